//! Building the benchmark's C programs with the system `cc` into the harness's scratch directory.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder holding the benchmark C sources.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bench")
}

/// Runs `cc` with `args` in `dir`, failing with cc's own message.
pub fn cc(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("cc")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// The call-heavy fib program: a plain build and a `-pg` build, both -O2.
pub struct FibBuilds {
    pub plain: PathBuf,
    pub pg: PathBuf,
}

pub fn build_fib(dir: &Path) -> Result<FibBuilds, String> {
    let src = source_dir().join("fib_fp.c");
    let src = src.to_string_lossy();
    cc(dir, &["-O2", "-pthread", "-o", "fib_plain", &src])?;
    cc(dir, &["-O2", "-pg", "-pthread", "-o", "fib_pg", &src])?;
    Ok(FibBuilds {
        plain: dir.join("fib_plain"),
        pg: dir.join("fib_pg"),
    })
}

/// The CPU-bound program spinning in the main program and two shared libraries (no -pg).
pub fn build_spin(dir: &Path) -> Result<PathBuf, String> {
    let src = source_dir().join("spin_libs.c");
    let src = src.to_string_lossy();
    cc(
        dir,
        &[
            "-O1",
            "-fPIC",
            "-shared",
            "-DSPIN_LIB=spin_a",
            "-o",
            "libspin_a.so",
            &src,
        ],
    )?;
    cc(
        dir,
        &[
            "-O1",
            "-fPIC",
            "-shared",
            "-DSPIN_LIB=spin_b",
            "-o",
            "libspin_b.so",
            &src,
        ],
    )?;
    cc(
        dir,
        &[
            "-O1",
            "-o",
            "spin",
            &src,
            "-L.",
            "-lspin_a",
            "-lspin_b",
            "-Wl,-rpath,$ORIGIN",
        ],
    )?;
    Ok(dir.join("spin"))
}
