//! Whole-store reads: counts and the presence filter at open (`open`), or both read back
//! from where a clean stop saved them (`saved`); pages of records for export, stats and
//! the index rebuild. Claims held by the claim journal are records too, merged in.

mod open;
mod saved;

#[cfg(test)]
pub(in crate::store) use saved::FILE_NAME as SAVED_FILTER_FILE;

use super::{KeyStore, KeyValue, Record, StateCounts, StoreError, Tree, decode, state_index};

impl KeyStore {
    /// Recounts records per state (and collects the `indeterminate` ones' keys per sink) by a full scan
    /// (after import).
    pub fn recount(&self) -> Result<StateCounts, StoreError> {
        let mut counts = [0i64; 3];
        let mut doubts = super::doubts::KeysBySink::new();
        self.for_each_record_page(10_000, |page| {
            for (key, record) in page {
                counts[state_index(record.state())] += 1;
                super::doubts::tally(&mut doubts, &key, &record);
            }
            Ok(())
        })?;
        self.set_counts(counts);
        self.doubts.set(doubts);
        Ok(self.counts())
    }

    pub(super) fn set_counts(&self, counts: [i64; 3]) {
        self.counts.set(counts);
    }

    /// Calls `f` with every record, a page of up to `page_size` at a time, in key order.
    /// Each page is read under the exclusive gate ([`KeyStore::scan_records`]): a running
    /// instance's writes wait for one page at a time.
    pub(super) fn for_each_record_page<E: From<StoreError>>(
        &self,
        page_size: usize,
        mut f: impl FnMut(Vec<(String, Record)>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut after: Option<String> = None;
        loop {
            let page = self.scan_records(after.as_deref(), page_size)?;
            let Some((last, _)) = page.last() else { return Ok(()) };
            after = Some(last.clone());
            f(page)?;
        }
    }

    /// Up to `limit` records with keys after `after` (exclusive), for export and stats.
    pub fn scan_records(&self, after: Option<&str>, limit: usize) -> Result<Vec<(String, Record)>, StoreError> {
        // Exclusive: no completion is between the journal's claims and the backend
        // (invariant 3 of `claims::completions`) while the page is read.
        let _gate = self.locks.exclusive();
        let start = match after {
            Some(a) => {
                let mut s = a.as_bytes().to_vec();
                s.push(0);
                s
            }
            None => Vec::new(),
        };
        let (page, more) = self.scan_slices(&start, limit)?;
        // Claims held by the journal are records too (and their keys are not in the
        // backend): merged in, up to the backend page's last key when more may follow.
        let upper = more.then(|| page.last().map(|(k, _)| k.clone())).flatten();
        let journaled = self.journaled_claims(&start, upper.as_deref());
        let mut records = page
            .into_iter()
            .map(|(k, v)| {
                let rec = decode(&k, &v)?;
                Ok((String::from_utf8_lossy(&k).into_owned(), rec))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if !journaled.is_empty() {
            records.extend(journaled);
            records.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            records.truncate(limit);
        }
        Ok(records)
    }

    /// Up to `limit` records of the backend with keys from `start`, in key order, from every
    /// slice (a key is in one slice at a time), and whether more may follow. Each slice is
    /// read for its share of the page only, so a page costs about `limit` reads whatever
    /// the number of slices: the page ends at the lowest last key of a slice that filled
    /// its share, beyond which that slice was not read.
    fn scan_slices(&self, start: &[u8], limit: usize) -> Result<(Vec<KeyValue>, bool), StoreError> {
        let live = self.slices.live();
        let share = if live.len() <= 1 { limit } else { limit / live.len() + 1 };
        let mut page = Vec::new();
        // Keys above it may be missing from the page.
        let mut read_to: Option<Vec<u8>> = None;
        for slice in live {
            let part = self.backend.scan(Tree::Records(slice), start, None, share)?;
            if part.len() == share
                && let Some((last, _)) = part.last()
                && read_to.as_ref().is_none_or(|to| last < to)
            {
                read_to = Some(last.clone());
            }
            page.extend(part);
        }
        page.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(to) = &read_to {
            page.retain(|(key, _)| key <= to);
        }
        let more = read_to.is_some() || page.len() > limit;
        page.truncate(limit);
        Ok((page, more))
    }

    /// The claims held by the journal with `start <= key <= upper`, unordered. Locks every
    /// stripe in turn: for scans (operators, export), not the hot path.
    fn journaled_claims(&self, start: &[u8], upper: Option<&[u8]>) -> Vec<(String, Record)> {
        if self.journal.is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for stripe in self.locks.stripes_in_order() {
            out.extend(
                stripe
                    .journaled_claims()
                    .filter(|(k, _)| k.as_bytes() >= start && upper.is_none_or(|u| k.as_bytes() <= u))
                    .map(|(k, c)| (k.to_string(), Record::InProgress(c.clone()))),
            );
        }
        out
    }
}
