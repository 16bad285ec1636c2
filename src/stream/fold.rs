//! Fold, then trim: with an archive, what a trim would remove is folded into
//! archive files first, in the order that loses nothing whatever crashes —
//! file durable → manifest → XTRIM — by one sidecar at a time per stream.
//!
//! A crash after the file leaves an orphan that the next fold overwrites (a
//! file is named by its stream and first id, and the next fold starts at the
//! same id); after the manifest, entries both archived and live, which the
//! next fold does not archive again (it starts after `archived_through`) and
//! Read takes from the archive only. The trim is capped at the first id not
//! archived and runs only while this sidecar holds the stream's fold lease
//! (`trim.lua` checks it), and two sidecars can never commit the same
//! manifest version (create-if-absent), so a sidecar that lost its lease
//! while stalled can neither archive a range twice nor trim past the archive.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    archive::{Archive, ArchiveError, Manifest},
    error::Error,
    id::StreamId,
    metrics::{ArchiveExtent, Metrics},
    redis::{
        range::range,
        trim::{run, Fence, Trim, Trimmed},
        Redis,
    },
};

/// How long a fold lease lasts unless renewed (ms): renewed before each file,
/// so a sidecar that dies mid-fold holds the stream up no longer than this.
pub const FOLD_LEASE_MS: u64 = 30_000;
/// How long a Trim waits for another sidecar's fold of the same stream.
const LEASE_WAIT: Duration = Duration::from_secs(5);

/// How big the archive's files are.
#[derive(Clone, Copy, Debug)]
pub struct FileSizes {
    /// The most entries in one file (`--archive-file-entries`).
    pub entries: usize,
    /// The least time between two partial files (fewer than `entries`) that
    /// retention folds of one stream (`--archive-partial-file-interval-ms`).
    pub partial_interval: Duration,
}

/// Who asks for a fold, which decides whether it may end in a partial file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// A Trim call: everything the trim removes is folded, however few.
    ByTrim,
    /// A retention round: whole files, and a partial one only once
    /// [`FileSizes::partial_interval`] has passed since the stream's last.
    ByRetention,
}

/// The archive as the trims use it: where files go, and what each stream's
/// last fold did.
pub struct Folding {
    archive: Archive,
    id_field: String,
    /// The most entries in one file (`--archive-file-entries`).
    file_entries: usize,
    partial_interval: Duration,
    /// Stream key → when retention last folded a partial file of it (absent:
    /// not since this sidecar started, at `started`).
    last_partial: Mutex<HashMap<String, Instant>>,
    started: Instant,
    /// This sidecar's consumer name, the first part of its lease tokens.
    owner: String,
    metrics: Arc<Metrics>,
    /// Stream key → why its last fold failed (absent after a success).
    errors: Mutex<HashMap<String, String>>,
}

impl Folding {
    /// Folds into `archive`; entries' branded ids are in `id_field`; files are
    /// as `sizes` says; `owner` names this sidecar in leases.
    pub fn new(archive: Archive, id_field: String, sizes: FileSizes, owner: String, metrics: Arc<Metrics>) -> Folding {
        Folding {
            archive,
            id_field,
            file_entries: sizes.entries.max(1),
            partial_interval: sizes.partial_interval,
            last_partial: Mutex::default(),
            started: Instant::now(),
            owner,
            metrics,
            errors: Mutex::default(),
        }
    }

    /// Whether a fold `asked` so may write a partial file of `stream` now.
    fn partial_allowed(&self, stream: &str, asked: Asked) -> bool {
        let last = self.last_partial.lock().expect("partial files").get(stream).copied();
        asked == Asked::ByTrim || last.unwrap_or(self.started).elapsed() >= self.partial_interval
    }

    /// The archive read from.
    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// Why this sidecar's last fold of `stream` failed; `None` after a success.
    pub fn last_error(&self, stream: &str) -> Option<String> {
        self.errors.lock().expect("fold errors").get(stream).cloned()
    }

    /// Folds into the archive what `trim` would remove from `stream`, then
    /// trims (never past what is archived). Returns the trim and how many
    /// entries this call archived.
    ///
    /// Errors: [`Error::ArchiveUnavailable`] when the store refuses (nothing
    /// more is trimmed; what was committed stays); [`Error::Aborted`] when
    /// another sidecar holds the stream's fold lease for longer than 5 s, or
    /// took it over; the trim's own errors.
    pub(crate) async fn fold_then_trim(
        &self,
        redis: &Redis,
        stream: &str,
        trim: &Trim,
        asked: Asked,
    ) -> Result<(Trimmed, u64), Error> {
        let started = Instant::now();
        let result = self.fold_then_trim_leased(redis, stream, trim, asked).await.map_err(|error| match error {
            Error::ArchiveUnavailable { context, stream, reason, .. } => {
                Error::ArchiveUnavailable { context, stream, reason, trimming: true }
            }
            error => error,
        });
        let mut errors = self.errors.lock().expect("fold errors");
        match &result {
            Ok(_) => {
                errors.remove(stream);
            }
            // The caller's mistakes (another type at the key, a bad bound) and another
            // sidecar folding at the moment are no failure of folding.
            Err(Error::Aborted { .. } | Error::WrongType { .. } | Error::InvalidArgument { .. }) => {}
            Err(error) => {
                self.metrics.archive.fold_error(stream, redis.keys.sharded_stream_of(stream));
                tracing::warn!(%stream, %error, "folding into the archive failed: nothing more is trimmed until it succeeds");
                errors.insert(stream.to_owned(), error.to_string());
            }
        }
        self.metrics.archive.fold_duration(stream, redis.keys.sharded_stream_of(stream), started.elapsed());
        result
    }

    async fn fold_then_trim_leased(
        &self,
        redis: &Redis,
        stream: &str,
        trim: &Trim,
        asked: Asked,
    ) -> Result<(Trimmed, u64), Error> {
        let lease = redis.keys.fold_lease(stream);
        let token = format!("{}:{:016x}", self.owner, fastrand::u64(..));
        self.acquire(redis, stream, &lease, &token).await?;
        let held = Held { redis, lease, token, released: false };
        let result = self.fold_and_trim(redis, stream, trim, asked, &held.lease, &held.token).await;
        held.release().await;
        result
    }

    async fn fold_and_trim(
        &self,
        redis: &Redis,
        stream: &str,
        trim: &Trim,
        asked: Asked,
        lease: &str,
        token: &str,
    ) -> Result<(Trimmed, u64), Error> {
        let mut manifest =
            self.archive.manifest(stream).await.map_err(|e| store_error(e, "reading the manifest", stream))?;
        let sharded = redis.keys.sharded_stream_of(stream);
        self.metrics.archive.extent(stream, sharded, extent(&manifest));
        // What this fold archives it reads from the stream in whole ranges after
        // this id, so only live entries up to it can be missing from the archive.
        let archived_before = manifest.archived_through();
        self.refuse_another_archive(redis, stream, archived_before).await?;
        // What the trim would remove: entries below this bound.
        let bound = run(redis, stream, trim, None, true).await?.applied_min_id;
        let mut archived = 0;
        if let Some(bound) = bound.parse::<StreamId>().ok().filter(|bound| *bound > StreamId::ZERO) {
            loop {
                let start = manifest.archived_through().and_then(StreamId::successor);
                let start = start.map_or_else(|| "-".to_owned(), |id| id.to_string());
                let entries = range(redis, stream, &start, &format!("({bound}"), self.file_entries).await?;
                let Some(last) = entries.last().map(|e| e.id) else { break };
                let partial = entries.len() < self.file_entries;
                if partial && !self.partial_allowed(stream, asked) {
                    tracing::debug!(%stream, entries = entries.len(), "left in the stream until a whole file is due");
                    break;
                }
                renew(redis, stream, lease, token).await?;
                let file = self
                    .archive
                    .write_file(stream, &self.id_field, &entries)
                    .await
                    .map_err(|e| fold_error(e, "writing a file", stream))?;
                let bytes = file.bytes;
                pause_point("after_file").await;
                manifest = self
                    .archive
                    .commit(stream, &manifest, file)
                    .await
                    .map_err(|e| fold_error(e, "writing the manifest", stream))?;
                pause_point("after_manifest").await;
                archived += entries.len() as u64;
                self.metrics.archive.folded(stream, sharded, entries.len() as u64, bytes);
                self.metrics.archive.extent(stream, sharded, extent(&manifest));
                tracing::debug!(%stream, entries = entries.len(), %last, "folded into the archive");
                if partial {
                    if asked == Asked::ByRetention {
                        self.last_partial.lock().expect("partial files").insert(stream.to_owned(), Instant::now());
                    }
                    break;
                }
            }
        }
        self.refuse_unarchived_below(redis, stream, &manifest, archived_before).await?;
        pause_point("before_trim").await;
        let fence = Fence { lease, token, through: manifest.archived_through() };
        let trimmed = run(redis, stream, trim, Some(fence), false).await?;
        Ok((trimmed, archived))
    }

    /// Refuses ([`Error::Conflict`]) when `<stream>:archive:through` says the
    /// stream was trimmed into an archive past `ends`, where this one ends:
    /// another sidecar folds it under another `--archive-url`, or this archive
    /// lost files (a bucket emptied). Folding on would split the history, and
    /// Read would show a gap. One GET.
    async fn refuse_another_archive(&self, redis: &Redis, stream: &str, ends: Option<StreamId>) -> Result<(), Error> {
        let key = redis.keys.archive_through(stream);
        let mut conn = redis.conn.clone();
        let through: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::from_redis(e, "reading where the archive ends (GET)", stream))?;
        let Some(through) = through.and_then(|t| t.parse::<StreamId>().ok()) else { return Ok(()) };
        if ends.is_some_and(|ends| through <= ends) {
            return Ok(());
        }
        let ends = ends.map_or_else(|| "holds nothing of it".to_owned(), |id| format!("ends at {id}"));
        Err(Error::Conflict {
            reason: format!(
                "stream `{stream}` was trimmed into an archive through {through} (`{key}`), but this sidecar's \
                 archive ({}) {ends}: another sidecar folds it under another --archive-url, or this archive lost \
                 files; give every sidecar of this Redis the same --archive-url (delete `{key}` only to start \
                 this archive afresh on purpose)",
                self.archive.url()
            ),
        })
    }

    /// Refuses ([`Error::Conflict`]) when `stream` holds an entry at or below
    /// `through` (where the archive ended when this fold began) that
    /// `manifest`'s files do not hold: the trim, capped at the archive's end,
    /// would remove it, and it would be nowhere. Entries
    /// there are normally ones a crash left both archived and live; another
    /// can only come from a stream deleted and written again with ids given
    /// by hand, or a restored backup. Reads the stream and the archive over
    /// that span only (nothing to read in the usual case: one XRANGE).
    async fn refuse_unarchived_below(
        &self,
        redis: &Redis,
        stream: &str,
        manifest: &Manifest,
        through: Option<StreamId>,
    ) -> Result<(), Error> {
        let Some(through) = through else { return Ok(()) };
        let mut from = "-".to_owned();
        loop {
            let live = range(redis, stream, &from, &through.to_string(), self.file_entries).await?;
            let (Some(first), Some(last)) = (live.first().map(|e| e.id), live.last().map(|e| e.id)) else {
                return Ok(());
            };
            let archived = self
                .archive
                .read(stream, manifest, first, last, usize::MAX)
                .await
                .map_err(|e| store_error(e, "reading archive files", stream))?;
            let archived: std::collections::HashSet<StreamId> = archived.iter().map(|e| e.id).collect();
            if let Some(stray) = live.iter().find(|e| !archived.contains(&e.id)) {
                return Err(Error::Conflict {
                    reason: format!(
                        "entry {} of stream `{stream}` is at or below the end of its archive ({through}) but not in \
                         it (was the stream deleted and written again with ids given by hand?): nothing is trimmed \
                         while it is there; read it, then XDEL it (Append it again for a new id)",
                        stray.id
                    ),
                });
            }
            if live.len() < self.file_entries {
                return Ok(());
            }
            from = format!("({last}");
        }
    }

    /// Takes `stream`'s fold lease, waiting up to [`LEASE_WAIT`] for another
    /// holder to finish.
    async fn acquire(&self, redis: &Redis, stream: &str, lease: &str, token: &str) -> Result<(), Error> {
        let deadline = Instant::now() + LEASE_WAIT;
        loop {
            if take_lease(redis, lease, token, FOLD_LEASE_MS, stream).await? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Aborted {
                    reason: format!("another sidecar is folding stream `{stream}` into the archive; try again"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Takes `lease` (of `stream`) for `token` for `ttl_ms` unless someone holds
/// it (`SET lease token NX PX ttl_ms`): true when taken. The fold lease and
/// the scheduled entries' move lease are taken this way.
///
/// Errors: as [`Error::from_redis`].
pub(crate) async fn take_lease(
    redis: &Redis,
    lease: &str,
    token: &str,
    ttl_ms: u64,
    stream: &str,
) -> Result<bool, Error> {
    let mut conn = redis.conn.clone();
    let taken: Option<String> = redis::cmd("SET")
        .arg(lease)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, format!("taking the lease `{lease}` (SET NX)"), stream))?;
    Ok(taken.is_some())
}

/// Extends the lease while it is still `token`'s ([`Error::Aborted`] if not).
async fn renew(redis: &Redis, stream: &str, lease: &str, token: &str) -> Result<(), Error> {
    let mut conn = redis.conn.clone();
    let renewed: i64 = redis
        .scripts
        .lease_renew
        .key(lease)
        .arg(token)
        .arg(FOLD_LEASE_MS)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "renewing the fold lease (lease_renew.lua)", stream))?;
    if renewed == 1 {
        Ok(())
    } else {
        Err(Error::Aborted { reason: format!("another sidecar took over folding stream `{stream}`; try again") })
    }
}

/// A fold lease this sidecar holds. Given up when the fold ends, and also when
/// the fold is dropped half-way (a Trim call cancelled by its client), so the
/// stream's next fold need not wait [`FOLD_LEASE_MS`] for it to expire.
struct Held<'a> {
    redis: &'a Redis,
    lease: String,
    token: String,
    released: bool,
}

impl Held<'_> {
    async fn release(mut self) {
        let mut conn = self.redis.conn.clone();
        release(&mut conn, &self.redis.scripts.lease_release, &self.lease, &self.token).await;
        // Only now: a release cancelled half-way is done again on drop.
        self.released = true;
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (mut conn, script) = (self.redis.conn.clone(), self.redis.scripts.lease_release.clone());
        let (lease, token) = (std::mem::take(&mut self.lease), std::mem::take(&mut self.token));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { release(&mut conn, &script, &lease, &token).await });
        }
    }
}

/// Gives the lease up if it is still `token`'s (`lease_release.lua`); a
/// failure only delays the next fold until the lease expires.
pub(crate) async fn release<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    script: &redis::Script,
    lease: &str,
    token: &str,
) {
    let released: redis::RedisResult<i64> = script.key(lease).arg(token).invoke_async(conn).await;
    if let Err(error) = released {
        tracing::debug!(%lease, %error, "the lease stays until it expires");
    }
}

/// A store error met while folding: a conflict means another sidecar folded
/// the same range first ([`Error::Aborted`]), anything else [`store_error`].
fn fold_error(error: ArchiveError, context: &'static str, stream: &str) -> Error {
    match error {
        ArchiveError::Conflict { .. } => {
            Error::Aborted { reason: format!("another sidecar archived stream `{stream}` at the same time; try again") }
        }
        error => store_error(error, context, stream),
    }
}

/// What `manifest` holds, for the metrics.
pub fn extent(manifest: &Manifest) -> ArchiveExtent {
    ArchiveExtent {
        files: manifest.files.len() as u64,
        bytes: manifest.bytes(),
        entries: manifest.entries(),
        oldest_ms: manifest.oldest().map(|id| id.ms),
    }
}

/// An archive error as the API's: UNAVAILABLE, naming what was being done.
pub(crate) fn store_error(error: ArchiveError, context: &'static str, stream: &str) -> Error {
    Error::ArchiveUnavailable { context, stream: stream.to_owned(), reason: error.to_string(), trimming: false }
}

/// For the crash tests: with `ECHOMQ_ARCHIVE_PAUSE_AT` naming this step
/// (`after_file`, `after_manifest`, `before_trim`), logs it and stops here
/// for good, so the test can kill the process at exactly this point.
async fn pause_point(step: &'static str) {
    static PAUSE_AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if PAUSE_AT.get_or_init(|| std::env::var("ECHOMQ_ARCHIVE_PAUSE_AT").ok()).as_deref() == Some(step) {
        tracing::warn!(step, "paused for a crash test (ECHOMQ_ARCHIVE_PAUSE_AT)");
        std::future::pending::<()>().await;
    }
}
