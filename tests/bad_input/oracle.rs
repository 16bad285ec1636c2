//! The oracle: what the sidecar's answers must be, and the comparison of what
//! came with what was deserved: the verdict errors of a step ([`Expect`],
//! [`reconcile`]), how a call's opening and its end went, an Append's status,
//! and no panic in the sidecar's log.

use echomq::proto::{VerdictError, VerdictErrorCode};
use tonic::{Code, Status};

use super::ECHO_CHARS;

/// Marks an opening that may be accepted or refused with INVALID_ARGUMENT.
pub(crate) const EITHER: &str = "(EITHER)";

/// A verdict error a step deserves.
#[derive(Debug, Clone)]
pub(crate) struct Expect {
    /// The id as sent; the error may echo its first 64 characters only.
    pub(crate) text: String,
    /// The codes that are right (any one of them).
    pub(crate) codes: Vec<VerdictErrorCode>,
    /// May or may not come (a huge delay the sidecar may refuse).
    pub(crate) optional: bool,
}

impl Expect {
    pub(crate) fn new(text: &str, code: VerdictErrorCode) -> Expect {
        Expect { text: text.to_owned(), codes: vec![code], optional: false }
    }

    fn matches(&self, error: &VerdictError) -> bool {
        let echoed = error.id == self.text
            || (self.text.chars().count() > ECHO_CHARS
                && error.id == self.text.chars().take(ECHO_CHARS).collect::<String>());
        echoed && self.codes.iter().any(|c| *c as i32 == error.code)
    }
}

/// A text cut to 40 characters, for messages (ids and reasons may be megabytes).
pub(crate) fn short(text: &str) -> String {
    if text.chars().count() > 40 {
        format!("{:?}…({} bytes)", text.chars().take(40).collect::<String>(), text.len())
    } else {
        format!("{text:?}")
    }
}

pub(crate) fn describe_error(e: &VerdictError) -> String {
    let code = VerdictErrorCode::try_from(e.code).map_or_else(|_| e.code.to_string(), |c| format!("{c:?}"));
    format!("{code} for {} ({})", short(&e.id), e.message)
}

/// Matches the errors a step got against those it deserves. Returns the
/// problems, and which expectations were met (for optional ones).
pub(crate) fn reconcile(expects: &[Expect], errors: &[VerdictError]) -> (Vec<String>, Vec<bool>) {
    let mut met = vec![false; expects.len()];
    let mut problems = Vec::new();
    for error in errors {
        match (0..expects.len()).find(|&i| !met[i] && expects[i].matches(error)) {
            Some(i) => met[i] = true,
            None => problems.push(format!("unexpected verdict error: {}", describe_error(error))),
        }
    }
    for (i, e) in expects.iter().enumerate() {
        if !met[i] && !e.optional {
            problems.push(format!("missing verdict error {:?} for {}", e.codes, short(&e.text)));
        }
    }
    (problems, met)
}

/// The panics in a sidecar log, in order: where, what, and the first frames
/// of the sidecar's own code in the backtrace.
pub(crate) fn panics(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if let Some(at) = line.find("panicked at ") {
            let message = lines.get(i + 1).copied().unwrap_or_default();
            let ours: Vec<&str> = lines[i..lines.len().min(i + 80)]
                .iter()
                .filter(|l| l.contains("./src/"))
                .take(3)
                .map(|l| l.trim())
                .collect();
            out.push(format!("{} {message} (via {})", &line[at..], ours.join(" <- ")));
        }
    }
    out
}

/// What is wrong with how a call's first message `what` was answered, if
/// anything: `expected` is the status it deserves (`None`: accepted), `got`
/// the status it got (`None`: accepted, and a half-close ended it cleanly).
pub(crate) fn judge_opening(what: &str, expected: Option<Code>, got: Option<Status>) -> Option<String> {
    match (expected, got) {
        (None, None) => None,
        (Some(code), Some(status)) if status.code() == code => None,
        (None, Some(status)) if what.contains(EITHER) && status.code() == Code::InvalidArgument => None,
        (expected, got) => Some(format!(
            "{what}: expected {}, got {}",
            expected.map_or("acceptance".to_owned(), |c| format!("{c:?}")),
            got.map_or("acceptance".to_owned(), |s| format!("{:?}: {}", s.code(), short(s.message())))
        )),
    }
}

/// What is wrong with how a call ended after `what`, if anything: it must end
/// with `expected` (`None`: OK), and no verdict error may come first.
pub(crate) fn judge_end(
    what: &str,
    expected: Option<Code>,
    status: Option<Status>,
    errors: &[VerdictError],
) -> Vec<String> {
    let mut problems = Vec::new();
    if !errors.is_empty() {
        problems.push(format!(
            "{what}: unexpected verdict errors {:?}",
            errors.iter().map(describe_error).collect::<Vec<_>>()
        ));
    }
    let got = status.as_ref().map(Status::code);
    if got != expected {
        problems.push(format!(
            "{what}: expected the call to end with {}, it ended with {}",
            expected.map_or("OK".to_owned(), |c| format!("{c:?}")),
            status.map_or("OK".to_owned(), |s| format!("{:?}: {}", s.code(), short(s.message())))
        ));
    }
    problems
}

/// What is wrong with the answer to a bad Append `what`, if anything: it must
/// be refused with `code`.
pub(crate) fn judge_refused_append(what: &str, code: Code, result: Result<(), Status>) -> Option<String> {
    match result {
        Err(status) if status.code() == code => None,
        got => Some(format!(
            "{what}: expected {:?}, got {:?}",
            Some(code),
            got.map_err(|s| (s.code(), short(s.message())))
        )),
    }
}
