//! One Consume call after its subscribe: relays the client's verdicts to the
//! group worker and the worker's deliveries and verdict errors to the client.
//!
//! Malformed verdicts are answered here, without a trip to the worker. While
//! the client does not read, the relay waits on the outbound channel and reads
//! no new verdicts either, so gRPC flow control pushes back on the client and
//! nothing grows without bound.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Status, Streaming};
use tracing::debug;

use super::worker::{Command, Event, FailVerdict, SessionId};
use crate::{
    error::Error,
    id::BrandedId,
    proto::{consume_request::Kind, consume_response, ConsumeRequest, ConsumeResponse, VerdictError, VerdictErrorCode},
};

/// How long an ending call waits for its last verdicts to reach Redis.
const DETACH_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// A Fail reason is cut to this many bytes.
const MAX_REASON_BYTES: usize = 4096;

type Outbound = mpsc::Sender<Result<ConsumeResponse, Status>>;

/// Wraps a server message.
pub(super) fn response(kind: consume_response::Kind) -> ConsumeResponse {
    ConsumeResponse { kind: Some(kind) }
}

/// Runs until the client closes its side, the call breaks, a second subscribe
/// arrives, or the sidecar closes calls on shutdown; then detaches the call
/// from its worker, which returns what the call held to the PEL's waiting set.
pub(super) async fn relay(
    session: SessionId,
    mut inbound: Streaming<ConsumeRequest>,
    mut events: mpsc::UnboundedReceiver<Event>,
    outbound: Outbound,
    worker: mpsc::Sender<Command>,
    mut closing: watch::Receiver<bool>,
) {
    let ending = loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(request)) => {
                    if let Err(status) = forward(session, request, &outbound, &worker).await {
                        break Some(status);
                    }
                }
                Ok(None) => break None,
                Err(status) if crate::error::is_oversized(&status) => {
                    break Some(crate::error::resource_exhausted_if_oversized(status));
                }
                Err(status) => {
                    debug!(session, %status, "call broke");
                    break None;
                }
            },
            event = events.recv() => {
                let frame = match event {
                    Some(Event::Delivery(delivery)) => response(consume_response::Kind::Delivery(delivery)),
                    Some(Event::VerdictError(error)) => response(consume_response::Kind::VerdictError(error)),
                    None => break Some(Error::ShuttingDown.into()),
                };
                if outbound.send(Ok(frame)).await.is_err() {
                    break None;
                }
            }
            true = async { closing.wait_for(|closing| *closing).await.is_ok() } => break Some(Error::ShuttingDown.into()),
        }
    };
    // The call ends only once its verdicts have reached Redis (bounded, should
    // Redis be down), so a client that sees it end can count on its acks.
    let (flushed, applied) = oneshot::channel();
    if worker.send(Command::Detach { session, flushed }).await.is_ok() {
        let _ = tokio::time::timeout(DETACH_FLUSH_TIMEOUT, applied).await;
    }
    if let Some(status) = ending {
        let _ = outbound.send(Err(status)).await;
    }
    debug!(session, "call ended");
}

/// Validates one client message and passes it to the worker. An error status
/// ends the call; a bad verdict only gets a verdict error.
async fn forward(
    session: SessionId,
    request: ConsumeRequest,
    outbound: &Outbound,
    worker: &mpsc::Sender<Command>,
) -> Result<(), Status> {
    let command = match request.kind {
        Some(Kind::Subscribe(_)) => {
            return Err(Error::invalid(
                "subscribe",
                "this call is already subscribed; a call subscribes once (open another call for another subscription)",
            )
            .into())
        }
        None => return Err(Error::invalid("kind", "a message must set subscribe, ack, fail, extend or drain").into()),
        Some(Kind::Ack(ack)) => {
            let ids = parse_ids(ack.ids, outbound).await;
            if ids.is_empty() {
                return Ok(());
            }
            Command::Ack { session, ids }
        }
        Some(Kind::Fail(fail)) => {
            let Some(id) = parse_id(&fail.id, outbound).await else { return Ok(()) };
            let retry_after = match super::duration("fail.retry_after", fail.retry_after) {
                Ok(delay) => delay,
                Err(e) => {
                    let message = format!("{e}; the delivery is still held");
                    reject(outbound, &fail.id, VerdictErrorCode::InvalidArgument, message).await;
                    return Ok(());
                }
            };
            let mut reason = fail.reason;
            truncate_utf8(&mut reason, MAX_REASON_BYTES);
            Command::Fail {
                session,
                fail: FailVerdict { text: fail.id, id, retry_after, dead_letter: fail.dead_letter, reason },
            }
        }
        Some(Kind::Drain(_)) => Command::Drain { session },
        Some(Kind::Extend(extend)) => {
            let by = match super::duration("extend.by", extend.by) {
                Ok(Some(by)) if !by.is_zero() => by,
                _ => {
                    for id in &extend.ids {
                        let message = "extend.by is required, greater than zero and at most 365 days";
                        reject(outbound, id, VerdictErrorCode::InvalidArgument, message).await;
                    }
                    return Ok(());
                }
            };
            let ids = parse_ids(extend.ids, outbound).await;
            Command::Extend { session, ids, by }
        }
    };
    worker.send(command).await.map_err(|_| Status::from(Error::ShuttingDown))
}

async fn parse_ids(texts: Vec<String>, outbound: &Outbound) -> Vec<(String, BrandedId)> {
    let mut ids = Vec::with_capacity(texts.len());
    for text in texts {
        if let Some(id) = parse_id(&text, outbound).await {
            ids.push((text, id));
        }
    }
    ids
}

async fn parse_id(text: &str, outbound: &Outbound) -> Option<BrandedId> {
    match text.parse() {
        Ok(id) => Some(id),
        Err(e) => {
            let shown: String = text.chars().take(64).collect();
            reject(outbound, &shown, VerdictErrorCode::InvalidArgument, e.to_string()).await;
            None
        }
    }
}

async fn reject(outbound: &Outbound, id: &str, code: VerdictErrorCode, message: impl Into<String>) {
    let error = VerdictError { id: id.to_owned(), code: code as i32, message: message.into() };
    let _ = outbound.send(Ok(response(consume_response::Kind::VerdictError(error)))).await;
}

fn truncate_utf8(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}
