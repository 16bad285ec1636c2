//! The AdminService: what is stuck, dead letters back to work, and a group
//! destroyed with its keys. One RPC per file; this file only routes.

mod dead_letters;
mod describe;
mod destroy;

use tonic::{Request, Response, Status};

use crate::{
    proto::{
        admin_service_server::AdminService, DescribeGroupRequest, DescribeGroupResponse, DestroyGroupRequest,
        DestroyGroupResponse, ListDeadLettersRequest, ListDeadLettersResponse, ReplayDeadLettersRequest,
        ReplayDeadLettersResponse,
    },
    redis::Redis,
    security::Guard,
};

/// The AdminService implementation.
#[derive(Clone)]
pub struct Admin {
    redis: Redis,
    id_field: String,
    guard: Guard,
    /// The archive DescribeGroup reports on (`--archive-url`).
    archive: Option<std::sync::Arc<crate::stream::fold::Folding>>,
    /// How a replay writes: through the durable writer when writes wait for replicas.
    writes: crate::durable::Writes,
}

impl Admin {
    /// Serves the AdminService with `redis`; branded ids live in `id_field`;
    /// names are checked by `guard`; DescribeGroup reports on `archive`;
    /// ReplayDeadLetters writes as `writes` says (confirmed by `WAIT` or not).
    pub fn new(
        redis: Redis,
        id_field: String,
        guard: Guard,
        archive: Option<std::sync::Arc<crate::stream::fold::Folding>>,
        writes: crate::durable::Writes,
    ) -> Admin {
        Admin { redis, id_field, guard, archive, writes }
    }
}

#[tonic::async_trait]
impl AdminService for Admin {
    async fn describe_group(
        &self,
        request: Request<DescribeGroupRequest>,
    ) -> Result<Response<DescribeGroupResponse>, Status> {
        Ok(Response::new(describe::describe_group(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn list_dead_letters(
        &self,
        request: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        Ok(Response::new(dead_letters::list(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn replay_dead_letters(
        &self,
        request: Request<ReplayDeadLettersRequest>,
    ) -> Result<Response<ReplayDeadLettersResponse>, Status> {
        Ok(Response::new(dead_letters::replay(self, request.extensions().get(), request.get_ref()).await?))
    }

    async fn destroy_group(
        &self,
        request: Request<DestroyGroupRequest>,
    ) -> Result<Response<DestroyGroupResponse>, Status> {
        Ok(Response::new(destroy::destroy_group(self, request.extensions().get(), request.get_ref()).await?))
    }
}
