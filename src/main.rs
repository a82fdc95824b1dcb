//! The `dedupd` binary: parse the command line and hand over to `dedupd::cli`.

#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::ExitCode;

/// mimalloc, not glibc's malloc: the hot path allocates many small, short-lived buffers
/// (glibc's malloc was ~27% of the store's write path: docs/performance-notes.md, "The store's
/// write path").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Crash points for the crash suite, only in test builds (src/crash.rs).
    #[cfg(feature = "failpoints")]
    let _crash_points = dedupd::crash::configure_from_env();
    let cli = dedupd::cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            dedupd::cli::print_error(format_args!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(dedupd::cli::dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            dedupd::cli::print_error(e);
            ExitCode::from(2)
        }
    };
    // What is still running once the command is done (a sink call that outlasted the drain)
    // is dropped; a thread blocked in it is left behind rather than waited for forever.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    code
}

/// How long the runtime's leftover tasks and blocking threads get to end at exit.
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(5);
