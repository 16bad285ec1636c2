//! Redis Cluster: the local cluster fixture itself (`support::cluster`), before
//! the sidecar is tested against it.

// Tests fail loudly by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Instant;

use redis::cluster_async::ClusterConnection;
use support::cluster::{RedisCluster, Role};

async fn xadd(con: &mut ClusterConnection, key: &str, n: usize) {
    for i in 0..n {
        let _: String = redis::cmd("XADD").arg(key).arg("*").arg("n").arg(i).query_async(con).await.expect("XADD");
    }
}

async fn xlen(con: &mut ClusterConnection, key: &str) -> i64 {
    redis::cmd("XLEN").arg(key).query_async(con).await.unwrap_or_else(|e| panic!("XLEN {key}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fixture_serves_keys_on_every_primary_and_fails_over() {
    let t0 = Instant::now();
    let mut cluster = RedisCluster::start(3, 1).await;
    eprintln!("cluster of 3x1 up in {:?}: {}", t0.elapsed(), cluster.seed_urls());
    let topology = cluster.topology().await;
    assert_eq!(topology.primaries().len(), 3, "{topology:?}");
    assert_eq!(topology.roles.len(), 6, "{topology:?}");

    // A key on every primary, written and read back through one cluster connection.
    let keys = cluster.key_per_primary("orders").await;
    let mut owners = Vec::new();
    for key in &keys {
        owners.push(cluster.primary_of(key).await);
    }
    owners.sort_unstable();
    owners.dedup();
    assert_eq!(owners.len(), 3, "the keys {keys:?} must land on 3 different primaries");
    let mut con = cluster.conn().await;
    for key in &keys {
        xadd(&mut con, key, 3).await;
    }
    for key in &keys {
        assert_eq!(xlen(&mut con, key).await, 3, "{key}");
        let entries: redis::Value =
            redis::cmd("XRANGE").arg(key).arg("-").arg("+").query_async(&mut con).await.unwrap();
        assert!(matches!(&entries, redis::Value::Array(a) if a.len() == 3), "XRANGE {key}: {entries:?}");
    }

    // Graceful failover: the old primary becomes the new one's replica; the same
    // connection follows MOVED to the new primary, for reads and writes.
    let old = cluster.primary_of(&keys[0]).await;
    let t = Instant::now();
    let new = cluster.failover(&keys[0]).await;
    eprintln!("failover :{old} -> :{new} took {:?}", t.elapsed());
    assert_ne!(new, old);
    assert_eq!(cluster.primary_of(&keys[0]).await, new);
    assert_eq!(cluster.replicas_of(new).await, vec![old]);
    assert_eq!(cluster.topology().await.roles[&old], Role::Replica { of: new, link_up: true });
    let t = Instant::now();
    assert_eq!(xlen(&mut con, &keys[0]).await, 3, "{} after the failover", keys[0]);
    xadd(&mut con, &keys[0], 1).await;
    assert_eq!(xlen(&mut con, &keys[0]).await, 4);
    eprintln!("reads and a write after the failover took {:?}", t.elapsed());

    // A primary killed: its replica is promoted and the data is still there.
    let t = Instant::now();
    let killed = cluster.kill_primary(&keys[1]).await;
    eprintln!("kill of :{killed} healed in {:?}", t.elapsed());
    let promoted = cluster.primary_of(&keys[1]).await;
    assert_ne!(promoted, killed);
    assert!(!cluster.live_ports().contains(&killed));
    let t = Instant::now();
    assert_eq!(xlen(&mut con, &keys[1]).await, 3, "{} after its primary was killed (old connection)", keys[1]);
    eprintln!("the old connection read after the kill in {:?}", t.elapsed());
    let mut fresh = cluster.conn().await;
    for (key, len) in keys.iter().zip([4, 3, 3]) {
        assert_eq!(xlen(&mut fresh, key).await, len, "{key} through a new connection");
    }

    // The killed node comes back as a replica of the promoted one (its nodes.conf).
    let t = Instant::now();
    cluster.restart(killed).await;
    eprintln!("restart of :{killed} rejoined in {:?}", t.elapsed());
    assert_eq!(cluster.topology().await.roles[&killed], Role::Replica { of: promoted, link_up: true });
    assert_eq!(xlen(&mut con, &keys[1]).await, 3);
    eprintln!("whole test: {:?}", t0.elapsed());
}
