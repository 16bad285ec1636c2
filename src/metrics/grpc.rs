//! The gRPC server's calls, per method and status, under the names and
//! labels of grpc-prometheus (go-grpc-middleware's `grpc_prometheus`, and its
//! ports to Java and Python): `grpc_server_started_total` and
//! `grpc_server_handled_total`, labelled `grpc_type`, `grpc_service`,
//! `grpc_method` and (handled) `grpc_code`. Those are the names Prometheus
//! users' gRPC dashboards and alerts already query (etcd's mixin, Grafana's
//! "gRPC" dashboards), so they work unchanged; OpenTelemetry's RPC
//! conventions are still moving and name no counters.
//!
//! Label values are therefore grpc-prometheus' too, not snake_case words: the
//! service's full name (`echomq.v1.StreamService`), the method as the proto
//! spells it (`Append`), the code as Go's `codes.Code` prints it (`OK`,
//! `NotFound`, `Unavailable`) and the type (`unary`, `bidi_stream`, …).
//! They are bounded: services and methods come from the descriptors the
//! server serves (any other path counts as `unknown`), codes from gRPC's 17.
//! As grpc-prometheus' `InitializeMetrics` does, every method's series are
//! present from the start at zero, for every code.
//!
//! A call counts as started when its request reaches the server, and as
//! handled when its status is known: from the response headers of a
//! trailers-only answer (every failed unary call, a stream refused at once),
//! else from the trailers at the end of the response body, so a streaming
//! call (Consume) counts when it ends. A response body dropped before its
//! trailers (the client cancelled, the connection broke) counts as
//! `Canceled`.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use prost::Message as _;
use tonic::codegen::{
    http::{HeaderMap, Request, Response},
    Body as HttpBody, Bytes, Service,
};

/// gRPC's codes, by number, as grpc-prometheus' `grpc_code` label spells them.
pub const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// Index of `Canceled` in [`CODES`].
const CANCELED: usize = 1;
/// Index of `Unknown` in [`CODES`].
const UNKNOWN: usize = 2;

/// The labels of a method's started calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    /// `unary`, `client_stream`, `server_stream` or `bidi_stream`.
    grpc_type: &'static str,
    /// The service's full name, e.g. `echomq.v1.ConsumerService`.
    grpc_service: String,
    /// The method's name, e.g. `Consume`.
    grpc_method: String,
}

/// The labels of a method's handled calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandledLabels {
    #[prometheus(flatten)]
    method: MethodLabels,
    /// One of [`CODES`].
    grpc_code: &'static str,
}

/// One method's counters, looked up once, so a call only touches atomics.
#[derive(Debug)]
struct MethodCounters {
    started: Counter,
    /// By code number, as [`CODES`].
    handled: [Counter; 17],
}

impl MethodCounters {
    fn new(
        started: &Family<MethodLabels, Counter>,
        handled: &Family<HandledLabels, Counter>,
        labels: MethodLabels,
    ) -> Self {
        MethodCounters {
            started: started.get_or_create(&labels).clone(),
            handled: CODES
                .map(|grpc_code| handled.get_or_create(&HandledLabels { method: labels.clone(), grpc_code }).clone()),
        }
    }
}

/// The gRPC server's counters. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    started: Family<MethodLabels, Counter>,
    handled: Family<HandledLabels, Counter>,
    /// Request path (`/echomq.v1.StreamService/Append`) → its counters.
    methods: Arc<HashMap<String, Arc<MethodCounters>>>,
    /// Any other path.
    unknown: Arc<MethodCounters>,
}

impl GrpcMetrics {
    /// The counters of every method the server serves: the EchoMQ services,
    /// health and both reflection versions (their descriptors).
    pub(super) fn new() -> GrpcMetrics {
        let started = Family::default();
        let handled = Family::default();
        let mut methods = HashMap::new();
        let sets = [
            crate::proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ];
        for set in sets {
            let set = prost_types::FileDescriptorSet::decode(set).expect("the embedded descriptors are valid");
            for file in &set.file {
                for service in &file.service {
                    let service_name = match file.package() {
                        "" => service.name().to_owned(),
                        package => format!("{package}.{}", service.name()),
                    };
                    for method in &service.method {
                        let grpc_type = match (method.client_streaming(), method.server_streaming()) {
                            (false, false) => "unary",
                            (true, false) => "client_stream",
                            (false, true) => "server_stream",
                            (true, true) => "bidi_stream",
                        };
                        let labels = MethodLabels {
                            grpc_type,
                            grpc_service: service_name.clone(),
                            grpc_method: method.name().to_owned(),
                        };
                        let path = format!("/{service_name}/{}", method.name());
                        methods.insert(path, Arc::new(MethodCounters::new(&started, &handled, labels)));
                    }
                }
            }
        }
        let unknown =
            MethodLabels { grpc_type: "unknown", grpc_service: "unknown".into(), grpc_method: "unknown".into() };
        let unknown = Arc::new(MethodCounters::new(&started, &handled, unknown));
        GrpcMetrics { started, handled, methods: Arc::new(methods), unknown }
    }

    /// Creates the counters and registers them in `root` (unprefixed:
    /// grpc-prometheus' names).
    pub(super) fn register(root: &mut Registry) -> GrpcMetrics {
        let metrics = GrpcMetrics::new();
        root.register(
            "grpc_server_started",
            "RPCs started on the server, by method (grpc-prometheus)",
            metrics.started.clone(),
        );
        root.register(
            "grpc_server_handled",
            "RPCs completed on the server, by method and status code; a streaming call when it ends (grpc-prometheus)",
            metrics.handled.clone(),
        );
        metrics
    }

    fn method(&self, path: &str) -> Arc<MethodCounters> {
        self.methods.get(path).unwrap_or(&self.unknown).clone()
    }
}

/// The status code number in a `grpc-status` header or trailer, if any.
fn status_of(headers: &HeaderMap) -> Option<usize> {
    let code = headers.get("grpc-status")?.to_str().ok()?.parse::<usize>().ok()?;
    Some(if code < CODES.len() { code } else { UNKNOWN })
}

/// The tower layer that counts every call the server answers. It sits
/// outermost on the server (before tonic's routing and the services' own
/// layers), so it counts what the client gets: the rewritten status of an
/// oversized request, a refused token, an unknown method.
#[derive(Clone, Debug)]
pub struct GrpcLayer {
    metrics: GrpcMetrics,
}

impl GrpcLayer {
    /// Counts into `metrics` ([`super::Metrics::grpc`]).
    pub fn new(metrics: GrpcMetrics) -> GrpcLayer {
        GrpcLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcLayer {
    type Service = GrpcCounted<S>;

    fn layer(&self, inner: S) -> GrpcCounted<S> {
        GrpcCounted { inner, metrics: self.metrics.clone() }
    }
}

/// The service [`GrpcLayer`] makes.
#[derive(Clone, Debug)]
pub struct GrpcCounted<S> {
    inner: S,
    metrics: GrpcMetrics,
}

impl<S, B, ResBody> Service<Request<B>> for GrpcCounted<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<tonic::codegen::StdError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let counters = self.metrics.method(request.uri().path());
        counters.started.inc();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match response.await {
                Ok(response) => response,
                Err(e) => {
                    counters.handled[UNKNOWN].inc();
                    return Err(e);
                }
            };
            if let Some(code) = status_of(response.headers()) {
                counters.handled[code].inc();
                return Ok(response.map(tonic::body::Body::new));
            }
            Ok(response.map(|body| {
                tonic::body::Body::new(CountedBody { inner: tonic::body::Body::new(body), counters: Some(counters) })
            }))
        })
    }
}

/// A response body that counts its call when the status trailer passes, or
/// as `Canceled` when dropped before it.
struct CountedBody {
    inner: tonic::body::Body,
    /// Until the call is counted.
    counters: Option<Arc<MethodCounters>>,
}

impl CountedBody {
    fn count(&mut self, code: usize) {
        if let Some(counters) = self.counters.take() {
            counters.handled[code].inc();
        }
    }
}

impl HttpBody for CountedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_of) {
                    self.count(code);
                }
            }
            // A body that fails or ends without a status: gRPC's Unknown.
            Poll::Ready(Some(Err(_)) | None) => self.count(UNKNOWN),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.count(CANCELED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_method_is_known_with_its_type() {
        let metrics = GrpcMetrics::new();
        let consume = metrics.method("/echomq.v1.ConsumerService/Consume");
        assert!(!Arc::ptr_eq(&consume, &metrics.unknown));
        assert!(!Arc::ptr_eq(&metrics.method("/echomq.v1.StreamService/Append"), &metrics.unknown));
        assert!(!Arc::ptr_eq(&metrics.method("/grpc.health.v1.Health/Check"), &metrics.unknown));
        assert!(Arc::ptr_eq(&metrics.method("/no.Such/Method"), &metrics.unknown));
        let labels = MethodLabels {
            grpc_type: "bidi_stream",
            grpc_service: "echomq.v1.ConsumerService".into(),
            grpc_method: "Consume".into(),
        };
        assert!(metrics.started.get(&labels).is_some(), "Consume is a bidi_stream");
    }

    /// A body of nothing but its trailers.
    struct Trailers(Option<HeaderMap>);

    impl HttpBody for Trailers {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
            Poll::Ready(self.0.take().map(|t| Ok(http_body::Frame::trailers(t))))
        }
    }

    #[test]
    fn a_body_counts_its_trailers_code_or_canceled_when_dropped_before() {
        let metrics = GrpcMetrics::new();
        let counters = metrics.method("/echomq.v1.ConsumerService/Consume");
        drop(CountedBody { inner: tonic::body::Body::empty(), counters: Some(counters.clone()) });
        assert_eq!(counters.handled[CANCELED].get(), 1);

        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "14".parse().unwrap_or_else(|_| unreachable!()));
        let inner = Trailers(Some(trailers));
        let mut body = CountedBody { inner: tonic::body::Body::new(inner), counters: Some(counters.clone()) };
        let waker = std::task::Waker::noop();
        let polled = Pin::new(&mut body).poll_frame(&mut Context::from_waker(waker));
        assert!(matches!(polled, Poll::Ready(Some(Ok(_)))));
        drop(body);
        assert_eq!(counters.handled[14].get(), 1, "Unavailable, from the trailers");
        assert_eq!(counters.handled[CANCELED].get(), 1, "counted once, not again when dropped");
    }

    #[test]
    fn a_status_header_maps_to_its_code_name() {
        let mut headers = HeaderMap::new();
        assert_eq!(status_of(&headers), None);
        headers.insert("grpc-status", "5".parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(status_of(&headers).map(|c| CODES[c]), Some("NotFound"));
        headers.insert("grpc-status", "99".parse().unwrap_or_else(|_| unreachable!()));
        assert_eq!(status_of(&headers).map(|c| CODES[c]), Some("Unknown"));
    }
}
