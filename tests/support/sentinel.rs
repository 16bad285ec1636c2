//! A local Redis Sentinel deployment: a primary, replicas of it, and three
//! Sentinels monitoring it as `mymaster` (Debian's `redis-server --sentinel`),
//! each on a free loopback port; fast failover settings (down after 1 s,
//! failover timeout 5 s). Every process is killed on drop.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, kill_child, print_logs_requested, read_log, tail, tcp_accepts, TempDir};
use super::redis_probe;
use super::redis_server::{RedisOptions, RedisServer};

/// The master name the Sentinels monitor.
pub const MASTER_NAME: &str = "mymaster";

/// A primary, its replicas and three Sentinels (see the module doc).
pub struct SentinelDeployment {
    /// The data nodes: index 0 is the first primary.
    pub nodes: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

/// One `redis-server --sentinel` process.
struct SentinelProcess {
    port: u16,
    password: Option<String>,
    child: Option<Child>,
    log: PathBuf,
    _dir: TempDir,
}

impl SentinelDeployment {
    /// Starts a primary, `replicas` replicas of it (synced), and three Sentinels.
    pub async fn start(replicas: usize) -> SentinelDeployment {
        SentinelDeployment::start_with(replicas, None).await
    }

    /// As [`SentinelDeployment::start`], the Sentinels requiring `password`
    /// of their clients (`requirepass`) and of each other (`sentinel sentinel-pass`).
    pub async fn start_with(replicas: usize, password: Option<&str>) -> SentinelDeployment {
        let primary = RedisServer::start().await;
        let mut nodes = vec![primary];
        for _ in 0..replicas {
            let replica_of =
                ["--replicaof", "127.0.0.1", &nodes[0].port().to_string(), "--repl-diskless-sync-delay", "0"];
            let options =
                RedisOptions { args: replica_of.iter().map(|a| (*a).to_owned()).collect(), ..Default::default() };
            nodes.push(RedisServer::start_with(options).await);
        }
        // The primary must not wait 5 s to start a replica's full sync.
        let mut conn = nodes[0].conn().await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg("0")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut deployment = SentinelDeployment { nodes, sentinels: Vec::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(info) = deployment.replicas_synced(deployment.nodes[0].port()).await {
            assert!(Instant::now() < deadline, "the replicas did not sync within 30 s:\n{info}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..3 {
            deployment.sentinels.push(SentinelProcess::start(deployment.nodes[0].port(), password).await);
        }
        // Each Sentinel knows the primary at once; wait until they know each other
        // and the replicas, so a failover can be agreed.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut ready = true;
            for sentinel in &deployment.sentinels {
                let (known_sentinels, known_replicas) = sentinel.peers().await;
                ready &= known_sentinels >= 2 && known_replicas >= replicas;
            }
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "the Sentinels did not discover each other and the replicas in 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        deployment
    }

    /// `redis+sentinel://127.0.0.1:<s1>,127.0.0.1:<s2>,127.0.0.1:<s3>/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The Sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The port of the primary the Sentinels name now (the first that answers).
    pub async fn primary_port(&self) -> Option<u16> {
        for sentinel in &self.sentinels {
            if let Some(port) = sentinel.master_port().await {
                return Some(port);
            }
        }
        None
    }

    /// The data node on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes.iter().find(|n| n.port() == port).expect("a node of this deployment")
    }

    /// The data node on `port`, mutably (to kill it).
    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes.iter_mut().find(|n| n.port() == port).expect("a node of this deployment")
    }

    /// Waits until the Sentinels name a primary other than `old` that says it
    /// is one (`ROLE`), and returns its port. Panics after `timeout`.
    pub async fn until_failed_over(&self, old: u16, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(port) = self.primary_port().await.filter(|port| *port != old) {
                if role(self.node(port)).await.as_deref() == Some("master") {
                    return port;
                }
            }
            assert!(Instant::now() < deadline, "the Sentinels did not fail over from :{old} within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether every other data node is an online replica of the primary on
    /// `primary` (its `INFO replication`) that acknowledges a write there
    /// (`WAIT`, 200 ms); else the `INFO` seen.
    async fn replicas_synced(&self, primary: u16) -> Result<(), String> {
        let replicas = self.nodes.len() - 1;
        let mut conn = self.node(primary).conn().await;
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap_or_default();
        let online = info.lines().filter(|line| line.starts_with("slave") && line.contains("state=online")).count();
        if !info.contains("role:master") || online < replicas {
            return Err(info);
        }
        redis_probe::replicas_acknowledge(&mut conn, "ready", replicas as i64).await.map_err(|_| info)
    }

    /// Waits until the primary the Sentinels name has every other data node
    /// as an online replica that acknowledges a write (what a planned
    /// failover waits for, so that no replica still in its full sync is
    /// promoted), and returns its port. It follows the primary if the
    /// Sentinels fail over meanwhile: with `down-after` at 1 s, a loaded
    /// machine makes them do so now and then. Panics after 30 s.
    pub async fn until_replicas_synced(&self) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = match self.primary_port().await {
                Some(primary) => match self.replicas_synced(primary).await {
                    Ok(()) => return primary,
                    Err(info) => format!(":{primary} says\n{info}"),
                },
                None => "no Sentinel names a primary".to_owned(),
            };
            assert!(Instant::now() < deadline, "the replicas did not sync within 30 s: {seen}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A planned failover (`SENTINEL FAILOVER mymaster`), asked of the first
    /// Sentinel that takes it.
    pub async fn sentinel_failover(&self) {
        for sentinel in &self.sentinels {
            let Some(mut conn) = sentinel.conn().await else { continue };
            let asked: redis::RedisResult<()> =
                redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME).query_async(&mut conn).await;
            if asked.is_ok() {
                return;
            }
        }
        panic!("no Sentinel took SENTINEL FAILOVER");
    }

    /// A planned failover from the primary on `old`, made as Redis'
    /// `FAILOVER` command and managed services make one: writes paused on
    /// it (`CLIENT PAUSE WRITE`) until every replica has all it wrote, then
    /// `SENTINEL FAILOVER`, then `old` made a replica of the new primary
    /// and unpaused. Nothing written on `old` is lost, and nobody reads from
    /// it what the new primary lacks (`SENTINEL FAILOVER` alone leaves `old`
    /// a writable primary until Sentinel turns it, 8 s later). Returns the
    /// new primary's port.
    pub async fn planned_failover(&self, old: u16) -> u16 {
        let mut conn = self.node(old).conn().await;
        let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(10_000).arg("WRITE").query_async(&mut conn).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap();
            let primary_offset = info.lines().find_map(|line| line.strip_prefix("master_repl_offset:"));
            // `slave0:ip=127.0.0.1,port=6380,state=online,offset=123,lag=0`
            let caught_up = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains("state=online"))
                .filter(|line| line.split(',').find_map(|part| part.strip_prefix("offset=")) == primary_offset)
                .count();
            if caught_up >= self.nodes.len() - 1 {
                break;
            }
            if info.contains("role:slave") {
                // The Sentinels failed over by themselves meanwhile.
                let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query_async(&mut conn).await.unwrap();
                return self.until_failed_over(old, Duration::from_secs(30)).await;
            }
            assert!(Instant::now() < deadline, "the replicas of :{old} did not catch up while paused:\n{info}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.sentinel_failover().await;
        let new = self.until_failed_over(old, Duration::from_secs(30)).await;
        self.replicate(old, new).await;
        let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query_async(&mut conn).await.unwrap();
        new
    }

    /// Makes the data node on `port` a replica of the one on `primary`
    /// (`REPLICAOF`), as an operator does with a node it brings back.
    pub async fn replicate(&self, port: u16, primary: u16) {
        let mut conn = self.node(port).conn().await;
        let _: () = redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary).query_async(&mut conn).await.unwrap();
    }

    /// SIGSTOPs (`stop`) or SIGCONTs the data node on `port`.
    pub fn signal(&self, port: u16, stop: bool) {
        let pid = self.node(port).pid().expect("a running node");
        let status = Command::new("kill").arg(if stop { "-STOP" } else { "-CONT" }).arg(pid.to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -STOP/-CONT {pid}");
    }
}

/// The URL of the primary that the Sentinels of `sentinel_url` (this
/// fixture's `redis+sentinel://h:p,…/mymaster`) name now, confirmed with
/// `ROLE`: the first Sentinel that names one that says `master`. `None`
/// while none does (a failover under way).
pub async fn primary_url(sentinel_url: &str) -> Option<String> {
    let rest = sentinel_url.strip_prefix("redis+sentinel://")?;
    let (hosts, master) = rest.split_once('/')?;
    for host in hosts.split(',') {
        let Ok(client) = redis::Client::open(format!("redis://{host}")) else { continue };
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)));
        let Ok(mut conn) = client.get_multiplexed_async_connection_with_config(&config).await else { continue };
        let named: redis::RedisResult<Option<(String, u16)>> =
            redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(master).query_async(&mut conn).await;
        let Ok(Some((ip, port))) = named else { continue };
        let url = format!("redis://{ip}:{port}");
        let Ok(node) = redis::Client::open(url.as_str()) else { continue };
        let Ok(mut node) = node.get_multiplexed_async_connection_with_config(&config).await else { continue };
        let reply: Option<redis::Value> = redis::cmd("ROLE").query_async(&mut node).await.ok();
        if let Some(redis::Value::Array(items)) = reply {
            if matches!(items.first(), Some(redis::Value::BulkString(role)) if role == b"master") {
                return Some(url);
            }
        }
    }
    None
}

/// `ROLE`'s first element on `node` (`master`, `slave`), `None` when it does not answer.
pub async fn role(node: &RedisServer) -> Option<String> {
    let client = redis::Client::open(node.url()).ok()?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_millis(500)));
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.ok()?;
    let reply: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await.ok()?;
    match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(role)) => String::from_utf8(role.clone()).ok(),
            _ => None,
        },
        _ => None,
    }
}

impl SentinelProcess {
    async fn start(primary_port: u16, password: Option<&str>) -> SentinelProcess {
        let dir = TempDir::new("sentinel");
        let log = dir.path().join("sentinel.log");
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\nsentinel failover-timeout {MASTER_NAME} 5000\n{}",
                dir.path().display(),
                password.map_or_else(String::new, |p| format!("requirepass {p}\nsentinel sentinel-pass {p}\n"))
            ),
        )
        .expect("sentinel.conf");
        let out = fs::OpenOptions::new().create(true).append(true).open(&log).expect("sentinel log");
        let err = out.try_clone().expect("sentinel log");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn redis-server --sentinel");
        let mut sentinel =
            SentinelProcess { port, password: password.map(str::to_owned), child: Some(child), log, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if sentinel.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
                break;
            }
            if tcp_accepts(port).await && sentinel.master_port().await.is_some() {
                return sentinel;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("a Sentinel did not start on :{port}; its log:\n{}", read_log(&sentinel.log));
    }

    async fn conn(&self) -> Option<redis::aio::MultiplexedConnection> {
        let auth = self.password.as_deref().map_or_else(String::new, |p| format!(":{p}@"));
        let client = redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port)).ok()?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(500)));
        client.get_multiplexed_async_connection_with_config(&config).await.ok()
    }

    async fn master_port(&self) -> Option<u16> {
        let mut conn = self.conn().await?;
        let reply: Option<(String, u16)> =
            redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(MASTER_NAME).query_async(&mut conn).await.ok()?;
        reply.map(|(_, port)| port)
    }

    /// How many other Sentinels and replicas this Sentinel knows.
    async fn peers(&self) -> (usize, usize) {
        let Some(mut conn) = self.conn().await else { return (0, 0) };
        let count = |reply: redis::RedisResult<redis::Value>| match reply {
            Ok(redis::Value::Array(items)) => items.len(),
            _ => 0,
        };
        let sentinels = count(redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER_NAME).query_async(&mut conn).await);
        let replicas = count(redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME).query_async(&mut conn).await);
        (sentinels, replicas)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
        if print_logs_requested() || std::thread::panicking() {
            eprintln!("----- sentinel :{} log (tail) -----\n{}", self.port, tail(&read_log(&self.log), 30));
        }
    }
}
