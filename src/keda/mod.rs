//! KEDA's external scaler (`externalscaler.ExternalScaler`, the vendored
//! `proto/externalscaler/externalscaler.proto`), served on the gRPC port with
//! `--keda-scaler`, behind the same bearer token, mTLS and stream allow-list
//! as the EchoMQ services. Without the flag it is not served (UNIMPLEMENTED)
//! and reflection does not list it.
//!
//! A trigger names a `stream`, a `group` and a `backlogPerReplica`
//! ([`metadata`]). The metric is the group's backlog
//! ([`crate::redis::group::backlog`]): its lag, right after trims on every
//! server, plus the pending entries no live call holds. So KEDA scales the
//! consumers to the work, and to zero when there is none:
//!
//! - `IsActive`: whether the backlog is above zero.
//! - `GetMetricSpec`: one metric, `echomq-<stream>-<group>`, with the target
//!   `backlogPerReplica` (entries per replica); the group must exist.
//! - `GetMetrics`: the backlog (entries).
//! - `StreamIsActive`: the first answer at once, then each change, polled
//!   every [`POLL_INTERVAL`]; it ends when the client goes away.
//! - `StreamMetricSpec` (optional in KEDA): UNIMPLEMENTED, so KEDA reads
//!   `GetMetricSpec` as before; the target never changes while a trigger lives.
//!
//! `StreamIsActive` is RESOURCE_EXHAUSTED while [`MAX_OPEN_STREAMS`] are open.
//!
//! Errors, for every RPC: INVALID_ARGUMENT for missing or bad metadata (the
//! message names the key); NOT_FOUND when the stream or the group does not
//! exist; PERMISSION_DENIED for a stream outside the allow-list;
//! UNAUTHENTICATED without the bearer token (`--auth-token-file`);
//! FAILED_PRECONDITION when the key is not a stream; UNAVAILABLE when Redis
//! cannot be reached.

pub mod metadata;

use std::{pin::Pin, sync::Arc, time::Duration};

use tokio::sync::{mpsc, Semaphore};
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{Request, Response, Status};
use tracing::debug;

use self::{
    metadata::Trigger,
    proto::{
        external_scaler_server::ExternalScaler, GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse,
        IsActiveResponse, MetricSpec, MetricValue, ScaledObjectRef,
    },
};
use crate::{
    error::Error,
    redis::{
        group::{backlog, Backlog},
        Redis,
    },
    security::{Caller, Guard},
};

/// KEDA's generated `externalscaler` code: messages, the server trait, the client.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("externalscaler");

    /// The encoded file descriptor set of `externalscaler.proto`, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/externalscaler_descriptor.bin"));
}

/// How often `StreamIsActive` looks at the backlog: an append is pushed
/// within this (plus a round trip). Each look is one script run and one
/// `XPENDING … COUNT 1`.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// The most `StreamIsActive` calls open at once on one sidecar: KEDA holds
/// one per trigger (and operator replica); each polls Redis every
/// [`POLL_INTERVAL`]. Past it a call is RESOURCE_EXHAUSTED, so no client,
/// token or not, can open enough of them to load Redis or exhaust the scaler.
pub const MAX_OPEN_STREAMS: usize = 256;

/// The most entries of each part of the backlog `GetMetrics` counts one by
/// one; beyond, it reports this + 1 (see [`backlog`]). 10,000 entries is
/// far more replicas than any `backlogPerReplica` worth setting asks for.
const METRIC_COUNT_LIMIT: usize = 10_000;

/// Whether the backlog is above zero needs no count: one entry will do.
const ACTIVE_COUNT_LIMIT: usize = 0;

/// The `externalscaler.ExternalScaler` implementation.
#[derive(Clone)]
pub struct Scaler {
    redis: Redis,
    guard: Guard,
    /// A pending entry idle this long is held by no live call
    /// (`--reclaim-min-idle-ms`; calls refresh theirs every third of it).
    unheld_after: Duration,
    /// One permit per open `StreamIsActive` call ([`MAX_OPEN_STREAMS`]).
    open_streams: Arc<Semaphore>,
}

impl Scaler {
    /// Serves KEDA with `redis`; names are checked by `guard`; a pending
    /// entry idle for `unheld_after` (`--reclaim-min-idle-ms`) counts.
    pub fn new(redis: Redis, guard: Guard, unheld_after: Duration) -> Scaler {
        Scaler { redis, guard, unheld_after, open_streams: Arc::new(Semaphore::new(MAX_OPEN_STREAMS)) }
    }

    /// The trigger of `scaled`, its names checked for `caller`.
    fn trigger(&self, caller: Option<&Caller>, scaled: Option<&ScaledObjectRef>) -> Result<Trigger, Error> {
        let empty = Default::default();
        let trigger = Trigger::parse(scaled.map_or(&empty, |s| &s.scaler_metadata))?;
        self.guard.stream(caller, "scalerMetadata.stream", &trigger.stream)?;
        self.guard.name("scalerMetadata.group", &trigger.group)?;
        Ok(trigger)
    }

    /// The trigger's backlog, each part counted up to `limit`; a sharded
    /// stream's is its shards' sum.
    async fn backlog(&self, trigger: &Trigger, limit: usize) -> Result<Backlog, Error> {
        let (stream, group) = (trigger.stream.as_str(), trigger.group.as_str());
        let Some(shards) = self.redis.keys.shards(stream) else {
            self.redis.refuse_sharded("scalerMetadata.stream", stream).await?;
            return self.key_backlog(stream, group, limit).await;
        };
        let mut sum = Backlog::default();
        for key in &shards {
            sum = sum + self.key_backlog(key, group, limit).await?;
        }
        Ok(sum)
    }

    /// The backlog of `group` on the stream key `key`: the group's lag and
    /// unheld pending entries, plus the key's scheduled entries that are due
    /// (`ZCOUNT <key>:scheduled -inf <now ms>`: in the stream within a mover's
    /// poll, so work already). A group that does not exist (no consumer has
    /// subscribed yet, or Redis lost its data, or it was destroyed) has every
    /// entry of the stream as its backlog: scaled to zero, no consumer would
    /// ever create it otherwise, and a consumer woken creates it from its own
    /// start. A stream that does not exist has none.
    async fn key_backlog(&self, key: &str, group: &str, limit: usize) -> Result<Backlog, Error> {
        let mut conn = self.redis.conn.clone();
        let group_backlog = match backlog(&self.redis, key, group, self.unheld_after, limit).await {
            Err(Error::NotFound { .. }) => {
                let entries: u64 = redis::cmd("XLEN")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| Error::from_redis(e, "counting a stream without the group", key))?;
                debug!(stream = %key, %group, entries, "the group does not exist: its backlog is the whole stream");
                Backlog { entries, at_least: false }
            }
            counted => counted?,
        };
        let due: u64 = redis::cmd("ZCOUNT")
            .arg(self.redis.keys.scheduled(key))
            .arg("-inf")
            .arg(crate::entry::now_unix_ms())
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "counting the due scheduled entries", key))?;
        Ok(group_backlog + Backlog { entries: due, at_least: false })
    }

    async fn is_active(&self, trigger: &Trigger) -> Result<bool, Error> {
        Ok(self.backlog(trigger, ACTIVE_COUNT_LIMIT).await?.entries > 0)
    }
}

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(&self, request: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        let trigger = self.trigger(request.extensions().get(), Some(request.get_ref()))?;
        Ok(Response::new(IsActiveResponse { result: Scaler::is_active(self, &trigger).await? }))
    }

    type StreamIsActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let trigger = self.trigger(request.extensions().get(), Some(request.get_ref()))?;
        let permit = self.open_streams.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "{MAX_OPEN_STREAMS} StreamIsActive calls are open on this scaler already: close some, or spread the triggers over more scalers"
            ))
        })?;
        // Bad metadata or a missing group is the call's status, not a message.
        let first = Scaler::is_active(self, &trigger).await?;
        // One message in flight: a slow reader gets the latest change next,
        // and a closed channel tells the task the client went away.
        let (tx, rx) = mpsc::channel(1);
        let scaler = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut last = first;
            if tx.send(Ok(IsActiveResponse { result: last })).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    _ = tx.closed() => break,
                    _ = tokio::time::sleep(POLL_INTERVAL) => {}
                }
                match Scaler::is_active(&scaler, &trigger).await {
                    Ok(active) if active == last => {}
                    Ok(active) => {
                        last = active;
                        if tx.send(Ok(IsActiveResponse { result: active })).await.is_err() {
                            break;
                        }
                    }
                    // KEDA opens the stream again after an error: the group
                    // may be gone, or Redis out of reach.
                    Err(e) => {
                        let _ = tx.send(Err(Status::from(e))).await;
                        break;
                    }
                }
            }
            debug!(stream = %trigger.stream, group = %trigger.group, "StreamIsActive ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let trigger = self.trigger(request.extensions().get(), Some(request.get_ref()))?;
        // KEDA asks for the spec when the ScaledObject is made: a stream that
        // is not one (FAILED_PRECONDITION) or Redis out of reach shows there.
        self.backlog(&trigger, ACTIVE_COUNT_LIMIT).await?;
        let target = trigger.backlog_per_replica;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: trigger.metric_name(),
                target_size: i64::try_from(target).unwrap_or(i64::MAX),
                target_size_float: target as f64,
            }],
        }))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        let trigger = self.trigger(request.extensions().get(), request.get_ref().scaled_object_ref.as_ref())?;
        let backlog = self.backlog(&trigger, METRIC_COUNT_LIMIT).await?;
        if backlog.at_least {
            debug!(stream = %trigger.stream, group = %trigger.group, entries = backlog.entries, "backlog reported as a floor");
        }
        // KEDA asks by the name GetMetricSpec gave, its index prefix removed.
        let name = &request.get_ref().metric_name;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: if name.is_empty() { trigger.metric_name() } else { name.clone() },
                metric_value: i64::try_from(backlog.entries).unwrap_or(i64::MAX),
                metric_value_float: backlog.entries as f64,
            }],
        }))
    }

    type StreamMetricSpecStream = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

    async fn stream_metric_spec(
        &self,
        _request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamMetricSpecStream>, Status> {
        Err(Status::unimplemented("the target per replica never changes while a trigger lives: use GetMetricSpec"))
    }
}
