//! Read: validate the range → XRANGE (one entry more than asked, to know where
//! the next page starts) → entries.

use prost_types::Timestamp;

use super::Streams;
use crate::{
    entry,
    error::Error,
    id::StreamId,
    proto::{ReadRequest, ReadResponse},
    redis::{parse_entries, RawEntry, Redis},
    security::Caller,
};

/// Page size when a request sends 0 (entries).
pub const DEFAULT_PAGE: usize = 100;
/// Largest page a request may ask for (entries).
pub const MAX_PAGE: usize = 10_000;

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

/// A request's page size: 0 → [`DEFAULT_PAGE`]; above [`MAX_PAGE`] is INVALID_ARGUMENT.
pub fn page_size(field: &'static str, count: u32) -> Result<usize, Error> {
    match count as usize {
        0 => Ok(DEFAULT_PAGE),
        n if n > MAX_PAGE => Err(Error::invalid(field, format!("{n} is above the limit of {MAX_PAGE}"))),
        n => Ok(n),
    }
}

/// Read: one page of the range, oldest first.
pub(super) async fn read(
    streams: &Streams,
    caller: Option<&Caller>,
    request: &ReadRequest,
) -> Result<ReadResponse, Error> {
    let stream = streams.guard.stream(caller, "stream", &request.stream)?;
    super::not_sharded(&streams.redis, "stream", stream).await?;
    let start = parse_bound("start_id", &request.start_id, "start_time", request.start_time, End::Start)?;
    let end = parse_bound("end_id", &request.end_id, "end_time", request.end_time, End::End)?;
    let count = page_size("count", request.count)?;
    let page = page(&streams.redis, stream, &start, &end, count, streams.guard.max_message_bytes).await?;
    let entries = page.entries.into_iter().filter_map(|e| entry::to_entry(e, &streams.id_field, |_| false)).collect();
    Ok(ReadResponse { entries, next_start_id: page.next_start_id, oversized_ids: page.oversized_ids })
}

/// One page of a stream, sized to fit one gRPC message.
#[derive(Debug, Default)]
pub struct Page {
    /// The entries, oldest first.
    pub entries: Vec<RawEntry>,
    /// Where the next page starts; empty at the end of the range.
    pub next_start_id: String,
    /// Entries of the page's range too large for one gRPC message on their own
    /// (bytes over `--max-message-bytes`): their stream ids, left out.
    pub oversized_ids: Vec<String>,
}

/// Room for the response around its entries, and for each field's encoding (bytes).
const PAGE_OVERHEAD: usize = 1024;
const ENTRY_OVERHEAD: usize = 128;
const FIELD_OVERHEAD: usize = 24;

/// An upper bound of an entry's encoded size: a field may appear both in the
/// payload map and among the raw fields.
fn encoded_bound(entry: &RawEntry) -> usize {
    let fields = entry.fields.as_deref().unwrap_or_default();
    ENTRY_OVERHEAD + fields.iter().map(|(name, value)| 2 * (name.len() + value.len()) + FIELD_OVERHEAD).sum::<usize>()
}

/// One page of `stream` between the XRANGE bounds `start` and `end`: up to
/// `count` entries, no more than fit in `max_bytes` (a response must not
/// exceed the gRPC message limit), and the id the next page starts at (empty
/// at the end). Asks for one entry more than it returns, to know whether there
/// is a next. An entry too large for a message on its own is left out and
/// named in [`Page::oversized_ids`], so paging never sticks on it.
///
/// Errors: [`Error::WrongType`], [`Error::Unavailable`].
pub async fn page(
    redis: &Redis,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
    max_bytes: usize,
) -> Result<Page, Error> {
    let mut conn = redis.conn.clone();
    let reply: redis::Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg(start)
        .arg(end)
        .arg("COUNT")
        .arg(count + 1)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "reading (XRANGE)", stream))?;
    let raw = parse_entries(&reply).map_err(|e| Error::from_redis(e, "reading (XRANGE)", stream))?;
    let budget = max_bytes.saturating_sub(PAGE_OVERHEAD);
    let (mut page, mut used) = (Page::default(), 0);
    for (i, entry) in raw.into_iter().enumerate() {
        let size = encoded_bound(&entry);
        if i == count || (used + size > budget && size <= budget) {
            page.next_start_id = entry.id.to_string();
            break;
        }
        if size > budget {
            page.oversized_ids.push(entry.id.to_string());
            continue;
        }
        used += size;
        page.entries.push(entry);
    }
    Ok(page)
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
    fn page_size_defaults_and_caps() {
        assert_eq!(page_size("count", 0).unwrap(), DEFAULT_PAGE);
        assert!(page_size("count", 10_001).is_err());
    }
}
