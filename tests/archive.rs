//! The archive through the sidecar (`--archive-url`): Trim and `--retention`
//! fold what they remove into Parquet files first (file → manifest → XTRIM),
//! Read spans the archive and the stream, a crash at each step loses nothing
//! and archives nothing twice, and a store that refuses writes stops the
//! trimming, visibly, without making the sidecar unready. Against a local
//! directory and a real S3-compatible server (MinIO), with DuckDB reading the
//! files as they are.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use std::{collections::BTreeSet, path::Path, time::Duration};

use echomq::{
    archive::{Archive, Manifest},
    id::StreamId,
    proto::{AppendRequest, DescribeGroupRequest, Entry, GroupStart, ReadRequest, TrimRequest},
};
use support::{archive_tools::*, *};
use tonic::Code;

/// Options for a sidecar that archives into `url`, with `env` (AWS_*).
fn archiving(url: &str, env: Vec<(String, String)>, extra: &[&str]) -> SidecarOptions {
    let mut extra_args = vec!["--archive-url".to_owned(), url.to_owned()];
    extra_args.extend(extra.iter().map(|s| (*s).to_owned()));
    SidecarOptions { extra_args, env, ..SidecarOptions::default() }
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// Appends `n` entries to `stream` through the sidecar, each with a text
/// field `k` (its index) and a binary one; then two by hand (XADD) with a
/// name that is not UTF-8 and a repeated name. Returns the stream ids.
async fn append_awkward(sidecar: &Sidecar, redis: &RedisServer, stream: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut client = sidecar.stream_client().await;
    for k in 0..n {
        let request = AppendRequest {
            stream: stream.into(),
            fields: fields(&[("k", k.to_string().as_bytes()), ("bin", &[0, 255, k as u8])]),
            ..Default::default()
        };
        ids.push(client.append(request).await.expect("append").into_inner().stream_id);
    }
    let mut con = redis.conn().await;
    for value in [&b"\xff\x00"[..], b""] {
        let id: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg(&b"\xfe name"[..])
            .arg(value)
            .arg("dup")
            .arg("a")
            .arg("dup")
            .arg("b")
            .query_async(&mut con)
            .await
            .expect("XADD");
        ids.push(id);
    }
    ids
}

/// Every entry of `stream` Read returns, paging `page` at a time.
async fn read_all(sidecar: &Sidecar, stream: &str, page: u32) -> Vec<Entry> {
    let mut client = sidecar.stream_client().await;
    let (mut entries, mut start) = (Vec::new(), String::new());
    loop {
        let request = ReadRequest { stream: stream.into(), start_id: start, count: page, ..Default::default() };
        let response = client.read(request).await.expect("read").into_inner();
        assert!(response.oversized_ids.is_empty());
        entries.extend(response.entries);
        if response.next_start_id.is_empty() {
            return entries;
        }
        start = response.next_start_id;
    }
}

fn without_flag(entries: &[Entry]) -> Vec<Entry> {
    entries.iter().map(|e| Entry { archived: false, ..e.clone() }).collect()
}

async fn trim(sidecar: &Sidecar, stream: &str, max_len: u64) -> Result<echomq::proto::TrimResponse, tonic::Status> {
    let request = TrimRequest { stream: stream.into(), max_len, ..Default::default() };
    sidecar.stream_client().await.trim(request).await.map(|r| r.into_inner())
}

async fn archive_info(sidecar: &Sidecar, stream: &str) -> echomq::proto::ArchiveInfo {
    let request = DescribeGroupRequest { stream: stream.into(), group: "g".into(), ..Default::default() };
    let response = sidecar.admin_client().await.describe_group(request).await.expect("describe").into_inner();
    response.archive.expect("describe reports the archive")
}

/// Trim folds, then trims; Read returns the same entries as before the trim,
/// in order, none twice, paging across the boundary; describe and the
/// metrics show the archive's extent. Returns the trimmed stream ids.
async fn fold_then_trim_and_read_back(sidecar: &Sidecar, redis: &RedisServer) -> Vec<String> {
    let stream = "orders";
    let mut con = redis.conn().await;
    let ids = append_awkward(sidecar, redis, stream, 40).await;
    // Delivered everything: the safe trim is not held back.
    create_group(&mut con, stream, "g", "$").await;
    let before = read_all(sidecar, stream, 100).await;
    assert_eq!(before.len(), 42);

    let trimmed = trim(sidecar, stream, 10).await.expect("trim");
    assert_eq!((trimmed.trimmed, trimmed.archived), (32, 32), "{trimmed:?}");
    assert_eq!(xlen(&mut con, stream).await, 10);

    for page in [7, 32, 100] {
        let after = read_all(sidecar, stream, page).await;
        assert_eq!(without_flag(&after), before, "page {page}: the same entries, in order, none twice");
        let archived: Vec<bool> = after.iter().map(|e| e.archived).collect();
        assert_eq!(archived, [vec![true; 32], vec![false; 10]].concat(), "page {page}");
    }
    // A range inside the archive, by instant, ends where asked.
    let request =
        ReadRequest { stream: stream.into(), start_id: ids[3].clone(), end_id: ids[5].clone(), ..Default::default() };
    let some = sidecar.stream_client().await.read(request).await.expect("read").into_inner();
    assert_eq!(some.entries.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids[3..=5]);

    // By instant, from inside the archive across the boundary, paging on by id.
    let from_ms: u64 = ids[20].split('-').next().unwrap().parse().unwrap();
    let from = prost_types::Timestamp { seconds: (from_ms / 1000) as i64, nanos: (from_ms % 1000) as i32 * 1_000_000 };
    let expected: Vec<Entry> =
        before.iter().filter(|e| e.stream_id.parse::<StreamId>().unwrap().ms >= from_ms).cloned().collect();
    let mut client = sidecar.stream_client().await;
    let mut request = ReadRequest { stream: stream.into(), start_time: Some(from), count: 4, ..Default::default() };
    let mut by_time = Vec::new();
    loop {
        let page = client.read(request.clone()).await.expect("read by start_time").into_inner();
        by_time.extend(page.entries);
        if page.next_start_id.is_empty() {
            break;
        }
        request = ReadRequest { stream: stream.into(), start_id: page.next_start_id, count: 4, ..Default::default() };
    }
    assert!(by_time.first().is_some_and(|e| e.archived) && by_time.last().is_some_and(|e| !e.archived));
    assert_eq!(without_flag(&by_time), expected, "from {from_ms} ms: archive, then stream, none twice");

    // A second trim archives nothing again.
    let again = trim(sidecar, stream, 5).await.expect("trim");
    assert_eq!((again.trimmed, again.archived), (5, 5));
    assert_eq!(without_flag(&read_all(sidecar, stream, 9).await), before);

    let info = archive_info(sidecar, stream).await;
    assert_eq!((info.entries, info.files), (37, 2), "{info:?}");
    assert_eq!((info.oldest_id.as_str(), info.archived_through.as_str()), (ids[0].as_str(), ids[36].as_str()));
    assert!(info.bytes > 0 && info.last_error.is_empty(), "{info:?}");
    assert_eq!(sidecar.counter("echomq_archive_folded_entries_total").await, 37.0);
    assert_eq!(sidecar.counter("echomq_archive_entries").await, 37.0);
    ids[..37].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_trim_folds_first_and_read_spans_the_archive_and_the_stream() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    fold_then_trim_and_read_back(&sidecar, &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs DuckDB (scripts/install-deps makes .tmp/archive-venv); scripts/test runs it"]
async fn duckdb_reads_exactly_the_entries_a_local_trim_folded() {
    let python = duckdb_python();
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    let trimmed = fold_then_trim_and_read_back(&sidecar, &redis).await;

    // DuckDB sees exactly the entries that were trimmed, as they are.
    let rows = duckdb_rows(&python, dir.path());
    let seen: Vec<String> = rows.iter().map(|row| row[1].as_str().unwrap().to_owned()).collect();
    let mut sorted = seen.clone();
    sorted.sort_by_key(|id| id.parse::<StreamId>().unwrap());
    assert_eq!(sorted, trimmed);
    assert!(rows.iter().all(|row| row[0] == "orders"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MinIO (scripts/install-deps makes .tmp/bin/minio); scripts/test runs it"]
async fn minio_trim_folds_first_and_read_spans_the_archive_and_the_stream() {
    let minio = Minio::start().await;
    let redis = RedisServer::start().await;
    let url = format!("s3://{BUCKET}/sidecar");
    let sidecar = Sidecar::start(&redis, archiving(&url, minio.aws_env(), &[])).await;
    fold_then_trim_and_read_back(&sidecar, &redis).await;
}

/// A store that stops answering (MinIO under SIGSTOP): a Read of the tail,
/// after the archive's end, is served from the stream without asking it; a
/// Read and a Trim that need it fail UNAVAILABLE within the store's bound,
/// not object_store's default minutes; once it answers, both work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MinIO (scripts/install-deps makes .tmp/bin/minio); scripts/test runs it"]
async fn a_stalled_store_leaves_tail_reads_alone_and_fails_the_rest_in_bounded_time() {
    let minio = Minio::start().await;
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, archiving(&format!("s3://{BUCKET}/stall"), minio.aws_env(), &[])).await;
    let ids = append_awkward(&sidecar, &redis, "s", 20).await;
    create_group(&mut redis.conn().await, "s", "g", "$").await;
    assert_eq!(trim(&sidecar, "s", 5).await.expect("trim").archived, 17);

    minio.stall(true);
    let mut client = sidecar.stream_client().await;
    let tail = ReadRequest { stream: "s".into(), start_id: ids[17].clone(), ..Default::default() };
    let read = tokio::time::timeout(Duration::from_secs(5), client.read(tail)).await;
    let page = read.expect("a tail Read does not wait for the store").expect("read").into_inner();
    assert_eq!(page.entries.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids[17..]);

    let started = std::time::Instant::now();
    let whole = ReadRequest { stream: "s".into(), ..Default::default() };
    let refused = client.read(whole.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(!refused.message().contains("trim"), "a Read says nothing of trims: {}", refused.message());
    let refused = trim(&sidecar, "s", 2).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("removed nothing"), "{}", refused.message());
    assert!(started.elapsed() < Duration::from_secs(70), "two calls took {:?}", started.elapsed());
    assert_eq!(xlen(&mut redis.conn().await, "s").await, 5, "nothing trimmed");

    minio.stall(false);
    assert_eq!(client.read(whole).await.expect("read once the store answers").into_inner().entries.len(), 22);
}

/// An entry at or below the archive's end that the archive does not hold (the
/// stream deleted and written again with an id given by hand): Read returns
/// it among the archived ones, and a trim refuses (FAILED_PRECONDITION)
/// rather than remove it into nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_below_the_archive_that_it_lacks_is_read_and_never_trimmed() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    let ids = append_awkward(&sidecar, &redis, "s", 6).await;
    assert_eq!(trim(&sidecar, "s", 1).await.expect("trim").archived, 7);
    let mut con = redis.conn().await;
    let _: i64 = redis::cmd("DEL").arg("s").query_async(&mut con).await.unwrap();
    let low: String = redis::cmd("XADD").arg("s").arg("5-1").arg("low").arg("1").query_async(&mut con).await.unwrap();
    let new: String = redis::cmd("XADD").arg("s").arg("*").arg("new").arg("1").query_async(&mut con).await.unwrap();
    create_group(&mut con, "s", "g", "$").await;

    let all = read_all(&sidecar, "s", 3).await;
    let expected = [vec![low.clone()], ids[..7].to_vec(), vec![new]].concat();
    assert_eq!(all.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), expected);
    assert!(!all[0].archived && all[1..8].iter().all(|e| e.archived) && !all[8].archived);

    let refused = trim(&sidecar, "s", 1).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&low), "names the entry: {}", refused.message());
    assert_eq!(xlen(&mut con, "s").await, 2, "nothing trimmed");
    assert!(archive_info(&sidecar, "s").await.last_error.contains(&low));
}

/// Bounds that remove nothing (`min_id` 0-0, an instant at the epoch) trim
/// nothing, as without an archive, and are no fold failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_that_removes_nothing_is_no_fold_error() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    append_awkward(&sidecar, &redis, "s", 3).await;
    let mut client = sidecar.stream_client().await;
    for request in [
        TrimRequest { stream: "s".into(), min_id: "0-0".into(), ..Default::default() },
        TrimRequest { stream: "s".into(), before: Some(prost_types::Timestamp::default()), ..Default::default() },
    ] {
        let response = client.trim(request.clone()).await.unwrap_or_else(|e| panic!("{request:?}: {e:?}")).into_inner();
        assert_eq!((response.trimmed, response.archived), (0, 0), "{request:?}");
    }
    let mut con = redis.conn().await;
    let _: () = redis::cmd("SET").arg("text").arg("v").query_async(&mut con).await.unwrap();
    let wrong = trim(&sidecar, "text", 1).await.unwrap_err();
    assert_eq!(wrong.code(), Code::FailedPrecondition, "{wrong:?}");
    assert_eq!(sidecar.counter("echomq_archive_fold_errors_total").await, 0.0);
    assert_eq!(xlen(&mut con, "s").await, 5);
}

/// A sidecar without the archive beside one with it (a rolling upgrade that
/// turns the archive on, one replica configured apart) refuses to trim the
/// archived stream, which would remove entries it never archived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_without_the_archive_refuses_to_trim_an_archived_stream() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let archived = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    let plain = Sidecar::start(&redis, SidecarOptions::default()).await;
    let ids = append_awkward(&archived, &redis, "s", 10).await;
    trim(&archived, "s", 6).await.unwrap();

    let refused = trim(&plain, "s", 1).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--archive-url"), "{}", refused.message());
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 6, "nothing trimmed");
    let read: Vec<String> = read_all(&archived, "s", 100).await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(read, ids, "every entry, archived or live");
    // Nor does an Append's cap, which trims inside the append.
    let mut client = plain.stream_client().await;
    let capped = AppendRequest { stream: "s".into(), fields: fields(&[("k", b"v")]), max_len: 1, ..Default::default() };
    let refused = client.append(capped).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--retention"), "{}", refused.message());
    assert_eq!(xlen(&mut con, "s").await, 6, "nothing appended, nothing trimmed");
    // A stream never archived is trimmed by it as before.
    append_awkward(&plain, &redis, "t", 3).await;
    trim(&plain, "t", 1).await.unwrap();
    assert_eq!(xlen(&mut con, "t").await, 1);
}

/// Two sidecars with different archives on one Redis would split a stream's
/// history between them: the second to fold finds the stream trimmed past its
/// archive's end and refuses, trimming nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_with_another_archive_refuses_to_fold_the_stream() {
    let redis = RedisServer::start().await;
    let (one, other) = (TempDir::new("archive"), TempDir::new("archive-other"));
    let first = Sidecar::start(&redis, archiving(&file_url(one.path()), vec![], &[])).await;
    let second = Sidecar::start(&redis, archiving(&file_url(other.path()), vec![], &[])).await;
    let ids = append_awkward(&first, &redis, "s", 10).await;
    trim(&first, "s", 6).await.unwrap();

    let refused = trim(&second, "s", 2).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--archive-url"), "{}", refused.message());
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 6, "nothing trimmed");
    assert_eq!(parquet_files(other.path()), 0, "nothing folded into the other archive");
    let read: Vec<String> = read_all(&first, "s", 100).await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(read, ids);
}

/// `<stream>:archive:through` set by hand to what is no id neither hides the
/// archive from Read nor stops folding: the next trim writes an id again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_archive_end_key_hides_nothing_and_is_rewritten() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    let ids = append_awkward(&sidecar, &redis, "s", 10).await;
    trim(&sidecar, "s", 6).await.unwrap();
    let mut con = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*archive:through").query_async(&mut con).await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let _: () = redis::cmd("SET").arg(&keys[0]).arg("garbage").query_async(&mut con).await.unwrap();

    let read = read_all(&sidecar, "s", 100).await;
    assert_eq!(read.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids);
    assert!(read[0].archived, "the archived entries come from the archive");
    trim(&sidecar, "s", 2).await.unwrap();
    assert_eq!(xlen(&mut con, "s").await, 2);
    let through: String = redis::cmd("GET").arg(&keys[0]).query_async(&mut con).await.unwrap();
    assert!(through.parse::<echomq::id::StreamId>().is_ok(), "{through}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_max_len_is_refused_with_an_archive() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    let request =
        AppendRequest { stream: "s".into(), fields: fields(&[("k", b"v")]), max_len: 10, ..Default::default() };
    let refused = sidecar.stream_client().await.append(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--retention"), "{}", refused.message());
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 0, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_unreachable_archive_url_exits_2_with_the_reason() {
    let dir = TempDir::new("archive");
    let missing = dir.path().join("missing");
    for (url, says) in [("ftp://host/x".to_owned(), "ftp"), (file_url(&missing), "missing")] {
        let mut args = local_args("redis://127.0.0.1:1");
        args.extend(["--archive-url".to_owned(), url.clone()]);
        let out = run_to_exit(&args, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {stderr}");
        assert!(stderr.contains("--archive-url") && stderr.contains(says), "{url}: {stderr}");
    }
}

/// Retention runs on its timer, folds first, and is safe: it keeps what a
/// group has not been delivered; a sharded stream is kept per shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_folds_on_its_timer_and_never_past_what_a_group_needs() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let options = archiving(
        &file_url(dir.path()),
        vec![],
        &[
            "--retention",
            "kept=maxlen:5,sh=maxlen:2",
            "--retention-interval-ms",
            "100",
            "--archive-partial-file-interval-ms",
            "0",
            "--sharded-streams",
            "sh=2",
        ],
    );
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "kept", "g", "$").await;
    let ids = append_awkward(&sidecar, &redis, "kept", 28).await;
    // The group has been delivered nothing: retention keeps it all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(xlen(&mut con, "kept").await, 30, "held back for the group");
    let _: redis::Value =
        redis::cmd("XGROUP").arg("SETID").arg("kept").arg("g").arg("$").query_async(&mut con).await.unwrap();
    assert!(eventually(Duration::from_secs(10), || stream_length_is(&redis, "kept", 5)).await, "{}", sidecar.log());
    let all = read_all(&sidecar, "kept", 8).await;
    assert_eq!(all.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids);
    assert_eq!(all.iter().filter(|e| e.archived).count(), 25);

    // A sharded stream: each shard key keeps its own 2, archived per key.
    let mut client = sidecar.stream_client().await;
    for k in 0..20 {
        let request = AppendRequest {
            stream: "sh".into(),
            fields: fields(&[("k", k.to_string().as_bytes())]),
            ..Default::default()
        };
        client.append(request).await.expect("append");
    }
    let shards = ["sh:{sh:0}", "sh:{sh:1}"];
    let settled = eventually(Duration::from_secs(10), || async {
        stream_length_is(&redis, shards[0], 2).await && stream_length_is(&redis, shards[1], 2).await
    })
    .await;
    assert!(settled, "{}", sidecar.log());
    let archive = Archive::open(&file_url(dir.path())).unwrap();
    let mut total = 0;
    for shard in shards {
        let manifest = archive.manifest(shard).await.unwrap();
        total += manifest.entries();
        assert_eq!(manifest.entries() + 2, read_all(&sidecar, shard, 100).await.len() as u64, "{shard}");
    }
    assert_eq!(total, 16);
}

/// Retention folds whole files and leaves the rest in the stream until the
/// partial-file interval has passed, so a steady stream does not turn into
/// one tiny file per round; a Trim call folds everything it removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_folds_whole_files_and_leaves_the_rest_in_the_stream() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let policy = ["--retention", "s=maxlen:3", "--retention-interval-ms", "50", "--archive-file-entries", "10"];
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &policy)).await;
    let archive = Archive::open(&file_url(dir.path())).unwrap();
    let files = || async { archive.manifest("s").await.unwrap().files.iter().map(|f| f.entries).collect::<Vec<_>>() };
    let mut ids = append_awkward(&sidecar, &redis, "s", 23).await;
    // 22 due: two whole files, two entries left beyond the policy's 3.
    assert!(eventually(Duration::from_secs(10), || stream_length_is(&redis, "s", 5)).await, "{}", sidecar.log());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(files().await, [10, 10]);
    assert_eq!(xlen(&mut redis.conn().await, "s").await, 5, "no partial file within the interval");

    ids.extend(append_awkward(&sidecar, &redis, "s", 6).await);
    assert!(eventually(Duration::from_secs(10), || stream_length_is(&redis, "s", 3)).await, "{}", sidecar.log());
    assert_eq!(files().await, [10, 10, 10]);

    // A Trim folds what it removes, a partial file too.
    assert_eq!(trim(&sidecar, "s", 1).await.expect("trim").archived, 2);
    assert_eq!(files().await, [10, 10, 10, 2]);
    let all = read_all(&sidecar, "s", 7).await;
    assert_eq!(all.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids);
}

/// A kill -9 after the file, after the manifest, or before the trim loses
/// nothing; after a restart nothing is archived twice or read twice, and no
/// file outside the manifest is left for DuckDB to count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_each_step_loses_nothing_and_archives_nothing_twice() {
    for step in ["after_file", "after_manifest", "before_trim"] {
        let redis = RedisServer::start().await;
        let dir = TempDir::new("archive");
        let url = file_url(dir.path());
        let paused = SidecarOptions {
            env: vec![("ECHOMQ_ARCHIVE_PAUSE_AT".into(), step.into())],
            ..archiving(&url, vec![], &["--archive-file-entries", "7"])
        };
        let mut crashing = Sidecar::start(&redis, paused).await;
        let ids = append_awkward(&crashing, &redis, "s", 18).await;
        let client = crashing.stream_client().await;
        let pending_trim = tokio::spawn(async move {
            let mut client = client;
            client.trim(TrimRequest { stream: "s".into(), max_len: 4, ..Default::default() }).await
        });
        let reached =
            eventually(Duration::from_secs(10), || async { crashing.log().contains("paused for a crash test") }).await;
        assert!(reached, "{step}: {}", crashing.log());
        crashing.kill9();
        assert!(pending_trim.await.unwrap().is_err(), "{step}: the trim died with the sidecar");
        let mut con = redis.conn().await;
        assert_eq!(xlen(&mut con, "s").await, 20, "{step}: nothing trimmed before the crash");

        // The lease the dead sidecar held expires; a new sidecar folds on.
        let _: i64 = redis::cmd("DEL").arg("s:archive:lease").query_async(&mut con).await.unwrap();
        let sidecar = Sidecar::start(&redis, archiving(&url, vec![], &["--archive-file-entries", "7"])).await;
        let response = trim(&sidecar, "s", 4).await.expect("trim after the restart");
        assert_eq!(response.trimmed, 16, "{step}: {response:?}");
        assert_eq!(xlen(&mut con, "s").await, 4);

        let all = read_all(&sidecar, "s", 5).await;
        assert_eq!(all.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids, "{step}");
        let archive = Archive::open(&url).unwrap();
        let manifest = archive.manifest("s").await.unwrap();
        let archived = archive.read("s", &manifest, StreamId::ZERO, StreamId::MAX, 1000).await.unwrap();
        let unique: BTreeSet<StreamId> = archived.iter().map(|e| e.id).collect();
        assert_eq!((archived.len(), unique.len()), (16, 16), "{step}: each trimmed entry archived once");
        assert_eq!(parquet_files(dir.path()), manifest.files.len(), "{step}: no orphan beside the manifest's files");
    }
}

async fn stream_length_is(redis: &RedisServer, stream: &str, length: i64) -> bool {
    xlen(&mut redis.conn().await, stream).await == length
}

fn parquet_files(dir: &Path) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            count += parquet_files(&path);
        } else if path.extension().is_some_and(|e| e == "parquet") {
            count += 1;
        }
    }
    count
}

/// An archive that refuses writes pauses trimming: the Trim fails
/// UNAVAILABLE and removes nothing, describe and the metrics say why, the
/// sidecar stays ready; once the store takes writes again, trimming resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_that_refuses_writes_pauses_trimming_visibly() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &[])).await;
    append_awkward(&sidecar, &redis, "s", 10).await;
    create_group(&mut redis.conn().await, "s", "g", "$").await;
    // The stream's directory is a file now: no file can be written under it.
    std::fs::write(dir.path().join("s"), b"in the way").unwrap();

    let refused = trim(&sidecar, "s", 2).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("archive"), "{}", refused.message());
    let mut con = redis.conn().await;
    assert_eq!(xlen(&mut con, "s").await, 12, "nothing trimmed unarchived");
    assert!(!archive_info(&sidecar, "s").await.last_error.is_empty());
    assert!(refused.message().contains("removed nothing"), "{}", refused.message());
    assert_eq!(sidecar.counter("echomq_archive_fold_errors_total").await, 1.0);
    assert_eq!(sidecar.readyz().await, Some(200), "a refusing archive does not make the sidecar unready");

    std::fs::remove_file(dir.path().join("s")).unwrap();
    let response = trim(&sidecar, "s", 2).await.expect("trim once the store takes writes");
    assert_eq!((response.trimmed, response.archived), (10, 10));
    assert!(archive_info(&sidecar, "s").await.last_error.is_empty());
}

/// Two sidecars apply the same retention to one stream while entries keep
/// coming, until both have folded: the fold lease lets one at a time fold, so
/// every entry is in the archive or the stream exactly once, and the two
/// folded, between them, exactly what the archive holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_folding_one_stream_never_archive_an_entry_twice() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let url = file_url(dir.path());
    let policy = [
        "--retention",
        "s=maxlen:3",
        "--retention-interval-ms",
        "20",
        "--archive-file-entries",
        "5",
        "--archive-partial-file-interval-ms",
        "0",
    ];
    let a = Sidecar::start(&redis, archiving(&url, vec![], &policy)).await;
    let b = Sidecar::start(&redis, archiving(&url, vec![], &policy)).await;
    let mut ids = Vec::new();
    for round in 0.. {
        let sidecar = if round % 2 == 0 { &a } else { &b };
        ids.extend(append_awkward(sidecar, &redis, "s", 8).await);
        tokio::time::sleep(Duration::from_millis(30)).await;
        if round >= 10 && folded(&a).await > 0.0 && folded(&b).await > 0.0 {
            break;
        }
        assert!(round < 500, "one sidecar never folded: {}", b.log());
    }
    let settled = eventually(Duration::from_secs(10), || stream_length_is(&redis, "s", 3)).await;
    assert!(settled, "{}", a.log());
    let all = read_all(&a, "s", 13).await;
    assert_eq!(all.iter().map(|e| e.stream_id.clone()).collect::<Vec<_>>(), ids);
    let archive = Archive::open(&url).unwrap();
    let manifest: Manifest = archive.manifest("s").await.unwrap();
    assert_eq!(manifest.entries(), ids.len() as u64 - 3);
    assert_eq!(folded(&a).await + folded(&b).await, manifest.entries() as f64, "each entry folded by one sidecar once");
    for pair in manifest.files.windows(2) {
        assert!(pair[0].last_id < pair[1].first_id, "files overlap: {pair:?}");
    }
}

async fn folded(sidecar: &Sidecar) -> f64 {
    sidecar.counter("echomq_archive_folded_entries_total").await
}

/// A Trim its client cancels half-way through the fold gives the stream's
/// fold lease up at once, instead of holding the stream's folding up until
/// the lease expires (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trim_cancelled_mid_fold_gives_the_lease_up() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let paused = SidecarOptions {
        env: vec![("ECHOMQ_ARCHIVE_PAUSE_AT".into(), "after_file".into())],
        ..archiving(&file_url(dir.path()), vec![], &[])
    };
    let sidecar = Sidecar::start(&redis, paused).await;
    append_awkward(&sidecar, &redis, "s", 5).await;
    let client = sidecar.stream_client().await;
    let call = tokio::spawn(async move {
        let mut client = client;
        client.trim(TrimRequest { stream: "s".into(), max_len: 2, ..Default::default() }).await
    });
    let reached =
        eventually(Duration::from_secs(10), || async { sidecar.log().contains("paused for a crash test") }).await;
    assert!(reached, "{}", sidecar.log());
    let lease_held = || async {
        let held: i64 = redis::cmd("EXISTS").arg("s:archive:lease").query_async(&mut redis.conn().await).await.unwrap();
        held == 1
    };
    assert!(lease_held().await, "the fold holds the lease");
    call.abort();
    let given_up = eventually(Duration::from_secs(3), || async { !lease_held().await }).await;
    assert!(given_up, "the lease outlived the cancelled Trim: {}", sidecar.log());
    assert_eq!(xlen(&mut redis.conn().await, "s").await, 7, "nothing trimmed");
}

/// A dead-letter stream is archived like any other: its retention folds the
/// oldest dead letters, and Read returns them from the archive with the
/// branded id, the payload and the reason they were dead-lettered with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_stream_is_archived_like_any_other() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let retention = [
        "--retention",
        "orders:dlq=maxlen:1",
        "--retention-interval-ms",
        "100",
        "--archive-partial-file-interval-ms",
        "0",
    ];
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &retention)).await;
    let mut call = Consumer::subscribe(&sidecar, subscribe_msg("orders", "g", GroupStart::New)).await;
    let mut branded = Vec::new();
    for k in 0..3 {
        sidecar.append("orders", &[("k", k.to_string().as_bytes())]).await;
        let delivery = call.next_delivery(EVENT_TIMEOUT).await;
        call.dead_letter(&delivery.id, "poison").await;
        branded.push(delivery.id);
    }
    let archive = Archive::open(&file_url(dir.path())).unwrap();
    let folded = eventually(Duration::from_secs(10), || async {
        archive.manifest("orders:dlq").await.unwrap().entries() == 2 && stream_length_is(&redis, "orders:dlq", 1).await
    })
    .await;
    assert!(folded, "{}", sidecar.log());
    let letters = read_all(&sidecar, "orders:dlq", 10).await;
    assert_eq!(letters.iter().map(|e| e.id.clone()).collect::<Vec<_>>(), branded);
    assert_eq!(letters.iter().map(|e| e.archived).collect::<Vec<_>>(), [true, true, false]);
    for (k, letter) in letters.iter().enumerate() {
        assert_eq!(letter.payload.get("k").map(|v| &v[..]), Some(k.to_string().as_bytes()), "{letter:?}");
        assert_eq!(letter.payload.get("echomq.reason").map(|v| &v[..]), Some(&b"poison"[..]), "{letter:?}");
    }
}

/// Scheduled entries and the archive: entries moved into the stream are
/// folded and trimmed like any (each branded id read back exactly once, the
/// archived ones from the archive), and one still scheduled during the fold
/// enters after the archive's end and is read from the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_scheduled_entries_are_archived_once_and_a_late_one_follows_the_archive() {
    let redis = RedisServer::start().await;
    let dir = TempDir::new("archive");
    let sidecar = Sidecar::start(&redis, archiving(&file_url(dir.path()), vec![], &["--schedule-poll-ms", "20"])).await;
    let mut client = sidecar.stream_client().await;
    let mut con = redis.conn().await;
    let stream = "sched";
    let append = |n: usize, delay_ms: Option<i64>| AppendRequest {
        stream: stream.into(),
        fields: fields(&[("n", n.to_string().as_bytes())]),
        delay: delay_ms.map(|ms| prost_types::Duration { seconds: ms / 1000, nanos: (ms % 1000) as i32 * 1_000_000 }),
        ..Default::default()
    };
    let mut minted = Vec::new();
    for n in 0..20 {
        // Every other entry scheduled, interleaved with plain ones.
        let delay = (n % 2 == 1).then_some(300);
        minted.push(client.append(append(n, delay)).await.unwrap().into_inner().id);
    }
    let late = client.append(append(20, Some(3_000))).await.unwrap().into_inner();
    assert!(late.scheduled);
    for _ in 0..50 {
        if xlen(&mut con, stream).await == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(xlen(&mut con, stream).await, 20, "the 10 due entries moved");
    create_group(&mut con, stream, "g", "$").await;

    let trimmed = trim(&sidecar, stream, 4).await.expect("trim");
    assert_eq!((trimmed.trimmed, trimmed.archived), (16, 16), "{trimmed:?}");
    let read = read_all(&sidecar, stream, 7).await;
    let ids: Vec<&str> = read.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 20, "none twice: {ids:?}");
    let expected: BTreeSet<&str> = minted.iter().map(String::as_str).collect();
    assert_eq!(ids.iter().copied().collect::<BTreeSet<_>>(), expected, "each branded id once");
    assert_eq!(read.iter().filter(|e| e.archived).count(), 16);

    // The late one enters after the archive's end, and Read finds it in the stream.
    for _ in 0..100 {
        if xlen(&mut con, stream).await == 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let read = read_all(&sidecar, stream, 7).await;
    assert_eq!(read.len(), 21);
    let last = read.last().unwrap();
    assert_eq!((last.id.as_str(), last.archived), (late.id.as_str(), false));
    let info = archive_info(&sidecar, stream).await;
    assert!(
        info.archived_through.parse::<StreamId>().unwrap() < last.stream_id.parse::<StreamId>().unwrap(),
        "{info:?} {last:?}"
    );
}
