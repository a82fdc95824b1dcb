//! A stand-in for the consumer's pause and resume (`Fetching`), for the tests of
//! `partitions` and `consumer`.

use std::collections::HashSet;
use std::convert::Infallible;

use parking_lot::Mutex;

use super::{Fetching, Tp};

/// Which partitions Kafka would fetch, as pause and resume left them.
#[derive(Default)]
pub(crate) struct FakeFetching {
    paused: Mutex<HashSet<Tp>>,
}

impl FakeFetching {
    pub(crate) fn is_paused(&self, tp: &Tp) -> bool {
        self.paused.lock().contains(tp)
    }
}

impl Fetching for FakeFetching {
    type Error = Infallible;
    fn pause(&self, tps: &[Tp]) -> Result<(), Infallible> {
        self.paused.lock().extend(tps.iter().cloned());
        Ok(())
    }
    fn resume(&self, tps: &[Tp]) -> Result<(), Infallible> {
        let mut paused = self.paused.lock();
        for tp in tps {
            paused.remove(tp);
        }
        Ok(())
    }
}
