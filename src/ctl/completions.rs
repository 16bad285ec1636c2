//! `completions SHELL`: a completion script for bash, zsh, fish, elvish or
//! PowerShell, generated from the same clap definition as `--help`, so it
//! cannot drift from the flags.

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::exit::Failure;

/// `completions`' flags.
#[derive(Debug, clap::Args)]
#[command(after_help = "Install, e.g. for bash: `echomqctl completions bash > \
    ~/.local/share/bash-completion/completions/echomqctl`; for zsh, into a directory on $fpath as \
    `_echomqctl`; for fish: `~/.config/fish/completions/echomqctl.fish`.")]
pub(crate) struct Args {
    /// The shell.
    #[arg(value_enum)]
    shell: Shell,
}

/// Writes the script to standard output. Needs no sidecar.
pub(crate) fn run(args: &Args) -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "echomqctl", &mut out);
    let mut stdout = std::io::stdout().lock();
    std::io::Write::write_all(&mut stdout, &out)?;
    std::io::Write::flush(&mut stdout)?;
    Ok(())
}
