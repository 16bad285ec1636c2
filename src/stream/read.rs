//! Read: validate the range → XRANGE (one entry more than asked, to know where
//! the next page starts) → entries.

use prost_types::Timestamp;

use super::Streams;
use crate::{
    entry,
    error::Error,
    id::StreamId,
    proto::{ReadRequest, ReadResponse},
    redis::range::{page, page_size},
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

/// Read: one page of the range, oldest first.
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
    let page = page(&streams.redis, stream, &start, &end, count, streams.guard.max_message_bytes).await?;
    let entries = page.entries.into_iter().filter_map(|e| entry::to_entry(e, &streams.id_field, |_| false)).collect();
    Ok(ReadResponse { entries, next_start_id: page.next_start_id, oversized_ids: page.oversized_ids })
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
