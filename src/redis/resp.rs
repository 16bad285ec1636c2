//! A group reader's own plain-TCP connection to a single Redis server, which
//! turns `XREADGROUP` replies straight into entries.
//!
//! Why: through redis-rs every reply is parsed by its `combine` parser into a
//! generic [`Value`] tree, which [`super::parse_read_reply`] then takes apart.
//! On the consume path that was the largest share of the sidecar's CPU
//! (~21% of its samples in `perf`, about 2 µs per entry of a 256-entry
//! reply); reading the RESP bytes directly takes about a quarter of that.
//!
//! It speaks RESP2 (it never sends `HELLO`), one command at a time, and does
//! what redis-rs' connect would do for a reader: `AUTH` with the URL's
//! credentials, `SELECT` of its database, `CLIENT SETNAME`, `TCP_NODELAY` and
//! the sidecar's keepalive. Error replies are parsed by redis-rs, so a
//! reader's errors are the same [`RedisError`]s, classified by
//! [`super::fault`] as before. `rediss://`, `redis+unix://` and clusters keep
//! redis-rs' connections ([`super::readers`] decides).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use redis::{Cmd, ErrorKind, RedisConnectionInfo, RedisError, RedisResult, Value};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::RawEntry;
use crate::id::StreamId;

/// Bytes asked of the socket per read; a 256-entry reply of 100-byte bodies
/// is ~50 KB.
const READ_CHUNK: usize = 64 * 1024;

/// One reader connection (see the module doc).
pub struct RespConnection {
    socket: TcpStream,
    /// Bytes read and not yet consumed: at most the start of the next reply.
    buffer: BytesMut,
    /// How far the reply at the front of `buffer` is known to be complete.
    scan: Scan,
    /// Bounds each reply (a reader's: its BLOCK time plus `--redis-timeout-ms`).
    reply_timeout: Duration,
}

impl RespConnection {
    /// Connects to `host:port` and sets the connection up for `settings`
    /// (`AUTH`, `SELECT` when the database is not 0) and names it `name`
    /// (`CLIENT SETNAME`; an ACL user without CLIENT, or a server without
    /// it, is not an error),
    /// all within `connect_timeout`; each later reply is awaited for at most
    /// `reply_timeout`.
    ///
    /// Errors: an I/O error (refused, unreachable), a timed-out I/O error
    /// after `connect_timeout`, or Redis' own error for `AUTH` (WRONGPASS),
    /// `SELECT`, or the naming (NOAUTH when Redis wants a password none was
    /// given for; `ERR max number of clients reached`).
    pub async fn connect(
        host: &str,
        port: u16,
        settings: &RedisConnectionInfo,
        name: &str,
        connect_timeout: Duration,
        reply_timeout: Duration,
    ) -> RedisResult<RespConnection> {
        let connecting = async {
            let socket = TcpStream::connect((host, port)).await?;
            socket.set_nodelay(true)?;
            redis::io::tcp::socket2::SockRef::from(&socket).set_tcp_keepalive(&super::tcp_keepalive())?;
            let mut conn = RespConnection {
                socket,
                buffer: BytesMut::with_capacity(READ_CHUNK),
                scan: Scan::default(),
                reply_timeout: connect_timeout,
            };
            conn.set_up(settings, name).await?;
            RedisResult::Ok(conn)
        };
        let mut conn = tokio::time::timeout(connect_timeout, connecting).await.map_err(|_| timed_out())??;
        conn.reply_timeout = reply_timeout;
        Ok(conn)
    }

    /// `AUTH`, `SELECT` and `CLIENT SETNAME` in one round trip.
    async fn set_up(&mut self, settings: &RedisConnectionInfo, name: &str) -> RedisResult<()> {
        let mut commands = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            auth.arg(settings.username()).arg(password);
            commands.push(auth);
        }
        if settings.db() != 0 {
            commands.push(redis::cmd("SELECT").arg(settings.db()).clone());
        }
        commands.push(redis::cmd("CLIENT").arg("SETNAME").arg(name).clone());
        let mut packed = Vec::new();
        for command in &commands {
            command.write_packed_command(&mut packed);
        }
        self.socket.write_all(&packed).await?;
        let naming = commands.len() - 1;
        for step in 0..commands.len() {
            let reply = self.reply().await?;
            match parse_error(&reply) {
                Err(e) if step == naming && naming_is_optional(&e) => {
                    tracing::debug!("a reader connection could not name itself ({e}); it reads all the same")
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Sends `read` (an `XREADGROUP` of one stream) and returns its entries:
    /// none when the BLOCK time passed with none, as [`super::parse_read_reply`].
    ///
    /// Errors: Redis' error reply (NOGROUP, NOPERM, …); an I/O error when the
    /// connection drops; a timed-out I/O error after the reply timeout (the
    /// connection is then unusable: the late reply would answer the next
    /// command); a Parse error for a reply of another shape (after which the
    /// connection is unusable too: where the next reply starts is unknown).
    pub async fn read_entries(&mut self, read: &Cmd) -> RedisResult<Vec<RawEntry>> {
        let reply_timeout = self.reply_timeout;
        let asking = async {
            self.socket.write_all(&read.get_packed_command()).await?;
            self.reply().await
        };
        let reply = tokio::time::timeout(reply_timeout, asking).await.map_err(|_| timed_out())??;
        parse_read_reply(&reply)
    }

    /// `PING`, answered within `timeout`: the pool's health check.
    ///
    /// Errors: as [`RespConnection::read_entries`].
    pub async fn ping(&mut self, timeout: Duration) -> RedisResult<()> {
        let asking = async {
            self.socket.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
            self.reply().await
        };
        let reply = tokio::time::timeout(timeout, asking).await.map_err(|_| timed_out())??;
        parse_error(&reply)
    }

    /// The next complete reply's bytes.
    async fn reply(&mut self) -> RedisResult<Bytes> {
        loop {
            if let Some(len) = self.scan.complete(&self.buffer)? {
                self.scan = Scan::default();
                return Ok(take_reply(&mut self.buffer, len));
            }
            self.buffer.reserve(READ_CHUNK);
            if self.socket.read_buf(&mut self.buffer).await? == 0 {
                let closed = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "Redis closed the connection");
                return Err(closed.into());
            }
        }
    }
}

/// Splits the first `len` bytes (a complete reply) off `buffer`. Entries'
/// fields are slices of the reply (see [`parse_read_reply`]), and every
/// slice keeps the whole allocation it lies in: a reply much smaller than
/// the buffer after it is copied out instead, so a delivery held for a slow
/// client keeps at most [`PINNED_PER_REPLY`] times its reply's bytes, not
/// [`READ_CHUNK`] for one entry. After a large reply the buffer starts
/// afresh: what is left of a big allocation would otherwise keep all of it
/// (the reply's bytes share it) for as long as the group has calls, for
/// every reader that once read a burst of large entries.
fn take_reply(buffer: &mut BytesMut, len: usize) -> Bytes {
    if buffer.capacity() > PINNED_PER_REPLY * len {
        let reply = Bytes::copy_from_slice(&buffer[..len]);
        bytes::Buf::advance(buffer, len);
        return reply;
    }
    let reply = buffer.split_to(len).freeze();
    if buffer.capacity() > RETAINED_MAX {
        let mut fresh = BytesMut::with_capacity(READ_CHUNK.max(buffer.len()));
        fresh.extend_from_slice(buffer);
        *buffer = fresh;
    }
    reply
}

/// The most spare buffer a reader keeps between replies (bytes).
const RETAINED_MAX: usize = 4 * READ_CHUNK;

/// At most how many times its own size of buffer a reply's bytes may keep
/// allocated (see [`take_reply`]).
const PINNED_PER_REPLY: usize = 4;

/// The timed-out I/O error redis-rs gives for a reply that does not come
/// ([`RedisError::is_timeout`], so [`super::fault`] says Timeout).
pub(super) fn timed_out() -> RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "Redis did not answer the reader in time").into()
}

/// Whether a `CLIENT SETNAME` refusal leaves the connection usable: the ACL
/// user may not run CLIENT (NOPERM), or the server does not know it. Any
/// other (NOAUTH: a password is needed; `max number of clients reached`)
/// is the connection's failure, reported as such rather than as the next
/// read's puzzling error.
fn naming_is_optional(error: &RedisError) -> bool {
    error.code() == Some("NOPERM") || error.to_string().contains("unknown")
}

/// `Err` with Redis' error for an error reply (`-…`), parsed by redis-rs so
/// that its code and kind are what every other command's error has.
fn parse_error(reply: &[u8]) -> RedisResult<()> {
    if reply.first() == Some(&b'-') {
        redis::parse_redis_value(reply).and_then(Value::extract_error)?;
    }
    Ok(())
}

/// How far a RESP2 reply at the front of a buffer has been found complete,
/// kept between socket reads so a large reply is scanned once.
#[derive(Debug)]
struct Scan {
    /// Where the next unscanned item starts.
    pos: usize,
    /// Items still to come: 1 at the start; an array header adds its length.
    remaining: usize,
}

impl Default for Scan {
    fn default() -> Scan {
        Scan { pos: 0, remaining: 1 }
    }
}

impl Scan {
    /// The length of the complete reply at the front of `buffer`, `None`
    /// while more bytes are needed.
    ///
    /// Errors: a Parse error for a byte that starts no RESP2 item.
    fn complete(&mut self, buffer: &[u8]) -> RedisResult<Option<usize>> {
        while self.remaining > 0 {
            let Some((kind, header, after)) = line(buffer, self.pos)? else { return Ok(None) };
            match kind {
                b'+' | b'-' | b':' => self.pos = after,
                b'$' => match number(header)? {
                    n if n < 0 => self.pos = after,
                    n => {
                        let end = after + n as usize + 2;
                        if end > buffer.len() {
                            return Ok(None);
                        }
                        self.pos = end;
                    }
                },
                b'*' => {
                    self.pos = after;
                    self.remaining += number(header)?.max(0) as usize;
                }
                other => return Err(malformed(format!("a reply item starting with byte {other:#04x}"))),
            }
            self.remaining -= 1;
        }
        Ok(Some(self.pos))
    }
}

/// The item header at `pos`: its type byte, the text after it up to CRLF,
/// and where the next byte starts; `None` when the CRLF has not arrived.
fn line(buffer: &[u8], pos: usize) -> RedisResult<Option<(u8, &[u8], usize)>> {
    let Some(rest) = buffer.get(pos..).filter(|rest| !rest.is_empty()) else { return Ok(None) };
    // Headers are a few bytes: a plain scan for the CR beats `windows(2)`,
    // which the profile showed per header, twice per reply (scan and parse).
    let mut from = 0;
    loop {
        let Some(cr) = rest[from..].iter().position(|&b| b == b'\r').map(|at| from + at) else { return Ok(None) };
        match rest.get(cr + 1) {
            Some(b'\n') => return Ok(Some((rest[0], &rest[1..cr], pos + cr + 2))),
            Some(_) => from = cr + 1,
            None => return Ok(None),
        }
    }
}

/// A header's number: ASCII digits after an optional `-`, within `i64`.
/// Parsed by hand: a UTF-8 check and `str::parse` per header were, with
/// the stream ids, a fifth of the sidecar's instructions per delivery.
fn number(text: &[u8]) -> RedisResult<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', digits)) => (true, digits),
        _ => (false, text),
    };
    let magnitude = crate::id::decimal(digits).and_then(|n| i64::try_from(n).ok());
    match magnitude {
        Some(n) if negative => Ok(-n),
        Some(n) => Ok(n),
        None => Err(malformed(format!("a length, got {:?}", String::from_utf8_lossy(text)))),
    }
}

fn malformed(what: String) -> RedisError {
    RedisError::from((ErrorKind::Parse, "unexpected reply from Redis", what))
}

/// Parses one complete `XREADGROUP` reply of RESP2 bytes: nil (`*-1`) on
/// timeout, else `[[stream, [[id, [field, value, …] or nil], …]], …]`; an
/// error reply is Redis' error. The same entries as
/// [`super::parse_read_reply`] of the reply's [`Value`]; malformed items are
/// an error, never skipped. Field names and values are slices of `reply`
/// (no copy, no allocation each).
pub fn parse_read_reply(reply: &Bytes) -> RedisResult<Vec<RawEntry>> {
    parse_error(reply)?;
    let mut reply = Cursor { whole: reply, bytes: reply };
    let Some(streams) = reply.array("an XREADGROUP reply")? else { return Ok(Vec::new()) };
    let mut entries = Vec::new();
    for _ in 0..streams {
        if reply.array("[stream, entries]")? != Some(2) {
            return Err(malformed("expected [stream, entries]".into()));
        }
        reply.bulk("a stream name")?;
        let count = reply.array("a list of stream entries")?.unwrap_or(0);
        // Bounded by what arrived: a count no reply this size can hold must
        // end in a parse error, not in a huge allocation first.
        entries.reserve(count.min(reply.bytes.len() / MIN_ENTRY_BYTES));
        for _ in 0..count {
            entries.push(reply.entry()?);
        }
    }
    Ok(entries)
}

/// The fewest bytes an entry (`*2\r\n$3\r\n0-0\r\n*-1\r\n`) and a field
/// pair (`$0\r\n\r\n` twice) take in a reply, to bound what a count
/// read from the reply may reserve.
const MIN_ENTRY_BYTES: usize = 18;
const MIN_FIELD_BYTES: usize = 12;

/// Reads RESP2 items off the front of a complete reply.
struct Cursor<'a> {
    /// The whole reply, which field slices are taken of.
    whole: &'a Bytes,
    /// What is left of it.
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    /// The header of type `kind`: its number, and the rest after its CRLF.
    fn header(&mut self, kind: u8, what: &str) -> RedisResult<i64> {
        match line(self.bytes, 0)? {
            Some((found, header, after)) if found == kind => {
                let n = number(header)?;
                self.bytes = &self.bytes[after..];
                Ok(n)
            }
            _ => Err(malformed(format!("expected {what}, got {:?}", self.preview()))),
        }
    }

    /// An array's length; `None` for nil.
    fn array(&mut self, what: &str) -> RedisResult<Option<usize>> {
        let n = self.header(b'*', what)?;
        Ok((n >= 0).then_some(n as usize))
    }

    /// A bulk string's bytes (nil is malformed here).
    fn bulk(&mut self, what: &str) -> RedisResult<&'a [u8]> {
        let n = self.header(b'$', what)?;
        let body = usize::try_from(n).ok().and_then(|len| {
            let bytes = self.bytes.get(..len)?;
            let rest = self.bytes.get(len..)?.strip_prefix(b"\r\n")?;
            Some((bytes, rest))
        });
        let Some((bytes, rest)) = body else {
            return Err(malformed(format!(
                "expected {what}, got a bulk string of length {n} with {} bytes left",
                self.bytes.len()
            )));
        };
        self.bytes = rest;
        Ok(bytes)
    }

    /// One `[id, [field, value, …]]` (or `[id, nil]`: deleted while pending).
    fn entry(&mut self) -> RedisResult<RawEntry> {
        if self.array("a stream entry")? != Some(2) {
            return Err(malformed("expected a stream entry of [id, fields]".into()));
        }
        let id = self.bulk("a stream id")?;
        let id = StreamId::parse_ascii(id)
            .ok_or_else(|| malformed(format!("expected a stream id, got {:?}", String::from_utf8_lossy(id))))?;
        let fields = match self.array("an entry's field list")? {
            None => None,
            Some(n) if n % 2 == 0 => {
                let mut fields = Vec::with_capacity((n / 2).min(self.bytes.len() / MIN_FIELD_BYTES));
                for _ in 0..n / 2 {
                    let name = self.whole.slice_ref(self.bulk("a field name")?);
                    fields.push((name, self.whole.slice_ref(self.bulk("a field value")?)));
                }
                Some(fields)
            }
            Some(n) => return Err(malformed(format!("expected an even field list, got {n} items"))),
        };
        Ok(RawEntry { id, fields })
    }

    /// The start of what is left, for an error message.
    fn preview(&self) -> String {
        String::from_utf8_lossy(&self.bytes[..self.bytes.len().min(40)]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> RedisResult<Vec<RawEntry>> {
        parse_read_reply(&Bytes::copy_from_slice(bytes))
    }

    /// An entry as the tests write it: its id, and its fields or none (deleted).
    type Entry<'a> = (&'a str, Option<&'a [(&'a [u8], &'a [u8])]>);

    /// A reply as Redis 7.0 sends it: one stream, `entries` of (id, fields).
    fn reply(entries: &[Entry]) -> Vec<u8> {
        let bulk = |out: &mut Vec<u8>, bytes: &[u8]| {
            out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        };
        let mut out = b"*1\r\n*2\r\n".to_vec();
        bulk(&mut out, b"orders");
        out.extend_from_slice(format!("*{}\r\n", entries.len()).as_bytes());
        for (id, fields) in entries {
            out.extend_from_slice(b"*2\r\n");
            bulk(&mut out, id.as_bytes());
            match fields {
                None => out.extend_from_slice(b"*-1\r\n"),
                Some(fields) => {
                    out.extend_from_slice(format!("*{}\r\n", fields.len() * 2).as_bytes());
                    for (name, value) in *fields {
                        bulk(&mut out, name);
                        bulk(&mut out, value);
                    }
                }
            }
        }
        out
    }

    const ENTRIES: [Entry; 3] = [
        ("1-0", Some(&[(b"body", b"hello"), (b"\xff", b"")])),
        ("1-1", None),
        ("2-7", Some(&[(b"body", b"a\r\nb"), (b"body", b"again")])),
    ];

    #[test]
    fn entries_are_what_the_value_parser_finds() {
        let bytes = reply(&ENTRIES);
        let expected = super::super::parse_read_reply(redis::parse_redis_value(&bytes).unwrap()).unwrap();
        assert_eq!(parse(&bytes).unwrap(), expected);
        assert_eq!(expected.len(), 3);
        assert_eq!(expected[1].fields, None);
        assert_eq!(expected[2].fields.as_ref().unwrap()[0].1, &b"a\r\nb"[..]);
    }

    #[test]
    fn header_numbers_are_decimal_within_i64_and_anything_else_is_a_parse_error() {
        assert_eq!(number(b"0").unwrap(), 0);
        assert_eq!(number(b"-1").unwrap(), -1);
        assert_eq!(number(b"9223372036854775807").unwrap(), i64::MAX);
        for bad in [&b""[..], b"-", b"+1", b" 1", b"1 ", b"1a", b"9223372036854775808", b"99999999999999999999"] {
            assert_eq!(number(bad).unwrap_err().kind(), ErrorKind::Parse, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_header_ends_at_its_crlf_not_at_a_lone_cr() {
        assert_eq!(line(b"$3\r\nabc", 0).unwrap(), Some((b'$', &b"3"[..], 4)));
        assert_eq!(line(b"+a\rb\r\n", 0).unwrap(), Some((b'+', &b"a\rb"[..], 6)));
        assert_eq!(line(b"+a\r", 0).unwrap(), None, "the LF has not arrived");
        assert_eq!(line(b"xx:5\r\n", 2).unwrap(), Some((b':', &b"5"[..], 6)));
        assert_eq!(line(b"", 0).unwrap(), None);
    }

    #[test]
    fn nil_and_empty_replies_have_no_entries() {
        assert_eq!(parse(b"*-1\r\n").unwrap(), Vec::new());
        assert_eq!(parse(&reply(&[])).unwrap(), Vec::new());
    }

    #[test]
    fn an_error_reply_is_the_error_redis_rs_would_give() {
        let e = parse(b"-NOGROUP No such key 'orders' or consumer group 'g'\r\n").unwrap_err();
        assert_eq!(e.code(), Some("NOGROUP"));
        assert_eq!(super::super::fault(&e), super::super::Fault::NoGroup);
    }

    #[test]
    fn a_malformed_reply_is_a_parse_error_not_fewer_entries() {
        let odd = b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*1\r\n$1\r\na\r\n";
        let bad_id = b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\nx-0\r\n*-1\r\n";
        let integer = b":5\r\n";
        for bytes in [&odd[..], bad_id, integer] {
            assert_eq!(parse(bytes).unwrap_err().kind(), ErrorKind::Parse, "{bytes:?}");
        }
    }

    #[test]
    fn a_reply_cut_anywhere_is_a_parse_error_not_a_panic() {
        let bytes = reply(&ENTRIES);
        for cut in 0..bytes.len() {
            let parsed = std::panic::catch_unwind(|| parse(&bytes[..cut]));
            let Ok(parsed) = parsed else { panic!("panicked at cut {cut} of {}", bytes.len()) };
            assert_eq!(parsed.map_err(|e| e.kind()), Err(ErrorKind::Parse), "cut {cut} of {}", bytes.len());
        }
    }

    #[test]
    fn counts_larger_than_the_reply_are_a_parse_error_not_an_allocation() {
        let entries = b"*1\r\n*2\r\n$1\r\ns\r\n*4611686018427387903\r\n";
        let fields = b"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n1-0\r\n*9223372036854775806\r\n";
        let bulk = b"*1\r\n*2\r\n$9223372036854775807\r\ns\r\n";
        for bytes in [&entries[..], &fields[..], &bulk[..]] {
            assert_eq!(parse(bytes).unwrap_err().kind(), ErrorKind::Parse, "{bytes:?}");
        }
    }

    #[test]
    fn a_large_reply_leaves_no_large_buffer_behind() {
        let mut buffer = BytesMut::from(&vec![b'x'; 8 * 1024 * 1024][..]);
        buffer.extend_from_slice(b"+PO");
        let reply = take_reply(&mut buffer, 8 * 1024 * 1024);
        assert_eq!(reply.len(), 8 * 1024 * 1024);
        assert_eq!(&buffer[..], b"+PO", "the start of the next reply is kept");
        assert!(buffer.capacity() <= RETAINED_MAX, "{} bytes kept", buffer.capacity());
        let mut small = BytesMut::with_capacity(READ_CHUNK);
        small.extend_from_slice(b"+OK\r\n");
        let spare = small.capacity();
        take_reply(&mut small, 5);
        assert_eq!(small.capacity(), spare - 5, "a small reply's buffer is reused, not reallocated");
    }

    #[test]
    fn a_small_reply_is_copied_out_and_a_large_one_shares_the_buffer() {
        let mut buffer = BytesMut::with_capacity(READ_CHUNK);
        buffer.extend_from_slice(b"+OK\r\n+PONG\r\n");
        let start = buffer.as_ptr();
        let small = take_reply(&mut buffer, 5);
        assert_eq!(&small[..], b"+OK\r\n");
        assert_ne!(small.as_ptr(), start, "a 5-byte reply must not keep a 64 KiB buffer");
        assert_eq!(&buffer[..], b"+PONG\r\n");

        let mut buffer = BytesMut::with_capacity(READ_CHUNK);
        buffer.extend_from_slice(&reply(&[("1-0", Some(&[(b"body", &[b'x'; 40_000])]))]));
        let (start, len) = (buffer.as_ptr(), buffer.len());
        let large = take_reply(&mut buffer, len);
        assert_eq!(large.as_ptr(), start, "a reply filling the buffer is not copied");
        let entries = parse_read_reply(&large).unwrap();
        let value = &entries[0].fields.as_ref().unwrap()[0].1;
        assert!(large.as_ptr_range().contains(&value.as_ptr()), "a field's value is a slice of its reply");
    }

    #[test]
    fn a_reply_is_complete_only_when_its_last_byte_has_arrived_in_whatever_pieces() {
        let bytes = reply(&ENTRIES);
        for cut in 0..bytes.len() {
            let mut scan = Scan::default();
            assert_eq!(scan.complete(&bytes[..cut]).unwrap(), None, "complete at {cut} of {}", bytes.len());
            // Resumed over the whole buffer, as after the next socket read.
            assert_eq!(scan.complete(&bytes).unwrap(), Some(bytes.len()), "cut at {cut}");
        }
        let mut two = bytes.clone();
        two.extend_from_slice(b"+PONG\r\n");
        assert_eq!(Scan::default().complete(&two).unwrap(), Some(bytes.len()));
        assert_eq!(Scan::default().complete(b"*-1\r\n").unwrap(), Some(5));
        assert!(Scan::default().complete(b"!oops\r\n").is_err());
    }
}
