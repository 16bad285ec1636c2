//! Logs and traces.
//!
//! Logs: `tracing` to standard error, text or JSON, filtered by `ECHOMQ_LOG`.
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, spans are exported over OTLP
//! gRPC (the standard `OTEL_*` variables apply: service name, headers,
//! timeouts). The W3C trace context crosses the stream inside the entry, in
//! the field [`TRACE_FIELD`]: Append stores it, a delivery carries it, so a
//! consumer's span joins the producer's trace.

use std::{
    collections::HashMap,
    io::{self, IsTerminal},
    sync::atomic::{AtomicBool, Ordering},
};

use opentelemetry::{
    propagation::TextMapPropagator,
    trace::{TraceContextExt, TracerProvider as _},
    Context,
};
use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider, Resource};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

use crate::config::LogFormat;

/// The entry field that carries an entry's W3C trace context (`traceparent`
/// format). Delivered in `Delivery.traceparent`, not in the payload.
pub const TRACE_FIELD: &str = "traceparent";

static EXPORTING: AtomicBool = AtomicBool::new(false);

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
                let resource = Resource::builder().with_service_name("echomq-sidecar").build();
                let provider =
                    SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
                (Some(provider), None)
            }
            Err(e) => (None, Some(e.to_string())),
        }
    } else {
        (None, None)
    };
    let traces = provider.as_ref().map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("echomq")));
    tracing_subscriber::registry().with(filter).with(logs).with(traces).init();
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
}
