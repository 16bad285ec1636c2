//! The archive tests' tools: MinIO (a real S3-compatible server) and DuckDB
//! (PyPI `duckdb` in `.tmp/archive-venv`), both made by scripts/install-deps.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use echomq::archive::Archive;

use super::{eventually, free_port, kill_child, TempDir, START_TIMEOUT};

// The tests that need a tool are `#[ignore]`d saying so; scripts/test runs
// them (`-- --ignored`) after install-deps has made their tools.

/// The tool at `$<env>`, else at `.tmp/<relative>` in the checkout, else
/// `name` on PATH. Panics naming how to get it when it is nowhere: the tests
/// that call this are ignored unless asked for, and asked for, they must run.
pub fn find_tool(env: &str, relative: &str, name: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .or_else(|| Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".tmp").join(relative)).filter(|p| p.is_file()))
        .or_else(|| std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("no {name}: set {env}, or run scripts/install-deps (it makes .tmp/{relative})"))
}

/// The bucket every MinIO test uses; each test takes its own prefix.
pub const BUCKET: &str = "echomq-archive";

/// A MinIO server on free loopback ports with a data directory of its own,
/// killed and removed on drop.
pub struct Minio {
    child: Child,
    /// The S3 API port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl Minio {
    /// Starts MinIO with the bucket [`BUCKET`] and waits until it takes a
    /// probe. Panics when there is no MinIO.
    pub async fn start() -> Minio {
        let binary = find_tool("ECHOMQ_MINIO", "bin/minio", "minio");
        let dir = TempDir::new("minio");
        let data = dir.path().join("data");
        // A directory under the data directory before the first start is a bucket to MinIO
        // (object_store cannot create buckets, and a signed CreateBucket by hand is not worth it).
        std::fs::create_dir_all(data.join(BUCKET)).expect("create bucket dir");
        let (port, console) = (free_port(), free_port());
        let log = dir.path().join("minio.log");
        let out = std::fs::File::create(&log).expect("log");
        let child = Command::new(&binary)
            .args(["server", "--quiet", "--address", &format!("127.0.0.1:{port}")])
            .args(["--console-address", &format!("127.0.0.1:{console}")])
            .arg(&data)
            .env("MINIO_ROOT_USER", "minioadmin")
            .env("MINIO_ROOT_PASSWORD", "minioadmin")
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let minio = Minio { child, port, log, _dir: dir };
        let probe = minio.archive("probe");
        let up = eventually(START_TIMEOUT, || async { probe.probe().await.is_ok() }).await;
        if !up {
            let last = probe.probe().await.err().map(|e| e.to_string()).unwrap_or_default();
            panic!("MinIO did not take a probe within {START_TIMEOUT:?}: {last}\n{}", super::read_log(&minio.log));
        }
        minio
    }

    /// An archive at `s3://BUCKET/<prefix>` on this server, configured as
    /// the sidecar would be by its AWS_* variables.
    pub fn archive(&self, prefix: &str) -> Archive {
        let aws = [
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "minioadmin".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "minioadmin".to_owned()),
        ];
        Archive::open_with(&format!("s3://{BUCKET}/{prefix}"), aws.map(|(k, v)| (k.to_owned(), v))).expect("open s3://")
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        kill_child(&mut self.child);
        if super::print_logs_requested() {
            eprintln!("--- minio log ---\n{}", super::tail(&super::read_log(&self.log), 40));
        }
    }
}

impl Minio {
    /// Stops the server (SIGSTOP: it takes connections and never answers) or
    /// lets it go on (SIGCONT).
    pub fn stall(&self, stalled: bool) {
        let signal = if stalled { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").arg(signal).arg(self.child.id().to_string()).status().expect("run kill");
        assert!(status.success(), "kill {signal} MinIO: {status}");
    }

    /// The `AWS_*` settings a sidecar needs for this server.
    pub fn aws_env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "minioadmin".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "minioadmin".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .to_vec()
    }
}

/// Prints every row DuckDB finds under a directory as one JSON document:
/// `[[stream, stream_id, branded_id, minted_at ms, minted_at's type, [[name hex, value hex], …]], …]`.
pub const DUCKDB_QUERY: &str = r#"
import json, sys
import duckdb
rows = duckdb.sql(
    "SELECT stream, stream_id, branded_id, epoch_ms(minted_at), typeof(minted_at), fields "
    f"FROM '{sys.argv[1]}/**/*.parquet'"
).fetchall()
print(json.dumps([
    [stream, stream_id, branded, minted, kind, [[f["name"].hex(), f["value"].hex()] for f in fields]]
    for stream, stream_id, branded, minted, kind, fields in rows
]))
"#;

/// The Python with DuckDB. Panics when there is none.
pub fn duckdb_python() -> PathBuf {
    find_tool("ECHOMQ_ARCHIVE_PYTHON", "archive-venv/bin/python", "python3-with-duckdb")
}

/// Every row DuckDB reads under `dir`, as [`DUCKDB_QUERY`] prints them.
pub fn duckdb_rows(python: &Path, dir: &Path) -> Vec<serde_json::Value> {
    let output = Command::new(python).arg("-c").arg(DUCKDB_QUERY).arg(dir).output().expect("run python");
    assert!(output.status.success(), "DuckDB query failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON rows")
}
