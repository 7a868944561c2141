//! Helpers of the call-count tests: build the C fixtures in `fixtures/callcounts`, run them under
//! glibc's `-pg` or under `libmslprof.so`, and reduce both kinds of profile to the same call graph
//! of function names, so the two can be compared exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_format::model::{Profile, UNKNOWN_KEY};

use crate::Workspace;

/// (caller function, callee function) → calls.
pub type CallGraph = BTreeMap<(String, String), u64>;

/// The directory holding the call-count fixtures' sources.
pub fn fixture_dir() -> PathBuf {
    crate::fixtures_dir("callcounts")
}

/// The path of fixture source `name`.
pub fn source(name: &str) -> PathBuf {
    fixture_dir().join(name)
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

/// Builds `lib<name>.so` in the workspace from fixture sources with `flags`.
pub fn build_library(workspace: &Workspace, name: &str, sources: &[&str], flags: &[String]) {
    let mut args: Vec<String> = flags.to_vec();
    args.extend(["-shared", "-fPIC", "-o"].map(String::from));
    args.push(format!("lib{name}.so"));
    args.extend(sources.iter().map(|s| source(s).display().to_string()));
    workspace.cc(&args);
}

/// Builds executable `exe` in the workspace from fixture sources with `flags`, linked with
/// `lib<name>.so` for each of `libraries` (found at run time through `$ORIGIN`).
pub fn build_program(
    workspace: &Workspace,
    exe: &str,
    sources: &[&str],
    libraries: &[&str],
    flags: &[String],
) -> PathBuf {
    let mut args: Vec<String> = flags.to_vec();
    args.push("-o".into());
    args.push(exe.into());
    args.extend(sources.iter().map(|s| source(s).display().to_string()));
    args.push("-L.".into());
    args.push("-Wl,-rpath,$ORIGIN".into());
    args.extend(libraries.iter().map(|l| format!("-l{l}")));
    args.push("-pthread".into());
    workspace.cc(&args);
    workspace.join(exe)
}

/// Runs `command` and panics unless it exits 0; returns its standard output.
pub fn run_ok(command: &mut Command) -> String {
    let output = crate::run(command);
    assert!(
        output.status.success(),
        "{command:?} failed: {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
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
    assert!(
        bytes.len() >= 20 && &bytes[..4] == b"gmon",
        "not a GNU gmon.out"
    );
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

/// The call graph of an mslprof profile: every arc of every module, its callee named from that
/// module's file and its caller from the file of the module its key names.
pub fn profile_call_graph(profile: &Profile, keep: &dyn Fn(&str) -> bool) -> CallGraph {
    let mut symbols: BTreeMap<u32, Symbols> = BTreeMap::new();
    for module in &profile.modules {
        let path = Path::new(std::str::from_utf8(&module.path).unwrap_or(""));
        if !module.path.is_empty() && path.exists() {
            symbols.insert(module.key, Symbols::of(path));
        }
    }
    let name = |key: u32, address: u64| -> Option<String> {
        if key == UNKNOWN_KEY {
            return None;
        }
        symbols.get(&key)?.function_at(address).map(str::to_string)
    };
    call_graph(
        profile.modules.iter().flat_map(|module| {
            module.arcs.iter().map(move |arc| {
                (
                    name(arc.caller_key, arc.caller_address),
                    name(module.key, arc.callee_address),
                    arc.count,
                )
            })
        }),
        keep,
    )
}

/// The call graph of a glibc `gmon.out` of the non-PIE executable `exe`.
pub fn gnu_call_graph(exe: &Path, gmon: &[u8], keep: &dyn Fn(&str) -> bool) -> CallGraph {
    let symbols = Symbols::of(exe);
    call_graph(
        gnu_gmon_arcs(gmon).into_iter().map(|(from, to, count)| {
            (
                symbols.function_at(from).map(str::to_string),
                symbols.function_at(to).map(str::to_string),
                count,
            )
        }),
        keep,
    )
}
