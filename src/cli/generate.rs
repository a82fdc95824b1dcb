//! `dedupd completions SHELL` and `dedupd man`: shell completions and the man page, generated
//! from the command line's own definition (clap), so they never disagree with it. The
//! release script (scripts/release) writes both next to the binary.

use clap::CommandFactory;

use super::output::print_line;
use super::{Cli, CliError};

/// Prints the completion script for `shell`.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<(), CliError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "dedupd", &mut script);
    print_line(String::from_utf8_lossy(&script).trim_end())
}

/// Prints the man page (roff).
pub(super) fn man() -> Result<(), CliError> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page).map_err(CliError::Stdout)?;
    print_line(String::from_utf8_lossy(&page).trim_end())
}
