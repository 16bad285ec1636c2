//! Operating the sidecar: admin HTTP, gRPC health and reflection, SIGTERM,
//! configuration by flags and environment.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use echomq::proto::{AppendRequest, AppendResponse, DescribeGroupRequest, GroupStart, ReadRequest};
use support::*;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_is_200() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    assert_eq!(sidecar.livez().await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_redis_is_down_and_200_again_after() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    assert_eq!(sidecar.readyz().await, Some(200));

    redis.kill9();

    let not_ready = eventually(Duration::from_secs(15), || async { sidecar.readyz().await == Some(503) }).await;
    assert!(not_ready, "/readyz must turn 503 while Redis is unreachable (last: {:?})", sidecar.readyz().await);
    let body = http_get(sidecar.admin_port(), "/readyz").await.expect("GET /readyz").body;
    assert!(body.starts_with("not ready: ") && body.contains("Redis"), "the body says why: {body:?}");
    assert_eq!(sidecar.livez().await, Some(200), "liveness does not depend on Redis");
    redis.restart().await;
    let ready = eventually(Duration::from_secs(15), || async { sidecar.readyz().await == Some(200) }).await;
    assert!(ready, "/readyz must be 200 again once Redis is back (last: {:?})", sidecar.readyz().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_reports_serving() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut health = sidecar.health_client().await;

    let resp = health.check(HealthCheckRequest { service: String::new() }).await.expect("health check").into_inner();

    assert_eq!(resp.status, ServingStatus::Serving as i32);
    for service in ["echomq.v1.ConsumerService", "echomq.v1.StreamService"] {
        let resp = health.check(HealthCheckRequest { service: service.into() }).await;
        eprintln!("health of {service}: {resp:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_calls_settle_then_exits_0_keeping_unacked_pending() {
    let redis = RedisServer::start().await;
    let grace = Duration::from_millis(5000);
    let mut sidecar = Sidecar::start(&redis, SidecarOptions::default().grace(5000)).await;
    let mut con = redis.conn().await;
    let health = sidecar.health_client().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let acked = sidecar.append("s", &[("k", b"acked")]).await;
    let kept = sidecar.append("s", &[("k", b"kept")]).await;
    let held = call.deliveries(2, EVENT_TIMEOUT).await;
    assert_eq!(ids(&held), vec![acked.id.clone(), kept.id.clone()]);

    sidecar.sigterm();
    let signalled = Instant::now();

    let not_ready = eventually(EVENT_TIMEOUT, || async { sidecar.readyz().await == Some(503) }).await;
    assert!(not_ready, "/readyz must answer 503 during the grace period (last: {:?})", sidecar.readyz().await);
    let body = http_get(sidecar.admin_port(), "/readyz").await.expect("GET /readyz").body;
    assert_eq!(body, "not ready: shutting down\n");
    let left_serving = eventually(Duration::from_secs(2), || {
        let mut health = health.clone();
        async move {
            let status =
                health.check(HealthCheckRequest { service: String::new() }).await.map(|r| r.into_inner().status);
            status.ok() != Some(ServingStatus::Serving as i32)
        }
    })
    .await;
    assert!(left_serving, "health must leave SERVING");
    // An ack sent during the grace period is applied.
    call.ack(&[&acked.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 1, EVENT_TIMEOUT).await, 1, "the grace-period ack reached Redis");
    // Nothing new is handed out while shutting down.
    let late = xadd_raw(&mut con, "s", &[(b"k", b"late")]).await;
    let end = match call.next_event(grace + Duration::from_secs(5)).await {
        Event::Ended(status) => status,
        Event::VerdictError(e) => panic!("the grace-period ack was refused: {e:?}"),
        other => panic!("expected no delivery after SIGTERM, only the end of the call; got {other:?}"),
    };
    let ended_after = signalled.elapsed();
    let end = end.expect("the call must end with UNAVAILABLE, not OK");
    assert_code(&end, Code::Unavailable);
    assert!(
        ended_after >= grace - Duration::from_millis(500),
        "the call ended {ended_after:?} after SIGTERM, grace is {grace:?}"
    );

    let exit =
        sidecar.wait_exit(grace + Duration::from_secs(5)).await.expect("the sidecar must exit after the grace period");
    assert!(exit.success(), "exit status {exit}");
    let pending: Vec<String> = pending_entries(&mut con, "s", "g").await.into_iter().map(|p| p.stream_id).collect();
    assert!(pending.contains(&kept.stream_id), "the un-acked entry stays pending: {pending:?}");
    assert!(!pending.contains(&acked.stream_id), "the grace-period ack stays applied: {pending:?}");
    eprintln!("late entry {late} pending after shutdown: {}", pending.contains(&late));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_the_grace_at_once_keeping_held_entries_pending() {
    let redis = RedisServer::start().await;
    let mut sidecar = Sidecar::start(&redis, SidecarOptions::default().grace(60_000)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let held = sidecar.append("s", &[("k", b"held")]).await;
    assert_eq!(call.next_delivery(EVENT_TIMEOUT).await.id, held.id);

    sidecar.sigterm();
    assert!(eventually(EVENT_TIMEOUT, || async { sidecar.readyz().await == Some(503) }).await, "draining");
    let second = Instant::now();
    sidecar.sigterm();
    let exit = sidecar.wait_exit(Duration::from_secs(15)).await.expect("the sidecar exits long before its 60 s grace");
    assert!(exit.success(), "exit status {exit}");
    assert!(second.elapsed() < Duration::from_secs(15), "took {:?}", second.elapsed());
    assert!(sidecar.log().contains("second signal: ending the grace period now"), "{}", sidecar.log());
    let pending: Vec<String> = pending_entries(&mut con, "s", "g").await.into_iter().map(|p| p.stream_id).collect();
    assert_eq!(pending, vec![held.stream_id], "the held entry stays pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_reading_new_entries() {
    let redis = RedisServer::start().await;
    let mut sidecar = Sidecar::start(&redis, SidecarOptions::default().grace(2000)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let held = sidecar.append("s", &[("k", b"held")]).await;
    assert_eq!(call.next_delivery(EVENT_TIMEOUT).await.id, held.id);

    sidecar.sigterm();
    assert!(eventually(EVENT_TIMEOUT, || async { sidecar.readyz().await == Some(503) }).await);
    wait_no_blocked_readers(&mut con).await;
    let late = xadd_raw(&mut con, "s", &[(b"k", b"late")]).await;

    let end = call.wait_end(Duration::from_secs(10)).await;
    assert_code(&end.expect("UNAVAILABLE"), Code::Unavailable);
    let exit = sidecar.wait_exit(Duration::from_secs(10)).await.expect("the sidecar must exit");
    assert!(exit.success(), "exit status {exit}");
    // "Reading stops": an entry appended after SIGTERM is left in the stream for
    // the next reader, not taken into this consumer's PEL (where only a reclaim
    // after min-idle, with an extra delivery counted, would free it).
    let pending: Vec<String> = pending_entries(&mut con, "s", "g").await.into_iter().map(|p| p.stream_id).collect();
    assert_eq!(pending, vec![held.stream_id.clone()], "entry {late} was read after SIGTERM");
    let last = last_delivered_id(&mut con, "s", "g").await;
    assert_eq!(last, held.stream_id, "the group's position must not move past what was handed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_calls_exits_0_promptly() {
    let redis = RedisServer::start().await;
    let mut sidecar = Sidecar::start(&redis, SidecarOptions::default().grace(10_000)).await;

    sidecar.sigterm();

    // With no call to wait for, there is nothing to drain.
    let exit =
        sidecar.wait_exit(Duration::from_secs(8)).await.expect("exit without calls should not wait the full grace");
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_name_comes_from_the_environment() {
    let redis = RedisServer::start().await;
    let mut options = SidecarOptions::default().env("ECHOMQ_CONSUMER_NAME", "from-env").env("POD_NAME", "from-pod");
    options.omit_consumer_name = true;
    let sidecar = Sidecar::start(&redis, options).await;

    let call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    assert_eq!(call.subscribed.as_ref().unwrap().consumer, "from-env");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_name_defaults_to_pod_name() {
    let redis = RedisServer::start().await;
    let mut options = SidecarOptions::default().env("POD_NAME", "pod-xyz-0");
    options.omit_consumer_name = true;
    let sidecar = Sidecar::start(&redis, options).await;

    let call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    assert_eq!(call.subscribed.as_ref().unwrap().consumer, "pod-xyz-0");
}

/// `--worker-threads` sets how many runtime workers the process runs (three
/// here, more than the two CPUs of this project's machines, so the default
/// would not pass), and a sidecar so started delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_sets_the_runtime_workers() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--worker-threads").arg("3")).await;
    let pid = sidecar.pid().expect("the sidecar runs");
    // Tokio names its workers `tokio-rt-worker` (blocking-pool threads `tokio-runtime-w`).
    let workers = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the sidecar's threads")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end() == "tokio-rt-worker")
        .count();
    assert_eq!(workers, 3, "{}", sidecar.log());
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    let appended = sidecar.append("s", &[("k", b"v")]).await;
    assert_eq!(call.next_delivery(EVENT_TIMEOUT).await.id, appended.id);
}

#[test]
fn help_exits_0_and_names_the_documented_env_vars() {
    let out = run_to_exit(&["--help"], Duration::from_secs(10));

    assert!(out.status.success(), "--help exit status {}", out.status);
    let help = String::from_utf8_lossy(&out.stdout);
    for var in ["ECHOMQ_REDIS_URL", "ECHOMQ_LISTEN", "ECHOMQ_ADMIN_LISTEN", "ECHOMQ_CONSUMER_NAME"] {
        assert!(help.contains(var), "--help must mention {var}:\n{help}");
    }
}

#[test]
fn help_names_an_env_var_for_every_flag() {
    let out = run_to_exit(&["--help"], Duration::from_secs(10));

    let help = String::from_utf8_lossy(&out.stdout);
    let flags = [
        "redis-url",
        "listen",
        "admin-listen",
        "consumer-name",
        "reclaim-min-idle-ms",
        "reclaim-interval-ms",
        "default-max-in-flight",
        "max-in-flight-limit",
        "retry-backoff-initial-ms",
        "retry-backoff-max-ms",
        "read-block-ms",
        "shutdown-grace-ms",
        "id-field",
        "redis-timeout-ms",
        "reader-connections",
        "shared-readers",
        "worker-threads",
        "wait-replicas",
        "wait-timeout-ms",
        "wait-aof",
        "dedup-window-ms",
        "log-format",
    ];
    let missing: Vec<String> = flags
        .iter()
        .flat_map(|flag| {
            let var = format!("ECHOMQ_{}", flag.to_uppercase().replace('-', "_"));
            let mut gaps = Vec::new();
            if !help.contains(&format!("--{flag}")) {
                gaps.push(format!("--{flag}"));
            }
            if !help.contains(&var) {
                gaps.push(var);
            }
            gaps
        })
        .collect();
    assert!(missing.is_empty(), "--help lacks {missing:?}:\n{help}");
}

#[test]
fn bad_listen_value_exits_nonzero_with_a_one_line_reason() {
    let out = run_to_exit(
        &["--listen", "nonsense", "--redis-url", "redis://127.0.0.1:1", "--admin-listen", "127.0.0.1:0"],
        Duration::from_secs(15),
    );

    assert!(!out.status.success(), "a bad --listen must fail, got {}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "a bad flag is a clean error, not a panic:\n{stderr}");
    assert!(
        stderr.lines().any(|l| l.contains("nonsense") && l.to_lowercase().contains("listen")),
        "one line must name the flag and the bad value:\n{stderr}"
    );
}

#[test]
fn bad_number_flag_exits_nonzero() {
    let out =
        run_to_exit(&["--reclaim-min-idle-ms", "soon", "--redis-url", "redis://127.0.0.1:1"], Duration::from_secs(15));

    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.lines().any(|l| l.contains("soon")), "the reason names the bad value:\n{stderr}");
}

/// `grpcurl` on PATH or at `.tmp/bin/grpcurl`.
fn find_grpcurl() -> Option<PathBuf> {
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tmp/bin/grpcurl");
    if local.is_file() {
        return Some(local);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join("grpcurl")).find(|p| p.is_file())
}

/// The string value of `"key": "value"` in grpcurl's JSON output.
fn json_string(json: &str, key: &str) -> Option<String> {
    let at = json.find(&format!("\"{key}\""))?;
    let rest = &json[at + key.len() + 2..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_lists_services_and_appends_with_json() {
    let Some(grpcurl) = find_grpcurl() else {
        eprintln!("SKIPPED: no grpcurl on PATH or at .tmp/bin/grpcurl");
        return;
    };
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let target = format!("127.0.0.1:{}", sidecar.grpc_port());

    let list = Command::new(&grpcurl).args(["-plaintext", &target, "list"]).output().expect("run grpcurl");
    let services = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "grpcurl list: {}", String::from_utf8_lossy(&list.stderr));
    for service in ["echomq.v1.ConsumerService", "echomq.v1.StreamService", "grpc.health.v1.Health"] {
        assert!(services.lines().any(|l| l.trim() == service), "reflection must list {service}:\n{services}");
    }

    let append = Command::new(&grpcurl)
        .args([
            "-plaintext",
            "-d",
            r#"{"stream":"s","fields":{"k":"dmFsdWU="}}"#,
            &target,
            "echomq.v1.StreamService/Append",
        ])
        .output()
        .expect("run grpcurl");
    let body = String::from_utf8_lossy(&append.stdout);
    assert!(append.status.success(), "grpcurl Append: {}", String::from_utf8_lossy(&append.stderr));
    let id = json_string(&body, "id").unwrap_or_else(|| panic!("no id in {body}"));
    let stream_id = json_string(&body, "streamId").unwrap_or_else(|| panic!("no streamId in {body}"));
    assert_eq!(id, branded_from_stream_id(&stream_id));
    let mut con = redis.conn().await;
    let entries = xrange(&mut con, "s").await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].field("k"), Some(&b"value"[..]), "base64 `dmFsdWU=` is the bytes `value`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_listen_serves_grpc() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions { unix_socket: true, ..SidecarOptions::default() }).await;
    let path = sidecar.unix_path().unwrap();

    let channel = unix_channel(path, None).await.expect("connect over the unix socket");
    let resp = echomq::proto::stream_service_client::StreamServiceClient::new(channel)
        .append(echomq::proto::AppendRequest {
            stream: "s".into(),
            fields: [("k".to_owned(), b"v".to_vec())].into_iter().collect(),
            ..Default::default()
        })
        .await
        .expect("append over the unix socket")
        .into_inner();

    let mut con = redis.conn().await;
    assert_eq!(xrange(&mut con, "s").await[0].stream_id, resp.stream_id);
}

/// A second sidecar must not steal a live sidecar's socket (unlinking it would
/// cut the first one's clients off while its /readyz still says 200); the
/// socket is group-writable for an app container of another user, and it is
/// gone after a clean exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_unix_socket_is_not_taken_over_and_is_removed_on_exit() {
    use std::os::unix::fs::PermissionsExt;
    let redis = RedisServer::start().await;
    let mut first = Sidecar::start(&redis, SidecarOptions { unix_socket: true, ..SidecarOptions::default() }).await;
    let path = first.unix_path().unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "group read/write, nothing for others");

    let args = [
        "--redis-url".to_owned(),
        redis.url(),
        "--listen".to_owned(),
        format!("unix:{}", path.display()),
        "--admin-listen".to_owned(),
        format!("127.0.0.1:{}", free_port()),
    ];
    let second = run_to_exit(&args, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second sidecar on a live socket must not start: {stderr}");
    assert!(stderr.contains("listening on this socket"), "{stderr}");
    assert!(tokio::net::UnixStream::connect(&path).await.is_ok(), "the first sidecar still serves its socket");

    first.sigterm();
    assert!(first.wait_exit(Duration::from_secs(20)).await.is_some_and(|s| s.success()));
    assert!(!path.exists(), "a clean exit removes the socket file");
}

/// gRPC health follows Redis like /readyz does: NOT_SERVING while Redis is
/// down, SERVING again once it answers; every failed command is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_command_errors_follow_a_redis_outage() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut health = sidecar.health_client().await;
    let status = |health: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>| {
        let mut health = health.clone();
        async move {
            health
                .check(HealthCheckRequest { service: "echomq.v1.StreamService".into() })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    };
    assert_eq!(status(&mut health).await, ServingStatus::Serving as i32);

    redis.kill9();
    let down = eventually(Duration::from_secs(10), || {
        let mut health = health.clone();
        async move { status(&mut health).await == ServingStatus::NotServing as i32 }
    })
    .await;
    assert!(down, "health must say NOT_SERVING while Redis is down");
    let append = echomq::proto::AppendRequest { stream: "s".into(), ..Default::default() };
    let failed = sidecar.stream_client().await.append(append).await;
    assert_code(&failed.expect_err("Redis is down"), Code::Unavailable);
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("/metrics").body;
    assert!(
        metrics.lines().any(|l| l.starts_with("echomq_redis_command_errors_total{command=\"script:append\"}")),
        "the failed append is counted:\n{metrics}"
    );

    redis.restart().await;
    let up = eventually(Duration::from_secs(15), || {
        let mut health = health.clone();
        async move { status(&mut health).await == ServingStatus::Serving as i32 }
    })
    .await;
    assert!(up, "health must say SERVING again once Redis answers");
}

/// A seed list names cluster nodes; nodes without cluster mode are a setting
/// to fix, not an outage to wait out: exit 2 with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_list_of_non_cluster_nodes_exits_2_with_the_reason() {
    let redis = RedisServer::start().await;
    let args = local_args(&format!("{},{}", redis.url(), redis.url()));
    let out = run_to_exit(&args, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cluster support disabled"), "{stderr}");
}

/// The shard count of a sharded stream is recorded in Redis by the first
/// sidecar; one configured with another count refuses to start (its entries
/// would sit unread in shards the others do not know).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_another_shard_count_for_a_stream_refuses_to_start() {
    let redis = RedisServer::start().await;
    let _first = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("orders=4")).await;
    let _same = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("orders=4")).await;
    let mut con = redis.conn().await;
    let recorded: String = redis::cmd("GET").arg("orders:shards").query_async(&mut con).await.unwrap();
    assert_eq!(recorded, "4");

    let mut args = local_args(&redis.url());
    args.extend(["--sharded-streams".to_owned(), "orders=2".to_owned()]);
    let out = run_to_exit(&args, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("recorded in Redis with 4 shards") && stderr.contains("orders:shards"), "{stderr}");
}

/// A sidecar started without a stream that another sidecar shards refuses to
/// append to it or subscribe to it (its entries would land in, and its readers
/// wait on, a plain key no shard consumer or producer uses), and refuses to
/// append to its shard keys (the ids would leave their shard's stride).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_not_configured_for_a_sharded_stream_refuses_to_touch_it() {
    let redis = RedisServer::start().await;
    let sharding = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("orders=2")).await;
    let plain = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    async fn append(sidecar: &Sidecar, stream: &str) -> Result<tonic::Response<AppendResponse>, tonic::Status> {
        let request = AppendRequest {
            stream: stream.to_owned(),
            partition_key: "customer-7".to_owned(),
            fields: fields(&[("k", b"v")]),
            ..Default::default()
        };
        sidecar.stream_client().await.append(request).await
    }

    let refused = append(&plain, "orders").await.expect_err("orders is sharded elsewhere");
    assert_code(&refused, Code::FailedPrecondition);
    assert!(refused.message().contains("--sharded-streams orders=2"), "{}", refused.message());
    let refused = append(&plain, "orders:{orders:1}").await.expect_err("a shard key of a stream not configured here");
    assert_code(&refused, Code::InvalidArgument);
    let refused = Consumer::try_subscribe(&plain, subscribe_msg("orders", "g", GroupStart::Beginning))
        .await
        .err()
        .expect("subscribing to orders here would wait on a key nobody writes");
    assert_code(&refused, Code::FailedPrecondition);
    let refused = Consumer::try_subscribe(&plain, subscribe_msg("orders:{orders:1}", "g", GroupStart::Beginning))
        .await
        .err()
        .expect("a shard key of a stream not configured here");
    assert_code(&refused, Code::InvalidArgument);
    let exists: i64 = redis::cmd("EXISTS").arg("orders").arg("orders:{orders:1}").query_async(&mut con).await.unwrap();
    assert_eq!(exists, 0, "nothing was written or created");

    // Redis forgot the count (a restart without persistence): the sharding sidecar records it again.
    let _: () = redis::cmd("DEL").arg("orders:shards").query_async(&mut con).await.unwrap();
    let recorded = eventually(Duration::from_secs(20), || {
        let mut con = con.clone();
        async move {
            redis::cmd("GET")
                .arg("orders:shards")
                .query_async::<Option<String>>(&mut con)
                .await
                .ok()
                .flatten()
                .as_deref()
                == Some("2")
        }
    })
    .await;
    assert!(recorded, "the shard count must be recorded again");
    assert_code(&append(&plain, "orders").await.expect_err("refused again"), Code::FailedPrecondition);

    // Only a recorded count blocks a name: keys of other types or values named like it do not.
    let _: () = redis::cmd("XADD").arg("foo:shards").arg("*").arg("a").arg("b").query_async(&mut con).await.unwrap();
    let _: () = redis::cmd("SET").arg("bar:shards").arg("0").query_async(&mut con).await.unwrap();
    append(&plain, "user:{user:123}").await.expect("shaped like a shard key, but nothing shards `user`");
    append(&plain, "foo").await.expect("foo:shards is a stream, not a count");
    append(&plain, "bar").await.expect("bar:shards holds no count");
    Consumer::try_subscribe(&plain, subscribe_msg("bar", "g", GroupStart::Beginning)).await.expect("bar is plain");
    Consumer::try_subscribe(&plain, subscribe_msg("foo", "g", GroupStart::Beginning)).await.expect("foo is plain");

    // Calls on one stream key name the logical stream's shards instead of answering for an empty key.
    let read = plain.stream_client().await.read(ReadRequest { stream: "orders".into(), ..Default::default() }).await;
    let refused = read.expect_err("orders is sharded: Read must name a shard");
    assert_code(&refused, Code::InvalidArgument);
    assert!(refused.message().contains("orders:{orders:0}"), "{}", refused.message());
    let describe = DescribeGroupRequest { stream: "orders".into(), group: "g".into() };
    assert_code(
        &plain.admin_client().await.describe_group(describe).await.expect_err("sharded"),
        Code::InvalidArgument,
    );

    // The sidecar that shards it is unaffected, and plain streams still work on both.
    let written = append(&sharding, "orders").await.expect("the sharding sidecar appends").into_inner();
    assert!(written.stream.starts_with("orders:{orders:"), "{}", written.stream);
    append(&sharding, "orders:{orders:3}").await.expect_err("orders has shards 0 and 1");
    append(&plain, "invoices").await.expect("a plain stream");
}

/// Before Redis answers, the port speaks gRPC at once: health says
/// NOT_SERVING, reflection lists the services, and an EchoMQ call is answered
/// UNAVAILABLE saying Redis is not reached yet. Once Redis is up, all serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_redis_answers_health_and_reflection_serve_and_calls_are_unavailable() {
    let mut redis = RedisServer::start().await;
    redis.kill9();
    let sidecar = Sidecar::launch(&redis, SidecarOptions::default()).await;
    let mut health = sidecar.health_client().await;

    let started = Instant::now();
    let status =
        health.check(HealthCheckRequest { service: String::new() }).await.expect("health answers").into_inner();
    assert_eq!(status.status, ServingStatus::NotServing as i32);
    assert!(started.elapsed() < Duration::from_secs(5), "health took {:?}", started.elapsed());
    let services = list_services(&sidecar).await;
    assert!(services.iter().any(|s| s == "echomq.v1.StreamService"), "reflection: {services:?}");
    let refused = sidecar
        .stream_client()
        .await
        .append(AppendRequest {
            stream: "s".into(),
            fields: [("k".into(), b"v".to_vec())].into(),
            ..Default::default()
        })
        .await
        .expect_err("no Redis yet");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("not reached Redis yet"), "{refused:?}");
    assert_eq!(sidecar.readyz().await, Some(503));

    redis.restart().await;
    let serving = eventually(Duration::from_secs(20), || {
        let mut health = health.clone();
        async move {
            health.check(HealthCheckRequest { service: String::new() }).await.map(|r| r.into_inner().status).ok()
                == Some(ServingStatus::Serving as i32)
        }
    })
    .await;
    assert!(serving, "health never turned SERVING once Redis was up");
    let appended = sidecar.append("s", &[("k", b"v")]).await;
    assert_eq!(appended.id.len(), 28);
}

/// At start the sidecar asks the server its version (`INFO server`): below
/// Redis 6.2 (no XAUTOCLAIM, no XGROUP CREATECONSUMER, no exclusive ranges)
/// it exits 2 naming the version found and the one it needs; at 6.2 or newer
/// it starts and logs what it found. Which branch runs depends on the
/// `redis-server` on PATH: `scripts/test-servers` runs this test once more on
/// Redis 5.0.6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_refuses_a_server_older_than_redis_6_2() {
    let redis = RedisServer::start().await;
    let server = redis.info().await;
    if server.redis < (6, 2, 0) {
        let out = run_to_exit(&local_args(&redis.url()), Duration::from_secs(15));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let (major, minor, patch) = server.redis;
        let found = format!("Redis {major}.{minor}.{patch}");
        assert!(stderr.contains(&found) && stderr.contains("Redis 6.2.0"), "{stderr}");
    } else {
        let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
        let (major, minor, patch) = server.valkey.unwrap_or(server.redis);
        let found = format!("{major}.{minor}.{patch}");
        let logged = eventually(EVENT_TIMEOUT, || async {
            let log = sidecar.log();
            log.contains("new enough") && log.contains(&found)
        })
        .await;
        assert!(logged, "the sidecar logs the server's version ({found}); its log:\n{}", sidecar.log());
    }
}
