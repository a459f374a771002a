//! Compiles the example's protocol.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::compile_protos("proto/greeter.proto")?;
    println!("cargo:rerun-if-changed=proto/greeter.proto");
    Ok(())
}
