//! EchoMQ sidecar: owns Redis Streams consumer groups and hands deliveries to
//! services in any language over one bidirectional gRPC call.
//!
//! # Layout
//!
//! - [`config`]: flags and `ECHOMQ_*` variables, defaults as named constants.
//! - [`app`]: start-up order, listeners, the shutdown sequence.
//! - [`admin_http`]: the admin HTTP port (`/livez`, `/readyz`).
//! - [`admin`]: the AdminService: describe a group, list and replay dead letters.
//! - [`error`]: the one error enum and its one mapping to `tonic::Status`.
//! - [`id`]: stream ids and branded ids.
//! - [`entry`]: entry fields to the wire's payload, raw fields and branded id.
//! - [`keys`]: derived key names (dead-letter stream, retry hash) and shard keys.
//! - [`metrics`]: Prometheus metrics and the timed Redis connection.
//! - [`redis`]: connections (shared and dedicated), the Lua scripts, reply parsing.
//! - [`consume`]: the Consume call: validation, the group door, the group
//!   worker (reads, recovery, reclaim, leases, XACK batches) and the per-call relay.
//! - [`security`]: bearer token, mTLS identity, the stream allow-list, name limits.
//! - [`stream`]: Append and AppendBatch.
//! - [`telemetry`]: logs, OTLP traces, the trace context carried in entries.
//! - [`proto`]: the generated wire types, services and clients (`echomq.v1`).

pub mod admin;
pub mod admin_http;
pub mod app;
pub mod config;
pub mod consume;
pub mod entry;
pub mod error;
pub mod id;
pub mod keys;
pub mod metrics;
pub mod redis;
pub mod security;
pub mod stream;
pub mod telemetry;

/// The generated `echomq.v1` code: messages, server traits and clients.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("echomq.v1");

    /// The encoded file descriptor set of `proto/`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/echomq_descriptor.bin"));
}
