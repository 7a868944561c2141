//! The runtime's stack walker against framehop (samply's unwinder), on the same stacks: `unwind_compare`
//! (tests/src/bin) under the `test-hooks` runtime walks its own stack at depths 10, 30 and 100 with both, from
//! the same registers, and times each; nanoseconds per walk and per frame, median (min to max) over the trials.

use std::process::Command;

use crate::rate::median_and_range;
use crate::report::Section;
use crate::{Env, Scale};

const DEPTHS: [usize; 3] = [10, 30, 100];

/// The walkers in the order of `unwind_compare`'s trial lines: cold cache, warm, cold, warm.
const WALKERS: [&str; 4] = [
    "mslprof runtime, cold cache",
    "mslprof runtime, warm cache",
    "framehop, cold cache",
    "framehop, warm cache",
];

pub fn run(env: &Env) -> Result<Section, String> {
    let quick = env.scale == Scale::Quick;
    let trials = if quick { 3 } else { 11 };
    let frames_per_measurement = if quick { 200_000 } else { 2_000_000 };
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "-p",
            "mslprof-tests",
            "--bin",
            "unwind_compare",
        ])
        .current_dir(&env.workspace)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err("cargo build --release --bin unwind_compare failed".into());
    }
    let program = env
        .runtime
        .with_file_name("unwind_compare")
        .canonicalize()
        .map_err(|e| format!("unwind_compare: {e}"))?;
    let mut command = Command::new(&program);
    command
        .args(["--trials", &trials.to_string()])
        .args(["--frames", &frames_per_measurement.to_string()])
        .args(DEPTHS.map(|d| d.to_string()))
        .env("LD_PRELOAD", mslprof_tests::test_hooks_runtime_library())
        .env("GPROFDIR", "")
        .env_remove("MSLPROF_STACK_DEPTH")
        .current_dir(&env.scratch);
    let output = command
        .output()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if !output.status.success() {
        return Err(format!(
            "unwind_compare failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    // `trial DEPTH FRAMES RUNTIME_COLD RUNTIME_WARM FRAMEHOP_COLD FRAMEHOP_WARM`, nanoseconds per walk.
    let mut per_walk: Vec<[Vec<f64>; 4]> = vec![Default::default(); DEPTHS.len()];
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parsed = || -> Option<(usize, [f64; 4])> {
            let depth = DEPTHS
                .iter()
                .position(|d| fields.get(1) == Some(&d.to_string().as_str()))?;
            let mut times = [0.0; 4];
            for (slot, field) in times.iter_mut().zip(fields.get(3..7)?) {
                *slot = field.parse().ok()?;
            }
            Some((depth, times))
        };
        match (fields.first(), parsed()) {
            (Some(&"trial"), Some((depth, times))) => {
                for (walker, time) in times.into_iter().enumerate() {
                    per_walk[depth][walker].push(time);
                }
            }
            _ => return Err(format!("unwind_compare printed an unexpected line: {line}")),
        }
    }
    let mut rows = Vec::new();
    for (depth, times) in DEPTHS.iter().zip(&per_walk) {
        if times[0].len() != trials {
            return Err(format!(
                "unwind_compare gave {} trials at depth {depth}",
                times[0].len()
            ));
        }
        for (walker, name) in WALKERS.iter().enumerate() {
            let (median, low, high) = median_and_range(times[walker].clone());
            // Against the runtime's walk with its cache in the same state (cold or warm).
            let ratios = times[walker]
                .iter()
                .zip(&times[walker % 2])
                .map(|(t, r)| t / r)
                .collect();
            let (ratio, _, _) = median_and_range(ratios);
            let per_frame = *depth as f64;
            rows.push(vec![
                depth.to_string(),
                name.to_string(),
                format!("{median:.0} ({low:.0} to {high:.0})"),
                format!(
                    "{:.1} ({:.1} to {:.1})",
                    median / per_frame,
                    low / per_frame,
                    high / per_frame
                ),
                format!("{ratio:.2}×"),
            ]);
        }
    }
    Ok(Section {
        title: "Call stacks: the runtime's walker against framehop".into(),
        intro: format!(
            "`unwind_compare` (tests/src/bin/unwind_compare.rs), one process under the runtime built with its \
             `test-hooks` feature, outside any signal handler: it recurses through distinct functions until its \
             stack is 10, 30 or 100 frames deep (`main` and libc's start-up frames included), then walks that stack \
             from the same registers with the runtime's walk (`stacks::unwind::walk`, as the SIGPROF handler runs \
             it, through `mslprof_test_walk_here`, its rule cache emptied before each walk or kept across walks) and \
             with framehop 0.16 (`MustNotAllocateDuringUnwind`, one module \
             per loaded object, its `.eh_frame_hdr`, `.eh_frame` and code read in place): {frames_per_measurement} \
             frames' worth of walks of each kind per trial, {trials} trials, interleaved. Every walk must return the \
             runtime's frames (same count, same addresses), or the run stops without timing."
        ),
        header: [
            "depth",
            "walker",
            "ns per walk",
            "ns per frame",
            "against the runtime, same cache state (median ratio)",
        ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        rows,
        notes: vec![
            "Cold cache: every frame finds its module, binary-searches the module's copied `.eh_frame_hdr` and \
             evaluates its FDE with gimli (the runtime's cache emptied before each walk, outside the timing, and \
             checked to give no hit; framehop's two unwinders take turns over one cache, so no walk finds a rule \
             the one before cached, checked from its statistics): what a sample costs at code not sampled \
             recently. Warm cache: the cache kept across walks, as the SIGPROF handler keeps one per scratch slot \
             (the runtime's 1024 entries, direct-mapped by a hash of load-instance key and address) and samply \
             keeps framehop's (509 slots by address modulo 509): repeated stacks find most rules cached, but two \
             of a stack's addresses that share an entry evict each other on every walk."
                .to_string(),
            "Figures are median (min to max) over the trials, each the mean of its walks; the ratio is taken within \
             each trial. The stack-capture cost of a whole sample, handler included, is in \"Call stacks: capture \
             time and overhead\"."
                .to_string(),
        ],
    })
}
