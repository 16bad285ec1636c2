//! Crash recovery with real processes: a SIGKILLed sidecar, a dead peer, a slow
//! client, a destroyed group, a flushed or restarted Redis, a read whose reply
//! is lost.
//!
//! The lost-read tests put the sidecar's Redis connections through toxiproxy
//! (`support::toxiproxy`): they need `toxiproxy-server` on PATH, as
//! `scripts/test` puts it (or `ECHOMQ_TOXIPROXY`), and fail without it.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::{AppendRequest, Drain, GroupStart, Release, VerdictErrorCode};
use support::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_then_restart_redelivers_own_pending_with_attempts_2() {
    let redis = RedisServer::start().await;
    let mut sidecar = Sidecar::start(&redis, SidecarOptions::named("pod-a")).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 3).await;
    let mut appended = Vec::new();
    for i in 0..10 {
        appended.push(sidecar.append("s", &[("n", i.to_string().as_bytes())]).await.id);
    }
    let held = call.deliveries(3, EVENT_TIMEOUT).await;

    sidecar.kill9();

    // kill -9 settles nothing: the entries stay pending on the sidecar's consumer.
    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending.len(), 3, "{pending:?}");
    assert!(pending.iter().all(|p| p.consumer == "pod-a" && p.deliveries == 1), "{pending:?}");
    assert!(matches!(call.next_event(EVENT_TIMEOUT).await, Event::Ended(Some(_))), "the call breaks with the process");

    sidecar.restart().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let got = call.deliveries(10, EVENT_TIMEOUT).await;

    let (recovered, fresh) = got.split_at(3);
    assert_eq!(ids(recovered), ids(&held), "own pending entries are re-delivered first");
    assert!(recovered.iter().all(|d| d.attempts == 2), "second hand-over: {recovered:?}");
    assert!(fresh.iter().all(|d| d.attempts == 1), "{fresh:?}");
    assert_eq!(ids(&got), appended, "nothing lost, nothing duplicated, in order");
    call.ack(&appended.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    call.assert_quiet(Duration::from_millis(1500), "everything acked, nothing comes back").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_reclaims_dead_sidecars_entries_after_min_idle() {
    let redis = RedisServer::start().await;
    let mut dead = Sidecar::start(&redis, SidecarOptions::named("dead").reclaim(1000, 200)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&dead, "s", "g", GroupStart::New, 0).await;
    let a = dead.append("s", &[("k", b"a")]).await;
    let b = dead.append("s", &[("k", b"b")]).await;
    call.deliveries(2, EVENT_TIMEOUT).await;
    let delivered_at = Instant::now();
    dead.kill9();

    let peer = Sidecar::start(&redis, SidecarOptions::named("peer").reclaim(1000, 200)).await;
    let mut peer_call = Consumer::start(&peer, "s", "g", GroupStart::New, 0).await;
    let got = peer_call.deliveries(2, Duration::from_secs(15)).await;

    let waited = delivered_at.elapsed();
    assert!(waited >= Duration::from_millis(900), "reclaimed {waited:?} after delivery, before min-idle 1000 ms");
    assert_eq!(ids(&got).into_iter().collect::<BTreeSet<_>>(), [a.id, b.id].into_iter().collect());
    assert!(got.iter().all(|d| d.attempts == 2), "a reclaim is a second hand-over: {got:?}");
    let pending = pending_entries(&mut con, "s", "g").await;
    assert!(pending.iter().all(|p| p.consumer == "peer"), "the peer owns them now: {pending:?}");
    peer_call.ack(&ids(&got).iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// A transient Fail binds the group, not only its sidecar: the sidecar dies
/// before the retry delay passes, a peer reclaims the entry and delivers it
/// after the delay with the count it had; a later ended call counts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reclaims_a_transient_failure_delivers_it_with_the_count_it_had() {
    let redis = RedisServer::start().await;
    let mut dead = Sidecar::start(&redis, SidecarOptions::named("dead").reclaim(1000, 200)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&dead, "s", "g", GroupStart::New, 0).await;
    let e = dead.append("s", &[("k", b"e")]).await;
    let first = call.next_delivery(EVENT_TIMEOUT).await;
    call.send(req(Kind::Fail(echomq::proto::Fail {
        id: first.id.clone(),
        reason: "the database is down".to_owned(),
        retry_after: Some(duration_ms(2000)),
        kind: echomq::proto::FailKind::Transient as i32,
        ..Default::default()
    })))
    .await;
    let recorded = eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move { redis::cmd("HLEN").arg("s:retries:g").query_async::<u64>(&mut con).await.unwrap() == 1 }
    })
    .await;
    assert!(recorded, "the retry state is written before the sidecar dies");
    dead.kill9();

    let peer = Sidecar::start(&redis, SidecarOptions::named("peer").reclaim(1000, 200)).await;
    let mut peer_call = Consumer::start(&peer, "s", "g", GroupStart::New, 0).await;
    let again = peer_call.next_delivery(Duration::from_secs(15)).await;
    assert_eq!((again.id.as_str(), again.attempts), (e.id.as_str(), 1), "the transient failure cost no attempt");
    drop(peer_call);
    let mut next_call = Consumer::start(&peer, "s", "g", GroupStart::New, 0).await;
    let after_an_ended_call = next_call.next_delivery(Duration::from_secs(15)).await;
    assert_eq!(after_an_ended_call.attempts, 2, "a call that ended holding it counts, as always");
    next_call.ack_one(&after_an_ended_call.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

/// The rolling restart the Release is for: a client drains and gives back
/// what it never started. A peer sidecar gets those entries on its next
/// reclaim beat, far sooner than `--reclaim-min-idle-ms` (30 s here), each
/// with the `attempts` it had (2 for one that failed once); this sidecar's
/// other call, once it has room, gets none of them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_calls_released_deliveries_reach_a_peer_well_before_min_idle_with_attempts_unchanged() {
    let redis = RedisServer::start().await;
    let pod_a = Sidecar::start(&redis, SidecarOptions::named("pod-a").reclaim(30_000, 100)).await;
    let pod_b = Sidecar::start(&redis, SidecarOptions::named("pod-b").reclaim(30_000, 100)).await;
    let mut con = redis.conn().await;

    // pod-a's other call, full with e0 for now.
    let mut other = Consumer::start(&pod_a, "s", "g", GroupStart::New, 1).await;
    let e0 = pod_a.append("s", &[("k", b"0")]).await;
    assert_eq!(other.next_delivery(EVENT_TIMEOUT).await.id, e0.id);

    let mut stopping = Consumer::start(&pod_a, "s", "g", GroupStart::New, 3).await;
    let mut appended = Vec::new();
    for i in 1..=3 {
        appended.push(pod_a.append("s", &[("k", i.to_string().as_bytes())]).await.id);
    }
    let got = stopping.deliveries(3, EVENT_TIMEOUT).await;
    assert_eq!(ids(&got), appended);
    stopping.fail(&appended[0], Some(Duration::ZERO)).await;
    let again = stopping.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!((again.id.as_str(), again.attempts), (appended[0].as_str(), 2));

    let mut peer = Consumer::start(&pod_b, "s", "g", GroupStart::New, 10).await;
    stopping.send(req(Kind::Drain(Drain {}))).await;
    let released_at = Instant::now();
    stopping.send(req(Kind::Release(Release { ids: appended.clone() }))).await;

    let taken = peer.deliveries(3, Duration::from_secs(10)).await;
    let waited = released_at.elapsed();
    assert!(waited < Duration::from_secs(5), "the peer got them {waited:?} after the release, min-idle is 30 s");
    let mut attempts: Vec<(String, u32)> = taken.iter().map(|d| (d.id.clone(), d.attempts)).collect();
    attempts.sort();
    let expected = vec![(appended[0].clone(), 2), (appended[1].clone(), 1), (appended[2].clone(), 1)];
    assert_eq!(attempts, expected, "each released entry comes with the attempts it had");
    assert_eq!(pod_a.counter("echomq_releases_total").await, 3.0);
    let pending = pending_entries(&mut con, "s", "g").await;
    let owners: BTreeSet<(String, String)> =
        pending.iter().map(|p| (p.stream_id.clone(), p.consumer.clone())).collect();
    assert_eq!(owners.iter().filter(|(_, c)| c == "pod-b").count(), 3, "{pending:?}");

    // pod-a's other call has room now: the released entries are the peer's, never doubled here.
    other.ack_one(&e0.id).await;
    other.assert_quiet(Duration::from_millis(1500), "a released entry a peer took is not delivered here too").await;
    stopping.assert_quiet(Duration::from_millis(100), "drained").await;
    peer.ack(&appended.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_keeps_its_entry_from_peer_reclaim() {
    let redis = RedisServer::start().await;
    let slow_side = Sidecar::start(&redis, SidecarOptions::named("slow").reclaim(3000, 200)).await;
    let mut dead = Sidecar::start(&redis, SidecarOptions::named("dead").reclaim(3000, 200)).await;
    let mut con = redis.conn().await;
    // max_in_flight 1: once it holds `e`, the slow side reads nothing more.
    let mut slow = Consumer::start(&slow_side, "s", "g", GroupStart::New, 1).await;
    let e = slow_side.append("s", &[("k", b"slow")]).await;
    let held = slow.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(held.id, e.id);
    // A control entry, left behind by a dead sidecar: proves the peer's reclaim beat runs.
    let mut doomed = Consumer::start(&dead, "s", "g", GroupStart::New, 1).await;
    let control = dead.append("s", &[("k", b"control")]).await;
    assert_eq!(doomed.next_delivery(EVENT_TIMEOUT).await.id, control.id);
    dead.kill9();
    let peer = Sidecar::start(&redis, SidecarOptions::named("peer").reclaim(3000, 200)).await;
    let mut other = Consumer::start(&peer, "s", "g", GroupStart::New, 0).await;

    // Hold `e` for over twice min-idle while the peer's reclaim beat runs every
    // 200 ms. (The min-idle leaves room for a stall of the slow side, which
    // refreshes every third of it, on a loaded machine.)
    let held_until = Instant::now() + Duration::from_millis(7000);
    let mut reclaimed = Vec::new();
    while Instant::now() < held_until {
        match other.next_event(held_until.saturating_duration_since(Instant::now())).await {
            Event::Delivery(d) => reclaimed.push(d),
            Event::Timeout => break,
            other => panic!("peer call: {other:?}"),
        }
    }

    assert!(reclaimed.iter().all(|d| d.id != e.id), "a live holder's entry was reclaimed: {reclaimed:?}");
    assert_eq!(ids(&reclaimed), vec![control.id.clone()], "the peer reclaims the dead sidecar's entry (control)");
    let slow_pending: Vec<PendingEntry> =
        pending_entries(&mut con, "s", "g").await.into_iter().filter(|p| p.stream_id == e.stream_id).collect();
    assert_eq!(slow_pending.len(), 1);
    assert_eq!(slow_pending[0].consumer, "slow", "{slow_pending:?}");
    assert_eq!(slow_pending[0].deliveries, 1, "keeping the idle time fresh is not a delivery: {slow_pending:?}");
    assert!(slow_pending[0].idle_ms < 3000, "idle time must be kept fresh: {slow_pending:?}");
    slow.ack(&[&held.id]).await;
    other.ack(&[&control.id]).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    slow.assert_quiet(Duration::from_millis(1000), "the late ack succeeds without a verdict error").await;
}

/// Receives until `id` arrives, acking whatever comes; panics if the call ends.
async fn ack_until(call: &mut Consumer, id: &str, timeout: Duration) -> echomq::proto::Delivery {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match call.next_event(left).await {
            Event::Delivery(d) => {
                call.ack(&[&d.id]).await;
                if d.id == id {
                    return d;
                }
            }
            Event::VerdictError(e) => eprintln!("verdict error while waiting (tolerated): {e:?}"),
            other => panic!("waiting for {id}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroyed_group_is_recreated_under_a_live_subscription() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    ack_until(&mut call, &first.id, EVENT_TIMEOUT).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);

    let destroyed: i64 = redis::cmd("XGROUP").arg("DESTROY").arg("s").arg("g").query_async(&mut con).await.unwrap();
    assert_eq!(destroyed, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = sidecar.append("s", &[("k", b"after")]).await;

    // The group comes back from `0`, so `first` may be delivered again (at-least-once).
    let d = ack_until(&mut call, &after.id, Duration::from_secs(20)).await;
    assert_eq!(d.payload.get("k").map(|v| &v[..]), Some(&b"after"[..]));
    assert!(groups(&mut con, "s").await.contains_key("g"), "the sidecar re-created the group");
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "acks apply to the new group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_under_a_live_subscription_recovers() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    ack_until(&mut call, &first.id, EVENT_TIMEOUT).await;

    let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = sidecar.append("s", &[("k", b"after")]).await;

    ack_until(&mut call, &after.id, Duration::from_secs(20)).await;
    assert!(groups(&mut con, "s").await.contains_key("g"));
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_during_subscription_then_new_entries_are_delivered() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    ack_until(&mut call, &first.id, EVENT_TIMEOUT).await;
    let mut con = redis.conn().await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);

    redis.kill9();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    redis.restart().await; // empty: nothing was persisted

    // Append through the sidecar once its connections are back.
    let mut client = sidecar.stream_client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let request = AppendRequest {
            stream: "s".into(),
            fields: [("k".to_owned(), b"after".to_vec())].into_iter().collect(),
            ..Default::default()
        };
        match client.append(request).await {
            Ok(resp) => break resp.into_inner(),
            Err(status) if Instant::now() < deadline => {
                assert_code(&status, Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("append never recovered after the Redis restart: {status:?}"),
        }
    };

    // The call may survive (the sidecar re-creates the group) or end with UNAVAILABLE.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut observed = "the call survived the restart";
    loop {
        match call.next_event(deadline.saturating_duration_since(Instant::now())).await {
            Event::Delivery(d) => {
                call.ack(&[&d.id]).await;
                if d.id == after.id {
                    break;
                }
            }
            Event::VerdictError(e) => eprintln!("verdict error (tolerated): {e:?}"),
            Event::Ended(status) => {
                let status = status.expect("the call ended with OK although the client did not close it");
                assert_code(&status, Code::Unavailable);
                observed = "the call ended with UNAVAILABLE; a new subscription got the entry";
                call = loop {
                    match Consumer::try_subscribe(&sidecar, subscribe_msg("s", "g", GroupStart::Beginning)).await {
                        Ok(c) => break c,
                        Err(s) if Instant::now() < deadline => {
                            assert_code(&s, Code::Unavailable);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(s) => panic!("could not resubscribe: {s:?}"),
                    }
                };
            }
            other => panic!("waiting for {} after the Redis restart: {other:?}", after.id),
        }
    }
    eprintln!("observed: {observed}");
    assert_eq!(sidecar.readyz().await, Some(200));
}

/// After an outage long enough for every step's backoff to reach 5 s, the
/// sidecar delivers again as soon as it is ready, not when each worker's
/// backoff runs out: the readiness check's recovery ends the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_resume_as_soon_as_redis_is_ready_again_not_after_the_backoff() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    ack_until(&mut call, &first.id, EVENT_TIMEOUT).await;

    redis.kill9();
    // 100 ms doubling to 5 s: by now every failing step waits 5 s between tries.
    tokio::time::sleep(Duration::from_secs(12)).await;
    redis.restart().await; // empty: the group is re-created
    let ready = eventually(Duration::from_secs(10), || async { sidecar.readyz().await == Some(200) }).await;
    assert!(ready, "never ready again:\n{}", sidecar.log());
    let ready_at = Instant::now();
    let mut con = redis.conn().await;
    let id: String = redis::cmd("XADD").arg("s").arg("*").arg("k").arg("after").query_async(&mut con).await.unwrap();
    loop {
        match call.next_event(Duration::from_secs(10)).await {
            Event::Delivery(d) if d.stream_id == id => break,
            Event::Delivery(d) => call.ack(&[&d.id]).await,
            // An ack that met the outage is answered UNAVAILABLE: tolerated.
            Event::VerdictError(e) => assert_eq!(e.code, VerdictErrorCode::Unavailable as i32, "{e:?}"),
            other => panic!("waiting for {id} after the outage: {other:?}\n{}", sidecar.log()),
        }
    }
    let waited = ready_at.elapsed();
    assert!(waited < Duration::from_secs(3), "delivered {waited:?} after ready: the backoff was waited out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_while_an_entry_is_held_recovers_promptly_with_short_leases() {
    // Lease refreshes every ~0.7 s fail with NOGROUP after the restart; they must
    // not keep postponing the group's re-creation.
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100).reclaim(2000, 500)).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    assert_eq!(call.next_delivery(EVENT_TIMEOUT).await.id, first.id, "held, never acked");

    redis.kill9();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    redis.restart().await; // empty: the group is gone
    tokio::time::sleep(Duration::from_millis(6000)).await;

    let mut con = redis.conn().await;
    let after = xadd_raw(&mut con, "s", &[(b"k", b"after")]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call.next_event(deadline.saturating_duration_since(Instant::now())).await {
            Event::Delivery(d) if d.stream_id == after => break,
            Event::Delivery(_) | Event::VerdictError(_) => {}
            other => panic!("the entry appended after the restart did not arrive on the live call: {other:?}"),
        }
    }
}

/// Moves `stream_id` to consumer `thief` (as a peer's reclaim would), idle 0.
async fn steal(con: &mut redis::aio::MultiplexedConnection, stream_id: &str) {
    let _: redis::Value = redis::cmd("XCLAIM")
        .arg("s")
        .arg("g")
        .arg("thief")
        .arg(0)
        .arg(stream_id)
        .arg("JUSTID")
        .query_async(con)
        .await
        .unwrap();
}

/// A sidecar with `--reclaim-min-idle-ms` and `--reclaim-interval-ms` set,
/// and a call on `s`/`g` holding the one entry appended.
async fn one_held(
    min_idle_ms: u64,
    interval_ms: u64,
) -> (RedisServer, Sidecar, redis::aio::MultiplexedConnection, Consumer, echomq::proto::AppendResponse) {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().reclaim(min_idle_ms, interval_ms)).await;
    let con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let entry = sidecar.append("s", &[("k", b"e")]).await;
    call.next_delivery(EVENT_TIMEOUT).await;
    (redis, sidecar, con, call, entry)
}

/// A peer takes two held entries: the lease refresh notices, the call is told
/// LEASE_LOST, and its later Ack and Fail are answered NOT_PENDING and not
/// applied: the peer keeps both, with no retry state written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_told_and_the_calls_verdicts_are_not_applied() {
    let redis = RedisServer::start().await;
    // Refreshes every 200 ms; the reclaim beat runs once, at the start.
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().reclaim(600, 600_000)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let (e, f) = (sidecar.append("s", &[("k", b"e")]).await, sidecar.append("s", &[("k", b"f")]).await);
    call.deliveries(2, EVENT_TIMEOUT).await;
    steal(&mut con, &e.stream_id).await;
    steal(&mut con, &f.stream_id).await;

    let mut told = BTreeSet::new();
    for _ in 0..2 {
        let error = call.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!(error.code, VerdictErrorCode::LeaseLost as i32, "{error:?}");
        told.insert(error.id);
    }
    assert_eq!(told, BTreeSet::from([e.id.clone(), f.id.clone()]));
    call.ack_one(&e.id).await;
    call.fail(&f.id, Some(Duration::from_secs(60))).await;
    for _ in 0..2 {
        let error = call.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!(error.code, VerdictErrorCode::NotPending as i32, "{error:?}");
        assert!(error.message.contains("lost to a peer"), "{error:?}");
    }

    let pending = pending_entries(&mut con, "s", "g").await;
    assert_eq!(pending.iter().filter(|p| p.consumer == "thief").count(), 2, "the peer keeps both: {pending:?}");
    assert!(!exists(&mut con, "s:retries:g").await, "no retry state for the peer's entry");
    assert_eq!(sidecar.counter("echomq_acks_total").await, 0.0);
    assert_eq!(sidecar.counter("echomq_leases_lost_total").await, 2.0);
}

/// Once its lease is lost, an entry that comes back to this sidecar (its
/// reclaim beat takes it from the peer, which stopped) is delivered to the
/// same call again, even though the call never answered the lost one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_lease_was_lost_comes_back_to_the_same_call() {
    let (_redis, sidecar, mut con, mut call, e) = one_held(600, 200).await;
    steal(&mut con, &e.stream_id).await;

    let error = call.next_verdict_error(EVENT_TIMEOUT).await;
    assert_eq!((error.id.as_str(), error.code), (e.id.as_str(), VerdictErrorCode::LeaseLost as i32), "{error:?}");
    let again = call.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(again.id, e.id);
    assert!(again.attempts >= 2, "{again:?}");
    call.ack_one(&again.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "the re-delivery's ack applies");
    assert_eq!(sidecar.counter("echomq_leases_lost_total").await, 1.0);
}

/// Another client acknowledges a held entry (XACK by hand): no peer holds it,
/// so the call is not told of a lost lease; its Ack is answered NOT_PENDING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_acknowledged_elsewhere_is_not_a_lost_lease() {
    let (_redis, sidecar, mut con, mut call, e) = one_held(300, 600_000).await;
    let _: i64 = redis::cmd("XACK").arg("s").arg("g").arg(&e.stream_id).query_async(&mut con).await.unwrap();

    call.assert_quiet(Duration::from_millis(600), "several refreshes: no LEASE_LOST").await;
    call.ack_one(&e.id).await;
    let error = call.next_verdict_error(EVENT_TIMEOUT).await;

    assert_eq!(error.code, VerdictErrorCode::NotPending as i32, "{error:?}");
    assert!(error.message.contains("another client acknowledged it"), "{error:?}");
    assert_eq!(sidecar.counter("echomq_leases_lost_total").await, 0.0);
}

/// The group's consumer names (`XINFO CONSUMERS`).
async fn consumer_names(con: &mut redis::aio::MultiplexedConnection, stream: &str, group: &str) -> BTreeSet<String> {
    let reply: redis::Value =
        redis::cmd("XINFO").arg("CONSUMERS").arg(stream).arg(group).query_async(con).await.expect("XINFO CONSUMERS");
    let redis::Value::Array(consumers) = reply else { panic!("XINFO CONSUMERS: {reply:?}") };
    consumers
        .iter()
        .map(|consumer| {
            let fields: Vec<redis::Value> = match consumer {
                redis::Value::Array(fields) => fields.clone(),
                redis::Value::Map(kv) => kv.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect(),
                other => panic!("consumer: {other:?}"),
            };
            let at = fields.iter().position(|f| matches!(f, redis::Value::BulkString(b) if b == b"name")).unwrap();
            match &fields[at + 1] {
                redis::Value::BulkString(name) => String::from_utf8(name.clone()).unwrap(),
                other => panic!("name: {other:?}"),
            }
        })
        .collect()
}

/// A live sidecar on a quiet stream, blocked in XREADGROUP, looks idle to
/// XINFO on Redis 7.0 (an empty read does not refresh idle): its peers'
/// consumer hygiene must keep it because it beats, and remove it only once
/// it is dead (SIGKILL) and holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hygiene_keeps_a_live_quiet_sidecar_and_removes_it_once_dead() {
    let redis = RedisServer::start().await;
    let limit = ["--consumer-idle-limit-ms", "1500"];
    let mut quiet = Sidecar::start(&redis, SidecarOptions::named("quiet").arg(limit[0]).arg(limit[1])).await;
    let cleaner = Sidecar::start(&redis, SidecarOptions::named("cleaner").arg(limit[0]).arg(limit[1])).await;
    let mut con = redis.conn().await;
    let _quiet_call = Consumer::start(&quiet, "s", "g", GroupStart::New, 0).await;
    let _cleaner_call = Consumer::start(&cleaner, "s", "g", GroupStart::New, 0).await;
    assert!(consumer_names(&mut con, "s", "g").await.contains("quiet"));

    // Over three limits of quiet, each sidecar's hygiene beating every 375 ms.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let names = consumer_names(&mut con, "s", "g").await;
    assert!(names.contains("quiet") && names.contains("cleaner"), "a live sidecar was removed: {names:?}");

    quiet.kill9();
    let deadline = Instant::now() + Duration::from_secs(15);
    while consumer_names(&mut con, "s", "g").await.contains("quiet") {
        assert!(Instant::now() < deadline, "the dead sidecar's consumer was never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(consumer_names(&mut con, "s", "g").await.contains("cleaner"));
    let beats: Vec<String> = redis::cmd("HKEYS").arg("s:heartbeats:g").query_async(&mut con).await.unwrap();
    assert_eq!(beats, vec!["cleaner".to_owned()], "the dead consumer's heartbeat goes with it");
}

/// At the default idle limit (an hour) only every 45th hygiene beat lists
/// the group's consumers (XINFO CONSUMERS and an HGET each, which every
/// sidecar of a group of a thousand consumers ran every 10 s); the beats in
/// between record the heartbeat alone. The first beat is thorough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_hygiene_beats_record_the_heartbeat_without_listing_consumers() {
    let redis = RedisServer::start().await;
    // No gauge polls: they would list consumers too.
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--metrics-poll-interval-ms").arg("0")).await;
    let mut con = redis.conn().await;
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let beat = || async {
        let mut con = redis.conn().await;
        let at: Option<u64> =
            redis::cmd("HGET").arg("s:heartbeats:g").arg(sidecar.consumer_name()).query_async(&mut con).await.unwrap();
        at
    };
    assert!(eventually(EVENT_TIMEOUT, || async { beat().await.is_some() }).await, "the first beat");
    let first = beat().await;
    // Redis 7 counts XINFO's subcommands apart; 6.2 counts them as `xinfo`
    // (with the gauges off, nothing else here runs XINFO after the subscribe).
    let xinfo = |con: &mut redis::aio::MultiplexedConnection| {
        let mut con = con.clone();
        async move { command_calls(&mut con, "xinfo|consumers").await + command_calls(&mut con, "xinfo").await }
    };
    let listed = xinfo(&mut con).await;
    assert!(listed >= 1, "the first beat is thorough");

    // The next beat, 10 s later at this limit.
    let second = eventually(Duration::from_secs(15), || async { beat().await != first }).await;
    assert!(second, "the heartbeat was recorded again:\n{}", sidecar.log());
    assert_eq!(xinfo(&mut con).await, listed, "a light beat lists no consumers");
    let ttl: i64 = redis::cmd("PTTL").arg("s:heartbeats:g").query_async(&mut con).await.unwrap();
    assert!(ttl > 0, "the hash keeps the expiry the thorough beat gave it: {ttl}");
}

/// A stream deleted (DEL, FLUSHALL, a restart without persistence) after
/// its last call left, while the group's worker lingers (two hygiene beats,
/// 1 s each here): the beat that finds no stream says so once, in words,
/// not Redis' script error, and records no heartbeat. The worker then
/// retires and beats no more, even once the group is back; a call that
/// subscribes again starts a worker that beats for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_after_its_last_call_left_is_logged_once_in_words() {
    let redis = RedisServer::start().await;
    // A 4 s idle limit: hygiene beats every second (its interval is a quarter of the limit).
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--consumer-idle-limit-ms").arg("4000")).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    call.close_send();
    assert!(call.wait_end(EVENT_TIMEOUT).await.is_none_or(|s| s.code() == Code::Ok), "the call ended cleanly");

    let _: () = redis::cmd("DEL").arg("s").arg("s:heartbeats:g").query_async(&mut con).await.unwrap();
    let retired = || async { sidecar.log().contains("the group's worker retires") };
    assert!(eventually(EVENT_TIMEOUT, retired).await, "the worker retires:\n{}", sidecar.log());
    let log = sidecar.log();
    let gone: Vec<&str> = log.lines().filter(|l| l.contains("stream `s` no longer exists")).collect();
    assert_eq!(gone.len(), 1, "said once, in words:\n{log}");
    assert!(!log.contains("no such key"), "no Redis script error in the log:\n{log}");
    let heartbeats = || async {
        let mut con = redis.conn().await;
        let beats: i64 = redis::cmd("EXISTS").arg("s:heartbeats:g").query_async(&mut con).await.unwrap();
        beats
    };
    assert_eq!(heartbeats().await, 0, "no heartbeat recorded for a group that is gone");

    // The stream and its group come back: a retired worker does not beat for them.
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("s")
        .arg("g")
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut con)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(heartbeats().await, 0, "no heartbeat from a retired worker:\n{}", sidecar.log());
    // A call does.
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let beating = || async { heartbeats().await == 1 };
    assert!(eventually(EVENT_TIMEOUT, beating).await, "the heartbeat is recorded again:\n{}", sidecar.log());
    let log = sidecar.log();
    assert_eq!(log.lines().filter(|l| l.contains("stream `s` no longer exists")).count(), 1, "{log}");
}

// ---------------------------------------------------------------------------
// A read whose reply is lost: its entries come first, not after the reclaim
// ---------------------------------------------------------------------------

/// Far beyond these tests: only the sidecar's own recovery may bring the
/// entries of a lost read back within [`LOST_READ_BACK`], never the reclaim
/// beat or the lease refresh.
const LOST_READ_MIN_IDLE_MS: u64 = 60_000;
/// How soon an entry of a lost read must come back.
const LOST_READ_BACK: Duration = Duration::from_secs(2);
/// How long toxiproxy holds back Redis' replies: the sidecar gives up the
/// read long before the reply could reach it.
const HOLD_REPLIES_MS: u64 = 3_000;

/// A sidecar that reaches Redis through `proxy`, whose beats (reclaim, lease
/// refresh, gauges) stay out of the few seconds a test takes, and whose
/// reader blocks for longer than that (`shared` false: a blocking reader,
/// `--shared-readers off`; true: a shared reader, waiting for a wake-up), so
/// its one read is the one that is lost.
async fn sidecar_through(redis: &RedisServer, proxy: &Proxy, name: &str, shared: bool) -> Sidecar {
    let mut options = SidecarOptions::named(name)
        .reclaim(LOST_READ_MIN_IDLE_MS, LOST_READ_MIN_IDLE_MS)
        .arg("--read-block-ms")
        .arg("30000")
        .arg("--metrics-poll-interval-ms")
        .arg("0")
        .arg("--shared-readers")
        .arg(if shared { "on" } else { "off" });
    options.redis_url = Some(proxy.redis_url());
    Sidecar::start(redis, options).await
}

/// `echomq_reader_connections_closed_total{reason}` of `sidecar`.
async fn readers_closed(sidecar: &Sidecar, reason: &str) -> f64 {
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    let label = format!("reason=\"{reason}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with("echomq_reader_connections_closed_total{") && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `reason` closed a reader connection of `sidecar`.
async fn wait_reader_closed(sidecar: &Sidecar, reason: &str, why: &str) {
    let closed = eventually(EVENT_TIMEOUT, || async move { readers_closed(sidecar, reason).await >= 1.0 }).await;
    assert!(
        closed,
        "{why}: no reader connection closed with reason {reason}\n----- sidecar log -----\n{}",
        sidecar.log()
    );
}

/// Waits until the group's worker is idle: its reader blocked in Redis in its
/// `>` read, and the beats that every worker runs once when it starts (the
/// heartbeat, the reclaim, the lease refresh) done, so no reply of theirs is
/// held back with the read's and delays the worker (their next run is 10 s
/// and more away).
async fn wait_worker_idle(con: &mut redis::aio::MultiplexedConnection) {
    let idle = eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move {
            let info: String = redis::cmd("INFO").arg("clients").query_async(&mut con).await.expect("INFO clients");
            info.lines().any(|line| line.trim() == "blocked_clients:1") && exists(&mut con, "s:heartbeats:g").await
        }
    })
    .await;
    assert!(idle, "the group's reader never blocked in XREADGROUP, or its worker never beat");
    // The replies of the start beats that Redis has run are on their way.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Appends one entry straight to Redis while the sidecar's reader is blocked
/// for it, so Redis hands it to that read at once (into `consumer`'s PEL), and
/// checks that it did; the reply is then on its way to the sidecar.
async fn append_into_the_blocked_read(
    con: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    consumer: &str,
) -> String {
    let id = xadd_raw(con, stream, &[(b"k", b"v")]).await;
    let pending = pending_entries(con, stream, "g").await;
    assert!(
        pending.iter().any(|p| p.stream_id == id && p.consumer == consumer && p.deliveries == 1),
        "the blocked read did not take {id} (the test's premise): {pending:?}"
    );
    id
}

/// How the group's last taking call stops taking while its read is blocked.
#[derive(Clone, Copy, Debug)]
enum Leave {
    /// The client goes away (the call is cancelled).
    Drop,
    /// The client sends `Drain` and stays.
    Drain,
}

/// The group's only call leaves (`how`) while its worker's `XREADGROUP … >`
/// is out, after Redis ran it and put an entry in this consumer's PEL, but
/// before the reply reached the sidecar (toxiproxy holds Redis' replies back).
/// The worker stops its reader and the reply is lost. The next call on the
/// same sidecar must get that entry at once (attempts 2: the lost read counted
/// as a delivery), not after `--reclaim-min-idle-ms` or a restart.
///
/// `shared`: with a shared reader (see [`wait_read_took`]), whose read is
/// under way once Redis ran it, not blocked.
async fn entry_of_a_cut_off_read_goes_to_the_next_call(how: Leave, shared: bool) {
    let redis = RedisServer::start().await;
    let toxiproxy = Toxiproxy::start().await;
    let proxy = toxiproxy.proxy("redis", redis.port()).await;
    let sidecar = sidecar_through(&redis, &proxy, "pod-a", shared).await;
    let mut con = redis.conn().await;
    let mut first = Some(Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await);
    if shared {
        wait_shared_worker_idle(&mut con).await;
    } else {
        wait_worker_idle(&mut con).await;
    }

    proxy.add("hold-replies", Direction::Downstream, Toxic::Latency { ms: HOLD_REPLIES_MS, jitter_ms: 0 }).await;
    let (id, held_back_at) = if shared {
        let id = xadd_raw(&mut con, "s", &[(b"k", b"v")]).await;
        wait_read_took(&mut con, &id, "pod-a").await;
        (id, Instant::now())
    } else {
        let held_back_at = Instant::now();
        (append_into_the_blocked_read(&mut con, "s", "pod-a").await, held_back_at)
    };
    match how {
        Leave::Drop => drop(first.take()),
        Leave::Drain => first.as_ref().unwrap().send(req(Kind::Drain(Drain {}))).await,
    }
    wait_reader_closed(&sidecar, "stopped_mid_read", "the read was not cut off").await;
    assert!(
        held_back_at.elapsed() < Duration::from_millis(HOLD_REPLIES_MS),
        "the reader stopped only after the held-back reply could have reached it: the race was not set up"
    );
    // Let the held replies out before removing the toxic: toxiproxy flushes
    // what a removed toxic holds into writers that may be closing (the cut-off
    // read's connection), waiting 5 s on each such chunk. The entry stays in
    // this consumer's PEL meanwhile, which is what the next call must find.
    tokio::time::sleep(Duration::from_millis(HOLD_REPLIES_MS + 200).saturating_sub(held_back_at.elapsed())).await;
    proxy.remove("hold-replies").await;

    let mut next = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let got = match next.next_event(LOST_READ_BACK).await {
        Event::Delivery(d) => d,
        other => panic!(
            "{how:?}: the entry the cut-off read took ({id}) was not delivered to the next call within \
             {LOST_READ_BACK:?}, got {other:?}; pending: {:?}\n----- sidecar log -----\n{}",
            pending_entries(&mut con, "s", "g").await,
            sidecar.log()
        ),
    };
    assert_eq!(got.stream_id, id, "{how:?}");
    assert_eq!(got.attempts, 2, "{how:?}: the cut-off read was the first delivery");
    next.ack_one(&got.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0, "{how:?}");
    next.assert_quiet(Duration::from_millis(500), "acked, nothing comes back").await;
    if let Some(drained) = first.as_mut() {
        drained.assert_quiet(Duration::from_millis(100), "a drained call gets nothing").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_of_a_read_cut_off_by_the_last_call_leaving_goes_to_the_next_call() {
    entry_of_a_cut_off_read_goes_to_the_next_call(Leave::Drop, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_of_a_read_cut_off_by_a_drain_goes_to_the_next_call() {
    entry_of_a_cut_off_read_goes_to_the_next_call(Leave::Drain, false).await;
}

/// The reader's connection is reset after Redis ran its read and before the
/// reply arrived: the call still subscribed gets the entry as soon as Redis
/// is reachable again, not after `--reclaim-min-idle-ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_of_a_read_whose_connection_broke_is_delivered_at_once() {
    let redis = RedisServer::start().await;
    let toxiproxy = Toxiproxy::start().await;
    let proxy = toxiproxy.proxy("redis", redis.port()).await;
    let sidecar = sidecar_through(&redis, &proxy, "pod-a", false).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    wait_worker_idle(&mut con).await;

    proxy.add("reset", Direction::Downstream, Toxic::ResetPeer { after_ms: 0 }).await;
    let id = append_into_the_blocked_read(&mut con, "s", "pod-a").await;
    wait_reader_closed(&sidecar, "read_error", "the read's connection did not break").await;
    proxy.remove("reset").await;

    let got = match call.next_event(LOST_READ_BACK + Duration::from_secs(1)).await {
        Event::Delivery(d) => d,
        other => panic!(
            "the entry the broken read took ({id}) was not delivered, got {other:?}; pending: {:?}\n----- sidecar \
             log -----\n{}",
            pending_entries(&mut con, "s", "g").await,
            sidecar.log()
        ),
    };
    assert_eq!(got.stream_id, id);
    assert_eq!(got.attempts, 2, "the broken read was the first delivery");
    call.ack_one(&got.id).await;
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
}

// Shared readers: a read is short, on a pooled connection, after a wake-up.
// With every reply held back by the proxy, the wake-up (the invalidate push),
// the XLEN that arms the next one and the read's reply each arrive late, so
// the read is under way, run by Redis, for long enough to lose its reply.
// (A shared read whose connection breaks takes the blocking reader's path,
// `ReaderConnection::read`, tested above with `--shared-readers off`: toxiproxy
// cannot drop a reply it holds back without delivering it first.)

/// Waits until the shared reader's read took `id` into `consumer`'s PEL
/// (Redis ran it; its reply is held back).
async fn wait_read_took(con: &mut redis::aio::MultiplexedConnection, id: &str, consumer: &str) {
    let took =
        eventually(Duration::from_secs(15), || {
            let mut con = con.clone();
            async move {
                pending_entries(&mut con, "s", "g").await.iter().any(|p| p.stream_id == id && p.consumer == consumer)
            }
        })
        .await;
    assert!(took, "the shared reader's read never took {id} (the test's premise)");
}

/// Waits until the shared group's worker ran its start beats (the heartbeat
/// is the last) and their replies are on their way.
async fn wait_shared_worker_idle(con: &mut redis::aio::MultiplexedConnection) {
    let beat = eventually(EVENT_TIMEOUT, || {
        let mut con = con.clone();
        async move { exists(&mut con, "s:heartbeats:g").await }
    })
    .await;
    assert!(beat, "the group's worker never beat");
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_reader_entry_of_a_read_cut_off_by_the_last_call_leaving_goes_to_the_next_call() {
    entry_of_a_cut_off_read_goes_to_the_next_call(Leave::Drop, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_reader_entry_of_a_read_cut_off_by_a_drain_goes_to_the_next_call() {
    entry_of_a_cut_off_read_goes_to_the_next_call(Leave::Drain, true).await;
}
