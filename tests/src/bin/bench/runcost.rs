//! What `mslprof run` itself costs: the same program started by `mslprof run` (with its report, and with
//! `--no-report`) and by hand (`LD_PRELOAD` + `LD_AUDIT`, the profile into a folder of its own), CPU time of the
//! whole process tree, interleaved; the difference to the hand-written run is taken within each round.

use std::path::Path;

use crate::calls::Spread;
use crate::fixtures;
use crate::measure::{Invocation, round_order, run_once};
use crate::plt::audit_library;
use crate::report::Section;
use crate::{Env, Scale};

/// The ways of starting one program that the table compares; the first is the baseline.
const MODES: [&str; 3] = [
    "by hand: LD_PRELOAD + LD_AUDIT",
    "mslprof run --no-report",
    "mslprof run",
];

/// The three invocations of `program args` in `dir`, in the order of [`MODES`].
fn invocations(env: &Env, program: &Path, args: &[&str], dir: &Path) -> [Invocation; 3] {
    let by_hand = Invocation::new(MODES[0], program, dir)
        .args(args.iter().copied())
        .env("LD_PRELOAD", env.runtime.to_string_lossy())
        .env("LD_AUDIT", audit_library(env).to_string_lossy())
        .env("GPROFDIR", dir.join("by-hand").to_string_lossy());
    let run = |label: &str, options: &[&str]| {
        Invocation::new(label, &env.analyzer, dir)
            .arg("run")
            .args(options.iter().copied())
            .arg(program.to_string_lossy())
            .args(args.iter().copied())
    };
    [by_hand, run(MODES[1], &["--no-report"]), run(MODES[2], &[])]
}

pub fn run(env: &Env) -> Result<Section, String> {
    let dir = env.scratch.join("runcost");
    std::fs::create_dir_all(dir.join("by-hand")).map_err(|e| e.to_string())?;
    let fib = fixtures::build_fib(&dir)?;
    let rounds = match env.scale {
        Scale::Quick => 5,
        _ => 21,
    };
    let programs: [(&str, &Path, &[&str]); 2] = [
        ("/bin/true", Path::new("/bin/true"), &[]),
        ("fib_pg 1 20 (-pg)", &fib.pg, &["1", "20"]),
    ];
    let mut rows = Vec::new();
    let mut worst_over_hand = f64::MIN;
    for (label, program, args) in programs {
        let invs = invocations(env, program, args, &dir);
        let mut cpu_ms: Vec<Vec<f64>> = vec![Vec::new(); invs.len()];
        for round in 0..rounds {
            for i in round_order(round, invs.len()) {
                cpu_ms[i].push(run_once(&invs[i])?.cpu.as_secs_f64() * 1e3);
            }
        }
        for (mode, figures) in MODES.iter().zip(&cpu_ms) {
            let over: Vec<f64> = figures.iter().zip(&cpu_ms[0]).map(|(a, b)| a - b).collect();
            let over = Spread::of(&over);
            let is_run = *mode != MODES[0];
            if is_run {
                worst_over_hand = worst_over_hand.max(over.median);
            }
            rows.push(vec![
                label.to_string(),
                mode.to_string(),
                Spread::of(figures).show(),
                if is_run { over.show() } else { String::new() },
            ]);
        }
    }
    Ok(Section {
        title: "What `mslprof run` itself costs".into(),
        intro: format!(
            "CPU time of the whole process tree (ms, median (min–max) over {rounds} interleaved rounds) of one program started by hand under the runtime and the audit module, and by `mslprof run` (which also writes the profile into a private folder, moves it to gmon.out, and runs the report in a second `mslprof` process unless `--no-report`); the difference to the hand-written run is taken within each round."
        ),
        header: ["program", "started", "CPU ms", "over by hand (ms)"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec![format!(
            "Target: `mslprof run` at most 20 ms over the hand-written run. Largest median in this run: {worst_over_hand:.1} ms ({}).",
            if worst_over_hand <= 20.0 {
                "met"
            } else {
                "not met"
            }
        )],
    })
}
