//! Start-up order, listeners, and the shutdown sequence.
//!
//! Start: bind both ports (fail fast on a taken port), serve the admin port
//! (live, not ready), connect to Redis (retrying with backoff), then serve gRPC
//! and report SERVING.
//!
//! Shutdown, when the injected `shutdown` future resolves (SIGTERM or SIGINT in
//! the binary): health NOT_SERVING and `/readyz` 503; workers stop handing out
//! entries; calls get the grace period to settle what they hold (acks still
//! work); then calls end with UNAVAILABLE, the server stops, the workers flush
//! their last acks, and the outcome is logged. A second SIGTERM or SIGINT
//! during the grace ends it at once (logged). What was not acknowledged stays
//! pending in Redis: nothing is lost.

use std::{future::Future, io, path::Path, sync::Arc, time::Duration};

use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio::{
    net::{TcpListener, UnixListener},
    sync::watch,
    task::JoinHandle,
    time::{sleep, Instant},
};
use tokio_stream::{
    wrappers::{TcpListenerStream, UnixListenerStream},
    StreamExt,
};
use tonic::{
    service::interceptor::InterceptedService,
    transport::{Certificate, Identity, Server, ServerTlsConfig},
};
use tonic_health::ServingStatus;
use tracing::{error, info, warn};

use crate::{
    admin::Admin,
    admin_http::{self, Readiness},
    archive::Archive,
    config::{Config, Listen},
    consume::{Consumers, Signals},
    deferred::Deferred,
    keda::{proto::external_scaler_server::ExternalScalerServer, Scaler},
    metrics::Metrics,
    proto::{
        admin_service_server::AdminServiceServer, consumer_service_server::ConsumerServiceServer,
        stream_service_server::StreamServiceServer,
    },
    redis::{primary::redacted_url, version::VersionError, ConnectOptions, Redis},
    security::{Gate, Guard},
    stream::{
        fold::{FileSizes, Folding},
        Streams,
    },
};

/// The services whose health is reported: the server as a whole (`""`) and each EchoMQ service.
const SERVICES: [&str; 4] = ["", "echomq.v1.ConsumerService", "echomq.v1.StreamService", "echomq.v1.AdminService"];
/// What the EchoMQ services answer (UNAVAILABLE) until Redis has answered.
const REDIS_NOT_YET: &str = "the sidecar has not reached Redis yet (it keeps trying; its log says why): retry shortly";
/// How long the server may take to close connections after calls have ended.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long group workers may take to flush their last acks.
const WORKER_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How often Redis is pinged for readiness.
const READINESS_PING: Duration = Duration::from_secs(1);
/// Every this many pings (and whenever Redis is back), the shard counts are
/// recorded again: a Redis restart without persistence forgets them, and
/// sidecars not started with a sharded stream rely on them to refuse it.
const SHARD_RECORD_EVERY_PINGS: u32 = 10;

/// Why the sidecar could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listen address could not be bound (taken, or not allowed).
    #[error("cannot listen on {what} {address}: {source}")]
    Bind {
        /// Which port: `gRPC` or `admin`.
        what: &'static str,
        /// The address as configured.
        address: String,
        /// The OS error.
        source: io::Error,
    },
    /// A setting names a file that cannot be read or used.
    #[error("{0}")]
    Config(String),
    /// The Redis URL cannot be used at all (not a reachability problem).
    #[error("bad Redis URL: {0}")]
    RedisUrl(redis::RedisError),
    /// Redis (or its Sentinels) refused the sidecar's settings at start: a
    /// wrong or missing password, an unknown ACL user, a database index out of
    /// range, no usable Sentinel. Waiting will not mend it.
    #[error("Redis refused the sidecar's settings ({target}): {reason}; fix the setting and start again")]
    RedisSettings {
        /// The Redis URL, its passwords redacted.
        target: String,
        /// What Redis said.
        reason: String,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                warn!("cannot listen for SIGTERM ({e}); only SIGINT stops the sidecar gracefully");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
    }
}

/// Runs the sidecar until `shutdown` resolves, then shuts down in order.
///
/// Errors: [`AppError::Bind`] when a port is taken, [`AppError::RedisUrl`] for
/// an unusable URL, [`AppError::Serve`] when the gRPC server fails.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), AppError> {
    // One TLS implementation for gRPC and Redis: rustls on ring. Already
    // installed when tests run several sidecars in one process.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let consumer = config.consume.consumer_name();
    let files = Files::read(&config)?;
    let archive = open_archive(&config).await?;
    let guard = new_guard(&config, &files);
    let admin_listener = TcpListener::bind(config.admin.admin_listen).await.map_err(|source| AppError::Bind {
        what: "admin",
        address: config.admin.admin_listen.to_string(),
        source,
    })?;
    let grpc_listener = bind_grpc(&config.server.listen).await?;
    let scaler_listener = match config.server.keda_scaler_listen {
        Some(address) => Some(TcpListener::bind(address).await.map_err(|source| AppError::Bind {
            what: "KEDA scaler",
            address: address.to_string(),
            source,
        })?),
        None => None,
    };

    // Built before connecting to Redis, so unusable TLS files fail the start at once.
    let mut builder = Server::builder()
        // Dead clients are noticed even when they hold entries and send nothing.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = files.tls.clone() {
        builder = builder.tls_config(tls).map_err(|e| {
            AppError::Config(format!("--tls-cert-file/--tls-key-file/--tls-client-ca-file: {}", error_chain(&e)))
        })?;
    }
    let metrics = Arc::new(Metrics::new());
    // Outermost, so every call is counted by the status its client gets,
    // after the rewrite below (layers added first wrap those added later).
    let builder = builder.layer(crate::metrics::grpc::GrpcLayer::new(metrics.grpc()));
    // tonic refuses a request message before any handler sees it, with its own
    // codes: OUT_OF_RANGE for an oversized one (gRPC's code is
    // RESOURCE_EXHAUSTED) and INTERNAL for one it cannot decode, such as a
    // string field that is not UTF-8 (bad input: INVALID_ARGUMENT). Here, inside
    // the metrics layer, so calls are counted by the status the client gets.
    let mut builder = builder.layer(tower::util::MapResponseLayer::new(crate::error::refused_request_status));
    let admin_address =
        admin_listener.local_addr().map_or_else(|_| config.admin.admin_listen.to_string(), |a| a.to_string());
    let readiness = Readiness::default();
    let (stopped_tx, stopped) = watch::channel(false);
    let admin =
        tokio::spawn(admin_http::serve(admin_listener, readiness.clone(), metrics.clone(), wait_true(stopped.clone())));
    let grpc_address = match &grpc_listener {
        GrpcListener::Tcp(listener) => {
            listener.local_addr().map_or_else(|_| config.server.listen.to_string(), |a| a.to_string())
        }
        GrpcListener::Unix(_) => config.server.listen.to_string(),
    };
    info!(admin = %admin_address, grpc = %grpc_address, %consumer, "echomq-sidecar starting");

    // Health, reflection and the port are served from the start; the EchoMQ
    // services answer UNAVAILABLE until Redis has answered (see `deferred`).
    let (health, health_service) = tonic_health::server::health_reporter();
    for service in SERVICES {
        health.set_service_status(service, ServingStatus::NotServing).await;
    }
    let max = config.server.max_message_bytes;
    let consumer_service = Deferred::new(REDIS_NOT_YET);
    let stream_service = Deferred::new(REDIS_NOT_YET);
    let admin_service = Deferred::new(REDIS_NOT_YET);
    let keda_service = Deferred::new(REDIS_NOT_YET);
    // Both versions: grpcurl speaks v1, Python's grpcio-reflection only v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // KEDA's scaler on the gRPC port, unless it has a port of its own.
    let keda = config.server.keda_scaler && scaler_listener.is_none();
    // KEDA's service is listed only where it is served.
    let reflection = || {
        let builder = reflection();
        if keda {
            builder.register_encoded_file_descriptor_set(crate::keda::proto::FILE_DESCRIPTOR_SET)
        } else {
            builder
        }
    };
    let reflection_v1 = reflection().build_v1().expect("the embedded descriptors are valid");
    let reflection_v1alpha = reflection().build_v1alpha().expect("the embedded descriptors are valid");

    // The gate (bearer token, caller identity) sits in front of the EchoMQ
    // services only: health and reflection stay open for probes and grpcurl.
    let admit = {
        let gate = guard.gate().clone();
        move |request| gate.admit(request)
    };
    let (closing_tx, closing) = watch::channel(false);
    // The scaler's own port: KEDA's service, health and reflection, nothing
    // else, and no bearer token asked (KEDA's client cannot send one).
    let scaler_server = scaler_listener.map(|listener| {
        let gate = guard.gate().without_token();
        let admit = move |request| gate.admit(request);
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(crate::keda::proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let router = builder
            .clone()
            .add_service(health_service.clone())
            .add_service(reflection().build_v1().expect("the embedded descriptors are valid"))
            .add_service(reflection().build_v1alpha().expect("the embedded descriptors are valid"))
            .add_service(InterceptedService::new(keda_service.clone(), admit));
        let address = listener.local_addr().map_or_else(|_| String::from("?"), |a| a.to_string());
        info!(%address, "serving the KEDA scaler on its own port");
        let stop = wait_true(closing.clone());
        tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop).await {
                warn!("the KEDA scaler's port failed: {}", error_chain(&e));
            }
        })
    });
    let router = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(InterceptedService::new(consumer_service.clone(), admit.clone()))
        .add_service(InterceptedService::new(stream_service.clone(), admit.clone()))
        .add_service(InterceptedService::new(admin_service.clone(), admit.clone()))
        // Not added without --keda-scaler: tonic answers its calls UNIMPLEMENTED.
        .add_optional_service(keda.then(|| InterceptedService::new(keda_service.clone(), admit)));
    let stop_serving = wait_true(closing.clone());
    let mut server = tokio::spawn(async move {
        match grpc_listener {
            GrpcListener::Tcp(listener) => {
                // Deliveries are small frames where latency matters: no Nagle.
                let incoming = TcpListenerStream::new(listener).map(|conn| {
                    conn.inspect(|c| {
                        let _ = c.set_nodelay(true);
                    })
                });
                router.serve_with_incoming_shutdown(incoming, stop_serving).await
            }
            GrpcListener::Unix(listener) => {
                router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop_serving).await
            }
        }
    });
    info!("serving health and reflection; the EchoMQ services wait for Redis");

    tokio::pin!(shutdown);
    let redis_timeout = config.redis.redis_timeout;
    let redis = tokio::select! {
        redis = connect_with_backoff(&config, &files, redis_timeout, metrics.clone()) => redis.map(Some),
        _ = &mut shutdown => {
            info!("shutdown before Redis was reachable");
            Ok(None)
        }
    };
    let started = match redis {
        Ok(Some(redis)) => prepare_redis(redis, &config, redis_timeout).await.map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(e),
    };
    let (redis, writes, wake) = match started {
        Ok(Some(started)) => started,
        stopped_or_failed => {
            let _ = closing_tx.send(true);
            let _ = tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut server).await;
            let _ = stopped_tx.send(true);
            let _ = admin.await;
            return stopped_or_failed.map(|_| ());
        }
    };

    let (draining_tx, draining) = watch::channel(false);
    let folding = archive.map(|archive| new_folding(&config, archive, consumer.clone(), metrics.clone()));
    let retention = tokio::spawn(crate::stream::retention::run(
        redis.clone(),
        folding.clone(),
        config.archive.retention.clone(),
        config.archive.retention_interval,
        draining.clone(),
    ));
    let mover_wake = crate::stream::scheduled::MoverWake::default();
    let mover = tokio::spawn(crate::stream::scheduled::run(
        crate::stream::scheduled::Mover {
            redis: redis.clone(),
            id_field: config.appends.id_field.clone(),
            writes: writes.clone(),
            owner: consumer.clone(),
            metrics: metrics.clone(),
            warned: Default::default(),
        },
        config.appends.schedule_poll,
        config.appends.schedule_idle_poll,
        mover_wake.clone(),
        draining.clone(),
    ));
    let (redis_up_tx, redis_up) = watch::channel(true);
    let signals = Signals { draining, closing, redis_up };
    let consumers = Consumers::new(
        redis.clone(),
        metrics.clone(),
        &config,
        consumer,
        signals,
        guard.clone(),
        writes.durable.clone(),
        wake,
    );
    consumer_service.set(
        ConsumerServiceServer::new(consumers.clone()).max_decoding_message_size(max).max_encoding_message_size(max),
    );
    stream_service.set(
        StreamServiceServer::new(Streams::new(
            redis.clone(),
            config.appends.id_field.clone(),
            guard.clone(),
            metrics.clone(),
            folding.clone(),
            writes.clone(),
            mover_wake,
        ))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max),
    );
    admin_service.set(
        AdminServiceServer::new(Admin::new(
            redis.clone(),
            config.appends.id_field.clone(),
            guard.clone(),
            folding,
            writes,
        ))
        .max_decoding_message_size(max)
        .max_encoding_message_size(max),
    );
    keda_service.set(
        ExternalScalerServer::new(Scaler::new(redis.clone(), guard.clone(), config.consume.reclaim_min_idle))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
    );
    // Ready only once the services answer: a probe that sees 200 (or
    // SERVING) before they are set would send calls to the placeholders.
    readiness.set_redis_up(true);
    for service in SERVICES {
        health.set_service_status(service, ServingStatus::Serving).await;
    }
    let pinger = tokio::spawn(ping_loop(redis, readiness.clone(), health.clone(), SERVICES, redis_up_tx));
    info!("serving");

    let mut running = Running {
        consumers,
        readiness,
        health,
        draining: draining_tx,
        closing: closing_tx,
        stopped: stopped_tx,
        server,
        scaler_server,
        retention,
        mover,
        pinger,
        admin,
    };
    tokio::select! {
        _ = &mut shutdown => {}
        result = &mut running.server => {
            let _ = running.stopped.send(true);
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(AppError::Serve(e)),
                Err(e) => {
                    error!("gRPC server task failed: {e}");
                    Ok(())
                }
            };
        }
    }
    running.shut_down(config.server.shutdown_grace, &config.server.listen).await;
    Ok(())
}

/// What runs once the services are set: what the shutdown sequence stops.
struct Running {
    consumers: Consumers,
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
    /// Turned true first: the workers stop reading.
    draining: watch::Sender<bool>,
    /// Turned true when calls are to end: the gRPC server stops serving.
    closing: watch::Sender<bool>,
    /// Turned true last: the admin port stops.
    stopped: watch::Sender<bool>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    /// The KEDA scaler's own port (`--keda-scaler-listen`), stopped with the gRPC port.
    scaler_server: Option<JoinHandle<()>>,
    retention: JoinHandle<()>,
    /// The scheduled-entry mover: stops with the retention (a move step is one script, atomic).
    mover: JoinHandle<()>,
    pinger: JoinHandle<()>,
    admin: JoinHandle<io::Result<()>>,
}

impl Running {
    /// The shutdown sequence (see the module doc): calls get `grace` to
    /// settle what they hold; a Unix socket at `listen` is removed; the
    /// outcome is logged.
    async fn shut_down(self, grace: Duration, listen: &Listen) {
        let Running {
            consumers,
            readiness,
            health,
            draining,
            closing,
            stopped,
            mut server,
            scaler_server,
            retention,
            mover,
            pinger,
            admin,
        } = self;
        // By convention a second SIGTERM or SIGINT ends the grace at once;
        // listening starts now, so one sent right after the first is not missed.
        let second_signal = shutdown_signal();
        tokio::pin!(second_signal);
        info!(
            ?grace,
            held = consumers.held(),
            "shutting down: not serving, no new deliveries, calls may settle what they hold"
        );
        // Reading stops first: each worker cuts off its blocked XREADGROUP, and
        // once Redis has seen that connection close, entries appended afterwards
        // stay in the stream for the next reader instead of this consumer's PEL.
        let _ = draining.send(true);
        // Draining before health, so that the ping loop cannot put health back.
        readiness.set_draining();
        for service in SERVICES {
            health.set_service_status(service, ServingStatus::NotServing).await;
        }
        let deadline = Instant::now() + grace;
        while consumers.held() > 0 && Instant::now() < deadline {
            tokio::select! {
                _ = sleep(Duration::from_millis(20)) => {}
                _ = &mut second_signal => {
                    warn!(
                        held = consumers.held(),
                        "second signal: ending the grace period now; what calls still hold stays pending"
                    );
                    break;
                }
            }
        }
        let _ = closing.send(true);
        if tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut server).await.is_err() {
            warn!("gRPC connections did not close within {SERVER_STOP_TIMEOUT:?}; stopping anyway");
            server.abort();
        }
        if let Some(mut scaler_server) = scaler_server {
            if tokio::time::timeout(SERVER_STOP_TIMEOUT, &mut scaler_server).await.is_err() {
                warn!("KEDA scaler connections did not close within {SERVER_STOP_TIMEOUT:?}; stopping anyway");
                scaler_server.abort();
            }
        }
        consumers.shutdown(WORKER_STOP_TIMEOUT).await;
        // A fold in progress stops where it is: committed files stay, the trim
        // that would follow simply does not happen.
        retention.abort();
        mover.abort();
        pinger.abort();
        let _ = stopped.send(true);
        let _ = admin.await;
        if let Listen::Unix(path) = listen {
            let _ = std::fs::remove_file(path);
        }
        // Held when the grace ran out, or returned by calls that ended without a verdict.
        let unsettled = consumers.returned_while_draining();
        if unsettled == 0 {
            info!("shut down: every delivery was settled");
        } else {
            warn!(unsettled, "shut down: un-settled deliveries stay pending and will be delivered again");
        }
    }
}

/// The gate (bearer token, the stream allow-lists) and the name and size limits, from the settings.
fn new_guard(config: &Config, files: &Files) -> Guard {
    Guard::new(
        Gate::new(
            files.auth_token.clone(),
            config.security.allow_streams.clone(),
            config.security.allow_streams_for.iter().cloned().collect(),
        ),
        config.server.max_name_bytes,
        config.server.max_fields_per_entry,
        config.server.max_message_bytes,
    )
}

/// The fold-then-trim of `archive`, with the file sizes of the settings; `owner` names this sidecar in leases.
fn new_folding(config: &Config, archive: Archive, owner: String, metrics: Arc<Metrics>) -> Arc<Folding> {
    let file_entries = usize::try_from(config.archive.archive_file_entries).unwrap_or(usize::MAX);
    let partial_interval = config.archive.archive_partial_file_interval;
    let sizes = FileSizes { entries: file_entries, partial_interval };
    Arc::new(Folding::new(archive, config.appends.id_field.clone(), sizes, owner, metrics))
}

/// Checks what the sidecar needs of the server `redis` reached, records the
/// sharded streams' counts and starts the writes. Each refusal is a setting
/// to fix, [`AppError::Config`] (exit 2), never a failure call after call
/// later: a server older than the floor (it lacks commands the sidecar
/// needs), a shard count that disagrees with Redis, writes that wait for
/// what the server cannot do (WAITAOF on Redis 7.0).
async fn prepare_redis(
    mut redis: Redis,
    config: &Config,
    redis_timeout: Duration,
) -> Result<(Redis, crate::durable::Writes, Option<Arc<crate::redis::wake::WakeHub>>), AppError> {
    match redis.check_server_version().await {
        Ok(server) => info!(%server, "the Redis server is new enough"),
        Err(e @ VersionError::TooOld { .. }) => return Err(AppError::Config(e.to_string())),
        // INFO refused (an ACL without +info) or unreadable (a proxy): say so, and run.
        Err(e) => warn!("{e}; going on without knowing the server's version"),
    }
    redis.record_shard_counts().await.map_err(|e| AppError::Config(e.to_string()))?;
    let durability = crate::durable::Durability {
        replicas: config.appends.wait_replicas,
        aof: config.appends.wait_aof,
        timeout: config.appends.wait_timeout,
    };
    let dedup_window = config.appends.dedup_window;
    let writes = crate::durable::Writes::start(&redis, durability, dedup_window, redis_timeout)
        .await
        .map_err(AppError::Config)?;
    redis.warn_of_plain_namesakes().await;
    let wake = crate::consume::wake_hub(&redis, config).await.map_err(AppError::Config)?;
    Ok((redis, writes, wake))
}

/// How long the archive may take to answer the start's probe write.
const ARCHIVE_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens `--archive-url` and checks that the store accepts a write (a probe
/// object written, read and deleted): a URL that cannot be used, or a store
/// that refuses or does not answer within 10 s, is [`AppError::Config`] (exit 2).
async fn open_archive(config: &Config) -> Result<Option<Archive>, AppError> {
    let Some(url) = &config.archive.archive_url else { return Ok(None) };
    let archive = Archive::open(url).map_err(|e| AppError::Config(format!("--archive-url: {e}")))?;
    match tokio::time::timeout(ARCHIVE_PROBE_TIMEOUT, archive.probe()).await {
        Ok(Ok(())) => {
            info!(archive = %archive.url(), "the archive accepts writes: trims fold into it first");
            Ok(Some(archive))
        }
        Ok(Err(e)) => Err(AppError::Config(format!(
            "--archive-url {url}: the archive refused a probe write: {e}{}",
            s3_settings_hint(url)
        ))),
        Err(_) => Err(AppError::Config(format!(
            "--archive-url {url}: the archive did not answer within {ARCHIVE_PROBE_TIMEOUT:?}{}",
            s3_settings_hint(url)
        ))),
    }
}

/// For an `s3://` URL, which endpoint it was tried at: without
/// `AWS_ENDPOINT_URL` the S3 client goes to AWS, and without credentials it
/// asks the instance metadata service (169.254.169.254), which is what a
/// failure then names.
fn s3_settings_hint(url: &str) -> String {
    if !url.starts_with("s3://") {
        return String::new();
    }
    let endpoint = std::env::var("AWS_ENDPOINT_URL").or_else(|_| std::env::var("AWS_ENDPOINT"));
    let credentials = std::env::var_os("AWS_ACCESS_KEY_ID").is_some();
    match (endpoint, credentials) {
        (Ok(endpoint), true) => format!(" (endpoint {endpoint})"),
        (Ok(endpoint), false) => format!(
            " (endpoint {endpoint}; no AWS_ACCESS_KEY_ID, so the credentials were sought from the instance metadata service)"
        ),
        (Err(_), _) => " (no AWS_ENDPOINT_URL: AWS itself; set it for another S3-compatible store)".to_owned(),
    }
}

enum GrpcListener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

async fn bind_grpc(listen: &Listen) -> Result<GrpcListener, AppError> {
    let bind_error = |source| AppError::Bind { what: "gRPC", address: listen.to_string(), source };
    match listen {
        Listen::Tcp(address) => TcpListener::bind(address).await.map(GrpcListener::Tcp).map_err(bind_error),
        Listen::Unix(path) => {
            remove_stale_socket(path).map_err(bind_error)?;
            let listener = UnixListener::bind(path).map_err(bind_error)?;
            // Group read/write: an app container of another user in the same
            // fsGroup can connect; others cannot.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_error)?;
            Ok(GrpcListener::Unix(listener))
        }
    }
}

/// A socket file left by a previous run (after kill -9) would make bind fail:
/// it is removed, unless a live sidecar still accepts connections on it (then
/// binding would steal its clients): AddrInUse.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        return Ok(());
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(io::ErrorKind::AddrInUse, "another process is listening on this socket"));
    }
    std::fs::remove_file(path)
}

/// What the settings' files hold, read once at start so a bad path fails fast.
struct Files {
    auth_token: Option<String>,
    tls: Option<ServerTlsConfig>,
    redis_password: Option<String>,
    redis_ca: Option<Vec<u8>>,
    /// `--sentinel-password`, or read from `--sentinel-password-file`.
    sentinel_password: Option<String>,
}

impl Files {
    fn read(config: &Config) -> Result<Files, AppError> {
        let read = |flag: &str, path: &Path| {
            std::fs::read(path).map_err(|e| AppError::Config(format!("{flag} {}: {e}", path.display())))
        };
        let text = |flag: &str, path: &Path| -> Result<String, AppError> {
            crate::redis::credentials::read_text(path)
                .map_err(|reason| AppError::Config(format!("{flag} {}: {reason}", path.display())))
        };
        let auth_token =
            config.security.auth_token_file.as_deref().map(|p| text("--auth-token-file", p)).transpose()?;
        let redis_password =
            config.redis.redis_password_file.as_deref().map(|p| text("--redis-password-file", p)).transpose()?;
        let redis_ca = config.redis.redis_ca_file.as_deref().map(|p| read("--redis-ca-file", p)).transpose()?;
        let sentinel_password = match &config.redis.sentinel_password_file {
            Some(path) => Some(text("--sentinel-password-file", path)?),
            None => config.redis.sentinel_password.clone(),
        };
        let certificates = |flag: &str, path: &Path| -> Result<Vec<u8>, AppError> {
            let pem = read(flag, path)?;
            let found = CertificateDer::pem_slice_iter(&pem).filter(Result::is_ok).count();
            if found == 0 {
                return Err(AppError::Config(format!("{flag} {}: no PEM certificate found", path.display())));
            }
            Ok(pem)
        };
        let tls = match (&config.security.tls_cert_file, &config.security.tls_key_file) {
            (Some(cert), Some(key)) => {
                let cert = certificates("--tls-cert-file", cert)?;
                let key_pem = read("--tls-key-file", key)?;
                if PrivateKeyDer::from_pem_slice(&key_pem).is_err() {
                    return Err(AppError::Config(format!(
                        "--tls-key-file {}: no PEM private key found",
                        key.display()
                    )));
                }
                let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key_pem));
                if let Some(ca) = &config.security.tls_client_ca_file {
                    tls = tls.client_ca_root(Certificate::from_pem(certificates("--tls-client-ca-file", ca)?));
                }
                Some(tls)
            }
            _ => None,
        };
        Ok(Files { auth_token, tls, redis_password, redis_ca, sentinel_password })
    }
}

async fn connect_with_backoff(
    config: &Config,
    files: &Files,
    timeout: Duration,
    metrics: Arc<Metrics>,
) -> Result<Redis, AppError> {
    let mut delay = Duration::from_millis(200);
    loop {
        let url = &config.redis.redis_url;
        let options = ConnectOptions {
            password: files.redis_password.as_deref(),
            password_file: config.redis.redis_password_file.as_deref(),
            ca_pem: files.redis_ca.as_deref(),
            timeout,
            sharded: &config.redis.sharded_streams,
            sentinel_username: config.redis.sentinel_username.as_deref(),
            sentinel_password: files.sentinel_password.as_deref(),
        };
        match Redis::connect(url, options, metrics.redis()).await {
            Ok(redis) => {
                let kind = if redis.keys.is_cluster() { "a Redis Cluster" } else { "Redis" };
                let target = redacted_url(url);
                match redis.primary() {
                    Some(primary) => {
                        let node = primary.state().client.get_connection_info().addr().to_string();
                        info!(redis_url = %target, primary = %node, "connected to {kind}");
                    }
                    None => info!(redis_url = %target, "connected to {kind}"),
                }
                if !redis.keys.is_cluster() {
                    crate::telemetry::set_redis_server(url);
                }
                return Ok(redis);
            }
            Err(e) if is_no_usable_sentinel(&e) || refuses_the_settings(&e) => {
                // A Sentinel lookup's detail says what each Sentinel said; the rest is kind and wrapping.
                let reason =
                    e.detail().filter(|_| is_no_usable_sentinel(&e)).map_or_else(|| e.to_string(), str::to_owned);
                return Err(AppError::RedisSettings { target: redacted_url(url), reason });
            }
            Err(e) if e.kind() == redis::ErrorKind::InvalidClientConfig || is_not_a_cluster(&e) => {
                return Err(AppError::RedisUrl(e))
            }
            Err(e) => {
                warn!(
                    redis_url = %redacted_url(url),
                    "Redis is not usable yet (unreachable, or refusing the credentials), retrying in {delay:?}: {e}"
                );
                sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Every Sentinel is down or none knows the master name ([`crate::redis::primary`]).
fn is_no_usable_sentinel(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::InvalidClientConfig && error.to_string().contains("no usable Redis Sentinel")
}

/// Redis answered, and refused what the sidecar was configured with: a
/// wrong password or unknown user (`WRONGPASS`, or redis-rs'
/// AuthenticationFailed), no password where one is needed (`NOAUTH`), a
/// database index the server does not have. Only at start: while serving,
/// the same answers (a password rotated under a running sidecar) are
/// retried, as an outage is.
fn refuses_the_settings(error: &redis::RedisError) -> bool {
    let text = error.to_string();
    crate::redis::fault::refuses_credentials(error)
        || text.contains("DB index is out of range")
        || text.contains("invalid DB index")
}

/// A seed list names nodes without cluster mode: a setting to fix, not an outage to wait out.
fn is_not_a_cluster(error: &redis::RedisError) -> bool {
    error.to_string().contains("cluster support disabled")
}

/// Follows Redis' reachability (see [`Redis::unready`]) into `/readyz` and the
/// gRPC health status of `services`, so both say NOT_SERVING while Redis is
/// down, and logs each change with its cause.
async fn ping_loop(
    redis: Redis,
    readiness: Readiness,
    health: tonic_health::server::HealthReporter,
    services: [&str; 4],
    redis_up: watch::Sender<bool>,
) {
    let mut was_up = true;
    // The cause last logged, without its error detail, so that a cause that
    // changes while not ready (PING fails, then the cluster says fail) is
    // logged once each, not once a ping.
    let mut logged_cause = String::new();
    for ping in 1u32.. {
        sleep(READINESS_PING).await;
        let unready = redis.unready().await;
        let up = unready.is_none();
        if up && (!was_up || ping % SHARD_RECORD_EVERY_PINGS == 0) {
            if let Err(e) = redis.record_shard_counts().await {
                error!("{e}");
            }
        }
        readiness.set_redis_unready(unready.as_deref());
        redis_up.send_if_modified(|was| std::mem::replace(was, up) != up);
        if let Some(why) = &unready {
            let cause = why.split(" (").next().unwrap_or(why);
            if cause != logged_cause {
                warn!("{why}; not ready");
                logged_cause = cause.to_owned();
            }
        }
        if up != was_up {
            if up {
                info!("Redis is reachable again; ready");
                logged_cause.clear();
            }
            // While draining, health stays NOT_SERVING whatever Redis does.
            let status = if readiness.is_ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
            for service in services {
                health.set_service_status(service, status).await;
            }
        }
        was_up = up;
    }
}

/// An error and its sources, `: `-separated (tonic's transport errors say
/// little at the top).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

async fn wait_true(mut flag: watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}
