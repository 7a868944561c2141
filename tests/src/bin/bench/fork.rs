//! The suite `fork`: what a fork costs under the runtime (issue 30). `fork_loop.c` forks children that
//! `_exit(0)` at once and waits for each; it is run plain and under the release runtime (default settings,
//! call-site rewriting on; and at `MSLPROF_HZ=1000`, where a child would open a task-clock event at its first
//! sample), as a plain C program and a `-pg` one, in interleaved trials. Each trial reports the mean
//! wall-clock and CPU microseconds (the process's and its children's user + system time) of one fork +
//! `_exit` + `waitpid`; the table gives the median and range over trials and the ratio of the medians to the
//! plain run of the same build. The target is a runtime fork at most 1.5× a plain one.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::calls::Spread;
use crate::measure::round_order;
use crate::report::Section;
use crate::{Env, Scale, fixtures};

/// The target ratio of a runtime fork to a plain one.
const TARGET: f64 = 1.5;

/// One configuration: a label, the program, whether the runtime is preloaded, and its `MSLPROF_HZ` if not the
/// default.
struct Config {
    build: &'static str,
    label: &'static str,
    program: std::path::PathBuf,
    runtime: bool,
    hz: Option<&'static str>,
}

/// Runs `config` once with `forks` forks: (wall, CPU) µs per fork, as the program prints them.
fn trial(env: &Env, config: &Config, forks: u64, dir: &Path) -> Result<(f64, f64), String> {
    let mut cmd = Command::new(&config.program);
    cmd.arg(forks.to_string())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if config.runtime {
        cmd.env("LD_PRELOAD", &env.runtime);
    }
    if let Some(hz) = config.hz {
        cmd.env("MSLPROF_HZ", hz);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("{}: {e}", config.program.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} ({}) exited with {:?}",
            config.build, config.label, out.status
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<f64> = text
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // The children that wrote a profile (few should: a child is sampled only if its first period ends before its
    // `_exit`) and the parent's gmon.out go.
    for entry in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("gmon.out") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    match figures[..] {
        [wall, cpu] => Ok((wall, cpu)),
        _ => Err(format!("unexpected output {text:?}")),
    }
}

pub fn run(env: &Env) -> Result<Section, String> {
    let dir = env.folder("fork")?;
    let src = fixtures::source_dir().join("fork_loop.c");
    let src = src.to_string_lossy();
    fixtures::cc(&dir, &["-O2", "-o", "fork_plain", &src])?;
    fixtures::cc(&dir, &["-O2", "-pg", "-o", "fork_pg", &src])?;
    let (trials, forks) = match env.scale {
        Scale::Quick => (5, 200),
        _ => (15, 1000),
    };
    let mut configs = Vec::new();
    for (build, program) in [("plain C", "fork_plain"), ("-pg", "fork_pg")] {
        for (label, runtime, hz) in [
            ("plain", false, None),
            ("mslprof", true, None),
            ("mslprof, 1 kHz", true, Some("1000")),
        ] {
            configs.push(Config {
                build,
                label,
                program: dir.join(program),
                runtime,
                hz,
            });
        }
    }
    let mut walls = vec![Vec::new(); configs.len()];
    let mut cpus = vec![Vec::new(); configs.len()];
    for round in 0..trials {
        for i in round_order(round, configs.len()) {
            let (wall, cpu) = trial(env, &configs[i], forks, &dir)?;
            walls[i].push(wall);
            cpus[i].push(cpu);
        }
    }
    let mut rows = Vec::new();
    let mut verdicts = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        let wall = Spread::of(&walls[i]);
        let cpu = Spread::of(&cpus[i]);
        // The plain run of the same build.
        let base = configs
            .iter()
            .position(|c| c.build == config.build && !c.runtime)
            .unwrap_or(i);
        let wall_ratio = wall.median / Spread::of(&walls[base]).median;
        let cpu_ratio = cpu.median / Spread::of(&cpus[base]).median;
        let preload = match (config.runtime, config.hz) {
            (false, _) => String::new(),
            (true, None) => "LD_PRELOAD=libmslprof.so ".to_string(),
            (true, Some(hz)) => format!("LD_PRELOAD=libmslprof.so MSLPROF_HZ={hz} "),
        };
        rows.push(vec![
            config.build.to_string(),
            config.label.to_string(),
            format!(
                "`{preload}{} {forks}`",
                config
                    .program
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
            ),
            format!("{:.0} ({:.0}–{:.0})", wall.median, wall.min, wall.max),
            format!("{:.2}×", wall_ratio),
            format!("{:.0} ({:.0}–{:.0})", cpu.median, cpu.min, cpu.max),
            format!("{:.2}×", cpu_ratio),
        ]);
        if config.runtime {
            verdicts.push(format!(
                "{} ({}): a fork under the runtime costs {wall_ratio:.2}× a plain one in wall time and {cpu_ratio:.2}× in CPU time: the ≤ {TARGET}× target is {} (wall) and {} (CPU).",
                config.build,
                config.label,
                if wall_ratio <= TARGET { "met" } else { "not met" },
                if cpu_ratio <= TARGET { "met" } else { "not met" },
            ));
        }
    }
    let mut notes = verdicts;
    notes.push(format!(
        "{trials} interleaved trials of {forks} forks per configuration; the figures are per fork + `_exit` + `waitpid`. \
         CPU is user + system time of the loop's process and its children, which a loaded machine disturbs less than wall time."
    ));
    notes.push(
        "A child that records nothing writes no profile (a forked child's `_exit` dump is skipped when empty). At \
         1 kHz a child's task-clock event waits for its first sample, which its CPU-time timer takes at a random \
         point of its first period (runtime/README.md, \"Per-thread task clocks\"): these children exit first and \
         never open one."
            .to_string(),
    );
    Ok(Section {
        title: "fork".to_string(),
        intro: "`fork` + `_exit` + `waitpid` in a loop (tests/fixtures/bench/fork_loop.c, -O2), plain and under the \
                release runtime with its default settings and at `MSLPROF_HZ=1000`, for a plain C program and a `-pg` \
                one: µs per fork, median (min–max) over trials, and the ratio of medians to the plain run of the same \
                build."
            .to_string(),
        header: [
            "build",
            "run",
            "command",
            "wall µs/fork",
            "wall ratio",
            "CPU µs/fork",
            "CPU ratio",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes,
    })
}
