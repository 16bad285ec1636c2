//! Traces: an in-process OTLP receiver (the collector's gRPC trace service)
//! takes the sidecar's spans, and the tests check them against the
//! OpenTelemetry semantic conventions: span kinds, `messaging.*` and `db.*`
//! attributes, parents across the stream, the settle span's links, the
//! resource's `service.name`, and what must not be there (root spans of
//! background commands, tracing-internal attributes).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use echomq::proto::{
    consume_request::Kind, Ack, AppendBatchRequest, AppendBatchResponse, AppendRequest, AppendResponse, BatchEntry,
    Delivery, GroupStart,
};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        trace_service_server::{TraceService, TraceServiceServer},
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    },
    common::v1::{any_value, KeyValue},
    trace::v1::{span::SpanKind, Span},
};
use support::*;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// A span as received, with its resource's attributes.
type Received = (Vec<KeyValue>, Span);

/// What the receiver was sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| (attributes.clone(), span)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    async fn start() -> (Receiver, SocketAddr) {
        let receiver = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (receiver, address)
    }

    fn all(&self) -> Vec<Span> {
        self.spans.lock().unwrap().iter().map(|(_, span)| span.clone()).collect()
    }

    fn named(&self, name: &str) -> Vec<Span> {
        self.all().into_iter().filter(|s| s.name == name).collect()
    }

    /// The resources' attribute `key`, once per distinct value.
    fn resource_values(&self, key: &str) -> BTreeSet<String> {
        self.spans.lock().unwrap().iter().filter_map(|(resource, _)| value(resource, key)).collect()
    }
}

/// An attribute's value as text (strings as they are, numbers in decimal).
fn value(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|a| a.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

fn attr(span: &Span, key: &str) -> Option<String> {
    value(&span.attributes, key)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// A sidecar exporting to a fresh receiver; `options` adds to its settings.
async fn traced(options: SidecarOptions) -> (Receiver, RedisServer, Sidecar) {
    let (receiver, address) = Receiver::start().await;
    let redis = RedisServer::start().await;
    let options =
        options.env("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{address}")).env("OTEL_BSP_SCHEDULE_DELAY", "100");
    let sidecar = Sidecar::start(&redis, options).await;
    (receiver, redis, sidecar)
}

/// Appends one entry (`k` = `v`) to `stream` in the producer's trace (its
/// `traceparent` header).
async fn append_in_producer_trace(sidecar: &Sidecar, stream: &str) -> AppendResponse {
    let mut append = tonic::Request::new(AppendRequest {
        stream: stream.to_owned(),
        fields: [("k".to_owned(), b"v".to_vec())].into(),
        ..Default::default()
    });
    append.metadata_mut().insert("traceparent", format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01").parse().unwrap());
    sidecar.stream_client().await.append(append).await.unwrap().into_inner()
}

/// One traced round trip: an Append (in the producer's trace), an
/// AppendBatch of two, the three delivered and acked in one Ack; returns once
/// the receiver has the deliveries' spans and a settle span's links to all three.
struct RoundTrip {
    receiver: Receiver,
    redis: RedisServer,
    _sidecar: Sidecar,
    stream: String,
    appended: AppendResponse,
    batch: AppendBatchResponse,
    deliveries: Vec<Delivery>,
}

async fn round_trip(options: SidecarOptions) -> RoundTrip {
    let (receiver, redis, sidecar) = traced(options).await;
    let stream = unique("traced");
    let appended = append_in_producer_trace(&sidecar, &stream).await;
    let mut client = sidecar.stream_client().await;
    let entry = || BatchEntry { fields: [("k".to_owned(), b"w".to_vec())].into(), ..Default::default() };
    let batch = AppendBatchRequest { stream: stream.clone(), entries: vec![entry(), entry()], ..Default::default() };
    let batch = client.append_batch(batch).await.unwrap().into_inner();

    let mut consumer =
        Consumer::try_subscribe(&sidecar, subscribe_msg(&stream, "g", GroupStart::Beginning)).await.unwrap();
    let deliveries = consumer.deliveries(3, Duration::from_secs(5)).await;
    consumer.send(req(Kind::Ack(Ack { ids: deliveries.iter().map(|d| d.id.clone()).collect() }))).await;

    let arrived = eventually(Duration::from_secs(10), || {
        let receiver = receiver.clone();
        async move {
            let links: usize = receiver.named("echomq.settle").iter().map(|s| s.links.len()).sum();
            receiver.named("echomq.deliver").len() == 3 && links == 3
        }
    })
    .await;
    assert!(arrived, "deliver and settle spans reach the receiver: {:#?}", receiver.all());
    RoundTrip { receiver, redis, _sidecar: sidecar, stream, appended, batch, deliveries }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_is_a_producer_span_with_messaging_attributes() {
    let trip = round_trip(SidecarOptions::default()).await;
    let appends = trip.receiver.named("echomq.append");
    assert_eq!(appends.len(), 2, "one span per Append and per AppendBatch");
    let single = appends.iter().find(|s| attr(s, "messaging.message.id").is_some()).expect("the single Append's span");
    assert_eq!(single.kind(), SpanKind::Producer);
    assert_eq!(attr(single, "messaging.system").as_deref(), Some("echomq"));
    assert_eq!(attr(single, "messaging.operation.type").as_deref(), Some("send"));
    assert_eq!(attr(single, "messaging.operation.name").as_deref(), Some("append"));
    assert_eq!(attr(single, "messaging.destination.name"), Some(trip.stream.clone()));
    assert_eq!(attr(single, "messaging.message.id"), Some(trip.appended.id.clone()));
    assert_eq!(attr(single, "messaging.batch.message_count"), None, "a single message is no batch");
    assert_eq!(hex(&single.trace_id), PRODUCER_TRACE);
    assert_eq!(hex(&single.parent_span_id), PRODUCER_SPAN, "append is a child of the producer's span");

    let batch = appends.iter().find(|s| attr(s, "messaging.message.id").is_none()).expect("the AppendBatch's span");
    assert_eq!(batch.kind(), SpanKind::Producer);
    assert_eq!(attr(batch, "messaging.batch.message_count").as_deref(), Some("2"));
    assert_eq!(attr(batch, "messaging.destination.name"), Some(trip.stream.clone()));
    assert_eq!(trip.batch.entries.len(), 2);
    assert!(batch.parent_span_id.is_empty(), "a call without a traceparent starts a trace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_is_a_consumer_span_in_the_producers_trace() {
    let trip = round_trip(SidecarOptions::default()).await;
    let single =
        trip.receiver.named("echomq.append").into_iter().find(|s| attr(s, "messaging.message.id").is_some()).unwrap();
    let delivery = trip.deliveries.iter().find(|d| d.id == trip.appended.id).unwrap();
    let delivers = trip.receiver.named("echomq.deliver");
    let span = delivers.iter().find(|s| attr(s, "messaging.message.id") == Some(delivery.id.clone())).unwrap();
    assert_eq!(span.kind(), SpanKind::Consumer);
    assert_eq!(attr(span, "messaging.system").as_deref(), Some("echomq"));
    assert_eq!(attr(span, "messaging.operation.type").as_deref(), Some("process"));
    assert_eq!(attr(span, "messaging.operation.name").as_deref(), Some("deliver"));
    assert_eq!(attr(span, "messaging.destination.name"), Some(trip.stream.clone()));
    assert_eq!(attr(span, "messaging.consumer.group.name").as_deref(), Some("g"));
    assert_eq!(attr(span, "echomq.stream_id"), Some(delivery.stream_id.clone()));
    assert_eq!(attr(span, "echomq.attempts").as_deref(), Some("1"));
    assert_eq!(attr(span, "echomq.verdict").as_deref(), Some("ack"), "the deliver span records the verdict");
    assert_eq!(hex(&span.trace_id), PRODUCER_TRACE, "the delivery is in the producer's trace");
    assert_eq!(hex(&span.parent_span_id), hex(&single.span_id), "deliver is a child of append (the entry's context)");
    assert!(!delivery.payload.contains_key("traceparent"), "the trace context is not payload");
    assert_eq!(
        delivery.traceparent,
        format!("00-{PRODUCER_TRACE}-{}-01", hex(&span.span_id)),
        "the consumer continues from the deliver span"
    );
    // The batch's entries, appended with no context, are children of the batch's span.
    let batch = trip.receiver.named("echomq.append").into_iter().find(|s| attr(s, "messaging.message.id").is_none());
    for id in trip.batch.entries.iter().map(|e| &e.id) {
        let span = delivers.iter().find(|s| attr(s, "messaging.message.id").as_ref() == Some(id)).unwrap();
        assert_eq!(span.parent_span_id, batch.as_ref().unwrap().span_id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_are_client_spans_under_their_operation() {
    let trip = round_trip(SidecarOptions::default()).await;
    let commands = trip.receiver.named("echomq.redis");
    let all = trip.receiver.all();
    assert!(!commands.is_empty());
    for span in &commands {
        assert_eq!(span.kind(), SpanKind::Client, "{span:?}");
        assert_eq!(attr(span, "db.system.name").as_deref(), Some("redis"));
        assert_eq!(attr(span, "server.address").as_deref(), Some("127.0.0.1"));
        assert_eq!(attr(span, "server.port"), Some(trip.redis.port().to_string()));
        assert_eq!(attr(span, "db.namespace").as_deref(), Some("0"));
        assert!(attr(span, "db.operation.name").is_some());
        let parent = all.iter().find(|p| p.span_id == span.parent_span_id);
        let parent = parent.unwrap_or_else(|| panic!("a Redis command span is never a root: {span:?}"));
        assert!(matches!(parent.name.as_str(), "echomq.append" | "echomq.settle"), "under {}", parent.name);
    }
    let script = |name: &str| {
        commands.iter().find(|s| attr(s, "db.stored_procedure.name").as_deref() == Some(name)).cloned().unwrap()
    };
    let append = script("append");
    assert_eq!(attr(&append, "db.operation.name").as_deref(), Some("EVALSHA"));
    let appends: Vec<_> = trip.receiver.named("echomq.append").into_iter().map(|s| s.span_id).collect();
    assert!(appends.contains(&append.parent_span_id), "append.lua runs under an append span");
    // First deliveries without a key: the acks go as a plain XACK, under the settle span.
    let xack = commands.iter().find(|s| attr(s, "db.operation.name").as_deref() == Some("XACK")).unwrap();
    let settles: Vec<_> = trip.receiver.named("echomq.settle").into_iter().map(|s| s.span_id).collect();
    assert!(settles.contains(&xack.parent_span_id), "the XACK runs under a settle span");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_span_links_the_deliveries_it_acknowledges() {
    let trip = round_trip(SidecarOptions::default()).await;
    let delivers = trip.receiver.named("echomq.deliver");
    let settles = trip.receiver.named("echomq.settle");
    let mut linked = BTreeSet::new();
    for settle in &settles {
        assert_eq!(settle.kind(), SpanKind::Client);
        assert_eq!(attr(settle, "messaging.system").as_deref(), Some("echomq"));
        assert_eq!(attr(settle, "messaging.operation.type").as_deref(), Some("settle"));
        assert_eq!(attr(settle, "messaging.operation.name").as_deref(), Some("ack"));
        assert_eq!(attr(settle, "messaging.destination.name"), Some(trip.stream.clone()));
        assert_eq!(attr(settle, "messaging.consumer.group.name").as_deref(), Some("g"));
        if settle.links.len() > 1 {
            assert_eq!(attr(settle, "messaging.batch.message_count"), Some(settle.links.len().to_string()));
        }
        assert!(settle.parent_span_id.is_empty(), "a settle run belongs to no one delivery's trace");
        for link in &settle.links {
            let deliver = delivers.iter().find(|d| d.span_id == link.span_id).expect("each link names a delivery span");
            assert_eq!(link.trace_id, deliver.trace_id);
            assert_eq!(value(&link.attributes, "messaging.message.id"), attr(deliver, "messaging.message.id"));
            linked.insert(link.span_id.clone());
        }
    }
    let delivered: BTreeSet<_> = delivers.iter().map(|d| d.span_id.clone()).collect();
    assert_eq!(linked, delivered, "every acked delivery is linked from the settle span that acked it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sidecar_exports_no_spans() {
    let (receiver, _redis, sidecar) = traced(SidecarOptions::default()).await;
    // A subscribed, idle consumer: lease refreshes, heartbeats and gauge
    // polls run beside the readiness PING every second.
    let stream = unique("idle");
    let _consumer = Consumer::try_subscribe(&sidecar, subscribe_msg(&stream, "g", GroupStart::New)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let spans = receiver.all();
    assert!(spans.is_empty(), "background commands make no spans: {spans:#?}");
    // The exporter works: one Append arrives.
    sidecar.append(&stream, &[("k", b"v")]).await;
    let arrived = eventually(Duration::from_secs(10), || {
        let receiver = receiver.clone();
        async move { !receiver.named("echomq.append").is_empty() }
    })
    .await;
    assert!(arrived, "the append span reaches the receiver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_carry_no_tracing_internal_attributes() {
    let trip = round_trip(SidecarOptions::default()).await;
    let noise = [
        "code.file.path",
        "code.filepath",
        "code.line.number",
        "code.lineno",
        "code.module.name",
        "code.namespace",
        "thread.id",
        "thread.name",
        "busy_ns",
        "idle_ns",
        "target",
        "level",
    ];
    for span in trip.receiver.all() {
        for attribute in &span.attributes {
            assert!(!noise.contains(&attribute.key.as_str()), "{} carries {}", span.name, attribute.key);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_service_name_and_resource_attributes_reach_the_resource() {
    let options = SidecarOptions::default()
        .env("OTEL_SERVICE_NAME", "orders-sidecar")
        // OTEL_SERVICE_NAME wins over a service.name here (the specification's order).
        .env("OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,deployment.environment.name=test");
    let trip = round_trip(options).await;
    assert_eq!(trip.receiver.resource_values("service.name"), BTreeSet::from(["orders-sidecar".to_owned()]));
    assert_eq!(trip.receiver.resource_values("deployment.environment.name"), BTreeSet::from(["test".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_service_name_the_service_is_echomq_sidecar() {
    let options = SidecarOptions::default().env("OTEL_SERVICE_NAME", "").env("OTEL_RESOURCE_ATTRIBUTES", "");
    let trip = round_trip(options).await;
    assert_eq!(trip.receiver.resource_values("service.name"), BTreeSet::from(["echomq-sidecar".to_owned()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_do_not_follow_the_log_filter() {
    // Logging only warnings must not turn the (INFO) spans off.
    let trip = round_trip(SidecarOptions::default().env("ECHOMQ_LOG", "warn")).await;
    assert_eq!(trip.receiver.named("echomq.append").len(), 2);
    assert!(!trip.receiver.named("echomq.redis").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_collector_the_callers_trace_context_still_crosses_the_stream() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let stream = unique("untraced");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut append = tonic::Request::new(AppendRequest {
        stream: stream.clone(),
        fields: [("k".to_owned(), b"v".to_vec())].into(),
        ..Default::default()
    });
    append.metadata_mut().insert("traceparent", traceparent.parse().unwrap());
    sidecar.stream_client().await.append(append).await.unwrap();

    let mut consumer =
        Consumer::try_subscribe(&sidecar, subscribe_msg(&stream, "g", GroupStart::Beginning)).await.unwrap();
    let delivery = consumer.deliveries(1, Duration::from_secs(5)).await.remove(0);
    assert_eq!(delivery.traceparent, traceparent);
}

/// An AckEmit is a PRODUCER span, the child of the delivery's span (so in
/// the producer's trace), its script's Redis span beneath it; the emitted
/// entry carries its context, so the consumer downstream continues the trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ack_emit_is_a_producer_span_under_the_delivery_and_its_emits_carry_it() {
    let (receiver, redis, sidecar) = traced(SidecarOptions::default()).await;
    let stream = unique("traced");
    append_in_producer_trace(&sidecar, &stream).await;
    let mut call = Consumer::try_subscribe(&sidecar, subscribe_msg(&stream, "g", GroupStart::Beginning)).await.unwrap();
    let delivery = call.next_delivery(Duration::from_secs(5)).await;
    let sink = format!("{stream}:out");

    call.ack_emit(&delivery.id, &[(&sink, &[("k", b"w")])]).await;
    call.next_emitted(Duration::from_secs(5)).await;

    let arrived = eventually(Duration::from_secs(10), || {
        let receiver = receiver.clone();
        async move { !receiver.named("echomq.ack_emit").is_empty() && !receiver.named("echomq.deliver").is_empty() }
    })
    .await;
    assert!(arrived, "the ack_emit span reaches the receiver: {:#?}", receiver.all());
    let deliver = receiver.named("echomq.deliver").pop().unwrap();
    let step = receiver.named("echomq.ack_emit").pop().unwrap();
    assert_eq!(step.kind(), SpanKind::Producer);
    assert_eq!(attr(&step, "messaging.operation.type").as_deref(), Some("send"));
    assert_eq!(attr(&step, "messaging.operation.name").as_deref(), Some("ack_emit"));
    assert_eq!(attr(&step, "messaging.destination.name"), Some(stream.clone()));
    assert_eq!(attr(&step, "messaging.message.id"), Some(delivery.id.clone()));
    assert_eq!(hex(&step.trace_id), PRODUCER_TRACE);
    assert_eq!(step.parent_span_id, deliver.span_id, "a child of the delivery's span");
    assert_eq!(attr(&deliver, "echomq.verdict").as_deref(), Some("ack_emit"));
    let script =
        receiver.all().into_iter().find(|s| attr(s, "db.stored_procedure.name").as_deref() == Some("ack_emit"));
    assert_eq!(script.map(|s| s.parent_span_id), Some(step.span_id.clone()), "the script's Redis span is beneath it");
    let mut con = redis.conn().await;
    let emitted = xrange(&mut con, &sink).await;
    let expected = format!("00-{PRODUCER_TRACE}-{}-01", hex(&step.span_id));
    assert_eq!(emitted[0].field("traceparent"), Some(expected.as_bytes()), "the emit carries the step's context");
}
