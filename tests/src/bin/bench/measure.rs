//! Running one configuration of a benchmark several times and reducing the runs to medians.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One way of running a program: the command line, extra environment and working directory.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub label: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub dir: PathBuf,
}

impl Invocation {
    pub fn new(label: &str, program: impl AsRef<Path>, dir: impl AsRef<Path>) -> Self {
        Invocation {
            label: label.to_string(),
            program: program.as_ref().to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            dir: dir.as_ref().to_path_buf(),
        }
    }
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, a: I) -> Self {
        self.args.extend(a.into_iter().map(Into::into));
        self
    }
    pub fn env(mut self, k: &str, v: impl Into<String>) -> Self {
        self.env.push((k.to_string(), v.into()));
        self
    }

    /// The command as a person would type it, for the report.
    pub fn shell_line(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.env {
            // Paths are the harness's own scratch or target folders: the file name says enough.
            let shown = if v.contains('/') {
                Path::new(v)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| v.clone())
            } else {
                v.clone()
            };
            s.push_str(&format!("{k}={shown} "));
        }
        s.push_str(
            &self
                .program
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// One run's figures.
#[derive(Clone, Copy, Debug)]
pub struct RunFigures {
    pub wall: Duration,
    /// User plus system CPU time of the process and its threads.
    pub cpu: Duration,
    pub max_rss_kib: u64,
}

/// Medians over several runs.
#[derive(Clone, Copy, Debug)]
pub struct Medians {
    pub wall: Duration,
    pub cpu: Duration,
    pub max_rss_kib: u64,
    pub runs: usize,
}

/// Runs `inv` once, output discarded, and fails if it does not exit 0.
pub fn run_once(inv: &Invocation) -> Result<RunFigures, String> {
    run_with_output(inv, false).map(|(figures, _)| figures)
}

/// Runs `inv` once and fails if it does not exit 0; with `keep_stdout`, also returns what it wrote to its
/// standard output (else discarded, and the string is empty).
pub fn run_with_output(
    inv: &Invocation,
    keep_stdout: bool,
) -> Result<(RunFigures, String), String> {
    let mut cmd = Command::new(&inv.program);
    cmd.args(&inv.args)
        .current_dir(&inv.dir)
        .stdin(Stdio::null())
        .stdout(if keep_stdout {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null());
    for (k, v) in &inv.env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", inv.program.display()))?;
    let mut stdout = String::new();
    if let Some(mut pipe) = child.stdout.take() {
        std::io::Read::read_to_string(&mut pipe, &mut stdout)
            .map_err(|e| format!("{}: {e}", inv.program.display()))?;
    }
    let usage = mslprof_tests::wait_with_usage(child.id()).map_err(|e| format!("wait: {e}"))?;
    let wall = start.elapsed();
    if usage.status.code() != Some(0) {
        return Err(format!(
            "`{}` exited with {:?}",
            inv.shell_line(),
            usage.status
        ));
    }
    let figures = RunFigures {
        wall,
        cpu: usage.user_cpu + usage.system_cpu,
        max_rss_kib: usage.max_rss_kib,
    };
    Ok((figures, stdout))
}

/// Runs every invocation `runs` times, interleaved (a, b, c, a, b, c, ...) so that the machine's drifting load
/// affects all of them alike, and returns the medians in the same order.
pub fn interleaved(invs: &[Invocation], runs: usize) -> Result<Vec<Medians>, String> {
    Ok(interleaved_figures(invs, runs)?
        .iter()
        .map(|figs| medians(figs))
        .collect())
}

/// Every figure of `runs` interleaved rounds (each round runs every invocation once, in [`round_order`]): one vector per
/// invocation, indexed by round, so that figures of one round can be paired.
pub fn interleaved_figures(
    invs: &[Invocation],
    runs: usize,
) -> Result<Vec<Vec<RunFigures>>, String> {
    let mut all: Vec<Vec<RunFigures>> = vec![Vec::new(); invs.len()];
    for round in 0..runs {
        for i in round_order(round, invs.len()) {
            all[i].push(run_once(&invs[i])?);
        }
    }
    Ok(all)
}

/// The order in which round `round` of interleaved trials runs `n` configurations: rotated by one each round,
/// so that no configuration always runs first, or always right after the same one (a position in the round
/// may bias a run on a shared machine: in one run with a fixed order, rustc under `MSLPROF_PLT=0`, always run
/// last, took 0.96× the CPU time of the plain build, always run first, although it does more work).
pub fn round_order(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |step| (round + step) % n)
}

fn medians(figs: &[RunFigures]) -> Medians {
    let mut walls: Vec<Duration> = figs.iter().map(|f| f.wall).collect();
    let mut cpus: Vec<Duration> = figs.iter().map(|f| f.cpu).collect();
    let mut rss: Vec<u64> = figs.iter().map(|f| f.max_rss_kib).collect();
    walls.sort();
    cpus.sort();
    rss.sort();
    Medians {
        wall: walls[walls.len() / 2],
        cpu: cpus[cpus.len() / 2],
        max_rss_kib: rss[rss.len() / 2],
        runs: figs.len(),
    }
}
