//! The archive: where a trim's entries are folded before Redis forgets them.
//!
//! Storage is Apache Arrow's `object_store`: a local directory
//! (`file:///abs/dir`) or any S3-compatible store (`s3://bucket[/prefix]`).
//! This module is the storage layer only — files, manifests and reading them
//! back; the fold-then-trim order, leases and timers are [`crate::stream::fold`]'s.
//!
//! # Layout under the root (the directory, or the bucket prefix)
//!
//! ```text
//! <stream>/data/<first ms, 20 digits>-<first seq, 20 digits>.parquet   one folded range (format.rs)
//! <stream>/manifest/<version, 20 digits>.json                         immutable manifest versions (manifest.rs)
//! ```
//!
//! `<stream>` is the stream key percent-encoded ([`encode_stream`]): letters,
//! digits and `-_.:@+,` stay as they are, every other byte becomes `%XX`, so
//! `orders:{eu}` is `orders:%7Beu%7D`, a key with `/` stays one directory and
//! the mapping is reversible. DuckDB reads the whole archive with
//! `SELECT * FROM '<root>/**/*.parquet'`.
//!
//! # Why it is crash-safe and race-safe
//!
//! - A data file's name depends only on the stream and its first id, so
//!   folding again after a crash (file written, manifest not) overwrites the
//!   orphan instead of leaving a second copy that a query of `**/*.parquet`
//!   would count twice.
//! - A manifest version is created with create-if-absent (`PutMode::Create`:
//!   a hard link on a local directory, `If-None-Match: *` on S3), so two
//!   writers can never both commit the same version; the loser gets
//!   [`ArchiveError::Conflict`] and rereads. Versions are never rewritten or
//!   deleted, so an old base can never be committed on again.
//! - Local writes are fsynced (the file and its directory) before they
//!   return, matching what S3 promises when a PUT succeeds.

mod format;
mod manifest;

use std::{
    collections::HashMap,
    fmt::{self, Write as _},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::TryStreamExt;
use object_store::{
    aws::{AmazonS3Builder, AmazonS3ConfigKey},
    local::LocalFileSystem,
    path::{Path, PathPart},
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
};

/// How long one request to an S3 store may take before it is retried: a
/// store that stops answering fails a fold or a Read `UNAVAILABLE` within
/// about [`STORE_RETRY_TIMEOUT`] + this, not object_store's default of minutes.
/// Enough for a default-sized file (25,000 entries, a few MB) on any link a
/// sidecar should fold over.
const STORE_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to an S3 store may take.
const STORE_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a failed or timed-out request (with object_store's backoff).
const STORE_RETRIES: usize = 2;
/// No retry starts later than this after the first attempt.
const STORE_RETRY_TIMEOUT: Duration = Duration::from_secs(15);

pub use manifest::{FileMeta, Manifest};

use crate::{id::StreamId, redis::RawEntry};

/// Why an archive operation failed. Messages name the stream, object or URL
/// and say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// `--archive-url` cannot be used: not a URL, an unknown scheme, a missing
    /// directory, or S3 settings the client refuses. The text says which.
    #[error("archive url `{url}`: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another writer committed this manifest version (or the file being
    /// written is already in the newest manifest) first: reread the
    /// manifest and fold from its `archived_through`.
    #[error(
        "archive of stream `{stream}`: manifest version {version} was committed by another writer; reread the manifest"
    )]
    Conflict {
        /// The stream key.
        stream: String,
        /// The version that was taken.
        version: u64,
    },
    /// The object store refused or failed an operation (unreachable,
    /// credentials, bucket gone, disk full, …); the store's text says which
    /// object and why.
    #[error("archive store: {0}")]
    Store(#[from] object_store::Error),
    /// An archive object is not what the archive writes: a manifest that is
    /// not its JSON, a Parquet file without the columns, a file that does not
    /// match its manifest entry.
    #[error("{0}")]
    Format(String),
    /// The caller asked for something the archive cannot store: no entries,
    /// entries out of order or without a body, a file overlapping what is
    /// archived, an empty stream key.
    #[error("{0}")]
    Input(String),
}

/// An archive: an object store, a root prefix inside it, and the URL it was
/// opened from. Cheap to clone (the store is shared).
#[derive(Clone)]
pub struct Archive {
    /// The store: LocalFileSystem rooted at the directory, or one bucket.
    store: Arc<dyn ObjectStore>,
    /// The prefix inside the store every object lives under (empty for a
    /// directory; the URL's path for a bucket).
    root: Path,
    /// The URL as given, for logs and errors.
    url: String,
    /// The newest manifest version seen per stream (by a read or a commit),
    /// so the next lookup lists only the versions after it. Versions are
    /// never deleted, so a hint is never past the newest.
    hints: Arc<Mutex<HashMap<String, u64>>>,
}

impl fmt::Debug for Archive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Archive").field("url", &self.url).finish_non_exhaustive()
    }
}

/// Object names inside a stream's directory.
const DATA_DIR: &str = "data";
const MANIFEST_DIR: &str = "manifest";

/// Manifest versions kept per stream: each lists every file, so keeping them
/// all would grow a stream's manifests with the square of its files. After
/// committing version v, the committer deletes version v - this. Readers only
/// ever read the newest.
pub const MANIFESTS_KEPT: u64 = 16;
/// Encoded stream keys are cut into directory levels of at most this many
/// bytes (Linux allows 255 per name); every level but the last ends in `~`,
/// which the encoding never produces, so one key's levels cannot be another
/// key's directory.
const SEGMENT_BYTES: usize = 200;

impl Archive {
    /// Opens the archive at `url`, reading S3 settings from the process's
    /// `AWS_*` variables ([`Archive::open_with`] with `std::env::vars()`).
    pub fn open(url: &str) -> Result<Archive, ArchiveError> {
        Archive::open_with(url, std::env::vars())
    }

    /// Opens the archive at `url` with S3 settings from `aws`, pairs named as
    /// the standard variables (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`,
    /// `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`, `AWS_VIRTUAL_HOSTED_STYLE_REQUEST`,
    /// …, as `AmazonS3Builder::from_env` reads them; other names are ignored).
    /// Does no I/O beyond checking that a directory exists: [`Archive::probe`]
    /// checks the store answers.
    ///
    /// - `file:///abs/dir`: the directory, which must exist; writes are fsynced.
    /// - `s3://bucket` or `s3://bucket/prefix`: that bucket, objects under the
    ///   prefix. The region defaults to `us-east-1` when `AWS_REGION` is unset.
    ///   TLS uses the process's default rustls provider (the sidecar installs
    ///   ring at start).
    ///
    /// Errors: [`ArchiveError::Url`] for a URL that does not parse, another
    /// scheme, a relative or missing directory, an endpoint that is not an
    /// http(s) URL, or settings the S3 client refuses.
    pub fn open_with(url: &str, aws: impl IntoIterator<Item = (String, String)>) -> Result<Archive, ArchiveError> {
        let bad = |reason: String| ArchiveError::Url { url: url.to_owned(), reason };
        let parsed = url::Url::parse(url)
            .map_err(|e| bad(format!("{e}; expected file:///absolute/dir or s3://bucket/prefix")))?;
        let (store, root): (Arc<dyn ObjectStore>, Path) = match parsed.scheme() {
            "file" => {
                if parsed.host_str().is_some_and(|host| !host.is_empty() && host != "localhost") {
                    return Err(bad("a file URL names a local directory: write file:///absolute/dir".into()));
                }
                let dir = parsed.to_file_path().map_err(|()| bad("not an absolute directory path".into()))?;
                if !dir.is_dir() {
                    return Err(bad(format!("{} is not a directory: create it, or fix the URL", dir.display())));
                }
                let store = LocalFileSystem::new_with_prefix(&dir).map_err(|e| bad(e.to_string()))?.with_fsync(true);
                (Arc::new(store), Path::default())
            }
            "s3" => {
                let bucket = parsed
                    .host_str()
                    .filter(|b| !b.is_empty())
                    .ok_or_else(|| bad("no bucket: write s3://bucket/prefix".into()))?;
                // reqwest is built with `rustls-no-provider`: without a process-wide provider its
                // client would panic. The sidecar installs ring at start; so does this, for any
                // other caller (a second install is a no-op).
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut builder = AmazonS3Builder::new()
                    .with_region("us-east-1")
                    .with_client_options(
                        ClientOptions::new()
                            .with_timeout(STORE_REQUEST_TIMEOUT)
                            .with_connect_timeout(STORE_CONNECT_TIMEOUT),
                    )
                    .with_retry(RetryConfig {
                        backoff: BackoffConfig::default(),
                        max_retries: STORE_RETRIES,
                        retry_timeout: STORE_RETRY_TIMEOUT,
                    });
                for (key, value) in aws {
                    // As AmazonS3Builder::from_env does, without reading the process environment.
                    if key == "AWS_ENDPOINT_URL" || key == "AWS_ENDPOINT" {
                        // The S3 client panics on an endpoint it cannot make a request URI of.
                        let endpoint = url::Url::parse(&value).ok();
                        if !endpoint.is_some_and(|e| matches!(e.scheme(), "http" | "https") && e.has_host()) {
                            return Err(bad(format!(
                                "{key} `{value}` is not an http(s) URL: write http://host:port or https://host"
                            )));
                        }
                    }
                    if key.starts_with("AWS_") {
                        if let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
                            builder = builder.with_config(key, value);
                        }
                    }
                }
                let store = builder.with_bucket_name(bucket).build().map_err(|e| bad(e.to_string()))?;
                let root = Path::from_url_path(parsed.path()).map_err(|e| bad(format!("the prefix: {e}")))?;
                (Arc::new(store), root)
            }
            other => return Err(bad(format!("unknown scheme `{other}`: use file:// or s3://"))),
        };
        Ok(Archive { store, root, url: url.to_owned(), hints: Arc::default() })
    }

    /// The URL the archive was opened from, for logs.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Checks that the store answers and accepts writes: puts, gets and
    /// deletes a small probe object, `<root>/.echomq-probe-<pid>-<nanos>`
    /// (no stream's directory starts with `.`).
    ///
    /// Errors: [`ArchiveError::Store`] with the store's reason (unreachable,
    /// no such bucket, credentials refused, read-only directory, …);
    /// [`ArchiveError::Format`] if the object reads back different.
    pub async fn probe(&self) -> Result<(), ArchiveError> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = self.object(&format!(".echomq-probe-{}-{nanos}", std::process::id()));
        let body = format!("echomq archive probe {nanos}");
        self.store.put(&path, PutPayload::from(body.clone().into_bytes())).await?;
        let back = self.store.get(&path).await?.bytes().await?;
        self.store.delete(&path).await?;
        if back != body.as_bytes() {
            return Err(ArchiveError::Format(format!(
                "archive store at {}: the probe object read back different",
                self.url
            )));
        }
        Ok(())
    }

    /// The newest committed manifest of `stream`: [`Manifest::default`]
    /// (version 0, no files) when nothing is archived.
    ///
    /// One LIST of `<stream>/manifest/` (only past the newest version this
    /// `Archive` has seen) and one GET of the newest version.
    ///
    /// Errors: [`ArchiveError::Store`]; [`ArchiveError::Format`] for a
    /// manifest that does not parse; [`ArchiveError::Input`] for an empty key.
    pub async fn manifest(&self, stream: &str) -> Result<Manifest, ArchiveError> {
        let dir = self.object(&format!("{}/{MANIFEST_DIR}", encode_stream(stream)?));
        let hint = self.hint(stream);
        let listing = match hint {
            Some(version) => self.store.list_with_offset(Some(&dir), &self.manifest_path(stream, version)?),
            None => self.store.list(Some(&dir)),
        };
        let listed: Vec<_> = listing.try_collect().await?;
        let newest = listed.iter().filter_map(|meta| parse_version(meta.location.filename()?)).max();
        let Some(version) = newest.max(hint) else {
            return Ok(Manifest::default());
        };
        let path = self.manifest_path(stream, version)?;
        let json = self.store.get(&path).await?.bytes().await?;
        let manifest = manifest::from_json(path.as_ref(), stream, version, &json)?;
        self.note(stream, version);
        Ok(manifest)
    }

    /// Encodes `entries` (strictly ascending ids, every body present) as one
    /// Parquet file ([`format`](self) has the columns) and stores it, durably,
    /// at `<stream>/data/<first id>.parquet`; `id_field` is the reserved
    /// branded-id field, for the `branded_id` column. Returns its metadata,
    /// for [`Archive::commit`].
    ///
    /// The file is created with create-if-absent. If it exists, it is either
    /// an orphan (a fold that crashed before its commit: overwritten) or
    /// already in the newest manifest (someone else folded this range:
    /// [`ArchiveError::Conflict`], the file is left alone).
    ///
    /// Encoding runs on the calling task (about 1 µs per entry in release
    /// builds): fold in batches of bounded size.
    ///
    /// Errors: [`ArchiveError::Input`] for entries it cannot store (see
    /// above; over 2 GiB of fields); [`ArchiveError::Conflict`];
    /// [`ArchiveError::Store`]; [`ArchiveError::Format`] if Parquet fails.
    pub async fn write_file(
        &self,
        stream: &str,
        id_field: &str,
        entries: &[RawEntry],
    ) -> Result<FileMeta, ArchiveError> {
        let encoded = format::encode(stream, id_field, entries)?;
        let first = encoded.first_id;
        let relative = format!("{}/{DATA_DIR}/{:020}-{:020}.parquet", encode_stream(stream)?, first.ms, first.seq);
        let path = self.object(&relative);
        let bytes = encoded.bytes.len() as u64;
        let payload = PutPayload::from(encoded.bytes);
        match self.store.put_opts(&path, payload.clone(), PutOptions::from(PutMode::Create)).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                let newest = self.manifest(stream).await?;
                if newest.files.iter().any(|file| file.path == relative) {
                    return Err(ArchiveError::Conflict { stream: stream.to_owned(), version: newest.version });
                }
                self.store.put_opts(&path, payload, PutOptions::from(PutMode::Overwrite)).await?;
            }
            Err(e) => return Err(e.into()),
        }
        Ok(FileMeta { path: relative, first_id: first, last_id: encoded.last_id, entries: entries.len() as u64, bytes })
    }

    /// Commits manifest version `current.version + 1`: `current`'s files and
    /// then `file`, so `archived_through` becomes `file.last_id`. `current`
    /// must be what [`Archive::manifest`] (or the previous commit) returned.
    ///
    /// One PUT with create-if-absent of `<stream>/manifest/<version>.json`,
    /// then a DELETE of the version [`MANIFESTS_KEPT`] older (best effort).
    ///
    /// Errors: [`ArchiveError::Conflict`] when that version exists (another
    /// writer committed first; nothing was written); [`ArchiveError::Input`]
    /// when `file` does not start after `current.archived_through()` (it would
    /// archive entries twice); [`ArchiveError::Store`].
    pub async fn commit(&self, stream: &str, current: &Manifest, file: FileMeta) -> Result<Manifest, ArchiveError> {
        if let Some(through) = current.archived_through().filter(|through| file.first_id <= *through) {
            return Err(ArchiveError::Input(format!(
                "archive of stream `{stream}`: file {} starts at {}, not after {through}, where version {} ends",
                file.path, file.first_id, current.version
            )));
        }
        if file.last_id < file.first_id {
            return Err(ArchiveError::Input(format!("archive file {} ends before it starts", file.path)));
        }
        let mut next = current.clone();
        next.version += 1;
        next.files.push(file);
        let path = self.manifest_path(stream, next.version)?;
        let json = PutPayload::from(manifest::to_json(stream, &next));
        match self.store.put_opts(&path, json, PutOptions::from(PutMode::Create)).await {
            Ok(_) => {
                self.note(stream, next.version);
                if let Some(old) = next.version.checked_sub(MANIFESTS_KEPT).filter(|old| *old > 0) {
                    // Best effort: a version left behind (a crash, a refusal) is only storage.
                    if let Err(error) = self.store.delete(&self.manifest_path(stream, old)?).await {
                        tracing::debug!(%stream, version = old, %error, "an old manifest version stays");
                    }
                }
                Ok(next)
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(ArchiveError::Conflict { stream: stream.to_owned(), version: next.version })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The archived entries of `stream` with ids in `start..=end`, ascending,
    /// at most `limit`, exactly as they were folded. Reads (one GET each) only
    /// the files of `manifest` that overlap the range, in order, and stops
    /// once `limit` entries are found.
    ///
    /// Errors: [`ArchiveError::Store`] (a file of the manifest missing
    /// included); [`ArchiveError::Format`] for a file that is not the
    /// archive's Parquet or does not match its manifest entry (size or row
    /// count: it was replaced after the commit).
    pub async fn read(
        &self,
        stream: &str,
        manifest: &Manifest,
        start: StreamId,
        end: StreamId,
        limit: usize,
    ) -> Result<Vec<RawEntry>, ArchiveError> {
        let mut out = Vec::new();
        let want = format::Want { start, end, limit };
        for file in manifest.overlapping(start, end) {
            if out.len() >= limit {
                break;
            }
            let bytes = self.store.get(&self.object(&file.path)).await?.bytes().await?;
            let mismatch = |what: &str, found: u64, listed: u64| {
                ArchiveError::Format(format!(
                    "archive file `{}` has {found} {what}, version {} of the manifest of stream `{stream}` says {listed}: \
                     it was replaced after the commit",
                    file.path, manifest.version
                ))
            };
            if bytes.len() as u64 != file.bytes {
                return Err(mismatch("bytes", bytes.len() as u64, file.bytes));
            }
            let rows = format::decode(&file.path, bytes, want, &mut out)?;
            if rows != file.entries {
                return Err(mismatch("entries", rows, file.entries));
            }
        }
        Ok(out)
    }

    /// The object at `relative` (a `/`-separated path of valid segments) under the root.
    fn object(&self, relative: &str) -> Path {
        // Taken as they are (`parse`), so a `%` of the stream encoding is not encoded again; a
        // part that is not valid (never one this module makes) is escaped by `PathPart::from`.
        relative.split('/').fold(self.root.clone(), |path, part| {
            path.join(PathPart::parse(part).unwrap_or_else(|_| PathPart::from(part)))
        })
    }

    /// The object of manifest version `version` of `stream`.
    fn manifest_path(&self, stream: &str, version: u64) -> Result<Path, ArchiveError> {
        Ok(self.object(&format!("{}/{MANIFEST_DIR}/{version:020}.json", encode_stream(stream)?)))
    }

    /// The newest manifest version seen for `stream`, if any.
    fn hint(&self, stream: &str) -> Option<u64> {
        self.hints.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(stream).copied()
    }

    /// Records that version `version` of `stream` exists.
    fn note(&self, stream: &str, version: u64) {
        let mut hints = self.hints.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let seen = hints.entry(stream.to_owned()).or_default();
        *seen = (*seen).max(version);
    }
}

/// A manifest object's version from its file name, `None` for other names
/// (a local store's staging files, anything put there by hand).
fn parse_version(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".json")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| digits.parse().ok())?
}

/// A stream key as a relative object path: percent-encoded, `/`-joined levels
/// of at most [`SEGMENT_BYTES`] bytes. Letters, digits and `-_.:@+,` stay
/// (a `.` only after the first byte, so no level is `.` or `..` and none
/// starts like the probe object); `=` is encoded so DuckDB never takes a
/// directory for a Hive partition. Reversed by [`decode_stream`].
///
/// Errors: [`ArchiveError::Input`] for an empty key.
pub fn encode_stream(stream: &str) -> Result<String, ArchiveError> {
    if stream.is_empty() {
        return Err(ArchiveError::Input("an empty stream key cannot be archived".into()));
    }
    let mut flat = String::with_capacity(stream.len());
    for (at, byte) in stream.bytes().enumerate() {
        let keep = byte.is_ascii_alphanumeric() || b"-_:@+,".contains(&byte) || (byte == b'.' && at > 0);
        if keep {
            flat.push(char::from(byte));
        } else {
            let _ = write!(flat, "%{byte:02X}");
        }
    }
    // Cut at SEGMENT_BYTES, never inside a `%XX`.
    let mut out = String::with_capacity(flat.len() + flat.len() / SEGMENT_BYTES * 2);
    let mut level = 0;
    let mut rest = flat.as_str();
    while !rest.is_empty() {
        let token = if rest.starts_with('%') { 3 } else { 1 };
        if level + token > SEGMENT_BYTES {
            out.push_str("~/");
            level = 0;
        }
        out.push_str(&rest[..token]);
        level += token;
        rest = &rest[token..];
    }
    Ok(out)
}

/// The stream key of an [`encode_stream`] path; `None` if `encoded` is not one.
pub fn decode_stream(encoded: &str) -> Option<String> {
    let joined = encoded.replace("~/", "");
    percent_encoding::percent_decode_str(&joined).decode_utf8().ok().map(|key| key.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_encode_readably_and_reversibly() {
        for (key, encoded) in [
            ("orders", "orders"),
            ("orders:{eu}", "orders:%7Beu%7D"),
            ("a/b c", "a%2Fb%20c"),
            ("..", "%2E."),
            (".probe", "%2Eprobe"),
            ("k=v", "k%3Dv"),
            ("100%", "100%25"),
            ("é", "%C3%A9"),
            ("v1.2~x", "v1.2%7Ex"),
        ] {
            assert_eq!(encode_stream(key).ok().as_deref(), Some(encoded), "{key}");
            assert_eq!(decode_stream(encoded).as_deref(), Some(key));
        }
        assert!(encode_stream("").is_err());
    }

    #[test]
    fn long_stream_keys_are_cut_into_levels() {
        let key = format!("{}{}", "x".repeat(199), "{".repeat(200));
        let encoded = encode_stream(&key).unwrap_or_default();
        let levels: Vec<&str> = encoded.split('/').collect();
        assert!(levels.len() > 2 && levels.iter().all(|level| level.len() <= SEGMENT_BYTES + 1), "{levels:?}");
        assert!(levels[..levels.len() - 1].iter().all(|level| level.ends_with('~')));
        assert_eq!(levels[0], format!("{}~", "x".repeat(199)));
        assert_eq!(decode_stream(&encoded), Some(key));
    }

    #[test]
    fn manifest_names_parse_only_when_they_are_versions() {
        assert_eq!(parse_version("00000000000000000012.json"), Some(12));
        for other in ["12.json", "00000000000000000012.json#3", "0000000000000000001a.json", "x"] {
            assert_eq!(parse_version(other), None, "{other}");
        }
    }

    #[test]
    fn urls_that_cannot_be_used_say_why() {
        let none = std::iter::empty::<(String, String)>;
        let reason = |url: &str| Archive::open_with(url, none()).map(|_| ()).unwrap_err().to_string();
        assert!(reason("not a url").contains("expected file:///absolute/dir"), "{}", reason("not a url"));
        assert!(reason("gs://bucket").contains("unknown scheme `gs`"));
        assert!(reason("file:///no/such/dir/here").contains("is not a directory"));
        assert!(reason("s3:///prefix").contains("no bucket"));
        assert!(Archive::open_with("s3://bucket/some/prefix", none()).is_ok());
        assert!(Archive::open_with(&format!("file://{}", std::env::temp_dir().display()), none()).is_ok());
    }
}
