//! Read: validate the range → XRANGE (one entry more than asked, to know where
//! the next page starts) → entries.

use prost_types::Timestamp;

use super::Streams;
use crate::{
    archive::fold::Folding,
    entry,
    error::Error,
    id::StreamId,
    proto::{Entry, ReadRequest, ReadResponse},
    redis::range::{fit, page, page_size, range, Page},
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

/// Read: one page of the range, oldest first; with an archive, the part of
/// the range up to its `archived_through` from there, the rest from the stream.
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
    let (page, archived_through) = match &streams.archive {
        Some(folding) => spanning_page(streams, folding, stream, &start, &end, count).await?,
        None => (page(&streams.redis, stream, &start, &end, count, max_bytes).await?, None),
    };
    let entries = page
        .entries
        .into_iter()
        .filter_map(|e| {
            let archived = archived_through.is_some_and(|through| e.id <= through);
            entry::to_entry(e, &streams.id_field, |_| false).map(|entry| Entry { archived, ..entry })
        })
        .collect();
    Ok(ReadResponse { entries, next_start_id: page.next_start_id, oversized_ids: page.oversized_ids })
}

/// A page of the range `start`..=`end` (XRANGE bounds) across the archive and
/// the stream: entries up to the manifest's `archived_through` come from the
/// archive (also those a crash left in the stream too), the rest from the
/// stream, so none is missed or returned twice. Returns the page and
/// `archived_through`.
async fn spanning_page(
    streams: &Streams,
    folding: &Folding,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
) -> Result<(Page, Option<StreamId>), Error> {
    let max_bytes = streams.guard.max_message_bytes;
    let archive = folding.archive();
    let manifest = archive
        .manifest(stream)
        .await
        .map_err(|e| crate::archive::fold::store_error(e, "reading the manifest", stream))?;
    let through = manifest.archived_through();
    let first = bound_id(start, StreamId::ZERO);
    let last = bound_id(end, StreamId::MAX);
    let Some(through) = through.filter(|through| first <= *through && first <= last) else {
        return Ok((page(&streams.redis, stream, start, end, count, max_bytes).await?, through));
    };
    // One more than the page, to know where the next starts.
    let mut raw = archive
        .read(stream, &manifest, first, last.min(through), count + 1)
        .await
        .map_err(|e| crate::archive::fold::store_error(e, "reading archive files", stream))?;
    if raw.len() <= count && last > through {
        if let Some(after) = through.successor() {
            let live = range(&streams.redis, stream, &after.to_string(), end, count + 1 - raw.len()).await?;
            raw.extend(live);
        }
    }
    Ok((fit(raw, count, max_bytes), Some(through)))
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
}
