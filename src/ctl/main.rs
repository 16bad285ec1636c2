//! `echomqctl`, the admin command line: speaks to a sidecar over gRPC to
//! describe a group, tail a stream, append, list and replay dead letters, read
//! by id or instant, and trim. Tables for people, `--json` for scripts, exit
//! codes that say what failed ([`exit`]).
//!
//! # Layout
//!
//! - `main.rs`: parse, run one command on a single-threaded runtime, map the
//!   outcome to an exit code.
//! - [`cli`]: the flags (clap derive), the `--help` texts and the exit-code table.
//! - [`connect`]: the endpoint (TCP, TLS, unix socket), the bearer token, the
//!   per-call timeout.
//! - [`exit`]: what can fail, and the one mapping of a failure to an exit code.
//! - [`render`]: values, entries, tables and JSON, shared by the commands.
//! - [`time`]: instants (RFC 3339, unix milliseconds, "that long ago") and
//!   human durations.
//! - One file per command, each the same shape (its `Args`, then `run`:
//!   validate → call → print): [`describe`], [`tail`], [`append`], [`dlq`],
//!   [`read`], [`trim`]; [`completions`] writes shell completion scripts.

mod append;
mod cli;
mod completions;
mod connect;
mod describe;
mod dlq;
mod exit;
mod group;
mod ids;
mod read;
mod render;
mod scheduled;
mod tail;
mod time;
mod trim;

use std::process::ExitCode;

use clap::{error::ErrorKind, Parser};

use crate::cli::{Cli, Command};
use crate::exit::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap prints the reason and a usage line; exit code 2 is clap's and ours.
            let _ = e.print();
            return ExitCode::from(exit::USAGE);
        }
    };
    // One TLS implementation, as the sidecar's: rustls on ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("echomqctl: cannot start the async runtime: {e}");
            return ExitCode::from(exit::OTHER);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) | Err(Failure::OutputClosed) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("echomqctl: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    // Every command but `completions` needs the sidecar: connect first, so an
    // unreachable one is reported as such, not as the first call's failure.
    let connect = || connect::Context::open(&cli.connection, cli.json);
    match cli.command {
        Command::Completions(args) => completions::run(&args),
        Command::Describe(args) => describe::run(args, &connect().await?).await,
        Command::Tail(args) => tail::run(args, &connect().await?).await,
        Command::Append(args) => append::run(args, &connect().await?).await,
        Command::Dlq(cli::Dlq::List(args)) => dlq::list(args, &connect().await?).await,
        Command::Dlq(cli::Dlq::Replay(args)) => dlq::replay(args, &connect().await?).await,
        Command::Read(args) => read::run(args, &connect().await?).await,
        Command::Trim(args) => trim::run(args, &connect().await?).await,
        Command::Group(cli::Group::Destroy(args)) => group::destroy(args, &connect().await?).await,
        Command::Scheduled(cli::Scheduled::List(args)) => scheduled::list(args, &connect().await?).await,
        Command::Scheduled(cli::Scheduled::Cancel(args)) => scheduled::cancel(args, &connect().await?).await,
    }
}
