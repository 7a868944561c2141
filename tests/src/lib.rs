//! Helpers shared by the integration tests: building C fixtures and running them under the runtime.
//!
//! The tests rely on `cargo build --workspace --all-targets` having built `libmslprof.so` and `mslprof` into
//! the same target directory as the test executable; a missing file fails the test with a message naming it.
//! C fixtures are compiled with the system `cc` into a fresh temporary directory per test, never into the
//! source tree.

pub mod analyzer;
pub mod callcounts;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

use mslprof_format::model::{Module, Profile};

mod sys;

pub use sys::{ChildUsage, global_symbol, send_signal, wait_with_usage};

/// `target/<profile>/`, found from the running test executable (`target/<profile>/deps/<test>-<hash>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    if deps.file_name() == Some(OsStr::new("deps")) {
        deps.parent().unwrap().to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

fn built_file(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --all-targets` before `cargo test --workspace`",
        path.display()
    );
    path
}

/// `target/<profile>/libmslprof.so`.
pub fn runtime_library() -> PathBuf {
    built_file("libmslprof.so")
}

/// A copy of the runtime built with its `test-hooks` feature, for the fixtures that ask it how many samples it
/// has taken (`mslprof_test_samples`) or inject samples (`mslprof_test_inject_samples`). The shipped
/// `libmslprof.so` never carries those symbols, so the first call builds this copy with cargo, in the same
/// profile as the tests, into `target/<profile>/test-hooks/` (later calls, and later test runs, reuse it).
pub fn test_hooks_runtime_library() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_test_hooks_runtime).clone()
}

fn build_test_hooks_runtime() -> PathBuf {
    let target = target_dir();
    let profile = target
        .file_name()
        .and_then(OsStr::to_str)
        .expect("target/<profile>")
        .to_owned();
    let hooks_target = target.join("test-hooks");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "--lib", "-p", "mslprof-runtime"])
        .args(["--features", "test-hooks", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&hooks_target)
        .args([
            "--profile",
            if profile == "debug" { "dev" } else { &profile },
        ]);
    let output = run(&mut command);
    assert_success(&output, "building the runtime with its test hooks");
    let library = hooks_target.join(&profile).join("libmslprof.so");
    assert!(library.exists(), "{} is missing", library.display());
    library
}

/// `target/<profile>/libmslprof_audit.so`, the `LD_AUDIT` module that counts calls through the PLT.
pub fn audit_library() -> PathBuf {
    built_file("libmslprof_audit.so")
}

/// `target/<profile>/mslprof`.
pub fn analyzer_binary() -> PathBuf {
    built_file("mslprof")
}

/// The real rustc binary (not the rustup proxy), found through `rustc --print sysroot`.
pub fn real_rustc() -> Option<PathBuf> {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let p = PathBuf::from(sysroot.trim()).join("bin/rustc");
    p.exists().then_some(p)
}

/// `tests/fixtures/<area>/`.
pub fn fixtures_dir(area: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(area)
}

/// A temporary directory holding one test's build products and output files.
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Default for Workspace {
    fn default() -> Self {
        Self::new()
    }
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace {
            dir: tempfile::Builder::new()
                .prefix("mslprof-test-")
                .tempdir()
                .expect("temporary directory"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `cc <args>` in this directory ([`cc`]).
    pub fn cc<I, S>(&self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        cc(self.path(), args);
    }

    /// Builds a shared library `file_name` from `sources` (paths) with extra flags, e.g. a soname.
    pub fn shared_library(&self, file_name: &str, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
        let out = self.join(file_name);
        let mut args: Vec<std::ffi::OsString> =
            vec!["-shared".into(), "-fPIC".into(), "-O1".into(), "-g".into()];
        args.extend(flags.iter().map(Into::into));
        args.push("-o".into());
        args.push(out.clone().into());
        args.extend(sources.iter().map(|s| s.clone().into_os_string()));
        self.cc(args);
        out
    }

    /// Builds an executable `name` from `sources`, then `flags` (libraries, `-L`, `-Wl,...`).
    pub fn program(&self, name: &str, sources: &[PathBuf], flags: &[&str]) -> PathBuf {
        let out = self.join(name);
        let mut args: Vec<std::ffi::OsString> =
            vec!["-O1".into(), "-g".into(), "-o".into(), out.clone().into()];
        args.extend(sources.iter().map(|s| s.clone().into_os_string()));
        args.extend(flags.iter().map(Into::into));
        args.push("-Wl,-rpath,$ORIGIN".into());
        self.cc(args);
        out
    }

    /// A command running `program` in this directory with the runtime preloaded and a clean profiling
    /// environment (no inherited LD_PROFILE, GPROFDIR, GMON_OUT_PREFIX, MSLPROF_* or bucket size).
    pub fn command_with_runtime(&self, program: &Path) -> Command {
        let mut command = self.command(program);
        command.env("LD_PRELOAD", runtime_library());
        command
    }

    /// As [`Workspace::command_with_runtime`], with the runtime built with its test hooks
    /// ([`test_hooks_runtime_library`]).
    pub fn command_with_test_hooks_runtime(&self, program: &Path) -> Command {
        let mut command = self.command(program);
        command.env("LD_PRELOAD", test_hooks_runtime_library());
        command
    }

    /// As [`Workspace::command_with_runtime`], without the runtime.
    ///
    /// `LD_PROFILE_OUTPUT` points into this directory: glibc's ld.so starts its own `sprof` profiler when
    /// `LD_PROFILE` names exactly one library, and would otherwise write `/var/tmp/NAME.profile`. The child starts
    /// with SIGINT and SIGQUIT at their default action, however the test suite was started.
    pub fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command.current_dir(self.path());
        sys::default_interrupt_signals(&mut command);
        command.env("LD_PROFILE_OUTPUT", self.path());
        // cargo test points LD_LIBRARY_PATH at target/<profile>, which would win over a fixture's own
        // RUNPATH (e.g. one linked with the test-hooks copy of libmslprof.so).
        command.env_remove("LD_LIBRARY_PATH");
        for (name, _) in std::env::vars_os() {
            let name_text = name.to_string_lossy();
            if name_text.starts_with("MSLPROF_")
                || [
                    "LD_PROFILE",
                    "LD_PROFILEBUCKET_SIZE",
                    "GPROFDIR",
                    "GMON_OUT_PREFIX",
                    "LD_PRELOAD",
                    "LD_AUDIT",
                ]
                .contains(&name_text.as_ref())
            {
                command.env_remove(&name);
            }
        }
        command
    }

    /// Builds `no_perf_events`, a static launcher that runs its arguments as a command with
    /// `perf_event_open` refused (EACCES) by a seccomp filter, as in a container that forbids it. Being static,
    /// it does not load the runtime an `LD_PRELOAD` names; the program it executes does.
    pub fn no_perf_events_launcher(&self) -> PathBuf {
        let out = self.join("no_perf_events");
        self.cc([
            "-static".as_ref(),
            "-O1".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
            fixtures_dir("sampling")
                .join("no_perf_events.c")
                .as_os_str(),
        ]);
        out
    }

    /// Reads and decodes a profile written in this directory.
    pub fn profile(&self, name: &str) -> Profile {
        read_profile(&self.join(name))
    }
}

/// Runs the system C compiler, `cc <args>`, in `dir`: the one way the tests build C fixtures. Panics with the
/// command line and the compiler's messages when it fails.
pub fn cc<I, S>(dir: &Path, args: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    compile("cc", dir, args);
}

/// As [`cc`], with another compiler driver named (`gcc`, `g++`), for the tests that compare with GNU gprof
/// on the compiler gprof documents, or build C++.
pub fn compile<I, S>(compiler: &str, dir: &Path, args: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    if let Err(message) = try_compile(compiler, dir, args) {
        panic!("{message}");
    }
}

/// As [`compile`], returning the failure (the command line and the compiler's messages) instead of
/// panicking: for the benchmark harness, which skips a workload it cannot build.
pub fn try_compile<I, S>(compiler: &str, dir: &Path, args: I) -> Result<(), String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args
        .into_iter()
        .map(|a| a.as_ref().to_os_string())
        .collect();
    let output = Command::new(compiler)
        .args(&args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run {compiler}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{compiler} {} failed in {}:\n{}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// Runs `command`, returning its output; panics if it could not be started.
pub fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

/// Panics unless `output` is a successful exit, showing `what` ran, its status and both output streams.
pub fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Like [`run`], and also returns the CPU time (user + system) the process used, from `wait4`
/// ([`wait_with_usage`]).
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which std's Child cannot do"
)]
pub fn run_measuring_cpu(command: &mut Command) -> (Output, Duration) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let mut stderr_pipe = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stderr_pipe.read_to_end(&mut bytes).map(|_| bytes)
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let stderr = stderr.join().unwrap().unwrap();
    // Reaped here, not by `child`, which is dropped without waiting.
    let usage =
        wait_with_usage(child.id()).unwrap_or_else(|e| panic!("cannot wait for {command:?}: {e}"));
    let output = Output {
        status: usage.status,
        stdout,
        stderr,
    };
    (output, usage.cpu())
}

/// Calls `ready` on `child` every 20 ms until it gives a value, for 20 s at most: the one deadline the tests
/// give a fixture that should end, or show something, within a second or two. Past it `child` is killed and
/// reaped, and the test fails saying `hang`. `ready` may fail the test itself (a child that ended too early).
pub fn wait_until<T>(
    child: &mut Child,
    hang: &str,
    mut ready: impl FnMut(&mut Child) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = ready(child) {
            return value;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{hang}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to end, for 20 s at most ([`wait_until`]).
pub fn wait_at_most_20s(child: &mut Child, hang: &str) -> ExitStatus {
    wait_until(child, hang, |c| c.try_wait().expect("wait"))
}

/// Decodes a profile file with the format-spec reader; panics with the reader's error.
pub fn read_profile(path: &Path) -> Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    mslprof_format::read(&bytes, mslprof_format::GnuTarget::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The profile's module whose file name is `name`.
pub fn module<'a>(profile: &'a Profile, name: &str) -> &'a Module {
    profile
        .modules
        .iter()
        .find(|m| m.name == name.as_bytes())
        .unwrap_or_else(|| panic!("no module {name} in {:?}", module_names(profile)))
}

/// File names of the profile's modules, for messages.
pub fn module_names(profile: &Profile) -> Vec<String> {
    profile
        .modules
        .iter()
        .map(|m| String::from_utf8_lossy(&m.name).into_owned())
        .collect()
}

/// Sum of a module's histogram buckets (0 without a histogram).
pub fn histogram_total(module: &Module) -> u64 {
    module
        .histogram
        .as_ref()
        .map_or(0, |h| h.ranges.iter().map(|r| r.buckets.total()).sum())
}

/// Whether `perf record -e cpu-clock` works here (installed, permitted); the reason when it does not.
pub fn perf_unavailable() -> Option<String> {
    let probe = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-o", "/dev/null", "--", "true"])
        .output();
    match probe {
        Err(e) => Some(format!("perf cannot be run: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "perf record fails: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}
pub mod loader;

/// The Lua 5.4 sources of the `lua-src` crate (a dev-dependency of this crate, so cargo has fetched it),
/// found through `cargo metadata`.
pub fn lua_sources(workspace: &Path) -> Result<PathBuf, String> {
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1"])
        .current_dir(workspace)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata: {e}"))?;
    let manifest = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "lua-src"))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata does not list lua-src")?;
    let dir = Path::new(manifest)
        .parent()
        .ok_or("lua-src has no folder")?;
    std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("lua-5.4"))
        })
        .max()
        .ok_or_else(|| format!("no lua-5.4 sources in {}", dir.display()))
}
