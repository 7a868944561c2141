//! Per-call overhead of call counting: the same fib program run plain, under glibc's `-pg` mcount and under
//! mslprof's mcount, on one and two threads.

use crate::measure::{Invocation, interleaved};
use crate::report::{Section, ms};
use crate::{Env, Scale, fixtures};

/// Calls of `fib` that computing fib(n) makes: C(n) = 1 + C(n-1) + C(n-2), C(0) = C(1) = 1.
fn calls_for(n: u64) -> u64 {
    let (mut a, mut b) = (1u64, 1u64);
    for _ in 1..n {
        (a, b) = (b, 1 + a + b);
    }
    b
}

/// The real workload: Lua 5.4 as a `-pg` shared library. glibc's mcount runs on every call but keeps only the
/// main program's arcs (so gprof sees nothing of liblua); mslprof counts them all. The number of calls comes
/// from mslprof's own profile of the run.
fn lua_rows(env: &Env, rows: &mut Vec<Vec<String>>, notes: &mut Vec<String>) -> Result<(), String> {
    let dir = env.scratch.join("lua");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let builds = match fixtures::build_lua(&env.workspace, &dir) {
        Ok(b) => b,
        Err(e) => {
            notes.push(format!("Lua workload skipped: {e}"));
            return Ok(());
        }
    };
    let pg_dir = builds.pg.parent().ok_or("no folder")?.to_path_buf();
    let invs = [
        Invocation::new("Lua plain", &builds.plain, &pg_dir),
        Invocation::new("Lua glibc -pg", &builds.pg, &pg_dir),
        Invocation::new("Lua mslprof", &builds.pg, &pg_dir)
            .env("LD_PRELOAD", env.runtime.to_string_lossy())
            .env("LD_PROFILE", "ALL"),
    ];
    let med = interleaved(&invs, env.runs)?;
    let gmon = pg_dir.join("gmon.out");
    let bytes = std::fs::read(&gmon).map_err(|e| format!("{}: {e}", gmon.display()))?;
    let profile = mslprof_format::read(&bytes, mslprof_format::GnuTarget::default())
        .map_err(|e| format!("{}: {e}", gmon.display()))?;
    let calls: u64 = profile
        .modules
        .iter()
        .flat_map(|m| &m.arcs)
        .map(|a| a.count)
        .sum();
    let base = med[0].cpu.as_secs_f64();
    let per_call = |i: usize| (med[i].cpu.as_secs_f64() - base) / calls as f64 * 1e9;
    for (i, inv) in invs.iter().enumerate() {
        rows.push(vec![
            "1".into(),
            inv.label.clone(),
            format!("`{}`", inv.shell_line()),
            ms(med[i].wall),
            ms(med[i].cpu),
            if i == 0 {
                "—".into()
            } else {
                format!("{:.2}", per_call(i))
            },
            if i == 2 && per_call(1) > 0.0 {
                format!("{:.2}× glibc", per_call(2) / per_call(1))
            } else {
                String::new()
            },
        ]);
    }
    notes.push(format!(
        "Lua 5.4 (`liblua.so` built with `-pg`, driver `tests/golden/analyzer/lua/driver.c`): {calls} calls, counted by mslprof in every module; \
         glibc's mcount pays for them too but keeps only the main program's."
    ));
    Ok(())
}

pub fn run(env: &Env) -> Result<Section, String> {
    let dir = env.scratch.join("calls");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let builds = fixtures::build_fib(&dir)?;
    let n: u64 = if env.scale == Scale::Quick { 27 } else { 32 };
    let calls = calls_for(n);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut mslprof_one_thread = None;
    for threads in [1u32, 2] {
        let args = [threads.to_string(), n.to_string()];
        let plain = Invocation::new("plain", &builds.plain, &dir).args(args.clone());
        let glibc = Invocation::new("glibc -pg", &builds.pg, &dir).args(args.clone());
        let ours = Invocation::new("mslprof", &builds.pg, &dir)
            .args(args.clone())
            .env("LD_PRELOAD", env.runtime.to_string_lossy())
            .env("LD_PROFILE", "ALL");
        let invs = [plain, glibc, ours];
        let med = interleaved(&invs, env.runs)?;
        // CPU time (user + system, all threads) is steadier than wall time on a shared machine.
        let base = med[0].cpu.as_secs_f64();
        let total_calls = calls as f64 * f64::from(threads);
        let per_call = |i: usize| (med[i].cpu.as_secs_f64() - base) / total_calls * 1e9;
        let (g, m) = (per_call(1), per_call(2));
        if threads == 1 {
            mslprof_one_thread = Some(m);
        }
        for (i, inv) in invs.iter().enumerate() {
            let overhead = if i == 0 {
                "—".to_string()
            } else {
                format!("{:.2}", per_call(i))
            };
            rows.push(vec![
                threads.to_string(),
                inv.label.clone(),
                format!("`{}`", inv.shell_line()),
                ms(med[i].wall),
                ms(med[i].cpu),
                overhead,
                if i == 2 && g > 0.0 {
                    format!("{:.2}× glibc", m / g)
                } else {
                    String::new()
                },
            ]);
        }
        if threads == 2
            && let Some(one) = mslprof_one_thread
            && one > 0.0
        {
            notes.push(format!(
                "mslprof per-call overhead with 2 threads / with 1 thread: {:.2}× (target ≤ 1.5×)",
                m / one
            ));
        }
    }
    lua_rows(env, &mut rows, &mut notes)?;
    notes.insert(0, format!("fib({n}) makes {calls} calls per thread; overhead per call = (profiled − plain CPU time) / calls, CPU time summed over threads."));
    notes.push("Target: mslprof ≤ 0.5× glibc's per-call overhead on one thread.".into());
    Ok(Section {
        title: "Call counting: fib through a function pointer".into(),
        intro: "`tests/fixtures/bench/fib_fp.c` built with `cc -O2` (plain) and `cc -O2 -pg`; the `-pg` binary is run as is \
                (glibc's mcount, writes its gmon.out) and with `LD_PRELOAD=libmslprof.so` (mslprof's mcount)."
            .into(),
        header: ["threads", "run", "command", "wall ms (median)", "CPU ms (median)", "ns/call overhead", "vs glibc"].iter().map(|s| s.to_string()).collect(),
        rows,
        notes,
    })
}
