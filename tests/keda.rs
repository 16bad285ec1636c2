//! KEDA's external scaler (`--keda-scaler`): a client speaking KEDA's own
//! protocol (`externalscaler.ExternalScaler`) against a real sidecar and
//! Redis. The metric is the group's backlog: its lag (right after trims, on
//! every server) plus the pending entries no live call holds, plus the
//! scheduled entries that are due.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::time::{Duration, Instant};

use echomq::{
    keda::proto::{external_scaler_client::ExternalScalerClient, GetMetricsRequest, IsActiveResponse, ScaledObjectRef},
    proto::{AppendRequest, DescribeGroupRequest, GroupStart},
};
use redis::aio::MultiplexedConnection;
use support::*;
use tonic::{transport::Channel, Code, Status};

/// A sidecar serving the scaler, whose pending entries count as unheld after
/// `unheld_ms` idle (`--reclaim-min-idle-ms`).
async fn scaler_sidecar(redis: &RedisServer, unheld_ms: u64) -> Sidecar {
    Sidecar::start(redis, SidecarOptions::default().arg("--keda-scaler").reclaim(unheld_ms, 60_000)).await
}

async fn client(sidecar: &Sidecar) -> ExternalScalerClient<Channel> {
    ExternalScalerClient::new(sidecar.channel().await)
}

/// A trigger's reference, as KEDA sends it: the trigger's metadata as given,
/// `scalerAddress` included.
fn trigger(pairs: &[(&str, &str)]) -> ScaledObjectRef {
    let mut metadata: std::collections::HashMap<String, String> =
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    metadata.insert("scalerAddress".into(), "echomq-scaler.default.svc:50051".into());
    ScaledObjectRef { name: "consumers".into(), namespace: "default".into(), scaler_metadata: metadata }
}

fn s_g() -> ScaledObjectRef {
    trigger(&[("stream", "s"), ("group", "g")])
}

/// The metric GetMetrics reports for `scaled`.
async fn metric(sidecar: &Sidecar, scaled: ScaledObjectRef) -> Result<i64, Status> {
    let request = GetMetricsRequest { scaled_object_ref: Some(scaled), metric_name: "echomq-s-g".into() };
    let values = client(sidecar).await.get_metrics(request).await?.into_inner().metric_values;
    assert_eq!(values.len(), 1, "{values:?}");
    assert_eq!(values[0].metric_name, "echomq-s-g", "answered by the name asked for");
    assert_eq!(values[0].metric_value as f64, values[0].metric_value_float);
    Ok(values[0].metric_value)
}

async fn is_active(sidecar: &Sidecar, scaled: ScaledObjectRef) -> Result<bool, Status> {
    Ok(client(sidecar).await.is_active(scaled).await?.into_inner().result)
}

/// Appends `n` entries with plain XADD.
async fn xadd_n(con: &mut MultiplexedConnection, stream: &str, n: usize) {
    for k in 0..n {
        let _: String = redis::cmd("XADD").arg(stream).arg("*").arg("n").arg(k).query_async(con).await.unwrap();
    }
}

/// A trim that removed entries the group had not read leaves Redis 7.0's
/// XINFO `lag` wrong for good, and 6.2 has none: the metric is the true
/// count anyway, the same as DescribeGroup's lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_is_the_true_backlog_after_a_trim_of_unread_entries() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;
    xadd_n(&mut con, "s", 60).await;
    read_and_ack(&mut con, "s", "g", 10).await;
    // Removes the 10 read and 20 the group has not read.
    let _: i64 = redis::cmd("XTRIM").arg("s").arg("MAXLEN").arg(30).query_async(&mut con).await.unwrap();
    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 30, "nothing left that was read: the whole stream");

    read_and_ack(&mut con, "s", "g", 5).await;
    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 25, "25 left after the last-delivered id");
    let described = sidecar
        .admin_client()
        .await
        .describe_group(DescribeGroupRequest { stream: "s".into(), group: "g".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(described.lag, Some(25), "the metric is what DescribeGroup reports");
    assert!(is_active(&sidecar, s_g()).await.unwrap());
}

/// All consumed and acknowledged: the metric is 0 and IsActive false, so KEDA
/// may scale the consumers to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backlog_is_zero_and_inactive_once_everything_is_acked() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;
    sidecar.append_numbered("s", 3).await;
    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 3);
    assert!(is_active(&sidecar, s_g()).await.unwrap());

    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    let delivered = call.deliveries(3, EVENT_TIMEOUT).await;
    call.ack(&delivered.iter().map(|d| d.id.as_str()).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);

    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 0);
    assert!(!is_active(&sidecar, s_g()).await.unwrap());
}

/// Entries a live call holds are being worked on: they do not count, however
/// long the handler takes. Entries pending for a consumer that died count
/// once idle for `--reclaim-min-idle-ms` (a live call's lease refresh keeps
/// its entries' idle time under a third of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_held_by_a_live_call_do_not_count_but_a_dead_consumers_do() {
    let redis = RedisServer::start().await;
    let scaler = scaler_sidecar(&redis, 1_000).await;
    let mut consumer = Sidecar::start(&redis, SidecarOptions::named("pod-c").reclaim(1_000, 60_000)).await;
    sidecar_appends(&scaler, 3).await;
    let mut call = Consumer::start(&consumer, "s", "g", GroupStart::Beginning, 2).await;
    call.deliveries(2, EVENT_TIMEOUT).await;
    call.assert_quiet(Duration::from_millis(300), "max_in_flight 2").await;

    // Longer than the idle limit: held entries stay fresh, only the unread one counts.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(metric(&scaler, s_g()).await.unwrap(), 1, "two held by a live call, one not read");

    consumer.kill9();
    let counted = eventually(Duration::from_secs(10), || async { metric(&scaler, s_g()).await.unwrap() == 3 }).await;
    assert!(counted, "the dead consumer's two entries never counted: {}", metric(&scaler, s_g()).await.unwrap());
}

/// The next StreamIsActive message within `within`; `Err` when none came.
async fn next(
    stream: &mut tonic::Streaming<IsActiveResponse>,
    within: Duration,
) -> Result<Result<Option<IsActiveResponse>, Status>, tokio::time::error::Elapsed> {
    tokio::time::timeout(within, stream.message()).await
}

async fn sidecar_appends(sidecar: &Sidecar, n: usize) {
    sidecar.append_numbered("s", n).await;
}

/// StreamIsActive answers at once, then pushes `true` within a second of an
/// append to a group that had nothing to do, and nothing while nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_is_active_pushes_true_within_a_second_of_an_append() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "$").await;
    let mut stream = client(&sidecar).await.stream_is_active(s_g()).await.expect("stream").into_inner();
    let first = next(&mut stream, Duration::from_secs(2)).await.expect("a first answer at once");
    assert!(!first.unwrap().unwrap().result, "nothing to do yet");
    assert!(next(&mut stream, Duration::from_millis(800)).await.is_err(), "no push while nothing changes");

    let appended = Instant::now();
    sidecar.append("s", &[("k", b"v")]).await;
    let pushed = next(&mut stream, Duration::from_secs(1)).await.expect("pushed within a second of the append");
    assert!(pushed.unwrap().unwrap().result, "active after the append");
    assert!(appended.elapsed() < Duration::from_secs(1), "took {:?}", appended.elapsed());
    assert!(next(&mut stream, Duration::from_millis(800)).await.is_err(), "pushed once, not on every poll");
}

/// Bad metadata gets a status and a message that says which key to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_metadata_is_refused_with_a_status_that_says_what_to_fix() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;
    // The trigger's metadata, the status it gets, and what the message must say.
    type Case = (&'static [(&'static str, &'static str)], Code, &'static str);
    let cases: [Case; 4] = [
        (&[("group", "g")], Code::InvalidArgument, "set `stream` in the trigger's metadata"),
        (&[("stream", "s")], Code::InvalidArgument, "set `group` in the trigger's metadata"),
        (
            &[("stream", "s"), ("group", "g"), ("backlogPerReplica", "ten")],
            Code::InvalidArgument,
            "`ten` is not a whole number",
        ),
        (&[("stream", "s"), ("group", "g"), ("backlogPerReplica", "0")], Code::InvalidArgument, "must be at least 1"),
    ];
    for (pairs, code, says) in cases {
        let mut client = client(&sidecar).await;
        let scaled = trigger(pairs);
        let refusals = [
            ("IsActive", client.is_active(scaled.clone()).await.map(|_| ())),
            ("GetMetricSpec", client.get_metric_spec(scaled.clone()).await.map(|_| ())),
            ("GetMetrics", metric(&sidecar, scaled.clone()).await.map(|_| ())),
            ("StreamIsActive", client.stream_is_active(scaled.clone()).await.map(|_| ())),
        ];
        for (rpc, result) in refusals {
            let status = result.expect_err(&format!("{rpc} {pairs:?} must be refused"));
            assert_eq!(status.code(), code, "{rpc} {pairs:?}: {status:?}");
            assert!(status.message().contains(says), "{rpc} {pairs:?}: {:?} lacks {says:?}", status.message());
        }
    }
}

/// A group that does not exist (before its first consumer, or lost with
/// Redis' data): its backlog is the whole stream, so KEDA wakes consumers
/// that create it; a stream that does not exist has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_does_not_exist_has_the_whole_stream_as_its_backlog() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    let not_yet = trigger(&[("stream", "s"), ("group", "not-yet")]);
    assert_eq!(metric(&sidecar, not_yet.clone()).await.unwrap(), 0, "no stream, no backlog");
    assert!(!is_active(&sidecar, not_yet.clone()).await.unwrap());
    let spec = client(&sidecar).await.get_metric_spec(not_yet.clone()).await.expect("a spec before the group exists");
    assert_eq!(spec.into_inner().metric_specs.len(), 1);

    xadd_n(&mut con, "s", 7).await;
    assert_eq!(metric(&sidecar, not_yet.clone()).await.unwrap(), 7, "every entry, until a consumer creates the group");
    assert!(is_active(&sidecar, not_yet.clone()).await.unwrap(), "KEDA wakes the consumers that would create it");

    create_group(&mut con, "s", "not-yet", "$").await;
    assert_eq!(metric(&sidecar, not_yet).await.unwrap(), 0, "created from the end: nothing to do");
}

/// Scheduled entries that are due are work: they enter the stream within a
/// mover's poll. Here they stay due in the schedule: the sidecar that
/// scheduled them is gone, and the scaler's mover, idle since before they
/// were scheduled, sleeps for a minute. Entries not due yet are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_scheduled_entries_count_and_later_ones_do_not() {
    let redis = RedisServer::start().await;
    let idle = |options: SidecarOptions| {
        options.arg("--schedule-poll-ms").arg("60000").arg("--schedule-idle-poll-ms").arg("60000")
    };
    let sidecar = Sidecar::start(&redis, idle(SidecarOptions::default().arg("--keda-scaler"))).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "$").await;
    let mut producer = Sidecar::start(&redis, idle(SidecarOptions::default())).await;
    let mut streams = producer.stream_client().await;
    for delay_ms in [1_000, 1_000, 3_600_000] {
        let delay = prost_types::Duration::try_from(Duration::from_millis(delay_ms)).ok();
        let request = AppendRequest { stream: "s".into(), delay, ..Default::default() };
        assert!(streams.append(request).await.unwrap().into_inner().scheduled);
    }
    producer.kill9();
    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 0, "nothing is due yet");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(redis::cmd("XLEN").arg("s").query_async::<u64>(&mut con).await.unwrap(), 0, "not moved");
    assert_eq!(metric(&sidecar, s_g()).await.unwrap(), 2, "the two due, not the one due in an hour");
    assert!(is_active(&sidecar, s_g()).await.unwrap());
}

/// Open StreamIsActive calls are capped, so no client (the scaler's own
/// port asks no token) can load Redis or the scaler without bound; a closed
/// one frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_is_active_calls_are_capped_and_a_closed_one_frees_its_place() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;
    let mut client = client(&sidecar).await;
    let mut open = Vec::new();
    for _ in 0..echomq::keda::MAX_OPEN_STREAMS {
        open.push(client.stream_is_active(s_g()).await.expect("within the cap").into_inner());
    }
    let refused = client.stream_is_active(s_g()).await.expect_err("one over the cap");
    assert_code(&refused, Code::ResourceExhausted);
    assert!(refused.message().contains("256 StreamIsActive calls are open"), "{refused:?}");
    drop(open.pop());
    let freed = eventually(EVENT_TIMEOUT, || {
        let mut client = client.clone();
        async move { client.stream_is_active(s_g()).await.is_ok() }
    })
    .await;
    assert!(freed, "a closed call frees its place");
}

/// GetMetricSpec names one metric per trigger and asks for
/// `backlogPerReplica` entries per replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_spec_names_the_group_and_targets_backlog_per_replica() {
    let redis = RedisServer::start().await;
    let sidecar = scaler_sidecar(&redis, 30_000).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "orders:eu", "billing", "0").await;
    let scaled = trigger(&[("stream", "orders:eu"), ("group", "billing"), ("backlogPerReplica", "50")]);
    let specs = client(&sidecar).await.get_metric_spec(scaled).await.unwrap().into_inner().metric_specs;
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].metric_name, "echomq-orders-eu-billing");
    assert_eq!((specs[0].target_size, specs[0].target_size_float), (50, 50.0));
}

/// A scaler sidecar (`flag`, with `value` if any) behind the bearer token
/// `s3cret` and the allow-list `orders:*`, with group `g` on `orders:eu`
/// (allowed) and on `payments` (not); the directory holds the token file.
async fn guarded_scaler(flag: &str, value: Option<&str>) -> (RedisServer, Sidecar, TempDir) {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("keda-token");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let mut options = SidecarOptions::default().arg(flag);
    if let Some(value) = value {
        options = options.arg(value);
    }
    let options =
        options.arg("--auth-token-file").arg(token_file.to_str().unwrap()).arg("--allow-streams").arg("orders:*");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "orders:eu", "g", "0").await;
    create_group(&mut con, "payments", "g", "0").await;
    (redis, sidecar, dir)
}

/// The scaler sits behind the same bearer token and stream allow-list as the
/// EchoMQ services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scaler_needs_the_token_and_a_stream_in_the_allow_list() {
    let (_redis, sidecar, _dir) = guarded_scaler("--keda-scaler", None).await;
    let mut client = client(&sidecar).await;
    let orders = trigger(&[("stream", "orders:eu"), ("group", "g")]);

    let without = client.is_active(orders.clone()).await.expect_err("no token");
    assert_code(&without, Code::Unauthenticated);
    let allowed = client.is_active(with_token(orders, Some("s3cret"))).await.expect("token, allowed stream");
    assert!(!allowed.into_inner().result);
    let outside = trigger(&[("stream", "payments"), ("group", "g")]);
    let denied = client.is_active(with_token(outside, Some("s3cret"))).await.expect_err("outside the allow-list");
    assert_code(&denied, Code::PermissionDenied);
    assert!(denied.message().contains("`payments`"), "{denied:?}");
}

/// `--keda-scaler-listen`: the scaler on a port of its own, with nothing
/// else on it, asks for no token (KEDA cannot send one) but keeps the
/// allow-list; the gRPC port no longer serves it, and keeps its token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_its_own_port_the_scaler_asks_no_token_and_serves_nothing_else() {
    let port = free_port();
    let (_redis, sidecar, _dir) = guarded_scaler("--keda-scaler-listen", Some(&format!("127.0.0.1:{port}"))).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .expect("the scaler's port");
    let mut scaler = ExternalScalerClient::new(channel.clone());
    let orders = trigger(&[("stream", "orders:eu"), ("group", "g")]);

    let answered = scaler.is_active(orders.clone()).await.expect("no token asked on the scaler's port");
    assert!(!answered.into_inner().result);
    let outside = trigger(&[("stream", "payments"), ("group", "g")]);
    let denied = scaler.is_active(outside).await.expect_err("the allow-list applies");
    assert_code(&denied, Code::PermissionDenied);

    let describe = DescribeGroupRequest { stream: "orders:eu".into(), group: "g".into() };
    let admin = echomq::proto::admin_service_client::AdminServiceClient::new(channel.clone())
        .describe_group(describe)
        .await
        .expect_err("no EchoMQ call on the scaler's port");
    assert_code(&admin, Code::Unimplemented);
    let services = list_services_on(channel).await;
    assert!(services.iter().any(|s| s == "externalscaler.ExternalScaler"), "{services:?}");
    assert!(!services.iter().any(|s| s.starts_with("echomq.")), "{services:?}");

    let on_grpc_port = client(&sidecar).await.is_active(with_token(orders, Some("s3cret"))).await;
    assert_code(&on_grpc_port.expect_err("not on the gRPC port"), Code::Unimplemented);
}

/// Off by default: the service is not served, and reflection does not list it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_scaler_is_unimplemented_and_not_listed() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let refused = client(&sidecar).await.is_active(s_g()).await.expect_err("not served");
    assert_code(&refused, Code::Unimplemented);
    let services = list_services(&sidecar).await;
    assert!(!services.iter().any(|s| s == "externalscaler.ExternalScaler"), "{services:?}");
}

/// With `ECHOMQ_KEDA_SCALER=true`, reflection lists KEDA's service beside EchoMQ's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_variable_reflection_lists_the_scaler() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().env("ECHOMQ_KEDA_SCALER", "true")).await;
    let services = list_services(&sidecar).await;
    assert!(services.iter().any(|s| s == "externalscaler.ExternalScaler"), "{services:?}");
    assert!(services.iter().any(|s| s == "echomq.v1.AdminService"), "{services:?}");
}
