//! A gRPC service served from the start that answers UNAVAILABLE until the
//! sidecar has what it needs to serve for real (Redis reached), then hands
//! every call to the real service.
//!
//! The port is bound and HTTP/2 spoken from the first moment, so health
//! (`NOT_SERVING`) and reflection answer while Redis is still out of reach,
//! and a client sees a gRPC status that says why, not a dial timeout.

use std::sync::{Arc, OnceLock};

use tonic::{
    codegen::{http, BoxFuture, Context, Poll, Service},
    server::NamedService,
    Status,
};

/// The service `S` once [`Deferred::set`] gave it; until then every call is
/// answered UNAVAILABLE with `waiting`'s message. Clones share the slot.
pub struct Deferred<S> {
    slot: Arc<OnceLock<S>>,
    waiting: &'static str,
}

impl<S> Clone for Deferred<S> {
    fn clone(&self) -> Self {
        Deferred { slot: self.slot.clone(), waiting: self.waiting }
    }
}

impl<S> Deferred<S> {
    /// An empty slot; calls get UNAVAILABLE `waiting` (a sentence for a person:
    /// what is missing, and that retrying later will do).
    pub fn new(waiting: &'static str) -> Deferred<S> {
        Deferred { slot: Arc::new(OnceLock::new()), waiting }
    }

    /// Fills the slot; later calls go to `service`. A second call does nothing.
    pub fn set(&self, service: S) {
        let _ = self.slot.set(service);
    }
}

impl<S, B> Service<http::Request<B>> for Deferred<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    // tonic's generated services are always ready; the clone made in `call` is polled there.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        match self.slot.get() {
            Some(service) => {
                let mut service = service.clone();
                Box::pin(async move {
                    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
                    service.call(request).await
                })
            }
            None => {
                let status = Status::unavailable(self.waiting);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

impl<S: NamedService> NamedService for Deferred<S> {
    const NAME: &'static str = S::NAME;
}
