//! Compiles the gRPC test protocol.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(
            &[
                "proto/chain.proto",
                "proto/health.proto",
                "proto/greeter.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto/chain.proto");
    println!("cargo:rerun-if-changed=proto/health.proto");
    println!("cargo:rerun-if-changed=proto/greeter.proto");
    Ok(())
}
