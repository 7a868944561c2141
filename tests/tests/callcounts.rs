//! Exact call counts and arcs under libmslprof.so: compared with glibc's own `-pg` on the same C
//! code built as one executable, across `-pg`, `-pg -mfentry` and `-finstrument-functions` at -O0
//! and -O2; threads, signal handlers, register preservation, moncontrol, and no glibc gmon.out.

use mslprof_format::model::Profile;
use mslprof_tests::callcounts::{
    CallGraph, Instrumentation, Symbols, assert_hot_counts_exact, build_library, build_oracle_app,
    build_program, calls_per_function, common_flags, cpu_has_avx, gnu_call_graph, pg_flags,
    profile_call_graph, run_ok, run_signal_fixture, run_threads_fixture,
};
use mslprof_tests::{Workspace, module, read_profile};

/// Functions of the oracle fixture (main.c, cca.c, ccb.c, ccc.c).
fn oracle_function(name: &str) -> bool {
    name == "main"
        || name.starts_with("main_")
        || name.starts_with("a_")
        || name.starts_with("b_")
        || name.starts_with("c_")
}

/// glibc's `-pg` on the oracle sources linked into one non-PIE executable: its gmon.out, reduced
/// to a call graph of function names.
fn glibc_oracle() -> CallGraph {
    let workspace = Workspace::new();
    let mut flags = common_flags("-O0");
    flags.extend(["-pg".to_string(), "-no-pie".to_string()]);
    let exe = build_program(
        &workspace,
        "oracle",
        &["main.c", "cca.c", "ccb.c", "ccc.c"],
        &[],
        &flags,
    );
    run_ok(&mut workspace.command(&exe));
    let gmon = std::fs::read(workspace.join("gmon.out")).expect("glibc wrote gmon.out");
    let graph = gnu_call_graph(&exe, &gmon, &oracle_function);
    assert!(
        graph.len() >= 12,
        "the oracle has too few arcs to mean anything: {graph:?}"
    );
    graph
}

/// The oracle sources as an executable plus three instrumented libraries, run under the runtime.
fn mslprof_run(instrumentation: Instrumentation, optimization: &str) -> (Workspace, Profile) {
    let workspace = Workspace::new();
    let mut flags = common_flags(optimization);
    flags.extend(instrumentation.flags().iter().map(|f| f.to_string()));
    let exe = build_oracle_app(&workspace, &flags);
    let stdout = run_ok(&mut workspace.command_with_runtime(&exe));
    assert_eq!(stdout, "total 3082015\n", "the program's output changed");
    let profile = read_profile(&workspace.join("gmon.out"));
    (workspace, profile)
}

#[test]
fn every_arc_matches_glibc_gprof_for_each_instrumentation_and_optimization() {
    let oracle = glibc_oracle();
    // The fixture's known shape, so the oracle itself is checked too.
    assert_eq!(oracle[&("a_chain".into(), "b_chain".into())], 1000);
    assert_eq!(oracle[&("b_chain".into(), "c_leaf".into())], 2000);
    assert_eq!(oracle[&("main_rec".into(), "main_rec".into())], 80);
    assert_eq!(oracle[&("a_apply".into(), "main_callback".into())], 400);
    for instrumentation in Instrumentation::ALL {
        for optimization in ["-O0", "-O2"] {
            let (_workspace, profile) = mslprof_run(instrumentation, optimization);
            let ours = profile_call_graph(&profile, &oracle_function);
            assert_eq!(
                ours, oracle,
                "arcs differ from glibc's for {instrumentation:?} {optimization}"
            );
            assert_eq!(calls_per_function(&ours), calls_per_function(&oracle));
            assert_eq!(profile.header.dropped_arcs, 0);
        }
    }
}

#[test]
fn arcs_are_module_relative_and_keyed_by_load_instance() {
    let (_workspace, profile) = mslprof_run(Instrumentation::Mcount, "-O2");
    let library_b = mslprof_tests::module(&profile, "libccb.so");
    let library_c = mslprof_tests::module(&profile, "libccc.so");
    // c_leaf is called only from b_chain, in libccb.so: both call sites are keyed by libccb's load
    // instance and lie inside its text, far below any load address.
    assert_eq!(library_c.arcs.len(), 2, "{:?}", library_c.arcs);
    for arc in &library_c.arcs {
        assert_eq!(arc.caller_key, library_b.key);
        assert_eq!(arc.count, 1000);
        assert!(arc.caller_address.0 < 0x10_0000 && arc.callee_address.0 < 0x10_0000);
    }
}

#[test]
fn only_selected_modules_record_arcs() {
    let workspace = Workspace::new();
    let flags = pg_flags("-O2");
    let exe = build_oracle_app(&workspace, &flags);
    run_ok(
        workspace
            .command_with_runtime(&exe)
            .env("LD_PROFILE", "libccb.so"),
    );
    let profile = read_profile(&workspace.join("gmon.out"));
    for module in &profile.modules {
        let name = String::from_utf8_lossy(&module.name);
        if name == "libccb.so" {
            let calls: u64 = module.arcs.iter().map(|a| a.count).sum();
            assert_eq!(calls, 1000 + 75, "b_chain and b_pong calls");
        } else {
            assert!(
                module.arcs.is_empty(),
                "{name} has arcs but was not selected"
            );
        }
    }
}

#[test]
fn four_threads_times_half_a_million_calls_are_exactly_two_million() {
    let (profile, graph) = run_threads_fixture(&[]);
    assert_eq!(
        graph[&("thread_body".into(), "t_work".into())],
        2_000_000,
        "{graph:?}"
    );
    assert_eq!(profile.header.dropped_arcs, 0);
}

#[test]
fn many_threads_coming_and_going_count_exactly() {
    // 10 waves of 24 threads: most threads share the last counter stripe (atomic adds), and each
    // exiting thread releases its call cache.
    let (_profile, graph) = run_threads_fixture(&["24", "5000", "10"]);
    assert_eq!(
        graph[&("thread_body".into(), "t_work".into())],
        24 * 5000 * 10,
        "{graph:?}"
    );
}

#[test]
fn threads_still_alive_at_exit_have_their_cached_counts_in_the_file() {
    // Threads call t_work 100 000 times each, then block; main returns without joining them. The counts of
    // their hot arc sit in their call caches (not yet in the arc table) when the exit dump is written: as
    // running totals for threads that own a counter stripe (8 threads), and also as deltas for the threads
    // beyond the 63rd alive at once, which share the last stripe (70 threads).
    for threads in [8u64, 70] {
        let (_profile, graph) =
            run_threads_fixture(&[&threads.to_string(), "100000", "1", "linger"]);
        assert_eq!(
            graph[&("thread_body".into(), "t_work".into())],
            threads * 100_000,
            "{threads} threads: {graph:?}"
        );
    }
}

/// The arcs into `callees` (functions of the executable module `exe`), each caller named by its function when
/// it is in the executable and by its module's file name otherwise.
fn arcs_into(profile: &Profile, exe: &str, callees: &[&str]) -> CallGraph {
    let program = module(profile, exe);
    let symbols = Symbols::of(std::path::Path::new(
        std::str::from_utf8(&program.path).expect("a UTF-8 path"),
    ));
    let mut graph = CallGraph::new();
    for arc in &program.arcs {
        let Some(callee) = symbols.function_at(arc.callee_address.0) else {
            continue;
        };
        if !callees.contains(&callee) {
            continue;
        }
        let caller = if arc.caller_key == program.key {
            symbols
                .function_at(arc.caller_address.0)
                .unwrap_or("?")
                .to_string()
        } else {
            profile
                .modules
                .iter()
                .find(|caller| caller.key == arc.caller_key)
                .map_or("?".to_string(), |caller| {
                    String::from_utf8_lossy(&caller.name).into_owned()
                })
        };
        *graph.entry((caller, callee.to_string())).or_default() += arc.count;
    }
    graph
}

#[test]
fn rounds_of_two_hundred_live_threads_coming_and_going_count_every_call_exactly() {
    // Each round has 200 threads alive at once (a barrier): 63 own a counter stripe (the main thread one of
    // them), the others share the last one and keep deltas; every round gives the owned stripes back and
    // hands them out again. A thread's first counted call, the start routine's (from the runtime's wrapper of
    // it, which starts the thread's sampling timer), is the one that takes its stripe. With call-site
    // rewriting by default and off, three runs each.
    const ROUNDS: u64 = 12;
    const THREADS: u64 = 200;
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "churn", &["churn.c"], &[], &pg_flags("-O2"));
    let threads = ROUNDS * THREADS;
    let expected: CallGraph = [
        (("start_thread".to_string(), "w"), threads),
        (("w".to_string(), "hot_leaf"), threads * 10_000),
        (("w".to_string(), "leaf2"), threads * 1_000),
    ]
    .into_iter()
    .map(|((caller, callee), count)| ((caller, callee.to_string()), count))
    .collect();
    for setting in [None, Some("0")] {
        for run in 0..3 {
            let mut command = workspace.command_with_runtime(&exe);
            command.args([ROUNDS.to_string(), THREADS.to_string()]);
            if let Some(setting) = setting {
                command.env("MSLPROF_SITE_STUBS", setting);
            }
            let stdout = run_ok(&mut command);
            assert_eq!(stdout, format!("threads {threads}\n"));
            let profile = read_profile(&workspace.join("gmon.out"));
            let mut counted = arcs_into(&profile, "churn", &["w", "hot_leaf", "leaf2"]);
            // The start routine is called from the runtime's wrapper of it, or from libc's start_thread
            // where the (release-built) wrapper tail-calls it: one caller module, either way.
            let start_calls: Vec<(String, u64)> = counted
                .iter()
                .filter(|((_, callee), _)| callee == "w")
                .map(|((caller, _), &count)| (caller.clone(), count))
                .collect();
            assert!(
                start_calls.len() == 1
                    && ["libmslprof.so", "libc.so.6"].contains(&start_calls[0].0.as_str()),
                "run {run}, MSLPROF_SITE_STUBS={setting:?}: {start_calls:?}"
            );
            counted.retain(|(_, callee), _| callee != "w");
            counted.insert(("start_thread".into(), "w".into()), start_calls[0].1);
            assert_eq!(
                counted, expected,
                "run {run}, MSLPROF_SITE_STUBS={setting:?}"
            );
            assert_eq!(profile.header.dropped_arcs, 0);
        }
    }
}

#[test]
fn four_tail_called_callees_of_one_call_site_count_exactly_and_as_glibc_does() {
    // tailcalls.c needs its sibling calls, so not `common_flags` (which turns them off).
    let flags = |extra: &[&str]| -> Vec<String> {
        ["-O2", "-pg"]
            .iter()
            .chain(extra)
            .map(|f| f.to_string())
            .collect()
    };
    let tail_function = |name: &str| name == "main" || name.starts_with("tail_");
    let rounds = 300_000u64;
    let expected: CallGraph = ["tail_a", "tail_b", "tail_c", "tail_d"]
        .into_iter()
        .map(|callee| (("main".to_string(), callee.to_string()), rounds))
        .collect();

    let oracle = Workspace::new();
    let exe = build_program(&oracle, "tail", &["tailcalls.c"], &[], &flags(&["-no-pie"]));
    run_ok(oracle.command(&exe).arg(rounds.to_string()));
    let gmon = std::fs::read(oracle.join("gmon.out")).expect("glibc wrote gmon.out");
    assert_eq!(gnu_call_graph(&exe, &gmon, &tail_function), expected);

    // The four arcs share a call site, so one own entry: the cache keeps the others in the other way of
    // its set and in the alternate sets their callees pick, instead of cycling them through one entry.
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "tail", &["tailcalls.c"], &[], &flags(&[]));
    run_ok(workspace.command_with_runtime(&exe).arg(rounds.to_string()));
    let profile = read_profile(&workspace.join("gmon.out"));
    assert_eq!(profile_call_graph(&profile, &tail_function), expected);
}

/// The main program's GOT entry for `mcount` and main's address, as near.c prints them.
fn got_mcount_and_main(stdout: &str) -> (u64, u64) {
    let parse = |word: &str| u64::from_str_radix(word.trim_start_matches("0x"), 16).unwrap();
    let words: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(words.len(), 2, "near.c printed {stdout:?}");
    (parse(words[0]), parse(words[1]))
}

#[test]
fn main_program_calls_a_copy_of_mcount_next_to_it_and_counts_stay_exact() {
    let calls = 1_000_000u64;
    let expected: CallGraph = [(("main".to_string(), "step".to_string()), calls)]
        .into_iter()
        .collect();
    let step_arcs = |name: &str| name == "main" || name == "step";
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "near", &["near.c"], &[], &pg_flags("-O2"));

    // The PIE program is mapped far from the shared libraries: its GOT entry is pointed at the copy the
    // runtime mapped next to it (within 128 MiB), and every call is counted through it.
    let stdout = run_ok(workspace.command_with_runtime(&exe).arg(calls.to_string()));
    let (mcount, main) = got_mcount_and_main(&stdout);
    assert!(
        mcount.abs_diff(main) < 1 << 30,
        "mcount {mcount:#x} is not next to main {main:#x}"
    );
    let profile = read_profile(&workspace.join("gmon.out"));
    assert_eq!(profile_call_graph(&profile, &step_arcs), expected);

    // MSLPROF_NEAR_MCOUNT=0 leaves the entry at the library's own mcount, and counts the same.
    let stdout = run_ok(
        workspace
            .command_with_runtime(&exe)
            .env("MSLPROF_NEAR_MCOUNT", "0")
            .arg(calls.to_string()),
    );
    let (far_mcount, main) = got_mcount_and_main(&stdout);
    assert!(
        far_mcount.abs_diff(main) >= 1 << 31,
        "mcount {far_mcount:#x} is next to main {main:#x} although MSLPROF_NEAR_MCOUNT=0"
    );
    let profile = read_profile(&workspace.join("gmon.out"));
    assert_eq!(profile_call_graph(&profile, &step_arcs), expected);
}

#[test]
fn signal_handler_calling_instrumented_code_during_mcount_counts_exactly() {
    let workspace = Workspace::new();
    let (handled, profile) = run_signal_fixture(&workspace, "signal", &pg_flags("-O2"));
    assert!(handled > 0);
    let graph = profile_call_graph(&profile, &|name| {
        ["main", "on_alarm", "m_work", "h_work"].contains(&name)
    });
    assert_eq!(graph[&("main".into(), "m_work".into())], 20_000_000);
    assert_eq!(graph[&("on_alarm".into(), "h_work".into())], 10 * handled);
    assert_eq!(profile.header.dropped_arcs, 0);
}

#[test]
fn registers_reach_instrumented_functions_intact() {
    let avx = cpu_has_avx();
    if !avx {
        eprintln!("note: no AVX on this CPU; __m256 arguments are not tested");
    }
    for instrumentation in Instrumentation::ALL {
        for optimization in ["-O0", "-O2"] {
            let workspace = Workspace::new();
            let mut flags = common_flags(optimization);
            flags.extend(instrumentation.flags().iter().map(|f| f.to_string()));
            if avx {
                flags.push("-mavx".into());
            }
            build_library(&workspace, "ccr", &["ccr.c"], &flags);
            let exe = build_program(&workspace, "regs", &["regs.c"], &["ccr"], &flags);
            let stdout = run_ok(&mut workspace.command_with_runtime(&exe));
            assert_eq!(stdout, "regs ok\n", "{instrumentation:?} {optimization}");
            let profile = read_profile(&workspace.join("gmon.out"));
            let calls = calls_per_function(&profile_call_graph(&profile, &|name| {
                name == "main" || name.starts_with("r_")
            }));
            let mut expected = vec!["r_doubles", "r_ints", "r_m128", "r_mixed", "r_variadic"];
            if avx {
                expected.push("r_m256");
            }
            for name in expected {
                assert_eq!(calls.get(name), Some(&3), "{name}: {calls:?}");
            }
        }
    }
}

#[test]
fn a_pg_program_leaves_only_the_runtime_profile() {
    let workspace = Workspace::new();
    let flags = pg_flags("-O2");
    let exe = build_program(&workspace, "pause", &["pause.c"], &[], &flags);
    // Without the runtime, glibc writes its own gmon.out (the fixture really is a -pg program).
    run_ok(&mut workspace.command(&exe));
    let glibc = std::fs::read(workspace.join("gmon.out")).expect("glibc's gmon.out");
    assert_eq!(&glibc[..4], b"gmon");
    std::fs::remove_file(workspace.join("gmon.out")).unwrap();

    run_ok(&mut workspace.command_with_runtime(&exe));
    let ours = std::fs::read(workspace.join("gmon.out")).expect("the runtime's gmon.out");
    assert_eq!(&ours[..8], b"\x89MSLPROF", "gmon.out is not the runtime's");
    let leftovers: Vec<_> = std::fs::read_dir(workspace.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("gmon"))
        .collect();
    assert_eq!(leftovers, ["gmon.out"]);
    // moncontrol(0) paused counting for 5 of the 22 calls.
    let profile = read_profile(&workspace.join("gmon.out"));
    let graph = profile_call_graph(&profile, &|name| name == "main" || name == "p_work");
    assert_eq!(graph[&("main".into(), "p_work".into())], 17);

    // With GPROFDIR empty the runtime writes nothing, and glibc does not either.
    std::fs::remove_file(workspace.join("gmon.out")).unwrap();
    run_ok(workspace.command_with_runtime(&exe).env("GPROFDIR", ""));
    assert!(!workspace.join("gmon.out").exists());
}

#[test]
fn calls_from_library_constructors_before_the_runtime_starts_are_counted() {
    let workspace = Workspace::new();
    let mut flags = pg_flags("-O2");
    if cpu_has_avx() {
        flags.push("-mavx".into());
    }
    build_library(&workspace, "cci", &["cci.c"], &flags);
    let exe = build_program(&workspace, "init", &["init_main.c"], &["cci"], &flags);
    let stdout = run_ok(&mut workspace.command_with_runtime(&exe));
    assert!(stdout.starts_with("ok "), "{stdout}");
    let profile = read_profile(&workspace.join("gmon.out"));
    let graph = profile_call_graph(&profile, &|name| name.starts_with("i_"));
    assert_eq!(graph[&("i_init".into(), "i_work".into())], 5, "{graph:?}");
    assert_eq!(graph[&("i_init".into(), "i_double".into())], 1, "{graph:?}");
    assert_eq!(graph[&("i_call".into(), "i_work".into())], 1, "{graph:?}");
}

#[test]
fn linked_instead_of_preloaded_the_runtime_counts_all_the_same() {
    // `cc -pg ... -lmslprof`: the program loads the runtime itself; its mcount, __fentry__ and
    // __cyg_profile_func_enter take the place of glibc's because it comes before libc.
    let runtime_dir = mslprof_tests::runtime_library()
        .parent()
        .expect("runtime directory")
        .display()
        .to_string();
    for instrumentation in Instrumentation::ALL {
        let workspace = Workspace::new();
        let mut flags = common_flags("-O2");
        flags.extend(instrumentation.flags().iter().map(|f| f.to_string()));
        build_library(&workspace, "cct", &["cct.c"], &flags);
        flags.extend([
            format!("-L{runtime_dir}"),
            format!("-Wl,-rpath,{runtime_dir}"),
            "-Wl,--no-as-needed".to_string(),
            "-lmslprof".to_string(),
        ]);
        let exe = build_program(&workspace, "threads", &["threads.c"], &["cct"], &flags);
        run_ok(workspace.command(&exe).args(["2", "1000"]));
        let bytes = std::fs::read(workspace.join("gmon.out")).expect("gmon.out");
        assert_eq!(
            &bytes[..8],
            b"\x89MSLPROF",
            "{instrumentation:?}: not the runtime's"
        );
        let profile = read_profile(&workspace.join("gmon.out"));
        let graph = profile_call_graph(&profile, &|name| name == "thread_body" || name == "t_work");
        assert_eq!(
            graph.get(&("thread_body".into(), "t_work".into())),
            Some(&2000),
            "{instrumentation:?}: {graph:?}"
        );
    }
}

#[test]
fn sites_of_hot_functions_are_rewritten_while_the_program_runs_and_count_exactly() {
    let workspace = Workspace::new();
    let exe = build_program(&workspace, "hot", &["hot.c"], &[], &pg_flags("-O2"));
    // By default hot_leaf (a thousand calls a round) becomes a jump, alone or while a second thread runs
    // through its site; cold_leaf (one call every thousand rounds) and crowded (400 call sites, whose return
    // addresses must collide in its 256-entry table) stay calls. Calls
    // before the rewrite are counted through mcount, calls after it through the stub, and the counts stay
    // exact across the move, and with a signal handler calling hot_leaf all the while.
    for (mode, setting, most_rounds, sites) in [
        ("alone", None, "400000", "jump call call"),
        ("thread", None, "400000", "jump call call"),
        ("alone", Some("0"), "3000", "call call call"),
    ] {
        let mut command = workspace.command_with_runtime(&exe);
        command.args([mode, most_rounds]).env("MSLPROF_HZ", "1000");
        if let Some(setting) = setting {
            command.env("MSLPROF_SITE_STUBS", setting);
        }
        let stdout = run_ok(&mut command);
        let what = format!("{mode}, MSLPROF_SITE_STUBS={setting:?}: {stdout}");
        let profile = read_profile(&workspace.join("gmon.out"));
        let found = assert_hot_counts_exact(&stdout, &profile, mode == "thread", &what);
        assert_eq!(found, sites, "{what}");
    }
}

#[test]
fn rewritten_sites_count_exactly_across_call_sites_threads_and_reloaded_libraries() {
    let workspace = Workspace::new();
    let flags = pg_flags("-O2");
    for (name, caller) in [("sitea", "a_calls"), ("siteb", "b_calls")] {
        let mut library_flags = flags.clone();
        library_flags.push(format!("-DCALLER={caller}"));
        build_library(&workspace, name, &["sitecaller.c"], &library_flags);
    }
    let exe = build_program(&workspace, "sites", &["sites.c"], &[], &flags);
    let expected: CallGraph = [
        (("main", "many_sites"), 1),
        (("many_sites", "step"), 300 * 1000),
        (("main", "crowd"), 1),
        (("crowd", "crowded"), 10),
        (("worker", "step"), 4 * 200_000),
        (("main", "call_library"), 2),
        (("call_library", "a_calls"), 1),
        (("a_calls", "step"), 30_000),
        (("call_library", "b_calls"), 1),
        (("b_calls", "step"), 30_000),
    ]
    .into_iter()
    .map(|((caller, callee), count)| ((caller.to_string(), callee.to_string()), count))
    .collect();
    let names = [
        "main",
        "many_sites",
        "worker",
        "call_library",
        "a_calls",
        "b_calls",
        "step",
        "crowd",
        "crowded",
    ];
    // With MSLPROF_SITE_STUBS=1 step's call of mcount is a jump to its stub, while crowded's stays a call (ten
    // direct call sites); by default both stay calls. Both count the same: 300 call sites share step's
    // 256-entry table (the rest go to the cache), four threads have regions of their own, and b_calls is not
    // counted as a_calls although libsiteb.so usually takes the place libsitea.so left.
    for (setting, site) in [(Some("1"), "jump call"), (None, "call call")] {
        let mut command = workspace.command_with_runtime(&exe);
        command.arg(workspace.path());
        if let Some(setting) = setting {
            command.env("MSLPROF_SITE_STUBS", setting);
        }
        let stdout = run_ok(&mut command);
        assert_eq!(stdout.trim(), site, "MSLPROF_SITE_STUBS={setting:?}");
        let profile = read_profile(&workspace.join("gmon.out"));
        assert_eq!(
            profile_call_graph(&profile, &|name| names.contains(&name)),
            expected,
            "MSLPROF_SITE_STUBS={setting:?}"
        );
        assert_eq!(profile.header.dropped_arcs, 0);
    }
}
