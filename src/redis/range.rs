//! Range paging: one page of a stream's entries, sized to fit one gRPC
//! message (XRANGE). Read and ListDeadLetters page the same way.

use crate::{
    error::Error,
    redis::{parse_entries, RawEntry, Redis},
};

/// Page size when a request sends 0 (entries).
pub const DEFAULT_PAGE: usize = 100;
/// Largest page a request may ask for (entries).
pub const MAX_PAGE: usize = 10_000;

/// A request's page size: 0 → [`DEFAULT_PAGE`]; above [`MAX_PAGE`] is INVALID_ARGUMENT.
pub fn page_size(field: &'static str, count: u32) -> Result<usize, Error> {
    match count as usize {
        0 => Ok(DEFAULT_PAGE),
        n if n > MAX_PAGE => Err(Error::invalid(field, format!("{n} is above the limit of {MAX_PAGE}"))),
        n => Ok(n),
    }
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
    Ok(fit(range(redis, stream, start, end, count + 1).await?, count, max_bytes))
}

/// Up to `count` entries of `stream` between the XRANGE bounds `start` and
/// `end`, oldest first (XRANGE … COUNT).
///
/// Errors: [`Error::WrongType`], [`Error::Unavailable`].
pub async fn range(redis: &Redis, stream: &str, start: &str, end: &str, count: usize) -> Result<Vec<RawEntry>, Error> {
    let mut conn = redis.conn.clone();
    let reply: redis::Value = xrange(stream, start, end, count)
        .query_async(&mut conn)
        .await
        .map_err(|e| Error::from_redis(e, "reading (XRANGE)", stream))?;
    parse_entries(reply).map_err(|e| Error::from_redis(e, "reading (XRANGE)", stream))
}

/// As [`range`], then the string at `key` (none when absent), in one
/// pipeline: XRANGE before GET, so what the GET returns was written no later
/// than the range was read.
///
/// Errors: [`Error::WrongType`] (of the stream or the key), [`Error::Unavailable`].
pub async fn range_then_get(
    redis: &Redis,
    stream: &str,
    start: &str,
    end: &str,
    count: usize,
    key: &str,
) -> Result<(Vec<RawEntry>, Option<String>), Error> {
    let mut conn = redis.conn.clone();
    let mut pipe = redis::pipe();
    pipe.add_command(xrange(stream, start, end, count)).cmd("GET").arg(key);
    let (entries, value): (redis::Value, Option<String>) =
        pipe.query_async(&mut conn).await.map_err(|e| Error::from_redis(e, "reading (XRANGE, GET)", stream))?;
    let entries = parse_entries(entries).map_err(|e| Error::from_redis(e, "reading (XRANGE)", stream))?;
    Ok((entries, value))
}

fn xrange(stream: &str, start: &str, end: &str, count: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(stream).arg(start).arg(end).arg("COUNT").arg(count);
    cmd
}

/// A page of `raw` (oldest first, one more than `count` when there is a
/// next page): as [`page`] sizes it.
pub fn fit(raw: Vec<RawEntry>, count: usize, max_bytes: usize) -> Page {
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
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_defaults_and_caps() {
        assert_eq!(page_size("count", 0).unwrap(), DEFAULT_PAGE);
        assert!(page_size("count", MAX_PAGE as u32 + 1).is_err());
        assert_eq!(page_size("count", 7).unwrap(), 7);
    }
}
