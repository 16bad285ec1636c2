//! What every fixture process stands on: free loopback ports, unique names,
//! temp directories removed on drop, child processes killed and reaped, logs
//! read back, and the waits they are given.
//!
//! A plain file with no dependency beyond std and tokio: the benches take it
//! in too (`benches/common/mod.rs`), beside [`super::redis_server`].

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a fixture waits for a process to come up. Generous: CI is slow.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The default wait for an event the test expects to arrive.
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique within this test binary, for streams, groups and consumers.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Ports handed out by [`free_port`] in this process, so two fixtures never get
/// the same one even when the kernel offers it twice.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago: bind port 0, note the port, release it.
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind 127.0.0.1:0").port();
        let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if guard.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let path = std::env::temp_dir().join(format!("echomq-test-{}-{nanos}", unique(prefix)));
        fs::create_dir_all(&path).expect("create temp dir");
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Whether a fixture prints its process' log when dropped: when the test
/// panics, or always with `ECHOMQ_TEST_LOGS` set.
pub fn print_logs_requested() -> bool {
    std::thread::panicking() || std::env::var_os("ECHOMQ_TEST_LOGS").is_some()
}

/// A log file's text (lossy UTF-8); empty when it cannot be read.
pub fn read_log(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        let mut bytes = Vec::new();
        let _ = f.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Sends SIGKILL to a child and reaps it.
pub fn kill_child(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let _ = child.kill();
    child.wait().ok()
}

/// Polls `try_wait` until the child exits or `timeout` passes.
pub async fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Whether a TCP connect to the loopback `port` succeeds within 2 s.
pub async fn tcp_accepts(port: u16) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(("127.0.0.1", port))).await,
        Ok(Ok(_))
    )
}

/// Retries `check` every 50 ms until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
