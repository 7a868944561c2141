//! The suite `plt`: what counting calls through the PLT costs (issue 10). A C program calling an
//! uninstrumented library function N times through the PLT, plain, counted (`LD_AUDIT=libmslprof_audit.so`
//! with the runtime) and with `MSLPROF_PLT=0`, as per-call slopes, from one call site and from 8 192 scattered
//! ones; rustc `-O` on a generated crate of 300 small functions under `LD_PROFILE=ALL` with PLT counting on
//! and off, against the plain run's CPU time; and two call-heavy programs nobody here wrote, Python with
//! SQLite and `openssl speed`, the same three ways and with PLT counting but no call site rewritten
//! (`MSLPROF_PLT_SITES=0`), and what their modules weigh in the report with PLT counting on and off.

use std::path::{Path, PathBuf};

use crate::Env;
use crate::Scale;
use crate::calls::Spread;
use crate::measure::{Invocation, RunFigures, round_order, run_once, run_with_output};
use crate::report::Section;

/// The ways of running a program that the tables compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Plain,
    /// Runtime and audit module, PLT counting on.
    Counted,
    /// Runtime and audit module with `MSLPROF_PLT=0`.
    Off,
    /// Runtime and audit module, PLT counting on, no call site rewritten (`MSLPROF_PLT_SITES=0`).
    SitesKept,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::Counted, Mode::Off];
/// The modes of the programs nobody here wrote: also PLT counting without rewritten call sites.
const PROGRAM_MODES: [Mode; 4] = [Mode::Plain, Mode::Counted, Mode::Off, Mode::SitesKept];

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Counted => "PLT counted",
            Mode::Off => "MSLPROF_PLT=0",
            Mode::SitesKept => "PLT counted, no site rewritten",
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
            Mode::SitesKept => with_runtime().env("MSLPROF_PLT_SITES", "0"),
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

/// Builds libleaf.so (tests/fixtures/plt/leaf.c) into `dir`.
fn build_leaf(dir: &Path) -> Result<(), String> {
    let leaf = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plt/leaf.c");
    cc(
        dir,
        &[
            "-O2",
            "-shared",
            "-fPIC",
            "-o",
            "libleaf.so",
            &leaf.to_string_lossy(),
        ],
    )
}

/// Builds `program` in `dir` from `source` (`-O2`), linked with libleaf.so.
fn build_leaf_caller(dir: &Path, source: &Path, program: &str) -> Result<(), String> {
    let source = source.to_string_lossy();
    cc(
        dir,
        &[
            "-O2",
            "-o",
            program,
            &source,
            "-L.",
            "-lleaf",
            "-ldl",
            "-Wl,-rpath,$ORIGIN",
        ],
    )
}

/// The rows of a PLT table: each mode's per-call CPU-time slope of `program` between `small` and `large`
/// calls (its one argument), over `trials` interleaved trials, and the slope over the plain run's of the same
/// trial; every counted run's profile must count `large + extra_calls` calls into libleaf.so.
fn plt_rows(
    env: &Env,
    dir: &Path,
    program: &Path,
    (small, large): (u64, u64),
    trials: usize,
    extra_calls: u64,
) -> Result<Vec<Vec<String>>, String> {
    let invs: Vec<(Invocation, Invocation)> = MODES
        .iter()
        .map(|mode| {
            let base = mode.invocation(env, program, dir);
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
                let counted = calls_into_leaf(dir)?;
                if counted != large + extra_calls {
                    return Err(format!(
                        "PLT counting counted {counted} calls into libleaf.so, not {}",
                        large + extra_calls
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
    Ok(rows)
}

/// The columns of both PLT tables.
fn plt_header() -> Vec<String> {
    ["mode", "command", "ns/call", "ns/call over plain"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// How the PLT tables' figures are taken, for their introductions.
fn slope_method(trials: usize, small: u64, large: u64) -> String {
    format!(
        "ns per call, median (min–max) over {trials} interleaved trials, each the CPU-time slope between {small} and {large} calls; \
         the overhead column subtracts the plain run's slope of the same trial."
    )
}

/// Trials of each PLT table.
fn plt_trials(env: &Env) -> usize {
    match env.scale {
        Scale::Quick => 5,
        _ => 21,
    }
}

/// `plt_main` (tests/fixtures/plt) calling libleaf.so's `plt_leaf` through the PLT: per-call slopes.
fn leaf_section(env: &Env) -> Result<Section, String> {
    let dir = env.folder("plt-leaf")?;
    build_leaf(&dir)?;
    let main = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/plt/plt_main.c");
    build_leaf_caller(&dir, &main, "plt_main")?;
    let (small, large): (u64, u64) = (1_000_000, 11_000_000);
    let trials = plt_trials(env);
    // The loop's calls of plt_leaf, and main's one call of plt_leaf_address.
    let rows = plt_rows(env, &dir, &dir.join("plt_main"), (small, large), trials, 1)?;
    Ok(Section {
        title: "Call counting: calls through the PLT".into(),
        intro: format!(
            "`tests/fixtures/plt/plt_main.c` calling `plt_leaf` of `tests/fixtures/plt/leaf.c` (both `cc -O2`, no `-pg`) through the PLT. {}",
            slope_method(trials, small, large)
        ),
        header: plt_header(),
        rows,
        notes: vec![
            format!("Every counted run's gmon.out was checked: exactly {large} + 1 calls into libleaf.so (the loop's and main's call of `plt_leaf_address`)."),
            "Target: the counted overhead no more than mslprof's mcount hit path (the fib table's one-thread row).".into(),
        ],
    })
}

/// Call sites of [`scattered_sites_source`].
const SCATTERED_SITES: usize = 8192;

/// A program whose calls of `plt_leaf` come from [`SCATTERED_SITES`] call sites, one in each of as many small
/// functions, picked in pseudo-random order: `main(n)` makes n calls, about as many from every site.
fn scattered_sites_source() -> String {
    let mut c = String::from(
        "/* Generated by the bench suite `plt`. */\n#include <stdio.h>\n#include <stdlib.h>\nint plt_leaf(int x);\n",
    );
    for i in 0..SCATTERED_SITES {
        c.push_str(&format!(
            "__attribute__((noinline)) int c{i}(int x) {{ volatile int v = x ^ {i}; return plt_leaf(v) + 1; }}\n"
        ));
    }
    c.push_str("static int (*const callers[])(int) = {");
    for i in 0..SCATTERED_SITES {
        c.push_str(&format!("c{i},"));
    }
    c.push_str("};\n");
    c.push_str(&format!(
        "int main(int argc, char **argv) {{\n long n = argc > 1 ? atol(argv[1]) : 1000000;\n unsigned s = 1;\n long sum = 0;\n \
         for (long k = 0; k < n; k++) {{\n  s = s * 1103515245u + 12345u;\n  sum += callers[(s >> 8) % {SCATTERED_SITES}]((int)k);\n }}\n \
         printf(\"%ld\\n\", sum);\n return 0;\n}}\n"
    ));
    c
}

/// [`scattered_sites_source`]'s program: per-call slopes, the shape of rustc's calls into its allocator
/// (thousands of call sites, none of them hot).
fn scattered_sites_section(env: &Env) -> Result<Section, String> {
    let dir = env.folder("plt-scattered")?;
    build_leaf(&dir)?;
    let source = dir.join("scattered_sites.c");
    std::fs::write(&source, scattered_sites_source())
        .map_err(|e| format!("{}: {e}", source.display()))?;
    build_leaf_caller(&dir, &source, "scattered_sites")?;
    let (small, large): (u64, u64) = (2_000_000, 22_000_000);
    let trials = plt_trials(env);
    let rows = plt_rows(
        env,
        &dir,
        &dir.join("scattered_sites"),
        (small, large),
        trials,
        0,
    )?;
    Ok(Section {
        title: format!("Call counting: calls through the PLT from {SCATTERED_SITES} call sites"),
        intro: format!(
            "A generated program (`scattered_sites_source` in `tests/src/bin/bench/plt.rs`, `cc -O2`) calling `plt_leaf` of `tests/fixtures/plt/leaf.c` through the PLT \
             from {SCATTERED_SITES} call sites, one in each of as many small functions, picked in pseudo-random order: the shape of rustc's calls into its allocator, \
             thousands of sites none of which is hot enough for the look to rewrite it, and a callee with too many callers for its audit stub to be redirected. {}",
            slope_method(trials, small, large)
        ),
        header: plt_header(),
        rows,
        notes: vec![
            format!("Every counted run's gmon.out was checked: exactly {large} calls into libleaf.so."),
            "Each counted call reads and writes its call site's entry of the thread's cache, an entry on a line of its own: the hit path of the table above, with the entries of 8 192 sites (512 KiB of lines) beyond the first-level data cache.".into(),
        ],
    })
}

/// A crate of 300 small functions calling each other, for rustc to compile.
pub fn generated_crate(dir: &Path) -> Result<PathBuf, String> {
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

/// rustc's arguments to compile the crate of [`generated_crate`], written into `dir`: `-O`, a library.
pub fn generated_crate_args(dir: &Path) -> Result<Vec<String>, String> {
    let source = generated_crate(dir)?;
    Ok(["-O", "--crate-type", "lib", "--crate-name", "gen300"]
        .iter()
        .map(|a| a.to_string())
        .chain([source.to_string_lossy().into_owned()])
        .collect())
}

/// Static TLS surplus for rustc under `LD_AUDIT` (see [`rustc_section`]).
const STATIC_TLS_TUNABLE: &str = "glibc.rtld.optional_static_tls=65536";

/// The rustc binary itself (not a rustup proxy, which would be what the runtime starts under).
pub fn real_rustc() -> Result<PathBuf, String> {
    mslprof_tests::real_rustc()
        .ok_or_else(|| "rustc (through `rustc --print sysroot`) not found".into())
}

/// rustc -O on the generated crate: CPU time under `LD_PROFILE=ALL` with PLT counting on and off.
fn rustc_section(env: &Env) -> Result<Section, String> {
    let dir = env.folder("plt-rustc")?;
    let args = generated_crate_args(&dir)?;
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
                .args(args.clone());
            if *mode == Mode::Plain {
                inv
            } else {
                inv.env("LD_PROFILE", "ALL")
            }
        })
        .collect();
    let rows = ratio_rows(&invs, runs, cpu_seconds, show_ms)?;
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
            "Targets: PLT counted ≤ 1.03× the plain run (issue 35), MSLPROF_PLT=0 ≤ 1.05×.".into(),
        ],
    })
}

/// The Python script of [`python_sqlite_section`]: 200 000 inserts into an indexed in-memory table, then a
/// GROUP BY.
const SQLITE_SCRIPT: &str = "\
import sqlite3
con = sqlite3.connect(':memory:')
cur = con.cursor()
cur.execute('create table t(id integer primary key, k integer, name text, v real)')
cur.execute('create index ik on t(k)')
cur.execute('create index iname on t(name)')
for i in range(200000):
    cur.execute('insert into t(k, name, v) values (?, ?, ?)', (i % 997, 'n%d' % (i * 7919 % 100003), i * 0.5))
con.commit()
rows = cur.execute('select k, count(*), sum(v) from t group by k order by k').fetchall()
print(len(rows), rows[0])
";

/// The Python interpreter itself (`sys.executable`: not a pyenv shim, whose shell script would be timed too),
/// if it has the sqlite3 module.
fn real_python() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args(["-c", "import sys, sqlite3; print(sys.executable)"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// A section that says why a program's rows are missing.
fn skipped(title: &str, why: String) -> Section {
    Section {
        title: title.into(),
        intro: why,
        header: Vec::new(),
        rows: Vec::new(),
        notes: Vec::new(),
    }
}

/// The rows of a program run in each of [`PROGRAM_MODES`] (`invs` in that order): per mode, the median of `cost`
/// (what one run cost, from its figures and standard output; lower is better) and its ratio to the plain run
/// of the same round, median (min–max) over `rounds` interleaved rounds.
fn ratio_rows(
    invs: &[Invocation],
    rounds: usize,
    cost: impl Fn(&RunFigures, &str) -> Result<f64, String>,
    shown: impl Fn(f64) -> String,
) -> Result<Vec<Vec<String>>, String> {
    let mut costs = vec![Vec::new(); invs.len()];
    for round in 0..rounds {
        for i in round_order(round, invs.len()) {
            let (figures, stdout) = run_with_output(&invs[i], true)?;
            costs[i].push(cost(&figures, &stdout)?);
        }
    }
    let plain = &costs[Mode::Plain as usize];
    Ok(PROGRAM_MODES
        .iter()
        .zip(invs)
        .zip(&costs)
        .map(|((mode, inv), values)| {
            let ratios: Vec<f64> = values.iter().zip(plain).map(|(v, p)| v / p).collect();
            vec![
                mode.label().to_string(),
                inv.shell_line(),
                shown(Spread::of(values).median),
                if *mode == Mode::Plain {
                    String::new()
                } else {
                    Spread::of(&ratios).show()
                },
            ]
        })
        .collect())
}

/// A run's cost as its CPU time in seconds.
fn cpu_seconds(figures: &RunFigures, _stdout: &str) -> Result<f64, String> {
    Ok(figures.cpu.as_secs_f64())
}

/// Seconds shown as whole milliseconds.
fn show_ms(seconds: f64) -> String {
    format!("{:.0}", seconds * 1e3)
}

/// Python 3 with SQLite (every mode's runtime selects every module): CPU time against the plain run's.
fn python_sqlite_section(env: &Env) -> Result<Section, String> {
    let title = "Call counting: Python with SQLite, PLT counting";
    let Some(python) = real_python() else {
        return Ok(skipped(
            title,
            "No `python3` with the sqlite3 module on this machine: not measured.".into(),
        ));
    };
    // A run that touches memory varies by ±15 % from one run to the next on a busy host: the
    // median needs many rounds to settle.
    let rounds = match env.scale {
        Scale::Quick => 3,
        _ => 21,
    };
    let invs = python_sqlite_invocations(env, &python, &PROGRAM_MODES)?;
    let rows = ratio_rows(&invs, rounds, cpu_seconds, show_ms)?;
    Ok(Section {
        title: title.into(),
        intro: format!(
            "`{}` running a script of 200 000 inserts into an in-memory table with two indexes, then a GROUP BY \
             (`SQLITE_SCRIPT` in `tests/src/bin/bench/plt.rs`): most calls through the PLT are libsqlite3's into libc \
             (`pthread_mutex_lock`/`unlock`, `memmove`, `memcmp`, `malloc`/`free`). \
             Median CPU time over {rounds} interleaved rounds; the ratio to plain is taken within each round, median (min–max).",
            python.display()
        ),
        header: ["mode", "command", "CPU ms", "vs plain (median, min–max)"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec!["Target: PLT counted ≤ 1.05× the plain run (issue 35).".into()],
    })
}

/// The runs of Python with SQLite, one per mode of `modes`: the script written into the suite's scratch folder.
fn python_sqlite_invocations(
    env: &Env,
    python: &Path,
    modes: &[Mode],
) -> Result<Vec<Invocation>, String> {
    let dir = env.folder("plt-python")?;
    let script = dir.join("sqlite_inserts.py");
    std::fs::write(&script, SQLITE_SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    Ok(modes
        .iter()
        .map(|mode| mode.invocation(env, python, &dir).arg("sqlite_inserts.py"))
        .collect())
}

/// The runs of `openssl speed` on SHA-256 of 16-byte blocks for `seconds`, one per mode of `modes`.
fn openssl_invocations(
    env: &Env,
    seconds: &str,
    modes: &[Mode],
) -> Result<Vec<Invocation>, String> {
    let dir = env.folder("plt-openssl")?;
    Ok(modes
        .iter()
        .map(|mode| {
            mode.invocation(env, Path::new("openssl"), &dir)
                .args(["speed", "-seconds", seconds, "-bytes", "16", "sha256"])
        })
        .collect())
}

/// `openssl speed` on SHA-256 of 16-byte blocks: throughput lost, as the plain run's throughput over each mode's.
fn openssl_section(env: &Env) -> Result<Section, String> {
    let title = "Call counting: openssl speed sha256, 16-byte blocks, PLT counting";
    let seconds = match env.scale {
        Scale::Quick => "1",
        _ => "3",
    };
    let rounds = match env.scale {
        Scale::Quick => 3,
        _ => 11,
    };
    let invs = openssl_invocations(env, seconds, &PROGRAM_MODES)?;
    if run_once(&invs[Mode::Plain as usize]).is_err() {
        return Ok(skipped(
            title,
            "No working `openssl` on this machine: not measured.".into(),
        ));
    }
    // `sha256  12345.67k`: thousands of bytes per second; a run's cost is its inverse.
    let rows = ratio_rows(
        &invs,
        rounds,
        |_, stdout| {
            stdout
                .lines()
                .find_map(|line| line.strip_prefix("sha256"))
                .and_then(|rest| rest.trim().strip_suffix('k'))
                .and_then(|k| k.parse::<f64>().ok())
                .filter(|k| *k > 0.0)
                .map(|k| 1.0 / (k * 1e3))
                .ok_or_else(|| format!("openssl speed printed no sha256 figure: {stdout:?}"))
        },
        |seconds_per_byte| format!("{:.1}", 1.0 / seconds_per_byte / 1e6),
    )?;
    Ok(Section {
        title: title.into(),
        intro: format!(
            "`openssl speed -seconds {seconds} -bytes 16 sha256`: libcrypto's calls through the PLT into libc \
             (`malloc`, `free`, `memcpy`) for every 16-byte digest. Throughput in MB/s, median over {rounds} \
             interleaved rounds; \"vs plain\" is the plain run's throughput over the mode's (×, higher is slower), \
             taken within each round, median (min–max)."
        ),
        header: ["mode", "command", "MB/s", "vs plain (median, min–max)"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec!["Target: PLT counted ≤ ×1.05 (issue 35).".into()],
    })
}

pub fn run(env: &Env) -> Result<Vec<Section>, String> {
    Ok(vec![
        leaf_section(env)?,
        scattered_sites_section(env)?,
        rustc_section(env)?,
        python_sqlite_section(env)?,
        openssl_section(env)?,
        shares_section(env)?,
    ])
}

/// Sampling rate of the share runs: about 800 samples in the Python run, 3 000 in openssl's.
const SHARES_HZ: &str = "1000";

/// Each module's share of the program's own samples (the module table's `program` column: all samples but
/// the profiling overhead's; its `samples` column when the run had no overhead row) in the report of the
/// profile `file`.
fn module_shares(env: &Env, file: &Path) -> Result<Vec<(String, f64)>, String> {
    let output = std::process::Command::new(&env.analyzer)
        .args(["-b", "-p"])
        .arg(file)
        .output()
        .map_err(|e| format!("{}: {e}", env.analyzer.display()))?;
    if !output.status.success() {
        return Err(format!(
            "mslprof -b -p {}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let report = String::from_utf8_lossy(&output.stdout);
    let percent = |field: &str| field.strip_suffix('%').and_then(|f| f.parse::<f64>().ok());
    let shares = report
        .lines()
        .skip_while(|line| line.trim() != "Modules")
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.first()?.parse::<u32>().ok()?;
            let samples = percent(fields.get(1)?)?;
            match fields.get(2).and_then(|f| percent(f)) {
                Some(program) => Some((fields.get(3)?.to_string(), program)),
                // The overhead's own row has no program share; nor has any row without an overhead row.
                None if fields.get(3) == Some(&"(profiling") => None,
                None => Some((fields.get(2)?.to_string(), samples)),
            }
        })
        .collect::<Vec<_>>();
    if shares.is_empty() {
        return Err(format!(
            "no module table in the report of {}",
            file.display()
        ));
    }
    Ok(shares)
}

/// What the program's modules weigh with PLT counting on, against `MSLPROF_PLT=0`: the module table's shares of
/// the program's own samples, for Python with SQLite and for openssl, in interleaved rounds.
fn shares_section(env: &Env) -> Result<Section, String> {
    let title = "Call counting: module shares with PLT counting";
    let rounds = match env.scale {
        Scale::Quick => 3,
        _ => 7,
    };
    let mut programs: Vec<(&str, Vec<Invocation>)> = Vec::new();
    if let Some(python) = real_python() {
        programs.push((
            "Python + SQLite",
            python_sqlite_invocations(env, &python, &[Mode::Counted, Mode::Off])?,
        ));
    }
    let openssl = openssl_invocations(env, "3", &[Mode::Plain, Mode::Counted, Mode::Off])?;
    if run_once(&openssl[0]).is_ok() {
        programs.push(("openssl speed sha256", openssl[1..].to_vec()));
    }
    let mut rows = Vec::new();
    let mut widest = 0.0f64;
    for (name, invs) in &programs {
        // Per mode, per module: its share in each round.
        let mut shares: Vec<std::collections::BTreeMap<String, Vec<f64>>> =
            vec![Default::default(); 2];
        for round in 0..rounds {
            for i in round_order(round, invs.len()) {
                let out = env.scratch.join(format!("plt-shares-{round}-{i}"));
                let _ = std::fs::remove_dir_all(&out);
                std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
                let inv = invs[i]
                    .clone()
                    .env("MSLPROF_HZ", SHARES_HZ)
                    .env("GPROFDIR", out.to_string_lossy());
                run_once(&inv)?;
                let file = std::fs::read_dir(&out)
                    .map_err(|e| format!("{}: {e}", out.display()))?
                    .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                    .min()
                    .ok_or_else(|| format!("`{}` wrote no profile", inv.shell_line()))?;
                for (module, share) in module_shares(env, &file)? {
                    shares[i].entry(module).or_default().push(share);
                }
                let _ = std::fs::remove_dir_all(&out);
            }
        }
        // The modules with at least 1 % of the program's samples in either mode, largest first.
        let median = |mode: usize, module: &str| {
            shares[mode]
                .get(module)
                .map(|values| {
                    let mut all = values.clone();
                    all.resize(rounds, 0.0);
                    Spread::of(&all)
                })
                .unwrap_or(Spread::of(&[0.0]))
        };
        let mut modules: Vec<&String> = shares[0]
            .keys()
            .chain(shares[1].keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|module| median(0, module).median >= 1.0 || median(1, module).median >= 1.0)
            .collect();
        modules.sort_by(|a, b| median(1, b).median.total_cmp(&median(1, a).median));
        for module in modules {
            let (counted, off) = (median(0, module), median(1, module));
            let difference = counted.median - off.median;
            widest = widest.max(difference.abs());
            rows.push(vec![
                name.to_string(),
                module.clone(),
                show_share(&off),
                show_share(&counted),
                format!("{difference:+.1}"),
            ]);
        }
    }
    Ok(Section {
        title: title.into(),
        intro: format!(
            "The programs of the two sections above, profiled at `MSLPROF_HZ={SHARES_HZ}` with PLT counting on and with \
             `MSLPROF_PLT=0`, in {rounds} interleaved rounds: each module's share of the program's own samples (the \
             report's module table, `program` column: every sample but the profiling overhead's, which holds the \
             time in the runtime and its stubs), median (min–max) over the rounds, for the modules with at least \
             1 % in either mode."
        ),
        header: [
            "program",
            "module",
            "MSLPROF_PLT=0",
            "PLT counted",
            "difference (points)",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes: vec![
            format!(
                "Target (issue 35): every module within 2 points. Widest difference in this run: {widest:.1} points."
            ),
            "The stubs draw samples of the code that ran just before them as well as their own \
             (runtime/README.md, \"Rewritten PLT call sites\"): those are in the overhead, not in the module \
             they belong to."
                .into(),
        ],
    })
}

/// A share in percent, "12.3 (11.0–13.1)".
fn show_share(spread: &Spread) -> String {
    format!("{:.1} ({:.1}–{:.1})", spread.median, spread.min, spread.max)
}
