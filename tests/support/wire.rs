//! What travels on the gRPC wire, as the tests build and check it: branded ids
//! and stream ids, timestamps and durations, entry fields, the bearer token,
//! status codes.

use tonic::{Code, Status};

/// Splits a stream id `<ms>-<seq>` into its parts.
pub fn parse_stream_id(stream_id: &str) -> (u64, u64) {
    let (ms, seq) = stream_id.split_once('-').unwrap_or_else(|| panic!("not a stream id: {stream_id:?}"));
    (ms.parse().expect("stream id ms"), seq.parse().expect("stream id seq"))
}

/// The branded id (28 lowercase hex) that corresponds to a stream id.
pub fn branded_from_stream_id(stream_id: &str) -> String {
    let (ms, seq) = parse_stream_id(stream_id);
    format!("{ms:012x}{seq:016x}")
}

/// Whether `id` has the branded text form: exactly 28 lowercase hex characters.
pub fn is_branded(id: &str) -> bool {
    id.len() == 28 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The milliseconds part of a branded id.
pub fn branded_ms(id: &str) -> u64 {
    u64::from_str_radix(&id[..12], 16).expect("branded id ms")
}

/// The protobuf timestamp of a unix-milliseconds instant.
pub fn timestamp_of_ms(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

/// An entry's fields from (name, value) pairs, as Append takes them.
pub fn fields(pairs: &[(&str, &[u8])]) -> std::collections::HashMap<String, Vec<u8>> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.to_vec())).collect()
}

pub fn duration_ms(ms: u64) -> prost_types::Duration {
    prost_types::Duration { seconds: (ms / 1000) as i64, nanos: ((ms % 1000) * 1_000_000) as i32 }
}

/// `message` as a request carrying `authorization: Bearer <token>` when `token` is set.
pub fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("a token that fits in a header");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Asserts a status code, printing the whole status otherwise.
#[track_caller]
pub fn assert_code(status: &Status, code: Code) {
    assert_eq!(status.code(), code, "unexpected status: {status:?}");
}
