//! What can go wrong, and the one mapping of each failure to an exit code.
//! The codes are listed in `--help` ([`crate::cli::EXIT_CODES`]) and in the
//! docs; scripts may rely on them.

use std::fmt;

use tonic::{Code, Status};

/// Everything went as asked (also: `tail` ended by Ctrl-C or by a closed pipe).
pub(crate) const OK: u8 = 0;
/// Any failure not listed below: an unexpected status (INTERNAL, UNKNOWN, …),
/// output that could not be written.
pub(crate) const OTHER: u8 = 1;
/// Bad usage, found before anything was sent: a flag, a value, a file, JSON.
/// Also clap's code for a bad command line.
pub(crate) const USAGE: u8 = 2;
/// The sidecar could not be reached (connect failed, or no answer within the
/// timeout), or it answered UNAVAILABLE (it cannot reach Redis, or is shutting
/// down). Retrying later may help.
pub(crate) const UNREACHABLE: u8 = 3;
/// What was asked for does not exist: NOT_FOUND (no such stream or group), a
/// `read --id` with no such entry, a `dlq replay` id that is not in the
/// dead-letter stream.
pub(crate) const NOT_FOUND: u8 = 4;
/// The sidecar refused the request as it stands: INVALID_ARGUMENT,
/// FAILED_PRECONDITION, OUT_OF_RANGE, ALREADY_EXISTS, RESOURCE_EXHAUSTED.
/// Its message says what to change.
pub(crate) const REFUSED: u8 = 5;
/// The sidecar did not let this caller in: UNAUTHENTICATED (token) or
/// PERMISSION_DENIED (the stream allow-list).
pub(crate) const DENIED: u8 = 6;

/// Why a command did not finish as asked.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A bad value or file, found before any call ([`USAGE`]).
    Usage(String),
    /// The sidecar cannot be reached ([`UNREACHABLE`]).
    Unreachable(String),
    /// Something asked for is missing, found by the command itself ([`NOT_FOUND`]).
    NotFound(String),
    /// A call failed with this status; its code picks the exit code.
    Status {
        /// What was being done, for the message.
        doing: String,
        /// The status the sidecar (or the transport) answered.
        status: Status,
    },
    /// Any other failure ([`OTHER`]).
    Other(String),
    /// Standard output was closed (`| head`): the reader has what it wanted,
    /// so this ends the command with [`OK`] and no message.
    OutputClosed,
}

impl Failure {
    /// A failed call: `doing` says what it was for ("describe orders/billing").
    pub(crate) fn status(doing: impl Into<String>, status: Status) -> Failure {
        Failure::Status { doing: doing.into(), status }
    }

    /// As [`Failure::status`], for a request built from flags: an
    /// INVALID_ARGUMENT naming one of `flags`' request fields (the sidecar's
    /// `start_id: …`) names the flag it came from instead (`--from: …`),
    /// since the user typed flags, not fields.
    pub(crate) fn status_of_flags(doing: impl Into<String>, status: Status, flags: &[(&str, &str)]) -> Failure {
        let renamed =
            (status.code() == Code::InvalidArgument).then(|| status.message().split_once(": ")).flatten().and_then(
                |(field, reason)| flags.iter().find(|(f, _)| *f == field).map(|(_, flag)| format!("{flag}: {reason}")),
            );
        match renamed {
            Some(message) => Failure::status(doing, Status::invalid_argument(message)),
            None => Failure::status(doing, status),
        }
    }

    /// The process exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Failure::Usage(_) => USAGE,
            Failure::Unreachable(_) => UNREACHABLE,
            Failure::NotFound(_) => NOT_FOUND,
            Failure::Status { status, .. } if is_transport_failure(status) => UNREACHABLE,
            Failure::Status { status, .. } => code_of(status.code()),
            Failure::Other(_) => OTHER,
            Failure::OutputClosed => OK,
        }
    }
}

/// A status the client's transport made up, not one the sidecar answered: the
/// connection broke mid-call (tonic reports `Unknown: transport error` or
/// `Unknown: h2 protocol error: …`), or `--timeout-ms` passed with no answer
/// (`Cancelled: Timeout expired`). Both mean the sidecar could not be reached.
fn is_transport_failure(status: &Status) -> bool {
    let message = status.message();
    match status.code() {
        Code::Unknown => message.starts_with("transport error") || message.starts_with("h2 protocol error"),
        Code::Cancelled => message == "Timeout expired",
        _ => false,
    }
}

/// The exit code of a gRPC status code.
fn code_of(code: Code) -> u8 {
    match code {
        Code::Ok => OK,
        Code::Unavailable | Code::DeadlineExceeded => UNREACHABLE,
        Code::NotFound => NOT_FOUND,
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::AlreadyExists
        | Code::ResourceExhausted => REFUSED,
        Code::Unauthenticated | Code::PermissionDenied => DENIED,
        Code::Cancelled | Code::Unknown | Code::Aborted | Code::Unimplemented | Code::Internal | Code::DataLoss => {
            OTHER
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(reason) | Failure::NotFound(reason) | Failure::Other(reason) => f.write_str(reason),
            Failure::Unreachable(reason) => write!(f, "the sidecar is unreachable: {reason}"),
            Failure::Status { doing, status } => {
                write!(f, "{doing}: {:?}: {}", status.code(), status.message())
            }
            Failure::OutputClosed => f.write_str("standard output was closed"),
        }
    }
}

impl From<std::io::Error> for Failure {
    /// A failed write to standard output: a closed pipe ends the command
    /// quietly, anything else is [`OTHER`].
    fn from(e: std::io::Error) -> Failure {
        match e.kind() {
            std::io::ErrorKind::BrokenPipe => Failure::OutputClosed,
            _ => Failure::Other(format!("cannot write the output: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_failure_has_its_own_code() {
        let status = |code| Failure::status("x", Status::new(code, "m")).exit_code();
        assert_eq!(status(Code::Unavailable), UNREACHABLE);
        assert_eq!(status(Code::NotFound), NOT_FOUND);
        assert_eq!(status(Code::InvalidArgument), REFUSED);
        assert_eq!(status(Code::FailedPrecondition), REFUSED);
        assert_eq!(status(Code::Unauthenticated), DENIED);
        assert_eq!(status(Code::PermissionDenied), DENIED);
        assert_eq!(status(Code::Internal), OTHER);
        let transport = |code, message| Failure::status("x", Status::new(code, message)).exit_code();
        assert_eq!(transport(Code::Unknown, "transport error"), UNREACHABLE);
        assert_eq!(transport(Code::Unknown, "h2 protocol error: error reading a body from connection"), UNREACHABLE);
        assert_eq!(transport(Code::Cancelled, "Timeout expired"), UNREACHABLE);
        assert_eq!(transport(Code::Unknown, "something the sidecar said"), OTHER);
        assert_eq!(Failure::Usage("u".into()).exit_code(), USAGE);
        assert_eq!(Failure::OutputClosed.exit_code(), OK);
        let codes = [OK, OTHER, USAGE, UNREACHABLE, NOT_FOUND, REFUSED, DENIED];
        let distinct: std::collections::BTreeSet<u8> = codes.into_iter().collect();
        assert_eq!(distinct.len(), codes.len());
    }
}
