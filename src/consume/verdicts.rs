//! Every answer to a verdict that was not applied: one constructor per kind,
//! so each code goes with one text, written once.
//!
//! The group worker's ledger is the one authority that decides them (it
//! alone knows what a call holds); the relay builds only the answers to
//! messages it cannot route: an id that does not parse, an Extend without a
//! valid `by`, an AckEmit's bad emits.

use crate::proto::{VerdictError, VerdictErrorCode};

/// Why a delivery a call held is no longer pending for this sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// A peer reclaimed it (its lease ran out here).
    ToPeer,
    /// It was deleted from the stream (trimmed, XDEL) and dropped from the PEL.
    Deleted,
}

/// An answer to a verdict, as the consume core decides it: its kind and
/// what it needs, without the wire type; [`Refusal::error`] builds the frame
/// at the edge, with the one text of its kind.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// [`unknown_id`].
    UnknownId,
    /// [`gone`].
    Gone(Gone),
    /// [`not_pending_in_group`].
    NotPendingInGroup,
    /// [`not_dead_lettered`].
    NotDeadLettered,
    /// [`not_released`].
    NotReleased,
    /// [`lease_lost`].
    LeaseLost,
    /// [`invalid`], saying why.
    Invalid(String),
    /// [`fail_without_pel`].
    FailWithoutPel,
    /// [`release_without_pel`].
    ReleaseWithoutPel,
    /// [`unavailable`], saying what happened to the entry.
    Unavailable(String),
    /// [`permission_denied`], saying which stream.
    PermissionDenied(String),
}

impl Refusal {
    /// The VerdictError frame of this answer to the verdict on `id`.
    pub(crate) fn error(self, id: &str) -> VerdictError {
        match self {
            Refusal::UnknownId => unknown_id(id),
            Refusal::Gone(why) => gone(id, why),
            Refusal::NotPendingInGroup => not_pending_in_group(id),
            Refusal::NotDeadLettered => not_dead_lettered(id),
            Refusal::NotReleased => not_released(id),
            Refusal::LeaseLost => lease_lost(id),
            Refusal::Invalid(reason) => invalid(id, reason),
            Refusal::FailWithoutPel => fail_without_pel(id),
            Refusal::ReleaseWithoutPel => release_without_pel(id),
            Refusal::Unavailable(message) => unavailable(id, message),
            Refusal::PermissionDenied(message) => permission_denied(id, message),
        }
    }
}

fn error(id: &str, code: VerdictErrorCode, message: impl Into<String>) -> VerdictError {
    VerdictError { id: id.to_owned(), code: code as i32, message: message.into() }
}

/// UNKNOWN_ID: the call does not hold `id`.
pub(crate) fn unknown_id(id: &str) -> VerdictError {
    error(
        id,
        VerdictErrorCode::UnknownId,
        "this call does not hold that id: it was never delivered to this call, was already settled, or passed its ack deadline",
    )
}

/// NOT_PENDING: a verdict on a delivery the call held until Redis stopped
/// having it pending for this sidecar, saying why.
pub(crate) fn gone(id: &str, gone: Gone) -> VerdictError {
    let message = match gone {
        Gone::ToPeer => {
            "the lease on this entry was lost to a peer, which may be handling it now; its verdict was not applied"
        }
        Gone::Deleted => TRIMMED_WHILE_HELD,
    };
    error(id, VerdictErrorCode::NotPending, message)
}

/// NOT_PENDING: an XACK found none of its ids pending.
pub(crate) fn not_pending_in_group(id: &str) -> VerdictError {
    error(
        id,
        VerdictErrorCode::NotPending,
        "Redis no longer has this entry pending for the group: another client acknowledged it (a peer that reclaimed it, say), it was deleted, or the group was re-created; nothing was acknowledged",
    )
}

/// NOT_PENDING: a Fail with `dead_letter` on an entry no longer pending for
/// this consumer.
pub(crate) fn not_dead_lettered(id: &str) -> VerdictError {
    not_ours(id, "nothing was dead-lettered")
}

/// NOT_PENDING: a Release of an entry no longer pending for this consumer.
pub(crate) fn not_released(id: &str) -> VerdictError {
    not_ours(id, "a peer took it (or another client acknowledged it), so nothing was released")
}

/// NOT_PENDING: a verdict's script found the entry no longer pending for
/// this consumer; `outcome` says what that left undone.
fn not_ours(id: &str, outcome: &str) -> VerdictError {
    let message = format!("Redis no longer has this entry pending for this consumer; {outcome}");
    error(id, VerdictErrorCode::NotPending, message)
}

/// LEASE_LOST: sent unasked when a peer took a delivery the call holds.
pub(crate) fn lease_lost(id: &str) -> VerdictError {
    error(
        id,
        VerdictErrorCode::LeaseLost,
        "the lease on this entry was lost: Redis no longer has it pending for this sidecar (a peer reclaimed it); this call no longer holds it, and a verdict for it will not be applied",
    )
}

/// INVALID_ARGUMENT: the verdict is malformed; `reason` says how.
pub(crate) fn invalid(id: &str, reason: impl Into<String>) -> VerdictError {
    error(id, VerdictErrorCode::InvalidArgument, reason)
}

/// INVALID_ARGUMENT: a Fail on an at-most-once subscription.
pub(crate) fn fail_without_pel(id: &str) -> VerdictError {
    invalid(
        id,
        "this is an at-most-once (no_ack) subscription: the entry is not pending, so it cannot be retried or dead-lettered; ack it",
    )
}

/// INVALID_ARGUMENT: a Release on an at-most-once subscription.
pub(crate) fn release_without_pel(id: &str) -> VerdictError {
    invalid(
        id,
        "this is an at-most-once (no_ack) subscription: the entry is not pending, so there is nothing to give back to the group; ack it",
    )
}

/// INVALID_ARGUMENT: an Extend whose `by` is missing, zero or too long.
pub(crate) fn bad_extension(id: &str) -> VerdictError {
    invalid(id, "extend.by is required, greater than zero and at most 365 days")
}

/// UNAVAILABLE: the verdict could not reach Redis; `message` says what
/// happened to the entry.
pub(crate) fn unavailable(id: &str, message: impl Into<String>) -> VerdictError {
    error(id, VerdictErrorCode::Unavailable, message)
}

/// PERMISSION_DENIED: an AckEmit names a stream outside the allow-list;
/// `message` says which.
pub(crate) fn permission_denied(id: &str, message: impl Into<String>) -> VerdictError {
    error(id, VerdictErrorCode::PermissionDenied, message)
}

/// Why a held entry cannot be settled: it was deleted from the stream.
const TRIMMED_WHILE_HELD: &str = "the entry was deleted from the stream while held (trimmed, XDEL, or lost with Redis' data); Redis dropped it from the PEL, so there is nothing to acknowledge, retry or dead-letter";
