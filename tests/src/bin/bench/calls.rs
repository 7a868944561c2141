//! Per-call cost of call counting, measured so that it reproduces: mslprof's `mcount` against glibc's and
//! against the floor (a preloaded `mcount` that only returns), on fib (1, 16 and 64 threads), on generated
//! programs with 2 000 to 1 000 000 distinct arcs, on Lua 5.4 and on a C++ program of many small functions.
//!
//! Every figure is a slope, not a whole-run time: each configuration runs the same program at two amounts of
//! work, and the per-call cost is the difference in CPU time divided by the difference in calls, minus the same
//! slope of the plain (non `-pg`) build. Fixed costs (start-up, the dump at exit, glibc's buffer allocation)
//! cancel out; they were what made the whole-run figures of one machine differ from another's
//! (runtime/CALLCOUNTS.md). Each trial runs every configuration once at both sizes, interleaved, and yields
//! one per-call figure per configuration; tables give the median and the range (min–max) over the trials.

use std::path::{Path, PathBuf};

use crate::fixtures::{self, Builds};
use crate::measure::{Invocation, round_order, run_once};
use crate::report::Section;
use crate::workingset::{self, CalleeOrder};
use crate::{Env, Scale};

/// Calls of `fib` that computing fib(n) makes: C(n) = 1 + C(n-1) + C(n-2), C(0) = C(1) = 1.
fn fib_calls(n: u64) -> u64 {
    let (mut a, mut b) = (1u64, 1u64);
    for _ in 1..n {
        (a, b) = (b, 1 + a + b);
    }
    b
}

/// The ways of running a `-pg` program that the tables compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Counter {
    /// The build without `-pg`: the baseline every slope is taken against.
    Plain,
    /// `-pg` with a preloaded `mcount` that only returns.
    Floor,
    /// `-pg` under glibc's own `mcount`.
    Glibc,
    /// `-pg` with `LD_PRELOAD=libmslprof.so`.
    Mslprof,
}

const COUNTERS: [Counter; 4] = [
    Counter::Plain,
    Counter::Floor,
    Counter::Glibc,
    Counter::Mslprof,
];

impl Counter {
    fn label(self) -> &'static str {
        match self {
            Counter::Plain => "plain (no -pg)",
            Counter::Floor => "floor: no-op mcount",
            Counter::Glibc => "glibc -pg",
            Counter::Mslprof => "mslprof",
        }
    }

    fn invocation(self, env: &Env, builds: &Builds, floor: &Path, dir: &Path) -> Invocation {
        match self {
            Counter::Plain => Invocation::new(self.label(), &builds.plain, dir),
            Counter::Floor => Invocation::new(self.label(), &builds.pg, dir)
                .env("LD_PRELOAD", floor.to_string_lossy()),
            Counter::Glibc => Invocation::new(self.label(), &builds.pg, dir),
            Counter::Mslprof => Invocation::new(self.label(), &builds.pg, dir)
                .env("LD_PRELOAD", env.runtime.to_string_lossy()),
        }
    }
}

/// Per-call overhead of each counter over the trials, in ns (index = position in [`COUNTERS`]; the plain
/// entry is empty).
struct Slopes {
    per_counter: Vec<Vec<f64>>,
    /// Calls and distinct arcs in the gmon.out of the last mslprof run at the large size (read right after
    /// it: the counters share the folder); (0, 0) if mslprof was not measured.
    counted: (u64, usize),
}

impl Slopes {
    fn of(&self, counter: Counter) -> Spread {
        Spread::of(&self.per_counter[counter as usize])
    }
}

/// Median and range of one figure over the trials.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Spread {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Spread {
                min: f64::NAN,
                median: f64::NAN,
                max: f64::NAN,
            };
        }
        Spread {
            min: v[0],
            median: v[v.len() / 2],
            max: v[v.len() - 1],
        }
    }

    /// "2.31 (2.10–2.52)".
    pub fn show(&self) -> String {
        format!("{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

/// One program measured at two amounts of work.
struct Workload<'a> {
    builds: &'a Builds,
    dir: &'a Path,
    /// Arguments of the small and of the large run.
    small: Vec<String>,
    large: Vec<String>,
    /// Profiled calls of the large run minus those of the small run.
    extra_calls: u64,
}

/// Runs `trials` interleaved trials of every counter at both sizes and returns the per-call slopes.
fn measure(
    env: &Env,
    floor: &Path,
    work: &Workload,
    trials: usize,
    counters: &[Counter],
) -> Result<Slopes, String> {
    // The plain build (index 0) is every trial's baseline.
    let measured: Vec<Counter> = std::iter::once(Counter::Plain)
        .chain(counters.iter().copied().filter(|c| *c != Counter::Plain))
        .collect();
    let invs: Vec<(Invocation, Invocation)> = measured
        .iter()
        .map(|c| {
            let base = c.invocation(env, work.builds, floor, work.dir);
            (
                base.clone().args(work.small.clone()),
                base.args(work.large.clone()),
            )
        })
        .collect();
    let mut per_counter = vec![Vec::new(); COUNTERS.len()];
    let mut counted = (0, 0);
    for trial in 0..trials {
        let mut slope = vec![0.0; invs.len()];
        for i in round_order(trial, invs.len()) {
            let (small, large) = &invs[i];
            let s = run_once(small)?.cpu.as_secs_f64();
            let l = run_once(large)?.cpu.as_secs_f64();
            slope[i] = (l - s) / work.extra_calls as f64 * 1e9;
            if measured[i] == Counter::Mslprof {
                counted = counted_calls(work.dir)?;
            }
        }
        for (c, value) in measured.iter().zip(&slope).skip(1) {
            per_counter[*c as usize].push(value - slope[0]);
        }
    }
    Ok(Slopes {
        per_counter,
        counted,
    })
}

/// Builds the floor library (`noop_mcount.c`) into `dir`.
fn build_floor(dir: &Path) -> Result<PathBuf, String> {
    fixtures::shared_library(dir, "noop_mcount.c", "libnoop_mcount.so", &[], &[])
}

/// Total of every arc count in the `gmon.out` that the mslprof run of `dir` left, with the number of distinct
/// arcs: the benchmark refuses figures from a run that did not count exactly.
fn counted_calls(dir: &Path) -> Result<(u64, usize), String> {
    let gmon = dir.join("gmon.out");
    let bytes = std::fs::read(&gmon).map_err(|e| format!("{}: {e}", gmon.display()))?;
    let profile = mslprof_format::read(&bytes, mslprof_format::GnuTarget::default())
        .map_err(|e| format!("{}: {e}", gmon.display()))?;
    let arcs: Vec<&mslprof_format::Arc> = profile.modules.iter().flat_map(|m| &m.arcs).collect();
    Ok((arcs.iter().map(|a| a.count).sum(), arcs.len()))
}

/// How a target fared in this run.
fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "not met" }
}

/// glibc's per-call figures on fib with one thread (medians, ns): what the large working sets are held
/// against.
struct FibReference {
    glibc_whole: f64,
    glibc_own: f64,
}

/// The columns of every call-counting table.
fn table_header() -> Vec<String> {
    [
        "workload",
        "counter",
        "ns/call (median, min–max)",
        "own share: − floor (median, min–max)",
        "vs glibc",
        "own share vs glibc's",
        "vs floor",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Slopes {
    /// mslprof's median per-call overhead over glibc's: the ratio the targets are stated in.
    fn mslprof_to_glibc(&self) -> f64 {
        self.of(Counter::Mslprof).median / self.of(Counter::Glibc).median
    }

    /// The counter's figure minus the floor's, paired trial by trial (both ran in the same trial).
    fn own(&self, counter: Counter) -> Spread {
        let floor = &self.per_counter[Counter::Floor as usize];
        let values: Vec<f64> = self.per_counter[counter as usize]
            .iter()
            .zip(floor)
            .map(|(value, floor)| value - floor)
            .collect();
        Spread::of(&values)
    }

    /// The floor's, glibc's and mslprof's rows of one workload.
    fn rows(&self, workload: &str) -> Vec<Vec<String>> {
        let ratio = |ours: f64, other: f64| {
            if other > 0.0 {
                format!("{:.2}×", ours / other)
            } else {
                String::new()
            }
        };
        let (glibc, floor) = (self.of(Counter::Glibc), self.of(Counter::Floor));
        let glibc_own = self.own(Counter::Glibc);
        [Counter::Floor, Counter::Glibc, Counter::Mslprof]
            .into_iter()
            .map(|counter| {
                let spread = self.of(counter);
                let own = (counter != Counter::Floor).then(|| self.own(counter));
                // Only mslprof's row is compared: with glibc, with glibc's own share, with the floor.
                let comparisons = match own {
                    Some(own) if counter == Counter::Mslprof => [
                        ratio(spread.median, glibc.median),
                        ratio(own.median, glibc_own.median),
                        ratio(spread.median, floor.median),
                    ],
                    _ => Default::default(),
                };
                let mut row = vec![
                    workload.to_string(),
                    counter.label().to_string(),
                    spread.show(),
                    own.map(|own| own.show()).unwrap_or_default(),
                ];
                row.extend(comparisons);
                row
            })
            .collect()
    }
}

/// fib through a function pointer on 1, 16 and 64 threads.
fn fib_section(env: &Env, floor: &Path, trials: usize) -> Result<(Section, FibReference), String> {
    let dir = env.folder("calls-fib")?;
    let builds = fixtures::build_fib(&dir)?;
    let quick = env.scale == Scale::Quick;
    // Per-thread fib arguments (small, large): 41 to 107 M extra calls (with 7 M, a run's noise was of the
    // size of mslprof's own share of a call). The small run outlasts the runtime's first look, which
    // rewrites fib's site (runtime/CALLCOUNTS.md, "Rewriting while the program runs"): before it, every call
    // pays `mcount`. With 64 threads time-sliced on 2 cores it came at 16–134 ms of CPU time (10 runs),
    // because the kernel sends a CPU timer's signal when the thread it charged runs again. The small runs
    // used before (fib(23) on 64 threads: 39–58 ms of CPU time) often ended before it, or just after, so
    // the slope took in part of that once-per-process cost.
    let configs: [(u32, u64, u64); 3] = if quick {
        [(1, 22, 27), (16, 18, 22), (64, 16, 20)]
    } else {
        [(1, 32, 36), (16, 29, 32), (64, 28, 30)]
    };
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut one_thread: Option<(Spread, f64)> = None;
    let mut reference = None;
    let mut per_thread_ratio = Vec::new();
    let mut threads_met = true;
    for (threads, small, large) in configs {
        let work = Workload {
            builds: &builds,
            dir: &dir,
            small: vec![threads.to_string(), small.to_string()],
            large: vec![threads.to_string(), large.to_string()],
            extra_calls: (fib_calls(large) - fib_calls(small)) * u64::from(threads),
        };
        let slopes = measure(env, floor, &work, trials, &COUNTERS)?;
        let ours = slopes.of(Counter::Mslprof);
        let label = format!(
            "fib, {threads} thread{}",
            if threads == 1 { "" } else { "s" }
        );
        rows.extend(slopes.rows(&label));
        if threads == 1 {
            one_thread = Some((ours, slopes.mslprof_to_glibc()));
            reference = Some(FibReference {
                glibc_whole: slopes.of(Counter::Glibc).median,
                glibc_own: slopes.own(Counter::Glibc).median,
            });
        } else if let Some((one, _)) = one_thread {
            let ratio = ours.median / one.median;
            threads_met &= ratio <= 1.5;
            per_thread_ratio.push(format!("{threads} threads / 1 thread: {ratio:.2}×"));
        }
        // Exactness: the last mslprof run (large) counted every call.
        let (counted, _) = slopes.counted;
        let expected = fib_calls(large) * u64::from(threads) + u64::from(threads) + 1;
        if counted != expected {
            return Err(format!(
                "fib on {threads} threads: mslprof counted {counted} calls, expected {expected}"
            ));
        }
    }
    notes.push(format!(
        "mslprof's per-call overhead (medians), {} (target ≤ 1.5×: {} in this run). On this 2-core machine 16 and 64 threads are time-sliced.",
        per_thread_ratio.join(", "),
        verdict(threads_met)
    ));
    notes.push("Until the runtime's first look rewrites fib's site, every call pays `mcount`: a cost once per process, which the slope leaves out because the small run outlasts it. With one thread the look came after 12–16 ms of CPU time in 9 of 10 runs (28 in the tenth); with 16 and 64 threads time-sliced on 2 cores, after 16–134 ms (10 runs each), because the kernel sends the look timer's signal when the thread it charged runs again (runtime/CALLCOUNTS.md, \"Rewriting while the program runs\").".into());
    notes.push("Every mslprof run's gmon.out was checked: it counts exactly fib's calls, plus each worker's and main's.".into());
    notes.push("\"Own share\" is each trial's figure minus the floor of the same trial: what the counter itself adds to a call that any `mcount` pays for. \"Own share vs glibc's\" compares the medians of those.".into());
    let (reference, one_thread_ratio) = match (reference, one_thread) {
        (Some(reference), Some((_, ratio))) => (reference, ratio),
        _ => return Err("fib: no one-thread measurement".into()),
    };
    notes.push(format!(
        "Target: mslprof ≤ 0.5× glibc on one thread ({one_thread_ratio:.2}× in this run: {}). glibc's mcount on several threads skips calls that race (its lock is a try-lock), so its figures there are not exact counts.",
        verdict(one_thread_ratio <= 0.5)
    ));
    let section = Section {
        title: "Call counting: fib through a function pointer".into(),
        intro: format!(
            "`tests/fixtures/bench/fib_fp.c` built with `cc -O2` (plain) and `cc -O2 -pg`. Per-call overhead in ns, median (min–max) over {trials} interleaved trials, \
             each the CPU-time slope between fib(small) and fib(large) per thread, minus the plain build's slope. \
             The floor is a preloaded `mcount` that only returns (`tests/fixtures/bench/noop_mcount.c`): what any counter pays before doing anything."
        ),
        header: table_header(),
        rows,
        notes,
    };
    Ok((section, reference))
}

/// Generated programs with 2 k to 1 M distinct arcs.
/// Also returns the whole runs of the address-order programs ([`whole_run_section`]).
fn working_set_section(
    env: &Env,
    floor: &Path,
    trials: usize,
    fib: &FibReference,
) -> Result<(Section, Section), String> {
    let dir = env.folder("calls-ws")?;
    let sizes: &[usize] = match env.scale {
        Scale::Quick => &[2_000, 20_000],
        _ => &[2_000, 20_000, 200_000, 1_000_000],
    };
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut whole_runs = Vec::new();
    let mut first_above_target = Vec::new();
    // Working sets where mslprof's own share (median) is above glibc's own share on fib, and above glibc's
    // whole figure there.
    let (mut above_own, mut above_whole) = (Vec::new(), Vec::new());
    for &sites in sizes {
        for order in [CalleeOrder::Address, CalleeOrder::Scrambled] {
            eprintln!("bench: working set of {sites} arcs, {}", order.label());
            let program = workingset::build(&dir, sites, order)?;
            if order == CalleeOrder::Address {
                whole_runs.push(whole_runs_of(env, &program, &dir, trials)?);
            }
            // About 40 M extra calls between the small and the large run (at least 4 extra sweeps: a
            // run of a million arcs has a second of start-up and dump whose noise must stay small next to
            // the difference), after 4 sweeps: by then a thread's cache has grown to fit the working set
            // and been filled again, so the slope is the steady state.
            let per_sweep = program.calls_per_sweep();
            let small = 4u64;
            // From 200 000 arcs on, the runs' fixed costs vary by a few tenths of a second between runs
            // (system time: the page faults of a cache of up to 256 MiB, with or without huge pages), so
            // the difference spans 120 M calls there.
            let extra = match env.scale {
                Scale::Quick => 4_000_000,
                _ if sites >= 200_000 => 120_000_000,
                _ => 40_000_000,
            };
            let large = small + (extra / per_sweep).max(4);
            let work = Workload {
                builds: &program.builds,
                dir: &dir,
                small: vec![small.to_string()],
                large: vec![large.to_string()],
                extra_calls: (large - small) * per_sweep,
            };
            let slopes = measure(env, floor, &work, trials, &COUNTERS)?;
            let (counted, distinct) = slopes.counted;
            let expected = large * per_sweep + 1;
            if counted != expected || distinct < sites {
                return Err(format!(
                    "{sites} arcs: mslprof counted {counted} calls in {distinct} arcs, expected {expected} in at least {sites}"
                ));
            }
            // The first sweep: every call a miss that inserts its arc (slow path), against the plain build.
            let (first, first_trials) =
                first_sweep_cost(env, floor, &program.builds, &dir, per_sweep, trials)?;
            let label = format!(
                "{sites} arcs over {} functions, {}",
                program.functions,
                order.label()
            );
            rows.extend(slopes.rows(&label));
            let own = slopes.own(Counter::Mslprof).median;
            let short = format!("{sites} {} ({own:.2})", order.label());
            if own > fib.glibc_own {
                above_own.push(short.clone());
            }
            if own > fib.glibc_whole {
                above_whole.push(short);
            }
            if first.median > 100.0 {
                first_above_target.push(format!("{sites} {} ({:.0})", order.label(), first.median));
            }
            notes.push(format!(
                "{sites} arcs, {}: first sweep (every call inserts its arc) costs mslprof {} ns per call over the plain build ({first_trials} trials)",
                order.label(),
                first.show()
            ));
        }
    }
    notes.insert(0, "glibc's mcount gives up on these programs beyond a few thousand arcs (\"mcount: call graph buffer size limit exceeded, gmon.out will not be generated\") and then only returns: its rows there show what it costs once it has stopped counting.".into());
    notes.push(format!(
        "Target: the first call of an arc at most 100 ns over the plain build (median; the dump of the arcs at exit included). Above it in this run: {}.",
        if first_above_target.is_empty() { "none".to_string() } else { first_above_target.join(", ") }
    ));
    notes.push("Every mslprof run's gmon.out was checked: total count = sweeps × calls per sweep + 1 (main), and at least as many distinct arcs as call sites.".into());
    notes.push("Target: at every size, mslprof at or below glibc's per-call overhead on fib with one thread (the first table). These programs' floor alone (4–6 ns, the `-pg` code of a million call sites) is above glibc's whole figure on fib, so the comparison that can be met is of own shares.".into());
    let list = |sizes: &[String]| {
        if sizes.is_empty() {
            "none".to_string()
        } else {
            sizes.join(", ")
        }
    };
    notes.push(format!(
        "In this run, mslprof's own share above glibc's own share on fib ({:.2} ns): {}; above glibc's whole per-call overhead on fib ({:.2} ns): {}.",
        fib.glibc_own,
        list(&above_own),
        fib.glibc_whole,
        list(&above_whole)
    ));
    let whole = whole_run_section(&whole_runs, trials, fib);
    let section = Section {
        title: "Call counting: large working sets".into(),
        intro: format!(
            "Generated `-pg` programs (`tests/src/bin/bench/workingset.rs`, built with `cc -O1`): N distinct call sites in drivers of 1 000 direct calls each, over min(N, 2 000) tiny functions, \
             swept in address order; the callees of a driver's sites are in address order or scrambled. Per-call overhead in ns, median (min–max) over {trials} trials of the CPU-time slope between 4 sweeps and about 40 M more calls (120 M from 200 000 arcs on; 4 M with `--quick`)."
        ),
        header: table_header(),
        rows,
        notes,
    };
    Ok((section, whole))
}

/// Sweeps of the whole-run rows: most call sites of a big program run only a few times.
const WHOLE_RUN_SWEEPS: [u64; 3] = [1, 5, 20];

/// One trial of a whole run: (plain CPU ms, mslprof CPU ms, mslprof's ns per call over plain).
type WholeRunTrial = (f64, f64, f64);

/// One program's whole runs at each of [`WHOLE_RUN_SWEEPS`].
struct WholeRuns {
    sites: usize,
    /// Per sweep count, one figure per trial.
    per_sweeps: Vec<(u64, Vec<WholeRunTrial>)>,
}

/// Runs `program` whole, plain and under mslprof, interleaved, at 1, 5 and 20 sweeps: everything the first sweep
/// (every call inserts its arc), the later ones and the dump cost, per call.
fn whole_runs_of(
    env: &Env,
    program: &workingset::Program,
    dir: &Path,
    trials: usize,
) -> Result<WholeRuns, String> {
    let per_sweep = program.calls_per_sweep();
    let mut per_sweeps = Vec::new();
    for sweeps in WHOLE_RUN_SWEEPS {
        eprintln!(
            "bench: whole runs of {} sites, {sweeps} sweeps",
            program.sites
        );
        let invs = [Counter::Plain, Counter::Mslprof].map(|counter| {
            counter
                .invocation(env, &program.builds, Path::new(""), dir)
                .arg(sweeps.to_string())
        });
        let calls = sweeps * per_sweep;
        let mut figures = Vec::new();
        for trial in 0..trials {
            let mut cpu = [0.0; 2];
            for i in round_order(trial, invs.len()) {
                cpu[i] = run_once(&invs[i])?.cpu.as_secs_f64() * 1e3;
                if i == 1 {
                    let (counted, _) = counted_calls(dir)?;
                    if counted != calls + 1 {
                        return Err(format!(
                            "{} sites, {sweeps} sweeps: mslprof counted {counted} calls, expected {}",
                            program.sites,
                            calls + 1
                        ));
                    }
                }
            }
            figures.push((cpu[0], cpu[1], (cpu[1] - cpu[0]) * 1e6 / calls as f64));
        }
        per_sweeps.push((sweeps, figures));
    }
    Ok(WholeRuns {
        sites: program.sites,
        per_sweeps,
    })
}

/// The whole-run table: what a program whose call sites run only a few times pays per call, first sweep and dump
/// included, against glibc's per-call figure on fib.
fn whole_run_section(runs: &[WholeRuns], trials: usize, fib: &FibReference) -> Section {
    let mut rows = Vec::new();
    let mut target = None;
    for run in runs {
        for (sweeps, figures) in &run.per_sweeps {
            let column = |pick: fn(&WholeRunTrial) -> f64| {
                Spread::of(&figures.iter().map(pick).collect::<Vec<_>>())
            };
            let over = column(|f| f.2);
            let against_fib = over.median / fib.glibc_whole;
            if run.sites == 200_000 && *sweeps == 20 {
                target = Some(against_fib);
            }
            rows.push(vec![
                format!(
                    "{} sites, {sweeps} sweep{}",
                    run.sites,
                    if *sweeps == 1 { "" } else { "s" }
                ),
                format!("{:.1}", column(|f| f.0).median),
                format!("{:.1}", column(|f| f.1).median),
                over.show(),
                format!("{against_fib:.2}×"),
            ]);
        }
    }
    let mut notes = vec![
        "Every mslprof run's gmon.out was checked: total count = sweeps × calls per sweep + 1 (main).".to_string(),
    ];
    notes.push(match target {
        Some(ratio) => format!(
            "Target: 200 000 sites × 20 sweeps at most 2× glibc's per-call overhead on fib with one thread ({:.2} ns, the first table): {ratio:.2}× in this run ({}).",
            fib.glibc_whole,
            verdict(ratio <= 2.0)
        ),
        None => "Target: 200 000 sites × 20 sweeps at most 2× glibc's per-call overhead on fib (not measured with `--quick`).".to_string(),
    });
    Section {
        title: "Call counting: whole runs of large working sets".into(),
        intro: format!(
            "The address-order programs of the previous section run whole, plain and under mslprof, interleaved: every call of the first sweep inserts its arc, and the dump at exit writes them all. CPU ms (median over {trials} trials) and mslprof's overhead per call over the plain run, median (min–max)."
        ),
        header: [
            "workload",
            "plain CPU ms",
            "mslprof CPU ms",
            "ns/call over plain (median, min–max)",
            "vs glibc on fib",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
        notes,
    }
}

/// Calls the first-sweep measurement takes over all its trials at least (up to 40 times the trials asked
/// for): one sweep of 2 000 call sites is a quarter of a millisecond, below the noise of one process's CPU
/// time.
const FIRST_SWEEP_CALLS: u64 = 2_000_000;

/// CPU time per call of the first sweep under mslprof (sweeps 1 minus sweeps 0), minus the plain build's,
/// and the trials it took.
fn first_sweep_cost(
    env: &Env,
    floor: &Path,
    builds: &Builds,
    dir: &Path,
    per_sweep: u64,
    trials: usize,
) -> Result<(Spread, usize), String> {
    let trials = usize::try_from(FIRST_SWEEP_CALLS / per_sweep.max(1))
        .unwrap_or(usize::MAX)
        .clamp(trials, trials * 40);
    let work = Workload {
        builds,
        dir,
        small: vec!["0".into()],
        large: vec!["1".into()],
        extra_calls: per_sweep,
    };
    let slopes = measure(env, floor, &work, trials, &[Counter::Mslprof])?;
    Ok((slopes.of(Counter::Mslprof), trials))
}

/// A real program run whole, at one size (its fixed costs are small next to its tens of millions of calls):
/// per-call overhead of each counter over the plain build, per trial. The number of calls is the one
/// mslprof's profile of the same run counts.
struct WholeRun<'a> {
    label: &'static str,
    builds: &'a Builds,
    dir: &'a Path,
    args: Vec<String>,
}

/// The per-call slopes of `run` and the calls it made.
fn whole_run_slopes(
    env: &Env,
    floor: &Path,
    run: &WholeRun,
    trials: usize,
) -> Result<(Slopes, u64), String> {
    let invs: Vec<Invocation> = COUNTERS
        .iter()
        .map(|c| {
            c.invocation(env, run.builds, floor, run.dir)
                .args(run.args.clone())
        })
        .collect();
    let mut per_counter = vec![Vec::new(); COUNTERS.len()];
    let mut calls = 0;
    for trial in 0..trials {
        let mut times = vec![0.0; invs.len()];
        for i in round_order(trial, invs.len()) {
            times[i] = run_once(&invs[i])?.cpu.as_secs_f64();
            if COUNTERS[i] == Counter::Mslprof {
                // mslprof's profile says how many calls there were.
                calls = counted_calls(run.dir)?.0;
            }
        }
        for (i, c) in COUNTERS.iter().enumerate() {
            if *c != Counter::Plain {
                per_counter[i].push((times[i] - times[0]) / calls as f64 * 1e9);
            }
        }
    }
    let slopes = Slopes {
        per_counter,
        counted: (calls, 0),
    };
    Ok((slopes, calls))
}

/// Lua 5.4 as a `-pg` shared library and a C++ program of many small functions.
fn real_programs_section(env: &Env, floor: &Path, trials: usize) -> Result<Section, String> {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut ratios = Vec::new();
    let lua_dir = env.folder("calls-lua")?;
    match fixtures::build_lua(&env.workspace, &lua_dir) {
        Ok(builds) => {
            let pg_dir = builds.pg.parent().ok_or("no folder")?.to_path_buf();
            let run = WholeRun {
                label: "Lua 5.4",
                builds: &builds,
                dir: &pg_dir,
                args: Vec::new(),
            };
            let (slopes, calls) = whole_run_slopes(env, floor, &run, trials)?;
            rows.extend(slopes.rows(run.label));
            ratios.push((run.label, slopes.mslprof_to_glibc()));
            notes.push(format!(
                "Lua 5.4: `liblua.so` built with `-pg -O2` and the driver `tests/golden/analyzer/lua/driver.c`; {calls} calls, counted by mslprof in every module (glibc's mcount pays for them too but keeps only the main program's)."
            ));
        }
        Err(e) => notes.push(format!("Lua workload skipped: {e}")),
    }
    let cxx_dir = env.folder("calls-cxx")?;
    let builds = fixtures::build_cxx(&cxx_dir)?;
    // The C++ program takes its number of rounds: a slope between two, like fib's, with the calls of each
    // size counted by mslprof itself.
    let (small, large) = if env.scale == Scale::Quick {
        (100, 600)
    } else {
        (200, 2200)
    };
    let calls_at = |rounds: u64| -> Result<u64, String> {
        run_once(
            &Counter::Mslprof
                .invocation(env, &builds, floor, &cxx_dir)
                .arg(rounds.to_string()),
        )?;
        Ok(counted_calls(&cxx_dir)?.0)
    };
    let extra_calls = calls_at(large)? - calls_at(small)?;
    let work = Workload {
        builds: &builds,
        dir: &cxx_dir,
        small: vec![small.to_string()],
        large: vec![large.to_string()],
        extra_calls,
    };
    let slopes = measure(env, floor, &work, trials, &COUNTERS)?;
    rows.extend(slopes.rows("C++ small functions"));
    ratios.push(("C++", slopes.mslprof_to_glibc()));
    notes.push(format!(
        "C++: `tests/fixtures/bench/cxx_small_functions.cpp` (std::sort, std::map, std::unordered_map, std::priority_queue, std::function, virtual calls) built with `g++ -O1` and `-O1 -pg`: the CPU-time slope between {small} and {large} rounds, {extra_calls} calls of mostly tiny template functions apart."
    ));
    notes.push(format!(
        "Target: mslprof ≤ 0.5× glibc. In this run: {}.",
        ratios
            .iter()
            .map(|(label, ratio)| format!("{label} {ratio:.2}× ({})", verdict(*ratio <= 0.5)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(Section {
        title: "Call counting: real programs".into(),
        intro: format!(
            "Per-call overhead in ns over the plain build, median (min–max) over {trials} interleaved trials: for Lua a whole run (its fixed costs are small next to 78 M calls), for the C++ program a slope between two numbers of rounds."
        ),
        header: table_header(),
        rows,
        notes,
    })
}

pub fn run(env: &Env) -> Result<Vec<Section>, String> {
    let dir = env.folder("calls")?;
    let floor = build_floor(&dir)?;
    let trials = env.runs;
    // fib and the real programs measure a fraction of a nanosecond per call against the floor: twice as
    // many trials (they are short) keep the medians from moving from run to run.
    let more_trials = 2 * trials + 1;
    let (fib, reference) = fib_section(env, &floor, more_trials)?;
    let mut sections = vec![fib];
    let (working_sets, whole_runs) = working_set_section(env, &floor, trials, &reference)?;
    sections.push(working_sets);
    sections.push(whole_runs);
    sections.push(real_programs_section(env, &floor, more_trials)?);
    Ok(sections)
}
