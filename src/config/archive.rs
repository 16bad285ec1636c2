//! The archive (where what a trim removes goes first) and the retention
//! policies that trim streams on a schedule.

use std::time::Duration;

use clap::Args;

use super::millis;

/// Default period of the retention policies (`--retention`).
pub const DEFAULT_RETENTION_INTERVAL: Duration = Duration::from_secs(10);
/// Default most entries in one archive file.
pub const DEFAULT_ARCHIVE_FILE_ENTRIES: u64 = 25_000;
/// Default least time between two files of fewer entries than that,
/// folded by retention, per stream: an hour.
pub const DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL: Duration = Duration::from_secs(3_600);

/// The archive and retention.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Archive and retention")]
pub struct ArchiveConfig {
    /// Where what a trim removes is archived first: `file:///absolute/dir`, or `s3://bucket[/prefix]` for
    /// any S3-compatible store (endpoint, region and credentials from the standard `AWS_*` variables, e.g.
    /// `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`). With an archive,
    /// Trim and `--retention` fold entries into Parquet files before XTRIM removes them, Read returns them
    /// from there, and an Append's `max_len` is refused. A URL that cannot be parsed, or a store that
    /// does not accept a write at start, exits 2. Unset: no archive (a trim forgets).
    #[arg(long, env = "ECHOMQ_ARCHIVE_URL", value_parser = super::parse_non_empty)]
    pub archive_url: Option<String>,

    /// Retention policies, `NAME=maxlen:N` (keep the newest N entries) or `NAME=maxage:DURATION` (keep
    /// what was appended within DURATION: `500ms`, `90s`, `30m`, `12h`, `7d`), repeatable or
    /// comma-separated. NAME is a stream key, a dead-letter stream or a sharded stream (each shard
    /// then keeps its own N). Applied every `--retention-interval-ms` as a safe Trim (never past what a
    /// group still needs; archived first with `--archive-url`), by one sidecar at a time per stream.
    #[arg(long, env = "ECHOMQ_RETENTION", value_delimiter = ',', value_parser = parse_retention)]
    pub retention: Vec<Retention>,

    /// Period of the retention policies (milliseconds).
    #[arg(id = "retention_interval_ms", long = "retention-interval-ms", value_name = "RETENTION_INTERVAL_MS", env = "ECHOMQ_RETENTION_INTERVAL_MS",
          default_value = default_millis!(DEFAULT_RETENTION_INTERVAL), value_parser = millis::within(10..))]
    pub retention_interval: Duration,

    /// The most entries folded into one archive file (entries): also the most a fold holds in memory at
    /// once (about 25,000 × the entry size).
    #[arg(long, env = "ECHOMQ_ARCHIVE_FILE_ENTRIES", default_value_t = DEFAULT_ARCHIVE_FILE_ENTRIES, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub archive_file_entries: u64,

    /// Least time (milliseconds) between two partial archive files (fewer entries than
    /// --archive-file-entries) that retention folds of one stream. Between them retention folds whole
    /// files only and leaves the rest in the stream (at most one file's worth more than the policy
    /// keeps), so a steady stream does not become thousands of tiny files. 0: a partial file every
    /// round. A Trim call always folds everything it removes.
    #[arg(id = "archive_partial_file_interval_ms", long = "archive-partial-file-interval-ms", value_name = "ARCHIVE_PARTIAL_FILE_INTERVAL_MS", env = "ECHOMQ_ARCHIVE_PARTIAL_FILE_INTERVAL_MS",
          default_value = default_millis!(DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL), value_parser = millis::within(..))]
    pub archive_partial_file_interval: Duration,
}

impl ArchiveConfig {
    /// Checks that no stream has two policies.
    pub(super) fn validate(&self) -> Result<(), String> {
        let repeated = self
            .retention
            .iter()
            .enumerate()
            .find(|(k, policy)| self.retention[..*k].iter().any(|earlier| earlier.stream == policy.stream));
        if let Some((_, policy)) = repeated {
            return Err(format!("--retention names stream `{}` twice: give each stream one policy", policy.stream));
        }
        Ok(())
    }
}

/// One retention policy (`--retention`): which stream, and what it keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A stream key, or a sharded stream's name.
    pub stream: String,
    /// What the stream keeps.
    pub keep: Keep,
}

/// What a retention policy keeps of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The newest N entries (`maxlen:N`).
    Newest(u64),
    /// The entries appended within this long (`maxage:DURATION`), by their stream ids' milliseconds.
    Within(Duration),
}

fn parse_retention(text: &str) -> Result<Retention, String> {
    let shape = "give `NAME=maxlen:N` or `NAME=maxage:DURATION` (e.g. `orders=maxlen:100000`, `orders=maxage:7d`)";
    let (stream, policy) = text.rsplit_once('=').ok_or_else(|| shape.to_owned())?;
    if stream.is_empty() {
        return Err(format!("no stream name: {shape}"));
    }
    let keep = match policy.split_once(':') {
        Some(("maxlen", n)) => match n.parse::<u64>() {
            Ok(n) if n > 0 => Keep::Newest(n),
            _ => return Err(format!("maxlen takes a number of entries above 0, not `{n}`")),
        },
        Some(("maxage", age)) => match super::parse_duration(age) {
            Some(age) if !age.is_zero() => Keep::Within(age),
            _ => {
                return Err(format!(
                    "`{age}` is not a duration above 0: give a number and ms, s, m, h or d (e.g. `7d`)"
                ))
            }
        },
        _ => return Err(format!("`{policy}` is not a policy: {shape}")),
    };
    Ok(Retention { stream: stream.to_owned(), keep })
}
