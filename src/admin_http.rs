//! The admin HTTP port: `/livez`, `/readyz` and `/metrics`, nothing else.
//!
//! It binds all interfaces by default because the kubelet probes the pod IP;
//! the gRPC API stays on loopback.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
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
    /// Why Redis did not serve at the last check, for `/readyz`'s body.
    unready: Arc<Mutex<String>>,
}

impl Readiness {
    /// Records whether Redis served at the last check.
    pub fn set_redis_up(&self, up: bool) {
        self.redis_up.store(up, Ordering::Relaxed);
    }

    /// Records the last check: `None` when Redis serves, else why not (as
    /// [`crate::redis::Redis::unready`] says it), shown by `/readyz`.
    pub fn set_redis_unready(&self, why: Option<&str>) {
        if let Some(why) = why {
            let mut unready = self.unready.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            why.clone_into(&mut unready);
        }
        self.set_redis_up(why.is_none());
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
/// (see [`Readiness::is_ready`]), 503 otherwise, with a body that says why
/// (`not ready: shutting down`, or `not ready: ` and what the last Redis
/// check found).
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

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, String) {
    if readiness.draining.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down\n".to_owned());
    }
    if !readiness.redis_up.load(Ordering::Relaxed) {
        let why = readiness.unready.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n"));
    }
    (StatusCode::OK, "ready\n".to_owned())
}
