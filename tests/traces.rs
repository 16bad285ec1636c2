//! Traces: an in-process OTLP receiver checks that the sidecar's spans arrive
//! and that a consumer joins the producer's trace across the stream.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use echomq::proto::{consume_request::Kind, Ack, AppendRequest, GroupStart};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        trace_service_server::{TraceService, TraceServiceServer},
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    },
    trace::v1::Span,
};
use support::*;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
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

    fn named(&self, name: &str) -> Vec<Span> {
        self.spans.lock().unwrap().iter().filter(|s| s.name == name).cloned().collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_joins_the_producers_trace_across_the_stream() {
    let (receiver, address) = Receiver::start().await;
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(
        &redis,
        SidecarOptions::default()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &format!("http://{address}"))
            .env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    )
    .await;
    let stream = unique("traced");

    // The producer's own span: its context travels in the gRPC header.
    let producer_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let producer_span = "00f067aa0ba902b7";
    let mut append = tonic::Request::new(AppendRequest {
        stream: stream.clone(),
        fields: [("k".to_owned(), b"v".to_vec())].into(),
        ..Default::default()
    });
    append.metadata_mut().insert("traceparent", format!("00-{producer_trace}-{producer_span}-01").parse().unwrap());
    let appended = sidecar.stream_client().await.append(append).await.unwrap().into_inner();

    let mut consumer =
        Consumer::try_subscribe(&sidecar, subscribe_msg(&stream, "g", GroupStart::Beginning)).await.unwrap();
    let delivery = consumer.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(delivery.id, appended.id);
    assert!(
        delivery.traceparent.starts_with(&format!("00-{producer_trace}-")),
        "the delivery continues the producer's trace: {}",
        delivery.traceparent
    );
    assert!(!delivery.payload.contains_key("traceparent"), "the trace context is not payload");
    consumer.send(req(Kind::Ack(Ack { ids: vec![delivery.id.clone()] }))).await;

    let arrived = eventually(Duration::from_secs(10), || {
        let receiver = receiver.clone();
        async move { !receiver.named("echomq.append").is_empty() && !receiver.named("echomq.deliver").is_empty() }
    })
    .await;
    assert!(arrived, "append and deliver spans reach the OTLP receiver");
    let append_span = &receiver.named("echomq.append")[0];
    assert_eq!(hex(&append_span.trace_id), producer_trace);
    assert_eq!(hex(&append_span.parent_span_id), producer_span, "append is a child of the producer's span");
    let deliver_span = &receiver.named("echomq.deliver")[0];
    assert_eq!(hex(&deliver_span.trace_id), producer_trace, "the delivery is in the producer's trace");
    assert_eq!(hex(&deliver_span.parent_span_id), hex(&append_span.span_id), "deliver follows append");
    let delivery_span_id = delivery.traceparent.split('-').nth(2).unwrap();
    assert_eq!(delivery_span_id, hex(&deliver_span.span_id), "the consumer continues from the deliver span");
    let verdict = deliver_span.attributes.iter().find(|a| a.key == "verdict").and_then(|a| a.value.clone());
    assert!(format!("{verdict:?}").contains("ack"), "the deliver span records the verdict: {verdict:?}");
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
    let delivery = consumer.next_delivery(Duration::from_secs(5)).await;
    assert_eq!(delivery.traceparent, traceparent);
}
