//! Logs and traces.
//!
//! Logs: `tracing` to standard error, text or JSON, filtered by `ECHOMQ_LOG`.
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, spans are exported over OTLP
//! gRPC (the standard `OTEL_*` variables apply: `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, headers, timeouts, batch and limit settings).
//! The W3C trace context crosses the stream inside the entry, in the field
//! [`TRACE_FIELD`]: Append stores it, a delivery carries it, so a consumer's
//! span joins the producer's trace.
//!
//! The spans follow the OpenTelemetry semantic conventions (messaging and
//! database, semconv 1.3x): `echomq.append` (PRODUCER, `send`),
//! `echomq.deliver` (CONSUMER, `process`), `echomq.settle` (CLIENT, `settle`,
//! linked to the deliveries it acknowledges) and `echomq.redis` (CLIENT, one
//! Redis command, `db.*`), made by [`redis_command_span`] only inside one of
//! the others: background commands (the readiness PING, lease refreshes,
//! gauges) make no root spans. `docs/src/operations.md` lists every attribute.

use std::{
    collections::HashMap,
    io::{self, IsTerminal},
    sync::{
        atomic::{AtomicBool, Ordering},
        OnceLock,
    },
};

use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider as _},
    Context, Key, Value,
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    resource::{EnvResourceDetector, ResourceDetector},
    trace::SdkTracerProvider,
    Resource,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

use crate::config::LogFormat;

/// The entry field that carries an entry's W3C trace context (`traceparent`
/// format). Delivered in `Delivery.traceparent`, not in the payload.
pub const TRACE_FIELD: &str = "traceparent";

/// The service name when neither `OTEL_SERVICE_NAME` nor a `service.name` in
/// `OTEL_RESOURCE_ATTRIBUTES` gives one (the SDK's own default would be
/// `unknown_service:echomq-sidecar`).
pub const DEFAULT_SERVICE_NAME: &str = "echomq-sidecar";

/// `messaging.system` of the messaging spans. The semantic conventions
/// register no value for Redis Streams (nor for Redis at all), and say to use
/// a custom one then: the semantics these spans describe (branded ids,
/// attempts, verdicts, groups served over gRPC) are EchoMQ's; Redis itself
/// shows in the `db.*` attributes of the `echomq.redis` spans beneath them.
pub const MESSAGING_SYSTEM: &str = "echomq";

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// The Redis server of the `echomq.redis` spans' `server.*` and
/// `db.namespace`, set once connected (see [`set_redis_server`]).
static REDIS_SERVER: OnceLock<RedisServer> = OnceLock::new();

/// Where the shared connection's commands go, for the `echomq.redis` spans.
#[derive(Debug)]
struct RedisServer {
    /// Host name or IP address, or a unix socket's path.
    address: String,
    /// `None` for a unix socket.
    port: Option<i64>,
    /// The database index (`db.namespace`, a string by the conventions).
    db: String,
}

/// Whether spans are exported: per-delivery spans are only made then, so the
/// hot path pays nothing without a collector.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The installed telemetry; [`Telemetry::shutdown`] flushes spans on exit.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the span exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown() {
                eprintln!("echomq-sidecar: flushing traces failed: {e}");
            }
        }
    }
}

/// Installs logging and, when configured, the OTLP trace exporter. Call inside
/// the tokio runtime (the exporter's gRPC channel needs it).
pub fn init(format: LogFormat) -> Telemetry {
    let (filter, bad_filter) = match EnvFilter::try_from_env("ECHOMQ_LOG") {
        Ok(filter) => (filter, None),
        Err(e) if std::env::var_os("ECHOMQ_LOG").is_some() => (EnvFilter::new("info"), Some(e.to_string())),
        Err(_) => (EnvFilter::new("info"), None),
    };
    let ansi = io::stderr().is_terminal();
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer().with_writer(io::stderr).with_ansi(ansi).boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer().json().with_writer(io::stderr).boxed(),
    };
    let configured = ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let (provider, export_error) = if configured {
        match opentelemetry_otlp::SpanExporter::builder().with_tonic().build() {
            Ok(exporter) => {
                let resource = Resource::builder().with_service_name(service_name_from_env()).build();
                let provider =
                    SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
                (Some(provider), None)
            }
            Err(e) => (None, Some(e.to_string())),
        }
    } else {
        (None, None)
    };
    // Each layer has its own filter, so that ECHOMQ_LOG (how much is logged)
    // does not decide which spans are exported: the traces layer takes this
    // crate's spans at INFO, and nothing of its dependencies'.
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("echomq"))
            // No tracing-internal attributes on the spans: source location,
            // thread, the `target` and the busy/idle timings are about this
            // process' code, not the operation, and cost bytes on every span.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target("echomq", tracing::Level::INFO))
    });
    tracing_subscriber::registry().with(logs.with_filter(filter)).with(traces).init();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    if let Some(e) = bad_filter {
        tracing::warn!("ECHOMQ_LOG is not a valid filter ({e}); logging at info");
    }
    if let Some(e) = export_error {
        tracing::warn!("traces are off: the OTLP exporter could not be built: {e}");
    }
    EXPORTING.store(provider.is_some(), Ordering::Relaxed);
    Telemetry { provider }
}

/// The service name: `OTEL_SERVICE_NAME`, else `service.name` from
/// `OTEL_RESOURCE_ATTRIBUTES`, else [`DEFAULT_SERVICE_NAME`]. Decided here
/// because the SDK's resource builder lets `OTEL_RESOURCE_ATTRIBUTES` override
/// `OTEL_SERVICE_NAME`, where the specification says the opposite. The other
/// resource attributes come from the SDK's detectors (`Resource::builder`).
fn service_name_from_env() -> String {
    let from_attributes = EnvResourceDetector::new().detect().get(&Key::new("service.name"));
    service_name(std::env::var("OTEL_SERVICE_NAME").ok().as_deref(), from_attributes)
}

/// See [`service_name_from_env`]; empty values count as unset.
fn service_name(otel_service_name: Option<&str>, from_attributes: Option<Value>) -> String {
    otel_service_name
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .or_else(|| from_attributes.map(|v| v.to_string()).filter(|name| !name.is_empty()))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned())
}

/// Names the Redis server of the shared connection for the `echomq.redis`
/// spans, from the configured URL: a single server's host (or socket path),
/// port and database. Not for a cluster, whose commands go to whichever node
/// owns the key's slot, which this layer does not see (its spans then have
/// no `server.*`). Only the first call counts.
pub fn set_redis_server(url: &str) {
    use redis::{ConnectionAddr, IntoConnectionInfo};
    let Ok(info) = url.into_connection_info() else { return };
    let (address, port) = match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            (host.clone(), Some(i64::from(*port)))
        }
        ConnectionAddr::Unix(path) => (path.display().to_string(), None),
        _ => return,
    };
    let _ = REDIS_SERVER.set(RedisServer { address, port, db: info.redis_settings().db().to_string() });
}

/// The span of one Redis command on the shared connection: kind CLIENT, with
/// `db.system.name` (the stable database conventions' name for what older
/// ones called `db.system`), `db.operation.name` (the command; for a script
/// `EVALSHA`, and its file in `db.stored_procedure.name`), `db.namespace` and
/// `server.*`. `command` is the metrics label: a command name, or
/// `script:<name>`.
///
/// A disabled span unless traces are exported and the command runs inside an
/// exported span (an Append, a settle): a command with no operation around it
/// — the readiness PING every second, lease refreshes, gauge polls — would
/// be a root span of its own and drown the traces that matter.
pub fn redis_command_span(command: &str) -> tracing::Span {
    if !exporting() || !Context::current().span().span_context().is_valid() {
        return tracing::Span::none();
    }
    let (operation, script) = match command.strip_prefix("script:") {
        Some(script) => ("EVALSHA", Some(script)),
        None => (command, None),
    };
    let server = REDIS_SERVER.get();
    tracing::info_span!(
        "echomq.redis",
        otel.kind = "client",
        db.system.name = "redis",
        db.operation.name = operation,
        db.stored_procedure.name = script,
        db.namespace = server.map(|s| s.db.as_str()),
        server.address = server.map(|s| s.address.as_str()),
        server.port = server.and_then(|s| s.port),
    )
}

/// The context of `span` as a link target, when it is exported.
pub fn span_context_of(span: &tracing::Span) -> Option<opentelemetry::trace::SpanContext> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then_some(span_context)
}

/// The context a `traceparent` value names (invalid, so a root, when it is not one).
pub fn context_from(traceparent: &str) -> Context {
    let carrier = HashMap::from([(TRACE_FIELD.to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The `traceparent` of `span`, when it belongs to an exported trace.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACE_FIELD)
}

/// Makes `span` a child of the trace `traceparent` names, when it names one.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    if let Some(traceparent) = traceparent {
        let parent = context_from(traceparent);
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_through_the_propagator() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = context_from(text);
        assert!(context.span().span_context().is_valid());
        let mut carrier = HashMap::new();
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        assert_eq!(carrier[TRACE_FIELD], text);
        assert!(!context_from("not a traceparent").span().span_context().is_valid());
    }

    #[test]
    fn otel_service_name_wins_over_resource_attributes_and_the_default_is_echomq_sidecar() {
        assert_eq!(service_name(Some("orders"), Some("billing".into())), "orders");
        assert_eq!(service_name(None, Some("billing".into())), "billing");
        assert_eq!(service_name(Some(""), Some("billing".into())), "billing");
        assert_eq!(service_name(None, None), DEFAULT_SERVICE_NAME);
        assert_eq!(service_name(Some(""), Some("".into())), DEFAULT_SERVICE_NAME);
    }
}
