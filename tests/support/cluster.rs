//! A local Redis Cluster for the integration tests: `redis-server` processes in
//! cluster mode on free loopback ports, joined by `redis-cli --cluster create`,
//! with a graceful failover and a primary kill whose waits end only once every
//! live node agrees on the new topology (so a client following MOVED finds the
//! new primary at once).
//!
//! Each node is a [`RedisServer`] (its own temp dir with its `nodes.conf`;
//! killed, and its log tail printed when a test fails or `ECHOMQ_TEST_LOGS` is
//! set, on drop), started by the shared launcher as a cluster node
//! ([`RedisOptions::cluster`]: the cluster flags, on a port that leaves room
//! for its cluster bus port, port + 10000).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::Value;

use super::process::{tail, unique, EVENT_TIMEOUT, START_TIMEOUT};
use super::redis_probe::{as_array, as_int, wait_replicas_acknowledge};
use super::redis_server::{RedisOptions, RedisServer};

/// Redis Cluster's hash slots: 0..16384.
const SLOTS: u16 = 16384;
/// `--cluster-node-timeout`: a node silent this long is suspected, and a failed
/// primary's replica is promoted a second or two later. Short, so a kill heals
/// in a few seconds instead of the default's 15+.
const NODE_TIMEOUT_MS: u64 = 1000;
/// How long a graceful failover may take before the fixture gives up.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one `CLUSTER FAILOVER` request is given before it is asked again:
/// a little over Redis's own 5 s manual-failover timeout.
const MANUAL_FAILOVER_ATTEMPT: Duration = Duration::from_secs(7);
/// How long failure detection plus a replica's promotion may take after a kill.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one node may take to answer the fixture's inspection commands.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One range of hash slots and the nodes serving it, as `CLUSTER SLOTS` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub start: u16,
    /// Inclusive.
    pub end: u16,
    pub primary: u16,
    /// The replicas the reporting node knows (failed ones are left out).
    pub replicas: Vec<u16>,
}

/// What a node says it is (`INFO replication`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Primary,
    /// A replica of the primary on port `of`; `link_up` once `master_link_status:up`.
    Replica {
        of: u16,
        link_up: bool,
    },
}

/// The cluster as its live nodes describe it, at a moment they all agree: each
/// says `cluster_state:ok` and maps every slot to the same primary, every slot's
/// primary runs and says it is a primary, and every replica's link is up.
#[derive(Clone, Debug)]
pub struct Topology {
    /// All 16384 slots, in slot order (replica lists as the first live node reports them).
    pub slots: Vec<SlotRange>,
    /// Each live node's own view of its role, by port.
    pub roles: BTreeMap<u16, Role>,
}

impl Topology {
    /// The port of the primary serving `slot`.
    pub fn primary_of_slot(&self, slot: u16) -> u16 {
        self.slots.iter().find(|r| r.start <= slot && slot <= r.end).map(|r| r.primary).expect("all slots covered")
    }

    /// The ports of the primaries serving slots, in slot order.
    pub fn primaries(&self) -> Vec<u16> {
        let mut out: Vec<u16> = Vec::new();
        for range in &self.slots {
            if !out.contains(&range.primary) {
                out.push(range.primary);
            }
        }
        out
    }

    /// The live nodes that say they replicate `primary`, by port.
    pub fn replicas_of(&self, primary: u16) -> Vec<u16> {
        self.roles
            .iter()
            .filter(|(_, role)| matches!(role, Role::Replica { of, .. } if *of == primary))
            .map(|(p, _)| *p)
            .collect()
    }
}

/// The hash slot of `key`, by redis-rs' own routing (`Slot` keeps its number
/// private, so it is found by comparison; 16384 compares are nothing).
pub fn key_slot(key: &str) -> u16 {
    let slot = Slot::for_key(key);
    (0..SLOTS).find(|&n| Slot::new(n) == Some(slot)).expect("Slot::for_key is below 16384")
}

/// A Redis Cluster of `redis-server` children on loopback. Dropping it kills
/// every node (each [`RedisServer`] does its own).
pub struct RedisCluster {
    /// In start order. A killed node keeps its place, port and dir, for [`RedisCluster::restart`].
    nodes: Vec<RedisServer>,
    replicas_per_primary: usize,
}

impl RedisCluster {
    /// Starts `primaries * (1 + replicas_per_primary)` nodes, joins them with
    /// `redis-cli --cluster create`, and waits until every node agrees on all
    /// 16384 slots, says `cluster_state:ok`, and every replica's link is up.
    /// Panics with the nodes' log tails if that takes over [`START_TIMEOUT`].
    pub async fn start(primaries: usize, replicas_per_primary: usize) -> RedisCluster {
        assert!(primaries >= 3, "redis-cli --cluster create needs at least 3 primaries, not {primaries}");
        let mut nodes = Vec::new();
        for _ in 0..primaries * (1 + replicas_per_primary) {
            nodes.push(start_node().await);
        }
        let cluster = RedisCluster { nodes, replicas_per_primary };
        cluster.create().await;
        let replicas = primaries * replicas_per_primary;
        cluster
            .wait_until(START_TIMEOUT, "the cluster to come up", |t| {
                let (p, r) = (t.primaries().len(), t.roles.len() - t.primaries().len());
                if (p, r) == (primaries, replicas) {
                    Ok(())
                } else {
                    Err(format!("{p} primaries and {r} replicas so far, want {primaries} and {replicas}"))
                }
            })
            .await;
        if replicas_per_primary > 0 {
            cluster.wait_replicas_acknowledge().await;
        }
        cluster
    }

    /// Waits until every primary's replicas acknowledge a write (see
    /// [`wait_replicas_acknowledge`]).
    async fn wait_replicas_acknowledge(&self) {
        let topology = self.topology().await;
        for key in self.key_per_primary("ready").await {
            let port = topology.primary_of_slot(key_slot(&key));
            let mut con = self.nodes.iter().find(|n| n.port() == port).expect("the primary's node").conn().await;
            wait_replicas_acknowledge(&mut con, &key, self.replicas_per_primary as i64).await;
        }
    }

    /// `redis-cli --cluster create` on all nodes (off the runtime's threads: it
    /// blocks, polling the nodes once a second until they have met).
    async fn create(&self) {
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        args.extend([
            "--cluster-replicas".to_owned(),
            self.replicas_per_primary.to_string(),
            "--cluster-yes".to_owned(),
        ]);
        let run =
            tokio::task::spawn_blocking(move || Command::new("redis-cli").args(&args).stdin(Stdio::null()).output());
        let output = match tokio::time::timeout(START_TIMEOUT, run).await {
            Ok(Ok(Ok(output))) => output,
            Ok(Ok(Err(e))) => panic!("run redis-cli (is /usr/bin/redis-cli installed?): {e}"),
            Ok(Err(e)) => panic!("the redis-cli task failed: {e}"),
            Err(_) => panic!("redis-cli --cluster create ran over {START_TIMEOUT:?}\n{}", self.log_tails()),
        };
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed ({}):\n{}{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log_tails()
        );
    }

    /// SIGSTOP (`paused`) or SIGCONT the node on `port` (see [`RedisServer::pause`]).
    pub fn pause(&self, port: u16, paused: bool) {
        self.nodes.iter().find(|n| n.port() == port).expect("a node on that port").pause(paused);
    }

    /// The ports of all nodes, killed ones included, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The ports of the nodes that run.
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes.iter().filter(|n| n.pid().is_some()).map(RedisServer::port).collect()
    }

    /// `redis://127.0.0.1:<port>` of the first node that runs.
    pub fn seed_url(&self) -> String {
        let port = *self.live_ports().first().expect("a node that runs");
        format!("redis://127.0.0.1:{port}")
    }

    /// Every node's URL, killed ones included (a seed list may name a dead node),
    /// joined by commas: the sidecar's `--redis-url` for a cluster.
    pub fn seed_urls(&self) -> String {
        self.ports().iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// A cluster connection (seeded with the live nodes) for tests to seed and
    /// inspect data. It follows MOVED, and retries quickly (every 0.1-1 s, up to
    /// 20 times) where redis-rs' default first waits 1.28 s, so a test reading
    /// right after a failover is not slowed by the client.
    pub async fn conn(&self) -> ClusterConnection {
        let nodes: Vec<String> = self.live_ports().iter().map(|p| format!("redis://127.0.0.1:{p}")).collect();
        ClusterClient::builder(nodes)
            .retries(20)
            .min_retry_wait(100)
            .max_retry_wait(1000)
            .connection_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(5))
            .overall_response_timeout(Some(Duration::from_secs(30)))
            .build()
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("connect to the cluster")
    }

    /// The topology once the live nodes agree (see [`Topology`]); panics after
    /// [`EVENT_TIMEOUT`] of disagreement.
    pub async fn topology(&self) -> Topology {
        self.wait_until(EVENT_TIMEOUT, "the nodes to agree on the topology", |t| Ok(t.clone())).await
    }

    /// The port of the primary serving `key`'s slot (once the live nodes agree).
    pub async fn primary_of(&self, key: &str) -> u16 {
        self.topology().await.primary_of_slot(key_slot(key))
    }

    /// The live replicas of the primary on `primary`, by port (once the live nodes agree).
    pub async fn replicas_of(&self, primary: u16) -> Vec<u16> {
        self.topology().await.replicas_of(primary)
    }

    /// One key per primary, named `<unique(prefix)>-<n>`, in slot order: for tests
    /// that must touch every shard.
    pub async fn key_per_primary(&self, prefix: &str) -> Vec<String> {
        let topology = self.topology().await;
        let base = unique(prefix);
        let mut found: BTreeMap<u16, String> = BTreeMap::new();
        let primaries = topology.primaries();
        for n in 0.. {
            let key = format!("{base}-{n}");
            found.entry(topology.primary_of_slot(key_slot(&key))).or_insert(key);
            if found.len() == primaries.len() {
                break;
            }
        }
        primaries.iter().map(|p| found.remove(p).expect("a key per primary")).collect()
    }

    /// A graceful failover of the primary serving `key`: `CLUSTER FAILOVER` sent
    /// to one of its replicas (again if Redis dropped the request), then a wait
    /// (up to 30 s in all) until that replica is a primary, every live node maps
    /// the slot to it, and the old primary replicates it with its link up. The
    /// new primary's port.
    pub async fn failover(&self, key: &str) -> u16 {
        let slot = key_slot(key);
        let topology = self.topology().await;
        let old = topology.primary_of_slot(slot);
        let replica = *topology
            .replicas_of(old)
            .first()
            .unwrap_or_else(|| panic!("failover of {key:?}: its primary :{old} has no replica"));
        let what = format!("the failover of slot {slot} from :{old} to :{replica}");
        let done = |t: &Topology| {
            let now = t.primary_of_slot(slot);
            let old_role = t.roles.get(&old);
            if now == replica && old_role == Some(&Role::Replica { of: replica, link_up: true }) {
                Ok(replica)
            } else {
                Err(format!("slot {slot} is served by :{now}, :{old} is {old_role:?}"))
            }
        };
        // A manual failover gives up silently after 5 s when the primary ignores
        // the request (it has not yet learnt over the cluster bus that the sender
        // is its replica, right after start on a busy machine): wait for that,
        // and ask again should the request still be lost.
        let deadline = Instant::now() + FAILOVER_TIMEOUT;
        self.until_primary_knows_replica(old, replica, slot, deadline).await;
        loop {
            ask::<Value>(replica, redis::cmd("CLUSTER").arg("FAILOVER"))
                .await
                .unwrap_or_else(|e| panic!("CLUSTER FAILOVER on :{replica}: {e}"));
            let attempt = MANUAL_FAILOVER_ATTEMPT.min(deadline.saturating_duration_since(Instant::now()));
            let objection = match self.poll_until(attempt, &done).await {
                Ok(new) => return new,
                Err(objection) => objection,
            };
            let promoted = matches!(self.agreed().await, Ok(t) if t.roles.get(&replica) == Some(&Role::Primary));
            let left = deadline.saturating_duration_since(Instant::now());
            if promoted || left.is_zero() {
                // Promoted: the rest is the old primary catching up, not a lost request.
                return self.wait_until(left, &what, &done).await;
            }
            eprintln!("{what}: not done after {attempt:?} ({objection}); asking again");
        }
    }

    /// Waits until `primary`'s own `CLUSTER SLOTS` lists `replica` for `slot`:
    /// until then it ignores that replica's manual-failover request.
    async fn until_primary_knows_replica(&self, primary: u16, replica: u16, slot: u16, deadline: Instant) {
        loop {
            let knows = ask::<Value>(primary, redis::cmd("CLUSTER").arg("SLOTS")).await.is_ok_and(|reply| {
                parse_slots(&reply).iter().any(|r| r.start <= slot && slot <= r.end && r.replicas.contains(&replica))
            });
            if knows {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "waited {FAILOVER_TIMEOUT:?} for :{primary} to list :{replica} as its replica\n{}",
                    self.log_tails()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILLs the primary serving `key`, then waits (up to 30 s) until one of
    /// its replicas has been promoted and the live nodes agree again (all
    /// `cluster_state:ok`). The killed node's port.
    pub async fn kill_primary(&mut self, key: &str) -> u16 {
        let slot = key_slot(key);
        let topology = self.topology().await;
        let old = topology.primary_of_slot(slot);
        let replicas = topology.replicas_of(old);
        assert!(!replicas.is_empty(), "kill_primary({key:?}): its primary :{old} has no replica to promote");
        self.node_mut(old).kill9();
        self.wait_until(
            PROMOTION_TIMEOUT,
            &format!("a replica of the killed :{old} ({replicas:?}) to take slot {slot}"),
            |t| {
                let now = t.primary_of_slot(slot);
                if replicas.contains(&now) {
                    Ok(())
                } else {
                    Err(format!("slot {slot} is served by :{now}"))
                }
            },
        )
        .await;
        old
    }

    /// Starts a killed node again on its port and dir. Its `nodes.conf` makes it
    /// rejoin, as a replica of whoever took its slots; waits (up to
    /// [`START_TIMEOUT`]) until it replicates with its link up.
    pub async fn restart(&mut self, port: u16) {
        self.node_mut(port).restart().await;
        self.wait_until(START_TIMEOUT, &format!(":{port} to rejoin as a replica"), |t| match t.roles.get(&port) {
            Some(Role::Replica { link_up: true, .. }) => Ok(()),
            other => Err(format!(":{port} is {other:?}")),
        })
        .await;
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes.iter_mut().find(|n| n.port() == port).unwrap_or_else(|| panic!("no cluster node on :{port}"))
    }

    /// Every node's log tail, for a panic message.
    pub fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("----- redis cluster node :{} log (tail) -----\n{}", n.port(), tail(&n.log(), 15)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Polls [`RedisCluster::agreed`] every 100 ms until `check` accepts it;
    /// panics with the last objection and the log tails after `timeout`.
    async fn wait_until<T>(&self, timeout: Duration, what: &str, check: impl Fn(&Topology) -> Result<T, String>) -> T {
        match self.poll_until(timeout, check).await {
            Ok(value) => value,
            Err(objection) => panic!("waited {timeout:?} for {what}; last: {objection}\n{}", self.log_tails()),
        }
    }

    /// Polls [`RedisCluster::agreed`] every 100 ms until `check` accepts it;
    /// the last objection after `timeout`.
    async fn poll_until<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&Topology) -> Result<T, String>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let objection = match self.agreed().await {
                Ok(topology) => match check(&topology) {
                    Ok(value) => return Ok(value),
                    Err(objection) => objection,
                },
                Err(objection) => objection,
            };
            if Instant::now() >= deadline {
                return Err(objection);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The topology if the live nodes agree on it (see [`Topology`]); what is
    /// wrong otherwise.
    async fn agreed(&self) -> Result<Topology, String> {
        let live = self.live_ports();
        let mut slots: Option<(u16, Vec<SlotRange>)> = None;
        let mut roles = BTreeMap::new();
        for &port in &live {
            let (info, reported, replication): (String, Value, String) = ask_pipe(
                port,
                redis::pipe().cmd("CLUSTER").arg("INFO").cmd("CLUSTER").arg("SLOTS").cmd("INFO").arg("replication"),
            )
            .await?;
            let info = fields(&info);
            let state = info.get("cluster_state").map(String::as_str).unwrap_or("?");
            if state != "ok" {
                return Err(format!(":{port} says cluster_state:{state}"));
            }
            let ranges = parse_slots(&reported);
            covers_all(&ranges).map_err(|gap| format!(":{port}'s CLUSTER SLOTS {gap}"))?;
            match &slots {
                None => slots = Some((port, ranges)),
                Some((first, agreed)) => {
                    let primaries = |r: &[SlotRange]| r.iter().map(|r| (r.start, r.end, r.primary)).collect::<Vec<_>>();
                    if primaries(agreed) != primaries(&ranges) {
                        return Err(format!(
                            "the nodes disagree on the slots' primaries: :{first} says {:?}, :{port} says {:?}",
                            primaries(agreed),
                            primaries(&ranges)
                        ));
                    }
                }
            }
            let replication = fields(&replication);
            let role = match replication.get("role").map(String::as_str) {
                Some("master") => Role::Primary,
                Some("slave") => Role::Replica {
                    of: replication.get("master_port").and_then(|p| p.parse().ok()).unwrap_or(0),
                    link_up: replication.get("master_link_status").map(String::as_str) == Some("up"),
                },
                other => return Err(format!(":{port} reports role {other:?}")),
            };
            roles.insert(port, role);
        }
        let (_, slots) = slots.ok_or("no node runs")?;
        let topology = Topology { slots, roles };
        for primary in topology.primaries() {
            match topology.roles.get(&primary) {
                Some(Role::Primary) => {}
                None => return Err(format!(":{primary} serves slots but does not run")),
                Some(other) => return Err(format!(":{primary} serves slots but says it is {other:?}")),
            }
        }
        for (port, role) in &topology.roles {
            if let Role::Replica { of, link_up } = *role {
                if !link_up {
                    return Err(format!(":{port}'s link to its primary :{of} is not up"));
                }
                if topology.roles.get(&of) != Some(&Role::Primary) {
                    return Err(format!(":{port} replicates :{of}, which is not a running primary"));
                }
            }
        }
        Ok(topology)
    }
}

/// Starts one cluster node (see [`RedisOptions::cluster`]) with the short
/// [`NODE_TIMEOUT_MS`], once it answers PING.
async fn start_node() -> RedisServer {
    RedisServer::start_with(RedisOptions::cluster_node(&["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])).await
}

/// `cmd` on the node at `port`, over a connection of its own (nodes come and go).
async fn ask<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    let call = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut con = client.get_multiplexed_async_connection().await?;
        cmd.query_async::<T>(&mut con).await
    };
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(result) => result.map_err(|e| format!(":{port}: {e}")),
        Err(_) => Err(format!(":{port} did not answer within {ASK_TIMEOUT:?}")),
    }
}

/// As [`ask`], for a pipeline (one round trip).
async fn ask_pipe<T: redis::FromRedisValue>(port: u16, pipe: &redis::Pipeline) -> Result<T, String> {
    let call = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let mut con = client.get_multiplexed_async_connection().await?;
        pipe.query_async::<T>(&mut con).await
    };
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(result) => result.map_err(|e| format!(":{port}: {e}")),
        Err(_) => Err(format!(":{port} did not answer within {ASK_TIMEOUT:?}")),
    }
}

/// The `key:value` lines of `INFO` / `CLUSTER INFO`.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines().filter_map(|line| line.trim_end().split_once(':')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// `CLUSTER SLOTS` as ranges in slot order: `[start, end, [ip, port, id, …], replicas…]`.
fn parse_slots(reply: &Value) -> Vec<SlotRange> {
    let port = |node: &Value| as_int(&as_array(node)[1]) as u16;
    let mut ranges: Vec<SlotRange> = as_array(reply)
        .iter()
        .map(|range| {
            let range = as_array(range);
            SlotRange {
                start: as_int(&range[0]) as u16,
                end: as_int(&range[1]) as u16,
                primary: port(&range[2]),
                replicas: range[3..].iter().map(port).collect(),
            }
        })
        .collect();
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// `Ok` when sorted `ranges` cover slots 0..16384 without gap or overlap.
fn covers_all(ranges: &[SlotRange]) -> Result<(), String> {
    let mut next = 0u32;
    for range in ranges {
        if u32::from(range.start) != next {
            return Err(format!("has slot {} next where {next} was due", range.start));
        }
        next = u32::from(range.end) + 1;
    }
    if next == u32::from(SLOTS) {
        Ok(())
    } else {
        Err(format!("ends at slot {next}, not {SLOTS}"))
    }
}
