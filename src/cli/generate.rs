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

/// Prints the man page (roff): dedupd's, or with `subcommand` that one's (`dedupd-run(1)`,
/// as the main page's SUBCOMMANDS section names it).
pub(super) fn man(subcommand: Option<&str>) -> Result<(), CliError> {
    let pages = pages();
    let wanted = subcommand.map_or("dedupd".to_string(), |name| format!("dedupd-{name}"));
    match pages.iter().find(|(name, _)| *name == wanted) {
        Some((_, page)) => print_line(String::from_utf8_lossy(page).trim_end()),
        None => {
            let names: Vec<&str> = pages.iter().skip(1).filter_map(|(n, _)| n.strip_prefix("dedupd-")).collect();
            Err(CliError::Other(format!(
                "no subcommand {:?}; one of: {}",
                subcommand.unwrap_or_default(),
                names.join(", ")
            )))
        }
    }
}

/// Writes every man page into `dir`: dedupd.1 and one per subcommand (dedupd-run.1, ...).
pub(super) fn man_pages(dir: &std::path::Path) -> Result<(), CliError> {
    let file_error = |path: &std::path::Path, source| CliError::File { path: path.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
    for (name, page) in pages() {
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page).map_err(|e| file_error(&path, e))?;
    }
    Ok(())
}

/// Every page, named as the pages refer to each other: `dedupd` first, then `dedupd-SUB`.
fn pages() -> Vec<(String, Vec<u8>)> {
    let mut command = Cli::command().disable_help_subcommand(true);
    // Built, each subcommand carries the name the main page refers to it by (`dedupd-run`).
    command.build();
    let subcommands = command.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect::<Vec<_>>();
    std::iter::once(("dedupd".to_string(), command))
        .chain(
            subcommands.into_iter().map(|s| (format!("dedupd-{}", s.get_name()), s.version(env!("CARGO_PKG_VERSION")))),
        )
        .map(|(name, command)| {
            let mut page = Vec::new();
            // Rendering into memory cannot fail.
            let _ = clap_mangen::Man::new(command).render(&mut page);
            (name, page)
        })
        .collect()
}
