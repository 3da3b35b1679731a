// Compiles the gRPC contract with protox (pure Rust), so no `protoc` is needed on the machine.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["vmlauncher/v1/launcher.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
