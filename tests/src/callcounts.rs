//! Helpers of the call-count tests: build the C fixtures in `fixtures/callcounts`, run them under
//! glibc's `-pg` or under `libmslprof.so`, and reduce both kinds of profile to the same call graph
//! of function names, so the two can be compared exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// (caller function, callee function) → calls.
pub type CallGraph = BTreeMap<(String, String), u64>;

/// The directory holding the call-count fixtures' sources.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/callcounts")
}

/// `libmslprof.so` of the build that produced the running test executable
/// (`target/<profile>/deps/<test>` → `target/<profile>/libmslprof.so`).
pub fn runtime_library() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable in target/<profile>/deps");
    let library = profile_dir.join("libmslprof.so");
    assert!(
        library.exists(),
        "{} is missing: run `cargo build --workspace --all-targets` first",
        library.display()
    );
    library
}

/// Runs `cc` with `args` in `dir`; panics with the compiler's output if it fails.
pub fn cc(dir: &Path, args: &[&str]) {
    let output = Command::new("cc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("running cc");
    assert!(
        output.status.success(),
        "cc {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// True when the CPU can run AVX code (so the fixtures may pass `__m256` arguments).
pub fn cpu_has_avx() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .filter(|line| line.starts_with("flags"))
            .any(|line| line.split_whitespace().any(|flag| flag == "avx"))
    })
}

/// How the fixtures are instrumented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instrumentation {
    /// `-pg`: `mcount` after the prologue.
    Mcount,
    /// `-pg -mfentry`: `__fentry__` before the prologue.
    Fentry,
    /// `-finstrument-functions`: `__cyg_profile_func_enter`.
    InstrumentFunctions,
}

impl Instrumentation {
    pub const ALL: [Instrumentation; 3] = [
        Instrumentation::Mcount,
        Instrumentation::Fentry,
        Instrumentation::InstrumentFunctions,
    ];

    /// Compiler flags.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Instrumentation::Mcount => &["-pg"],
            Instrumentation::Fentry => &["-pg", "-mfentry"],
            Instrumentation::InstrumentFunctions => &["-finstrument-functions"],
        }
    }
}

/// Flags every fixture build uses: the fixtures' header, and no call turned into a jump.
pub fn common_flags(optimization: &str) -> Vec<String> {
    vec![
        optimization.to_string(),
        "-fno-optimize-sibling-calls".to_string(),
        format!("-I{}", fixture_dir().display()),
    ]
}

/// Builds shared library `lib<name>.so` in `dir` from fixture sources.
pub fn build_library(dir: &Path, name: &str, sources: &[&str], flags: &[String]) {
    let mut args: Vec<String> = flags.to_vec();
    args.extend(["-shared", "-fPIC", "-o"].map(String::from));
    args.push(format!("lib{name}.so"));
    args.extend(
        sources
            .iter()
            .map(|s| fixture_dir().join(s).display().to_string()),
    );
    cc(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Builds executable `exe` in `dir` from fixture sources, linked with `lib<name>.so` for each
/// name in `libraries` (found in `dir` at run time through `$ORIGIN`).
pub fn build_program(
    dir: &Path,
    exe: &str,
    sources: &[&str],
    libraries: &[&str],
    flags: &[String],
) {
    let mut args: Vec<String> = flags.to_vec();
    args.push("-o".into());
    args.push(exe.into());
    args.extend(
        sources
            .iter()
            .map(|s| fixture_dir().join(s).display().to_string()),
    );
    args.push("-L.".into());
    args.push("-Wl,-rpath,$ORIGIN".into());
    args.extend(libraries.iter().map(|l| format!("-l{l}")));
    args.push("-pthread".into());
    cc(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Runs `dir/exe` in `dir` with `env` added; panics unless it exits 0.
pub fn run(dir: &Path, exe: &str, env: &[(&str, &str)]) -> Output {
    let output = Command::new(dir.join(exe))
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .expect("running fixture");
    assert!(
        output.status.success(),
        "{exe} failed: {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs `dir/exe` with `libmslprof.so` preloaded.
pub fn run_profiled(dir: &Path, exe: &str, env: &[(&str, &str)]) -> Output {
    let library = runtime_library();
    let mut all = vec![("LD_PRELOAD", library.to_str().expect("utf-8 path"))];
    all.extend_from_slice(env);
    run(dir, exe, &all)
}

/// Function symbols of one ELF file, from `nm`: address-sorted (start, end, name).
#[derive(Debug, Default)]
pub struct Symbols {
    functions: Vec<(u64, u64, String)>,
}

impl Symbols {
    /// Reads the defined text symbols of `file` (link-time addresses).
    pub fn of(file: &Path) -> Symbols {
        let output = Command::new("nm")
            .args(["-S", "--defined-only"])
            .arg(file)
            .output()
            .expect("running nm");
        assert!(output.status.success(), "nm {}", file.display());
        let mut functions: Vec<(u64, u64, String)> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let [address, size, kind, name] = fields[..] else {
                    return None;
                };
                if !matches!(kind, "T" | "t" | "W" | "w") {
                    return None;
                }
                let start = u64::from_str_radix(address, 16).ok()?;
                let size = u64::from_str_radix(size, 16).ok()?;
                Some((start, start + size.max(1), name.to_string()))
            })
            .collect();
        functions.sort();
        Symbols { functions }
    }

    /// The function containing link-time address `address`.
    pub fn function_at(&self, address: u64) -> Option<&str> {
        let after = self
            .functions
            .partition_point(|&(start, _, _)| start <= address);
        let (_, end, name) = self.functions.get(after.checked_sub(1)?)?;
        (address < *end).then_some(name.as_str())
    }
}

/// The arcs of a GNU `gmon.out` written by glibc for a non-PIE executable: (from, self, count).
/// Histogram and basic-block records are skipped.
pub fn gnu_gmon_arcs(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
    assert!(bytes.len() >= 20 && &bytes[..4] == b"gmon", "not a GNU gmon.out");
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let mut arcs = Vec::new();
    let mut at = 20;
    while at < bytes.len() {
        let tag = bytes[at];
        at += 1;
        match tag {
            0 => {
                // lowpc, highpc, hist_size, prof_rate, dimen[15], dimen_abbrev, then the bins.
                let bins = u32_at(at + 16) as usize;
                at += 8 + 8 + 4 + 4 + 15 + 1 + 2 * bins;
            }
            1 => {
                arcs.push((u64_at(at), u64_at(at + 8), u64::from(u32_at(at + 16))));
                at += 20;
            }
            2 => {
                let count = u32_at(at) as usize;
                at += 4 + 16 * count;
            }
            other => panic!("unknown GNU gmon record tag {other} at offset {}", at - 1),
        }
    }
    arcs
}

/// Reduces address arcs to a call graph of function names; arcs whose caller or callee is not a
/// function of `keep` are left out (calls from libc start-up code or the dynamic linker).
pub fn call_graph(
    arcs: impl IntoIterator<Item = (Option<String>, Option<String>, u64)>,
    keep: &dyn Fn(&str) -> bool,
) -> CallGraph {
    let mut graph = CallGraph::new();
    for (caller, callee, count) in arcs {
        if let (Some(caller), Some(callee)) = (caller, callee)
            && keep(&caller)
            && keep(&callee)
        {
            *graph.entry((caller, callee)).or_default() += count;
        }
    }
    graph
}

/// Calls per callee function, summed over its callers.
pub fn calls_per_function(graph: &CallGraph) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for ((_, callee), count) in graph {
        *calls.entry(callee.clone()).or_default() += count;
    }
    calls
}
