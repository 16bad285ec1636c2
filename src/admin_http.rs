//! The admin HTTP port: `/livez`, `/readyz` and `/metrics`, nothing else.
//!
//! It binds all interfaces by default because the kubelet probes the pod IP;
//! the gRPC API stays on loopback.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use axum::{extract::State, http::StatusCode, routing::get, Router};

use crate::metrics::Metrics;
use tokio::net::TcpListener;

/// What readiness depends on. Cheap to clone; shared with the Redis pinger and
/// the shutdown sequence.
#[derive(Clone, Default)]
pub struct Readiness {
    redis_up: Arc<AtomicBool>,
    draining: Arc<AtomicBool>,
}

impl Readiness {
    /// Records whether Redis answered the last PING.
    pub fn set_redis_up(&self, up: bool) {
        self.redis_up.store(up, Ordering::Relaxed);
    }

    /// Records that shutdown has begun.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Ready: Redis answers and the sidecar is not shutting down.
    pub fn is_ready(&self) -> bool {
        self.redis_up.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }
}

/// Serves the admin port on `listener` until `shutdown` resolves.
///
/// `GET /livez`: 200 while the process serves. `GET /readyz`: 200 when ready
/// (see [`Readiness::is_ready`]), 503 otherwise.
///
/// `GET /metrics`: the Prometheus text exposition of [`Metrics`].
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(readiness)
        .route("/metrics", get(move || std::future::ready(exposition(&metrics))));
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

fn exposition(metrics: &Metrics) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        metrics.encode(),
    )
}

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}
