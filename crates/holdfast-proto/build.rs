fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/lock/v1/lock.proto");
    tonic_prost_build::configure().compile_protos(&["proto/lock/v1/lock.proto"], &["proto"])?;
    Ok(())
}
