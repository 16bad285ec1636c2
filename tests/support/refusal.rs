//! Table-driven refusals: a table of [`Refusal`] cases, each a call the
//! sidecar must refuse with a given status code (and message), from a given
//! Redis state, leaving given keys as they were; one loop
//! ([`assert_refusals`]) runs them against one sidecar and names the failing
//! cases.

use echomq::proto::{
    AppendBatchRequest, AppendRequest, BatchEntry, DescribeGroupRequest, ListDeadLettersRequest, ReadRequest,
    Subscribe, TrimRequest,
};
use redis::aio::MultiplexedConnection;
use tonic::{Code, Status};

use super::consume::Consumer;
use super::redis_probe::{create_group, exists, xadd_raw, xlen};
use super::redis_server::RedisServer;
use super::sidecar::Sidecar;
use super::wire::fields;

/// One call to the sidecar, made on a client of its own.
#[derive(Debug)]
pub enum Rpc {
    Append(AppendRequest),
    AppendBatch(AppendBatchRequest),
    Read(ReadRequest),
    Trim(TrimRequest),
    /// A Consume call that subscribes with this (refused: the call ends before `Subscribed`).
    Subscribe(Subscribe),
    DescribeGroup(DescribeGroupRequest),
    ListDeadLetters(ListDeadLettersRequest),
    CancelScheduled(echomq::proto::CancelScheduledRequest),
    ListScheduled(echomq::proto::ListScheduledRequest),
}

impl Rpc {
    /// Makes the call; `Err` with the status it was refused with.
    pub async fn call(self, sidecar: &Sidecar) -> Result<(), Status> {
        match self {
            Rpc::Append(r) => sidecar.stream_client().await.append(r).await.map(drop),
            Rpc::AppendBatch(r) => sidecar.stream_client().await.append_batch(r).await.map(drop),
            Rpc::Read(r) => sidecar.stream_client().await.read(r).await.map(drop),
            Rpc::Trim(r) => sidecar.stream_client().await.trim(r).await.map(drop),
            Rpc::Subscribe(s) => Consumer::try_subscribe(sidecar, s).await.map(drop),
            Rpc::DescribeGroup(r) => sidecar.admin_client().await.describe_group(r).await.map(drop),
            Rpc::ListDeadLetters(r) => sidecar.admin_client().await.list_dead_letters(r).await.map(drop),
            Rpc::CancelScheduled(r) => sidecar.stream_client().await.cancel_scheduled(r).await.map(drop),
            Rpc::ListScheduled(r) => sidecar.stream_client().await.list_scheduled(r).await.map(drop),
        }
    }
}

/// Redis state a case starts from (on an emptied Redis).
#[derive(Debug)]
pub enum Seed {
    /// `SET key value`: a key of another type than a stream.
    String(&'static str, &'static str),
    /// `n` entries `k=v` added with a plain `XADD` (a foreign producer).
    Entries(&'static str, usize),
    /// `n` entries appended through the sidecar's AppendBatch, field `n` = 0, 1, …
    Appended(&'static str, usize),
    /// `XGROUP CREATE key group 0 MKSTREAM`.
    Group(&'static str, &'static str),
}

impl Seed {
    async fn plant(&self, con: &mut MultiplexedConnection, sidecar: &Sidecar) {
        match *self {
            Seed::String(key, value) => {
                let _: () = redis::cmd("SET").arg(key).arg(value).query_async(con).await.expect("SET");
            }
            Seed::Entries(key, n) => {
                for _ in 0..n {
                    xadd_raw(con, key, &[(b"k", b"v")]).await;
                }
            }
            Seed::Appended(key, n) => {
                let entries = (0..n)
                    .map(|i| BatchEntry { fields: fields(&[("n", i.to_string().as_bytes())]), ..Default::default() })
                    .collect();
                let request = AppendBatchRequest { stream: key.into(), entries, ..Default::default() };
                sidecar.stream_client().await.append_batch(request).await.expect("append batch");
            }
            Seed::Group(key, group) => create_group(con, key, group, "0").await,
        }
    }
}

/// What a refused call must leave as it was.
#[derive(Debug)]
pub enum Leaves {
    /// The key does not exist: nothing was written to it (no group door opened).
    NoKey(&'static str),
    /// No key exists at all.
    NoKeys,
    /// `GET key` is still `value`.
    String(&'static str, &'static str),
    /// `XLEN key` is still `n`: nothing trimmed, nothing appended.
    Len(&'static str, i64),
}

impl Leaves {
    /// What is wrong, if anything.
    async fn check(&self, con: &mut MultiplexedConnection) -> Option<String> {
        match *self {
            Leaves::NoKey(key) => exists(con, key).await.then(|| format!("{key} was written")),
            Leaves::NoKeys => {
                let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(con).await.expect("KEYS");
                (!keys.is_empty()).then(|| format!("nothing may be written: {keys:?}"))
            }
            Leaves::String(key, value) => {
                let now: String = redis::cmd("GET").arg(key).query_async(con).await.expect("GET");
                (now != value).then(|| format!("{key} is {now:?}, not the untouched {value:?}"))
            }
            Leaves::Len(key, n) => {
                let now = xlen(con, key).await;
                (now != n).then(|| format!("XLEN {key} is {now}, not {n}"))
            }
        }
    }
}

/// One call that must be refused.
#[derive(Debug)]
pub struct Refusal {
    /// Names the case in its failure messages.
    pub case: &'static str,
    pub seed: Vec<Seed>,
    pub rpc: Rpc,
    /// The status code it must be refused with.
    pub code: Code,
    /// Texts the status message must contain (the stream it names, say).
    pub names: Vec<&'static str>,
    pub leaves: Vec<Leaves>,
}

impl Refusal {
    /// `rpc` must be refused with `code`, from an empty Redis.
    pub fn new(case: &'static str, rpc: Rpc, code: Code) -> Refusal {
        Refusal { case, seed: Vec::new(), rpc, code, names: Vec::new(), leaves: Vec::new() }
    }

    /// Redis holds `seed` before the call.
    pub fn given(mut self, seed: Seed) -> Refusal {
        self.seed.push(seed);
        self
    }

    /// The status message names `text`.
    pub fn naming(mut self, text: &'static str) -> Refusal {
        self.names.push(text);
        self
    }

    /// After the refusal, Redis `leaves` as it was.
    pub fn leaving(mut self, leaves: Leaves) -> Refusal {
        self.leaves.push(leaves);
        self
    }
}

/// Runs every case in turn against `sidecar`, each on an emptied Redis
/// (`FLUSHALL`, then its seed), and fails once at the end with every case
/// that went wrong, by name.
pub async fn assert_refusals(redis: &RedisServer, sidecar: &Sidecar, cases: Vec<Refusal>) {
    let mut con = redis.conn().await;
    let mut failures = Vec::new();
    for Refusal { case, seed, rpc, code, names, leaves } in cases {
        let before = failures.len();
        let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.expect("FLUSHALL");
        for s in &seed {
            s.plant(&mut con, sidecar).await;
        }
        let shown = format!("{rpc:?}");
        match rpc.call(sidecar).await {
            Ok(()) => failures.push(format!("{case}: must be refused with {code:?}, was accepted")),
            Err(status) if status.code() != code => {
                failures.push(format!("{case}: must be refused with {code:?}, got {status:?}"))
            }
            Err(status) => {
                for text in names {
                    if !status.message().contains(text) {
                        failures.push(format!("{case}: the message must name {text:?}: {status:?}"));
                    }
                }
            }
        }
        for leave in &leaves {
            if let Some(wrong) = leave.check(&mut con).await {
                failures.push(format!("{case}: a refused call must leave Redis alone: {wrong}"));
            }
        }
        if failures.len() > before {
            eprintln!("refusal case {case:?} failed; its call: {}", short(&shown));
        }
    }
    assert!(failures.is_empty(), "{} refusal case(s) failed:\n{}", failures.len(), failures.join("\n"));
}

/// A call's debug text, cut to a readable length (a name may be kilobytes).
fn short(text: &str) -> String {
    if text.chars().count() > 300 {
        format!("{}…", text.chars().take(300).collect::<String>())
    } else {
        text.to_owned()
    }
}
