//! Security: TLS and mTLS on the gRPC port, the bearer token, the stream
//! allow-list (for everyone and per mTLS identity), the limits, Redis
//! authentication (password file, ACL user, `rediss://`), and start-up refusal
//! of unusable security files. Certificates are made in each test with the
//! `openssl` CLI ([`TestPki`]).

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use echomq::proto::admin_service_client::AdminServiceClient;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::stream_service_client::StreamServiceClient;
use echomq::proto::{
    AppendBatchRequest, AppendRequest, AppendResponse, BatchEntry, DescribeGroupRequest, GroupStart,
    ListDeadLettersRequest, ReadRequest, TrimRequest,
};
use support::*;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// The URI SAN of the "billing" client certificate (its mTLS identity).
const BILLING_URI: &str = "spiffe://echomq/billing";
/// The DNS SAN the "billing" certificate also carries (not its identity: a URI SAN wins).
const BILLING_DNS: &str = "billing.echomq.test";
/// The only SAN of the "orders" client certificate (its identity: no URI SAN).
const ORDERS_DNS: &str = "orders.echomq.test";

fn append_request(stream: &str) -> AppendRequest {
    AppendRequest { stream: stream.to_owned(), fields: fields(&[("k", b"v")]), ..Default::default() }
}

/// Appends one entry on `channel`, with `token` when set.
async fn append_on(channel: Channel, token: Option<&str>, stream: &str) -> Result<AppendResponse, Status> {
    StreamServiceClient::new(channel).append(with_token(append_request(stream), token)).await.map(|r| r.into_inner())
}

/// Appends one entry through a plaintext channel (no token).
async fn try_append(sidecar: &Sidecar, stream: &str) -> Result<AppendResponse, Status> {
    append_on(sidecar.channel().await, None, stream).await
}

/// Writes `text` to a file in `dir`; its path.
fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).expect("write test file");
    path
}

fn path_str(path: &Path) -> String {
    path.to_str().expect("utf-8 path").to_owned()
}

/// Options for a sidecar serving TLS with `server` (and requiring client
/// certificates from `client_ca` when set).
fn tls_options(server: &CertFiles, client_ca: Option<&Path>) -> SidecarOptions {
    let mut options = SidecarOptions::default()
        .arg("--tls-cert-file")
        .arg(&path_str(&server.cert))
        .arg("--tls-key-file")
        .arg(&path_str(&server.key));
    if let Some(ca) = client_ca {
        options = options.arg("--tls-client-ca-file").arg(&path_str(ca));
    }
    options
}

/// Waits up to `within` for `/readyz` to turn 200 (true), polling.
async fn becomes_ready(sidecar: &Sidecar, within: Duration) -> bool {
    eventually(within, || async { sidecar.readyz().await == Some(200) }).await
}

/// Asserts `/readyz` is never 200 for `during` while the process keeps running
/// (or has exited). Polls often, so a brief moment of readiness is caught.
async fn assert_never_ready(sidecar: &Sidecar, during: Duration, why: &str) {
    let deadline = Instant::now() + during;
    while Instant::now() < deadline {
        let ready = sidecar.readyz().await;
        assert_ne!(ready, Some(200), "{why}; sidecar log:\n{}", sidecar.log());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Arguments for a sidecar that would otherwise start: free ports and a Redis
/// that does not exist (so a sidecar that does not fail at once keeps retrying).
fn base_args() -> Vec<String> {
    local_args("redis://127.0.0.1:1")
}

/// Asserts exit code 2 and exactly one non-empty stderr line that names `flag`
/// and `mentions`.
#[track_caller]
fn assert_exit_2_with_one_line(out: &Output, flag: &str, mentions: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit status {} (want 2); stderr:\n{stderr}", out.status);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "the reason must be one line, got:\n{stderr}");
    assert!(
        lines[0].contains(flag) && lines[0].contains(mentions),
        "the line must name {flag} and {mentions}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "a clean error, not a panic:\n{stderr}");
}

// ---------------------------------------------------------------------------
// TLS and mTLS
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_appends_and_consumes() {
    let pki = TestPki::new("tls");
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, tls_options(&pki.server_cert(), None)).await;
    let channel = sidecar.try_tls_channel(pki.client_tls(None)).await.expect("TLS handshake");

    let appended = append_on(channel.clone(), None, "s").await.expect("append over TLS");
    let sub = subscribe_msg("s", "g", GroupStart::Beginning);
    let mut call =
        Consumer::try_subscribe_on(ConsumerServiceClient::new(channel), None, sub).await.expect("subscribe over TLS");
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    call.ack_one(&delivery.id).await;

    assert_eq!(delivery.id, appended.id);
    let mut con = redis.conn().await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "the ack went through over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_client_is_not_served_when_tls_is_on() {
    let pki = TestPki::new("tls");
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, tls_options(&pki.server_cert(), None)).await;

    let result = match sidecar.try_channel().await {
        Ok(channel) => append_on(channel, None, "s").await.map(|_| ()),
        Err(connect_error) => Err(Status::unavailable(connect_error.to_string())),
    };

    assert!(result.is_err(), "a plaintext call to a TLS port must fail");
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "nothing may be appended over plaintext");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_accepts_a_client_certificate_signed_by_the_client_ca() {
    let pki = TestPki::new("mtls");
    let client = pki.client_cert("orders", &[&format!("DNS:{ORDERS_DNS}")]);
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, tls_options(&pki.server_cert(), Some(pki.ca_cert()))).await;

    let channel = sidecar.try_tls_channel(pki.client_tls(Some(&client))).await.expect("mTLS handshake");
    let appended = append_on(channel, None, "s").await.expect("append with a client certificate");

    let mut con = redis.conn().await;
    assert_eq!(xrange(&mut con, "s").await[0].stream_id, appended.stream_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_a_client_without_a_certificate() {
    let pki = TestPki::new("mtls");
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, tls_options(&pki.server_cert(), Some(pki.ca_cert()))).await;

    // With TLS 1.3 the client may finish its side of the handshake before the
    // server checks the (missing) certificate: the refusal then shows on the call.
    let result = match sidecar.try_tls_channel(pki.client_tls(None)).await {
        Ok(channel) => append_on(channel, None, "s").await.map(|_| ()),
        Err(handshake_error) => Err(Status::unavailable(handshake_error.to_string())),
    };

    assert!(result.is_err(), "a client without a certificate must be refused");
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "nothing may be appended without a client certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_refuses_a_client_certificate_from_another_ca() {
    let pki = TestPki::new("mtls");
    let stranger = TestPki::new("stranger");
    let foreign = stranger.client_cert("intruder", &[&format!("DNS:{ORDERS_DNS}")]);
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, tls_options(&pki.server_cert(), Some(pki.ca_cert()))).await;

    // The client trusts the right server CA but presents a certificate the
    // sidecar's client CA never signed.
    let result = match sidecar.try_tls_channel(pki.client_tls(Some(&foreign))).await {
        Ok(channel) => append_on(channel, None, "s").await.map(|_| ()),
        Err(handshake_error) => Err(Status::unavailable(handshake_error.to_string())),
    };

    assert!(result.is_err(), "a certificate from another CA must be refused");
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "nothing may be appended with a foreign certificate");
}

// ---------------------------------------------------------------------------
// Bearer token
// ---------------------------------------------------------------------------

const TOKEN: &str = "s3cret-token";

/// A sidecar requiring [`TOKEN`]; the file ends with a newline, which is ignored.
async fn token_sidecar(redis: &RedisServer, dir: &TempDir) -> Sidecar {
    let file = write_file(dir.path(), "token", &format!("{TOKEN}\n"));
    Sidecar::start(redis, SidecarOptions::default().arg("--auth-token-file").arg(&path_str(&file))).await
}

/// Append, Consume and DescribeGroup with `token`; their statuses (OK as `None`).
async fn calls_with_token(sidecar: &Sidecar, token: Option<&str>) -> [(&'static str, Option<Status>); 3] {
    let append = append_on(sidecar.channel().await, token, "s").await.err();
    let subscribe = subscribe_msg("s", "g", GroupStart::Beginning);
    let consume = Consumer::try_subscribe_on(sidecar.consumer_client().await, token, subscribe).await.err();
    let describe = DescribeGroupRequest { stream: "s".into(), group: "g".into(), ..Default::default() };
    let admin =
        AdminServiceClient::new(sidecar.channel().await).describe_group(with_token(describe, token)).await.err();
    [("Append", append), ("Consume", consume), ("DescribeGroup", admin)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_token_is_unauthenticated_on_append_consume_and_admin() {
    let dir = TempDir::new("token");
    let redis = RedisServer::start().await;
    let sidecar = token_sidecar(&redis, &dir).await;

    for (rpc, status) in calls_with_token(&sidecar, None).await {
        let status = status.unwrap_or_else(|| panic!("{rpc} without a token must be refused"));
        assert_code(&status, Code::Unauthenticated);
    }
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "a refused call must not touch Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_unauthenticated_on_append_consume_and_admin() {
    let dir = TempDir::new("token");
    let redis = RedisServer::start().await;
    let sidecar = token_sidecar(&redis, &dir).await;

    for token in ["s3cret-tokeN", "s3cret-token-and-more", "s3cret"] {
        for (rpc, status) in calls_with_token(&sidecar, Some(token)).await {
            let status = status.unwrap_or_else(|| panic!("{rpc} with token {token:?} must be refused"));
            assert_code(&status, Code::Unauthenticated);
        }
    }
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "a refused call must not touch Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn right_token_is_accepted_on_append_consume_and_admin() {
    let dir = TempDir::new("token");
    let redis = RedisServer::start().await;
    let sidecar = token_sidecar(&redis, &dir).await;

    for (rpc, status) in calls_with_token(&sidecar, Some(TOKEN)).await {
        assert!(status.is_none(), "{rpc} with the right token must succeed: {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_need_no_token() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let dir = TempDir::new("token");
    let redis = RedisServer::start().await;
    let sidecar = token_sidecar(&redis, &dir).await;

    let health = HealthClient::new(sidecar.channel().await)
        .check(HealthCheckRequest { service: String::new() })
        .await
        .expect("health without a token")
        .into_inner();
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = ServerReflectionClient::new(sidecar.channel().await)
        .server_reflection_info(tokio_stream::iter(vec![list]))
        .await
        .expect("reflection without a token")
        .into_inner();
    let reply = replies.message().await.expect("reflection reply").expect("one reply");

    assert_eq!(health.status, ServingStatus::Serving as i32);
    let Some(MessageResponse::ListServicesResponse(services)) = reply.message_response else {
        panic!("expected a service list, got {reply:?}");
    };
    let names: Vec<&str> = services.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"echomq.v1.StreamService"), "reflection lists the API: {names:?}");
}

// ---------------------------------------------------------------------------
// Allow-list for everyone
// ---------------------------------------------------------------------------

/// A sidecar allowing only `orders:*` to everyone.
async fn allow_list_sidecar(redis: &RedisServer) -> Sidecar {
    Sidecar::start(redis, SidecarOptions::default().arg("--allow-streams").arg("orders:*")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_inside_the_allow_list_work() {
    let redis = RedisServer::start().await;
    let sidecar = allow_list_sidecar(&redis).await;

    let appended = try_append(&sidecar, "orders:eu").await.expect("append inside the allow-list");
    // The default dead-letter stream (`orders:eu:dlq`) is inside the list too.
    let mut call = Consumer::start(&sidecar, "orders:eu", "g", GroupStart::Beginning, 0).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let read = sidecar
        .stream_client()
        .await
        .read(ReadRequest { stream: "orders:eu".into(), ..Default::default() })
        .await
        .expect("read inside the allow-list")
        .into_inner();

    assert_eq!(delivery.id, appended.id);
    assert_eq!(read.entries.len(), 1);
}

/// Every call that names a stream outside the allow-list is PERMISSION_DENIED,
/// whatever the RPC, and touches nothing. Each case runs on an emptied Redis;
/// a failure names its case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_outside_the_allow_list_is_permission_denied() {
    let redis = RedisServer::start().await;
    let sidecar = allow_list_sidecar(&redis).await;
    let denied = Code::PermissionDenied;
    let mut dead_letter_elsewhere = subscribe_msg("orders:eu", "g", GroupStart::New);
    dead_letter_elsewhere.dead_letter_stream = "graveyard".into();

    let cases = vec![
        Refusal::new("Append", Rpc::Append(append_request("payments:eu")), denied)
            .naming("payments:eu")
            .leaving(Leaves::NoKey("payments:eu")),
        Refusal::new(
            "AppendBatch",
            Rpc::AppendBatch(AppendBatchRequest {
                stream: "payments:eu".into(),
                entries: vec![BatchEntry { fields: fields(&[("k", b"v")]), ..Default::default() }],
                ..Default::default()
            }),
            denied,
        )
        .leaving(Leaves::NoKey("payments:eu")),
        Refusal::new(
            "Append scheduled",
            Rpc::Append(AppendRequest {
                delay: Some(prost_types::Duration { seconds: 60, nanos: 0 }),
                ..append_request("payments:eu")
            }),
            denied,
        )
        .naming("payments:eu")
        .leaving(Leaves::NoKey("payments:eu"))
        .leaving(Leaves::NoKey("payments:eu:scheduled")),
        Refusal::new(
            "CancelScheduled",
            Rpc::CancelScheduled(echomq::proto::CancelScheduledRequest {
                stream: "payments:eu".into(),
                id: "0000000000010000000000000000".into(),
            }),
            denied,
        )
        .naming("payments:eu"),
        Refusal::new(
            "ListScheduled",
            Rpc::ListScheduled(echomq::proto::ListScheduledRequest {
                stream: "payments:eu".into(),
                ..Default::default()
            }),
            denied,
        )
        .naming("payments:eu"),
        // No group door may be opened.
        Refusal::new("Subscribe", Rpc::Subscribe(subscribe_msg("payments:eu", "g", GroupStart::New)), denied)
            .leaving(Leaves::NoKey("payments:eu")),
        Refusal::new("Read", Rpc::Read(ReadRequest { stream: "payments:eu".into(), ..Default::default() }), denied)
            .given(Seed::Entries("payments:eu", 1)),
        Refusal::new(
            "Trim",
            Rpc::Trim(TrimRequest { stream: "payments:eu".into(), max_len: 1, ..Default::default() }),
            denied,
        )
        .given(Seed::Entries("payments:eu", 3))
        .leaving(Leaves::Len("payments:eu", 3)),
        Refusal::new(
            "DescribeGroup",
            Rpc::DescribeGroup(DescribeGroupRequest {
                stream: "payments:eu".into(),
                group: "g".into(),
                ..Default::default()
            }),
            denied,
        )
        .given(Seed::Group("payments:eu", "g")),
        Refusal::new(
            "ListDeadLetters of a dead-letter stream outside the allow-list",
            Rpc::ListDeadLetters(ListDeadLettersRequest {
                stream: "orders:eu".into(),
                dead_letter_stream: "payments:dlq".into(),
                ..Default::default()
            }),
            denied,
        ),
        // The stream is inside, its dead-letter stream is not: no group door either.
        Refusal::new(
            "Subscribe with a dead-letter stream outside the allow-list",
            Rpc::Subscribe(dead_letter_elsewhere),
            denied,
        )
        .naming("graveyard")
        .leaving(Leaves::NoKey("orders:eu")),
    ];

    assert_refusals(&redis, &sidecar, cases).await;
}

// ---------------------------------------------------------------------------
// Allow-list per mTLS identity
// ---------------------------------------------------------------------------

/// A sidecar with mTLS: `public:*` for everyone, `invoices:*` for the billing
/// URI identity, `orders:*` for the orders DNS identity, and `ledger:*` for the
/// billing certificate's DNS SAN (which is not its identity).
struct IdentityFixture {
    // Dropped in this order: the processes before the certificates' directory.
    sidecar: Sidecar,
    redis: RedisServer,
    billing: CertFiles,
    orders: CertFiles,
    pki: TestPki,
}

impl IdentityFixture {
    async fn start() -> IdentityFixture {
        let pki = TestPki::new("ident");
        let billing = pki.client_cert("billing", &[&format!("URI:{BILLING_URI}"), &format!("DNS:{BILLING_DNS}")]);
        let orders = pki.client_cert("orders", &[&format!("DNS:{ORDERS_DNS}")]);
        let redis = RedisServer::start().await;
        let options = tls_options(&pki.server_cert(), Some(pki.ca_cert()))
            .arg("--allow-streams")
            .arg("public:*")
            .arg("--allow-streams-for")
            .arg(&format!("{BILLING_URI}=invoices:*"))
            .arg("--allow-streams-for")
            .arg(&format!("{ORDERS_DNS}=orders:*"))
            .arg("--allow-streams-for")
            .arg(&format!("{BILLING_DNS}=ledger:*"));
        let sidecar = Sidecar::start(&redis, options).await;
        IdentityFixture { pki, billing, orders, sidecar, redis }
    }

    async fn channel(&self, cert: &CertFiles) -> Channel {
        self.sidecar.try_tls_channel(self.pki.client_tls(Some(cert))).await.expect("mTLS handshake")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_streams_for_grants_extra_streams_to_the_uri_san_identity() {
    let f = IdentityFixture::start().await;
    let channel = f.channel(&f.billing).await;

    let appended = append_on(channel.clone(), None, "invoices:2024").await.expect("billing may append to invoices:*");
    let sub = subscribe_msg("invoices:2024", "g", GroupStart::Beginning);
    let mut call = Consumer::try_subscribe_on(ConsumerServiceClient::new(channel.clone()), None, sub)
        .await
        .expect("billing may consume invoices:*");
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;
    let public = append_on(channel, None, "public:news").await;

    assert_eq!(delivery.id, appended.id);
    assert!(public.is_ok(), "the everyone list still applies: {public:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_streams_for_grants_extra_streams_to_the_dns_san_identity() {
    let f = IdentityFixture::start().await;

    let appended = append_on(f.channel(&f.orders).await, None, "orders:eu").await;

    assert!(appended.is_ok(), "a certificate with only a DNS SAN is identified by it: {appended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_streams_for_does_not_grant_to_other_identities() {
    let f = IdentityFixture::start().await;

    let orders_to_invoices = append_on(f.channel(&f.orders).await, None, "invoices:2024").await;
    let billing_to_orders = append_on(f.channel(&f.billing).await, None, "orders:eu").await;
    let sub = subscribe_msg("invoices:2024", "g", GroupStart::New);
    let orders_consumes_invoices =
        Consumer::try_subscribe_on(ConsumerServiceClient::new(f.channel(&f.orders).await), None, sub).await;

    assert_code(&orders_to_invoices.expect_err("orders may not append to invoices:*"), Code::PermissionDenied);
    assert_code(&billing_to_orders.expect_err("billing may not append to orders:*"), Code::PermissionDenied);
    assert_code(&orders_consumes_invoices.err().expect("orders may not consume invoices:*"), Code::PermissionDenied);
    let mut con = f.redis.conn().await;
    assert!(!exists(&mut con, "invoices:2024").await);
}

/// mTLS over a unix socket: the client certificate's identity counts there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_identity_is_recognised_on_a_unix_socket() {
    let pki = TestPki::new("ident-uds");
    let billing = pki.client_cert("billing", &[&format!("URI:{BILLING_URI}")]);
    let redis = RedisServer::start().await;
    let mut options = tls_options(&pki.server_cert(), Some(pki.ca_cert()))
        .arg("--allow-streams-for")
        .arg(&format!("{BILLING_URI}=invoices:*"));
    options.unix_socket = true;
    let sidecar = Sidecar::start(&redis, options).await;
    let path = sidecar.unix_path().unwrap();

    let channel = unix_channel(path, Some(pki.client_tls(Some(&billing)))).await.expect("mTLS over the unix socket");

    let appended = append_on(channel, None, "invoices:2024").await;
    assert!(appended.is_ok(), "billing may append to invoices:* over the socket: {appended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_the_uri_san_even_when_a_dns_san_is_present() {
    let f = IdentityFixture::start().await;

    // `ledger:*` is granted to the billing certificate's DNS SAN, which is not
    // its identity: the URI SAN is.
    let err = append_on(f.channel(&f.billing).await, None, "ledger:1").await.expect_err("ledger:* is not billing's");

    assert_code(&err, Code::PermissionDenied);
    assert!(err.message().contains(BILLING_URI), "the message names the caller's identity: {err:?}");
}

/// Without client certificates no caller has an identity, so per-identity
/// rules could never apply: the setting is refused at start, not silently dead.
#[test]
fn allow_streams_for_without_mtls_exits_2_with_a_one_line_reason() {
    let mut args = base_args();
    args.extend(["--allow-streams-for".to_owned(), format!("{BILLING_URI}=invoices:*")]);

    let out = run_to_exit(&args, Duration::from_secs(15));

    assert_exit_2_with_one_line(&out, "--allow-streams-for", "--tls-client-ca-file");
}

// ---------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_over_max_message_bytes_is_resource_exhausted() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-message-bytes").arg("2048")).await;
    let small = vec![b'x'; 1000];
    let big = vec![b'x'; 4000];
    let mut client = sidecar.stream_client().await;

    let fits = client
        .append(AppendRequest { stream: "s".into(), fields: fields(&[("body", &small)]), ..Default::default() })
        .await;
    let err = client
        .append(AppendRequest { stream: "s".into(), fields: fields(&[("body", &big)]), ..Default::default() })
        .await
        .expect_err("a 4000-byte message is over a 2048-byte limit");

    assert!(fits.is_ok(), "a message under the limit is accepted: {fits:?}");
    assert_code(&err, Code::ResourceExhausted);
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 1, "only the small entry was appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_over_max_fields_per_entry_are_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-fields-per-entry").arg("3")).await;
    let three = fields(&[("a", b"1"), ("b", b"2"), ("c", b"3")]);
    let mut four = three.clone();
    four.insert("d".into(), b"4".to_vec());

    let fits = sidecar
        .stream_client()
        .await
        .append(AppendRequest { stream: "s".into(), fields: three, ..Default::default() })
        .await;
    let err = sidecar
        .stream_client()
        .await
        .append(AppendRequest { stream: "s".into(), fields: four, ..Default::default() })
        .await
        .expect_err("four fields is over a limit of three");

    assert!(fits.is_ok(), "exactly the limit is accepted: {fits:?}");
    assert_code(&err, Code::InvalidArgument);
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_name_over_max_name_bytes_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-name-bytes").arg("16")).await;
    let at_limit = "s".repeat(16);
    let over = "s".repeat(17);

    let fits = try_append(&sidecar, &at_limit).await;
    let err = try_append(&sidecar, &over).await.expect_err("17 bytes is over a 16-byte limit");
    let subscribe_err =
        Consumer::try_subscribe(&sidecar, subscribe_msg(&over, "g", GroupStart::New)).await.err().expect("too long");

    assert!(fits.is_ok(), "exactly the limit is accepted: {fits:?}");
    assert_code(&err, Code::InvalidArgument);
    assert_code(&subscribe_err, Code::InvalidArgument);
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, &over).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_name_over_max_name_bytes_is_invalid_argument() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-name-bytes").arg("16")).await;

    let err = Consumer::try_subscribe(&sidecar, subscribe_msg("s", &"g".repeat(17), GroupStart::New))
        .await
        .err()
        .expect("a 17-byte group name is over a 16-byte limit");

    assert_code(&err, Code::InvalidArgument);
    let mut con = redis.conn().await;
    assert!(!exists(&mut con, "s").await, "no group door may be opened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_calls_over_max_consume_calls_are_resource_exhausted() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-consume-calls").arg("2")).await;
    let _first = Consumer::start(&sidecar, "s", "g1", GroupStart::New, 0).await;
    let _second = Consumer::start(&sidecar, "s", "g2", GroupStart::New, 0).await;

    let err = Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g3", GroupStart::New))
        .await
        .err()
        .expect("a third call is over a limit of two");

    assert_code(&err, Code::ResourceExhausted);
    assert!(err.message().contains("--max-consume-calls"), "the message names the setting: {err:?}");
    // The operator sees it too, at WARN (a line a second at most).
    let log = sidecar.log();
    let warned =
        log.lines().any(|l| l.contains(" WARN ") && l.contains("a Consume call was refused") && l.contains("g3"));
    assert!(warned, "the refusal is logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_consume_call_frees_its_slot() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--max-consume-calls").arg("1")).await;
    let first = Consumer::start(&sidecar, "s", "g1", GroupStart::New, 0).await;
    let refused = Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g2", GroupStart::New)).await;
    assert_code(&refused.err().expect("the limit is one call"), Code::ResourceExhausted);

    drop(first);

    let deadline = Instant::now() + EVENT_TIMEOUT;
    let (mut freed, mut last) = (false, None);
    while !freed && Instant::now() < deadline {
        match Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g2", GroupStart::New)).await {
            Ok(_call) => freed = true,
            Err(status) => {
                last = Some(status);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(freed, "the slot of an ended call must be freed; last refusal: {last:?}");
}

// ---------------------------------------------------------------------------
// Redis authentication and TLS
// ---------------------------------------------------------------------------

const REDIS_PASSWORD: &str = "redis-pa55word";

async fn password_redis() -> RedisServer {
    RedisServer::start_with(RedisOptions {
        args: vec!["--requirepass".into(), REDIS_PASSWORD.into()],
        ..RedisOptions::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_file_authenticates_to_redis() {
    let dir = TempDir::new("redis-auth");
    let redis = password_redis().await;
    let file = write_file(dir.path(), "redis-password", &format!("{REDIS_PASSWORD}\n"));

    let sidecar =
        Sidecar::start(&redis, SidecarOptions::default().arg("--redis-password-file").arg(&path_str(&file))).await;
    let appended = try_append(&sidecar, "s").await.expect("append through an authenticated connection");

    let mut con = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    assert_eq!(xrange(&mut con, "s").await[0].stream_id, appended.stream_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_redis_password_at_start_exits_2_saying_why() {
    let dir = TempDir::new("redis-auth");
    let redis = password_redis().await;
    let file = write_file(dir.path(), "redis-password", "not-the-password\n");

    let mut sidecar =
        Sidecar::launch(&redis, SidecarOptions::default().arg("--redis-password-file").arg(&path_str(&file))).await;

    // Waiting would not mend a wrong password: a setting to fix, exit 2, like a bad flag.
    let status = sidecar.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{}", sidecar.log());
    let log = sidecar.log();
    assert!(log.contains("Redis refused the sidecar's settings"), "the reason is said:\n{log}");
    assert!(log.to_lowercase().contains("wrongpass") || log.contains("AuthenticationFailed"), "{log}");
    assert!(!log.contains("not-the-password"), "the password is shown:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_redis_password_at_start_exits_2_saying_noauth() {
    let redis = password_redis().await;

    let mut sidecar = Sidecar::launch(&redis, SidecarOptions::default()).await;

    let status = sidecar.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{}", sidecar.log());
    assert!(sidecar.log().contains("NOAUTH"), "{}", sidecar.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_index_redis_does_not_have_exits_2() {
    let redis = RedisServer::start().await;
    let options = SidecarOptions { redis_url: Some(format!("{}/99", redis.url())), ..SidecarOptions::default() };

    let mut sidecar = Sidecar::launch(&redis, options).await;

    let status = sidecar.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{}", sidecar.log());
    assert!(sidecar.log().contains("DB index is out of range"), "{}", sidecar.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_password_file_overrides_the_url_password() {
    let dir = TempDir::new("redis-auth");
    let redis = password_redis().await;
    let file = write_file(dir.path(), "redis-password", REDIS_PASSWORD);
    let options =
        SidecarOptions { redis_url: Some(redis.url_with_auth(None, "stale-password")), ..SidecarOptions::default() }
            .arg("--redis-password-file")
            .arg(&path_str(&file));

    let sidecar = Sidecar::launch(&redis, options).await;

    assert!(becomes_ready(&sidecar, START_TIMEOUT).await, "the file's password wins:\n{}", sidecar.log());
}

/// Adds ACL user `user` with `password`, allowed all commands on `keys`
/// (`ACL SETUSER … ~<pattern> …`, space-separated rules).
async fn acl_user(admin: &mut redis::aio::MultiplexedConnection, user: &str, password: &str, keys: &str) {
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg(user).arg("on").arg(format!(">{password}"));
    setuser.arg(keys.split(' ').collect::<Vec<_>>()).arg("+@all");
    let _: redis::Value = setuser.query_async(admin).await.expect("ACL SETUSER");
}

/// Sidecar options that connect to `redis` as `user` (`redis://user@…<path>`,
/// `path` being `""` or a database like `"/3"`) with `password` from
/// `--redis-password-file`; and the directory that holds the file.
fn as_acl_user(redis: &RedisServer, user: &str, password: &str, path: &str) -> (SidecarOptions, TempDir) {
    let dir = TempDir::new("redis-acl");
    let file = write_file(dir.path(), "redis-password", &format!("{password}\n"));
    let options = SidecarOptions {
        redis_url: Some(format!("redis://{user}@127.0.0.1:{}{path}", redis.port())),
        ..SidecarOptions::default()
    }
    .arg("--redis-password-file")
    .arg(&path_str(&file));
    (options, dir)
}

/// Redis refusing a command to the sidecar's ACL user (NOPERM) is the
/// operator's to fix: PERMISSION_DENIED, not INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_acl_refusal_is_permission_denied() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "narrow", "narrow-pa55", "~orders*").await;
    let (options, _dir) = as_acl_user(&redis, "narrow", "narrow-pa55", "");
    let sidecar = Sidecar::start(&redis, options).await;

    assert!(try_append(&sidecar, "orders").await.is_ok());
    let refused = try_append(&sidecar, "payments").await.expect_err("outside the ACL user's keys");
    assert_code(&refused, Code::PermissionDenied);
    assert!(refused.message().contains("NOPERM") || refused.message().contains("permission"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acl_user_with_password_file_connects_as_that_user() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "echomq", "user-pa55", "~* &*").await;
    let (options, _dir) = as_acl_user(&redis, "echomq", "user-pa55", "");

    let sidecar = Sidecar::start(&redis, options).await;
    let appended = try_append(&sidecar, "s").await.expect("append as the ACL user");

    assert_eq!(xrange(&mut admin, "s").await[0].stream_id, appended.stream_id);
    let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut admin).await.expect("CLIENT LIST");
    assert!(clients.lines().any(|l| l.contains("user=echomq")), "the sidecar is connected as `echomq`:\n{clients}");
}

/// An ACL user deleted under a running sidecar (Redis closes its
/// connections) and re-created: the sidecar is unready meanwhile, and ready
/// and appending again once the user is back, twice in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_deleted_and_re_created_is_reconnected_as() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "echomq", "user-pa55", "~* &*").await;
    let (options, _dir) = as_acl_user(&redis, "echomq", "user-pa55", "");
    let sidecar = Sidecar::start(&redis, options).await;
    try_append(&sidecar, "s").await.expect("append as the ACL user");

    for round in 0..2 {
        let _: redis::Value =
            redis::cmd("ACL").arg("DELUSER").arg("echomq").query_async(&mut admin).await.expect("DELUSER");
        let unready = eventually(EVENT_TIMEOUT, || async { sidecar.readyz().await == Some(503) }).await;
        assert!(unready, "round {round}: still ready without its user:\n{}", sidecar.log());
        let refused = try_append(&sidecar, "s").await.expect_err("appended without its user");
        assert_eq!(refused.code(), Code::Unavailable, "round {round}: retrying may help, not INTERNAL: {refused:?}");

        acl_user(&mut admin, "echomq", "user-pa55", "~* &*").await;

        assert!(becomes_ready(&sidecar, EVENT_TIMEOUT).await, "round {round}: never ready again:\n{}", sidecar.log());
        let appended = try_append(&sidecar, "s").await.expect("append once the user is back");
        assert_eq!(xrange(&mut admin, "s").await.last().expect("entries").stream_id, appended.stream_id);
    }
    let refusals = sidecar.log().matches("refused the sidecar's credentials").count();
    assert!((1..=2).contains(&refusals), "one warning per refusal, not per retry: {refusals}\n{}", sidecar.log());
}

/// A password rotated the way Kubernetes rotates a mounted Secret: Redis
/// gets the new password, the file gets the new text, and the sidecar's
/// connections are closed (CLIENT KILL). Redis refuses the old password on
/// the reconnect, so the sidecar reads the file again: appends (the shared
/// connection) and consumption (the reader's own connection) recover with
/// the new password, said once in the log, without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_password_file_is_read_again_when_redis_refuses_the_old_one() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "echomq", "first-pa55", "~* &*").await;
    let (options, dir) = as_acl_user(&redis, "echomq", "first-pa55", "");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let before = try_append(&sidecar, "s").await.expect("append with the first password");
    assert_eq!(call.next_delivery(EVENT_TIMEOUT).await.id, before.id);

    let _: redis::Value = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("echomq")
        .arg("resetpass")
        .arg(">second-pa55")
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    write_file(dir.path(), "redis-password", "second-pa55\n");
    let killed: i64 =
        redis::cmd("CLIENT").arg("KILL").arg("USER").arg("echomq").query_async(&mut admin).await.expect("CLIENT KILL");
    assert!(killed >= 2, "the shared connection and the reader's were open: {killed}");

    let appended = eventually(EVENT_TIMEOUT, || async { try_append(&sidecar, "s").await.is_ok() }).await;
    assert!(appended, "appends never recovered with the new password:\n{}", sidecar.log());
    let after = try_append(&sidecar, "s").await.expect("append with the second password");
    let mut delivered = Vec::new();
    while !delivered.contains(&after.id) {
        delivered.push(call.next_delivery(EVENT_TIMEOUT).await.id);
    }
    let log = sidecar.log();
    let said = log.lines().filter(|l| l.contains("--redis-password-file") && !l.contains("test fixture")).count();
    assert_eq!(said, 1, "the new password is said once:\n{log}");
    assert!(!log.contains("pa55"), "no password in the log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_for_the_acl_user_keeps_the_sidecar_unready() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "echomq", "user-pa55", "~* &*").await;
    // The default user's password is not the ACL user's.
    let (options, _dir) = as_acl_user(&redis, "echomq", REDIS_PASSWORD, "");

    let sidecar = Sidecar::launch(&redis, options).await;

    assert_never_ready(&sidecar, Duration::from_secs(4), "the ACL user's password is wrong").await;
}

/// A reader connection is set up as the URL says: the database it names
/// (`/3`), and the ACL user with the password from `--redis-password-file`.
/// A reader on another database would find no group there (NOGROUP) and
/// deliver nothing; one not authenticated would be refused (NOAUTH).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_reads_the_database_and_as_the_user_the_url_names() {
    let redis = password_redis().await;
    let mut admin = redis.conn_with_auth(None, REDIS_PASSWORD).await;
    acl_user(&mut admin, "reader", "reader-pa55", "~* &*").await;
    let (options, _dir) = as_acl_user(&redis, "reader", "reader-pa55", "/3");
    let sidecar = Sidecar::start(&redis, options).await;

    let mut consumer = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let appended = sidecar.append("s", &[("k", b"in database 3")]).await;
    let delivery = consumer.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(delivery.stream_id, appended.stream_id);
    assert_eq!(delivery.payload["k"], &b"in database 3"[..]);
    let clients: String = redis::cmd("CLIENT").arg("LIST").query_async(&mut admin).await.expect("CLIENT LIST");
    let reader = clients.lines().find(|line| line.contains("name=echomq-reader")).expect("a reader");
    assert!(reader.contains(" db=3 ") && reader.contains(" user=reader "), "{reader}");
}

/// A redis-server serving TLS only, with a certificate of `pki` for 127.0.0.1.
async fn tls_redis(pki: &TestPki) -> RedisServer {
    let server = pki.server_cert();
    RedisServer::start_with(RedisOptions {
        args: vec![
            "--tls-cert-file".into(),
            path_str(&server.cert),
            "--tls-key-file".into(),
            path_str(&server.key),
            "--tls-ca-cert-file".into(),
            path_str(pki.ca_cert()),
            "--tls-auth-clients".into(),
            "no".into(),
        ],
        tls: true,
        ..RedisOptions::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_redis_ca_file_appends_and_consumes_over_tls() {
    let pki = TestPki::new("redis-tls");
    let redis = tls_redis(&pki).await;
    let options =
        SidecarOptions { redis_url: Some(format!("rediss://127.0.0.1:{}", redis.port())), ..SidecarOptions::default() }
            .arg("--redis-ca-file")
            .arg(&path_str(pki.ca_cert()));

    let sidecar = Sidecar::start(&redis, options).await;
    let appended = try_append(&sidecar, "s").await.expect("append over rediss://");
    // The blocking read has a connection of its own: it must speak TLS too.
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    let delivery = call.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(delivery.id, appended.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_an_untrusted_certificate_is_never_ready() {
    let pki = TestPki::new("redis-tls");
    let other = TestPki::new("other");
    let redis = tls_redis(&pki).await;
    let options =
        SidecarOptions { redis_url: Some(format!("rediss://127.0.0.1:{}", redis.port())), ..SidecarOptions::default() }
            .arg("--redis-ca-file")
            .arg(&path_str(other.ca_cert()));

    let sidecar = Sidecar::launch(&redis, options).await;

    assert_never_ready(&sidecar, Duration::from_secs(4), "Redis' certificate is not signed by --redis-ca-file").await;
}

// ---------------------------------------------------------------------------
// Unusable security files at start-up
// ---------------------------------------------------------------------------

#[test]
fn missing_auth_token_file_exits_2_with_a_one_line_reason() {
    let mut args = base_args();
    args.extend(["--auth-token-file".into(), "/nonexistent/echomq/token".into()]);

    let out = run_to_exit(&args, Duration::from_secs(15));

    assert_exit_2_with_one_line(&out, "--auth-token-file", "/nonexistent/echomq/token");
}

#[test]
fn empty_auth_token_file_exits_2_with_a_one_line_reason() {
    let dir = TempDir::new("token");
    let file = write_file(dir.path(), "token", " \n");
    let mut args = base_args();
    args.extend(["--auth-token-file".into(), path_str(&file)]);

    let out = run_to_exit(&args, Duration::from_secs(15));

    assert_exit_2_with_one_line(&out, "--auth-token-file", &path_str(&file));
}

#[test]
fn missing_tls_cert_file_exits_2_with_a_one_line_reason() {
    let pki = TestPki::new("tls");
    let server = pki.server_cert();
    let mut args = base_args();
    args.extend([
        "--tls-cert-file".into(),
        "/nonexistent/echomq/cert.pem".into(),
        "--tls-key-file".into(),
        path_str(&server.key),
    ]);

    let out = run_to_exit(&args, Duration::from_secs(15));

    assert_exit_2_with_one_line(&out, "--tls-cert-file", "/nonexistent/echomq/cert.pem");
}

#[test]
fn tls_cert_file_that_is_not_a_certificate_exits_2_without_waiting_for_redis() {
    let pki = TestPki::new("tls");
    let server = pki.server_cert();
    let garbage = write_file(pki.dir(), "garbage.pem", "this is not a certificate\n");
    let mut args = base_args();
    args.extend(["--tls-cert-file".into(), path_str(&garbage), "--tls-key-file".into(), path_str(&server.key)]);

    // Redis (127.0.0.1:1) is unreachable: a sidecar that checks its
    // certificate only after connecting would retry forever.
    let out = run_to_exit(&args, Duration::from_secs(15));

    assert_exit_2_with_one_line(&out, "--tls-cert-file", &path_str(&garbage));
}
