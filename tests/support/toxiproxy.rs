//! Shopify's toxiproxy as a fixture: a real TCP proxy between two of the
//! tests' processes (sidecar → Redis, client → sidecar) whose faults
//! ("toxics") a test turns on and off through its HTTP API.
//!
//! The server binary is `toxiproxy-server`, pinned and built by
//! `scripts/install-deps` into the tools cache and linked into `.tmp/bin`,
//! which `scripts/test` puts on PATH; `ECHOMQ_TOXIPROXY` names another binary.
//! A test that needs it and cannot find it fails (it never skips), with a
//! message that says how to get it.
//!
//! The API is plain JSON over HTTP/1.0 ([`http_request`]) on a free loopback
//! port; each proxy listens on a free loopback port of its own. Toxics apply to
//! the connections already open through a proxy and to new ones alike. What
//! each kind does, as toxiproxy 2.12 implements it:
//!
//! | toxic | effect |
//! | --- | --- |
//! | [`Toxic::Latency`] | each chunk is held for the latency (± jitter), in order; nothing is dropped |
//! | [`Toxic::ResetPeer`] | the connection is reset (RST) at the first data after the timeout |
//! | [`Toxic::BlackHole`] | the `timeout` toxic with timeout 0: data vanishes, nothing closes; removing it closes the connections it held |
//! | [`Toxic::Bandwidth`] | at most so many KB/s |

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::http::{http_request, http_request_within, HttpResponse};
use super::process::{free_port, kill_child, print_logs_requested, read_log, tail, TempDir, START_TIMEOUT};

/// The binary's name on PATH (what `scripts/install-deps` links into `.tmp/bin`).
pub const TOXIPROXY_BIN: &str = "toxiproxy-server";

/// The `toxiproxy-server` to run: `ECHOMQ_TOXIPROXY`, else the first on PATH.
/// Panics, saying how to get it, when there is none: a test of network faults
/// that cannot inject them must not pass.
pub fn toxiproxy_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("ECHOMQ_TOXIPROXY") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|dir| dir.join(TOXIPROXY_BIN)).find(|p| p.is_file()));
    on_path.unwrap_or_else(|| {
        panic!(
            "{TOXIPROXY_BIN} is not on PATH and ECHOMQ_TOXIPROXY is unset: run scripts/install-deps (it builds the \
             pinned toxiproxy into the tools cache and links it into .tmp/bin), then \
             `export PATH=\"$PWD/.tmp/bin:$PATH\"` (scripts/test does)"
        )
    })
}

/// A fault toxiproxy injects on one direction of a proxy's connections.
#[derive(Clone, Copy, Debug)]
pub enum Toxic {
    /// Every chunk waits `ms` milliseconds, give or take `jitter_ms`.
    Latency { ms: u64, jitter_ms: u64 },
    /// Connections are reset at their first data after `after_ms` milliseconds.
    ResetPeer { after_ms: u64 },
    /// Data vanishes and nothing closes (toxiproxy's `timeout` toxic with timeout 0).
    BlackHole,
    /// At most `kb_per_s` kilobytes per second.
    Bandwidth { kb_per_s: u64 },
}

impl Toxic {
    /// toxiproxy's type name and attributes (JSON).
    fn kind_and_attributes(self) -> (&'static str, String) {
        match self {
            Toxic::Latency { ms, jitter_ms } => ("latency", format!(r#"{{"latency":{ms},"jitter":{jitter_ms}}}"#)),
            Toxic::ResetPeer { after_ms } => ("reset_peer", format!(r#"{{"timeout":{after_ms}}}"#)),
            Toxic::BlackHole => ("timeout", r#"{"timeout":0}"#.to_owned()),
            Toxic::Bandwidth { kb_per_s } => ("bandwidth", format!(r#"{{"rate":{kb_per_s}}}"#)),
        }
    }
}

/// Which way a toxic acts: toward the upstream (requests) or back from it (replies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Upstream,
    Downstream,
}

impl Direction {
    fn name(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// A running `toxiproxy-server` on a free loopback port. Killed on drop.
pub struct Toxiproxy {
    child: Option<Child>,
    api_port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl Toxiproxy {
    /// Starts the server and waits until its API answers `GET /version`.
    /// Panics when the binary is missing ([`toxiproxy_bin`]) or the API does
    /// not come up within [`START_TIMEOUT`].
    pub async fn start() -> Toxiproxy {
        let bin = toxiproxy_bin();
        let dir = TempDir::new("toxiproxy");
        let log = dir.path().join("toxiproxy.log");
        let api_port = free_port();
        let out = std::fs::File::create(&log).expect("toxiproxy log");
        let err = out.try_clone().expect("toxiproxy log");
        let child = Command::new(&bin)
            .args(["-host", "127.0.0.1", "-port", &api_port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let mut proxy = Toxiproxy { child: Some(child), api_port, log, _dir: dir };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if http_request(api_port, "GET", "/version", None).await.is_some_and(|r| r.status == 200) {
                return proxy;
            }
            let exited = proxy.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "{} did not serve its API on :{api_port} ({exited:?}); its log:\n{}",
                bin.display(),
                read_log(&proxy.log)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A proxy named `name` on a free loopback port, forwarding to
    /// `127.0.0.1:<upstream_port>`. Panics if toxiproxy refuses it.
    pub async fn proxy(&self, name: &str, upstream_port: u16) -> Proxy {
        let listen_port = free_port();
        let body = format!(
            r#"{{"name":"{name}","listen":"127.0.0.1:{listen_port}","upstream":"127.0.0.1:{upstream_port}","enabled":true}}"#
        );
        self.call("POST", "/proxies", Some(&body), 201).await;
        Proxy { api_port: self.api_port, name: name.to_owned(), listen_port }
    }

    async fn call(&self, method: &str, path: &str, body: Option<&str>, want: u16) -> HttpResponse {
        call(self.api_port, method, path, body, want).await
    }
}

/// How long one API call may take. Removing a toxic flushes the chunks it
/// holds, waiting up to 5 s for each one whose connection's writer is busy
/// (closing after its client left), so a removal can take several of those.
const API_TIMEOUT: Duration = Duration::from_secs(30);

/// One API call; panics unless toxiproxy answers with status `want`.
async fn call(api_port: u16, method: &str, path: &str, body: Option<&str>, want: u16) -> HttpResponse {
    let response = http_request_within(API_TIMEOUT, api_port, method, path, body)
        .await
        .unwrap_or_else(|| panic!("toxiproxy :{api_port} did not answer {method} {path} within {API_TIMEOUT:?}"));
    assert_eq!(response.status, want, "toxiproxy: {method} {path} {body:?} answered {response:?}");
    response
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
        if print_logs_requested() {
            eprintln!("----- toxiproxy :{} log (tail) -----\n{}", self.api_port, tail(&read_log(&self.log), 40));
        }
    }
}

/// One proxy of a [`Toxiproxy`]: where to connect, and its toxics.
#[derive(Clone, Debug)]
pub struct Proxy {
    api_port: u16,
    name: String,
    listen_port: u16,
}

impl Proxy {
    /// The loopback port the proxy listens on (connect here instead of upstream).
    pub fn port(&self) -> u16 {
        self.listen_port
    }

    /// `redis://127.0.0.1:<port>`, for a sidecar that reaches Redis through it.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.listen_port)
    }

    /// `http://127.0.0.1:<port>`, for a gRPC client that reaches a sidecar through it.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.listen_port)
    }

    /// Turns `toxic` on for `direction`, named `<name>`; on the connections
    /// open now and on new ones. Panics if toxiproxy refuses it.
    pub async fn add(&self, name: &str, direction: Direction, toxic: Toxic) {
        let (kind, attributes) = toxic.kind_and_attributes();
        let body = format!(
            r#"{{"name":"{name}","type":"{kind}","stream":"{}","toxicity":1.0,"attributes":{attributes}}}"#,
            direction.name()
        );
        call(self.api_port, "POST", &format!("/proxies/{}/toxics", self.name), Some(&body), 200).await;
    }

    /// Turns toxic `name` off. Panics if there is none of that name.
    pub async fn remove(&self, name: &str) {
        call(self.api_port, "DELETE", &format!("/proxies/{}/toxics/{name}", self.name), None, 204).await;
    }

    /// Points the proxy at `127.0.0.1:<upstream_port>` from now on, as a
    /// managed service's endpoint moves to a new primary. Toxiproxy closes
    /// the connections open through it when its upstream changes.
    pub async fn set_upstream(&self, upstream_port: u16) {
        let body = format!(r#"{{"upstream":"127.0.0.1:{upstream_port}"}}"#);
        call(self.api_port, "POST", &format!("/proxies/{}", self.name), Some(&body), 200).await;
    }

    /// `toxic` on both directions (named `<name>-up` and `<name>-down`).
    pub async fn add_both(&self, name: &str, toxic: Toxic) {
        self.add(&format!("{name}-up"), Direction::Upstream, toxic).await;
        self.add(&format!("{name}-down"), Direction::Downstream, toxic).await;
    }

    /// Removes what [`Proxy::add_both`] added.
    pub async fn remove_both(&self, name: &str) {
        self.remove(&format!("{name}-up")).await;
        self.remove(&format!("{name}-down")).await;
    }
}
