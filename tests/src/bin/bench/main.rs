//! The benchmark harness: runs mslprof side by side with its anchors (plain runs, glibc `-pg`, GNU gprof) and
//! rewrites BENCHMARKS.md with medians and ratios.
//!
//! Run it with `cargo run --release -p mslprof-tests --bin bench` (add `-- --quick` for a fast smoke run with
//! fewer repetitions and smaller inputs, `-- --full` for the slow large-input gprof comparisons, `-- --only
//! calls|plt|run|sampling|rate|stacks|unwinders|analysis|fork` to run one suite and replace only its sections of BENCHMARKS.md). It builds the
//! release runtime and analyzer itself.
//!
//! Every mslprof run profiles every module by leaving `LD_PROFILE` unset (which means ALL): any value of that
//! variable also makes glibc's ld.so send each PLT call through its own profiling trampoline, a cost that is
//! not mslprof's (runtime/README.md).

mod analysis;
mod calls;
mod fixtures;
mod fork;
mod measure;
mod plt;
mod rate;
mod report;
mod runcost;
mod sampling;
mod stacks;
mod unwinders;
mod workingset;

use std::path::{Path, PathBuf};
use std::process::Command;

/// How much work one invocation of the harness does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Quick,
    Normal,
    Full,
}

/// Everything a suite needs to know about where things are.
pub struct Env {
    pub scale: Scale,
    pub runs: usize,
    pub workspace: PathBuf,
    pub runtime: PathBuf,
    pub analyzer: PathBuf,
    pub scratch: PathBuf,
}

impl Env {
    /// The suite's own folder `name` in the scratch folder, made if need be.
    pub fn folder(&self, name: &str) -> Result<PathBuf, String> {
        let dir = self.scratch.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        Ok(dir)
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut scale = Scale::Normal;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => scale = Scale::Quick,
            "--full" => scale = Scale::Full,
            "--only" => only = args.next(),
            "--synthetic-gmon" => return analysis::synthetic_gmon_main(&args.collect::<Vec<_>>()),
            "-h" | "--help" => {
                println!(
                    "usage: bench [--quick|--full] [--only calls|plt|run|sampling|rate|stacks|unwinders|analysis|fork]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace")?
        .to_path_buf();
    eprintln!("bench: building the release runtime and analyzer");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "-p",
            "mslprof-runtime",
            "-p",
            "mslprof-analyzer",
            "-p",
            "mslprof-audit",
        ])
        .current_dir(&workspace)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err("cargo build --release failed".into());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("release");
    let scratch = std::env::temp_dir().join(format!("mslprof-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let env = Env {
        scale,
        runs: match scale {
            Scale::Quick => 3,
            _ => 7,
        },
        workspace: workspace.clone(),
        runtime: target.join("libmslprof.so"),
        analyzer: target.join("mslprof"),
        scratch: scratch.clone(),
    };
    let mut sections = Vec::new();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    // The suites that report peak RSS run first: a child's ru_maxrss starts from the harness's own
    // high-water mark, which the call-counting suite raises (it reads profiles of a million arcs).
    let mut measured_memory = Vec::new();
    if wanted("sampling") {
        eprintln!("bench: sampling overhead and RSS");
        measured_memory.push(sampling::run(&env)?);
    }
    if wanted("rate") {
        eprintln!("bench: sampling rate achieved and its cost at 100, 1000 and 4000 Hz");
        sections.push(rate::run(&env)?);
    }
    if wanted("stacks") {
        eprintln!("bench: call stacks: capture time per sample and overhead at 100 Hz and 1 kHz");
        sections.push(stacks::run(&env)?);
    }
    if wanted("unwinders") {
        eprintln!("bench: the runtime's stack walker against framehop on the same stacks");
        sections.push(unwinders::run(&env)?);
    }
    if wanted("analysis") {
        eprintln!("bench: report generation, mslprof against GNU gprof");
        measured_memory.push(analysis::run(&env)?);
    }
    if wanted("calls") {
        eprintln!("bench: call counting (fib, large working sets, real programs)");
        sections.extend(calls::run(&env)?);
    }
    if wanted("plt") {
        eprintln!("bench: counting calls through the PLT (a C loop, rustc with LD_PROFILE=ALL)");
        sections.extend(plt::run(&env)?);
    }
    if wanted("run") {
        eprintln!("bench: what `mslprof run` itself costs, against a hand-written run");
        sections.push(runcost::run(&env)?);
    }
    if wanted("fork") {
        eprintln!("bench: what a fork costs (fork + _exit + waitpid, plain and -pg)");
        sections.push(fork::run(&env)?);
    }
    sections.extend(measured_memory);
    let out = workspace.join("BENCHMARKS.md");
    // With --only, the other suites' sections of the existing file are kept as they are.
    let kept = match &only {
        Some(_) => std::fs::read_to_string(&out).unwrap_or_default(),
        None => String::new(),
    };
    let text = report::render(&env, &sections, &kept);
    std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("bench: wrote {}", out.display());
    Ok(())
}
