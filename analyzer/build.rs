//! Embeds the runtime, `libmslprof.so`, and the PLT-counting audit module, `libmslprof_audit.so`, into release builds of `mslprof`, so that an installed binary
//! (`cargo install --locked --path analyzer --root DIR`) can run programs under it with nothing else on the machine.
//! Both are built by a nested `cargo build --release -p mslprof-runtime -p mslprof-audit` into this build's own
//! `OUT_DIR` (a target folder of its own, so it never waits on the outer build's lock). Debug builds embed
//! nothing: they find the runtime built beside them in `target/debug/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    const LIBRARIES: [&str; 2] = ["libmslprof.so", "libmslprof_audit.so"];
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().unwrap_or(Path::new(".")).to_path_buf();
    for crate_dir in [
        "runtime",
        "loader-hooks",
        "format-spec/src",
        "format-spec/Cargo.toml",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(crate_dir).display()
        );
    }
    println!("cargo:rerun-if-env-changed=MSLPROF_NO_EMBED");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let wanted = release && std::env::var_os("MSLPROF_NO_EMBED").is_none();
    // Empty files mean "nothing embedded"; the binary then looks for the runtime on disk only.
    if !wanted || !workspace.join("runtime/Cargo.toml").exists() {
        for lib in LIBRARIES {
            std::fs::write(out.join(lib), b"").expect("write an empty library into OUT_DIR");
        }
        return;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = out.join("runtime-target");
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            // The versions of Cargo.lock, as `cargo install --locked` builds the binary.
            "--locked",
            "-p",
            "mslprof-runtime",
            "-p",
            "mslprof-audit",
            "--lib",
            "--manifest-path",
        ])
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // Not clippy's or the outer build's settings: a plain build of the runtime.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .status()
        .expect("run cargo to build the runtime");
    assert!(
        status.success(),
        "building libmslprof.so and libmslprof_audit.so for embedding failed"
    );
    for lib in LIBRARIES {
        std::fs::copy(target_dir.join("release").join(lib), out.join(lib))
            .expect("copy a built library into OUT_DIR");
    }
}
