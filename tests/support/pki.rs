//! Certificates for the TLS and mTLS tests: a throw-away CA made with the
//! `openssl` CLI, and the server and client certificates it issues.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use super::process::TempDir;

/// A certificate and its private key, PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// A tonic identity (for a client certificate).
    pub fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(
            fs::read(&self.cert).expect("read certificate"),
            fs::read(&self.key).expect("read key"),
        )
    }
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A throw-away certificate authority made with the `openssl` CLI in a temp dir:
/// EC P-256 keys, X.509 v3, valid for two days. Issues server and client
/// certificates with the SANs a test asks for.
pub struct TestPki {
    name: String,
    ca: CertFiles,
    dir: TempDir,
}

/// The `openssl req` options for a new EC P-256 key, not encrypted.
const NEW_EC_KEY: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

fn openssl(args: &[&str], dir: &Path) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {} failed: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPki {
    /// A new CA named `name` (its subject CN).
    pub fn new(name: &str) -> TestPki {
        let dir = TempDir::new("pki");
        let (cert, key) = (dir.path().join(format!("{name}-ca.pem")), dir.path().join(format!("{name}-ca.key")));
        let subject = format!("/CN={name} test CA");
        let args = [
            &["req", "-x509"][..],
            &NEW_EC_KEY,
            &[
                "-keyout",
                key.to_str().expect("utf-8 path"),
                "-out",
                cert.to_str().expect("utf-8 path"),
                "-days",
                "2",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-addext",
                "subjectKeyIdentifier=hash",
            ],
        ]
        .concat();
        openssl(&args, dir.path());
        TestPki { name: name.to_owned(), ca: CertFiles { cert, key }, dir }
    }

    /// The CA certificate (PEM file).
    pub fn ca_cert(&self) -> &Path {
        &self.ca.cert
    }

    /// The CA certificate's PEM text.
    pub fn ca_pem(&self) -> Vec<u8> {
        fs::read(&self.ca.cert).expect("read CA certificate")
    }

    /// A directory for the test's other files, removed with the PKI.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues a certificate named `file` (files `<file>.pem`, `<file>.key`) with
    /// subject CN `cn`, the given SANs in openssl syntax (`DNS:localhost`,
    /// `IP:127.0.0.1`, `URI:spiffe://echomq/billing`) and the extended key usage
    /// `eku` (`serverAuth`, `clientAuth`).
    pub fn issue(&self, file: &str, cn: &str, sans: &[&str], eku: &str) -> CertFiles {
        let dir = self.dir.path();
        let (cert, key, csr, ext) = (
            dir.join(format!("{file}.pem")),
            dir.join(format!("{file}.key")),
            dir.join(format!("{file}.csr")),
            dir.join(format!("{file}.ext")),
        );
        let path = |p: &PathBuf| p.to_str().expect("utf-8 path").to_owned();
        let (key_path, csr_path, subject) = (path(&key), path(&csr), format!("/CN={cn}"));
        let args = [&["req"][..], &NEW_EC_KEY, &["-keyout", &key_path, "-out", &csr_path, "-subj", &subject]].concat();
        openssl(&args, dir);
        let mut extensions = vec![
            "basicConstraints=critical,CA:FALSE".to_owned(),
            "keyUsage=critical,digitalSignature".to_owned(),
            format!("extendedKeyUsage={eku}"),
            "subjectKeyIdentifier=hash".to_owned(),
            "authorityKeyIdentifier=keyid".to_owned(),
        ];
        if !sans.is_empty() {
            extensions.push(format!("subjectAltName={}", sans.join(",")));
        }
        fs::write(&ext, extensions.join("\n") + "\n").expect("write extensions file");
        let serial = format!("{}{:06}", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed));
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &path(&csr),
                "-CA",
                &path(&self.ca.cert),
                "-CAkey",
                &path(&self.ca.key),
                "-set_serial",
                &serial,
                "-days",
                "2",
                "-out",
                &path(&cert),
                "-extfile",
                &path(&ext),
            ],
            dir,
        );
        CertFiles { cert, key }
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server_cert(&self) -> CertFiles {
        self.issue(&format!("{}-server", self.name), "localhost", &["DNS:localhost", "IP:127.0.0.1"], "serverAuth")
    }

    /// A client certificate with the given SANs.
    pub fn client_cert(&self, file: &str, sans: &[&str]) -> CertFiles {
        self.issue(file, file, sans, "clientAuth")
    }

    /// A client TLS config trusting this CA for the server name `localhost`,
    /// presenting `identity` when given.
    pub fn client_tls(&self, identity: Option<&CertFiles>) -> tonic::transport::ClientTlsConfig {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(self.ca_pem()))
            .domain_name("localhost");
        match identity {
            Some(files) => tls.identity(files.identity()),
            None => tls,
        }
    }
}
