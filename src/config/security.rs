//! Who may call the gRPC API, and over what: TLS, mTLS, a bearer token, and
//! the streams each caller may use.

use std::path::PathBuf;

use clap::Args;

/// TLS and access control of the gRPC API.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "TLS and access")]
pub struct SecurityConfig {
    /// Serve gRPC over TLS with this PEM certificate chain (with --tls-key-file).
    #[arg(long, env = "ECHOMQ_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// The PEM private key of --tls-cert-file.
    #[arg(long, env = "ECHOMQ_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Require client certificates signed by this PEM CA (mTLS). A client's
    /// identity, for --allow-streams-for, is its certificate's first URI SAN,
    /// else its first DNS SAN.
    #[arg(long, env = "ECHOMQ_TLS_CLIENT_CA_FILE", requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<PathBuf>,

    /// Require `authorization: Bearer <token>` on the EchoMQ services, the
    /// token read from this file (surrounding whitespace ignored). Health and
    /// reflection stay open.
    #[arg(long, env = "ECHOMQ_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// Stream patterns every caller may use, comma-separated; `*` matches any
    /// run of characters (e.g. `orders:*,payments`). Unset, with no
    /// --allow-streams-for: every stream.
    #[arg(long, env = "ECHOMQ_ALLOW_STREAMS", value_delimiter = ',', value_parser = parse_pattern)]
    pub allow_streams: Vec<String>,

    /// Stream patterns one mTLS identity may use besides --allow-streams:
    /// `IDENTITY=PATTERN,PATTERN`. Repeat the flag for more identities; in the
    /// variable, separate rules with `;`.
    #[arg(long, env = "ECHOMQ_ALLOW_STREAMS_FOR", value_delimiter = ';', value_parser = parse_allow_rule)]
    pub allow_streams_for: Vec<(String, Vec<String>)>,
}

impl SecurityConfig {
    /// Checks that per-identity grants have identities to match.
    pub(super) fn validate(&self) -> Result<(), String> {
        if !self.allow_streams_for.is_empty() && self.tls_client_ca_file.is_none() {
            return Err("--allow-streams-for grants streams to mTLS identities, so it needs --tls-client-ca-file \
                        (without client certificates no caller has an identity)"
                .to_owned());
        }
        Ok(())
    }
}

fn parse_allow_rule(text: &str) -> Result<(String, Vec<String>), String> {
    let (identity, patterns) =
        text.split_once('=').ok_or_else(|| format!("`{text}` is not IDENTITY=PATTERN,PATTERN"))?;
    let patterns: Vec<String> =
        patterns.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect();
    if identity.trim().is_empty() || patterns.is_empty() {
        return Err(format!("`{text}` needs an identity and at least one pattern: IDENTITY=PATTERN,PATTERN"));
    }
    Ok((identity.trim().to_owned(), patterns))
}

/// One allow-list pattern, trimmed; an empty one would match no stream.
fn parse_pattern(text: &str) -> Result<String, String> {
    match text.trim() {
        "" => Err("an empty stream pattern matches no stream; list patterns like `orders:*,payments`".to_owned()),
        pattern => Ok(pattern.to_owned()),
    }
}
