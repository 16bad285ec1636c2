//! The StreamService: writing, replaying and trimming streams. One RPC per
//! file, each shaped validate → Redis → response; this file only routes.

mod append;
pub mod fold;
mod read;
pub mod retention;
pub mod scheduled;
pub(crate) mod trim;

use std::sync::Arc;

use tonic::{Request, Response, Status};

use fold::Folding;

pub use append::MAX_BATCH_ENTRIES;
pub use read::parse_bound;

use crate::{
    durable::Writes,
    metrics::Metrics,
    proto::{
        stream_service_server::StreamService, AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse,
        CancelScheduledRequest, CancelScheduledResponse, ListScheduledRequest, ListScheduledResponse, ReadRequest,
        ReadResponse, TrimRequest, TrimResponse,
    },
    redis::{Redis, UnreadTrimmed},
    security::Guard,
};

/// The StreamService implementation.
#[derive(Clone)]
pub struct Streams {
    redis: Redis,
    id_field: String,
    guard: Guard,
    /// Where appends are counted (`echomq_appends_total`).
    metrics: Arc<Metrics>,
    /// The archive trims fold into and Read reads from (`--archive-url`).
    archive: Option<Arc<Folding>>,
    /// How appends are written: waiting for replicas or not, the dedup window.
    writes: Writes,
    /// Wakes this sidecar's mover at the due time of an entry it scheduled.
    mover_wake: scheduled::MoverWake,
}

impl Streams {
    /// Serves streams with `redis`; branded ids live in the field `id_field`;
    /// names are checked by `guard`; appends are counted in `metrics`; trims
    /// fold into `archive` first, and Read reads it, when there is one;
    /// appends are written as `writes` says (durable or not, dedup window);
    /// a scheduled append wakes the mover through `mover_wake` at its due time.
    pub fn new(
        redis: Redis,
        id_field: String,
        guard: Guard,
        metrics: Arc<Metrics>,
        archive: Option<Arc<Folding>>,
        writes: Writes,
        mover_wake: scheduled::MoverWake,
    ) -> Streams {
        Streams { redis, id_field, guard, metrics, archive, writes, mover_wake }
    }
}

impl Streams {
    /// Counts and logs the entries a trim of `stream` (by `cause`: `trim`,
    /// `append_max_len`) removed before a group was delivered them.
    fn report_unread_trimmed(&self, stream: &str, unread: &[UnreadTrimmed], cause: &'static str) {
        let sharded_stream = self.redis.keys.sharded_stream_of(stream);
        for UnreadTrimmed { group, entries } in unread {
            match entries {
                Some(entries) => {
                    self.metrics.streams.trimmed_unread(stream, sharded_stream, group, *entries);
                    tracing::warn!(%stream, %group, entries, cause, "a trim removed entries before the group was delivered them");
                }
                None => tracing::warn!(
                    %stream,
                    %group,
                    cause,
                    "a trim removed more than 100,000 entries before the group was delivered them (not counted)"
                ),
            }
        }
    }
}

#[tonic::async_trait]
impl StreamService for Streams {
    async fn append(&self, request: Request<AppendRequest>) -> Result<Response<AppendResponse>, Status> {
        Ok(Response::new(
            append::append(self, request.extensions().get(), traceparent(&request), request.get_ref()).await?,
        ))
    }

    async fn append_batch(
        &self,
        request: Request<AppendBatchRequest>,
    ) -> Result<Response<AppendBatchResponse>, Status> {
        Ok(Response::new(
            append::append_batch(self, request.extensions().get(), traceparent(&request), request.get_ref()).await?,
        ))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        Ok(Response::new(read::read(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn trim(&self, request: Request<TrimRequest>) -> Result<Response<TrimResponse>, Status> {
        Ok(Response::new(trim::trim(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn cancel_scheduled(
        &self,
        request: Request<CancelScheduledRequest>,
    ) -> Result<Response<CancelScheduledResponse>, Status> {
        Ok(Response::new(scheduled::cancel(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn list_scheduled(
        &self,
        request: Request<ListScheduledRequest>,
    ) -> Result<Response<ListScheduledResponse>, Status> {
        Ok(Response::new(scheduled::list(self, request.extensions().get(), request.get_ref()).await?))
    }
}

/// The caller's W3C trace context, from the gRPC `traceparent` header.
fn traceparent<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get(crate::telemetry::TRACE_FIELD).and_then(|value| value.to_str().ok())
}
