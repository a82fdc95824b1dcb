//! Store tests, run against every backend.
