//! Writes that create entries: the field that carries the branded id, the
//! replicas (or fsyncs) an append waits for, and how long a dedup key holds.

use std::time::Duration;

use clap::Args;

use super::millis;

/// Default name of the entry field that carries the branded id.
pub const DEFAULT_ID_FIELD: &str = "id";
/// Default replicas an append waits for (`WAIT`): 0, none; appends are
/// answered once the primary has them, as Redis answers an `XADD`.
pub const DEFAULT_WAIT_REPLICAS: u32 = 0;
/// Default time an append waits for its replicas before it is answered
/// UNAVAILABLE as not confirmed.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default dedup window: two minutes, as NATS JetStream's duplicate
/// window. Long enough for a client to retry through a failover (Sentinel's
/// and a cluster's take seconds to tens of seconds) and a few backoffs; short
/// enough that the records (one Redis string of about 100 bytes plus the key
/// per keyed append) stay small: 1,000 keyed appends/s hold about 12 MB.
pub const DEFAULT_DEDUP_WINDOW: Duration = Duration::from_secs(120);

/// Default period of the scheduled-entry mover's poll while entries are due
/// or about to be: a due entry enters its stream within about this long
/// (plus the move's own few ms).
pub const DEFAULT_SCHEDULE_POLL: Duration = Duration::from_millis(100);

/// Default longest sleep of an idle mover: it bounds how late an entry is
/// when the sidecar that scheduled it is gone and no mover knew of it, and it
/// is the idle cost of scheduling, one round trip per sidecar this often.
pub const DEFAULT_SCHEDULE_IDLE_POLL: Duration = Duration::from_secs(1);

/// Entries and how appends are confirmed.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Entries and appends")]
pub struct AppendsConfig {
    /// Name of the entry field that carries the branded id. Not in the
    /// `echomq.` namespace, which dead letters use for their metadata (and a
    /// replay strips).
    #[arg(long, env = "ECHOMQ_ID_FIELD", default_value = DEFAULT_ID_FIELD, value_parser = parse_id_field)]
    pub id_field: String,

    /// Replicas that must have an appended entry before Append, AppendBatch or ReplayDeadLetters answers:
    /// each write is followed by `WAIT N --wait-timeout-ms` on a connection of its own (one WAIT covers
    /// every write queued meanwhile). A write not confirmed in time is answered UNAVAILABLE, naming its
    /// ids: it is on the primary but may be lost if the primary fails now. 0: no waiting (the default).
    /// More than the primary has connected is allowed (a warning at start): every append then times out.
    #[arg(long, env = "ECHOMQ_WAIT_REPLICAS", default_value_t = DEFAULT_WAIT_REPLICAS, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub wait_replicas: u32,

    /// How long (milliseconds) a write waits for --wait-replicas (or --wait-aof) before it is answered
    /// UNAVAILABLE as not confirmed.
    #[arg(id = "wait_timeout_ms", long = "wait-timeout-ms", value_name = "WAIT_TIMEOUT_MS", env = "ECHOMQ_WAIT_TIMEOUT_MS",
          default_value = default_millis!(DEFAULT_WAIT_TIMEOUT), value_parser = millis::within(1..=600_000))]
    pub wait_timeout: Duration,

    /// Confirm writes with `WAITAOF 1 N` instead of `WAIT N`: fsynced to the primary's append-only file
    /// and to N (--wait-replicas) replicas' files. Needs Redis 7.2 or newer, or Valkey, with
    /// `appendonly yes`: the sidecar refuses to start (exit 2) on an older server.
    #[arg(long, env = "ECHOMQ_WAIT_AOF", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub wait_aof: bool,

    /// How long (milliseconds) an append's dedup_key is remembered, from its first append: a second
    /// append with the same key on the same stream within it writes nothing and answers the first's ids.
    /// Each keyed append keeps one Redis key that long (about 100 bytes plus the key).
    #[arg(id = "dedup_window_ms", long = "dedup-window-ms", value_name = "DEDUP_WINDOW_MS", env = "ECHOMQ_DEDUP_WINDOW_MS",
          default_value = default_millis!(DEFAULT_DEDUP_WINDOW), value_parser = millis::within(1_000..=604_800_000))]
    pub dedup_window: Duration,

    /// How often (milliseconds) this sidecar looks for scheduled entries (Append's deliver_at/delay) that
    /// are due, on any stream, and moves them into their streams. A due entry enters its stream within
    /// about this long after its time (see the docs' "Scheduled entries"); each poll is one command to Redis.
    #[arg(id = "schedule_poll_ms", long = "schedule-poll-ms", value_name = "SCHEDULE_POLL_MS", env = "ECHOMQ_SCHEDULE_POLL_MS",
          default_value = default_millis!(DEFAULT_SCHEDULE_POLL), value_parser = millis::within(10..=60_000))]
    pub schedule_poll: Duration,

    /// The longest (milliseconds) an idle mover sleeps when it knows no entry due sooner: it wakes at the
    /// earliest due time it saw in the index, or when this sidecar schedules an entry, else after this
    /// long. An entry scheduled through a sidecar that is gone by its time enters within about this long
    /// after it; each idle wake is one command to Redis. Never below --schedule-poll-ms.
    #[arg(id = "schedule_idle_poll_ms", long = "schedule-idle-poll-ms", value_name = "SCHEDULE_IDLE_POLL_MS", env = "ECHOMQ_SCHEDULE_IDLE_POLL_MS",
          default_value = default_millis!(DEFAULT_SCHEDULE_IDLE_POLL), value_parser = millis::within(10..=600_000))]
    pub schedule_idle_poll: Duration,
}

fn parse_id_field(text: &str) -> Result<String, String> {
    let field = super::parse_non_empty(text)?;
    if field.starts_with("echomq.") {
        return Err("the `echomq.` prefix is reserved for dead-letter metadata (which a replay strips); \
                    pick another name"
            .into());
    }
    Ok(field)
}
