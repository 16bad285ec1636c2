//! Configuration: command-line flags, each with an `ECHOMQ_*` environment
//! variable, defaults as named constants. Parsed in tests with
//! [`clap::Parser::try_parse_from`], never by setting process variables.
//!
//! One group per concern, each in its own file with its flags, their
//! defaults, their parsers and their checks, shown under its own heading in
//! `--help` (and in the same sections of `docs/src/configuration.md`). A flag
//! given in milliseconds (`--*-ms`) is a [`Duration`] from the start.
//!
//! - [`redis`]: where Redis is, its credentials, timeouts, reader connections.
//! - [`server`]: the gRPC listener, request limits, threads, the shutdown grace.
//! - [`admin`]: the admin port, metrics polling, log format.
//! - [`security`]: TLS, mTLS, the bearer token, stream allow-lists.
//! - [`consume`]: the consumer name, flow control, retries, leases, reclaim.
//! - [`appends`]: the id field, replicas and fsyncs an append waits for, dedup.
//! - [`archive`]: the archive and the retention policies.

use std::time::Duration;

use clap::Parser;

/// A default duration as its flag's text, in milliseconds. clap shows and
/// parses a default as text that lives as long as the process; this keeps
/// one string per default, as `default_value_t` does.
macro_rules! default_millis {
    ($default:expr) => {{
        static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        TEXT.get_or_init(|| $default.as_millis().to_string()).as_str()
    }};
}

pub mod admin;
pub mod appends;
pub mod archive;
pub mod consume;
mod millis;
pub mod redis;
pub mod security;
pub mod server;

pub use self::{
    admin::{AdminConfig, LogFormat, DEFAULT_ADMIN_LISTEN, DEFAULT_METRICS_POLL_INTERVAL},
    appends::{AppendsConfig, DEFAULT_DEDUP_WINDOW, DEFAULT_ID_FIELD, DEFAULT_WAIT_REPLICAS, DEFAULT_WAIT_TIMEOUT},
    archive::{
        ArchiveConfig, Keep, Retention, DEFAULT_ARCHIVE_FILE_ENTRIES, DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL,
        DEFAULT_RETENTION_INTERVAL,
    },
    consume::{
        ConsumeConfig, DEFAULT_CONSUMER_IDLE_LIMIT, DEFAULT_MAX_CONSUME_CALLS, DEFAULT_MAX_DELIVERIES,
        DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT_LIMIT, DEFAULT_READ_BLOCK, DEFAULT_RECLAIM_INTERVAL,
        DEFAULT_RECLAIM_MIN_IDLE, DEFAULT_RETRY_BACKOFF_INITIAL, DEFAULT_RETRY_BACKOFF_MAX,
    },
    redis::{
        RedisConfig, SharedReaders, DEFAULT_READER_CONNECTIONS, DEFAULT_REDIS_TIMEOUT, DEFAULT_REDIS_URL,
        DEFAULT_SHARED_READER_CONNECTIONS, SHARED_MOST_SIDECARS,
    },
    security::SecurityConfig,
    server::{
        Listen, ServerConfig, DEFAULT_LISTEN, DEFAULT_MAX_FIELDS_PER_ENTRY, DEFAULT_MAX_MESSAGE_BYTES,
        DEFAULT_MAX_NAME_BYTES, DEFAULT_SHUTDOWN_GRACE,
    },
};

/// The sidecar's settings. Every flag has an `ECHOMQ_*` environment variable;
/// a flag given on the command line wins over the variable.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "echomq-sidecar",
    version,
    // `--reader-connections -1` is a bad value, said as such, not an unknown flag.
    allow_negative_numbers = true,
    about = "Owns Redis Streams consumer groups and hands deliveries to services in any language over gRPC.",
    after_help = "Log verbosity follows ECHOMQ_LOG (tracing filter syntax, e.g. `info,echomq=debug`; default `info`).\nTraces are exported over OTLP gRPC when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set; the other standard OTEL_* variables apply."
)]
pub struct Config {
    /// Redis: URL, credentials, timeouts, reader connections.
    #[command(flatten)]
    pub redis: RedisConfig,

    /// The gRPC server: listener, request limits, threads, shutdown grace.
    #[command(flatten)]
    pub server: ServerConfig,

    /// The admin port, metrics polling, logs.
    #[command(flatten)]
    pub admin: AdminConfig,

    /// TLS and who may use which streams.
    #[command(flatten)]
    pub security: SecurityConfig,

    /// How Consume calls are served.
    #[command(flatten)]
    pub consume: ConsumeConfig,

    /// The id field and how appends are confirmed.
    #[command(flatten)]
    pub appends: AppendsConfig,

    /// The archive and retention policies.
    #[command(flatten)]
    pub archive: ArchiveConfig,
}

impl Config {
    /// Checks relations between settings that one flag's parser cannot see.
    pub fn validate(&self) -> Result<(), String> {
        self.redis.validate()?;
        self.consume.validate()?;
        self.security.validate()?;
        self.archive.validate()
    }
}

/// `500ms`, `90s`, `30m`, `12h`, `7d`: a whole number and a unit (`ms`,
/// `s`, `m`, `h`, `d`); `None` for anything else or an overflow. The
/// retention policies and echomqctl's durations both read this form.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    Some(Duration::from_millis(number.parse::<u64>().ok()?.checked_mul(ms)?))
}

fn parse_non_empty(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(std::iter::once("echomq-sidecar").chain(args.iter().copied()))
    }

    #[test]
    fn idle_limit_and_poll_interval_are_off_or_long_enough() {
        let config = parse(&["--consumer-idle-limit-ms", "0", "--metrics-poll-interval-ms", "0"]).unwrap();
        assert_eq!((config.consume.consumer_removal(), config.admin.metrics_poll()), (None, None));
        let config = parse(&["--consumer-idle-limit-ms", "1000", "--metrics-poll-interval-ms", "100"]).unwrap();
        assert_eq!(
            (config.consume.consumer_removal(), config.admin.metrics_poll()),
            (Some(Duration::from_secs(1)), Some(Duration::from_millis(100)))
        );
        for (flag, value) in [("--consumer-idle-limit-ms", "1"), ("--metrics-poll-interval-ms", "99")] {
            let error = parse(&[flag, value]).unwrap_err().to_string();
            assert!(error.contains("too short"), "{flag} {value}: {error}");
        }
    }

    #[test]
    fn millisecond_flags_are_durations_with_their_defaults() {
        let config = parse(&[]).unwrap();
        let (consume, appends, archive) = (&config.consume, &config.appends, &config.archive);
        assert_eq!(config.redis.redis_timeout, DEFAULT_REDIS_TIMEOUT);
        assert_eq!(config.server.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
        assert_eq!(config.admin.metrics_poll(), Some(DEFAULT_METRICS_POLL_INTERVAL));
        assert_eq!(
            (consume.reclaim_min_idle, consume.reclaim_interval),
            (DEFAULT_RECLAIM_MIN_IDLE, DEFAULT_RECLAIM_INTERVAL)
        );
        assert_eq!(consume.lease_refresh_interval(), Duration::from_secs(10));
        assert_eq!(consume.consumer_removal(), Some(DEFAULT_CONSUMER_IDLE_LIMIT));
        assert_eq!(
            (consume.retry_backoff_initial, consume.retry_backoff_max),
            (DEFAULT_RETRY_BACKOFF_INITIAL, DEFAULT_RETRY_BACKOFF_MAX)
        );
        assert_eq!(consume.read_block, DEFAULT_READ_BLOCK);
        assert_eq!((appends.wait_timeout, appends.dedup_window), (DEFAULT_WAIT_TIMEOUT, DEFAULT_DEDUP_WINDOW));
        assert_eq!(
            (archive.retention_interval, archive.archive_partial_file_interval),
            (DEFAULT_RETENTION_INTERVAL, DEFAULT_ARCHIVE_PARTIAL_FILE_INTERVAL)
        );

        let config =
            parse(&["--reclaim-min-idle-ms", "250", "--shutdown-grace-ms", "0", "--read-block-ms", "1"]).unwrap();
        assert_eq!(config.consume.reclaim_min_idle, Duration::from_millis(250));
        assert_eq!(config.consume.lease_refresh_interval(), Duration::from_millis(83), "a third, in whole ms");
        assert_eq!(config.server.shutdown_grace, Duration::ZERO);
        assert_eq!(config.consume.read_block, Duration::from_millis(1));
        let backwards = parse(&["--retry-backoff-initial-ms", "5000", "--retry-backoff-max-ms", "100"]).unwrap();
        assert_eq!(
            backwards.validate().unwrap_err(),
            "--retry-backoff-initial-ms (5000) is above --retry-backoff-max-ms (100)"
        );
    }

    #[test]
    fn retention_policies_parse_and_bad_ones_say_what_to_give() {
        let config = parse(&["--retention", "a=maxlen:5,{b}:dlq=maxage:7d", "--retention", "c=maxage:250ms"]).unwrap();
        assert_eq!(
            config.archive.retention,
            [
                Retention { stream: "a".into(), keep: Keep::Newest(5) },
                Retention { stream: "{b}:dlq".into(), keep: Keep::Within(Duration::from_secs(7 * 86_400)) },
                Retention { stream: "c".into(), keep: Keep::Within(Duration::from_millis(250)) },
            ]
        );
        for bad in
            ["a", "=maxlen:1", "a=maxlen:0", "a=maxlen:x", "a=maxage:7", "a=maxage:0s", "a=keep:1", "a=maxage:1w"]
        {
            let error = parse(&["--retention", bad]).unwrap_err().to_string();
            assert!(error.contains("maxlen") || error.contains("duration"), "{bad}: {error}");
        }
    }

    /// Adding a flag touches its group's file and the docs: the configuration page lists every flag, with
    /// its variable, under the heading `--help` shows it under, in the same order.
    #[test]
    fn the_configuration_page_lists_every_flag_under_its_help_heading() {
        let page = include_str!("../../docs/src/configuration.md");
        let mut heading = None;
        let mut documented = Vec::new();
        for line in page.lines() {
            if let Some(title) = line.strip_prefix("### ") {
                heading = Some(title);
            } else if line.starts_with("## ") {
                heading = None;
            } else if let (Some(title), Some(row)) = (heading, line.strip_prefix("| `")) {
                let cells: Vec<&str> = row.split('|').map(|cell| cell.trim().trim_matches('`')).collect();
                documented.push((title.to_owned(), cells[0].to_owned(), cells[1].to_owned()));
            }
        }
        let command = <Config as clap::CommandFactory>::command();
        let flags: Vec<(String, String, String)> = command
            .get_arguments()
            .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
            .map(|arg| {
                let flag = format!("--{}", arg.get_long().expect("every setting is a long flag"));
                let heading = arg.get_help_heading().unwrap_or_else(|| panic!("{flag} has no help heading"));
                let env = arg.get_env().unwrap_or_else(|| panic!("{flag} has no variable")).to_string_lossy();
                (heading.to_owned(), flag, env.into_owned())
            })
            .collect();
        assert_eq!(documented, flags);
    }

    #[test]
    fn no_flags_means_local_defaults() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.redis.redis_url, DEFAULT_REDIS_URL);
        assert_eq!(config.server.listen, Listen::Tcp("127.0.0.1:50051".parse().unwrap()));
        assert_eq!(config.admin.admin_listen, "0.0.0.0:9464".parse().unwrap());
        assert_eq!(config.consume.default_max_in_flight(), DEFAULT_MAX_IN_FLIGHT);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn listen_takes_a_unix_socket() {
        let config = parse(&["--listen", "unix:/run/echomq.sock"]).unwrap();
        assert_eq!(config.server.listen, Listen::Unix("/run/echomq.sock".into()));
    }

    #[test]
    fn listen_takes_a_host_name_that_resolves() {
        // `localhost` resolves from /etc/hosts, with no DNS server involved.
        let Listen::Tcp(address) = parse(&["--listen", "localhost:50051"]).unwrap().server.listen else {
            panic!("localhost:50051 is a TCP address");
        };
        assert!(address.ip().is_loopback(), "{address}");
        assert_eq!(address.port(), 50051);
        assert_eq!(parse(&["--listen", "[::1]:7"]).unwrap().server.listen, Listen::Tcp("[::1]:7".parse().unwrap()));
    }

    #[test]
    fn bad_values_are_refused_with_a_reason() {
        for args in [
            &["--listen", "nonsense"][..],
            &["--listen", "localhost"],
            &["--listen", ":50051"],
            &["--listen", "localhost:99999"],
            &["--listen", "unix:"],
            &["--consumer-name", " "],
            &["--reclaim-min-idle-ms", "0"],
            &["--default-max-in-flight", "0"],
            &["--id-field", "echomq.id"],
        ] {
            assert!(parse(args).is_err(), "{args:?}");
        }
        let too_small = parse(&["--max-message-bytes", "0"]).unwrap_err().to_string();
        assert!(too_small.contains("1024..=4294967295"), "the range a person can act on: {too_small}");
        for url in ["http://x", "redis://u:s3cret@h:99999", "redis+sentinel://u:s3cret@h:1", ""] {
            let refused = parse(&["--redis-url", url]).unwrap().validate().unwrap_err();
            assert!(refused.starts_with("--redis-url (ECHOMQ_REDIS_URL): "), "{refused}");
            assert!(!refused.contains("s3cret"), "the password is shown: {refused}");
        }
        let stray = parse(&["--sentinel-password", "p"]).unwrap().validate().unwrap_err();
        assert!(stray.contains("not a redis+sentinel:// URL") && !stray.contains("\"p\""), "{stray}");
        let sentinel = ["--redis-url", "redis+sentinel://s:26379/m", "--sentinel-username", "u"];
        assert!(parse(&sentinel).unwrap().validate().is_ok());
        let config = parse(&["--default-max-in-flight", "20", "--max-in-flight-limit", "10"]).unwrap();
        assert!(config.validate().unwrap_err().contains("--max-in-flight-limit"));
        let config = parse(&["--max-in-flight-limit", "100"]).unwrap();
        assert_eq!(config.validate(), Ok(()), "an unset default follows a lower limit");
        assert_eq!(config.consume.default_max_in_flight(), 100);
        let twice = parse(&["--retention", "x=maxlen:3,y=maxlen:1,x=maxage:1d"]).unwrap();
        assert!(twice.validate().unwrap_err().contains("`x` twice"));
        assert!(parse(&["--retention", "x=maxlen:3,y=maxlen:1"]).unwrap().validate().is_ok());
    }

    #[test]
    fn allow_lists_parse() {
        let config = parse(&["--allow-streams", "a:*,b", "--allow-streams-for", "svc=c:*,d"]).unwrap();
        assert_eq!(config.security.allow_streams, vec!["a:*", "b"]);
        assert_eq!(config.security.allow_streams_for, vec![("svc".to_owned(), vec!["c:*".to_owned(), "d".to_owned()])]);
        assert!(parse(&["--allow-streams-for", "svc="]).is_err());
        assert_eq!(parse(&["--allow-streams", " a , b"]).unwrap().security.allow_streams, vec!["a", "b"]);
        assert!(parse(&["--allow-streams", ""]).is_err(), "an empty list would deny every stream");
        let per_identity = parse(&["--allow-streams-for", "svc=c:*"]).unwrap();
        assert!(per_identity.validate().is_err(), "identities need mTLS");
        assert!(parse(&["--tls-cert-file", "c.pem"]).is_err(), "a certificate needs its key");
    }

    #[test]
    fn consumer_name_falls_back_to_pod_then_host() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.consume.consumer_name_or(Some("pod-1".into()), Some("host\n".into())), "pod-1");
        assert_eq!(config.consume.consumer_name_or(None, Some("host\n".into())), "host");
        assert_eq!(config.consume.consumer_name_or(None, None), "echomq-sidecar");
        let config = parse(&["--consumer-name", "me"]).unwrap();
        assert_eq!(config.consume.consumer_name_or(Some("pod-1".into()), None), "me");
    }

    #[test]
    fn reader_connections_default_and_bounds() {
        let redis = parse(&[]).unwrap().redis;
        assert_eq!(redis.reader_connections, DEFAULT_READER_CONNECTIONS);
        assert_eq!(redis.shared_reader_connections, DEFAULT_SHARED_READER_CONNECTIONS);
        assert_eq!(redis.shared_readers, SharedReaders::Auto, "chosen per group");
        let redis = parse(&["--reader-connections", "5", "--shared-reader-connections", "3"]).unwrap().redis;
        assert_eq!((redis.reader_connections, redis.shared_reader_connections), (5, 3));
        for (flag, mode) in [("on", SharedReaders::On), ("off", SharedReaders::Off), ("auto", SharedReaders::Auto)] {
            assert_eq!(parse(&["--shared-readers", flag]).unwrap().redis.shared_readers, mode);
        }
        assert!(parse(&["--shared-readers", "maybe"]).is_err());
        assert!(parse(&["--reader-connections", "0"]).is_err(), "no reader could ever read");
        assert!(parse(&["--shared-reader-connections", "0"]).is_err(), "no shared read could ever run");
        for flag in ["--reader-connections", "--shared-reader-connections"] {
            assert!(parse(&[flag, "10000"]).is_ok());
            assert!(parse(&[flag, "10001"]).is_err(), "{flag}: past Redis' default maxclients");
            assert!(parse(&[flag, "18446744073709551615"]).is_err(), "{flag}: refused, not a failed allocation");
            let negative = parse(&[flag, "-1"]).unwrap_err();
            assert_eq!(negative.kind(), clap::error::ErrorKind::ValueValidation, "{flag} -1: {negative}");
            assert!(negative.to_string().contains("'-1'"), "{flag} -1 names the value: {negative}");
        }
        for flag in ["--read-block-ms", "--reclaim-min-idle-ms", "--consumer-idle-limit-ms", "--shutdown-grace-ms"] {
            assert!(parse(&[flag, "31536000000"]).is_ok(), "{flag}: a year is taken");
            let huge = parse(&[flag, "18446744073709551615"]).unwrap_err();
            assert_eq!(huge.kind(), clap::error::ErrorKind::ValueValidation, "{flag}: refused at start: {huge}");
        }
        assert!(parse(&["--max-consume-calls", "1000000"]).is_ok());
        assert!(parse(&["--max-consume-calls", "18446744073709551615"]).is_err(), "past the call counter");
    }

    #[test]
    fn durable_append_settings_default_off_and_are_bounded() {
        let config = parse(&[]).unwrap();
        let appends = &config.appends;
        assert_eq!((appends.wait_replicas, appends.wait_timeout, appends.wait_aof), (0, Duration::from_secs(1), false));
        assert_eq!(appends.dedup_window, DEFAULT_DEDUP_WINDOW);
        let config =
            parse(&["--wait-replicas", "2", "--wait-timeout-ms", "250", "--wait-aof", "--dedup-window-ms", "1000"])
                .unwrap();
        let appends = &config.appends;
        assert_eq!(
            (appends.wait_replicas, appends.wait_timeout, appends.wait_aof),
            (2, Duration::from_millis(250), true)
        );
        assert_eq!(appends.dedup_window, Duration::from_secs(1));
        assert!(parse(&["--wait-aof", "false"]).is_ok_and(|c| !c.appends.wait_aof));
        for bad in [
            &["--wait-timeout-ms", "0"][..],
            &["--wait-replicas", "-1"],
            &["--wait-replicas", "101"],
            &["--dedup-window-ms", "999"],
            &["--wait-aof", "maybe"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn worker_threads_default_to_one_per_cpu() {
        assert_eq!(parse(&[]).unwrap().server.worker_threads, 0);
        assert_eq!(parse(&["--worker-threads", "1"]).unwrap().server.worker_threads, 1);
        assert!(parse(&["--worker-threads", "-1"]).is_err());
        assert!(parse(&["--worker-threads", "1025"]).is_err());
    }
}
