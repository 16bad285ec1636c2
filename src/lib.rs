//! EchoMQ sidecar: owns Redis Streams consumer groups and hands deliveries to
//! services in any language over one bidirectional gRPC call.
//!
//! # Layout
//!
//! - [`config`]: flags and `ECHOMQ_*` variables, defaults as named constants.
//! - [`app`]: start-up order, listeners, the shutdown sequence.
//! - [`deferred`]: the EchoMQ services answer UNAVAILABLE until Redis has
//!   answered, while health and reflection serve from the start.
//! - [`admin_http`]: the admin HTTP port: `/livez`, `/readyz`, `/metrics`.
//! - [`archive`]: the archive's storage only: Parquet files and per-stream
//!   manifests on object storage (a directory or S3), written and read back.
//! - [`admin`]: the AdminService: describe a group, list and replay dead letters,
//!   destroy a group with its keys.
//! - [`stream`]: the StreamService: Append and AppendBatch, Read, Trim; the
//!   retention policies; `stream/fold.rs`, the fold-then-trim order that
//!   archives what a trim removes (leases, the crash-safe order).
//! - [`consume`]: the ConsumerService's Consume call. Its doc is the spec of
//!   how Consume behaves. One file per job:
//!   - `consume/subscribe.rs`: validating the subscribe, the group door;
//!   - `consume/session.rs`: the relay of one call (routes verdicts, parks);
//!   - `consume/worker.rs`: the group worker's loop, the one place that
//!     feeds the job files' outcomes back to the ledger;
//!   - `consume/ledger.rs`: its bookkeeping (held, ready, waiting, credit,
//!     deadlines, the read decision), sans-I/O: it returns effects, orders
//!     and counts for the worker to carry out, and is unit-tested alone;
//!   - `consume/orders.rs`: the plain data the ledger and the job files
//!     share (acks, retry states, dead-letter orders, backoff, group policy);
//!   - `consume/verdicts.rs`: every verdict error, code and text;
//!   - `consume/delivery.rs`: a Redis entry as a `Delivery` frame;
//!   - `consume/reader.rs`: the blocking XREADGROUP on its own connection
//!     (from the reader pool, `redis/readers.rs`), or for a group with
//!     per-key limits `keyed_read.lua` and an `XREAD BLOCK`;
//!   - `consume/keyed.rs` + `key_gate.lua`, `keys_gate.lua`: **per-key
//!     limits** (the keyed entries' members, the gate, the entries that
//!     wait for their key);
//!   - `consume/recovery.rs`: the own PEL at start, a lost group;
//!   - `consume/retry.rs` + `redeliver.lua`: **the retry policy** (backoff,
//!     the retry hash, claiming due entries);
//!   - `consume/lease.rs` + `refresh.lua`: **the lease refresh** and the
//!     reclaim beat (XAUTOCLAIM);
//!   - `consume/dead_letter.rs` + `dead_letter.lua`: **the dead-letter step**
//!     (Fail with dead_letter, poison entries, oversized entries);
//!   - `consume/settle.rs` + `settle.lua`: XACK batches;
//!   - `consume/release.rs` + `release.lua`: **Release**, unstarted
//!     deliveries back to the group with their delivery count restored;
//!   - `consume/emits.rs`: an AckEmit's emits, checked at the edge;
//!   - `consume/ack_emit.rs` + `ack_emit.lua`: **the AckEmit step** (a
//!     delivery's XACK and its emits in one script, fenced on the owner);
//!   - `consume/hygiene.rs` + `hygiene.lua`: heartbeats, and removing dead consumers;
//!   - `consume/gauges.rs`: polling the group's state into metrics.
//! - [`durable`]: writes that create entries: run as one `EVALSHA` (loading
//!   the script after a `NOSCRIPT`), and with `--wait-replicas`/`--wait-aof`
//!   through the durable writer, which confirms them with `WAIT`/`WAITAOF` on
//!   a connection of its own (group commit: one `WAIT` per round).
//! - [`durability`]: what a write must be confirmed by, and how a wait fell
//!   short (shared by [`durable`] and [`error`], below both).
//! - [`error`]: the API's error enum and its one mapping to `tonic::Status`
//!   (start-up has its own: [`redis::ShardCountError`], [`config`]'s parse errors).
//! - [`id`]: stream ids and branded ids.
//! - [`entry`]: entry fields to the wire's payload, raw fields and branded
//!   id; the dead-letter metadata field names.
//! - [`keys`]: derived key names (dead-letter stream, retry hash, heartbeat
//!   hash, keyed entries) and shard keys.
//! - [`metrics`]: the Prometheus registry and the `/metrics` text. Each
//!   group of series registers itself, in the file that records it:
//!   [`metrics::group`] (per consumer group), [`metrics::stream`] (appends,
//!   trims), [`metrics::archive`], [`metrics::grpc`] (the gRPC server's calls,
//!   a tower layer), `metrics/process.rs` (the process metrics); the
//!   connections' own series are redis/'s. It imports [`redis`], never the
//!   reverse.
//! - [`redis`]: `redis/mod.rs` is an index. Connections: [`redis::connect`]
//!   (the shared handles, dedicated connections, TCP settings),
//!   [`redis::timed`] (every command's latency, and its series),
//!   [`redis::primary`] (which node is the primary and moving every
//!   connection when it changes: Sentinel, a primary demoted behind its
//!   address), [`redis::shared`], [`redis::readers`] (the bounded pool of the
//!   group readers' dedicated connections), [`redis::resp`] (a reader's
//!   plain-TCP connection that parses XREADGROUP replies itself). The scripts
//!   and their shared `lua/prelude.lua` ([`redis::scripts`]), reply parsing
//!   ([`redis::reply`]). And what the services share, below them:
//!   [`redis::fault`](mod@redis::fault) (a Redis error's kind, decided once),
//!   [`redis::group`] (a group's state), [`redis::range`] (range paging),
//!   [`redis::shards`] (sharded streams' recorded shard counts),
//!   [`redis::trim`] (`trim.lua`'s wrapper, a typed bound in),
//!   [`redis::version`] (the server's version and the floor).
//! - [`keda`]: KEDA's external scaler (`--keda-scaler`): a group's backlog
//!   as the metric that scales its consumers; `keda/metadata.rs`, a
//!   trigger's metadata.
//! - [`security`]: bearer token, mTLS identity, the stream allow-list, name limits.
//! - [`telemetry`]: logs, OTLP traces, the trace context carried in entries.
//! - [`proto`]: the generated wire types, services and clients (`echomq.v1`);
//!   [`codec`], their gRPC codec (prost's, with smaller per-call buffers);
//!   [`wire`], the delivery frames the sidecar writes without the generated
//!   types' allocations.
//!
//! Two binaries stand on this library: `echomq-sidecar` (`src/main.rs`, thin:
//! configuration, telemetry, [`app::run`], exit codes) and `echomqctl`, the
//! admin command line (`src/ctl/`, one file per command; its `main.rs` has its
//! own Layout), a client of the generated stubs.

pub mod admin;
pub mod admin_http;
pub mod app;
pub mod archive;
pub mod codec;
pub mod config;
pub mod consume;
pub mod deferred;
pub mod durability;
pub mod durable;
pub mod entry;
pub mod error;
pub mod id;
pub mod keda;
pub mod keys;
pub mod metrics;
pub mod redis;
pub mod security;
pub mod stream;
pub mod telemetry;
pub mod wire;

/// The generated `echomq.v1` code: messages, server traits and clients.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("echomq.v1");
    pub use crate::wire::DeliveryBatch;

    /// The encoded file descriptor set of `proto/`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/echomq_descriptor.bin"));
}
