//! The StreamService: writing, replaying and trimming streams. One RPC per
//! file, each shaped validate → Redis → response; this file only routes.

mod append;
mod read;
mod trim;

use tonic::{Request, Response, Status};

pub use append::{MAX_BATCH_ENTRIES, MAX_FIELDS_PER_ENTRY};
pub use read::{page_size, parse_bound, DEFAULT_PAGE, MAX_PAGE};

use crate::{
    proto::{
        stream_service_server::StreamService, AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse,
        ReadRequest, ReadResponse, TrimRequest, TrimResponse,
    },
    redis::Redis,
};

/// The StreamService implementation.
#[derive(Clone)]
pub struct Streams {
    redis: Redis,
    id_field: String,
}

impl Streams {
    /// Serves streams with `redis`; branded ids live in the field `id_field`.
    pub fn new(redis: Redis, id_field: String) -> Streams {
        Streams { redis, id_field }
    }
}

#[tonic::async_trait]
impl StreamService for Streams {
    async fn append(&self, request: Request<AppendRequest>) -> Result<Response<AppendResponse>, Status> {
        Ok(Response::new(append::append(self, request.into_inner()).await?))
    }

    async fn append_batch(
        &self,
        request: Request<AppendBatchRequest>,
    ) -> Result<Response<AppendBatchResponse>, Status> {
        Ok(Response::new(append::append_batch(self, request.into_inner()).await?))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<ReadResponse>, Status> {
        Ok(Response::new(read::read(self, request.into_inner()).await?))
    }

    async fn trim(&self, request: Request<TrimRequest>) -> Result<Response<TrimResponse>, Status> {
        Ok(Response::new(trim::trim(self, request.into_inner()).await?))
    }
}

/// Checks a stream key named in `field`: 1 to
/// [`MAX_STREAM_NAME_BYTES`](crate::consume::MAX_STREAM_NAME_BYTES) bytes.
pub(crate) fn checked_stream<'a>(field: &'static str, stream: &'a str) -> Result<&'a str, crate::error::Error> {
    if stream.is_empty() || stream.len() > crate::consume::MAX_STREAM_NAME_BYTES {
        return Err(crate::error::Error::invalid(
            field,
            format!("required, 1 to {} bytes", crate::consume::MAX_STREAM_NAME_BYTES),
        ));
    }
    Ok(stream)
}
