//! One Consume call as the sequences drive it: messages go out without
//! waiting, and every step ends with a fence (an Ack of a well-formed id no
//! call holds, answered UNKNOWN_ID through the group worker), so each verdict
//! error is attributed to the step that caused it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::consume_response::Kind as ResponseKind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::{Ack, ConsumeRequest, ConsumeResponse, Delivery, VerdictError, VerdictErrorCode};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use super::oracle::describe_error;
use super::support::req;
use super::ANSWER;

use VerdictErrorCode::UnknownId as UNKNOWN;

/// What came next on a call.
enum Next {
    Response(Box<ConsumeResponse>),
    Ended(Option<Status>),
    Timeout,
}

/// A Consume call and what the test knows of it.
pub(crate) struct Call {
    tx: Option<mpsc::Sender<ConsumeRequest>>,
    rx: Streaming<ConsumeResponse>,
    /// How the call ended (`Some(None)`: OK), once it has.
    pub(crate) ended: Option<Option<Status>>,
    /// What this call holds, by the test's account: branded id → stream id.
    pub(crate) held: BTreeMap<String, String>,
    /// Deliveries received and not yet taken by the sequence.
    pub(crate) fresh: Vec<Delivery>,
    /// Problems seen on the wire (a second Subscribed, an empty message).
    pub(crate) oddities: Vec<String>,
    /// A Drain was sent: no new deliveries (those on the wire still come).
    pub(crate) drained: bool,
}

impl Call {
    /// Opens the call with `first`; `Err` when the server refuses it at once.
    pub(crate) async fn open(client: &ConsumerServiceClient<Channel>, first: ConsumeRequest) -> Result<Call, Status> {
        // Roomy: a burst is queued whole while the test reads answers.
        let (tx, rx) = mpsc::channel(4096);
        tx.send(first).await.expect("queue the first message");
        let response = client.clone().consume(ReceiverStream::new(rx)).await?;
        Ok(Call {
            tx: Some(tx),
            rx: response.into_inner(),
            ended: None,
            held: BTreeMap::new(),
            fresh: Vec::new(),
            oddities: Vec::new(),
            drained: false,
        })
    }

    async fn next(&mut self, timeout: Duration) -> Next {
        if let Some(status) = &self.ended {
            return Next::Ended(status.clone());
        }
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => Next::Timeout,
            Ok(Ok(Some(response))) => Next::Response(Box::new(response)),
            Ok(Ok(None)) => {
                self.ended = Some(None);
                Next::Ended(None)
            }
            Ok(Err(status)) => {
                self.ended = Some(Some(status.clone()));
                Next::Ended(Some(status))
            }
        }
    }

    /// The first answer after a subscribe: Subscribed, or how the call ended.
    pub(crate) async fn confirm(&mut self) -> Result<echomq::proto::Subscribed, String> {
        match self.next(ANSWER).await {
            Next::Response(response) => match response.kind {
                Some(ResponseKind::Subscribed(s)) => Ok(s),
                other => Err(format!("expected Subscribed first, got {other:?}")),
            },
            Next::Ended(status) => Err(format!("ended with {status:?}")),
            Next::Timeout => Err(format!("no answer to the subscribe within {ANSWER:?}")),
        }
    }

    fn take(&mut self, response: ConsumeResponse) -> Option<VerdictError> {
        match response.kind {
            // Taken into `held` by `Seq::absorb`, after the step's verdicts are
            // applied: a Fail with no delay can come back before the fence.
            Some(ResponseKind::Delivery(d)) => {
                self.fresh.push(d);
                None
            }
            Some(ResponseKind::Batch(batch)) => {
                if batch.deliveries.is_empty() {
                    self.oddities.push("an empty DeliveryBatch".to_owned());
                }
                self.fresh.extend(batch.deliveries);
                None
            }
            Some(ResponseKind::VerdictError(e)) => Some(e),
            Some(ResponseKind::Subscribed(s)) => {
                self.oddities.push(format!("a second Subscribed: {s:?}"));
                None
            }
            // An AckEmit applied: the generator counted its delivery acked,
            // and the ledger check finds it so; it may come after the fence.
            Some(ResponseKind::Emitted(e)) => {
                if e.entries.len() > 2 {
                    self.oddities.push(format!("an Emitted answer with more entries than any AckEmit sent: {e:?}"));
                }
                None
            }
            None => {
                self.oddities.push("a ConsumeResponse without a kind".to_owned());
                None
            }
        }
    }

    pub(crate) fn send_now(&self, message: ConsumeRequest) {
        if let Some(tx) = &self.tx {
            // The channel is roomy; a full or closed one means the call is gone.
            let _ = tx.try_send(message);
        }
    }

    /// Sends `messages`, then a fence, and collects the verdict errors that come
    /// before the fence's. `Err` with the call's end status when it ends instead.
    pub(crate) async fn exchange(
        &mut self,
        messages: Vec<ConsumeRequest>,
        fence: &str,
    ) -> Result<Vec<VerdictError>, (Vec<VerdictError>, String)> {
        for message in messages {
            self.drained |= matches!(message.kind, Some(Kind::Drain(_)));
            self.send_now(message);
        }
        self.send_now(req(Kind::Ack(Ack { ids: vec![fence.to_owned()] })));
        let mut errors = Vec::new();
        loop {
            match self.next(ANSWER).await {
                Next::Response(response) => {
                    if let Some(error) = self.take(*response) {
                        if error.id == fence {
                            if error.code != UNKNOWN as i32 {
                                errors.push(error);
                            }
                            return Ok(errors);
                        }
                        errors.push(error);
                    }
                }
                Next::Ended(status) => return Err((errors, format!("the call ended with {status:?}"))),
                Next::Timeout => return Err((errors, format!("the fence was not answered within {ANSWER:?}"))),
            }
        }
    }

    /// Waits for a delivery (up to `timeout`); true if one came.
    pub(crate) async fn wait_delivery(&mut self, timeout: Duration) -> Result<bool, String> {
        let deadline = Instant::now() + timeout;
        let before = self.fresh.len();
        while self.fresh.len() == before {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            match self.next(left).await {
                Next::Response(response) => {
                    if let Some(error) = self.take(*response) {
                        return Err(format!("an unprompted verdict error: {}", describe_error(&error)));
                    }
                }
                Next::Ended(status) => return Err(format!("the call ended with {status:?}")),
                Next::Timeout => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Waits for the end of the call; its status (None = OK) and the verdict
    /// errors that came first.
    pub(crate) async fn wait_end(&mut self) -> Result<(Option<Status>, Vec<VerdictError>), String> {
        let mut errors = Vec::new();
        loop {
            match self.next(ANSWER).await {
                Next::Response(response) => errors.extend(self.take(*response)),
                Next::Ended(status) => return Ok((status, errors)),
                Next::Timeout => return Err(format!("the call did not end within {ANSWER:?}")),
            }
        }
    }

    pub(crate) fn close_send(&mut self) {
        self.tx = None;
    }
}
