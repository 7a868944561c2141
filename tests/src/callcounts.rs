//! Helpers of the call-count tests: build the C fixtures in `fixtures/callcounts`, run them under
//! glibc's `-pg` or under `libmslprof.so`, and reduce both kinds of profile to the same call graph
//! of function names, so the two can be compared exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// [`common_flags`] plus `-pg`.
pub fn pg_flags(optimization: &str) -> Vec<String> {
    let mut flags = common_flags(optimization);
    flags.push("-pg".into());
    flags
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

/// The oracle sources split across modules: `libccc.so`, `libccb.so`, `libcca.so` and the executable `app`
/// linked with all three, each built with `flags`. Returns the executable.
pub fn build_oracle_app(workspace: &Workspace, flags: &[String]) -> PathBuf {
    for name in ["ccc", "ccb", "cca"] {
        build_library(workspace, name, &[&format!("{name}.c")], flags);
    }
    build_program(workspace, "app", &["main.c"], &["cca", "ccb", "ccc"], flags)
}

/// Runs `command` and panics unless it exits 0; returns its standard output.
pub fn run_ok(command: &mut Command) -> String {
    String::from_utf8_lossy(&run_succeeded(command).stdout).into_owned()
}

/// Runs `command` and panics unless it exits 0; returns what it wrote.
fn run_succeeded(command: &mut Command) -> Output {
    let output = crate::run(command);
    crate::assert_success(&output, &format!("{command:?}"));
    output
}

/// Builds `program` from `<program>.c` (a SIGALRM handler calling into libccs.so while the main loop does)
/// against libccs.so, both with `flags`, runs it under the runtime, and returns how many signals it says it
/// handled (the second word of its output) with the profile it left.
pub fn run_signal_fixture(
    workspace: &Workspace,
    program: &str,
    flags: &[String],
) -> (u64, Profile) {
    let (handled, profile, _) = run_signal_fixture_preloading(workspace, program, flags, None);
    (handled, profile)
}

/// [`run_signal_fixture`] with `first` (a library) preloaded before the runtime; also returns what the run wrote
/// on stderr.
pub fn run_signal_fixture_preloading(
    workspace: &Workspace,
    program: &str,
    flags: &[String],
    first: Option<&Path>,
) -> (u64, Profile, String) {
    build_library(workspace, "ccs", &["ccs.c"], flags);
    let exe = build_program(
        workspace,
        program,
        &[&format!("{program}.c")],
        &["ccs"],
        flags,
    );
    let mut command = workspace.command_with_runtime(&exe);
    if let Some(first) = first {
        command.env(
            "LD_PRELOAD",
            format!("{} {}", first.display(), crate::runtime_library().display()),
        );
    }
    let output = run_succeeded(&mut command);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let handled: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {stdout:?}"));
    (
        handled,
        crate::read_profile(&workspace.join("gmon.out")),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Checks a run of the hot fixture (hot.c, `alone` or `thread`): its output (the sites of hot_leaf,
/// cold_leaf and crowded, the rounds of each thread, the signals handled) and the exact counts of every arc
/// between its functions in `profile`. Returns what it says the three sites are (e.g. "jump call call").
pub fn assert_hot_counts_exact(
    stdout: &str,
    profile: &Profile,
    thread: bool,
    what: &str,
) -> String {
    const NAMES: [&str; 8] = [
        "main",
        "second",
        "round_of_calls",
        "hot_leaf",
        "cold_leaf",
        "crowd",
        "crowded",
        "on_alarm",
    ];
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 6, "{what}");
    let [rounds, second_rounds, handled] =
        [3, 4, 5].map(|i| fields[i].parse::<u64>().expect("a number"));
    assert!(handled > 0, "{what}");
    assert_eq!(second_rounds > 0, thread, "{what}");
    let all_rounds = rounds + second_rounds;
    // Each thread calls cold_leaf in its rounds 0, COLD_EVERY, 2 COLD_EVERY...
    let cold_calls = rounds.div_ceil(1000) + second_rounds.div_ceil(1000);
    let expected: CallGraph = [
        (("main", "round_of_calls"), rounds),
        (("second", "round_of_calls"), second_rounds),
        (("round_of_calls", "hot_leaf"), 1000 * all_rounds),
        (("round_of_calls", "cold_leaf"), cold_calls),
        (("round_of_calls", "crowd"), all_rounds),
        (("crowd", "crowded"), 400 * all_rounds),
        (("on_alarm", "hot_leaf"), 10 * handled),
    ]
    .into_iter()
    .filter(|&(_, count)| count > 0)
    .map(|((caller, callee), count)| ((caller.to_string(), callee.to_string()), count))
    .collect();
    let mut counted = profile_call_graph(profile, &|name| NAMES.contains(&name));
    // main's call of second (through pthread_create) is not a direct call: whatever it is, keep it out.
    counted.retain(|(caller, callee), _| !(caller == "main" && callee == "second"));
    assert_eq!(counted, expected, "{what}");
    assert_eq!(profile.header.dropped_arcs, 0, "{what}");
    fields[..3].join(" ")
}

/// Builds the threads fixture (threads.c against `-pg -O2` libcct.so), runs it under the runtime with `args`
/// (none: its defaults) and returns the profile with its call graph between `thread_body` and `t_work`.
pub fn run_threads_fixture(args: &[&str]) -> (Profile, CallGraph) {
    let workspace = Workspace::new();
    let flags = pg_flags("-O2");
    build_library(&workspace, "cct", &["cct.c"], &flags);
    let exe = build_program(&workspace, "threads", &["threads.c"], &["cct"], &flags);
    run_ok(workspace.command_with_runtime(&exe).args(args));
    let profile = crate::read_profile(&workspace.join("gmon.out"));
    let graph = profile_call_graph(&profile, &|name| name == "thread_body" || name == "t_work");
    (profile, graph)
}

/// Function symbols of one ELF file: address-sorted (start, end, name).
#[derive(Debug, Default)]
pub struct Symbols {
    functions: Vec<(u64, u64, String)>,
}

impl Symbols {
    /// Reads the defined function symbols of `file` (`.symtab`, or the dynamic symbols of a stripped file such
    /// as libc.so.6; link-time addresses).
    pub fn of(file: &Path) -> Symbols {
        use object::{Object, ObjectSymbol, SymbolKind};
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let elf =
            object::File::parse(&*bytes).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let symbols: Vec<_> = match elf.symbols().next() {
            Some(_) => elf.symbols().collect(),
            None => elf.dynamic_symbols().collect(),
        };
        let mut functions: Vec<(u64, u64, String)> = symbols
            .into_iter()
            .filter(|symbol| symbol.kind() == SymbolKind::Text && symbol.is_definition())
            .filter_map(|symbol| {
                let name = symbol.name().ok()?.to_string();
                let start = symbol.address();
                Some((start, start + symbol.size().max(1), name))
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
                    name(arc.caller_key, arc.caller_address.0),
                    name(module.key, arc.callee_address.0),
                    arc.count,
                )
            })
        }),
        keep,
    )
}

/// The call graph of a glibc `gmon.out` of the non-PIE executable `exe`, read with the
/// format-spec GNU reader.
pub fn gnu_call_graph(exe: &Path, gmon: &[u8], keep: &dyn Fn(&str) -> bool) -> CallGraph {
    let profile = mslprof_format::read(gmon, mslprof_format::GnuTarget::default())
        .unwrap_or_else(|e| panic!("glibc gmon.out: {e}"));
    assert!(matches!(
        profile.format,
        mslprof_format::SourceFormat::Gnu { .. }
    ));
    let symbols = Symbols::of(exe);
    call_graph(
        profile
            .modules
            .iter()
            .flat_map(|module| &module.arcs)
            .map(|arc| {
                (
                    symbols
                        .function_at(arc.caller_address.0)
                        .map(str::to_string),
                    symbols
                        .function_at(arc.callee_address.0)
                        .map(str::to_string),
                    arc.count,
                )
            }),
        keep,
    )
}
