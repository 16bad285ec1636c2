//! `echomqctl` end to end: the built binary against a real sidecar and
//! redis-server. Each test checks what the command printed (tables and JSON),
//! its exit code, and what it did (or did not do) in Redis.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use echomq::proto::GroupStart;
use redis::Value;
use serde_json::Value as Json;
use support::*;

/// The longest a one-shot command may run.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// A finished `echomqctl` run.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    #[track_caller]
    fn ok(self) -> Run {
        assert_eq!(self.code, 0, "echomqctl failed: {self:?}");
        self
    }

    /// Standard output as NDJSON: one value per line.
    fn json_lines(&self) -> Vec<Json> {
        self.stdout.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))).collect()
    }

    /// Standard output as one JSON document.
    fn json(&self) -> Json {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{}", self.stdout))
    }
}

/// The binary, with the test process' ECHOMQ_* variables removed.
fn ctl_command(endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_echomqctl"));
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("ECHOMQ_")) {
            cmd.env_remove(key);
        }
    }
    cmd.arg("--endpoint").arg(endpoint).args(args);
    cmd
}

/// Runs `echomqctl --endpoint <endpoint> <args>` to its end, with `stdin`.
async fn ctl_with_stdin(endpoint: &str, args: &[&str], stdin: &str) -> Run {
    let mut cmd = ctl_command(endpoint, args);
    let shown = format!("echomqctl {}", args.join(" "));
    let stdin = stdin.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn echomqctl");
        let _ = child.stdin.take().expect("stdin").write_all(stdin.as_bytes());
        let deadline = Instant::now() + RUN_TIMEOUT;
        while child.try_wait().expect("try_wait").is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!("`{shown}` still ran after {RUN_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = child.wait_with_output().expect("wait");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
    .await
    .expect("join")
}

async fn ctl(endpoint: &str, args: &[&str]) -> Run {
    ctl_with_stdin(endpoint, args, "").await
}

/// Starts a long-running command (a tail) with its output captured.
fn spawn_ctl(endpoint: &str, args: &[&str]) -> Child {
    ctl_command(endpoint, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn echomqctl")
}

/// Waits for a spawned command to end by itself, then collects it.
async fn finish(mut child: Child, within: Duration) -> Run {
    let status = wait_child(&mut child, within).await;
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("wait");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(status.is_some(), "echomqctl still ran after {within:?}: {run:?}");
    run
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("kill");
    assert!(status.success());
}

/// The line of a two-column report whose first words are `label`, as its value.
fn row<'a>(text: &'a str, label: &str) -> &'a str {
    text.lines()
        .find_map(|line| line.strip_prefix(label).filter(|rest| rest.starts_with("  ")).map(str::trim))
        .unwrap_or_else(|| panic!("no `{label}` line in\n{text}"))
}

/// XINFO GROUPS of one group, the fields a peek must not move, and the PEL.
async fn group_state(con: &mut redis::aio::MultiplexedConnection, stream: &str, group: &str) -> String {
    let all = groups(con, stream).await;
    let g = &all[group];
    let pick = |k: &str| format!("{k}={:?}", g.get(k).unwrap_or(&Value::Nil));
    let pel = pending_entries(con, stream, group).await;
    format!(
        "{} {} {} {:?}",
        pick("pending"),
        pick("last-delivered-id"),
        pick("entries-read"),
        pel.iter().map(|p| (p.stream_id.clone(), p.consumer.clone(), p.deliveries)).collect::<Vec<_>>()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_prints_the_groups_state_as_a_table_and_as_json() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::named("pod-d")).await;
    let (appended, _call) = two_held_of_five(&sidecar).await;

    let table = ctl(&sidecar.endpoint(), &["describe", "s", "g"]).await.ok().stdout;
    assert_eq!(row(&table, "pending"), "2");
    assert_eq!(row(&table, "lag"), "3");
    assert_eq!(row(&table, "stream length"), "5");
    assert_eq!(row(&table, "last delivered"), appended[1].stream_id);
    assert!(row(&table, "oldest pending").starts_with(&format!("{} (appended ", appended[0].stream_id)), "{table}");
    assert_eq!(row(&table, "highest delivery count"), "1");
    let consumer =
        table.lines().find(|l| l.starts_with("pod-d")).unwrap_or_else(|| panic!("no consumer row:\n{table}"));
    let cells: Vec<&str> = consumer.split_whitespace().collect();
    assert_eq!(cells[..2], ["pod-d", "2"], "{consumer}");
    assert!(cells[2].ends_with("ms") || cells[2].ends_with('s'), "idle as a duration: {consumer}");

    let json = ctl(&sidecar.endpoint(), &["describe", "s", "g", "--json"]).await.ok().json();
    assert_eq!(json["stream"], "s");
    assert_eq!(json["group"], "g");
    assert_eq!(json["pending"], 2);
    assert_eq!(json["lag"], 3);
    assert_eq!(json["stream_length"], 5);
    assert_eq!(json["last_delivered_id"], appended[1].stream_id.as_str());
    assert_eq!(json["oldest_pending_id"], appended[0].stream_id.as_str());
    assert!(json["oldest_pending_age_ms"].as_u64().is_some(), "{json}");
    assert_eq!(json["max_delivery_count"], 1);
    assert_eq!(json["consumers"][0]["name"], "pod-d");
    assert_eq!(json["consumers"][0]["pending"], 2);
    assert!(json["consumers"][0]["idle_ms"].as_u64().is_some_and(|ms| ms < 60_000), "{json}");
    assert_eq!(json["shards"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_a_sharded_stream_lists_each_shard() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--sharded-streams").arg("orders=2")).await;
    let mut call = Consumer::start(&sidecar, "orders", "g", GroupStart::New, 0).await;
    for i in 0..4 {
        sidecar.append("orders", &[("n", i.to_string().as_bytes())]).await;
    }
    call.deliveries(4, EVENT_TIMEOUT).await;

    let json = ctl(&sidecar.endpoint(), &["describe", "orders", "g", "--json"]).await.ok().json();
    assert_eq!(json["pending"], 4);
    assert_eq!(json["stream_length"], 4);
    let shards: Vec<(&str, u64)> = json["shards"]
        .as_array()
        .expect("shards")
        .iter()
        .map(|s| (s["stream"].as_str().unwrap(), s["pending"].as_u64().unwrap()))
        .collect();
    assert_eq!(shards, vec![("orders:{orders:0}", 2), ("orders:{orders:1}", 2)]);

    let table = ctl(&sidecar.endpoint(), &["describe", "orders", "g"]).await.ok().stdout;
    assert!(table.contains("SHARD"), "{table}");
    for shard in ["orders:{orders:0}", "orders:{orders:1}"] {
        let line = table.lines().find(|l| l.starts_with(shard)).unwrap_or_else(|| panic!("no {shard} row:\n{table}"));
        assert_eq!(line.split_whitespace().nth(1), Some("2"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_takes_fields_from_flags() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let run = ctl(
        &sidecar.endpoint(),
        &["append", "s", "-f", "sku=A-1", "--field", "note=two words=yes", "--field-base64", "bin=/wA=", "--json"],
    )
    .await
    .ok();

    let out = &run.json_lines()[0];
    let entries = xrange(&mut con, "s").await;
    assert_eq!(entries.len(), 1);
    assert_eq!(out["stream"], "s");
    assert_eq!(out["stream_id"], entries[0].stream_id.as_str());
    assert_eq!(entries[0].field("id"), Some(out["id"].as_str().unwrap().as_bytes()), "the branded id it printed");
    assert_eq!(entries[0].field("sku"), Some(&b"A-1"[..]));
    assert_eq!(entries[0].field("note"), Some(&b"two words=yes"[..]));
    assert_eq!(entries[0].field("bin"), Some(&[0xff, 0x00][..]));

    let table = ctl(&sidecar.endpoint(), &["append", "s", "-f", "k=v"]).await.ok().stdout;
    let entries = xrange(&mut con, "s").await;
    assert_eq!(entries.len(), 2);
    assert!(table.starts_with("STREAM"), "{table}");
    assert!(table.contains(&entries[1].stream_id), "{table}");
}

/// `--dedup-key`: a repeat prints the first append's ids as DUPLICATE and
/// writes nothing; JSON input gives each entry its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_with_a_dedup_key_writes_once() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let first = ctl(&sidecar.endpoint(), &["append", "s", "-f", "k=v", "--dedup-key", "order-1", "--json"]).await.ok();
    let again = ctl(&sidecar.endpoint(), &["append", "s", "-f", "k=w", "--dedup-key", "order-1"]).await.ok().stdout;
    assert_eq!(first.json_lines()[0]["duplicate"], false);
    assert!(again.contains("DUPLICATE") && again.contains("yes"), "{again}");
    assert!(again.contains(first.json_lines()[0]["id"].as_str().unwrap()), "the first append's id: {again}");
    assert_eq!(xlen(&mut con, "s").await, 1);

    let stdin = "{\"fields\": {\"k\": \"a\"}, \"dedup_key\": \"order-1\"}\n{\"fields\": {\"k\": \"b\"}, \"dedup_key\": \"order-2\"}\n";
    let run = ctl_with_stdin(&sidecar.endpoint(), &["append", "s", "--json", "--from-json", "-"], stdin).await.ok();
    let duplicate: Vec<bool> = run.json_lines().iter().map(|l| l["duplicate"].as_bool().unwrap()).collect();
    assert_eq!(duplicate, [true, false]);
    assert_eq!(xlen(&mut con, "s").await, 2);
}

/// `append --in`/`--at` schedule the entries; `scheduled list` shows them
/// until they enter the stream, `scheduled cancel` removes one (exit 4 once
/// it is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_at_or_in_schedules_and_scheduled_lists_and_cancels() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--schedule-poll-ms").arg("20")).await;
    let endpoint = sidecar.endpoint();
    let mut con = redis.conn().await;

    let later = ctl(&endpoint, &["append", "s", "-f", "k=later", "--in", "2s", "--json"]).await.ok().json_lines();
    assert_eq!(later[0]["scheduled"], true, "{later:?}");
    assert_eq!(later[0]["stream_id"], "", "no stream id until it enters");
    let later_id = later[0]["id"].as_str().unwrap().to_owned();
    let too_far = ctl(&endpoint, &["append", "s", "-f", "k=cancel-me", "--at", "2099-01-01T00:00:00Z"]).await;
    assert_eq!(too_far.code, 5, "beyond 365 days is refused (exit 5): {}", too_far.stderr);
    assert!(too_far.stderr.contains("--at: ") && too_far.stderr.contains("365 days"), "{}", too_far.stderr);
    let tomorrow = (std::time::SystemTime::now() + Duration::from_secs(86_400))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let table = ctl(&endpoint, &["append", "s", "-f", "k=cancel-me", "--at", &tomorrow]).await.ok().stdout;
    assert!(table.contains("SCHEDULED") && table.contains("yes"), "{table}");
    assert_eq!(xlen(&mut con, "s").await, 0, "nothing in the stream yet");

    let listed = ctl(&endpoint, &["scheduled", "list", "s", "--json"]).await.ok();
    let document: Json = serde_json::from_str(&listed.stdout).unwrap();
    assert_eq!(document["total"], 2, "{document}");
    let entries = document["scheduled"].as_array().unwrap();
    assert_eq!(entries[0]["id"], later_id.as_str(), "the first due first: {document}");
    assert_eq!(entries[0]["fields"]["k"], "later");
    let cancel_id = entries[1]["id"].as_str().unwrap().to_owned();
    assert_eq!(entries[1]["fields"]["k"], "cancel-me");

    let cancelled = ctl(&endpoint, &["scheduled", "cancel", "s", &cancel_id]).await.ok().stdout;
    assert!(cancelled.contains("cancelled") && cancelled.contains(&cancel_id), "{cancelled}");
    let again = ctl(&endpoint, &["scheduled", "cancel", "s", &cancel_id]).await;
    assert_eq!(again.code, 4, "not found: {}", again.stderr);

    let started = Instant::now();
    while xlen(&mut con, "s").await < 1 {
        assert!(started.elapsed() < Duration::from_secs(10), "the scheduled entry never entered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = ctl(&endpoint, &["scheduled", "list", "s"]).await.ok().stdout;
    assert!(text.contains("no scheduled entries"), "{text}");
    let read = ctl(&endpoint, &["read", "s", "--json"]).await.ok().json_lines();
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0]["id"], later_id.as_str(), "it carries the branded id append printed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_takes_entries_from_json_and_read_output_round_trips() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let run =
        ctl(&sidecar.endpoint(), &["append", "s", "--json", "--from-json", r#"{"sku": "A-1", "qty": 2}"#]).await.ok();
    assert_eq!(run.json_lines().len(), 1);
    let stdin = "{\"sku\": \"B-2\"}\n{\"sku\": \"C-3\", \"ok\": true}\n";
    let run = ctl_with_stdin(&sidecar.endpoint(), &["append", "s", "--json", "--from-json", "-"], stdin).await.ok();
    assert_eq!(run.json_lines().len(), 2, "two entries, one batch");
    let entries = xrange(&mut con, "s").await;
    let skus: Vec<&[u8]> = entries.iter().map(|e| e.field("sku").unwrap()).collect();
    assert_eq!(skus, vec![&b"A-1"[..], b"B-2", b"C-3"]);
    assert_eq!(entries[0].field("qty"), Some(&b"2"[..]));
    assert_eq!(entries[2].field("ok"), Some(&b"true"[..]));

    // What `read --json` prints appends back as it was, bytes that are not UTF-8 included.
    xadd_raw(&mut con, "s", &[(b"bin", &[0xff, 0xfe]), (b"text", "é \"q\"\n".as_bytes())]).await;
    let read = ctl(&sidecar.endpoint(), &["read", "s", "--json"]).await.ok().stdout;
    ctl_with_stdin(&sidecar.endpoint(), &["append", "copy", "--from-json", "-"], &read).await.ok();
    let copied = xrange(&mut con, "copy").await;
    let original = xrange(&mut con, "s").await;
    assert_eq!(copied.len(), original.len());
    for (copy, orig) in copied.iter().zip(&original) {
        let without_id = |e: &RawEntry| {
            let mut fields: Vec<_> = e.fields.iter().filter(|(k, _)| k != b"id").cloned().collect();
            fields.sort();
            fields
        };
        assert_eq!(without_id(copy), without_id(orig));
    }

    let bad = ctl(&sidecar.endpoint(), &["append", "s", "--from-json", "{\"a\": null}"]).await;
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("field `a`"), "{bad:?}");
    assert_eq!(xlen(&mut con, "s").await, 4, "nothing appended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_by_id_and_by_instant() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    for (id, value) in
        [("1000-0", &b"one"[..]), ("2000-0", b"two words"), ("2000-1", &[0xff, 0x00]), ("3000-0", b"three")]
    {
        xadd_raw_at(&mut con, "s", id, &[(b"v", value)]).await;
    }
    let ids = |run: &Run| -> Vec<String> {
        run.stdout.lines().map(|l| l.split_whitespace().next().unwrap().to_owned()).collect()
    };

    let one = ctl(&sidecar.endpoint(), &["read", "s", "--id", "2000-0"]).await.ok();
    assert_eq!(one.stdout.trim(), format!("2000-0  {}  v=\"two words\"", branded_from_stream_id("2000-0")));
    let bytes = ctl(&sidecar.endpoint(), &["read", "s", "--id", "2000-1"]).await.ok();
    assert!(bytes.stdout.trim().ends_with("v=base64:/wA="), "{bytes:?}");
    let missing = ctl(&sidecar.endpoint(), &["read", "s", "--id", "2500-0"]).await;
    assert_eq!(missing.code, 4, "{missing:?}");
    assert!(missing.stdout.is_empty());

    let since = ctl(&sidecar.endpoint(), &["read", "s", "--since", "1970-01-01T00:00:02Z"]).await.ok();
    assert_eq!(ids(&since), ["2000-0", "2000-1", "3000-0"]);
    let until = ctl(&sidecar.endpoint(), &["read", "s", "--until", "1970-01-01T00:00:02.500Z"]).await.ok();
    assert_eq!(ids(&until), ["1000-0", "2000-0", "2000-1"]);
    let window = ctl(&sidecar.endpoint(), &["read", "s", "--since", "2000", "--until", "2000", "--json"]).await.ok();
    let lines = window.json_lines();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["stream_id"], "2000-0");
    assert_eq!(lines[0]["minted_at_ms"], 2000);
    assert_eq!(lines[0]["fields"]["v"], "two words");
    assert_eq!(lines[1]["fields_base64"]["v"], "/wA=");
    let by_ids =
        ctl(&sidecar.endpoint(), &["read", "s", "--from", "2000-1", "--to", "3000", "--count", "1"]).await.ok();
    assert_eq!(ids(&by_ids), ["2000-1"]);
    let bad = ctl(&sidecar.endpoint(), &["read", "s", "--from", "nonsense"]).await;
    assert_eq!(bad.code, 2, "a usage error, found before any call: {bad:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_takes_the_branded_id_every_tool_prints() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = [
        sidecar.append("s", &[("k", b"a")]).await,
        sidecar.append("s", &[("k", b"b")]).await,
        sidecar.append("s", &[("k", b"c")]).await,
    ];
    let endpoint = sidecar.endpoint();

    let one = ctl(&endpoint, &["read", "s", "--id", &appended[1].id, "--json"]).await.ok().json();
    assert_eq!(one["id"], appended[1].id.as_str());
    assert_eq!(one["stream_id"], appended[1].stream_id.as_str());
    assert_eq!(one["fields"]["k"], "b");
    let range = ctl(&endpoint, &["read", "s", "--from", &appended[1].id, "--to", &appended[2].id, "--json"]).await.ok();
    let ids: Vec<Json> = range.json_lines().iter().map(|e| e["id"].clone()).collect();
    assert_eq!(ids, [appended[1].id.as_str(), appended[2].id.as_str()]);

    // A branded id that no entry of this stream was minted with: not found, saying which.
    let elsewhere = branded_from_stream_id("1000-7");
    let missing = ctl(&endpoint, &["read", "s", "--id", &elsewhere]).await;
    assert_eq!(missing.code, 4, "{missing:?}");
    assert!(missing.stderr.contains(&format!("no entry with branded id {elsewhere}")), "{missing:?}");

    // Neither form, or the id no entry can have: usage errors (exit code 2) that say what an id looks like.
    let upper = appended[0].id.to_uppercase();
    for (bad, says) in [
        ("x-1", "is not an entry id: expected a stream id"),
        (&appended[0].id[..27], "27 hex characters, but a branded id has 28"),
        (&upper, "branded ids are lowercase"),
        ("0000000000000000000000000000", "names no entry"),
        ("0-0", "names no entry"),
    ] {
        let refused = ctl(&endpoint, &["read", "s", "--id", bad]).await;
        assert_eq!(refused.code, 2, "{bad}: {refused:?}");
        assert!(refused.stderr.contains("--id") && refused.stderr.contains(says), "{bad}: {refused:?}");
        assert!(refused.stdout.is_empty(), "{bad}: {refused:?}");
    }
    // As a bound, 0-0 is before every entry.
    let all = ctl(&endpoint, &["read", "s", "--from", "0000000000000000000000000000", "--json"]).await.ok();
    assert_eq!(all.json_lines().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_removes_the_oldest_and_is_held_back_by_a_group() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    for id in 1..=5 {
        xadd_raw_at(&mut con, "s", &format!("{id}-0"), &[(b"k", b"v")]).await;
    }

    let run = ctl(&sidecar.endpoint(), &["trim", "s", "--max-len", "3"]).await.ok();
    assert!(run.stdout.starts_with("trimmed 2 entries from s"), "{run:?}");
    assert_eq!(xlen(&mut con, "s").await, 3);

    create_group(&mut con, "s", "g", "0").await; // has read nothing yet
    let held = ctl(&sidecar.endpoint(), &["trim", "s", "--min-id", "5-0", "--json"]).await.ok().json();
    assert_eq!(held["trimmed"], 0);
    assert_eq!(held["held_back_by_groups"], true);
    assert_eq!(xlen(&mut con, "s").await, 3);
    let forced =
        ctl(&sidecar.endpoint(), &["trim", "s", "--min-id", "5-0", "--ignore-groups", "--json"]).await.ok().json();
    assert_eq!(forced["trimmed"], 2);
    assert_eq!(forced["applied_min_id"], "5-0");
    assert_eq!(xlen(&mut con, "s").await, 1);

    let no_bound = ctl(&sidecar.endpoint(), &["trim", "s"]).await;
    assert_eq!(no_bound.code, 2, "exactly one bound is required: {no_bound:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_destroy_is_refused_while_entries_are_pending_unless_forced() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    for id in 1..=2 {
        xadd_raw_at(&mut con, "s", &format!("{id}-0"), &[(b"k", b"v")]).await;
    }
    create_group(&mut con, "s", "g", "0").await;
    create_group(&mut con, "s", "other", "0").await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg(&["GROUP", "g", "c", "COUNT", "1", "STREAMS", "s", ">"])
        .query_async(&mut con)
        .await
        .unwrap();

    let refused = ctl(&sidecar.endpoint(), &["group", "destroy", "s", "g"]).await;
    assert_eq!(refused.code, 5, "FAILED_PRECONDITION is a refusal: {refused:?}");
    assert!(refused.stderr.contains("pending"), "{refused:?}");

    let forced = ctl(&sidecar.endpoint(), &["group", "destroy", "s", "g", "--force", "--json"]).await.ok().json();
    assert_eq!(forced["pending_dropped"], 1);
    let groups: Vec<Vec<Value>> = redis::cmd("XINFO").arg(&["GROUPS", "s"]).query_async(&mut con).await.unwrap();
    assert_eq!(groups.len(), 1, "only `other` is left: {groups:?}");
    assert_eq!(xlen(&mut con, "s").await, 2, "the entries stay");

    let gone = ctl(&sidecar.endpoint(), &["group", "destroy", "s", "g"]).await;
    assert_eq!(gone.code, 4, "NOT_FOUND: {gone:?}");
    let text = ctl(&sidecar.endpoint(), &["group", "destroy", "s", "other"]).await.ok();
    assert!(text.stdout.starts_with("destroyed group other of s"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_archive_trim_folds_describe_shows_it_and_read_marks_archived_entries() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("ctl-archive");
    let options = SidecarOptions {
        extra_args: vec!["--archive-url".to_owned(), format!("file://{}", dir.path().display())],
        ..SidecarOptions::default()
    };
    let sidecar = Sidecar::start(&redis, options).await;
    let appended = sidecar.append_numbered("s", 5).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "$").await;

    // Nothing archived yet: the rows are there, empty.
    let table = ctl(&sidecar.endpoint(), &["describe", "s", "g"]).await.ok().stdout;
    assert_eq!(row(&table, "archived entries"), "0");
    assert_eq!(row(&table, "oldest archived"), "-");

    let trim = ctl(&sidecar.endpoint(), &["trim", "s", "--max-len", "2"]).await.ok();
    assert!(trim.stdout.starts_with("trimmed 3 entries from s"), "{trim:?}");
    assert!(trim.stdout.contains("archived 3 entries first"), "{trim:?}");
    assert_eq!(xlen(&mut con, "s").await, 2);

    let table = ctl(&sidecar.endpoint(), &["describe", "s", "g"]).await.ok().stdout;
    assert_eq!(row(&table, "archived entries"), "3");
    assert_eq!(row(&table, "archive files"), "1");
    assert!(row(&table, "archive bytes").parse::<u64>().unwrap() > 0, "{table}");
    assert_eq!(row(&table, "oldest archived"), appended[0].stream_id);
    assert_eq!(row(&table, "archived through"), appended[2].stream_id);
    assert_eq!(row(&table, "last fold error"), "-");
    let json = ctl(&sidecar.endpoint(), &["describe", "s", "g", "--json"]).await.ok().json();
    let archive = &json["archive"];
    assert_eq!(archive["entries"], 3, "{json}");
    assert_eq!(archive["files"], 1);
    assert!(archive["bytes"].as_u64().is_some_and(|b| b > 0), "{json}");
    assert_eq!(archive["oldest_id"], appended[0].stream_id.as_str());
    assert_eq!(archive["archived_through"], appended[2].stream_id.as_str());
    assert_eq!(archive["last_error"], Json::Null);

    // Read spans both: the archived entries say so, the live ones do not.
    let lines = ctl(&sidecar.endpoint(), &["read", "s"]).await.ok().stdout;
    let lines: Vec<&str> = lines.lines().collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    for (i, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("{}  {}  n=\"{i}\"", appended[i].stream_id, appended[i].id)), "{line}");
        assert_eq!(line.ends_with("  [archived]"), i < 3, "{line}");
    }
    let entries = ctl(&sidecar.endpoint(), &["read", "s", "--json"]).await.ok().json_lines();
    let marked: Vec<bool> = entries.iter().map(|e| e["archived"] == Json::Bool(true)).collect();
    assert_eq!(marked, [true, true, true, false, false]);
    assert!(entries[3].get("archived").is_none(), "a live entry carries no archived key: {}", entries[3]);
    assert_eq!(entries[0]["id"], appended[0].id.as_str());
    // One archived entry by id.
    let one = ctl(&sidecar.endpoint(), &["read", "s", "--id", &appended[1].stream_id, "--json"]).await.ok().json();
    assert_eq!(one["archived"], true);
    assert_eq!(one["fields"]["n"], "1");
    // What `read --json` prints of archived entries appends back as it is (the flag is ignored).
    let read = ctl(&sidecar.endpoint(), &["read", "s", "--json"]).await.ok().stdout;
    ctl_with_stdin(&sidecar.endpoint(), &["append", "copy", "--from-json", "-"], &read).await.ok();
    assert_eq!(xlen(&mut con, "copy").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_peeks_without_taking_entries_from_a_group() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(sidecar.append("s", &[("n", i.to_string().as_bytes())]).await);
    }
    create_group(&mut con, "s", "g", "0").await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("c")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg("s")
        .arg(">")
        .query_async(&mut con)
        .await
        .expect("XREADGROUP");
    let before = group_state(&mut con, "s", "g").await;

    let run = ctl(&sidecar.endpoint(), &["tail", "s", "--from-start", "--count", "3", "--json"]).await.ok();
    let ids: Vec<String> = run.json_lines().iter().map(|l| l["id"].as_str().unwrap().to_owned()).collect();
    let want: Vec<String> = appended.iter().map(|a| a.id.clone()).collect();
    assert_eq!(ids, want, "every entry, the pending one and the unread ones");
    assert_eq!(group_state(&mut con, "s", "g").await, before, "a peek takes nothing from the group");

    // Following: an entry appended while it waits is printed.
    let follower = spawn_ctl(&sidecar.endpoint(), &["tail", "s", "--count", "1", "--interval-ms", "50"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = sidecar.append("s", &[("n", b"later")]).await;
    let run = finish(follower, EVENT_TIMEOUT).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), format!("{}  {}  n=\"later\"", later.stream_id, later.id));
    assert_eq!(group_state(&mut con, "s", "g").await, before, "following takes nothing either");
    assert_eq!(pending_count(&mut con, "s", "g").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_with_group_and_ack_consumes_what_it_prints() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut appended = Vec::new();
    for i in 0..3 {
        appended.push(sidecar.append("s", &[("n", i.to_string().as_bytes())]).await);
    }

    let run = ctl(
        &sidecar.endpoint(),
        &["tail", "s", "--group", "g", "--ack", "--group-start", "beginning", "--count", "3", "--json"],
    )
    .await
    .ok();

    let lines = run.json_lines();
    let ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    let want: Vec<&str> = appended.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, want);
    assert!(lines.iter().all(|l| l["group"] == "g" && l["attempts"] == 1), "{lines:?}");
    assert!(run.stderr.contains("entries printed are acknowledged"), "{run:?}");
    assert_eq!(pending_count(&mut con, "s", "g").await, 0, "every printed entry is acknowledged");
    assert_eq!(last_delivered_id(&mut con, "s", "g").await, appended[2].stream_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_ends_cleanly_on_ctrl_c() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;

    let peek = spawn_ctl(&sidecar.endpoint(), &["tail", "s", "--interval-ms", "50"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(&peek, "INT");
    let run = finish(peek, EVENT_TIMEOUT).await;
    assert_eq!(run.code, 0, "{run:?}");

    sidecar.append("s", &[("k", b"v")]).await;
    let consume = spawn_ctl(&sidecar.endpoint(), &["tail", "s", "--group", "g", "--ack", "--group-start", "beginning"]);
    assert!(
        eventually(EVENT_TIMEOUT, || {
            let mut con = con.clone();
            async move { groups(&mut con, "s").await.contains_key("g") && pending_count(&mut con, "s", "g").await == 0 }
        })
        .await
    );
    assert!(
        eventually(EVENT_TIMEOUT, || {
            let mut con = con.clone();
            async move { last_delivered_id(&mut con, "s", "g").await != "0-0" }
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(&consume, "INT");
    let run = finish(consume, EVENT_TIMEOUT).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.lines().count(), 1, "{run:?}");
    assert_eq!(pending_count(&mut con, "s", "g").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_ends_quietly_when_its_output_closes() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let first = sidecar.append("s", &[("k", b"first")]).await;

    let mut tail = spawn_ctl(&sidecar.endpoint(), &["tail", "s", "--from-start", "--interval-ms", "50"]);
    let stdout = tail.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read a line");
        line // the reader, and with it the pipe, is closed here: `| head -n 1`
    })
    .await
    .expect("join");
    assert!(line.starts_with(&first.stream_id), "{line:?}");
    sidecar.append("s", &[("k", b"second")]).await; // its write finds the pipe closed
    let run = finish(tail, EVENT_TIMEOUT).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.is_empty(), "quietly: {run:?}");
}

/// `tail --group --ack | head -n 1`: the acks sent before the pipe closed are
/// settled before the command ends (they were dropped with the call), and an
/// entry whose line could not be written is not acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_group_settles_its_acks_when_its_output_closes() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let first = sidecar.append("s", &[("k", b"first")]).await;

    let mut tail =
        spawn_ctl(&sidecar.endpoint(), &["tail", "s", "--group", "g", "--ack", "--group-start", "beginning"]);
    let stdout = tail.stdout.take().expect("stdout");
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read a line");
        line // `| head -n 1`: the pipe closes here
    })
    .await
    .expect("join");
    assert!(line.starts_with(&first.stream_id), "{line:?}");
    let second = sidecar.append("s", &[("k", b"second")]).await; // its write finds the pipe closed
    let run = finish(tail, EVENT_TIMEOUT).await;

    assert_eq!(run.code, 0, "{run:?}");
    let pending = pending_entries(&mut con, "s", "g").await;
    let pending: Vec<&str> = pending.iter().map(|p| p.stream_id.as_str()).collect();
    assert_eq!(pending, vec![second.stream_id.as_str()], "the printed entry acked, the unwritten one pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_and_replayed() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;
    for (d, reason) in call.deliveries(2, EVENT_TIMEOUT).await.iter().zip(["cannot parse", "bad sku"]) {
        call.dead_letter(&d.id, reason).await;
    }
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    drop(call);

    let listed = ctl(&sidecar.endpoint(), &["dlq", "list", "s", "--json"]).await.ok().json();
    let letters = listed["dead_letters"].as_array().expect("dead_letters");
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0]["id"], a.id.as_str());
    assert_eq!(letters[0]["source_stream"], "s");
    assert_eq!(letters[0]["source_id"], a.stream_id.as_str());
    assert_eq!(letters[0]["group"], "g");
    assert_eq!(letters[0]["attempts"], 1);
    assert_eq!(letters[0]["reason"], "cannot parse");
    assert_eq!(letters[0]["fields"]["k"], "a");
    assert!(letters[0]["dead_lettered_at_ms"].as_u64().is_some());
    assert_eq!(letters[1]["id"], b.id.as_str());
    assert_eq!(listed["next_start_id"], Json::Null);
    let first = letters[0]["dead_letter_id"].as_str().unwrap().to_owned();

    let table = ctl(&sidecar.endpoint(), &["dlq", "list", "s"]).await.ok().stdout;
    assert!(table.contains("\"cannot parse\"") && table.contains("k=\"b\""), "{table}");

    let replayed = ctl(&sidecar.endpoint(), &["dlq", "replay", "s", &first]).await.ok().stdout;
    assert!(replayed.contains(&first) && replayed.contains(&a.id), "{replayed}");
    let back = xrange(&mut con, "s").await;
    assert_eq!(back.len(), 3, "the dead letter is back in the stream");
    assert_eq!(back[2].field("id"), Some(a.id.as_bytes()), "with its branded id");
    assert_eq!(xlen(&mut con, "s:dlq").await, 1);

    let again = ctl(&sidecar.endpoint(), &["dlq", "replay", "s", &first]).await;
    assert_eq!(again.code, 4, "no longer in the dead-letter stream: {again:?}");
    let rest = ctl(&sidecar.endpoint(), &["dlq", "replay", "s", "--count", "10", "--json"]).await.ok().json();
    assert_eq!(rest["replayed"][0]["id"], b.id.as_str());
    assert_eq!(xlen(&mut con, "s:dlq").await, 0);
    let none = ctl(&sidecar.endpoint(), &["dlq", "replay", "s"]).await;
    assert_eq!(none.code, 2, "ids or --count are required: {none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_replayed_by_their_branded_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let mut call = Consumer::start(&sidecar, "s", "g", GroupStart::New, 0).await;
    let a = sidecar.append("s", &[("k", b"a")]).await;
    let b = sidecar.append("s", &[("k", b"b")]).await;
    for d in call.deliveries(2, EVENT_TIMEOUT).await {
        call.dead_letter(&d.id, "poison").await;
    }
    assert_eq!(wait_pending(&mut con, "s", "g", 0, EVENT_TIMEOUT).await, 0);
    drop(call);
    let endpoint = sidecar.endpoint();

    let replayed = ctl(&endpoint, &["dlq", "replay", "s", &b.id, "--json"]).await.ok().json();
    assert_eq!(replayed["replayed"].as_array().unwrap().len(), 1, "{replayed}");
    assert_eq!(replayed["replayed"][0]["id"], b.id.as_str());
    let back = xrange(&mut con, "s").await;
    assert_eq!(back.len(), 3);
    assert_eq!(back[2].field("id"), Some(b.id.as_bytes()), "b is back in the stream");
    assert_eq!(xlen(&mut con, "s:dlq").await, 1, "a is still dead-lettered");

    // Replayed already, or never dead-lettered: not found, and nothing else is replayed.
    let again = ctl(&endpoint, &["dlq", "replay", "s", &b.id, "--json"]).await;
    assert_eq!(again.code, 4, "{again:?}");
    assert_eq!(again.json()["not_found_ids"][0], b.id.as_str());
    assert_eq!(xlen(&mut con, "s:dlq").await, 1, "an unknown branded id replays nothing else");

    for bad in ["nonsense", "0000000000000000000000000000"] {
        let refused = ctl(&endpoint, &["dlq", "replay", "s", bad]).await;
        assert_eq!(refused.code, 2, "{bad}: {refused:?}");
        assert!(refused.stderr.contains(bad), "{bad}: {refused:?}");
    }
    let list_from = ctl(&endpoint, &["dlq", "list", "s", "--from", &a.id]).await;
    assert_eq!(list_from.code, 2, "{list_from:?}");
    assert!(list_from.stderr.contains("takes a dead-letter stream id"), "{list_from:?}");
    assert_eq!(xlen(&mut con, "s:dlq").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_say_what_failed() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    sidecar.append("s", &[("k", b"v")]).await;

    let nobody = format!("http://127.0.0.1:{}", free_port());
    let unreachable = ctl(&nobody, &["describe", "s", "g"]).await;
    assert_eq!(unreachable.code, 3, "{unreachable:?}");
    assert!(unreachable.stderr.contains("unreachable"), "{unreachable:?}");

    for (args, flag) in [
        (&["read", "s", "--since", "yesterday"][..], "--since"),
        (&["tail", "s", "--group", "g"], "--ack"),
        (&["describe", "s"], "<GROUP>"),
        (&["nonsense"], "nonsense"),
    ] {
        let bad = ctl(&sidecar.endpoint(), args).await;
        assert_eq!(bad.code, 2, "{args:?}: {bad:?}");
        assert!(bad.stderr.contains(flag), "{args:?}: {bad:?}");
    }
    let bad_endpoint = ctl("ftp://x:1", &["describe", "s", "g"]).await;
    assert_eq!(bad_endpoint.code, 2, "{bad_endpoint:?}");

    let missing = ctl(&sidecar.endpoint(), &["describe", "s", "nope"]).await;
    assert_eq!(missing.code, 4, "NOT_FOUND: {missing:?}");
    let refused = ctl(&sidecar.endpoint(), &["describe", "s", ""]).await;
    assert_eq!(refused.code, 5, "INVALID_ARGUMENT: {refused:?}");
    // Ids are checked before any call: a usage error naming the flag, not a field of the request.
    for (args, flag) in [
        (&["read", "s", "--id", "x-1"][..], "--id <ID>"),
        (&["read", "s", "--from", "x-1"], "--from <FROM>"),
        (&["read", "s", "--to", "1-x"], "--to <TO>"),
        (&["trim", "s", "--min-id", "x"], "--min-id <MIN_ID>"),
        (&["tail", "s", "--from", "x"], "--from <FROM>"),
        (&["dlq", "list", "s", "--from", "x"], "--from <FROM>"),
    ] {
        let bad = ctl(&sidecar.endpoint(), args).await;
        assert_eq!(bad.code, 2, "{args:?}: {bad:?}");
        assert!(bad.stderr.contains(flag) && bad.stderr.contains("is not an entry id"), "{args:?}: {bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_sent_and_a_missing_one_exits_6() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("ctl-token");
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token = token.to_str().unwrap();
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--auth-token-file").arg(token)).await;

    let denied = ctl(&sidecar.endpoint(), &["append", "s", "-f", "k=v"]).await;
    assert_eq!(denied.code, 6, "{denied:?}");
    ctl(&sidecar.endpoint(), &["--auth-token-file", token, "append", "s", "-f", "k=v"]).await.ok();
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_unix_socket_endpoints_work() {
    let pki = TestPki::new("ctl");
    let server = pki.server_cert();
    let redis = RedisServer::start().await;
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let options = SidecarOptions::default()
        .arg("--tls-cert-file")
        .arg(&path(&server.cert))
        .arg("--tls-key-file")
        .arg(&path(&server.key));
    let sidecar = Sidecar::start(&redis, options).await;
    let ca = path(pki.ca_cert());
    ctl(&sidecar.https_endpoint(), &["--tls-ca-file", &ca, "append", "s", "-f", "k=tls"]).await.ok();
    let untrusted = ctl(&sidecar.https_endpoint(), &["append", "s", "-f", "k=v"]).await;
    assert_ne!(untrusted.code, 0, "the system's roots do not trust the test CA: {untrusted:?}");
    let plain_with_ca = ctl(&sidecar.endpoint(), &["--tls-ca-file", &ca, "append", "s", "-f", "k=v"]).await;
    assert_eq!(plain_with_ca.code, 2, "TLS options with http:// are a usage error: {plain_with_ca:?}");

    let unix = Sidecar::start(&redis, SidecarOptions { unix_socket: true, ..SidecarOptions::default() }).await;
    let socket = format!("unix:{}", unix.unix_path().unwrap().display());
    ctl(&socket, &["append", "s", "-f", "k=unix"]).await.ok();
    let mut con = redis.conn().await;
    let values: Vec<Vec<u8>> = xrange(&mut con, "s").await.iter().map(|e| e.field("k").unwrap().to_vec()).collect();
    assert_eq!(values, vec![b"tls".to_vec(), b"unix".to_vec()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_presents_the_client_certificate() {
    let pki = TestPki::new("ctl-mtls");
    let (server, client) = (pki.server_cert(), pki.client_cert("ctl-client", &["URI:spiffe://test/ctl"]));
    let redis = RedisServer::start().await;
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let ca = path(pki.ca_cert());
    let options = SidecarOptions::default()
        .arg("--tls-cert-file")
        .arg(&path(&server.cert))
        .arg("--tls-key-file")
        .arg(&path(&server.key))
        .arg("--tls-client-ca-file")
        .arg(&ca);
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;

    let without = ctl(&sidecar.https_endpoint(), &["--tls-ca-file", &ca, "append", "s", "-f", "k=v"]).await;
    assert_ne!(without.code, 0, "no client certificate, no call: {without:?}");
    assert_eq!(xlen(&mut con, "s").await, 0);
    let (cert, key) = (path(&client.cert), path(&client.key));
    let with = ["--tls-ca-file", &ca, "--tls-cert-file", &cert, "--tls-key-file", &key, "append", "s", "-f", "k=v"];
    ctl(&sidecar.https_endpoint(), &with).await.ok();
    assert_eq!(xlen(&mut con, "s").await, 1);
    let half =
        ctl(&sidecar.https_endpoint(), &["--tls-ca-file", &ca, "--tls-cert-file", &cert, "describe", "s", "g"]).await;
    assert_eq!(half.code, 2, "a certificate without its key is a usage error: {half:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_for_bash_complete_every_command() {
    let run = ctl("http://127.0.0.1:1", &["completions", "bash"]).await.ok();
    for word in ["describe", "tail", "append", "dlq", "replay", "read", "trim", "--endpoint", "--json"] {
        assert!(run.stdout.contains(word), "{word} missing from the bash completions");
    }
    let dir = TempDir::new("ctl-completions");
    let script = dir.path().join("echomqctl.bash");
    std::fs::write(&script, &run.stdout).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p echomqctl", script.display()))
        .output()
        .expect("run bash");
    assert!(out.status.success(), "bash could not load it: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("_echomqctl"), "{out:?}");

    let help = ctl("http://127.0.0.1:1", &["--help"]).await.ok().stdout;
    assert!(help.contains("Exit codes:") && help.contains("6  denied"), "{help}");
}
