//! sled 0.34 backend. One tree; the keyspaces are byte prefixes so that a batch touching
//! a record and its expiry entry is one atomic `apply_batch` (sled's multi-tree
//! transactions are much slower).

use std::path::Path;

use super::{Backend, Op, StoreError, Tree};

pub struct SledBackend {
    db: sled::Db,
    tree: sled::Tree,
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: "sled", message: e.to_string() }
}

fn prefix(tree: Tree) -> u8 {
    match tree {
        Tree::Records => b'r',
        Tree::Expiry => b'x',
        Tree::Meta => b'm',
    }
}

fn full_key(tree: Tree, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(prefix(tree));
    k.extend_from_slice(key);
    k
}

impl SledBackend {
    pub fn open(path: &Path) -> Result<SledBackend, StoreError> {
        let db = sled::Config::new().path(path).mode(sled::Mode::HighThroughput).open().map_err(err)?;
        let tree = db.open_tree("dedupd").map_err(err)?;
        Ok(SledBackend { db, tree })
    }
}

impl Backend for SledBackend {
    fn name(&self) -> &'static str {
        "sled"
    }

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree.get(full_key(tree, key)).map_err(err)?.map(|v| v.to_vec()))
    }

    fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for op in ops {
            match op {
                Op::Put(t, k, v) => batch.insert(full_key(t, &k), v),
                Op::Delete(t, k) => batch.remove(full_key(t, &k)),
            }
        }
        self.tree.apply_batch(batch).map_err(err)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.tree.flush().map(|_| ()).map_err(err)
    }

    fn scan(
        &self,
        tree: Tree,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        if end.is_some_and(|e| e <= start) || limit == 0 {
            return Ok(Vec::new());
        }
        let lo = full_key(tree, start);
        let hi = match end {
            Some(e) => full_key(tree, e),
            None => vec![prefix(tree) + 1],
        };
        let mut out = Vec::new();
        for item in self.tree.range(lo..hi).take(limit) {
            let (k, v) = item.map_err(err)?;
            out.push((k[1..].to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn disk_bytes(&self) -> Result<u64, StoreError> {
        self.db.size_on_disk().map_err(err)
    }
}
