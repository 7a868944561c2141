//! Sampling rate and its cost: samples per CPU-second achieved and CPU overhead at 100, 1000 and 4000 Hz on
//! the spin fixture, a spin loop on 1 and on 16 threads (with the kernel's floor for each: the same loops
//! with an empty handler on the same events; and without stacks, whose samples go through rings) and two rustc
//! compiles (a one-line crate, a generated one of 300 functions, with its own floor and its run without
//! stacks), interleaved trials, medians with min–max.

use std::path::{Path, PathBuf};

use crate::measure::{Invocation, round_order, run_once};
use crate::report::Section;
use crate::sampling::{real_rustc, small_crate};
use crate::{Env, Scale, fixtures};
use mslprof_format::Profile;

const RATES: [&str; 3] = ["100", "1000", "4000"];

/// One program's runs: plain, then under the runtime at each rate (profiles into their own folder).
fn invocations(
    label: &str,
    program: &Path,
    args: &[String],
    dir: &Path,
    env: &Env,
) -> Vec<Invocation> {
    let mut invs =
        vec![Invocation::new(&format!("{label}, plain"), program, dir).args(args.to_vec())];
    for hz in RATES {
        invs.push(under_runtime(
            &format!("{label}, MSLPROF_HZ={hz}"),
            program,
            args,
            hz,
            dir,
            env,
        ));
    }
    invs
}

/// A run of `program` under the runtime at `hz`, its profile going to a folder of `dir` named after `label`.
pub fn under_runtime(
    label: &str,
    program: &Path,
    args: &[String],
    hz: &str,
    dir: &Path,
    env: &Env,
) -> Invocation {
    let out = dir.join(label.replace([' ', ',', '='], "_"));
    Invocation::new(label, program, dir)
        .args(args.to_vec())
        .env("LD_PRELOAD", env.runtime.to_string_lossy().into_owned())
        .env("MSLPROF_HZ", hz)
        .env("GPROFDIR", out.to_string_lossy().into_owned())
}

/// The folder a run's profile goes to (its `GPROFDIR`), if it has one.
pub fn profile_dir(inv: &Invocation) -> Option<PathBuf> {
    inv.env
        .iter()
        .find(|(k, _)| k == "GPROFDIR")
        .map(|(_, dir)| PathBuf::from(dir))
}

/// The one profile a run left in its `GPROFDIR` (then removed), with the size of its file in bytes; `None` for
/// a run without `GPROFDIR`.
pub fn take_profile(inv: &Invocation) -> Result<Option<(Profile, usize)>, String> {
    let Some(dir) = profile_dir(inv) else {
        return Ok(None);
    };
    let mut found = None;
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let profile = mslprof_format::read(&bytes, Default::default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        found = Some((profile, bytes.len()));
        std::fs::remove_file(&path).map_err(|e| e.to_string())?;
    }
    Ok(found)
}

/// CPU seconds and samples (0 without a profile) of each invocation over `runs` interleaved rounds; each
/// run's profile is taken from its `GPROFDIR` and removed.
pub fn trials(invs: &[Invocation], runs: usize) -> Result<Vec<Vec<(f64, f64)>>, String> {
    for inv in invs {
        if let Some(dir) = profile_dir(inv) {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        }
    }
    let mut figures = vec![Vec::new(); invs.len()];
    for round in 0..runs {
        for i in round_order(round, invs.len()) {
            let cpu = run_once(&invs[i])?.cpu.as_secs_f64();
            let samples = take_profile(&invs[i])?
                .map_or(0.0, |(profile, _)| profile.header.total_samples as f64);
            figures[i].push((cpu, samples));
        }
    }
    Ok(figures)
}

pub fn median_and_range(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

/// The median and the first and third quartiles of `values` (not empty).
fn median_and_quartiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (values[n / 2], values[n / 4], values[(3 * n) / 4])
}

/// Interleaved rounds of `invs` (the plain run first in the list); one table row per run under the runtime.
/// A run's overhead is taken against the plain run of its own round, which a host whose load drifts between
/// rounds disturbs less than a comparison with the plain runs' median.
fn measure(invs: &[Invocation], runs: usize, rows: &mut Vec<Vec<String>>) -> Result<(), String> {
    let figures = trials(invs, runs)?;
    let cpu: Vec<Vec<f64>> = figures
        .iter()
        .map(|f| f.iter().map(|t| t.0).collect())
        .collect();
    let rate: Vec<Vec<f64>> = figures
        .iter()
        .map(|f| {
            f.iter()
                .map(|&(seconds, samples)| samples / seconds)
                .collect()
        })
        .collect();
    let (plain, _, _) = median_and_range(cpu[0].clone());
    for i in 1..invs.len() {
        let (cpu_median, _, _) = median_and_range(cpu[i].clone());
        let overheads = cpu[i]
            .iter()
            .zip(&cpu[0])
            .map(|(c, plain_of_round)| (c / plain_of_round - 1.0) * 100.0)
            .collect();
        let (overhead, low, high) = median_and_quartiles(overheads);
        let (achieved, rate_low, rate_high) = median_and_range(rate[i].clone());
        let achieved = if rate_high > 0.0 {
            format!("{achieved:.0} ({rate_low:.0}–{rate_high:.0})")
        } else {
            "—".to_string()
        };
        rows.push(vec![
            invs[i].label.clone(),
            format!("{:.0}", plain * 1e3),
            format!("{:.0}", cpu_median * 1e3),
            format!("{overhead:+.1} % (IQR {low:+.1} to {high:+.1})"),
            achieved,
        ]);
    }
    Ok(())
}

/// Rounds of the short rustc compile (not at the quick scale).
const RUSTC_ROUNDS: usize = 41;

/// Builds `tests/fixtures/bench/floor_preload.c` into `dir`: preloaded with `FLOOR_HZ`, it gives every thread
/// of a program a task-clock event signalling an empty handler, and does nothing else.
fn floor_preload(dir: &Path) -> Result<PathBuf, String> {
    fixtures::shared_library(
        dir,
        "floor_preload.c",
        "floor_preload.so",
        &["-O2"],
        &["-ldl"],
    )
}

pub fn run(env: &Env) -> Result<Section, String> {
    let dir = env.folder("rate")?;
    let quick = env.scale == Scale::Quick;
    // Overheads of a few percent need more rounds than the suites' usual 7 to stand out of this host's noise
    // (with 11, the medians at 1 kHz moved by a point from one run of the suite to the next).
    let runs = if quick { env.runs } else { env.runs.max(15) };
    let mut rows = Vec::new();

    let spin = fixtures::build_spin(&dir)?;
    let iterations = if quick { "50000000" } else { "400000000" };
    measure(
        &invocations("spin", &spin, &[iterations.into()], &dir, env),
        runs,
        &mut rows,
    )?;

    // The same loop with an empty SIGPROF handler on the same kernel event, against the runtime's handler: on
    // one thread, and on 16 threads spinning at once (2 cores: the events follow their threads through the
    // context switches).
    let floor_source = fixtures::source_dir().join("signal_floor.c");
    fixtures::cc(
        &dir,
        &[
            "-O1",
            "-pthread",
            "-o",
            "signal_floor",
            &floor_source.to_string_lossy(),
        ],
    )?;
    let floor = dir.join("signal_floor");
    let per_thread = if quick { "5000000" } else { "40000000" };
    for (label, iterations, threads) in [
        ("spin loop", iterations, "1"),
        ("16 threads", per_thread, "16"),
    ] {
        let mut floor_runs = invocations(
            label,
            &floor,
            &[iterations.into(), "0".into(), threads.into()],
            &dir,
            env,
        );
        // The fixture's own event at `hz`, signalling an empty handler or (`mode` "rings") writing records with
        // stack copies into rings that a thread of the fixture empties.
        let floor_run =
            |name: String, hz: &str, mode: Option<&str>| -> Result<Invocation, String> {
                let period_ns = 1_000_000_000 / hz.parse::<u64>().map_err(|e| e.to_string())?;
                let mut args = vec![
                    iterations.to_string(),
                    period_ns.to_string(),
                    threads.to_string(),
                ];
                args.extend(mode.map(str::to_string));
                Ok(Invocation::new(&name, &floor, &dir).args(args))
            };
        for hz in RATES {
            floor_runs.push(floor_run(
                format!("{label}, empty handler at {hz} Hz (no runtime)"),
                hz,
                None,
            )?);
        }
        // The same events writing records with stack copies into rings, which a thread of the fixture polls
        // and empties without walking them: the kernel's share of the runtime's rings with stack copies.
        for hz in ["1000", "4000"] {
            floor_runs.push(floor_run(
                format!(
                    "{label}, rings with stack copies at {hz} Hz, read but not walked (no runtime)"
                ),
                hz,
                Some("rings"),
            )?);
        }
        // Without stacks, samples go into a ring per thread instead of a signal each.
        for hz in ["1000", "4000"] {
            floor_runs.push(
                under_runtime(
                    &format!("{label}, MSLPROF_HZ={hz}, no stacks (rings)"),
                    &floor,
                    &[iterations.into(), "0".into(), threads.into()],
                    hz,
                    &dir,
                    env,
                )
                .env("MSLPROF_STACK_DEPTH", "0"),
            );
        }
        measure(&floor_runs, runs, &mut rows)?;
    }

    let mut notes = vec![
        "CPU time is user + system of the whole process (wait4); the overhead compares each run with the plain \
         run of the same round: the median over the rounds, with the interquartile range. The rate is samples / \
         CPU-seconds of that run, median (min–max)."
            .to_string(),
        "Targets (issue 33): at least 900 samples per CPU-second at 1 kHz and 3 000 at 4 kHz; at most 3 % CPU at 1 kHz, and a 1 kHz default only at ≤ 1 %. Above 200 Hz each event writes its samples into its thread's ring and sends no signal: with stacks (the rows without a note) each record copies the top 16 KiB of the stack, which the runtime's drain thread walks (its CPU time is in the figures); rows \"no stacks (rings)\" run with `MSLPROF_STACK_DEPTH=0`, whose records are the pc only, drained by the watch ticks (runtime/README.md, \"Sampling\"). The rows \"rings with stack copies (no runtime)\" are the same events writing the records the runtime's rings with stack copies hold (the registers and 16 KiB of stack, rings of 512 KiB woken half full), polled by a thread of the fixture that reads each record's pc and rsp and frees it without walking it: the kernel's share of those rings. The empty-handler rows are the kernel's cost when each sample is a signal (an hrtimer interrupt, an irq_work and a signal delivery), as it is where no ring can be mapped and for a thread whose stacks outgrow their copies. rustc's short run is mostly start-up, and its time in the kernel (page faults) takes no task-clock sample.".to_string(),
    ];
    if let Some(rustc) = real_rustc() {
        let args = small_crate(&dir)?;
        // A run of 50 ms varies by a fifth from one round to the next on this host: a few seconds of rounds
        // make its median mean something.
        let rounds = if quick { runs.min(5) } else { RUSTC_ROUNDS };
        measure(
            &invocations("rustc", &rustc, &args, &dir, env),
            rounds,
            &mut rows,
        )?;
        // A compile that runs long enough for the cost per sample to show, on its LLVM threads too.
        let long_args = crate::plt::generated_crate_args(&dir)?;
        let long_rounds = if quick { runs.min(3) } else { runs };
        let label = "rustc, 300 functions";
        let mut long_runs = invocations(label, &rustc, &long_args, &dir, env);
        // The kernel's floor for the same compile: every thread with a task-clock event signalling an empty
        // handler (the preloaded fixture, no runtime), as the runtime's events do for threads walked live.
        let preload = floor_preload(&dir)?;
        for hz in ["1000", "4000"] {
            long_runs.push(
                Invocation::new(
                    &format!("{label}, empty handler at {hz} Hz (no runtime)"),
                    &rustc,
                    &dir,
                )
                .args(long_args.clone())
                .env("LD_PRELOAD", preload.to_string_lossy().into_owned())
                .env("FLOOR_HZ", hz),
            );
        }
        // Without stacks: the pc of each sample into a ring, no signal, no walk.
        long_runs.push(
            under_runtime(
                &format!("{label}, MSLPROF_HZ=1000, no stacks (rings)"),
                &rustc,
                &long_args,
                "1000",
                &dir,
                env,
            )
            .env("MSLPROF_STACK_DEPTH", "0"),
        );
        measure(&long_runs, long_rounds, &mut rows)?;
        notes.push(format!(
            "rustc's rows: {rounds} rounds of the one-line crate (one compile takes about 50 ms of CPU, mostly \
             start-up), {long_rounds} of the generated crate of 300 functions of the suite `plt` (about 1.3 s, \
             most of it in LLVM's threads, whose stacks are deeper than a ring's copy: their samples are signals, \
             walked live). Its kernel floor (`tests/fixtures/bench/floor_preload.c`, preloaded) gives each of \
             rustc's threads a task-clock event of the runtime's kind signalling an empty handler: what any \
             per-thread task-clock sampler whose samples are signals pays on this machine before doing anything. \
             The row \"no stacks (rings)\" is the cheapest delivery the runtime has (`MSLPROF_STACK_DEPTH=0`)."
        ));
    } else {
        notes.push("rustc not found: its rows are skipped.".into());
    }
    Ok(Section {
        title: "Sampling rate and its cost".into(),
        intro: "Per-thread task-clock events at 100, 1000 and 4000 Hz: `tests/fixtures/bench/spin_libs.c` (one \
                thread), the spin loop of `tests/fixtures/bench/signal_floor.c` on one thread and on 16 threads \
                spinning at once on 2 cores, and real rustc compiles (`-O`) of a one-line crate and of a generated \
                crate of 300 functions, in interleaved trials. The kernel's floor: the same spin loops, each thread \
                with its own task-clock event of the runtime's kind signalling an empty SIGPROF handler, or writing \
                records with stack copies into rings that a thread of the fixture empties (no runtime), and the \
                300-function compile with such a signalling event on each of rustc's threads (a preloaded fixture, no \
                runtime), in the same rounds as the runs under the runtime."
            .into(),
        header: ["run", "plain CPU ms (median)", "CPU ms (median)", "CPU overhead", "samples per CPU-second"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes,
    })
}
