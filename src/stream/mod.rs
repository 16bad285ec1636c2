//! The StreamService: writing, replaying and trimming streams. One RPC per
//! file, each shaped validate → Redis → response; this file only routes.

mod append;
mod read;
mod trim;

use tonic::{Request, Response, Status};

pub use append::MAX_BATCH_ENTRIES;
pub use read::{page, page_size, parse_bound, Page, DEFAULT_PAGE, MAX_PAGE};

use crate::{
    proto::{
        stream_service_server::StreamService, AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse,
        ReadRequest, ReadResponse, TrimRequest, TrimResponse,
    },
    redis::Redis,
    security::Guard,
};

/// The StreamService implementation.
#[derive(Clone)]
pub struct Streams {
    redis: Redis,
    id_field: String,
    guard: Guard,
}

impl Streams {
    /// Serves streams with `redis`; branded ids live in the field `id_field`;
    /// names are checked by `guard`.
    pub fn new(redis: Redis, id_field: String, guard: Guard) -> Streams {
        Streams { redis, id_field, guard }
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
}

/// INVALID_ARGUMENT when `stream` names a sharded stream, configured here or
/// recorded in Redis by other sidecars (one `GET`): for calls that work on one
/// stream key (Read, Trim, dead letters), which must name a shard. The
/// message lists the shard keys. Errors also as
/// [`Redis::recorded_shard_count`] when the `GET` fails.
pub async fn not_sharded(redis: &Redis, field: &'static str, stream: &str) -> Result<(), crate::error::Error> {
    let (count, origin) = match redis.keys.shards(stream) {
        Some(shards) => (shards.len() as u32, ""),
        None => match redis.recorded_shard_count(stream).await? {
            Some(count) => (count, ", recorded in Redis by the sidecars that shard it"),
            None => return Ok(()),
        },
    };
    Err(crate::error::Error::invalid(
        field,
        format!(
            "`{stream}` is a sharded stream of {count} shards{origin}; name one shard's key (`{}` … `{}`)",
            crate::keys::shard_key(stream, 0),
            crate::keys::shard_key(stream, count - 1)
        ),
    ))
}

/// The caller's W3C trace context, from the gRPC `traceparent` header.
fn traceparent<T>(request: &Request<T>) -> Option<&str> {
    request.metadata().get(crate::telemetry::TRACE_FIELD).and_then(|value| value.to_str().ok())
}
