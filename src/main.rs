//! The `echomq-sidecar` binary: parse the configuration, start logging, run
//! until SIGTERM or SIGINT, and turn failures into exit codes (2 for a bad
//! setting or file, 1 for a failure while running).

use std::process::ExitCode;

use clap::{error::ErrorKind, Parser};
use echomq::{app, config::Config, telemetry};

fn main() -> ExitCode {
    let config = match Config::try_parse() {
        Ok(config) => config,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's message, usage hint left out, on one line: it names the
            // flag and, for a choice, the possible values.
            let text = e.to_string();
            let reason: Vec<&str> = text
                .split("\n\nUsage:")
                .next()
                .unwrap_or_default()
                .lines()
                .map(|line| line.trim().trim_start_matches("error: "))
                .filter(|line| !line.is_empty() && !line.starts_with("For more information"))
                .collect();
            eprintln!("echomq-sidecar: {} (see --help)", reason.join(" "));
            return ExitCode::from(2);
        }
    };
    if let Err(reason) = config.validate() {
        eprintln!("echomq-sidecar: {reason}");
        return ExitCode::from(2);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.server.worker_threads > 0 {
        builder.worker_threads(config.server.worker_threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("echomq-sidecar: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let telemetry = telemetry::init(config.admin.log_format);
        let result = app::run(config, app::shutdown_signal()).await;
        telemetry.shutdown();
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echomq-sidecar: {e}");
            match e {
                app::AppError::Config(_) | app::AppError::RedisUrl(_) | app::AppError::RedisSettings { .. } => {
                    ExitCode::from(2)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}
