//! A stream's manifest: which archive files hold which ids.
//!
//! Each version is its own immutable JSON object,
//! `<root>/<stream>/manifest/<version, 20 digits>.json`, holding the whole
//! list of files (not a delta), so reading the newest version is one listing
//! and one GET. A version is written with create-if-absent, which is what makes
//! [`Archive::commit`](super::Archive::commit) a compare-and-swap.

use serde::{Deserialize, Serialize};

use super::ArchiveError;
use crate::id::StreamId;

/// The manifest document's format, written as `format`; a reader refuses
/// others rather than misread them.
const FORMAT: u32 = 1;

/// The archived extent of one stream at one version: its files, oldest first.
///
/// Version 0 with no files ([`Manifest::default`]) is a stream with nothing
/// archived. Files never overlap and are in ascending id order, each starting
/// after the previous one's `last_id` ([`Archive::commit`](super::Archive::commit)
/// refuses anything else), so the archive holds each entry at most once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// The version: 1 for the first commit, one more for each after it.
    pub version: u64,
    /// The files, in ascending id order.
    pub files: Vec<FileMeta>,
}

impl Manifest {
    /// The last archived stream id: everything up to it is archived, so a
    /// fold resumes after it and a trim may remove up to it. `None` when
    /// nothing is archived.
    pub fn archived_through(&self) -> Option<StreamId> {
        self.files.last().map(|file| file.last_id)
    }

    /// The oldest archived stream id, `None` when nothing is archived.
    pub fn oldest(&self) -> Option<StreamId> {
        self.files.first().map(|file| file.first_id)
    }

    /// The number of archived entries.
    pub fn entries(&self) -> u64 {
        self.files.iter().map(|file| file.entries).sum()
    }

    /// The archive files' total size, bytes.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|file| file.bytes).sum()
    }

    /// The files holding ids in `start..=end`, in ascending order.
    pub fn overlapping(&self, start: StreamId, end: StreamId) -> impl Iterator<Item = &FileMeta> {
        self.files.iter().filter(move |file| file.last_id >= start && file.first_id <= end)
    }
}

/// One archive file: a folded range of one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// Its object path relative to the archive's root (the URL's directory or
    /// bucket prefix), e.g. `orders/data/00000001718000000000-00000000000000000000.parquet`.
    pub path: String,
    /// The first and last entries' stream ids (inclusive).
    pub first_id: StreamId,
    /// See `first_id`.
    pub last_id: StreamId,
    /// The number of entries (rows).
    pub entries: u64,
    /// The file's size, bytes.
    pub bytes: u64,
}

/// The JSON form of a manifest version.
#[derive(Serialize, Deserialize)]
struct Document {
    format: u32,
    /// The stream key, so a file read by hand says whose it is.
    stream: String,
    version: u64,
    files: Vec<FileDocument>,
}

/// The JSON form of a [`FileMeta`]: ids as their `ms-seq` text.
#[derive(Serialize, Deserialize)]
struct FileDocument {
    path: String,
    first_id: String,
    last_id: String,
    entries: u64,
    bytes: u64,
}

/// The JSON object of `manifest` for `stream`.
pub(super) fn to_json(stream: &str, manifest: &Manifest) -> Vec<u8> {
    let files = manifest
        .files
        .iter()
        .map(|file| FileDocument {
            path: file.path.clone(),
            first_id: file.first_id.to_string(),
            last_id: file.last_id.to_string(),
            entries: file.entries,
            bytes: file.bytes,
        })
        .collect();
    let document = Document { format: FORMAT, stream: stream.to_owned(), version: manifest.version, files };
    // Serializing plain structs of strings and integers cannot fail.
    serde_json::to_vec(&document).unwrap_or_default()
}

/// Parses the manifest object at `path`, which should be version `version` of `stream`.
///
/// Errors: [`ArchiveError::Format`] for anything else: not JSON, another
/// format, another stream or version, ids that do not parse.
pub(super) fn from_json(path: &str, stream: &str, version: u64, json: &[u8]) -> Result<Manifest, ArchiveError> {
    let failed = |reason: String| ArchiveError::Format(format!("manifest `{path}`: {reason}"));
    let document: Document = serde_json::from_slice(json).map_err(|e| failed(e.to_string()))?;
    if document.format != FORMAT {
        return Err(failed(format!("format {} is not {FORMAT}, the one this sidecar reads", document.format)));
    }
    if document.stream != stream || document.version != version {
        return Err(failed(format!(
            "holds version {} of stream `{}`, expected version {version} of `{stream}`",
            document.version, document.stream
        )));
    }
    let id = |text: &str| text.parse::<StreamId>().map_err(|e| failed(e.to_string()));
    let files = document
        .files
        .into_iter()
        .map(|file| {
            Ok(FileMeta {
                first_id: id(&file.first_id)?,
                last_id: id(&file.last_id)?,
                path: file.path,
                entries: file.entries,
                bytes: file.bytes,
            })
        })
        .collect::<Result<_, ArchiveError>>()?;
    Ok(Manifest { version, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(ms: u64, seq: u64) -> StreamId {
        StreamId { ms, seq }
    }

    fn file(first: StreamId, last: StreamId, entries: u64) -> FileMeta {
        FileMeta { path: format!("s/data/{first}.parquet"), first_id: first, last_id: last, entries, bytes: 100 }
    }

    #[test]
    fn extent_is_derived_from_the_files() {
        let empty = Manifest::default();
        assert_eq!((empty.version, empty.archived_through(), empty.oldest(), empty.entries()), (0, None, None, 0));
        let manifest = Manifest { version: 2, files: vec![file(id(1, 0), id(5, 0), 3), file(id(6, 0), id(9, 1), 4)] };
        assert_eq!(manifest.archived_through(), Some(id(9, 1)));
        assert_eq!(manifest.oldest(), Some(id(1, 0)));
        assert_eq!((manifest.entries(), manifest.bytes()), (7, 200));
        let hit = |start, end| manifest.overlapping(start, end).map(|f| f.first_id).collect::<Vec<_>>();
        assert_eq!(hit(id(5, 0), id(6, 0)), [id(1, 0), id(6, 0)]);
        assert_eq!(hit(id(5, 1), id(5, 9)), []);
        assert_eq!(hit(id(0, 0), id(1, 0)), [id(1, 0)]);
    }

    #[test]
    fn json_round_trips_and_names_its_stream_and_version() {
        let manifest = Manifest { version: 7, files: vec![file(id(1, 0), id(5, u64::MAX), 3)] };
        let json = to_json("orders:{eu}", &manifest);
        assert_eq!(from_json("p", "orders:{eu}", 7, &json).ok(), Some(manifest));
        let wrong = from_json("p", "orders", 7, &json).unwrap_err().to_string();
        assert!(wrong.contains("expected version 7 of `orders`"), "{wrong}");
        assert!(from_json("p", "orders:{eu}", 8, &json).is_err());
        assert!(from_json("p", "s", 1, b"{\"format\":2,\"stream\":\"s\",\"version\":1,\"files\":[]}").is_err());
    }
}
