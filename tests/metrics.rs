//! Prometheus metrics on the admin port: `/metrics` is scraped over plain TCP
//! while entries flow, and the counters, gauges and histograms must move.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use echomq::proto::{Delivery, GroupStart};
use redis::Value;
use support::*;

/// One sample line of the exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// One scrape of `/metrics`.
struct Scrape {
    text: String,
    samples: Vec<Sample>,
}

/// Parses `name{a="x",b="y"} value [timestamp]`; `None` for other lines.
fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, rest) = match line.find('{') {
        Some(brace) => (&line[..brace], &line[brace..]),
        None => {
            let (name, rest) = line.split_once(' ')?;
            return Some(Sample { name: name.to_owned(), labels: BTreeMap::new(), value: parse_value(rest)? });
        }
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest[1..].char_indices().peekable();
    let mut end = None;
    loop {
        // A label: key="value" (value with \" \\ \n escapes), then `,` or `}`.
        while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
            chars.next();
        }
        match chars.peek() {
            Some((i, '}')) => {
                end = Some(*i);
                break;
            }
            None => break,
            _ => {}
        }
        let mut key = String::new();
        for (_, c) in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next().map(|(_, c)| c) != Some('"') {
            return None;
        }
        let mut value = String::new();
        let mut escaped = false;
        for (_, c) in chars.by_ref() {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => break,
                (false, c) => value.push(c),
            }
        }
        labels.insert(key.trim().to_owned(), value);
    }
    let end = end? + 1;
    Some(Sample { name: name.to_owned(), labels, value: parse_value(&rest[1 + end..])? })
}

fn parse_value(text: &str) -> Option<f64> {
    match text.split_whitespace().next()? {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

impl Scrape {
    async fn fetch(sidecar: &Sidecar) -> Scrape {
        let response = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics answers");
        assert_eq!(response.status, 200, "GET /metrics: {response:?}");
        let samples = response.body.lines().filter_map(parse_sample).collect();
        Scrape { text: response.body, samples }
    }

    /// The value of the sample `name` whose labels include every pair of `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.find(name, labels).map(|s| s.value)
    }

    /// The sum of every sample `name` whose labels include every pair of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples.iter().filter(|s| s.name == name && has_labels(s, labels)).map(|s| s.value).sum()
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&Sample> {
        self.samples
            .iter()
            .find(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
    }

    /// The `# TYPE` of `family`: `counter`, `gauge`, `histogram`, …
    fn type_of(&self, family: &str) -> Option<&str> {
        self.text.lines().find_map(|line| {
            let mut parts = line.strip_prefix("# TYPE ")?.split_whitespace();
            (parts.next()? == family).then(|| parts.next()).flatten()
        })
    }

    /// Every family with a `# TYPE` line and its type.
    fn types(&self) -> BTreeMap<String, String> {
        self.text
            .lines()
            .filter_map(|line| {
                let mut parts = line.strip_prefix("# TYPE ")?.split_whitespace();
                Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
            })
            .collect()
    }

    /// The lines mentioning `name`, for failure messages.
    fn lines_of(&self, name: &str) -> String {
        self.text.lines().filter(|l| l.contains(name)).collect::<Vec<_>>().join("\n")
    }
}

fn has_labels(sample: &Sample, labels: &[(&str, &str)]) -> bool {
    labels.iter().all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(*v))
}

/// Scrapes until the sample `name` with `labels` satisfies `check`; its value.
/// Panics with the relevant lines of the last scrape otherwise.
async fn wait_metric(
    sidecar: &Sidecar,
    name: &str,
    labels: &[(&str, &str)],
    what: &str,
    check: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let scrape = Scrape::fetch(sidecar).await;
        let value = scrape.value(name, labels);
        if let Some(value) = value.filter(|v| check(*v)) {
            return value;
        }
        if Instant::now() >= deadline {
            panic!(
                "{name}{labels:?} should be {what} within {EVENT_TIMEOUT:?}; last value {value:?}; its lines:\n{}",
                scrape.lines_of(name)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for `name` with `labels` to equal `expected`.
async fn wait_eq(sidecar: &Sidecar, name: &str, labels: &[(&str, &str)], expected: f64) {
    wait_metric(sidecar, name, labels, &format!("{expected}"), |v| v == expected).await;
}

fn group<'a>(stream: &'a str, group: &'a str) -> [(&'static str, &'a str); 2] {
    [("stream", stream), ("group", group)]
}

/// The prelude most tests here share: a Redis, a sidecar started with
/// `options`, and one call subscribed to `s`/`g` from the beginning with the
/// sidecar's default `max_in_flight`. The servers live as long as it does.
struct OneCall {
    call: Consumer,
    sidecar: Sidecar,
    redis: RedisServer,
}

async fn one_call(options: SidecarOptions) -> OneCall {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, options).await;
    let call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    OneCall { call, sidecar, redis }
}

/// A scrape in which every series exists: a subscription creates the
/// per-group series, and an entry appended, delivered and acked (its ack
/// counted) gives the Redis histogram series.
async fn scrape_after_one_ack() -> Scrape {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;
    call.ack_one(&d.id).await;
    wait_eq(&sidecar, "echomq_acks_total", &group("s", "g"), 1.0).await;
    Scrape::fetch(&sidecar).await
}

/// The summed `_count` of the Redis latency histogram for the commands acks go
/// through: `XACK` alone, a `pipeline`, or the `settle.lua` script (0 when no
/// such series exists yet).
fn ack_command_count(scrape: &Scrape) -> f64 {
    ["XACK", "pipeline", "script:settle"]
        .iter()
        .filter_map(|c| scrape.value("echomq_redis_command_duration_seconds_count", &[("command", c)]))
        .sum()
}

// ---------------------------------------------------------------------------
// The exposition
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_the_text_exposition() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    let response = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics answers");

    assert_eq!(response.status, 200);
    let content_type = response.header("content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/openmetrics-text") || content_type.starts_with("text/plain"),
        "a Prometheus content type: {content_type:?}"
    );
    if content_type.starts_with("application/openmetrics-text") {
        assert!(response.body.ends_with("# EOF\n"), "OpenMetrics text ends with `# EOF`:\n{}", response.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_families_have_prometheus_types_and_names() {
    let scrape = scrape_after_one_ack().await;

    let counters = [
        "deliveries",
        "acks",
        "fails",
        "dead_letters",
        "reclaimed",
        "lease_refreshes",
        "leases_lost",
        "acks_not_pending",
        "emits",
        "window_stalls",
        "trimmed_while_pending",
        "group_recreations",
        "verdict_errors",
        "appends",
        "redis_errors",
        "reader_connection_refusals",
        "reader_connections_closed",
    ];
    let gauges = [
        "in_flight",
        "consume_calls",
        "group_pending",
        "group_lag",
        "group_oldest_pending_age_seconds",
        "group_max_delivery_count",
        "group_consumers",
        "stream_length",
        "scheduled",
        "scheduled_oldest_due_timestamp_seconds",
        "reader_connections_max",
        "reader_connections",
        "reader_connections_in_use",
        "reader_connection_waiters",
    ];
    let histograms = ["handler_duration_seconds", "redis_command_duration_seconds", "reader_connection_wait_seconds"];
    let mut problems = Vec::new();
    for name in counters {
        // OpenMetrics names the counter family without `_total`; the Prometheus
        // text format names it with. The samples end in `_total` either way.
        let family = format!("echomq_{name}");
        let typed = scrape.type_of(&family).or_else(|| scrape.type_of(&format!("{family}_total")));
        if typed != Some("counter") {
            problems.push(format!("{family}: TYPE {typed:?}, want counter"));
        }
    }
    for name in gauges {
        let family = format!("echomq_{name}");
        let typed = scrape.type_of(&family);
        if typed != Some("gauge") {
            problems.push(format!("{family}: TYPE {typed:?}, want gauge"));
        }
    }
    for name in histograms {
        let family = format!("echomq_{name}");
        let typed = scrape.type_of(&family);
        if typed != Some("histogram") {
            problems.push(format!("{family}: TYPE {typed:?}, want histogram"));
        }
    }
    // Every sample belongs to a typed family by the naming rules of its type.
    let types = scrape.types();
    for sample in scrape.samples.iter().filter(|s| s.name.starts_with("echomq_")) {
        let fits = types.iter().any(|(family, kind)| {
            let base = family.trim_end_matches("_total");
            match kind.as_str() {
                "counter" => sample.name == format!("{base}_total") || sample.name == format!("{base}_created"),
                "gauge" => &sample.name == family,
                "histogram" => ["_bucket", "_sum", "_count", "_created"]
                    .iter()
                    .any(|suffix| sample.name == format!("{family}{suffix}")),
                _ => false,
            }
        });
        if !fits {
            problems.push(format!("sample {} fits no family by its # TYPE", sample.name));
        }
    }
    for (family, kind) in types.iter().filter(|(f, _)| f.starts_with("echomq_")) {
        if kind == "gauge" && family.ends_with("_total") {
            problems.push(format!("gauge {family} ends in _total, a counter suffix"));
        }
        if kind == "histogram" && !family.ends_with("_seconds") && !family.ends_with("_bytes") {
            problems.push(format!("histogram {family} has no base unit in its name"));
        }
    }
    let inf_bucket = scrape.samples.iter().any(|s| {
        s.name == "echomq_handler_duration_seconds_bucket" && s.labels.get("le").map(String::as_str) == Some("+Inf")
    });
    if !inf_bucket {
        problems.push("echomq_handler_duration_seconds has no le=\"+Inf\" bucket".to_owned());
    }
    assert!(problems.is_empty(), "{problems:#?}\n----- /metrics -----\n{}", scrape.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_group_series_are_labelled_by_stream_and_group() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let _a = Consumer::start(&sidecar, "orders", "billing", GroupStart::New, 0).await;
    let _b = Consumer::start(&sidecar, "orders", "shipping", GroupStart::New, 0).await;

    let scrape = Scrape::fetch(&sidecar).await;

    for name in ["echomq_deliveries_total", "echomq_acks_total", "echomq_in_flight"] {
        let mut label_sets: Vec<BTreeMap<String, String>> =
            scrape.samples.iter().filter(|s| s.name == name).map(|s| s.labels.clone()).collect();
        label_sets.sort();
        let want: Vec<BTreeMap<String, String>> = ["billing", "shipping"]
            .iter()
            .map(|g| {
                [("group", *g), ("stream", "orders"), ("sharded_stream", "orders")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into()
            })
            .collect();
        assert_eq!(label_sets, want, "{name}: one series per stream and group:\n{}", scrape.lines_of(name));
    }
}

// ---------------------------------------------------------------------------
// Counters as entries flow
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_deliveries_count_deliveries_acks_and_handler_time() {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append_numbered("s", 3).await;
    let deliveries = call.deliveries(3, EVENT_TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(50)).await;

    for d in &deliveries {
        call.ack_one(&d.id).await;
    }

    wait_eq(&sidecar, "echomq_acks_total", &labels, 3.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_deliveries_total", &labels), Some(3.0));
    assert_eq!(scrape.value("echomq_handler_duration_seconds_count", &labels), Some(3.0));
    let sum = scrape.value("echomq_handler_duration_seconds_sum", &labels).unwrap();
    assert!(sum >= 0.15, "three handlers each held their entry ≥ 50 ms: sum {sum}");
    let inf = [("stream", "s"), ("group", "g"), ("le", "+Inf")];
    assert_eq!(scrape.value("echomq_handler_duration_seconds_bucket", &inf), Some(3.0));
    assert_eq!(scrape.value("echomq_in_flight", &labels), Some(0.0));
    assert_eq!(scrape.value("echomq_fails_total", &labels), Some(0.0));
}

/// A call on stream `s`, group `g`, with a window of `max_in_flight`,
/// holding `n` fresh deliveries.
async fn holding(sidecar: &Sidecar, n: usize, max_in_flight: u32) -> (Consumer, Vec<Delivery>) {
    let mut call = Consumer::start(sidecar, "s", "g", GroupStart::Beginning, max_in_flight).await;
    sidecar.append_numbered("s", n).await;
    let deliveries = call.deliveries(n, EVENT_TIMEOUT).await;
    (call, deliveries)
}

/// XACKs `deliveries` in group `g` from outside the sidecar, as another client would.
async fn ack_elsewhere(redis: &RedisServer, deliveries: &[&Delivery]) {
    let mut xack = redis::cmd("XACK");
    xack.arg("s").arg("g");
    for delivery in deliveries {
        xack.arg(&delivery.stream_id);
    }
    let _: i64 = xack.query_async(&mut redis.conn().await).await.unwrap();
}

/// The group's pending count (`XPENDING` summary).
async fn pending_count(redis: &RedisServer) -> Value {
    let summary: Value = redis::cmd("XPENDING").arg("s").arg("g").query_async(&mut redis.conn().await).await.unwrap();
    match summary {
        Value::Array(items) => items.into_iter().next().unwrap_or(Value::Nil),
        other => other,
    }
}

/// The next `n` verdict errors of `call`, each asserted NOT_PENDING; their ids, sorted.
async fn not_pending_answers(call: &mut Consumer, n: usize) -> Vec<String> {
    let mut answered = Vec::with_capacity(n);
    for _ in 0..n {
        let error = call.next_verdict_error(EVENT_TIMEOUT).await;
        assert_eq!(error.code, echomq::proto::VerdictErrorCode::NotPending as i32, "{error:?}");
        answered.push(error.id);
    }
    answered.sort();
    answered
}

/// One Ack of entries another client acknowledged first: XACK finds none
/// pending, so each is answered NOT_PENDING and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_that_find_nothing_pending_are_each_answered_not_pending() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let (mut call, deliveries) = holding(&sidecar, 2, 0).await;
    ack_elsewhere(&redis, &[&deliveries[0], &deliveries[1]]).await;

    call.ack(&[&deliveries[0].id, &deliveries[1].id]).await;

    assert_eq!(not_pending_answers(&mut call, 2).await, vec![deliveries[0].id.clone(), deliveries[1].id.clone()]);
    wait_eq(&sidecar, "echomq_acks_not_pending_total", &labels, 2.0).await;
    assert_eq!(Scrape::fetch(&sidecar).await.value("echomq_acks_total", &labels), Some(0.0));
}

/// One Ack of three entries, one of which another client acknowledged first:
/// the multi-id XACK counts two pending and cannot say which one was not, so
/// no id is answered; the shortfall is counted and logged, and all three are
/// settled in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_partly_not_pending_counts_the_shortfall_and_answers_no_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let (mut call, deliveries) = holding(&sidecar, 3, 0).await;
    ack_elsewhere(&redis, &[&deliveries[1]]).await;

    call.ack(&[&deliveries[0].id, &deliveries[1].id, &deliveries[2].id]).await;

    wait_eq(&sidecar, "echomq_acks_total", &labels, 2.0).await;
    wait_eq(&sidecar, "echomq_acks_not_pending_total", &labels, 1.0).await;
    call.assert_quiet(Duration::from_millis(300), "XACK cannot say which id was not pending").await;
    assert_eq!(pending_count(&redis).await, Value::Int(0));
    let log = sidecar.log();
    assert!(log.contains("no longer pending") && log.contains("not_pending=1"), "{log}");
}

/// A client that acks, batch after batch, entries others acknowledged in part
/// (as after a lost lease): the shortfall WARN goes out once a second
/// sidecar-wide, the rest at DEBUG, and once the burst is over one line says
/// how many were held back; the metric counts every ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_acks_partly_not_pending_warns_once_a_second() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let (call, deliveries) = holding(&sidecar, 40, 0).await;
    let elsewhere: Vec<&Delivery> = deliveries.iter().skip(1).step_by(2).collect();
    ack_elsewhere(&redis, &elsewhere).await;

    // Twenty batches of two, one of each acknowledged elsewhere, one at a time.
    for (n, pair) in deliveries.chunks(2).enumerate() {
        call.ack(&[&pair[0].id, &pair[1].id]).await;
        wait_eq(&sidecar, "echomq_acks_total", &labels, (n + 1) as f64).await;
    }
    wait_eq(&sidecar, "echomq_acks_not_pending_total", &labels, 20.0).await;

    let line = "some acknowledged entries were no longer pending";
    let held_back = "more batches of acks partly no longer pending since the last such line";
    // The worker's next turn after the second is out counts the held-back
    // lines: an Ack of an id the call does not hold makes one.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    call.ack_one(&format!("{:028x}", 7)).await;
    let counted = || async { sidecar.log().contains(held_back) };
    assert!(eventually(Duration::from_secs(3), counted).await, "the held-back lines are counted:\n{}", sidecar.log());
    let log = sidecar.log();
    let at = |level: &str| log.lines().filter(|l| l.contains(level) && l.contains(line)).count();
    let (warned, debugged) = (at(" WARN "), at(" DEBUG "));
    assert_eq!(warned + debugged, 20, "one line per batch:\n{log}");
    assert!(warned <= 4, "{warned} WARN lines for a burst of 20 batches:\n{log}");
    assert_eq!(pending_count(&redis).await, Value::Int(0));
}

/// One Ack of more ids than one XACK of settle.lua takes (1,024): every
/// chunk is acknowledged and counted, and only the chunk that found nothing
/// pending is answered NOT_PENDING, each of its ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_of_more_ids_than_one_xack_takes_settles_every_chunk() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let (mut call, deliveries) = holding(&sidecar, 1_030, 1_030).await;
    // The last six form the second chunk; acknowledged elsewhere, it finds none pending.
    let tail: Vec<&Delivery> = deliveries[1_024..].iter().collect();
    ack_elsewhere(&redis, &tail).await;

    let ids: Vec<&str> = deliveries.iter().map(|d| d.id.as_str()).collect();
    call.ack(&ids).await;

    let expected: Vec<String> = tail.iter().map(|d| d.id.clone()).collect();
    assert_eq!(not_pending_answers(&mut call, tail.len()).await, expected);
    wait_eq(&sidecar, "echomq_acks_total", &labels, 1_024.0).await;
    wait_eq(&sidecar, "echomq_acks_not_pending_total", &labels, 6.0).await;
    assert_eq!(pending_count(&redis).await, Value::Int(0));
}

/// Plain acks (first deliveries, no key) of more ids than one XACK takes,
/// settled together: they go as one pipeline of an XACK per 1,024, and every
/// one is applied and counted. Redis holds back the worker's XACK of a first
/// ack (CLIENT PAUSE WRITE), so the pieces of the large Ack behind it wait in
/// the worker's queue and are settled in one batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_acks_of_more_ids_than_one_xack_takes_go_as_one_pipeline() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let (call, deliveries) = holding(&sidecar, 3_001, 4_000).await;
    let pipelines = |scrape: &Scrape| {
        scrape.value("echomq_redis_command_duration_seconds_count", &[("command", "pipeline")]).unwrap_or(0.0)
    };
    let before = pipelines(&Scrape::fetch(&sidecar).await);

    let mut con = redis.conn().await;
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1_000).arg("WRITE").query_async(&mut con).await.unwrap();
    call.ack_one(&deliveries[0].id).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rest: Vec<&str> = deliveries[1..].iter().map(|d| d.id.as_str()).collect();
    call.ack(&rest).await;

    wait_eq(&sidecar, "echomq_acks_total", &labels, 3_001.0).await;
    assert_eq!(pending_count(&redis).await, Value::Int(0));
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(
        scrape.value("echomq_redis_command_duration_seconds_count", &[("command", "script:settle")]).unwrap_or(0.0),
        0.0,
        "plain acks run no script"
    );
    assert!(
        pipelines(&scrape) > before,
        "the 3,000 acks queued behind the paused XACK were not settled as one pipeline:\n{}",
        scrape.lines_of("echomq_redis_command_duration_seconds_count")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_deliveries_count_in_flight_until_their_verdict() {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append_numbered("s", 2).await;
    let deliveries = call.deliveries(2, EVENT_TIMEOUT).await;

    wait_eq(&sidecar, "echomq_in_flight", &labels, 2.0).await;
    call.ack_one(&deliveries[0].id).await;
    wait_eq(&sidecar, "echomq_in_flight", &labels, 1.0).await;
    call.ack_one(&deliveries[1].id).await;
    wait_eq(&sidecar, "echomq_in_flight", &labels, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_verdict_counts_a_fail_and_the_redelivery() {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append("s", &[("k", b"v")]).await;
    let first = call.next_delivery(EVENT_TIMEOUT).await;

    call.fail(&first.id, Some(Duration::from_millis(100))).await;
    let again = call.next_delivery(EVENT_TIMEOUT).await;
    call.ack_one(&again.id).await;

    assert_eq!(again.id, first.id);
    wait_eq(&sidecar, "echomq_acks_total", &labels, 1.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_fails_total", &labels), Some(1.0));
    assert_eq!(scrape.value("echomq_deliveries_total", &labels), Some(2.0), "the re-delivery counts");
    assert_eq!(scrape.value("echomq_handler_duration_seconds_count", &labels), Some(2.0), "two verdicts");
    assert_eq!(scrape.value("echomq_in_flight", &labels), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_verdict_counts_a_dead_letter() {
    let OneCall { redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append("s", &[("k", b"v")]).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;

    call.dead_letter(&d.id, "cannot parse").await;

    wait_eq(&sidecar, "echomq_dead_letters_total", &labels, 1.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_in_flight", &labels), Some(0.0));
    assert_eq!(scrape.value("echomq_acks_total", &labels), Some(0.0), "a dead letter is not an ack");
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s:dlq").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_entry_counts_a_dead_letter() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");
    let mut sub = subscribe_msg("s", "g", GroupStart::Beginning);
    sub.max_deliveries = 1;
    let mut call = Consumer::subscribe(&sidecar, sub).await;
    sidecar.append("s", &[("k", b"v")]).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;

    // The re-delivery would be the second: over max_deliveries, so dead-lettered.
    call.fail(&d.id, Some(Duration::from_millis(50))).await;

    wait_eq(&sidecar, "echomq_dead_letters_total", &labels, 1.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_fails_total", &labels), Some(1.0));
    assert_eq!(scrape.value("echomq_deliveries_total", &labels), Some(1.0), "the poison entry is not handed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_holding_an_entry_counts_a_fail_and_empties_in_flight() {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append("s", &[("k", b"v")]).await;
    call.next_delivery(EVENT_TIMEOUT).await;
    wait_eq(&sidecar, "echomq_in_flight", &labels, 1.0).await;

    drop(call);

    wait_eq(&sidecar, "echomq_fails_total", &labels, 1.0).await;
    wait_eq(&sidecar, "echomq_in_flight", &labels, 0.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_acks_total", &labels), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_reclaim_counts_reclaimed_entries() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().reclaim(300, 100)).await;
    let labels = group("s", "g");
    let mut con = redis.conn().await;
    let appended = sidecar.append("s", &[("k", b"v")]).await;
    create_group(&mut con, "s", "g", "0").await;
    // A peer reads the entry and dies holding it.
    let _: Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "g", "dead-peer", "COUNT", "1", "STREAMS", "s", ">"])
        .query_async(&mut con)
        .await
        .expect("XREADGROUP as the dead peer");

    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 0).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;

    assert_eq!(d.id, appended.id);
    wait_eq(&sidecar, "echomq_reclaimed_total", &labels, 1.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_deliveries_total", &labels), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_an_entry_counts_lease_refreshes() {
    // Leases are refreshed every third of the reclaim minimum idle time: 100 ms.
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default().reclaim(300, 100)).await;
    let labels = group("s", "g");
    sidecar.append("s", &[("k", b"v")]).await;
    call.next_delivery(EVENT_TIMEOUT).await;

    wait_metric(&sidecar, "echomq_lease_refreshes_total", &labels, "at least 2", |v| v >= 2.0).await;

    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_leases_lost_total", &labels), Some(0.0));
}

// ---------------------------------------------------------------------------
// Polled gauges
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_gauges_follow_the_group_state() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--metrics-poll-interval-ms").arg("100")).await;
    let labels = group("s", "g");
    sidecar.append_numbered("s", 5).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::Beginning, 2).await;
    let held = call.deliveries(2, EVENT_TIMEOUT).await;

    wait_eq(&sidecar, "echomq_group_pending", &labels, 2.0).await;
    wait_eq(&sidecar, "echomq_group_lag", &labels, 3.0).await;
    wait_eq(&sidecar, "echomq_stream_length", &labels, 5.0).await;
    wait_eq(&sidecar, "echomq_group_consumers", &labels, 1.0).await;
    wait_eq(&sidecar, "echomq_group_max_delivery_count", &labels, 1.0).await;
    wait_metric(&sidecar, "echomq_group_oldest_pending_age_seconds", &labels, "≥ 0.3 s", |v| v >= 0.3).await;

    // Settle everything: the gauges come back down.
    for d in &held {
        call.ack_one(&d.id).await;
    }
    for d in call.deliveries(2, EVENT_TIMEOUT).await {
        call.ack_one(&d.id).await;
    }
    let last = call.next_delivery(EVENT_TIMEOUT).await;
    call.ack_one(&last.id).await;
    wait_eq(&sidecar, "echomq_group_pending", &labels, 0.0).await;
    wait_eq(&sidecar, "echomq_group_lag", &labels, 0.0).await;
    wait_eq(&sidecar, "echomq_group_oldest_pending_age_seconds", &labels, 0.0).await;
    wait_eq(&sidecar, "echomq_stream_length", &labels, 5.0).await;
}

/// The gauges cost Redis one round trip per poll, whatever the server: the
/// idle budget of a subscription (the scale benchmark's) leaves no room for
/// the seven a poll once took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_reads_the_group_state_in_one_round_trip() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--metrics-poll-interval-ms").arg("100")).await;
    let labels = group("s", "g");
    sidecar.append_numbered("s", 3).await;
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    // A poll has run: its script is in Redis' cache (the first run of a
    // script costs a NOSCRIPT and a SCRIPT LOAD more).
    wait_eq(&sidecar, "echomq_stream_length", &labels, 3.0).await;

    let commands = Monitor::start(&redis).await.commands_for(Duration::from_millis(1_500)).await;

    // Every poll reads the consumers once, in a script or not.
    let polls = commands.iter().filter(|c| c.is("XINFO") && c.names("CONSUMERS") && c.names("s")).count();
    let round_trips: Vec<&Monitored> = commands.iter().filter(|c| reads_group_state(c, "s")).collect();
    assert!(polls >= 5, "a poll every 100 ms, {polls} in 1.5 s: {commands:#?}");
    // A poll cut by the window's start or end shows its round trip without
    // its script's commands, or the other way round: one more or one less.
    assert!(
        round_trips.len() <= polls + 1,
        "{polls} polls took {} round trips, one each at the most:\n{round_trips:#?}",
        round_trips.len()
    );
}

// ---------------------------------------------------------------------------
// Redis latency
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_command_latency_is_observed_and_grows_with_acks() {
    let OneCall { redis: _redis, sidecar, mut call } = one_call(SidecarOptions::default()).await;
    let labels = group("s", "g");
    sidecar.append_numbered("s", 2).await;
    let deliveries = call.deliveries(2, EVENT_TIMEOUT).await;
    let before = Scrape::fetch(&sidecar).await;

    for d in &deliveries {
        call.ack_one(&d.id).await;
        wait_metric(&sidecar, "echomq_acks_total", &labels, "counting this ack", |v| v >= 1.0).await;
    }
    wait_eq(&sidecar, "echomq_acks_total", &labels, 2.0).await;
    let after = Scrape::fetch(&sidecar).await;

    assert!(
        ack_command_count(&after) > ack_command_count(&before),
        "XACK (alone or in a pipeline) must be timed: before {}, after {}:\n{}",
        ack_command_count(&before),
        ack_command_count(&after),
        after.lines_of("echomq_redis_command_duration_seconds_count")
    );
    let commands: Vec<&str> = after
        .samples
        .iter()
        .filter(|s| s.name == "echomq_redis_command_duration_seconds_count")
        .filter_map(|s| s.labels.get("command").map(String::as_str))
        .collect();
    assert!(!commands.is_empty() && commands.iter().all(|c| !c.is_empty()), "labelled by command: {commands:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_errors_are_counted_by_operation() {
    let mut redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().reclaim(300, 100)).await;
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    redis.kill9();

    let deadline = Instant::now() + EVENT_TIMEOUT;
    let scrape = loop {
        let scrape = Scrape::fetch(&sidecar).await;
        if scrape.sum("echomq_redis_errors_total", &group("s", "g")) >= 1.0 {
            break scrape;
        }
        assert!(Instant::now() < deadline, "no Redis error counted for s/g:\n{}", scrape.lines_of("redis_errors"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let typed = scrape.type_of("echomq_redis_errors").or_else(|| scrape.type_of("echomq_redis_errors_total"));
    assert_eq!(typed, Some("counter"));
    let operations: Vec<&str> = scrape
        .samples
        .iter()
        .filter(|s| s.name == "echomq_redis_errors_total")
        .map(|s| s.labels.get("operation").map_or("", String::as_str))
        .collect();
    assert!(operations.iter().all(|op| !op.is_empty()), "each error series names its operation: {operations:?}");
}

/// The conventional metrics beside the sidecar's own: `echomq_build_info`
/// with the version, and the process metrics with values that are this
/// process's (its pid's RSS and start time, CPU that grows with work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_info_and_process_metrics_describe_this_process() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let first = Scrape::fetch(&sidecar).await;

    assert_eq!(
        first.value("echomq_build_info", &[("version", env!("CARGO_PKG_VERSION"))]),
        Some(1.0),
        "{}",
        first.text
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", sidecar.pid().unwrap())).unwrap();
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let rss = first.value("process_resident_memory_bytes", &[]).expect("process_resident_memory_bytes");
    assert!((rss - rss_kb * 1024.0).abs() < 8e6, "RSS {rss} vs /proc's {rss_kb} kB");
    let started = first.value("process_start_time_seconds", &[]).expect("process_start_time_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(now - started >= 0.0 && now - started < 120.0, "started {started}, now {now}");
    assert!(first.value("process_open_fds", &[]).unwrap() >= 3.0);
    assert!(first.value("process_max_fds", &[]).unwrap() >= first.value("process_open_fds", &[]).unwrap());
    assert!(first.value("process_virtual_memory_bytes", &[]).unwrap() > rss);
    assert!(first.text.contains("# TYPE process_cpu_seconds counter"), "{}", first.text);

    for n in 0..300 {
        sidecar.append("s", &[("n", n.to_string().as_bytes())]).await;
    }
    let cpu = |s: &Scrape| s.value("process_cpu_seconds_total", &[]).expect("process_cpu_seconds_total");
    let later = Scrape::fetch(&sidecar).await;
    assert!(cpu(&later) > cpu(&first), "CPU {} then {}", cpu(&first), cpu(&later));
}

// ---------------------------------------------------------------------------
// The conventions: series from the start, appends, verdict errors, calls,
// the gRPC server, label values, a recovery that is no error
// ---------------------------------------------------------------------------

/// Every worker step that can fail, as `echomq_redis_errors_total{operation}` names it.
const OPERATIONS: [&str; 10] = [
    "read",
    "recover",
    "redeliver",
    "reclaim",
    "refresh_leases",
    "settle",
    "dead_letter",
    "release",
    "recreate_group",
    "hygiene",
];

/// Every verdict error code, as `echomq_verdict_errors_total{code}` names it.
const VERDICT_CODES: [&str; 5] = ["unknown_id", "not_pending", "invalid_argument", "unavailable", "lease_lost"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_groups_series_are_present_from_the_start_at_zero() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let _call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    let scrape = Scrape::fetch(&sidecar).await;

    let labels = group("s", "g");
    let mut missing = Vec::new();
    let at_zero = [
        "echomq_deliveries_total",
        "echomq_acks_total",
        "echomq_fails_total",
        "echomq_releases_total",
        "echomq_dead_letters_total",
        "echomq_reclaimed_total",
        "echomq_lease_refreshes_total",
        "echomq_leases_lost_total",
        "echomq_acks_not_pending_total",
        "echomq_trimmed_while_pending_total",
        "echomq_group_recreations_total",
        "echomq_in_flight",
        "echomq_handler_duration_seconds_count",
    ];
    for name in at_zero {
        if scrape.value(name, &labels) != Some(0.0) {
            missing.push(format!("{name}{labels:?}: {:?}", scrape.value(name, &labels)));
        }
    }
    for code in VERDICT_CODES {
        let labels = [("stream", "s"), ("group", "g"), ("code", code)];
        if scrape.value("echomq_verdict_errors_total", &labels) != Some(0.0) {
            missing.push(format!("echomq_verdict_errors_total{labels:?}"));
        }
    }
    for operation in OPERATIONS {
        let labels = [("stream", "s"), ("group", "g"), ("operation", operation)];
        if scrape.value("echomq_redis_errors_total", &labels) != Some(0.0) {
            missing.push(format!("echomq_redis_errors_total{labels:?}"));
        }
    }
    if scrape.value("echomq_appends_total", &[("stream", "s")]) != Some(0.0) {
        missing.push("echomq_appends_total{stream=s}".to_owned());
    }
    if scrape.value("echomq_consume_calls", &labels) != Some(1.0) {
        missing
            .push(format!("echomq_consume_calls{labels:?} = 1: {:?}", scrape.value("echomq_consume_calls", &labels)));
    }
    assert!(missing.is_empty(), "{missing:#?}\n----- /metrics -----\n{}", scrape.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_counted_per_stream_once_redis_confirmed() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut client = sidecar.stream_client().await;

    sidecar.append_numbered("a", 3).await;
    let entry = || echomq::proto::BatchEntry { fields: [("k".to_owned(), b"v".to_vec())].into(), ..Default::default() };
    let batch =
        echomq::proto::AppendBatchRequest { stream: "b".into(), entries: vec![entry(), entry()], ..Default::default() };
    client.append_batch(batch).await.expect("AppendBatch");
    // Refused before Redis: the reserved field. Nothing appended, nothing counted.
    let refused = echomq::proto::AppendRequest {
        stream: "a".into(),
        fields: [("id".to_owned(), b"mine".to_vec())].into(),
        ..Default::default()
    };
    client.append(refused).await.expect_err("the reserved field is refused");

    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("echomq_appends_total", &[("stream", "a")]), Some(3.0), "{}", scrape.lines_of("appends"));
    assert_eq!(scrape.value("echomq_appends_total", &[("stream", "b")]), Some(2.0), "{}", scrape.lines_of("appends"));
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "a").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdict_errors_are_counted_by_code() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;

    // A well-formed id this call never held (the worker answers), then one
    // that does not parse (the relay answers).
    call.ack_one(&"0".repeat(28)).await;
    call.ack_one("not-an-id").await;
    call.next_verdict_error(EVENT_TIMEOUT).await;
    call.next_verdict_error(EVENT_TIMEOUT).await;

    let labels = |code| [("stream", "s"), ("group", "g"), ("code", code)];
    wait_eq(&sidecar, "echomq_verdict_errors_total", &labels("unknown_id"), 1.0).await;
    wait_eq(&sidecar, "echomq_verdict_errors_total", &labels("invalid_argument"), 1.0).await;
    let scrape = Scrape::fetch(&sidecar).await;
    for code in ["not_pending", "unavailable", "lease_lost"] {
        assert_eq!(scrape.value("echomq_verdict_errors_total", &labels(code)), Some(0.0), "{code}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_calls_gauge_goes_up_and_down_with_the_calls() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let labels = group("s", "g");

    let mut first = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let second = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    wait_eq(&sidecar, "echomq_consume_calls", &labels, 2.0).await;

    drop(second);
    wait_eq(&sidecar, "echomq_consume_calls", &labels, 1.0).await;
    first.close_send();
    first.wait_end(EVENT_TIMEOUT).await;
    wait_eq(&sidecar, "echomq_consume_calls", &labels, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_server_calls_are_counted_by_method_and_code() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let append = [("grpc_service", "echomq.v1.StreamService"), ("grpc_method", "Append")];
    let consume = [("grpc_service", "echomq.v1.ConsumerService"), ("grpc_method", "Consume")];
    let code = |method: [(&'static str, &'static str); 2], code: &'static str| {
        let [a, b] = method;
        [a, b, ("grpc_code", code)]
    };
    let before = Scrape::fetch(&sidecar).await;
    // Every method's series from the start, for every code.
    assert_eq!(before.value("grpc_server_handled_total", &code(append, "Unavailable")), Some(0.0), "{}", before.text);
    assert_eq!(before.value("grpc_server_started_total", &consume), Some(0.0));
    assert_eq!(
        before.find("grpc_server_started_total", &consume).and_then(|s| s.labels.get("grpc_type")).map(String::as_str),
        Some("bidi_stream")
    );

    sidecar.append_numbered("s", 2).await;
    let refused = echomq::proto::AppendRequest {
        stream: "s".into(),
        fields: [("id".to_owned(), b"mine".to_vec())].into(),
        ..Default::default()
    };
    sidecar.stream_client().await.append(refused).await.expect_err("the reserved field is refused");
    let missing =
        echomq::proto::DescribeGroupRequest { stream: "s".into(), group: "nope".into(), ..Default::default() };
    sidecar.admin_client().await.describe_group(missing).await.expect_err("no such group");

    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.value("grpc_server_started_total", &append), Some(3.0), "{}", scrape.lines_of("Append\""));
    assert_eq!(scrape.value("grpc_server_handled_total", &code(append, "OK")), Some(2.0));
    assert_eq!(scrape.value("grpc_server_handled_total", &code(append, "InvalidArgument")), Some(1.0));
    let describe = [("grpc_method", "DescribeGroup"), ("grpc_code", "NotFound")];
    assert_eq!(scrape.value("grpc_server_handled_total", &describe), Some(1.0));

    // A streaming call counts as started at once, as handled when it ends.
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let open = Scrape::fetch(&sidecar).await;
    assert_eq!(open.value("grpc_server_started_total", &consume), Some(1.0));
    assert_eq!(open.sum("grpc_server_handled_total", &consume), 0.0, "{}", open.lines_of("Consume\""));
    call.close_send();
    call.wait_end(EVENT_TIMEOUT).await;
    wait_eq(&sidecar, "grpc_server_handled_total", &code(consume, "OK"), 1.0).await;
    let ended = Scrape::fetch(&sidecar).await;
    assert_eq!(ended.sum("grpc_server_handled_total", &consume), 1.0, "{}", ended.lines_of("Consume\""));

    // A call the client drops is counted when the server sees it end: OK
    // when its half-close arrived first, Canceled when the reset did (a unit
    // test in src/metrics/grpc.rs pins that a dropped body is Canceled).
    let dropped = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    drop(dropped);
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let scrape = Scrape::fetch(&sidecar).await;
        if scrape.sum("grpc_server_handled_total", &consume) == 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the dropped call is never counted:\n{}", scrape.lines_of("Consume\""));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Label values are short snake_case words, except the domain's own names:
/// streams and groups (the user's), Redis commands, the version, the gRPC
/// names of grpc-prometheus, and histogram bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_values_are_short_snake_case_words() {
    let scrape = scrape_after_one_ack().await;

    let own_words = ["stream", "sharded_stream", "group", "command", "version", "le"];
    let word = |v: &str| {
        !v.is_empty()
            && v.len() <= 32
            && v.starts_with(|c: char| c.is_ascii_lowercase())
            && v.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let bad: Vec<String> = scrape
        .samples
        .iter()
        .filter(|s| s.name.starts_with("echomq_"))
        .flat_map(|s| s.labels.iter().map(move |(k, v)| (s, k, v)))
        .filter(|(_, k, v)| !own_words.contains(&k.as_str()) && !word(v))
        .map(|(s, k, v)| format!("{}: {k}={v:?}", s.name))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

/// A deleted stream's group is re-created: a recovery, counted as one, and
/// not as a Redis error (neither the worker's step nor the command).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_group_is_counted_as_a_recovery_not_an_error() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().backoff(100)).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(d.id, first.id);
    call.ack_one(&d.id).await;
    wait_eq(&sidecar, "echomq_acks_total", &group("s", "g"), 1.0).await;

    let _: () = redis::cmd("DEL").arg("s").query_async(&mut con).await.unwrap();
    wait_metric(&sidecar, "echomq_group_recreations_total", &group("s", "g"), "at least 1", |v| v >= 1.0).await;
    // The recreated group serves again.
    let after = sidecar.append("s", &[("k", b"after")]).await;
    let d = call.next_delivery(EVENT_TIMEOUT).await;
    assert_eq!(d.id, after.id);

    let scrape = Scrape::fetch(&sidecar).await;
    assert_eq!(scrape.sum("echomq_redis_errors_total", &[]), 0.0, "{}", scrape.lines_of("redis_errors"));
    assert_eq!(scrape.sum("echomq_redis_command_errors_total", &[]), 0.0, "{}", scrape.lines_of("command_errors"));
}
