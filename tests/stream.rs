//! StreamService: Append, AppendBatch, Read and Trim against a real redis-server.

// Tests fail loudly by design; `..Default::default()` on proto messages keeps them
// compiling when the contract gains fields.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::needless_update)]

mod support;

use echomq::proto::{AppendBatchRequest, AppendRequest, BatchEntry, ReadRequest, TrimRequest};
use support::*;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_returns_branded_id_equal_to_stream_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let before_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;

    let resp = sidecar.append("orders", &[("k", b"v")]).await;

    assert!(is_branded(&resp.id), "branded id must be 28 lowercase hex, got {:?}", resp.id);
    assert_eq!(resp.id, branded_from_stream_id(&resp.stream_id), "branded id must encode the stream id");
    let (ms, _) = parse_stream_id(&resp.stream_id);
    assert!(ms + 5_000 >= before_ms && ms <= before_ms + 60_000, "stream id ms {ms} is not now ({before_ms})");
    let mut con = redis.conn().await;
    let entries = xrange(&mut con, "orders").await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].stream_id, resp.stream_id, "the returned stream id is the one Redis holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_stores_branded_id_in_id_field() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let resp = sidecar.append("orders", &[("k", b"v"), ("bin", &[0u8, 255, 10])]).await;

    let mut con = redis.conn().await;
    let entries = xrange(&mut con, "orders").await;
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(entry.field("id"), Some(resp.id.as_bytes()), "reserved field `id` must hold the branded id: {entry:?}");
    assert_eq!(entry.field("k"), Some(&b"v"[..]));
    assert_eq!(entry.field("bin"), Some(&[0u8, 255, 10][..]), "values are stored byte for byte");
    assert_eq!(entry.fields.len(), 3, "exactly the user fields plus `id`: {entry:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_batch_ids_are_consecutive_and_ordered() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let entries: Vec<BatchEntry> = (0..50)
        .map(|i| BatchEntry { fields: fields(&[("n", i.to_string().as_bytes())]), ..Default::default() })
        .collect();
    let resp = sidecar
        .stream_client()
        .await
        .append_batch(AppendBatchRequest { stream: "batch".into(), entries, ..Default::default() })
        .await
        .expect("append batch")
        .into_inner();

    assert_eq!(resp.entries.len(), 50);
    for r in &resp.entries {
        assert!(is_branded(&r.id), "{r:?}");
        assert_eq!(r.id, branded_from_stream_id(&r.stream_id), "{r:?}");
    }
    for pair in resp.entries.windows(2) {
        let (a_ms, a_seq) = parse_stream_id(&pair[0].stream_id);
        let (b_ms, b_seq) = parse_stream_id(&pair[1].stream_id);
        let consecutive = (b_ms == a_ms && b_seq == a_seq + 1) || (b_ms > a_ms && b_seq == 0);
        assert!(consecutive, "ids not consecutive: {:?} then {:?}", pair[0], pair[1]);
        assert!(pair[0].id < pair[1].id, "branded ids must order like the entries");
    }
    // Request order is stream order, and Redis holds exactly these entries.
    let mut con = redis.conn().await;
    let stored = xrange(&mut con, "batch").await;
    let stored_ids: Vec<&str> = stored.iter().map(|e| e.stream_id.as_str()).collect();
    let returned_ids: Vec<&str> = resp.entries.iter().map(|e| e.stream_id.as_str()).collect();
    assert_eq!(stored_ids, returned_ids);
    for (i, e) in stored.iter().enumerate() {
        assert_eq!(e.field("n"), Some(i.to_string().as_bytes()), "entry {i} out of request order");
        assert_eq!(e.field("id"), Some(resp.entries[i].id.as_bytes()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_max_len_trims_approximately() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut client = sidecar.stream_client().await;

    for i in 0..1000 {
        client
            .append(AppendRequest {
                stream: "trimmed".into(),
                fields: fields(&[("n", i.to_string().as_bytes())]),
                max_len: 100,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("append {i}: {s:?}"));
    }

    let mut con = redis.conn().await;
    let len = xlen(&mut con, "trimmed").await;
    // `MAXLEN ~ 100` trims whole radix-tree nodes (100 entries each by default):
    // at least 100 stay, and far fewer than the 1000 appended.
    assert!((100..400).contains(&len), "XLEN after 1000 appends with max_len 100 is {len}");
    let entries = xrange(&mut con, "trimmed").await;
    assert_eq!(entries.last().and_then(|e| e.field("n")), Some(&b"999"[..]), "the newest entries are kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_with_no_fields_stores_only_the_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;

    let resp = sidecar.append("empty-fields", &[]).await;

    let mut con = redis.conn().await;
    let entries = xrange(&mut con, "empty-fields").await;
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].fields, vec![(b"id".to_vec(), resp.id.into_bytes())]);
}

// ---------------------------------------------------------------------------
// Read
// ---------------------------------------------------------------------------

async fn append_numbered(sidecar: &Sidecar, stream: &str, n: usize) -> Vec<echomq::proto::AppendResponse> {
    let entries = (0..n)
        .map(|i| BatchEntry { fields: fields(&[("n", i.to_string().as_bytes())]), ..Default::default() })
        .collect();
    sidecar
        .stream_client()
        .await
        .append_batch(AppendBatchRequest { stream: stream.into(), entries, ..Default::default() })
        .await
        .expect("append batch")
        .into_inner()
        .entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_replays_a_range_by_stream_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 5).await;

    let page = sidecar
        .stream_client()
        .await
        .read(ReadRequest {
            stream: "s".into(),
            start_id: appended[1].stream_id.clone(),
            end_id: appended[3].stream_id.clone(),
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner();

    let got: Vec<(&str, &str)> = page.entries.iter().map(|e| (e.id.as_str(), e.stream_id.as_str())).collect();
    let want: Vec<(&str, &str)> = appended[1..4].iter().map(|a| (a.id.as_str(), a.stream_id.as_str())).collect();
    assert_eq!(got, want, "bounds are inclusive, oldest first");
    assert_eq!(page.entries[0].payload, fields(&[("n", b"1")]), "payload without the reserved field");
    assert_eq!(page.entries[0].minted_at, Some(timestamp_of_ms(branded_ms(&appended[1].id))));
    assert_eq!(page.next_start_id, "", "the page reached the end of the range");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_pages_with_next_start_id() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 5).await;
    let mut client = sidecar.stream_client().await;

    let mut seen = Vec::new();
    let mut start_id = String::new();
    for _ in 0..10 {
        let page = client
            .read(ReadRequest { stream: "s".into(), start_id: start_id.clone(), count: 2, ..Default::default() })
            .await
            .expect("read")
            .into_inner();
        assert!(page.entries.len() <= 2, "count bounds a page");
        seen.extend(page.entries.into_iter().map(|e| e.id));
        if page.next_start_id.is_empty() {
            break;
        }
        start_id = page.next_start_id;
    }

    assert_eq!(seen, appended.iter().map(|a| a.id.clone()).collect::<Vec<_>>(), "every entry once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_by_instant_uses_the_milliseconds_as_bounds() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    for id in ["1000-0", "1999-9", "2000-0", "2000-1", "2001-0"] {
        xadd_raw_at(&mut con, "s", id, &[(b"at", id.as_bytes())]).await;
    }

    let page = sidecar
        .stream_client()
        .await
        .read(ReadRequest {
            stream: "s".into(),
            start_time: Some(timestamp_of_ms(2000)),
            end_time: Some(timestamp_of_ms(2000)),
            ..Default::default()
        })
        .await
        .expect("read")
        .into_inner();

    let got: Vec<&str> = page.entries.iter().map(|e| e.stream_id.as_str()).collect();
    assert_eq!(got, vec!["2000-0", "2000-1"]);
    assert_eq!(page.entries[0].id, branded_from_stream_id("2000-0"), "foreign entries get derived ids");
}

// ---------------------------------------------------------------------------
// Trim
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_by_max_len_keeps_the_newest() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 10).await;

    let resp = sidecar
        .stream_client()
        .await
        .trim(TrimRequest { stream: "s".into(), max_len: 3, ..Default::default() })
        .await
        .expect("trim")
        .into_inner();

    let mut con = redis.conn().await;
    let left: Vec<String> = xrange(&mut con, "s").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(left, appended[7..].iter().map(|a| a.stream_id.clone()).collect::<Vec<_>>());
    assert_eq!(resp.trimmed, 7);
    assert_eq!(resp.applied_min_id, appended[7].stream_id);
    assert!(!resp.held_back_by_groups);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_safe_mode_keeps_entries_a_group_has_pending() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 10).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;
    // The group reads 0..=2 and acks 0: 1 and 2 are pending, 3.. undelivered.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("g")
        .arg("c")
        .arg("COUNT")
        .arg(3)
        .arg("STREAMS")
        .arg("s")
        .arg(">")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: i64 = redis::cmd("XACK").arg("s").arg("g").arg(&appended[0].stream_id).query_async(&mut con).await.unwrap();

    let resp = sidecar
        .stream_client()
        .await
        .trim(TrimRequest { stream: "s".into(), max_len: 1, ..Default::default() })
        .await
        .expect("trim")
        .into_inner();

    let left: Vec<String> = xrange(&mut con, "s").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(left.first(), Some(&appended[1].stream_id), "nothing a group still needs is trimmed: {left:?}");
    assert_eq!(left.len(), 9);
    assert_eq!(resp.trimmed, 1);
    assert_eq!(resp.applied_min_id, appended[1].stream_id);
    assert!(resp.held_back_by_groups);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_safe_mode_keeps_entries_a_group_has_not_read() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 10).await;
    let mut con = redis.conn().await;
    // Positioned after entry 4: entries 5.. are not yet delivered to it.
    create_group(&mut con, "s", "g", &appended[4].stream_id).await;

    let resp = sidecar
        .stream_client()
        .await
        .trim(TrimRequest {
            stream: "s".into(),
            max_len: 0,
            min_id: appended[8].stream_id.clone(),
            ..Default::default()
        })
        .await
        .expect("trim")
        .into_inner();

    let left: Vec<String> = xrange(&mut con, "s").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(left.first(), Some(&appended[5].stream_id), "{left:?}");
    assert!(resp.held_back_by_groups);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_ignoring_groups_trims_as_asked() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let appended = append_numbered(&sidecar, "s", 10).await;
    let mut con = redis.conn().await;
    create_group(&mut con, "s", "g", "0").await;

    sidecar
        .stream_client()
        .await
        .trim(TrimRequest { stream: "s".into(), max_len: 2, ignore_groups: true, ..Default::default() })
        .await
        .expect("trim");

    let left: Vec<String> = xrange(&mut con, "s").await.into_iter().map(|e| e.stream_id).collect();
    assert_eq!(left, appended[8..].iter().map(|a| a.stream_id.clone()).collect::<Vec<_>>());
}

// ---------------------------------------------------------------------------
// Refusals: each RPC's bad requests, one table
// ---------------------------------------------------------------------------

/// Every bad request to Append, AppendBatch, Read and Trim is refused with the
/// status that names its fault, and writes nothing. Each case runs on an
/// emptied Redis; a failure names its case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_their_status_and_write_nothing() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let append = |stream: &str, f: &[(&str, &[u8])]| {
        Rpc::Append(AppendRequest { stream: stream.to_owned(), fields: fields(f), ..Default::default() })
    };
    let batch = |entries: &[&[(&str, &[u8])]]| {
        let entries = entries.iter().map(|f| BatchEntry { fields: fields(f), ..Default::default() }).collect();
        Rpc::AppendBatch(AppendBatchRequest { stream: "batch".into(), entries, ..Default::default() })
    };
    let (invalid, wrong_type) = (Code::InvalidArgument, Code::FailedPrecondition);

    let cases = vec![
        Refusal::new("Append with a user field named `id`", append("orders", &[("id", b"mine"), ("k", b"v")]), invalid)
            .leaving(Leaves::NoKey("orders")),
        Refusal::new(
            "AppendBatch with the reserved field in one entry",
            batch(&[&[("k", b"ok")], &[("id", b"not allowed")]]),
            invalid,
        )
        .leaving(Leaves::NoKey("batch")),
        Refusal::new("AppendBatch of no entries", batch(&[]), invalid),
        Refusal::new("Append to an empty stream name", append("", &[("k", b"v")]), invalid).leaving(Leaves::NoKeys),
        Refusal::new("Append to a stream name over 1024 bytes", append(&"s".repeat(1025), &[("k", b"v")]), invalid),
        Refusal::new("Append to a string key", append("plain", &[("k", b"v")]), wrong_type)
            .given(Seed::String("plain", "string"))
            .leaving(Leaves::String("plain", "string")),
        Refusal::new(
            "Read with both an id and an instant for its start",
            Rpc::Read(ReadRequest {
                stream: "s".into(),
                start_id: "1-0".into(),
                start_time: Some(timestamp_of_ms(1)),
                ..Default::default()
            }),
            invalid,
        ),
        Refusal::new(
            "Read of a string key",
            Rpc::Read(ReadRequest { stream: "plain".into(), ..Default::default() }),
            wrong_type,
        )
        .given(Seed::String("plain", "string")),
        Refusal::new(
            "Trim without a bound",
            Rpc::Trim(TrimRequest { stream: "s".into(), ..Default::default() }),
            invalid,
        )
        .given(Seed::Appended("s", 3))
        .leaving(Leaves::Len("s", 3)),
    ];

    assert_refusals(&redis, &sidecar, cases).await;
}

/// A page of Read never exceeds the gRPC message limit: it holds fewer entries
/// when they are large, and an entry too large on its own is named in
/// `oversized_ids` instead of making every page fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_pages_fit_the_message_limit_and_name_oversized_entries() {
    let redis = RedisServer::start().await;
    let options = SidecarOptions::default().arg("--max-message-bytes").arg("65536");
    let sidecar = Sidecar::start(&redis, options).await;
    let mut con = redis.conn().await;
    let medium = vec![b'm'; 15_000];
    let huge = vec![b'h'; 70_000];
    let mut ids = Vec::new();
    for body in [&medium, &medium, &medium, &huge, &medium, &medium] {
        ids.push(xadd_raw(&mut con, "big", &[(b"body", body)]).await);
    }

    let mut client = sidecar.stream_client().await;
    let (mut read, mut oversized, mut pages, mut start) = (Vec::new(), Vec::new(), 0, String::new());
    loop {
        let request = ReadRequest { stream: "big".into(), start_id: start.clone(), count: 100, ..Default::default() };
        let page = client.read(request).await.expect("a page that fits").into_inner();
        pages += 1;
        read.extend(page.entries.into_iter().map(|e| e.stream_id));
        oversized.extend(page.oversized_ids);
        if page.next_start_id.is_empty() {
            break;
        }
        start = page.next_start_id;
    }
    assert_eq!(oversized, vec![ids[3].clone()], "the 70 KB entry is named, not sent");
    let mut expected = ids.clone();
    expected.remove(3);
    assert_eq!(read, expected, "every other entry, in order");
    assert!(pages >= 2, "five 15 KB entries do not fit one 64 KB message");
}

/// A command Redis received but did not answer in time may have been applied:
/// DEADLINE_EXCEEDED saying so, not UNAVAILABLE (which invites a blind retry,
/// and a retried append is a second entry with another branded id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_redis_does_not_answer_in_time_is_deadline_exceeded_with_an_unknown_outcome() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default().arg("--redis-timeout-ms").arg("300")).await;
    let mut con = redis.conn().await;
    // Once OK comes back, Redis holds every client's commands for 1.5 s.
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1500).arg("ALL").query_async(&mut con).await.unwrap();

    let request = AppendRequest { stream: "slow".into(), fields: fields(&[("k", b"v")]), ..Default::default() };
    let err = sidecar.stream_client().await.append(request).await.expect_err("Redis is paused past the timeout");

    assert_code(&err, Code::DeadlineExceeded);
    assert!(err.message().contains("may have been applied"), "{err:?}");
}

/// `echomq_trimmed_unread_total` of `group` on stream `s`.
async fn trimmed_unread(sidecar: &Sidecar, group: &str) -> u64 {
    let metrics = http_get(sidecar.admin_port(), "/metrics").await.expect("GET /metrics").body;
    let series = format!("echomq_trimmed_unread_total{{stream=\"s\",sharded_stream=\"s\",group=\"{group}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |n| n.parse().expect("a count"))
}

/// The stream ids of `s`, oldest first.
async fn stream_ids(con: &mut redis::aio::MultiplexedConnection) -> Vec<(u64, u64)> {
    xrange(con, "s").await.iter().map(|e| parse_stream_id(&e.stream_id)).collect()
}

/// Entries a trim removes before a group was delivered them are lost to that
/// group for good: an Append's `max_len` and a Trim with `ignore_groups`
/// count them per group (`echomq_trimmed_unread_total`) and log them, exactly
/// as many as Redis shows were removed after each group's last-delivered id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trims_count_per_group_the_entries_it_had_not_been_delivered() {
    let redis = RedisServer::start().await;
    let sidecar = Sidecar::start(&redis, SidecarOptions::default()).await;
    let mut con = redis.conn().await;
    let appended = append_numbered(&sidecar, "s", 300).await;
    // `none` was delivered nothing, `half` the first 150, `all` every entry.
    let groups =
        [("none", "0-0"), ("half", appended[149].stream_id.as_str()), ("all", appended[299].stream_id.as_str())];
    for (group, last_delivered) in groups {
        create_group(&mut con, "s", group, last_delivered).await;
    }
    let mut expected = std::collections::BTreeMap::new();
    let mut count_removed = |before: Vec<(u64, u64)>, after: &[(u64, u64)]| {
        let removed: Vec<_> = before.into_iter().filter(|id| !after.contains(id)).collect();
        for (group, last_delivered) in groups {
            let last = parse_stream_id(last_delivered);
            *expected.entry(group).or_insert(0) += removed.iter().filter(|id| **id > last).count() as u64;
        }
        removed.len()
    };

    let before = stream_ids(&mut con).await;
    let request =
        AppendRequest { stream: "s".into(), fields: fields(&[("n", b"cap")]), max_len: 40, ..Default::default() };
    sidecar.stream_client().await.append(request).await.expect("append");
    let removed = count_removed(before, &stream_ids(&mut con).await);
    assert!(removed > 150, "the cap removed whole nodes past the first 150: {removed}");

    let before = stream_ids(&mut con).await;
    let request = TrimRequest { stream: "s".into(), max_len: 5, ignore_groups: true, ..Default::default() };
    sidecar.stream_client().await.trim(request).await.expect("trim");
    assert!(count_removed(before, &stream_ids(&mut con).await) > 0);

    assert!(expected["none"] > expected["half"] && expected["half"] > 0 && expected["all"] == 0, "{expected:?}");
    for (group, n) in &expected {
        assert_eq!(trimmed_unread(&sidecar, group).await, *n, "{group}");
    }
    assert!(sidecar.log().contains("a trim removed entries before the group was delivered them"), "{}", sidecar.log());
}
