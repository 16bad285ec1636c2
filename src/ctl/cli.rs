//! The command line: global connection options, `--json`, and one subcommand
//! per job (each command's own flags live beside its code). Every flag of the
//! connection has an `ECHOMQ_*` variable; a flag wins over its variable.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Where the sidecar listens by default: the sidecar's own default `--listen`.
pub(crate) const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:50051";
/// Default time (ms) one call may take, connecting included.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// The exit codes, as `--help` shows them (kept in step with [`crate::exit`]).
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  ok (also: tail ended by Ctrl-C, or its output pipe closed)
  1  other error (an unexpected status: INTERNAL, UNKNOWN, ...; output not written)
  2  usage: a bad flag, value, file or JSON, found before anything was sent
  3  sidecar unreachable: no connection or no answer in --timeout-ms, or UNAVAILABLE
     (it cannot reach Redis, or is shutting down); retrying later may help
  4  not found: NOT_FOUND (no such stream or group), `read --id` with no such entry,
     a `dlq replay` id that is not in the dead-letter stream
  5  refused: INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS, RESOURCE_EXHAUSTED
  6  denied: UNAUTHENTICATED (token) or PERMISSION_DENIED (stream allow-list)

Output: tables for people; with --json, one JSON object per entry (NDJSON) for tail, read
and append, one JSON document for describe, trim and dlq. A value that is valid UTF-8
prints as text (in tables: in double quotes, with \\\" \\\\ \\n \\t \\u{..} escapes); any other
value prints as `base64:` and its standard base64 (in JSON: under `fields_base64`).
Durations print as `1h 2m`, `3.2s`, ... in tables and as integer milliseconds (`*_ms`) in JSON;
instants as RFC 3339 (UTC) in tables and as unix milliseconds (`*_ms`) in JSON.";

/// echomqctl: the EchoMQ sidecar's admin command line.
#[derive(Debug, Parser)]
#[command(
    name = "echomqctl",
    version,
    about = "The EchoMQ sidecar's admin command line: describe a group, tail a stream, append, \
             list and replay dead letters, read by id or instant, trim.",
    after_help = EXIT_CODES,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub(crate) struct Cli {
    /// How to reach the sidecar.
    #[command(flatten)]
    pub(crate) connection: Connection,

    /// Print JSON for scripts instead of tables (NDJSON for tail, read and append).
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How to reach the sidecar: its address, TLS, the bearer token, a timeout.
/// The names mirror the sidecar's own flags.
#[derive(Clone, Debug, Args)]
pub(crate) struct Connection {
    /// The sidecar's gRPC address: `http://host:port`, `https://host:port` (TLS), `host:port`
    /// (plain), or `unix:/path` for the sidecar's `--listen unix:/path`.
    #[arg(long, env = "ECHOMQ_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub(crate) endpoint: String,

    /// Send `authorization: Bearer <token>`, the token read from this file (surrounding
    /// whitespace ignored): the file the sidecar's --auth-token-file names.
    #[arg(long, env = "ECHOMQ_AUTH_TOKEN_FILE", global = true)]
    pub(crate) auth_token_file: Option<PathBuf>,

    /// Trust this PEM CA for the sidecar's certificate (its --tls-cert-file) instead of the
    /// system's roots. Turns TLS on (an `http://` endpoint is then refused: write `https://`).
    #[arg(long, env = "ECHOMQ_TLS_CA_FILE", global = true)]
    pub(crate) tls_ca_file: Option<PathBuf>,

    /// Present this PEM client certificate (with --tls-key-file), for a sidecar that requires
    /// one (its --tls-client-ca-file). Its variable is not the sidecar's ECHOMQ_TLS_CERT_FILE,
    /// which holds the sidecar's server certificate.
    #[arg(long, env = "ECHOMQ_CTL_TLS_CERT_FILE", global = true)]
    pub(crate) tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file.
    #[arg(long, env = "ECHOMQ_CTL_TLS_KEY_FILE", global = true)]
    pub(crate) tls_key_file: Option<PathBuf>,

    /// The name to check the sidecar's certificate against. Default: the endpoint's host
    /// (`localhost` for a unix socket).
    #[arg(long, env = "ECHOMQ_TLS_SERVER_NAME", global = true)]
    pub(crate) tls_server_name: Option<String>,

    /// How long one call may take (milliseconds), connecting included. `tail` polls with
    /// calls of this bound; a `tail --group` call lives until it ends.
    #[arg(long, env = "ECHOMQ_TIMEOUT_MS", default_value_t = DEFAULT_TIMEOUT_MS, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout_ms: u64,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// A consumer group's state: pending, lag, consumers (pending, idle), the oldest pending
    /// entry and its age, the highest delivery count; per shard for a sharded stream.
    Describe(crate::describe::Args),
    /// Follow a stream and print its entries. Reads (XRANGE), never through a group, so it
    /// takes nothing from any group; with --group G --ack it consumes for real.
    Tail(crate::tail::Args),
    /// Append entries, their fields from flags or from JSON.
    Append(crate::append::Args),
    /// Dead letters: list them, replay them to their source stream.
    #[command(subcommand)]
    Dlq(Dlq),
    /// Read entries by stream id or by instant (no group: nothing is consumed).
    Read(crate::read::Args),
    /// Remove the oldest entries of a stream; by default never past what a group still needs.
    Trim(crate::trim::Args),
    /// Consumer groups: destroy one with the keys kept for it.
    #[command(subcommand)]
    Group(Group),
    /// Scheduled entries (append --at/--in): list those waiting, cancel one.
    #[command(subcommand)]
    Scheduled(Scheduled),
    /// Write a shell completion script to standard output.
    Completions(crate::completions::Args),
}

/// The consumer-group commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Group {
    /// Destroy a group and the keys the sidecars keep for it alone; refused while it has
    /// pending entries, unless --force.
    Destroy(crate::group::DestroyArgs),
}

/// The scheduled-entry commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Scheduled {
    /// List a stream's scheduled entries that have not entered it yet, the first due first.
    List(crate::scheduled::ListArgs),
    /// Cancel a scheduled entry before it enters the stream.
    Cancel(crate::scheduled::CancelArgs),
}

/// The dead-letter commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Dlq {
    /// List dead letters, oldest first, with where they came from and why.
    List(crate::dlq::ListArgs),
    /// Move dead letters back to their source stream (same branded id, a new stream id).
    Replay(crate::dlq::ReplayArgs),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("echomqctl").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn connection_defaults_to_the_sidecars_default_listen() {
        let cli = parse(&["describe", "s", "g"]).unwrap();
        assert_eq!(cli.connection.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(cli.connection.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert!(!cli.json);
    }

    #[test]
    fn global_flags_go_before_or_after_the_command() {
        let cli = parse(&["describe", "s", "g", "--json", "--endpoint", "unix:/x"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.connection.endpoint, "unix:/x");
    }

    /// `--help` is complete: every command and every flag says what it is for.
    #[test]
    fn every_command_and_flag_has_help() {
        fn walk(command: &clap::Command, path: &str) {
            let path = format!("{path} {}", command.get_name());
            assert!(command.get_about().is_some(), "`{path}` has no help text");
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if !matches!(id, "help" | "version") {
                    assert!(arg.get_help().is_some(), "`{path}`: `{id}` has no help text");
                }
            }
            for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(sub, &path);
            }
        }
        walk(&Cli::command(), "");
    }

    #[test]
    fn help_lists_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        for code in ["0  ok", "2  usage", "3  sidecar unreachable", "4  not found", "5  refused", "6  denied"] {
            assert!(help.contains(code), "{code} missing from --help");
        }
    }
}
