//! Restores off the rebalance path (`store.changelog`): an assignment starts the restore of
//! its state partitions on the restorer's thread and keeps them paused; the poll loop goes on
//! polling (heartbeats, other partitions' records) and, once a restore says it ended,
//! resumes the partitions it restored, whose workers then start. A partition let go
//! meanwhile is abandoned by the revoke (`Restorer::abandon`). A restore that fails stops
//! the process, its partitions refused, as a store failure does.

use std::sync::mpsc;

use parking_lot::Mutex;

use super::PipelineContext;
use crate::pipeline::changelog::RestoreEnded;
use crate::pipeline::control::Tp;
use crate::pipeline::partitions::Fetching;

/// The channel the restore threads report on.
pub(super) struct Restores {
    ended: mpsc::Sender<RestoreEnded>,
    reports: Mutex<mpsc::Receiver<RestoreEnded>>,
}

impl Default for Restores {
    fn default() -> Restores {
        let (ended, reports) = mpsc::channel();
        Restores { ended, reports: Mutex::new(reports) }
    }
}

impl PipelineContext {
    /// Starts restoring the state partitions of `assigned` that this store does not own;
    /// returns those of `assigned` to keep paused until it ends.
    pub(super) fn start_restores(&self, assigned: &[Tp]) -> Vec<Tp> {
        let Some(restorer) = &self.restorer else { return Vec::new() };
        let started = restorer.start(&restorer.state_partitions(assigned), self.restores.ended.clone());
        assigned.iter().filter(|tp| restorer.is_state(tp) && started.contains(&tp.1)).cloned().collect()
    }

    /// Resumes the partitions whose restore ended (from the poll loop); a failed restore
    /// refuses its partitions and stops the process.
    pub(super) fn finish_restores<F: Fetching>(&self, fetch: &F) {
        let Some(restorer) = &self.restorer else { return };
        let ended: Vec<RestoreEnded> = self.restores.reports.lock().try_iter().collect();
        for RestoreEnded { partitions, owned } in ended {
            let of = |ps: &[i32]| -> Vec<Tp> {
                self.partitions
                    .restoring()
                    .into_iter()
                    .filter(|tp| restorer.is_state(tp) && ps.contains(&tp.1))
                    .collect()
            };
            match owned {
                Ok(owned) => self.partitions.restored(fetch, &of(&owned)),
                Err(e) => {
                    tracing::error!(error = %e, partitions = ?partitions, "state could not be restored: refusing its partitions and stopping");
                    for tp in of(&partitions) {
                        self.partitions.refuse(fetch, &tp);
                    }
                    self.fatal.cancel();
                }
            }
        }
    }
}
