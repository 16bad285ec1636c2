//! The one error type of the API and the one mapping to `tonic::Status`.

use tonic::{Code, Status};

use crate::redis::fault::{fault, Fault};

/// What can go wrong while serving a call. Each variant carries the context a
/// caller needs to fix the request; [`From<Error> for Status`] is the only place
/// that turns them into gRPC statuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: `field` names the offending field.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The request field, as named in the proto (`subscribe.group_start`).
        field: &'static str,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// The key exists with another Redis type (Redis answered WRONGTYPE).
    #[error("key `{key}` holds another Redis type, not a stream; pick another key or delete it")]
    WrongType {
        /// The stream key.
        key: String,
    },
    /// A command was sent but Redis did not answer in time: it may or may not
    /// have been applied (an append may have been written).
    #[error("Redis did not answer in time ({context}): the outcome is unknown, it may have been applied; check (e.g. Read) before retrying: {source}")]
    Timeout {
        /// What the sidecar was doing.
        context: String,
        /// The underlying Redis error.
        source: redis::RedisError,
    },
    /// Redis could not be reached (or refused while loading, failing over…);
    /// retrying may help.
    #[error("Redis is unavailable ({context}): {source}")]
    Unavailable {
        /// What the sidecar was doing.
        context: String,
        /// The underlying Redis error.
        source: redis::RedisError,
    },
    /// Redis refused a command for a reason the caller cannot fix by retrying.
    #[error("Redis refused {context}: {source}")]
    Redis {
        /// What the sidecar was doing.
        context: String,
        /// The underlying Redis error.
        source: redis::RedisError,
    },
    /// The named stream or group does not exist.
    #[error("{what} does not exist")]
    NotFound {
        /// What was looked for, e.g. "group `g` of stream `s`".
        what: String,
    },
    /// The caller may not use this stream (the allow-list).
    #[error("stream `{stream}` is not in this sidecar's allow-list for {}", identity.as_deref().map_or("callers without a client certificate".to_owned(), |id| format!("`{id}`")))]
    PermissionDenied {
        /// The stream asked for.
        stream: String,
        /// The caller's mTLS identity, if any.
        identity: Option<String>,
    },
    /// A limit of the sidecar was reached; the message names the setting.
    #[error("{reason}")]
    ResourceExhausted {
        /// Which limit, and what to do.
        reason: String,
    },
    /// The request conflicts with state the sidecar or Redis already has.
    #[error("{reason}")]
    Conflict {
        /// What conflicts, and what to change.
        reason: String,
    },
    /// The archive (`--archive-url`) refused a read or a write, or did not
    /// answer: retrying once the store answers may help. A trim that meets it
    /// removes nothing (what it had archived stays archived).
    #[error("the archive is unavailable ({context}) for stream `{stream}`: {reason}{}", if *.trimming { "; this trim removed nothing" } else { "" })]
    ArchiveUnavailable {
        /// What the sidecar was doing.
        context: &'static str,
        /// The stream key.
        stream: String,
        /// What the store answered.
        reason: String,
        /// Met by a trim (which then removed nothing), not by a read.
        trimming: bool,
    },
    /// Another sidecar is folding the same stream into the archive (it holds
    /// the stream's fold lease, or committed first): retry later.
    #[error("{reason}")]
    Aborted {
        /// What ran at the same time.
        reason: String,
    },
    /// The sidecar is shutting down; the client should reconnect (to a peer or
    /// after the restart).
    #[error("the sidecar is shutting down; un-settled entries stay pending and will be delivered again")]
    ShuttingDown,
    /// A write that creates entries ran on the primary, but `WAIT`
    /// (`--wait-replicas`) or `WAITAOF` (`--wait-aof`) did not confirm it
    /// within `--wait-timeout-ms`: it may be lost if the primary fails now.
    #[error("{written} was written to the primary but not confirmed: {shortfall}; {retry}")]
    Unconfirmed {
        /// What was written: the entries' branded ids and stream ids, and the stream.
        written: String,
        /// How the confirmation fell short.
        shortfall: Box<crate::durability::Shortfall>,
        /// Whether a retry is safe (the same `dedup_key`) or may write twice.
        retry: String,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] for `field`.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument { field, reason: reason.into() }
    }

    /// Names the entry of a batch an INVALID_ARGUMENT is about (`index`, from
    /// 0, as in the request's `entries`), so a caller of a 1,000-entry batch
    /// can find it; other errors, and `None` (a single Append), pass as they are.
    pub fn in_batch_entry(self, index: Option<usize>) -> Error {
        match (self, index) {
            (Error::InvalidArgument { field, reason }, Some(index)) => {
                Error::InvalidArgument { field, reason: format!("entry {index} of the batch: {reason}") }
            }
            (error, _) => error,
        }
    }

    /// Classifies a Redis error met while doing `context` on `key`:
    /// WRONGTYPE → [`Error::WrongType`], connection and timeout errors →
    /// [`Error::Unavailable`], anything else → [`Error::Redis`].
    pub fn from_redis(source: redis::RedisError, context: impl Into<String>, key: &str) -> Error {
        let context = context.into();
        match fault(&source) {
            Fault::WrongType => Error::WrongType { key: key.to_owned() },
            Fault::Timeout => Error::Timeout { context, source },
            Fault::Unreachable | Fault::NotPrimary => Error::Unavailable { context, source },
            _ => Error::Redis { context, source },
        }
    }
}

/// Whether a Redis error is about reaching Redis (retry may help) rather than
/// about the command.
pub fn is_transient(error: &redis::RedisError) -> bool {
    matches!(fault(error), Fault::Timeout | Fault::Unreachable | Fault::NotPrimary)
}

/// Whether `status` is tonic's answer to a message over the size limit.
/// tonic says OUT_OF_RANGE; gRPC's code for it is RESOURCE_EXHAUSTED, which
/// is what [`inbound_status`] makes of it.
pub fn is_oversized(status: &Status) -> bool {
    status.code() == Code::OutOfRange && status.message().contains("message length too large")
}

/// How prost's decode errors begin (`prost::DecodeError`'s text).
const UNDECODABLE: &str = "failed to decode Protobuf message";

/// Whether `status` is tonic's answer to a request message it could not
/// decode: a `string` field that is not UTF-8, a truncated or malformed
/// message. tonic's prost codec says INTERNAL, as gRPC's status table has it
/// for a parse failure; here it is always the caller's bad input.
pub fn is_undecodable(status: &Status) -> bool {
    status.code() == Code::Internal && status.message().starts_with(UNDECODABLE)
}

/// The status a caller gets for a request message tonic refused before any
/// handler saw it: RESOURCE_EXHAUSTED for an oversized one, naming the
/// setting; INVALID_ARGUMENT for one that could not be decoded, with prost's
/// reason (which names the field: `AppendRequest.stream: invalid string value:
/// data is not UTF-8 encoded`); any other status unchanged. Used by the
/// server's response map ([`refused_request_status`]) for unary calls and by
/// Consume for the messages of its stream.
pub fn inbound_status(status: Status) -> Status {
    if is_oversized(&status) {
        Status::resource_exhausted(format!("{} (the sidecar's --max-message-bytes)", status.message()))
    } else if is_undecodable(&status) {
        Status::invalid_argument(format!(
            "{} (the request is not a valid message of the call's request type; string fields must be UTF-8, \
             bytes belong in bytes fields)",
            status.message()
        ))
    } else {
        status
    }
}

/// Rewrites a trailers-only response that carries tonic's status for a
/// request message it refused before any handler ran (oversized: OUT_OF_RANGE;
/// undecodable: INTERNAL) to the status [`inbound_status`] gives it. Used as a
/// `tower` response map on the server; other responses pass untouched.
pub fn refused_request_status<B>(mut response: tonic::codegen::http::Response<B>) -> tonic::codegen::http::Response<B> {
    let headers = response.headers();
    // Cheap first: only a trailers-only OUT_OF_RANGE (11) or INTERNAL (13) can be one.
    if !headers.get("grpc-status").is_some_and(|code| code == "11" || code == "13") {
        return response;
    }
    // Only the code and the (percent-encoded) message: nothing else of the
    // response is parsed or copied.
    let mut status_headers = tonic::codegen::http::HeaderMap::with_capacity(2);
    for name in ["grpc-status", "grpc-message"] {
        if let Some(value) = headers.get(name) {
            status_headers.insert(name, value.clone());
        }
    }
    let Some(status) = Status::from_header_map(&status_headers) else { return response };
    if is_oversized(&status) || is_undecodable(&status) {
        let status = inbound_status(status);
        // Only fails on a message that cannot be a header value, which
        // percent-encoding rules out; the response is then left as it was.
        let _ = Status::new(status.code(), status.message()).add_header(response.headers_mut());
    }
    response
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let code = match &error {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::WrongType { .. } | Error::Conflict { .. } => Code::FailedPrecondition,
            Error::Unavailable { .. }
            | Error::ArchiveUnavailable { .. }
            | Error::ShuttingDown
            | Error::Unconfirmed { .. } => Code::Unavailable,
            Error::Aborted { .. } => Code::Aborted,
            Error::Timeout { .. } => Code::DeadlineExceeded,
            // The Redis ACL user lacks a permission: the operator's to grant.
            Error::Redis { source, .. } if fault(source) == Fault::NoPermission => Code::PermissionDenied,
            Error::Redis { .. } => Code::Internal,
            Error::NotFound { .. } => Code::NotFound,
            Error::PermissionDenied { .. } => Code::PermissionDenied,
            Error::ResourceExhausted { .. } => Code::ResourceExhausted,
        };
        Status::new(code, error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(reply: &[u8]) -> redis::RedisError {
        match redis::parse_redis_value(reply).and_then(redis::Value::extract_error) {
            Err(e) => e,
            Ok(value) => panic!("not an error reply: {value:?}"),
        }
    }

    #[test]
    fn redirections_the_cluster_client_could_not_follow_and_replicas_are_unavailable() {
        for reply in [
            &b"-MOVED 3962 127.0.0.1:30001\r\n"[..],
            b"-ASK 3962 127.0.0.1:30001\r\n",
            b"-CLUSTERDOWN down\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ] {
            let error = Error::from_redis(server_error(reply), "appending", "s");
            assert_eq!(Status::from(error).code(), Code::Unavailable, "{}", String::from_utf8_lossy(reply));
        }
        let error = Error::from_redis(server_error(b"-ERR syntax error\r\n"), "appending", "s");
        assert_eq!(Status::from(error).code(), Code::Internal);
    }

    #[test]
    fn a_request_tonic_could_not_decode_is_bad_input_and_other_internal_errors_stay() {
        let undecodable = Status::internal(
            "failed to decode Protobuf message: AppendRequest.stream: invalid string value: data is not UTF-8 encoded",
        );
        let mapped = inbound_status(undecodable);
        assert_eq!(mapped.code(), Code::InvalidArgument);
        assert!(mapped.message().contains("AppendRequest.stream: invalid string value"), "{mapped:?}");
        let ours = Status::internal("reading the group's lag on `s`: ERR something");
        assert_eq!(inbound_status(ours).code(), Code::Internal);
    }

    #[test]
    fn the_response_map_rewrites_only_refused_requests() {
        let respond = |status: Status| refused_request_status(status.into_http::<()>());
        let rewritten = respond(Status::internal("failed to decode Protobuf message: invalid varint"));
        let status = Status::from_header_map(rewritten.headers()).unwrap();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with("failed to decode Protobuf message: invalid varint ("), "{status:?}");
        let oversized = respond(Status::out_of_range("Error, decoded message length too large: found 9 bytes"));
        assert_eq!(Status::from_header_map(oversized.headers()).unwrap().code(), Code::ResourceExhausted);
        let other = respond(Status::internal("something else"));
        assert_eq!(Status::from_header_map(other.headers()).unwrap().code(), Code::Internal);
    }
}
