//! Building the benchmark's C programs with the system `cc` into the harness's scratch directory.

use std::path::{Path, PathBuf};

/// The folder holding the benchmark C sources.
pub fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bench")
}

/// Runs `cc` with `args` in `dir` (the tests' one compiler helper), failing with cc's own message.
pub fn cc(dir: &Path, args: &[&str]) -> Result<(), String> {
    mslprof_tests::try_compile("cc", dir, args)
}

/// Builds the benchmark source `source` (in [`source_dir`]) into the shared library `output` in `dir`:
/// `flags`, `-shared -fPIC`, then the libraries it links against (`libs`, after the source). Returns its path.
pub fn shared_library(
    dir: &Path,
    source: &str,
    output: &str,
    flags: &[&str],
    libs: &[&str],
) -> Result<PathBuf, String> {
    let src = source_dir().join(source);
    let src = src.to_string_lossy();
    let mut args = flags.to_vec();
    args.extend(["-shared", "-fPIC", "-o", output, &src]);
    args.extend(libs);
    cc(dir, &args)?;
    Ok(dir.join(output))
}

/// A benchmark program built twice: plain and with `-pg`, both -O2.
pub struct Builds {
    pub plain: PathBuf,
    pub pg: PathBuf,
}

pub fn build_fib(dir: &Path) -> Result<Builds, String> {
    let src = source_dir().join("fib_fp.c");
    let src = src.to_string_lossy();
    cc(dir, &["-O2", "-pthread", "-o", "fib_plain", &src])?;
    cc(dir, &["-O2", "-pg", "-pthread", "-o", "fib_pg", &src])?;
    Ok(Builds {
        plain: dir.join("fib_plain"),
        pg: dir.join("fib_pg"),
    })
}

/// The C++ program of many small functions, built with `g++ -O1`, plain and with `-pg`.
pub fn build_cxx(dir: &Path) -> Result<Builds, String> {
    let src = source_dir().join("cxx_small_functions.cpp");
    let src = src.to_string_lossy();
    mslprof_tests::try_compile("g++", dir, ["-O1", "-o", "cxx_plain", &src])?;
    mslprof_tests::try_compile("g++", dir, ["-O1", "-pg", "-o", "cxx_pg", &src])?;
    Ok(Builds {
        plain: dir.join("cxx_plain"),
        pg: dir.join("cxx_pg"),
    })
}

/// The CPU-bound program spinning in the main program and two shared libraries (no -pg).
pub fn build_spin(dir: &Path) -> Result<PathBuf, String> {
    for lib in ["spin_a", "spin_b"] {
        shared_library(
            dir,
            "spin_libs.c",
            &format!("lib{lib}.so"),
            &["-O1", &format!("-DSPIN_LIB={lib}")],
            &[],
        )?;
    }
    let src = source_dir().join("spin_libs.c");
    let src = src.to_string_lossy();
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

/// A real workload: the Lua 5.4 interpreter as a shared library `liblua.so` and a driver program running a
/// fixed script (the one the analyzer's golden files use), built plain and with `-pg` into `dir/plain` and
/// `dir/pg`. Returns the two driver programs.
pub fn build_lua(workspace: &Path, dir: &Path) -> Result<Builds, String> {
    let lua = mslprof_tests::lua_sources(workspace)?;
    let mut sources: Vec<String> = std::fs::read_dir(&lua)
        .map_err(|e| format!("{}: {e}", lua.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    sources.sort();
    let driver = workspace.join("tests/golden/analyzer/lua/driver.c");
    let include = format!("-I{}", lua.display());
    for (sub, extra) in [("plain", None), ("pg", Some("-pg"))] {
        let out = dir.join(sub);
        std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
        let mut lib: Vec<&str> = vec![
            "-O2",
            "-DLUA_USE_LINUX",
            "-fPIC",
            "-shared",
            "-o",
            "liblua.so",
        ];
        lib.extend(extra);
        lib.extend(sources.iter().map(String::as_str));
        lib.push("-lm");
        cc(&out, &lib)?;
        let mut app: Vec<&str> = vec!["-O2", &include, "-o", "lua_app"];
        app.extend(extra);
        let driver = driver.to_string_lossy();
        app.extend([driver.as_ref(), "-L.", "-llua", "-Wl,-rpath,$ORIGIN", "-lm"]);
        cc(&out, &app)?;
    }
    Ok(Builds {
        plain: dir.join("plain/lua_app"),
        pg: dir.join("pg/lua_app"),
    })
}
