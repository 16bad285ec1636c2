//! The generator: random material (ids of every class, reasons, durations of
//! every sign and size) and the random messages built from it, each with what
//! it deserves: a call's first message and the status it gets, a verdict or
//! an extension and the verdict errors ([`Expect`]) and ledger effects
//! ([`Effect`]) it brings, a pool's subscribe, a bad Append.

use std::collections::HashMap;

use echomq::proto::consume_request::Kind;
use echomq::proto::{
    Ack, AckEmit, AppendBatchRequest, AppendRequest, BatchEntry, ConsumeRequest, Drain, Emit, Extend, Fail, GroupStart,
    Release, Subscribe, VerdictErrorCode,
};
use tonic::Code;

use super::ledger::Effect;
use super::oracle::{short, Expect};
use super::support::{fields, req, subscribe_msg, unique};
use super::{GROUP, OVERSIZED};

use VerdictErrorCode::{InvalidArgument as INVALID, UnknownId as UNKNOWN};

fn hex(rng: &mut fastrand::Rng, len: usize) -> String {
    (0..len).map(|_| char::from(b"0123456789abcdef"[rng.usize(..16)])).collect()
}

/// A well-formed branded id no entry has: its milliseconds are ~8,900 years away.
pub(crate) fn unknown_id(rng: &mut fastrand::Rng) -> String {
    if rng.u32(..8) == 0 {
        return "0".repeat(28);
    }
    format!("{:012x}{:016x}", 0xfff0_0000_0000u64 + rng.u64(..0xffff_ffff), rng.u64(..))
}

/// A text that is not a branded id, often derived from `base` (a real one).
fn malformed_id(rng: &mut fastrand::Rng, base: Option<&str>) -> String {
    let b = base.map_or_else(|| hex(rng, 28), str::to_owned);
    match rng.u32(..16) {
        0 => {
            let upper = b.to_uppercase();
            if upper == b {
                format!("{}A", &b[..27])
            } else {
                upper
            }
        }
        1 => b[..27].to_owned(),
        2 => format!("{b}0"),
        3 => format!("{}é", &b[..26]), // 28 bytes, not hex
        4 => "０".repeat(28),          // fullwidth digits
        5 => format!("🚀{}", &b[1..]),
        6 => "a".repeat(10 * 1024),
        7 => b.repeat(10 * 1024 / 28 + 1),
        8 => String::new(),
        9 => format!(" {b}"),
        10 => format!("{b}\n"),
        11 => format!("0x{}", &b[2..]),
        12 => "1718000000000-3".to_owned(),
        13 => format!("{}g", &b[..27]),
        14 => format!("{}\u{0}", &b[..27]),
        _ => format!("\u{202e}{}", &b[..25]), // a right-to-left override
    }
}

fn reason(rng: &mut fastrand::Rng) -> String {
    match rng.u32(..20) {
        _ if rng.u32(..60) == 0 => "x".repeat(1024 * 1024),
        // 1.2 MB of two-byte characters: the cut must land on a boundary.
        _ if rng.u32(..60) == 0 => "é".repeat(600 * 1024),
        0 => "🚀".repeat(2000),
        1 => String::new(),
        2 => "line\nbreak\ttab \u{0} nul".to_owned(),
        _ => format!("fuzz reason {}", rng.u32(..1000)),
    }
}

pub(crate) fn dur(seconds: i64, nanos: i32) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos }
}

fn negative_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [
        dur(-1, 0),
        dur(0, -1),
        dur(-5, -500_000_000),
        dur(-1, 999_999_999), // normalises to -1 ns
        dur(0, -1_500_000_000),
        dur(i64::MIN, 0),
        dur(i64::MIN, -999_999_999),
    ];
    choices[rng.usize(..choices.len())]
}

/// Not negative, but absurd: from 31 years to the largest Duration there is,
/// or positive with nanos out of range or of the other sign (a protobuf
/// Duration must not have those). The sidecar may take them or refuse them
/// (INVALID_ARGUMENT); it must not choke on them.
fn odd_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [
        dur(1_000_000_000, 0),
        dur(10_000_000_000_000, 0),
        dur(i64::MAX / 2, 0),
        dur(i64::MAX, 999_999_999),
        dur(i64::MAX, i32::MAX),
        dur(0, 1_500_000_000),
        dur(2, -1_900_000_000),
    ];
    choices[rng.usize(..choices.len())]
}

/// Huge but well-formed: from 31 years to the largest Duration there is.
fn huge_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [dur(1_000_000_000, 0), dur(10_000_000_000_000, 0), dur(i64::MAX / 2, 0), dur(i64::MAX, 999_999_999)];
    choices[rng.usize(..choices.len())]
}

/// A positive duration a client would plausibly send.
fn small_duration(rng: &mut fastrand::Rng) -> prost_types::Duration {
    let choices = [dur(0, 10_000_000), dur(0, 50_000_000), dur(1, 0), dur(0, 999_999_999)];
    choices[rng.usize(..choices.len())]
}

fn pick<'a, T>(rng: &mut fastrand::Rng, items: &'a [T]) -> Option<&'a T> {
    (!items.is_empty()).then(|| &items[rng.usize(..items.len())])
}

/// A subscribe from the beginning, everything else default.
pub(crate) fn sub(stream: &str, group: &str) -> Subscribe {
    subscribe_msg(stream, group, GroupStart::Beginning)
}

/// The first message of a call, and the status it deserves (`None`: accepted).
/// (With huge durations either acceptance or INVALID_ARGUMENT is right: see
/// [`odd_duration`]; those cases are marked by [`super::oracle::EITHER`] in
/// their description.)
pub(crate) fn opening(rng: &mut fastrand::Rng) -> (String, ConsumeRequest, Option<Code>) {
    let stream = unique("fz-open");
    let ten_kb = "s".repeat(10 * 1024);
    let mut s = sub(&stream, "g-open");
    let invalid = Some(Code::InvalidArgument);
    let (what, message, code): (&str, ConsumeRequest, Option<Code>) = match rng.u32(..34) {
        0 => ("an Ack before the subscribe", req(Kind::Ack(Ack { ids: vec![unknown_id(rng)] })), invalid),
        1 => (
            "a Fail before the subscribe",
            req(Kind::Fail(Fail { id: unknown_id(rng), ..Default::default() })),
            invalid,
        ),
        2 => (
            "an Extend before the subscribe",
            req(Kind::Extend(Extend { ids: vec![hex(rng, 28)], by: Some(dur(1, 0)) })),
            invalid,
        ),
        3 => ("a Drain before the subscribe", req(Kind::Drain(Drain {})), invalid),
        4 => ("a message without a kind", ConsumeRequest { kind: None }, invalid),
        5 => ("an empty Ack before the subscribe", req(Kind::Ack(Ack { ids: vec![] })), invalid),
        6 => {
            s.stream = String::new();
            ("an empty stream", req(Kind::Subscribe(s)), invalid)
        }
        7 => {
            s.stream = ten_kb;
            ("a 10 KB stream name", req(Kind::Subscribe(s)), invalid)
        }
        8 => {
            s.stream = "é".repeat(513); // 1026 bytes in 513 characters
            ("a 1026-byte stream name", req(Kind::Subscribe(s)), invalid)
        }
        9 => {
            s.group = String::new();
            ("an empty group", req(Kind::Subscribe(s)), invalid)
        }
        10 => {
            s.group = ten_kb;
            ("a 10 KB group name", req(Kind::Subscribe(s)), invalid)
        }
        11 => {
            s.group_start = GroupStart::Unspecified as i32;
            ("no group_start", req(Kind::Subscribe(s)), invalid)
        }
        12 => {
            s.group_start = [99, -1, 5, i32::MAX][rng.usize(..4)];
            ("an unknown group_start value", req(Kind::Subscribe(s)), invalid)
        }
        13 => {
            s.group_start = GroupStart::Id as i32;
            let bad = [
                "",
                "abc",
                "1-2-3",
                "-1",
                "1-",
                "-",
                "18446744073709551616-0",
                "1-18446744073709551616",
                "١٢٣-٤",
                "0x10-1",
                " 1-1",
            ];
            s.start_id = (*pick(rng, &bad).unwrap()).to_owned();
            ("GROUP_START_ID with a malformed start_id", req(Kind::Subscribe(s)), invalid)
        }
        14 => {
            s.group_start = GroupStart::Instant as i32;
            ("GROUP_START_INSTANT without start_time", req(Kind::Subscribe(s)), invalid)
        }
        15 => {
            s.group_start = GroupStart::Instant as i32;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            let seconds = [-1 - rng.i64(0..1_000_000), now + 3_600 + rng.i64(0..i64::MAX / 2)][rng.usize(..2)];
            s.start_time = Some(prost_types::Timestamp { seconds, nanos: 0 });
            ("GROUP_START_INSTANT before the epoch or an hour ahead", req(Kind::Subscribe(s)), invalid)
        }
        16 => {
            s.max_in_flight = [10_001, u32::MAX][rng.usize(..2)];
            ("max_in_flight over the limit", req(Kind::Subscribe(s)), invalid)
        }
        17 => {
            s.ack_deadline = Some(negative_duration(rng));
            ("a negative ack_deadline", req(Kind::Subscribe(s)), invalid)
        }
        18 => {
            s.retry_backoff_initial = Some(negative_duration(rng));
            ("a negative retry_backoff_initial", req(Kind::Subscribe(s)), invalid)
        }
        19 => {
            s.retry_backoff_max = Some(negative_duration(rng));
            ("a negative retry_backoff_max", req(Kind::Subscribe(s)), invalid)
        }
        20 => {
            s.retry_backoff_initial = Some(dur(10, 0));
            s.retry_backoff_max = Some(dur(1, 0));
            ("retry_backoff_initial above retry_backoff_max", req(Kind::Subscribe(s)), invalid)
        }
        21 => {
            s.dead_letter_stream = ten_kb;
            ("a 10 KB dead_letter_stream", req(Kind::Subscribe(s)), invalid)
        }
        22..=24 => {
            s.stream = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)].to_owned();
            ("a key of another type", req(Kind::Subscribe(s)), Some(Code::FailedPrecondition))
        }
        25 => {
            s.group = "g".repeat(1025);
            (
                "a 1025-byte group name (the limit is --max-name-bytes, 1024 by default)",
                req(Kind::Subscribe(s)),
                invalid,
            )
        }
        26 => {
            s.dead_letter_stream = "x".repeat(OVERSIZED);
            ("an oversized first message", req(Kind::Subscribe(s)), Some(Code::ResourceExhausted))
        }
        // Edges that must be accepted.
        27 => {
            s.stream = format!("fz-ünïcødé-🚀-{}", rng.u32(..));
            ("a unicode stream name", req(Kind::Subscribe(s)), None)
        }
        28 => {
            s.stream = format!("{}{}", stream, "n".repeat(1024 - stream.len()));
            ("a stream name of exactly 1024 bytes", req(Kind::Subscribe(s)), None)
        }
        29 => {
            s.group_start = GroupStart::Id as i32;
            s.start_id = ["0", "0-0", "1-1", "18446744073709551615-18446744073709551615"][rng.usize(..4)].to_owned();
            ("GROUP_START_ID with a valid start_id", req(Kind::Subscribe(s)), None)
        }
        30 => {
            s.group_start = GroupStart::Instant as i32;
            s.start_time = Some(prost_types::Timestamp { seconds: 0, nanos: 0 });
            ("GROUP_START_INSTANT at the epoch", req(Kind::Subscribe(s)), None)
        }
        31 => {
            s.max_in_flight = 10_000;
            ("max_in_flight at the limit", req(Kind::Subscribe(s)), None)
        }
        32 => {
            s.ack_deadline = Some(huge_duration(rng));
            s.retry_backoff_max = Some(huge_duration(rng));
            ("huge ack_deadline and retry_backoff_max (EITHER)", req(Kind::Subscribe(s)), None)
        }
        _ => {
            s.ack_deadline = Some(dur(0, 0));
            ("a zero ack_deadline (no deadline)", req(Kind::Subscribe(s)), None)
        }
    };
    (what.to_owned(), message, code)
}

/// An id of some class, with what an Ack of it deserves (`None`: applied) and
/// whether it was held. A held id moves from `avail` to `gone`.
fn any_id(
    rng: &mut fastrand::Rng,
    avail: &mut Vec<String>,
    gone: &mut Vec<String>,
) -> (String, Option<VerdictErrorCode>, bool) {
    match rng.u32(..10) {
        0..=3 if !avail.is_empty() => {
            let id = avail.swap_remove(rng.usize(..avail.len()));
            gone.push(id.clone());
            (id, None, true)
        }
        4 | 5 => {
            let base = pick(rng, avail).or_else(|| pick(rng, gone)).cloned();
            (malformed_id(rng, base.as_deref()), Some(INVALID), false)
        }
        6 | 7 if !gone.is_empty() => (pick(rng, gone).unwrap().clone(), Some(UNKNOWN), false),
        _ => (unknown_id(rng), Some(UNKNOWN), false),
    }
}

/// Builds one random verdict or extension against `avail` (ids the call holds
/// and this step has not settled yet) and `gone` (ids that are not held: settled
/// earlier or never delivered). Appends what it deserves to `expects`.
pub(crate) fn verdict(
    rng: &mut fastrand::Rng,
    deadline: bool,
    avail: &mut Vec<String>,
    gone: &mut Vec<String>,
    expects: &mut Vec<Expect>,
    effects: &mut Vec<Effect>,
) -> (String, ConsumeRequest) {
    match rng.u32(..100) {
        0..=31 => {
            let n = [0, 1, 1, 1, 2, 3, 5][rng.usize(..7)];
            let mut ids = Vec::new();
            for _ in 0..n {
                let (id, code, held) = any_id(rng, avail, gone);
                match code {
                    Some(code) => expects.push(Expect::new(&id, code)),
                    None if held => effects.push(Effect::Acked(id.clone())),
                    None => {}
                }
                ids.push(id);
            }
            let text = format!("Ack [{}]", ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", "));
            (text, req(Kind::Ack(Ack { ids })))
        }
        32..=39 => {
            let n = [0, 1, 1, 2, 3][rng.usize(..5)];
            let mut ids = Vec::new();
            for _ in 0..n {
                let (id, code, held) = any_id(rng, avail, gone);
                match code {
                    Some(code) => expects.push(Expect::new(&id, code)),
                    None if held => {
                        // Given back to the group at once: it may come back to this call.
                        gone.retain(|g| *g != id);
                        effects.push(Effect::Failed(id.clone()));
                    }
                    None => {}
                }
                ids.push(id);
            }
            let text = format!("Release [{}]", ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", "));
            (text, req(Kind::Release(Release { ids })))
        }
        40..=79 => {
            let (id, code, held) = any_id(rng, avail, gone);
            let (retry, retry_text) = match rng.u32(..10) {
                0..=3 => (None, "none"),
                4 | 5 => (Some(small_duration(rng)), "small"),
                6 => (Some(dur(0, 0)), "zero"),
                7 | 8 => (Some(negative_duration(rng)), "negative"),
                _ => (Some(odd_duration(rng)), "odd"),
            };
            let dead_letter = rng.u32(..5) == 0;
            let reason = reason(rng);
            let text = format!(
                "Fail {} retry_after {retry_text} {:?} dead_letter {dead_letter} reason {} bytes",
                short(&id),
                retry,
                reason.len()
            );
            let message =
                req(Kind::Fail(Fail { id: id.clone(), reason, retry_after: retry, dead_letter, ..Default::default() }));
            match (code, retry_text) {
                (Some(INVALID), _) => expects.push(Expect::new(&id, INVALID)),
                // The delay is checked before the id is looked up: either answer is right.
                (Some(code), "negative" | "odd") => {
                    expects.push(Expect { text: id.clone(), codes: vec![code, INVALID], optional: false })
                }
                (Some(code), _) => expects.push(Expect::new(&id, code)),
                (None, "negative") if held => {
                    // Refused, so still held.
                    expects.push(Expect::new(&id, INVALID));
                    gone.retain(|g| *g != id);
                    avail.push(id);
                }
                (None, "odd") if held => {
                    // Not reused in this step: it may be retried (and come back), or
                    // dead-lettered, or refused (and still held).
                    gone.retain(|g| *g != id);
                    expects.push(Expect { text: id.clone(), codes: vec![INVALID], optional: true });
                    effects.push(Effect::MaybeSettled { id, expect: expects.len() - 1, dead_letter });
                }
                (None, _) if held && dead_letter => effects.push(Effect::DeadLettered(id)),
                (None, _) if held => {
                    // Not reused in this step: after its backoff it may be delivered again, to this call.
                    gone.retain(|g| *g != id);
                    effects.push(Effect::Failed(id));
                }
                (None, _) => {}
            }
            (text, message)
        }
        80..=92 => {
            let n = [0, 1, 1, 2, 4][rng.usize(..5)];
            // by_ok: Some(true) valid, Some(false) invalid, None either.
            let (by, by_ok, by_text) = match rng.u32(..8) {
                0 => (None, Some(false), "missing"),
                1 => (Some(dur(0, 0)), Some(false), "zero"),
                2 | 3 => (Some(negative_duration(rng)), Some(false), "negative"),
                4 => (Some(odd_duration(rng)), None, "odd"),
                _ => (Some(small_duration(rng)), Some(true), "small"),
            };
            let mut ids = Vec::new();
            for _ in 0..n {
                // An extension settles nothing: a held id stays available, unless
                // the call has an ack deadline, which is now `by` from now.
                let (id, code, held) = any_id(rng, avail, gone);
                if held {
                    gone.retain(|g| *g != id);
                    if by_ok != Some(false) && deadline {
                        effects.push(Effect::Released(id.clone()));
                    } else {
                        avail.push(id.clone());
                    }
                }
                match (by_ok, code) {
                    (Some(false), _) | (_, Some(INVALID)) => expects.push(Expect::new(&id, INVALID)),
                    (Some(true), Some(code)) => expects.push(Expect::new(&id, code)),
                    (Some(true), None) => {}
                    (None, Some(code)) => {
                        expects.push(Expect { text: id.clone(), codes: vec![code, INVALID], optional: false })
                    }
                    (None, None) => expects.push(Expect { text: id.clone(), codes: vec![INVALID], optional: true }),
                }
                ids.push(id);
            }
            let shown = ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(", ");
            let text = format!("Extend by {by_text} {by:?} [{shown}]");
            (text, req(Kind::Extend(Extend { ids, by })))
        }
        93..=96 => {
            let (id, code, held) = any_id(rng, avail, gone);
            let (what, emits, emits_ok) = emits(rng);
            match (emits_ok, code) {
                // Bad emits are refused before the id is looked up: a held
                // delivery stays held.
                (false, _) | (_, Some(INVALID)) => {
                    expects.push(Expect::new(&id, INVALID));
                    if held {
                        gone.retain(|g| *g != id);
                        avail.push(id.clone());
                    }
                }
                (true, Some(code)) => expects.push(Expect::new(&id, code)),
                (true, None) if held => effects.push(Effect::Acked(id.clone())),
                (true, None) => {}
            }
            let text = format!("AckEmit {} with {what}", short(&id));
            (text, req(Kind::AckEmit(AckEmit { id, emits })))
        }
        _ => ("Drain".to_owned(), req(Kind::Drain(Drain {}))),
    }
}

/// The stream good emits go to: no pool stream, so the ledger's account of
/// the pools is not disturbed.
pub(crate) const EMIT_TARGET: &str = "fz-emits";

/// An AckEmit's emits (at most two), what they are, and whether they are
/// valid: none, a good one, a good one and an odd valid one, or a good one
/// and a bad one (the reserved field, an empty or 10 KB stream name, too
/// many fields).
fn emits(rng: &mut fastrand::Rng) -> (&'static str, Vec<Emit>, bool) {
    let good = || Emit { stream: EMIT_TARGET.to_owned(), fields: fields(&[("k", b"v")]) };
    let (what, bad) = match rng.u32(..10) {
        0 => return ("no emits", Vec::new(), true),
        1..=4 => return ("a good emit", vec![good()], true),
        5 => ("the reserved field", Emit { stream: EMIT_TARGET.to_owned(), fields: fields(&[("id", b"mine")]) }),
        6 => ("an empty stream", Emit { stream: String::new(), fields: fields(&[("k", b"v")]) }),
        7 => ("a 10 KB stream name", Emit { stream: "s".repeat(10 * 1024), fields: fields(&[("k", b"v")]) }),
        8 => {
            let many = (0..1001).map(|i| (format!("f{i}"), Vec::new())).collect();
            ("1001 fields", Emit { stream: EMIT_TARGET.to_owned(), fields: many })
        }
        _ => ("a unicode stream named like a shard key", Emit { stream: "fz:{fz:9}🚀".to_owned(), ..good() }),
    };
    if what.starts_with("a unicode") {
        // Valid: not a shard of a stream this sidecar shards.
        return (what, vec![good(), bad], true);
    }
    (what, vec![good(), bad], false)
}

/// A subscribe for the pool stream `stream`: the group policy is fixed per pool
/// (every call on a group must agree); flow control and, on the last pool
/// (`huge`), huge durations vary.
pub(crate) fn pool_subscribe(stream: &str, huge: bool, rng: &mut fastrand::Rng) -> Subscribe {
    let mut s = sub(stream, GROUP);
    s.max_in_flight = [0, 1, 2, 3, 5, 8][rng.usize(..6)];
    if huge {
        if rng.bool() {
            s.ack_deadline = Some(huge_duration(rng));
        }
        if rng.bool() {
            s.retry_backoff_max = Some(huge_duration(rng));
            if rng.bool() {
                s.retry_backoff_initial = s.retry_backoff_max;
            }
        }
    }
    // Batched frames and single ones: the oracle holds both to the same rules.
    s.max_batch = [0, 1, 2, 16][rng.usize(..4)];
    s
}

/// What a random Append sequence sends, and what it deserves.
pub(crate) enum AppendCase {
    /// Refused with `code`; nothing may reach [`APPEND_TARGET`].
    Refused { what: &'static str, call: AppendCall, code: Code },
    /// Accepted: odd but valid names and values, to be stored byte for byte.
    Accepted { stream: &'static str, fields: HashMap<String, Vec<u8>> },
}

/// A scheduled-entry Append to `stream` to refine: one field, nothing else set.
fn scheduled(stream: &str) -> AppendRequest {
    AppendRequest { stream: stream.to_owned(), fields: fields(&[("a", b"1")]), ..Default::default() }
}

/// An Append or an AppendBatch request.
pub(crate) enum AppendCall {
    One(AppendRequest),
    Batch(AppendBatchRequest),
}

/// The stream the Append sequences write to (and must not, when refused).
pub(crate) const APPEND_TARGET: &str = "fz-append";

/// A bad Append or AppendBatch (names, the reserved field, other key types,
/// too many fields or entries, oversized), or now and then a valid odd one.
pub(crate) fn append_case(rng: &mut fastrand::Rng) -> AppendCase {
    let target = APPEND_TARGET;
    let one = |stream: &str, f: HashMap<String, Vec<u8>>| {
        AppendCall::One(AppendRequest { stream: stream.to_owned(), fields: f, ..Default::default() })
    };
    let batch = |entries: Vec<HashMap<String, Vec<u8>>>| {
        AppendCall::Batch(AppendBatchRequest {
            stream: target.to_owned(),
            entries: entries.into_iter().map(|f| BatchEntry { fields: f, ..Default::default() }).collect(),
            ..Default::default()
        })
    };
    let ok_fields = fields(&[("a", b"1")]);
    let invalid = Code::InvalidArgument;
    let in_a_minute = || {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        Some(prost_types::Timestamp { seconds: now + 60, nanos: 0 })
    };
    let (what, call, code) = match rng.u32(..18) {
        0 => ("Append to an empty stream name", one("", ok_fields), invalid),
        1 => ("Append to a 10 KB stream name", one(&"s".repeat(10 * 1024), ok_fields), invalid),
        2 => ("Append with the reserved field", one(target, fields(&[("id", b"x"), ("a", b"1")])), invalid),
        3 => {
            let key = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)];
            ("Append to a key of another type", one(key, ok_fields), Code::FailedPrecondition)
        }
        4 => {
            let many = (0..1001).map(|i| (format!("f{i}"), b"v".to_vec())).collect();
            ("Append with 1001 fields", one(target, many), invalid)
        }
        5 => ("Append of 5 MB", one(target, fields(&[("big", &vec![b'x'; OVERSIZED])])), Code::ResourceExhausted),
        6 => ("AppendBatch of nothing", batch(vec![]), invalid),
        7 => ("AppendBatch of 10,001 entries", batch(vec![fields(&[("a", b"1")]); 10_001]), invalid),
        8 => {
            let mut entries = vec![fields(&[("a", b"1")]); 5];
            entries.insert(rng.usize(..=5), fields(&[("id", b"0190000000000000000000000001")]));
            ("AppendBatch with the reserved field in one entry", batch(entries), invalid)
        }
        9 => {
            let key = ["fz-string", "fz-hash", "fz-list"][rng.usize(..3)];
            let request = AppendBatchRequest {
                stream: key.to_owned(),
                entries: vec![BatchEntry { fields: fields(&[("a", b"1")]), ..Default::default() }],
                ..Default::default()
            };
            ("AppendBatch to a key of another type", AppendCall::Batch(request), Code::FailedPrecondition)
        }
        10 => {
            let request = AppendRequest { delay: Some(negative_duration(rng)), ..scheduled(target) };
            ("Append with a negative delay", AppendCall::One(request), invalid)
        }
        11 => {
            let delay = [odd_duration(rng), huge_duration(rng)][rng.usize(..2)];
            (
                "Append with an absurd delay",
                AppendCall::One(AppendRequest { delay: Some(delay), ..scheduled(target) }),
                invalid,
            )
        }
        12 => {
            let seconds = [40_000_000_000, i64::MAX / 2, i64::MAX][rng.usize(..3)];
            let at = Some(prost_types::Timestamp { seconds, nanos: 0 });
            let request = AppendRequest { deliver_at: at, ..scheduled(target) };
            ("Append with deliver_at beyond the 365-day horizon", AppendCall::One(request), invalid)
        }
        13 => {
            let request =
                AppendRequest { deliver_at: in_a_minute(), delay: Some(small_duration(rng)), ..scheduled(target) };
            ("Append with both deliver_at and delay", AppendCall::One(request), invalid)
        }
        14 => {
            let nanos = [-1, 1_000_000_000, i32::MIN, i32::MAX][rng.usize(..4)];
            let at = in_a_minute().map(|t| prost_types::Timestamp { nanos, ..t });
            (
                "Append with a malformed deliver_at",
                AppendCall::One(AppendRequest { deliver_at: at, ..scheduled(target) }),
                invalid,
            )
        }
        15 => {
            let request = AppendRequest { delay: Some(small_duration(rng)), max_len: 5, ..scheduled(target) };
            ("Append scheduled with max_len", AppendCall::One(request), invalid)
        }
        16 => {
            let mut entries: Vec<BatchEntry> = (0..5)
                .map(|_| BatchEntry {
                    fields: fields(&[("a", b"1")]),
                    delay: Some(small_duration(rng)),
                    ..Default::default()
                })
                .collect();
            let bad = rng.usize(..5);
            entries[bad].delay = Some(negative_duration(rng));
            let request = AppendBatchRequest { stream: target.to_owned(), entries, ..Default::default() };
            ("AppendBatch with a negative delay in one entry", AppendCall::Batch(request), invalid)
        }
        _ => {
            let stream = ["fz-append-ünï-🚀", target, "fz-append-\u{202e}rtl"][rng.usize(..3)];
            let value: Vec<u8> = (0..rng.usize(..256)).map(|_| rng.u8(..)).collect();
            let fields = fields(&[("ünï 🚀", &value), ("empty", b""), ("a", b"1")]);
            return AppendCase::Accepted { stream, fields };
        }
    };
    AppendCase::Refused { what, call, code }
}
