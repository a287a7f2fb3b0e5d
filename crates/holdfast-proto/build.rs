fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/lock/v1/lock.proto");
    // The encoded descriptors serve gRPC server reflection (grpcurl lists
    // lock.v1 without a copy of the .proto).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("lock_v1_descriptor.bin"))
        .compile_protos(&["proto/lock/v1/lock.proto"], &["proto"])?;
    Ok(())
}
