//! The archive's storage layer (`echomq::archive`) against real stores: a
//! local directory, a real S3-compatible server (MinIO, started here on free
//! loopback ports), and DuckDB reading the files as they are.
//!
//! The MinIO and DuckDB tests need their tools (`scripts/install-deps` builds
//! MinIO into the tools cache and links it as `.tmp/bin/minio`, and makes the
//! venv `.tmp/archive-venv` with PyPI `duckdb`), so they are `#[ignore]`d
//! saying so; scripts/test runs them with `--ignored`, and there a missing tool
//! fails them.

// Tests fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use bytes::Bytes;
use std::{path::Path, time::Duration};

use echomq::{
    archive::{Archive, ArchiveError, Manifest, MANIFESTS_KEPT},
    entry,
    id::StreamId,
    redis::RawEntry,
};
use support::{archive_tools::*, TempDir};

const ID_FIELD: &str = "id";

fn id(ms: u64, seq: u64) -> StreamId {
    StreamId { ms, seq }
}

fn field(name: &[u8], value: &[u8]) -> (Bytes, Bytes) {
    (Bytes::copy_from_slice(name), Bytes::copy_from_slice(value))
}

/// Entries whose fields exercise everything Redis can hold: non-UTF-8 names
/// and values, a repeated name, an empty value, the reserved branded-id field
/// (a copy's, so it differs from the stream id) and `traceparent`.
fn awkward_entries() -> Vec<RawEntry> {
    vec![
        RawEntry { id: id(1_718_000_000_000, 0), fields: Some(vec![field(b"order", b"42"), field(b"note", b"")]) },
        RawEntry {
            id: id(1_718_000_000_000, 1),
            fields: Some(vec![
                field(ID_FIELD.as_bytes(), b"0190000000000000000000000007"),
                field(b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                field(b"\xff\xfe name", b"\x00\x01\x02\xff"),
                field(b"dup", b"first"),
                field(b"dup", b"second"),
                field(b"", b""),
            ]),
        },
        RawEntry { id: id(1_718_000_000_005, 3), fields: Some(vec![field(b"only", b"\xc3\x28")]) },
    ]
}

/// `count` plain entries from `first` on, one per millisecond.
fn plain_entries(first: u64, count: u64) -> Vec<RawEntry> {
    (0..count)
        .map(|k| RawEntry { id: id(first + k, 0), fields: Some(vec![field(b"n", (first + k).to_string().as_bytes())]) })
        .collect()
}

/// Folds `entries` into one file and commits it on `current`.
async fn fold(archive: &Archive, stream: &str, current: &Manifest, entries: &[RawEntry]) -> Manifest {
    let file = archive.write_file(stream, ID_FIELD, entries).await.expect("write_file");
    archive.commit(stream, current, file).await.expect("commit")
}

/// A local-directory archive in a fresh temp dir.
fn local() -> (TempDir, Archive) {
    let dir = TempDir::new("archive");
    let archive = Archive::open(&format!("file://{}", dir.path().display())).expect("open file://");
    (dir, archive)
}

// ---- the behaviours, each run against both stores -------------------------------------------

/// What was folded reads back exactly, every field byte for byte and in
/// order, and the live path's conversion gives the same wire entry.
async fn check_round_trip(archive: &Archive) {
    let stream = "orders:{eu}/2026 q4";
    archive.probe().await.expect("probe");
    assert_eq!(archive.manifest(stream).await.expect("manifest"), Manifest::default());
    let entries = awkward_entries();
    let manifest = fold(archive, stream, &Manifest::default(), &entries).await;
    assert_eq!((manifest.version, manifest.entries(), manifest.files.len()), (1, 3, 1));
    assert_eq!(manifest.archived_through(), Some(id(1_718_000_000_005, 3)));
    assert_eq!(manifest.oldest(), Some(id(1_718_000_000_000, 0)));
    assert!(manifest.bytes() > 0);
    assert_eq!(archive.manifest(stream).await.expect("manifest"), manifest);

    let back = archive.read(stream, &manifest, StreamId::ZERO, id(u64::MAX, u64::MAX), 100).await.expect("read");
    assert_eq!(back, entries);
    for (raw, original) in back.into_iter().zip(entries) {
        assert_eq!(entry::to_entry(raw, ID_FIELD, |_| false), entry::to_entry(original, ID_FIELD, |_| false));
    }
}

/// Two writers commit on the same base version at once: exactly one wins,
/// the other gets Conflict, and the newest manifest is the winner's.
async fn check_racing_commits(first: &Archive, second: &Archive) {
    let stream = "race";
    let base = fold(first, stream, &Manifest::default(), &plain_entries(1, 3)).await;
    let (a, b) = tokio::join!(
        async {
            let file = first.write_file(stream, ID_FIELD, &plain_entries(10, 2)).await.expect("write a");
            first.commit(stream, &base, file).await
        },
        async {
            let file = second.write_file(stream, ID_FIELD, &plain_entries(20, 2)).await.expect("write b");
            second.commit(stream, &base, file).await
        },
    );
    let (winner, loser) = match (a, b) {
        (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
        other => panic!("expected exactly one winner, got {other:?}"),
    };
    assert!(matches!(loser, ArchiveError::Conflict { ref stream, version: 2 } if stream == "race"), "{loser}");
    assert_eq!(winner.version, 2);
    for archive in [first, second] {
        assert_eq!(archive.manifest(stream).await.expect("manifest"), winner);
    }
    // The loser rereads and commits on the winner's version.
    let retried = fold(second, stream, &winner, &plain_entries(30, 1)).await;
    assert_eq!(retried.version, 3);
    assert_eq!(first.manifest(stream).await.expect("manifest").version, 3);
}

#[tokio::test]
async fn local_round_trip_keeps_every_field_exactly() {
    let (_dir, archive) = local();
    check_round_trip(&archive).await;
}

#[tokio::test]
async fn local_racing_commits_have_exactly_one_winner() {
    let (dir, first) = local();
    // A second Archive on the same directory: another sidecar, no shared state.
    let second = Archive::open(&format!("file://{}", dir.path().display())).expect("open");
    check_racing_commits(&first, &second).await;
}

#[tokio::test]
async fn local_reads_span_files_in_order_and_honour_limits() {
    let (_dir, archive) = local();
    let stream = "spans";
    let mut manifest = Manifest::default();
    for first in [100, 110, 120] {
        manifest = fold(&archive, stream, &manifest, &plain_entries(first, 10)).await;
    }
    assert_eq!((manifest.version, manifest.files.len(), manifest.entries()), (3, 3, 30));
    let ids = |entries: Vec<RawEntry>| entries.into_iter().map(|e| e.id.ms).collect::<Vec<_>>();
    let read = |start, end, limit| {
        let (archive, manifest) = (&archive, &manifest);
        async move { ids(archive.read(stream, manifest, start, end, limit).await.expect("read")) }
    };
    // Across all three files, in order.
    assert_eq!(read(id(105, 0), id(125, 0), 100).await, (105..=125).collect::<Vec<_>>());
    // A limit stops inside the second file.
    assert_eq!(read(id(105, 0), id(125, 0), 8).await, (105..113).collect::<Vec<_>>());
    // Inclusive bounds that fall between entries.
    assert_eq!(read(id(109, 1), id(111, 5), 100).await, [110, 111]);
    // Outside the archive, and a limit of 0.
    assert!(read(id(200, 0), id(300, 0), 100).await.is_empty());
    assert!(read(StreamId::ZERO, id(99, 0), 100).await.is_empty());
    assert!(read(StreamId::ZERO, id(300, 0), 0).await.is_empty());
}

#[tokio::test]
async fn local_read_touches_only_overlapping_files() {
    let (dir, archive) = local();
    let stream = "sparse";
    let mut manifest = Manifest::default();
    for first in [1, 10, 20] {
        manifest = fold(&archive, stream, &manifest, &plain_entries(first, 3)).await;
    }
    // Remove the first file: a read that does not overlap it must not notice.
    std::fs::remove_file(dir.path().join(&manifest.files[0].path)).expect("remove");
    let back = archive.read(stream, &manifest, id(10, 0), id(30, 0), 100).await.expect("read");
    assert_eq!(back.len(), 6);
    let missing = archive.read(stream, &manifest, id(1, 0), id(30, 0), 100).await.unwrap_err();
    assert!(matches!(missing, ArchiveError::Store(object_store::Error::NotFound { .. })), "{missing}");
}

#[tokio::test]
async fn local_manifest_versions_are_numbered_objects_and_survive_a_reopen() {
    let (dir, archive) = local();
    let stream = "versions";
    let mut manifest = Manifest::default();
    for (k, first) in [1, 5, 9].into_iter().enumerate() {
        manifest = fold(&archive, stream, &manifest, &plain_entries(first, 2)).await;
        assert_eq!(manifest.version, k as u64 + 1);
    }
    let names = list(&dir.path().join("versions/manifest"));
    assert_eq!(names, ["00000000000000000001.json", "00000000000000000002.json", "00000000000000000003.json"]);
    // A fresh Archive (another process) finds the newest without any hint.
    let reopened = Archive::open(&format!("file://{}", dir.path().display())).expect("open");
    assert_eq!(reopened.manifest(stream).await.expect("manifest"), manifest);
    // A stale base is refused, and so is a file that overlaps what is archived.
    let file = archive.write_file(stream, ID_FIELD, &plain_entries(20, 1)).await.expect("write");
    let stale = Manifest { version: 1, files: manifest.files[..1].to_vec() };
    assert!(matches!(
        archive.commit(stream, &stale, file.clone()).await,
        Err(ArchiveError::Conflict { version: 2, .. })
    ));
    let overlapping = archive.write_file(stream, ID_FIELD, &plain_entries(10, 1)).await.expect("write");
    let refused = archive.commit(stream, &manifest, overlapping).await.unwrap_err();
    assert!(matches!(refused, ArchiveError::Input(_)) && refused.to_string().contains("not after 10-0"), "{refused}");
    assert_eq!(archive.commit(stream, &manifest, file).await.expect("commit").version, 4);
}

/// Only the newest MANIFESTS_KEPT versions stay: each lists every file, so
/// keeping them all would grow with the square of the files. The newest still
/// lists every file, and a fresh reader finds it.
#[tokio::test]
async fn local_old_manifest_versions_are_deleted() {
    let (dir, archive) = local();
    let stream = "many";
    let mut manifest = Manifest::default();
    let versions = MANIFESTS_KEPT + 5;
    for k in 0..versions {
        manifest = fold(&archive, stream, &manifest, &plain_entries(10 * k + 1, 2)).await;
    }
    let names = list(&dir.path().join("many/manifest"));
    let expected: Vec<String> = (versions - MANIFESTS_KEPT + 1..=versions).map(|v| format!("{v:020}.json")).collect();
    assert_eq!(names, expected);
    let reopened = Archive::open(&format!("file://{}", dir.path().display())).expect("open");
    let newest = reopened.manifest(stream).await.expect("manifest");
    assert_eq!((newest.version, newest.files.len() as u64), (versions, versions));
    assert_eq!(newest.entries(), 2 * versions);
}

#[tokio::test]
async fn local_refold_after_a_crash_overwrites_the_orphan() {
    let (dir, archive) = local();
    let stream = "orphans";
    // A fold that "crashed" after the file, before the manifest.
    archive.write_file(stream, ID_FIELD, &plain_entries(1, 5)).await.expect("write orphan");
    // The next fold starts at the same id and covers more.
    let manifest = fold(&archive, stream, &Manifest::default(), &plain_entries(1, 8)).await;
    assert_eq!(list(&dir.path().join("orphans/data")), ["00000000000000000001-00000000000000000000.parquet"]);
    let back = archive.read(stream, &manifest, StreamId::ZERO, id(100, 0), 100).await.expect("read");
    assert_eq!(back, plain_entries(1, 8));
    // Once committed, the same range is not overwritten: someone else folded it.
    let again = archive.write_file(stream, ID_FIELD, &plain_entries(1, 2)).await.unwrap_err();
    assert!(matches!(again, ArchiveError::Conflict { version: 1, .. }), "{again}");
    let still = archive.read(stream, &manifest, StreamId::ZERO, id(100, 0), 100).await.expect("read");
    assert_eq!(still.len(), 8);
}

#[tokio::test]
async fn local_stream_keys_become_readable_reversible_directories() {
    let (dir, archive) = local();
    let stream = "shop:{eu}/orders 2026";
    let manifest = fold(&archive, stream, &Manifest::default(), &plain_entries(1, 1)).await;
    assert_eq!(list(dir.path()), ["shop:%7Beu%7D%2Forders%202026"]);
    assert_eq!(
        manifest.files[0].path,
        "shop:%7Beu%7D%2Forders%202026/data/00000000000000000001-00000000000000000000.parquet"
    );
    assert!(dir.path().join(&manifest.files[0].path).is_file());
    assert_eq!(echomq::archive::decode_stream("shop:%7Beu%7D%2Forders%202026").as_deref(), Some(stream));
}

#[tokio::test]
async fn write_file_refuses_what_it_cannot_store() {
    let (_dir, archive) = local();
    let unordered = [plain_entries(5, 1), plain_entries(1, 1)].concat();
    let deleted = [RawEntry { id: id(1, 0), fields: None }];
    for (entries, says) in [
        (&[][..], "no entries"),
        (&unordered[..], "not in ascending id order: 5-0 before 1-0"),
        (&deleted[..], "has no body"),
    ] {
        let refused = archive.write_file("s", ID_FIELD, entries).await.unwrap_err();
        assert!(matches!(refused, ArchiveError::Input(_)) && refused.to_string().contains(says), "{refused}");
    }
}

#[tokio::test]
async fn a_file_replaced_after_its_commit_is_reported_not_served() {
    let (dir, archive) = local();
    let manifest = fold(&archive, "swap", &Manifest::default(), &plain_entries(1, 4)).await;
    // Someone (a writer that lost its lease) rewrote the file with another range.
    let other = Archive::open(&format!("file://{}", dir.path().display())).expect("open");
    let swapped = {
        let orphan_dir = TempDir::new("swap");
        let scratch = Archive::open(&format!("file://{}", orphan_dir.path().display())).expect("open");
        let file = scratch.write_file("swap", ID_FIELD, &plain_entries(1, 2)).await.expect("write");
        std::fs::read(orphan_dir.path().join(&file.path)).expect("read")
    };
    std::fs::write(dir.path().join(&manifest.files[0].path), swapped).expect("overwrite");
    let refused = other.read("swap", &manifest, StreamId::ZERO, id(10, 0), 10).await.unwrap_err();
    assert!(
        matches!(refused, ArchiveError::Format(_)) && refused.to_string().contains("replaced after the commit"),
        "{refused}"
    );
}

/// The names in `dir`, sorted.
fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
#[ignore = "needs MinIO (scripts/install-deps makes .tmp/bin/minio); scripts/test runs it"]
async fn minio_round_trip_keeps_every_field_exactly() {
    let minio = Minio::start().await;
    check_round_trip(&minio.archive("round-trip")).await;
}

#[tokio::test]
#[ignore = "needs MinIO (scripts/install-deps makes .tmp/bin/minio); scripts/test runs it"]
async fn minio_racing_commits_have_exactly_one_winner() {
    let minio = Minio::start().await;
    check_racing_commits(&minio.archive("race/a"), &minio.archive("race/a")).await;
}

/// The S3 client would panic on an endpoint it cannot make a request URI of.
#[test]
fn an_endpoint_that_is_no_http_url_is_refused_at_open() {
    for endpoint in ["127.0.0.1:9000", "not a url", "ftp://host:21", "http://"] {
        let aws = [("AWS_ENDPOINT_URL".to_owned(), endpoint.to_owned())];
        let refused = Archive::open_with("s3://bucket/x", aws).err();
        let message = refused.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(
            matches!(refused, Some(ArchiveError::Url { .. })) && message.contains("AWS_ENDPOINT_URL"),
            "{endpoint}: {refused:?}"
        );
    }
    let fine = [("AWS_ENDPOINT_URL".to_owned(), "http://127.0.0.1:9000".to_owned())];
    assert!(Archive::open_with("s3://bucket/x", fine).is_ok());
}

#[tokio::test]
#[ignore = "needs MinIO (scripts/install-deps makes .tmp/bin/minio); scripts/test runs it"]
async fn minio_refused_credentials_are_a_store_error() {
    let minio = Minio::start().await;
    let aws = [
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", minio.port)),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
        ("AWS_ACCESS_KEY_ID", "minioadmin".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "wrong-secret".to_owned()),
    ];
    let archive = Archive::open_with(&format!("s3://{BUCKET}/x"), aws.map(|(k, v)| (k.to_owned(), v))).expect("open");
    let refused = tokio::time::timeout(Duration::from_secs(60), archive.probe()).await.expect("probe in time");
    assert!(matches!(refused, Err(ArchiveError::Store(_))), "{refused:?}");
}

#[tokio::test]
#[ignore = "needs DuckDB (scripts/install-deps makes .tmp/archive-venv); scripts/test runs it"]
async fn duckdb_reads_exactly_the_entries_written() {
    let python = duckdb_python();
    let (dir, archive) = local();
    // Two streams, one of them in two files; keys that need encoding.
    let mut written = Vec::new();
    let awkward = awkward_entries();
    let manifest = fold(&archive, "orders:{eu}", &Manifest::default(), &awkward[..2]).await;
    fold(&archive, "orders:{eu}", &manifest, &awkward[2..]).await;
    written.extend(awkward.iter().map(|e| ("orders:{eu}", e.clone())));
    let plain = plain_entries(1_700_000_000_000, 50);
    fold(&archive, "k=v/ü", &Manifest::default(), &plain).await;
    written.extend(plain.iter().map(|e| ("k=v/ü", e.clone())));

    let rows = duckdb_rows(&python, dir.path());

    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut expected: Vec<serde_json::Value> = written
        .iter()
        .map(|(stream, raw)| {
            let fields = raw.fields.as_deref().unwrap_or_default();
            let branded = entry::branded_id(raw.id, fields, ID_FIELD).expect("branded id");
            serde_json::json!([
                stream,
                raw.id.to_string(),
                branded.to_string(),
                branded.minted_at_ms(),
                "TIMESTAMP WITH TIME ZONE",
                fields.iter().map(|(n, v)| [hex(n), hex(v)]).collect::<Vec<_>>(),
            ])
        })
        .collect();
    let mut rows = rows;
    let key = |row: &serde_json::Value| (row[0].to_string(), row[1].as_str().and_then(|s| s.parse::<StreamId>().ok()));
    rows.sort_by_key(key);
    expected.sort_by_key(key);
    assert_eq!(rows, expected);
    // The copy's branded id came from its reserved field, not from its stream id.
    assert!(rows.iter().any(|row| row[2] == "0190000000000000000000000007"));
}
