// Compiles the gRPC contract with protox (pure Rust), so no `protoc` is needed on the machine.
// The encoded descriptor set is kept for gRPC server reflection.
use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    no_ssh_crypto_preload()?;
    let descriptors = protox::compile(["vmlauncher/v1/launcher.proto"], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("vmlauncher_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    // KubeVirt's handler <-> launcher protos (src/kubevirt), apart: they are not ours to serve
    // reflection for, and their packages never import ours.
    let kubevirt = protox::compile(
        [
            "kubevirt/cmd/v1/cmd.proto",
            "kubevirt/cmd/info/info.proto",
            "kubevirt/notify/v1/notify.proto",
            "kubevirt/notify/info/info.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure().compile_fds(kubevirt)?;
    Ok(())
}

/// Builds `OUT_DIR/no_ssh_crypto.so` from `src/libvirt/no_ssh_crypto.c`: the shared object the
/// private libvirtd preloads (src/libvirt/lean.rs embeds it).
fn no_ssh_crypto_preload() -> Result<(), Box<dyn std::error::Error>> {
    let source = "src/libvirt/no_ssh_crypto.c";
    println!("cargo:rerun-if-changed={source}");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("no_ssh_crypto.so");
    let status = cc::Build::new()
        .get_compiler()
        .to_command()
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-s", "-o"])
        .arg(&out)
        .arg(source)
        .arg("-ldl")
        .status()?;
    if !status.success() {
        return Err(format!("compiling {source} failed: {status}").into());
    }
    Ok(())
}
