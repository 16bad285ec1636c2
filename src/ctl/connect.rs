//! Reaching the sidecar: the endpoint (TCP, TLS, unix socket), the bearer
//! token on every call, and a timeout per call. A connection is made once,
//! before the command's first call, so an unreachable sidecar is reported as
//! such ([`crate::exit::UNREACHABLE`]) and not as the first call's failure.

use std::path::PathBuf;
use std::time::Duration;

use echomq::proto::{
    admin_service_client::AdminServiceClient, consumer_service_client::ConsumerServiceClient,
    stream_service_client::StreamServiceClient,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::cli::Connection;
use crate::exit::Failure;

/// Where the sidecar is, parsed from `--endpoint`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `http://` or `https://` and an authority; `tls` says which.
    Tcp {
        /// The URI tonic connects to.
        uri: String,
        /// The host, for the certificate's name.
        host: String,
        /// Whether the scheme is `https`.
        tls: bool,
    },
    /// `unix:/path`.
    Unix(PathBuf),
}

impl Target {
    /// Parses `http://host:port`, `https://host:port`, `host:port` (plain) or `unix:/path`.
    pub(crate) fn parse(text: &str) -> Result<Target, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("a unix socket endpoint needs a path: `unix:/path/to/socket`".into());
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let (tls, rest) = if let Some(rest) = text.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, rest)
        } else if text.contains("://") {
            return Err(format!("`{text}`: the endpoint's scheme is http://, https:// or unix:"));
        } else {
            (false, text)
        };
        let authority = rest.trim_end_matches('/');
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => host,
            _ => {
                return Err(format!(
                    "`{text}` is not an endpoint: expected http://host:port, https://host:port or unix:/path"
                ))
            }
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let scheme = if tls { "https" } else { "http" };
        Ok(Target::Tcp { uri: format!("{scheme}://{authority}"), host, tls })
    }
}

/// Adds the bearer token to every call.
#[derive(Clone, Debug)]
pub(crate) struct Auth(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The channel every client shares, with the token added to each call.
type Svc = InterceptedService<Channel, Auth>;

/// What every command gets: the channel, the token, the output mode, the timeout.
pub(crate) struct Context {
    channel: Channel,
    auth: Auth,
    /// `--json`: JSON for scripts instead of tables.
    pub(crate) json: bool,
    /// `--timeout-ms`.
    pub(crate) timeout: Duration,
}

impl Context {
    /// Reads the token and TLS files, and connects.
    ///
    /// Errors: [`Failure::Usage`] for a bad endpoint, an unreadable file, or TLS
    /// options with an `http://` endpoint; [`Failure::Unreachable`] when the
    /// connection cannot be made within the timeout.
    pub(crate) async fn open(connection: &Connection, json: bool) -> Result<Context, Failure> {
        let target = Target::parse(&connection.endpoint).map_err(|e| Failure::Usage(format!("--endpoint {e}")))?;
        let auth = Auth(match &connection.auth_token_file {
            Some(path) => Some(bearer(path)?),
            None => None,
        });
        let tls = tls_config(connection, &target)?;
        let timeout = Duration::from_millis(connection.timeout_ms);
        let endpoint = match &target {
            Target::Tcp { uri, .. } => Endpoint::from_shared(uri.clone()),
            // The sidecar's HTTP/2 server wants an authority; the socket path is the address.
            Target::Unix(_) => {
                Endpoint::from_shared(if tls.is_some() { "https://localhost" } else { "http://localhost" }.to_owned())
            }
        }
        .map_err(|e| Failure::Usage(format!("--endpoint {}: {e}", connection.endpoint)))?
        .connect_timeout(timeout);
        let endpoint = match tls {
            Some(tls) => endpoint.tls_config(tls).map_err(|e| Failure::Usage(format!("TLS settings: {e}")))?,
            None => endpoint,
        };
        let connecting = async {
            match &target {
                Target::Tcp { .. } => endpoint.connect().await,
                Target::Unix(path) => {
                    let path = path.clone();
                    endpoint
                        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                            let path = path.clone();
                            async move {
                                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                    tokio::net::UnixStream::connect(path).await?,
                                ))
                            }
                        }))
                        .await
                }
            }
        };
        let channel = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => return Err(Failure::Unreachable(format!("{}: {}", connection.endpoint, error_chain(&e)))),
            Err(_) => {
                return Err(Failure::Unreachable(format!(
                    "{}: no connection within --timeout-ms {}",
                    connection.endpoint, connection.timeout_ms
                )))
            }
        };
        Ok(Context { channel, auth, json, timeout })
    }

    /// The StreamService.
    pub(crate) fn stream(&self) -> StreamServiceClient<Svc> {
        StreamServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// The AdminService.
    pub(crate) fn admin(&self) -> AdminServiceClient<Svc> {
        AdminServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// The ConsumerService.
    pub(crate) fn consumer(&self) -> ConsumerServiceClient<Svc> {
        ConsumerServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// `message` as a request bounded by `--timeout-ms`.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
    }
}

/// `Bearer <token>` from the token file.
fn bearer(path: &PathBuf) -> Result<MetadataValue<Ascii>, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::Usage(format!("--auth-token-file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(Failure::Usage(format!("--auth-token-file {}: the file is empty", path.display())));
    }
    format!("Bearer {token}")
        .parse()
        .map_err(|_| Failure::Usage(format!("--auth-token-file {}: the token is not printable ASCII", path.display())))
}

/// The TLS settings, or `None` for plaintext.
fn tls_config(connection: &Connection, target: &Target) -> Result<Option<ClientTlsConfig>, Failure> {
    let any_option = connection.tls_ca_file.is_some()
        || connection.tls_cert_file.is_some()
        || connection.tls_key_file.is_some()
        || connection.tls_server_name.is_some();
    let (on, default_name) = match target {
        Target::Tcp { tls: true, host, .. } => (true, host.clone()),
        Target::Tcp { tls: false, .. } if any_option => {
            return Err(Failure::Usage(format!(
                "--endpoint {}: TLS options need an https:// endpoint",
                connection.endpoint
            )))
        }
        Target::Tcp { .. } => (false, String::new()),
        Target::Unix(_) => (any_option, "localhost".to_owned()),
    };
    if !on {
        return Ok(None);
    }
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|e| Failure::Usage(format!("{flag} {}: {e}", path.display())))
    };
    let mut tls = ClientTlsConfig::new().domain_name(connection.tls_server_name.clone().unwrap_or(default_name));
    tls = match &connection.tls_ca_file {
        Some(path) => tls.ca_certificate(Certificate::from_pem(read("--tls-ca-file", path)?)),
        None => tls.with_enabled_roots(),
    };
    match (&connection.tls_cert_file, &connection.tls_key_file) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read("--tls-cert-file", cert)?, read("--tls-key-file", key)?));
        }
        (None, None) => {}
        _ => return Err(Failure::Usage("--tls-cert-file and --tls-key-file go together".into())),
    }
    Ok(Some(tls))
}

/// An error and its causes, on one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            Target::parse("http://127.0.0.1:50051").unwrap(),
            Target::Tcp { uri: "http://127.0.0.1:50051".into(), host: "127.0.0.1".into(), tls: false }
        );
        assert_eq!(
            Target::parse("localhost:7").unwrap(),
            Target::Tcp { uri: "http://localhost:7".into(), host: "localhost".into(), tls: false }
        );
        assert!(
            matches!(Target::parse("https://[::1]:7").unwrap(), Target::Tcp { tls: true, host, .. } if host == "::1")
        );
        assert_eq!(Target::parse("unix:/run/s.sock").unwrap(), Target::Unix("/run/s.sock".into()));
        for bad in ["unix:", "ftp://x:1", "nohost", "http://x:99999", ":5"] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
    }
}
