//! Compiles `proto/` with protox (pure Rust, no protoc binary) and feeds the
//! same file descriptor set to tonic's code generator and to server reflection.
//! KEDA's vendored `externalscaler.proto` gets a descriptor set of its own, so
//! reflection lists it only when the sidecar serves it (`--keda-scaler`).

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/echomq/v1/consumer_service.proto",
        "proto/echomq/v1/stream_service.proto",
        "proto/echomq/v1/admin_service.proto",
        "proto/echomq/v1/types.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("echomq_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    // Smaller per-call buffers than tonic's 8 KiB each (see `src/codec.rs`).
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::LeanCodec")
        // A delivery's payload values are slices of the Redis reply they
        // were read in (see `src/redis/resp.rs`), not a copy each.
        .bytes(".echomq.v1.Delivery")
        // The sidecar writes its deliveries without the generated type's
        // allocations (see `src/wire.rs`); clients decode generated ones.
        .extern_path(".echomq.v1.DeliveryBatch", "crate::wire::DeliveryBatch")
        .compile_fds(fds)?;

    let keda = "proto/externalscaler/externalscaler.proto";
    println!("cargo:rerun-if-changed={keda}");
    let fds = protox::compile([keda], ["proto"])?;
    fs::write(out.join("externalscaler_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
