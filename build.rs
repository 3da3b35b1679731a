// Compiles the gRPC contract with protox (pure Rust), so no `protoc` is needed on the machine.
// The encoded descriptor set is kept for gRPC server reflection.
use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    no_ssh_crypto_preload()?;
    hot_code_first();
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
/// private libvirtd preloads (src/libvirt/daemon.rs embeds it).
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

/// Links a release binary with the functions a running launcher executes packed together ahead of
/// the rest of its code. The kernel maps a binary's code in 64 KiB windows around each page a
/// process touches; spread over 3.4 MB, the 1.7 MB a launcher runs kept all of it resident.
/// `layout/hot-symbols.txt` names them exactly as this build names them (scripts/hot-symbols.sh
/// writes it from a profile of the release binary); a name the build lacks is skipped, so a stale
/// list costs pages, never correctness. Relative relocations are packed (DT_RELR, glibc 2.36):
/// their table, which the loader reads whole at every start, shrinks from 218 KiB to 5.
fn hot_code_first() {
    let list = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("layout/hot-symbols.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    // PROFILE is "release" for the bench profile too: it inherits release, and builds the same
    // binary (Cargo.toml: the features criterion turns on).
    if std::env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    if list.exists() {
        println!(
            "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
            list.display()
        );
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}
