//! Who may call, and which streams they may touch.
//!
//! - Authentication: with `--auth-token-file`, every call to the EchoMQ
//!   services carries `authorization: Bearer <token>` or gets UNAUTHENTICATED.
//!   Health and reflection stay open: probes and `grpcurl list` need them and
//!   they reveal nothing but the schema.
//! - Identity: with mTLS (`--tls-client-ca-file`), the client certificate's
//!   first URI SAN (a SPIFFE id, say), else its first DNS SAN.
//! - Authorization: an allow-list of stream patterns (`*` matches any run of
//!   characters), for everyone (`--allow-streams`) and per identity
//!   (`--allow-streams-for IDENTITY=PATTERNS`). A stream outside it gets
//!   PERMISSION_DENIED.

use std::{collections::HashMap, sync::Arc};

use tonic::{metadata::MetadataMap, Request, Status};

use crate::error::Error;

/// The caller, as established by [`Gate::admit`], carried in the request's extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The mTLS identity, when the client presented a certificate.
    pub identity: Option<String>,
}

/// Authentication and authorization for the EchoMQ services. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Gate {
    token: Option<Arc<str>>,
    everyone: Vec<String>,
    by_identity: Arc<HashMap<String, Vec<String>>>,
}

impl Gate {
    /// A gate requiring `token` (when set), allowing `everyone` patterns to all
    /// callers and `by_identity` patterns to the named identities. An empty
    /// `everyone` with no per-identity rules allows every stream.
    pub fn new(token: Option<String>, everyone: Vec<String>, by_identity: HashMap<String, Vec<String>>) -> Gate {
        Gate { token: token.map(Arc::from), everyone, by_identity: Arc::new(by_identity) }
    }

    /// The same allow-list, asking for no bearer token: for the KEDA scaler's
    /// own port, since KEDA's scaler client cannot send one.
    pub fn without_token(&self) -> Gate {
        Gate { token: None, ..self.clone() }
    }

    /// Checks the bearer token and records the caller's identity in the
    /// request's extensions. Used as a tonic interceptor.
    ///
    /// Errors: UNAUTHENTICATED for a missing or wrong token.
    #[allow(clippy::result_large_err)]
    pub fn admit(&self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.token {
            if !bearer_matches(request.metadata(), token) {
                return Err(Status::unauthenticated(
                    "missing or wrong bearer token: send `authorization: Bearer <token>` (the sidecar's --auth-token-file)",
                ));
            }
        }
        // tonic's `peer_certs` looks at TCP connections only; a unix socket's
        // TLS info sits under its own type.
        let certs = request.peer_certs().or_else(|| {
            request
                .extensions()
                .get::<tonic::transport::server::TlsConnectInfo<tonic::transport::server::UdsConnectInfo>>()
                .and_then(|info| info.peer_certs())
        });
        let identity = certs.and_then(|certs| certs.first().and_then(identity_of));
        request.extensions_mut().insert(Caller { identity });
        Ok(request)
    }

    /// Whether `caller` may touch `stream`.
    ///
    /// Errors: [`Error::PermissionDenied`] naming the stream and the identity.
    pub fn authorize(&self, caller: Option<&Caller>, stream: &str) -> Result<(), Error> {
        if self.everyone.is_empty() && self.by_identity.is_empty() {
            return Ok(());
        }
        let identity = caller.and_then(|c| c.identity.as_deref());
        let personal = identity.and_then(|id| self.by_identity.get(id)).into_iter().flatten();
        if self.everyone.iter().chain(personal).any(|pattern| glob_matches(pattern, stream)) {
            return Ok(());
        }
        Err(Error::PermissionDenied { stream: stream.to_owned(), identity: identity.map(str::to_owned) })
    }
}

/// The limits and access checks every RPC applies to the names it is given.
#[derive(Clone, Debug)]
pub struct Guard {
    gate: Gate,
    /// Longest stream or group name (bytes).
    pub max_name_bytes: usize,
    /// Most fields in one appended entry.
    pub max_fields_per_entry: usize,
    /// The largest gRPC message (bytes): pages of entries stay below it.
    pub max_message_bytes: usize,
}

impl Guard {
    /// A guard with `gate` and the given limits (bytes, fields, bytes).
    pub fn new(gate: Gate, max_name_bytes: usize, max_fields_per_entry: usize, max_message_bytes: usize) -> Guard {
        Guard { gate, max_name_bytes, max_fields_per_entry, max_message_bytes }
    }

    /// The gate (authentication and the allow-list).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// A stream or group name within limits, for request field `field`.
    ///
    /// Errors: [`Error::InvalidArgument`] when empty or over `max_name_bytes`.
    pub fn name<'a>(&self, field: &'static str, name: &'a str) -> Result<&'a str, Error> {
        if name.is_empty() {
            return Err(Error::invalid(field, "required, must not be empty"));
        }
        if name.len() > self.max_name_bytes {
            return Err(Error::invalid(
                field,
                format!("{} bytes is longer than this sidecar's limit of {}", name.len(), self.max_name_bytes),
            ));
        }
        Ok(name)
    }

    /// A stream name within limits that `caller` may use.
    ///
    /// Errors: as [`Guard::name`], and [`Error::PermissionDenied`].
    pub fn stream<'a>(&self, caller: Option<&Caller>, field: &'static str, name: &'a str) -> Result<&'a str, Error> {
        let name = self.name(field, name)?;
        self.gate.authorize(caller, name)?;
        Ok(name)
    }
}

impl Default for Guard {
    fn default() -> Guard {
        use crate::config::{DEFAULT_MAX_FIELDS_PER_ENTRY, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_NAME_BYTES};
        Guard::new(Gate::default(), DEFAULT_MAX_NAME_BYTES, DEFAULT_MAX_FIELDS_PER_ENTRY, DEFAULT_MAX_MESSAGE_BYTES)
    }
}

/// Constant-time comparison, so the token cannot be guessed byte by byte from
/// response times.
fn bearer_matches(metadata: &MetadataMap, token: &str) -> bool {
    let Some(presented) = metadata.get("authorization").and_then(|v| v.to_str().ok()) else { return false };
    // The scheme name is case-insensitive (RFC 9110 §11.1).
    let Some((scheme, presented)) = presented.split_once(' ') else { return false };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    let presented = presented.trim_start();
    let (a, b) = (presented.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

fn identity_of(der: &tonic::transport::CertificateDer<'static>) -> Option<String> {
    let cert = webpki::EndEntityCert::try_from(der).ok()?;
    let uri = cert.valid_uri_names().next().map(str::to_owned);
    uri.or_else(|| cert.valid_dns_names().next().map(str::to_owned))
}

/// `*` matches any run of characters (including none); everything else matches itself.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((star_pi, star_ti)) = star {
            pi = star_pi + 1;
            ti = star_ti + 1;
            star = Some((star_pi, star_ti + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("*", ""));
        assert!(glob_matches("orders:*", "orders:eu"));
        assert!(glob_matches("orders:*", "orders:"));
        assert!(!glob_matches("orders:*", "payments:eu"));
        assert!(glob_matches("*:dlq", "orders:dlq"));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxbyy"));
        assert!(glob_matches("exact", "exact"));
        assert!(!glob_matches("exact", "exactly"));
    }

    #[test]
    fn allow_list_for_everyone_and_per_identity() {
        let by_identity = HashMap::from([("billing".to_owned(), vec!["invoices:*".to_owned()])]);
        let gate = Gate::new(None, vec!["public:*".to_owned()], by_identity);
        let billing = Caller { identity: Some("billing".into()) };
        assert!(gate.authorize(None, "public:x").is_ok());
        assert!(gate.authorize(None, "invoices:x").is_err());
        assert!(gate.authorize(Some(&billing), "invoices:x").is_ok());
        assert!(gate.authorize(Some(&billing), "public:x").is_ok());
        assert!(Gate::default().authorize(None, "anything").is_ok());
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let gate = Gate::new(Some("s3cret".into()), Vec::new(), HashMap::new());
        let with = |value: &str| {
            let mut request = Request::new(());
            request.metadata_mut().insert("authorization", value.parse().unwrap());
            request
        };
        assert!(gate.admit(with("Bearer s3cret")).is_ok());
        assert!(gate.admit(with("Bearer s3cre")).is_err());
        assert!(gate.admit(with("bearer s3cret")).is_ok(), "the scheme is case-insensitive");
        assert!(gate.admit(with("Basic s3cret")).is_err());
        assert!(gate.admit(with("s3cret")).is_err());
        assert!(gate.admit(Request::new(())).is_err());
    }
}
