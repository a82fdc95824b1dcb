//! fjall 3 backend (LSM tree). Not written yet.

use std::path::Path;

use super::{Backend, Op, StoreError, Tree};

pub struct FjallBackend;

impl FjallBackend {
    pub fn open(_path: &Path) -> Result<FjallBackend, StoreError> {
        Err(StoreError::Backend { backend: "fjall", message: "not written yet".into() })
    }
}

impl Backend for FjallBackend {
    fn name(&self) -> &'static str {
        "fjall"
    }
    fn get(&self, _tree: Tree, _key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    fn apply(&self, _ops: Vec<Op>) -> Result<(), StoreError> {
        Ok(())
    }
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
    fn scan(&self, _t: Tree, _s: &[u8], _e: Option<&[u8]>, _l: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StoreError> {
        Ok(vec![])
    }
    fn disk_bytes(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}
