//! A test client of the Consume call: one call whose requests go through a
//! bounded channel and whose answers are read as [`Event`]s, with the waits
//! and assertions the tests share (the next delivery, quiet, the end).

use std::time::{Duration, Instant};

use echomq::proto::consume_request::Kind;
use echomq::proto::consume_response::Kind as ResponseKind;
use echomq::proto::consumer_service_client::ConsumerServiceClient;
use echomq::proto::{
    Ack, AckEmit, AppendResponse, ConsumeRequest, ConsumeResponse, Delivery, Emit, Emitted, Fail, GroupStart,
    Subscribe, Subscribed, VerdictError,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use super::process::EVENT_TIMEOUT;
use super::sidecar::Sidecar;
use super::wire::{duration_ms, with_token};

/// A Subscribe for `stream`/`group` starting at `start`, everything else default.
pub fn subscribe_msg(stream: &str, group: &str, start: GroupStart) -> Subscribe {
    Subscribe { stream: stream.to_owned(), group: group.to_owned(), group_start: start as i32, ..Subscribe::default() }
}

pub fn req(kind: Kind) -> ConsumeRequest {
    ConsumeRequest { kind: Some(kind) }
}

/// One emit of an AckEmit: its stream and its fields (name, value).
pub type EmitSpec<'a> = (&'a str, &'a [(&'a str, &'a [u8])]);

/// What a Consume call produced next.
#[derive(Debug)]
pub enum Event {
    Subscribed(Subscribed),
    Delivery(Delivery),
    /// A DeliveryBatch frame (a subscribe with `max_batch` above 1).
    Batch(Vec<Delivery>),
    VerdictError(VerdictError),
    /// The answer to an applied AckEmit.
    Emitted(Emitted),
    /// A ConsumeResponse with no kind set.
    Empty,
    /// The call ended: `None` for a clean end (OK), the status otherwise.
    Ended(Option<Status>),
    /// Nothing arrived in time.
    Timeout,
}

/// One Consume call: requests go through a bounded channel, responses are read
/// from tonic's stream. Dropping it cancels the call (a client disconnect).
pub struct Consumer {
    tx: Option<mpsc::Sender<ConsumeRequest>>,
    rx: Streaming<ConsumeResponse>,
    ended: bool,
    /// The server's confirmation, once received.
    pub subscribed: Option<Subscribed>,
}

impl Consumer {
    /// Opens a Consume call whose first message is `first`, without waiting for
    /// any answer. `Err` when the server refuses the call before its first message.
    pub async fn open(sidecar: &Sidecar, first: ConsumeRequest) -> Result<Consumer, Status> {
        Consumer::open_on(sidecar.consumer_client().await, None, first).await
    }

    /// As [`Consumer::open`], on a client of the caller's making (TLS, say),
    /// with `authorization: Bearer <token>` when `token` is set.
    pub async fn open_on(
        mut client: ConsumerServiceClient<Channel>,
        token: Option<&str>,
        first: ConsumeRequest,
    ) -> Result<Consumer, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.expect("queue the first message");
        let response = client.consume(with_token(ReceiverStream::new(rx), token)).await?;
        Ok(Consumer { tx: Some(tx), rx: response.into_inner(), ended: false, subscribed: None })
    }

    /// As [`Consumer::try_subscribe`], on a client of the caller's making.
    pub async fn try_subscribe_on(
        client: ConsumerServiceClient<Channel>,
        token: Option<&str>,
        subscribe: Subscribe,
    ) -> Result<Consumer, Status> {
        let consumer = Consumer::open_on(client, token, req(Kind::Subscribe(subscribe))).await?;
        consumer.confirm().await
    }

    /// Opens a call, subscribes and waits for `Subscribed`. `Err` carries the
    /// status the call ended with instead.
    pub async fn try_subscribe(sidecar: &Sidecar, subscribe: Subscribe) -> Result<Consumer, Status> {
        let consumer = Consumer::open(sidecar, req(Kind::Subscribe(subscribe))).await?;
        consumer.confirm().await
    }

    /// Waits for `Subscribed`; `Err` carries the status the call ended with instead.
    async fn confirm(self) -> Result<Consumer, Status> {
        let mut consumer = self;
        match consumer.next_event(Duration::from_secs(20)).await {
            Event::Subscribed(s) => {
                consumer.subscribed = Some(s);
                Ok(consumer)
            }
            Event::Ended(Some(status)) => Err(status),
            other => panic!("expected Subscribed, got {other:?}"),
        }
    }

    /// As [`Consumer::try_subscribe`], panicking when the subscription fails.
    pub async fn subscribe(sidecar: &Sidecar, subscribe: Subscribe) -> Consumer {
        let desc = format!("{}/{}", subscribe.stream, subscribe.group);
        Consumer::try_subscribe(sidecar, subscribe).await.unwrap_or_else(|s| panic!("subscribe {desc}: {s:?}"))
    }

    /// Subscribes with `max_in_flight` (0 = the sidecar's default).
    pub async fn start(
        sidecar: &Sidecar,
        stream: &str,
        group: &str,
        start: GroupStart,
        max_in_flight: u32,
    ) -> Consumer {
        let mut sub = subscribe_msg(stream, group, start);
        sub.max_in_flight = max_in_flight;
        Consumer::subscribe(sidecar, sub).await
    }

    /// A clone of the call's request side, for handlers that answer from
    /// tasks of their own while this reads the deliveries.
    pub fn sender(&self) -> mpsc::Sender<ConsumeRequest> {
        self.tx.clone().expect("the request side is closed")
    }

    /// Queues one client message.
    pub async fn send(&self, request: ConsumeRequest) {
        let tx = self.tx.as_ref().expect("the request side is closed");
        // A send error means the call is gone; the next read reports how it ended.
        let _ = tx.send(request).await;
    }

    pub async fn ack(&self, ids: &[&str]) {
        self.send(req(Kind::Ack(Ack { ids: ids.iter().map(|s| (*s).to_owned()).collect() }))).await;
    }

    pub async fn ack_one(&self, id: &str) {
        self.ack(&[id]).await;
    }

    /// AckEmit{id, emits}: each emit a stream and its fields.
    pub async fn ack_emit(&self, id: &str, emits: &[EmitSpec<'_>]) {
        let emits = emits
            .iter()
            .map(|(stream, fields)| Emit {
                stream: (*stream).to_owned(),
                fields: fields.iter().map(|(name, value)| ((*name).to_owned(), value.to_vec())).collect(),
            })
            .collect();
        self.send(req(Kind::AckEmit(AckEmit { id: id.to_owned(), emits }))).await;
    }

    /// The next Emitted answer; panics on anything else.
    pub async fn next_emitted(&mut self, timeout: Duration) -> Emitted {
        match self.next_event(timeout).await {
            Event::Emitted(e) => e,
            other => panic!("expected Emitted within {timeout:?}, got {other:?}"),
        }
    }

    /// Fail{id, retry_after} (no dead letter).
    pub async fn fail(&self, id: &str, retry_after: Option<Duration>) {
        self.send(req(Kind::Fail(Fail {
            id: id.to_owned(),
            reason: "test failure".to_owned(),
            retry_after: retry_after.map(|d| duration_ms(d.as_millis() as u64)),
            dead_letter: false,
            ..Default::default()
        })))
        .await;
    }

    /// Fail{id, reason, dead_letter: true}.
    pub async fn dead_letter(&self, id: &str, reason: &str) {
        self.send(req(Kind::Fail(Fail {
            id: id.to_owned(),
            reason: reason.to_owned(),
            retry_after: None,
            dead_letter: true,
            ..Default::default()
        })))
        .await;
    }

    /// Half-closes the call: no more client messages.
    pub fn close_send(&mut self) {
        self.tx = None;
    }

    /// The next thing the server sent, or `Timeout`.
    pub async fn next_event(&mut self, timeout: Duration) -> Event {
        if self.ended {
            return Event::Ended(None);
        }
        match tokio::time::timeout(timeout, self.rx.message()).await {
            Err(_) => Event::Timeout,
            Ok(Ok(Some(response))) => match response.kind {
                Some(ResponseKind::Subscribed(s)) => Event::Subscribed(s),
                Some(ResponseKind::Delivery(d)) => Event::Delivery(d),
                Some(ResponseKind::Batch(b)) => Event::Batch(b.deliveries),
                Some(ResponseKind::VerdictError(e)) => Event::VerdictError(e),
                Some(ResponseKind::Emitted(e)) => Event::Emitted(e),
                None => Event::Empty,
            },
            Ok(Ok(None)) => {
                self.ended = true;
                Event::Ended(None)
            }
            Ok(Err(status)) => {
                self.ended = true;
                Event::Ended(Some(status))
            }
        }
    }

    /// The next delivery; panics on anything else (a verdict error, the end of the call, a timeout).
    pub async fn next_delivery(&mut self, timeout: Duration) -> Delivery {
        match self.next_event(timeout).await {
            Event::Delivery(d) => d,
            other => panic!("expected a delivery within {timeout:?}, got {other:?}"),
        }
    }

    /// `n` deliveries, each within `timeout` of the previous one.
    pub async fn deliveries(&mut self, n: usize, timeout: Duration) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            match self.next_event(timeout).await {
                Event::Delivery(d) => out.push(d),
                other => panic!("expected delivery {} of {n}, got {other:?} (after {:?})", i + 1, ids(&out)),
            }
        }
        out
    }

    /// The next DeliveryBatch frame's deliveries; panics on anything else.
    pub async fn next_batch(&mut self, timeout: Duration) -> Vec<Delivery> {
        match self.next_event(timeout).await {
            Event::Batch(deliveries) => deliveries,
            other => panic!("expected a DeliveryBatch within {timeout:?}, got {other:?}"),
        }
    }

    /// Batch frames until `n` deliveries came, each frame within `timeout`
    /// of the previous one: the frames, in order.
    pub async fn batches(&mut self, n: usize, timeout: Duration) -> Vec<Vec<Delivery>> {
        let mut frames: Vec<Vec<Delivery>> = Vec::new();
        while frames.iter().map(Vec::len).sum::<usize>() < n {
            frames.push(self.next_batch(timeout).await);
        }
        frames
    }

    /// The next verdict error; panics on anything else.
    pub async fn next_verdict_error(&mut self, timeout: Duration) -> VerdictError {
        match self.next_event(timeout).await {
            Event::VerdictError(e) => e,
            other => panic!("expected a VerdictError within {timeout:?}, got {other:?}"),
        }
    }

    /// Asserts that the server sends nothing for `quiet`.
    pub async fn assert_quiet(&mut self, quiet: Duration, why: &str) {
        match self.next_event(quiet).await {
            Event::Timeout => {}
            other => panic!("expected nothing for {quiet:?} ({why}), got {other:?}"),
        }
    }

    /// Waits for the end of the call, skipping deliveries; the final status (None = OK).
    pub async fn wait_end(&mut self, timeout: Duration) -> Option<Status> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await {
                Event::Ended(status) => return status,
                Event::Timeout => panic!("the call did not end within {timeout:?}"),
                _ => {}
            }
        }
    }
}

/// The branded ids of deliveries, in order.
pub fn ids(deliveries: &[Delivery]) -> Vec<String> {
    deliveries.iter().map(|d| d.id.clone()).collect()
}

/// The describe tests' state: five entries appended to `s` (field `n` 0 to
/// 4), and a call on `s`/`g` from the beginning with `max_in_flight` 2 that
/// holds the first two and is seen to take no more: pending 2, lag 3.
pub async fn two_held_of_five(sidecar: &Sidecar) -> (Vec<AppendResponse>, Consumer) {
    let appended = sidecar.append_numbered("s", 5).await;
    let mut call = Consumer::start(sidecar, "s", "g", GroupStart::Beginning, 2).await;
    call.deliveries(2, EVENT_TIMEOUT).await;
    call.assert_quiet(Duration::from_millis(300), "max_in_flight 2").await;
    (appended, call)
}
