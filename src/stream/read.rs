//! Read: validate the range → XRANGE (one entry more than asked, to know where
//! the next page starts) → entries.

use std::collections::HashSet;

use prost_types::Timestamp;

use super::{fold::Folding, Streams};
use crate::{
    entry,
    error::Error,
    id::StreamId,
    proto::{Entry, ReadRequest, ReadResponse},
    redis::{
        range::{self, fit, page, page_size, Page},
        RawEntry,
    },
    security::Caller,
};

/// Which end of a range a bound is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The start: an instant means its millisecond's first id.
    Start,
    /// The end: an instant means its millisecond's last id.
    End,
}

/// An XRANGE bound from a stream id or an instant (not both); `-`/`+` when
/// neither is given. `id_field`/`time_field` name the request fields for errors.
pub fn parse_bound(
    id_field: &'static str,
    id: &str,
    time_field: &'static str,
    time: Option<Timestamp>,
    end: End,
) -> Result<String, Error> {
    match (id.is_empty(), time) {
        (false, Some(_)) => Err(Error::invalid(id_field, format!("give {id_field} or {time_field}, not both"))),
        (false, None) => Ok(id.parse::<StreamId>().map_err(|e| Error::invalid(id_field, e.to_string()))?.to_string()),
        (true, Some(at)) => {
            let ms = entry::unix_ms_of(time_field, at)?;
            let seq = if end == End::Start { 0 } else { u64::MAX };
            Ok(StreamId { ms, seq }.to_string())
        }
        (true, None) => Ok(if end == End::Start { "-" } else { "+" }.to_owned()),
    }
}

/// Read: one page of the range, oldest first; with an archive, entries the
/// archive holds come from there, the rest from the stream.
pub(super) async fn read(
    streams: &Streams,
    caller: Option<&Caller>,
    request: &ReadRequest,
) -> Result<ReadResponse, Error> {
    let stream = streams.guard.stream(caller, "stream", &request.stream)?;
    streams.redis.refuse_sharded("stream", stream).await?;
    let start = parse_bound("start_id", &request.start_id, "start_time", request.start_time, End::Start)?;
    let end = parse_bound("end_id", &request.end_id, "end_time", request.end_time, End::End)?;
    let count = page_size("count", request.count)?;
    let max_bytes = streams.guard.max_message_bytes;
    let (page, from_archive) = match &streams.archive {
        Some(folding) => spanning_page(streams, folding, stream, &start, &end, count).await?,
        None => (page(&streams.redis, stream, &start, &end, count, max_bytes).await?, HashSet::new()),
    };
    let entries = page
        .entries
        .into_iter()
        .filter_map(|e| {
            let archived = from_archive.contains(&e.id);
            entry::to_entry(e, &streams.id_field, |_| false).map(|entry| Entry { archived, ..entry })
        })
        .collect();
    Ok(ReadResponse { entries, next_start_id: page.next_start_id, oversized_ids: page.oversized_ids })
}

/// A page of the range `start`..=`end` (XRANGE bounds) across the archive and
/// the stream, with the ids of its entries that came from the archive.
///
/// The stream's part and where the archive ends (`<stream>:archive:through`,
/// [`crate::keys::Keyspace::archive_through`]) come first, in that order in
/// one pipeline: every entry a trim moved into the archive is at or below
/// that id, and it only grows, so a range that starts after it is whole in
/// the stream and the store is not asked (a Read of the tail works while the
/// store is down). Otherwise the archive's part, up to the manifest's
/// `archived_through`, is merged with the stream's by id, an entry in both
/// (a crash left it archived and live) taken once, from the archive.
async fn spanning_page(
    streams: &Streams,
    folding: &Folding,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
) -> Result<(Page, HashSet<StreamId>), Error> {
    let max_bytes = streams.guard.max_message_bytes;
    // One more than the page, to know where the next starts.
    let (live, trimmed_through) = live_and_archive_end(streams, stream, start, end, count + 1).await?;
    let first = bound_id(start, StreamId::ZERO);
    let last = bound_id(end, StreamId::MAX);
    if trimmed_through.is_none_or(|through| first > through) || first > last {
        return Ok((fit(live, count, max_bytes), HashSet::new()));
    }
    let archive = folding.archive();
    let manifest = archive
        .manifest(stream)
        .await
        .map_err(|e| crate::stream::fold::store_error(e, "reading the manifest", stream))?;
    let Some(through) = manifest.archived_through().filter(|through| first <= *through) else {
        return Ok((fit(live, count, max_bytes), HashSet::new()));
    };
    let archived = archive
        .read(stream, &manifest, first, last.min(through), count + 1)
        .await
        .map_err(|e| crate::stream::fold::store_error(e, "reading archive files", stream))?;
    let from_archive = archived.iter().map(|e| e.id).collect();
    Ok((fit(merge(archived, live, count + 1), count, max_bytes), from_archive))
}

/// Up to `count` entries of `stream` in the XRANGE bounds, then the id in
/// `<stream>:archive:through` (none when absent; [`StreamId::MAX`] when it
/// holds no id, so the archive is asked rather than skipped): an entry
/// trimmed after the XRANGE is at or below it.
async fn live_and_archive_end(
    streams: &Streams,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
) -> Result<(Vec<RawEntry>, Option<StreamId>), Error> {
    let redis = &streams.redis;
    let through = redis.keys.archive_through(stream);
    let (entries, through) = range::range_then_get(redis, stream, start, end, count, &through).await?;
    Ok((entries, through.map(|id| id.parse().unwrap_or(StreamId::MAX))))
}

/// The first `limit` entries of two ascending lists, in id order; an id in
/// both is taken once, from `archived`.
fn merge(archived: Vec<RawEntry>, live: Vec<RawEntry>, limit: usize) -> Vec<RawEntry> {
    let mut merged = Vec::with_capacity(limit.min(archived.len() + live.len()));
    let (mut archived, mut live) = (archived.into_iter().peekable(), live.into_iter().peekable());
    while merged.len() < limit {
        let next = match (archived.peek(), live.peek()) {
            (Some(a), Some(l)) if a.id == l.id => {
                live.next();
                archived.next()
            }
            (Some(a), Some(l)) if l.id < a.id => live.next(),
            (Some(_), _) => archived.next(),
            (None, _) => live.next(),
        };
        match next {
            Some(entry) => merged.push(entry),
            None => break,
        }
    }
    merged
}

/// The id of an XRANGE bound from [`parse_bound`]: `-` and `+` as `open`.
fn bound_id(bound: &str, open: StreamId) -> StreamId {
    bound.parse().unwrap_or(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_become_the_first_and_last_id_of_their_millisecond() {
        let at = Some(Timestamp { seconds: 2, nanos: 5_000_000 });
        assert_eq!(parse_bound("a", "", "b", at, End::Start).unwrap(), "2005-0");
        assert_eq!(parse_bound("a", "", "b", at, End::End).unwrap(), "2005-18446744073709551615");
        assert_eq!(parse_bound("a", "", "b", None, End::End).unwrap(), "+");
        assert!(parse_bound("a", "1-1", "b", at, End::Start).is_err());
        assert!(parse_bound("a", "x", "b", None, End::Start).is_err());
    }

    #[test]
    fn merge_keeps_id_order_takes_an_id_in_both_once_and_stops_at_the_limit() {
        let entry = |seq: u64, from: &[u8]| RawEntry {
            id: StreamId { ms: 1, seq },
            fields: Some(vec![(bytes::Bytes::from_static(b"from"), bytes::Bytes::copy_from_slice(from))]),
        };
        let archived = vec![entry(1, b"a"), entry(3, b"a"), entry(4, b"a")];
        let live = vec![entry(2, b"l"), entry(4, b"l"), entry(5, b"l")];
        let merged = merge(archived.clone(), live.clone(), 10);
        let seen: Vec<(u64, &[u8])> = merged.iter().map(|e| (e.id.seq, &e.fields.as_ref().unwrap()[0].1[..])).collect();
        assert_eq!(seen, [(1, &b"a"[..]), (2, b"l"), (3, b"a"), (4, b"a"), (5, b"l")]);
        assert_eq!(merge(archived, live, 3).len(), 3);
        assert!(merge(Vec::new(), Vec::new(), 3).is_empty());
    }
}
