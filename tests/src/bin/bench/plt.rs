//! The suite `plt`: what counting calls through the PLT costs (issue 10). A C program calling an
//! uninstrumented library function N times through the PLT, plain, counted (`LD_AUDIT=libmslprof_audit.so`
//! with the runtime) and with `MSLPROF_PLT=0`, as per-call slopes; and rustc `-O` on a generated crate of 300
//! small functions under `LD_PROFILE=ALL` with PLT counting on and off, against the plain run's CPU time.

use std::path::{Path, PathBuf};

use crate::Env;
use crate::Scale;
use crate::calls::Spread;
use crate::measure::{Invocation, interleaved_figures, round_order, run_once};
use crate::report::Section;

/// The ways of running a program that the tables compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    /// Runtime and audit module, PLT counting on.
    Counted,
    /// Runtime and audit module with `MSLPROF_PLT=0`.
    Off,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::Counted, Mode::Off];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Counted => "PLT counted",
            Mode::Off => "MSLPROF_PLT=0",
        }
    }

    fn invocation(self, env: &Env, program: &Path, dir: &Path) -> Invocation {
        let inv = Invocation::new(self.label(), program, dir);
        let with_runtime = || {
            inv.clone()
                .env("LD_AUDIT", audit_library(env).to_string_lossy())
                .env("LD_PRELOAD", env.runtime.to_string_lossy())
        };
        match self {
            Mode::Plain => inv,
            Mode::Counted => with_runtime(),
            Mode::Off => with_runtime().env("MSLPROF_PLT", "0"),
        }
    }
}

/// libmslprof_audit.so, built next to the runtime.
pub fn audit_library(env: &Env) -> PathBuf {
    env.runtime.with_file_name("libmslprof_audit.so")
}

/// "2.31 (2.10–2.52)": median and range.
fn spread(values: &[f64]) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(min), Some(median), Some(max)) => format!("{median:.2} ({min:.2}–{max:.2})"),
        _ => "n/a".into(),
    }
}

fn cc(dir: &Path, args: &[&str]) -> Result<(), String> {
    mslprof_tests::try_compile("cc", dir, args)
}

/// Calls into libleaf.so that the `gmon.out` of `dir` counted (every arc into that module).
fn calls_into_leaf(dir: &Path) -> Result<u64, String> {
    let gmon = dir.join("gmon.out");
    let bytes = std::fs::read(&gmon).map_err(|e| format!("{}: {e}", gmon.display()))?;
    let profile = mslprof_format::read(&bytes, mslprof_format::GnuTarget::default())
        .map_err(|e| format!("{}: {e}", gmon.display()))?;
    Ok(profile
        .modules
        .iter()
        .filter(|m| m.path.ends_with(b"/libleaf.so"))
        .flat_map(|m| &m.arcs)
        .map(|a| a.count)
        .sum())
}

/// `plt_main` (tests/fixtures/plt) calling libleaf.so's `plt_leaf` through the PLT: per-call slopes.
fn leaf_section(env: &Env) -> Result<Section, String> {
    let dir = env.scratch.join("plt-leaf");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plt");
    let leaf = sources.join("leaf.c");
    let main = sources.join("plt_main.c");
    cc(
        &dir,
        &[
            "-O2",
            "-shared",
            "-fPIC",
            "-o",
            "libleaf.so",
            &leaf.to_string_lossy(),
        ],
    )?;
    cc(
        &dir,
        &[
            "-O2",
            "-o",
            "plt_main",
            &main.to_string_lossy(),
            "-L.",
            "-lleaf",
            "-ldl",
            "-Wl,-rpath,$ORIGIN",
        ],
    )?;
    let program = dir.join("plt_main");
    let (small, large): (u64, u64) = (1_000_000, 11_000_000);
    let trials = match env.scale {
        Scale::Quick => 5,
        _ => 21,
    };
    let invs: Vec<(Invocation, Invocation)> = MODES
        .iter()
        .map(|mode| {
            let base = mode.invocation(env, &program, &dir);
            (
                base.clone().arg(small.to_string()),
                base.arg(large.to_string()),
            )
        })
        .collect();
    // Per mode: the absolute slope (ns per loop iteration with its call) of every trial.
    let mut slopes = vec![Vec::new(); MODES.len()];
    for trial in 0..trials {
        for i in round_order(trial, invs.len()) {
            let (small_run, large_run) = &invs[i];
            let s = run_once(small_run)?.cpu.as_secs_f64();
            let l = run_once(large_run)?.cpu.as_secs_f64();
            slopes[i].push((l - s) / (large - small) as f64 * 1e9);
            if MODES[i] == Mode::Counted {
                // The loop's calls of plt_leaf, and main's one call of plt_leaf_address.
                let counted = calls_into_leaf(&dir)?;
                if counted != large + 1 {
                    return Err(format!(
                        "PLT counting counted {counted} calls into libleaf.so, not {}",
                        large + 1
                    ));
                }
            }
        }
    }
    let plain = slopes[Mode::Plain as usize].clone();
    let mut rows = Vec::new();
    for (i, mode) in MODES.iter().enumerate() {
        let over: Vec<f64> = slopes[i].iter().zip(&plain).map(|(s, p)| s - p).collect();
        rows.push(vec![
            mode.label().to_string(),
            invs[i].1.shell_line(),
            spread(&slopes[i]),
            if *mode == Mode::Plain {
                String::new()
            } else {
                spread(&over)
            },
        ]);
    }
    Ok(Section {
        title: "Call counting: calls through the PLT".into(),
        intro: format!(
            "`tests/fixtures/plt/plt_main.c` calling `plt_leaf` of `tests/fixtures/plt/leaf.c` (both `cc -O2`, no `-pg`) through the PLT. \
             ns per call, median (min–max) over {trials} interleaved trials, each the CPU-time slope between {small} and {large} calls; \
             the overhead column subtracts the plain run's slope of the same trial."
        ),
        header: ["mode", "command", "ns/call", "ns/call over plain"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec![
            format!("Every counted run's gmon.out was checked: exactly {large} + 1 calls into libleaf.so (the loop's and main's call of `plt_leaf_address`)."),
            "Target: the counted overhead no more than mslprof's mcount hit path (the fib table's one-thread row).".into(),
        ],
    })
}

/// A crate of 300 small functions calling each other, for rustc to compile.
fn generated_crate(dir: &Path) -> Result<PathBuf, String> {
    let mut text = String::from("//! Generated by the bench suite `plt`.\n\n");
    for i in 0..300 {
        let next = if i == 0 {
            "x".to_string()
        } else {
            format!("f{}(x.wrapping_add({i}))", i - 1)
        };
        text.push_str(&format!(
            "#[inline(never)]\npub fn f{i}(x: u64) -> u64 {{\n    let v: Vec<u64> = (0..(x % 7)).collect();\n    \
             {next}.wrapping_mul(3) ^ v.iter().sum::<u64>()\n}}\n\n"
        ));
    }
    let path = dir.join("gen300.rs");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Static TLS surplus for rustc under `LD_AUDIT` (see [`rustc_section`]).
const STATIC_TLS_TUNABLE: &str = "glibc.rtld.optional_static_tls=65536";

/// The rustc binary itself (not a rustup proxy, which would be what the runtime starts under).
fn real_rustc() -> Result<PathBuf, String> {
    let output = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Ok(Path::new(&sysroot).join("bin/rustc"))
}

/// rustc -O on the generated crate: CPU time under `LD_PROFILE=ALL` with PLT counting on and off.
fn rustc_section(env: &Env) -> Result<Section, String> {
    let dir = env.scratch.join("plt-rustc");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let source = generated_crate(&dir)?;
    let rustc = real_rustc()?;
    // Per-round ratios spread over ±25 % on a shared machine: the median needs many rounds to settle.
    let runs = match env.scale {
        Scale::Quick => 3,
        _ => 31,
    };
    let invs: Vec<Invocation> = MODES
        .iter()
        .map(|mode| {
            // With any LD_AUDIT module, ld.so sizes the static TLS block before it loads the program's
            // libraries, so their initial-exec TLS must fit in the surplus (glibc BZ #31991):
            // librustc_driver's 23 KiB does not fit in the default 512 bytes. Every mode gets the same.
            let inv = mode
                .invocation(env, &rustc, &dir)
                .env("GLIBC_TUNABLES", STATIC_TLS_TUNABLE)
                .args([
                    "-O",
                    "--crate-type",
                    "lib",
                    "--crate-name",
                    "gen300",
                    &source.to_string_lossy(),
                ]);
            if *mode == Mode::Plain {
                inv
            } else {
                inv.env("LD_PROFILE", "ALL")
            }
        })
        .collect();
    let figures = interleaved_figures(&invs, runs)?;
    let cpu = |mode: Mode| -> Vec<f64> {
        figures[mode as usize]
            .iter()
            .map(|f| f.cpu.as_secs_f64())
            .collect()
    };
    let plain = cpu(Mode::Plain);
    let rows = MODES
        .iter()
        .zip(&invs)
        .map(|(mode, inv)| {
            let times = cpu(*mode);
            // Each round's run against the plain run of the same round.
            let ratios: Vec<f64> = times.iter().zip(&plain).map(|(t, p)| t / p).collect();
            vec![
                mode.label().to_string(),
                inv.shell_line(),
                format!("{:.0}", Spread::of(&times).median * 1e3),
                if *mode == Mode::Plain {
                    String::new()
                } else {
                    Spread::of(&ratios).show()
                },
            ]
        })
        .collect();
    Ok(Section {
        title: "Call counting: rustc with LD_PROFILE=ALL and PLT counting".into(),
        intro: format!(
            "rustc `-O` compiling a generated library crate of 300 small functions (`tests/src/bin/bench/plt.rs`), \
             median CPU time over {runs} interleaved rounds; the ratio to plain is taken within each round, median (min–max) over the rounds."
        ),
        header: ["mode", "command", "CPU ms", "vs plain (median, min–max)"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec![
            format!(
                "Every run has `GLIBC_TUNABLES={STATIC_TLS_TUNABLE}`: under any `LD_AUDIT` module, ld.so sizes the static TLS block before loading the program's libraries (glibc BZ #31991), and librustc_driver's 23 KiB of initial-exec TLS does not fit in the default surplus (\"cannot allocate memory in static TLS block\")."
            ),
            "Targets: PLT counted ≤ 1.10×, MSLPROF_PLT=0 ≤ 1.05× the plain run.".into(),
        ],
    })
}

pub fn run(env: &Env) -> Result<Vec<Section>, String> {
    Ok(vec![leaf_section(env)?, rustc_section(env)?])
}
