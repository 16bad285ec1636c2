//! HTTP/1.0 over plain TCP, for the sidecar's admin port (`/livez`, `/readyz`,
//! `/metrics`) and toxiproxy's API: no HTTP client crate, so a test sees
//! exactly what the port sends.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The status code of `GET <path>` on a loopback port, with a plain HTTP/1.0
/// request over TCP. `None` when nothing answers (refused, reset, timeout).
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 512];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.split_whitespace().nth(1)?.parse::<u16>().ok()
    };
    tokio::time::timeout(Duration::from_secs(5), probe).await.ok().flatten()
}

/// An HTTP response read to its end: status, header block and body.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    /// The header lines, as sent (without the status line).
    pub headers: String,
    pub body: String,
}

impl HttpResponse {
    /// The value of header `name` (case-insensitive), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// `GET <path>` on a loopback port with a plain HTTP/1.0 request over TCP, read
/// until the server closes the connection. `None` when nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<HttpResponse> {
    http_request(port, "GET", path, None).await
}

/// `<method> <path>` on a loopback port with a plain HTTP/1.0 request over TCP
/// (a JSON `body` with its `Content-Length` when given), read until the
/// server closes the connection, which HTTP/1.0 has it do after one response.
/// `None` when nothing answers within 5 s. For the admin port.
pub async fn http_request(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<HttpResponse> {
    http_request_within(Duration::from_secs(5), port, method, path, body).await
}

/// [`http_request`], waiting up to `timeout` for the answer: for toxiproxy's
/// API (`support::toxiproxy`), whose toxic removal may wait 5 s per held chunk.
pub async fn http_request_within(
    timeout: Duration,
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<HttpResponse> {
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let mut request = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
        if let Some(body) = body {
            request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        request.push_str("\r\n");
        request.push_str(body.unwrap_or(""));
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        let status = status_line.split_whitespace().nth(1)?.parse::<u16>().ok()?;
        Some(HttpResponse { status, headers: headers.replace("\r\n", "\n"), body: body.to_owned() })
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}
