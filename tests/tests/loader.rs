//! Loader events under the real runtime: modules loaded and unloaded by dlopen/dlclose, the RUNPATH/$ORIGIN
//! look-up through the interposed dlopen, churn under fast sampling, fork, exec, programs run by a shell, and
//! abnormal ends. Every profile is decoded with the format-spec reader and checked for exact call counts.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use mslprof_format::model::{IncompleteCause, Profile, header_flags};
use mslprof_tests::loader::{
    build_plugins, build_units_program, calls_into, calls_over_instances, function, instances,
    is_unloaded, profile_files, source,
};
use mslprof_tests::{Workspace, run, wait_at_most_20s};

/// Calls into `unit` (libunits.so) recorded in `profile`.
fn unit_calls(workspace: &Workspace, profile: &Profile) -> u64 {
    let unit = function(&workspace.join("libunits.so"), "unit");
    calls_over_instances(profile, "libunits.so", &unit)
}

fn assert_success(output: &std::process::Output) {
    mslprof_tests::assert_success(output, "the fixture");
}

#[test]
fn runpath_origin_dlopen_finds_the_same_file_as_without_the_runtime() {
    let workspace = Workspace::new();
    std::fs::create_dir_all(workspace.join("lib/plugins")).unwrap();
    workspace.shared_library(
        "lib/plugins/libfound.so",
        &[source("runpath_plugin.c")],
        &[],
    );
    let finder = workspace.shared_library(
        "lib/libfinder.so",
        &[source("runpath_loader.c")],
        &["-Wl,--enable-new-dtags,-rpath,$ORIGIN/plugins", "-ldl"],
    );
    let app = workspace.program("runpath_app", &[source("runpath_app.c")], &["-ldl"]);

    let plain = run(workspace.command(&app).arg(&finder));
    let profiled = run(workspace.command_with_runtime(&app).arg(&finder));
    let expected = format!(
        "found {} value 42\n",
        workspace.join("lib/plugins/libfound.so").display()
    );
    assert_eq!(
        String::from_utf8_lossy(&plain.stdout),
        expected,
        "the fixture itself must find its plugin"
    );
    assert_eq!(
        String::from_utf8_lossy(&profiled.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "under the runtime dlopen must find the same file; stderr:\n{}",
        String::from_utf8_lossy(&profiled.stderr)
    );
    assert_eq!(profiled.status.code(), plain.status.code());
    // The loads went through the runtime's dlopen: both libraries are in the profile, unloaded.
    let profile = workspace.profile("gmon.out");
    for name in ["libfinder.so", "libfound.so"] {
        let found = instances(&profile, name);
        assert_eq!(found.len(), 1, "{name}: one load instance");
        assert!(is_unloaded(found[0]), "{name} was dlclosed before exit");
    }
}

#[test]
fn two_plugins_loaded_and_unloaded_alternately_for_fifty_cycles() {
    let workspace = Workspace::new();
    let (alpha, beta) = build_plugins(&workspace);
    let app = workspace.program("cycles", &[source("cycles.c")], &["-ldl"]);
    let output = run(workspace
        .command_with_runtime(&app)
        .arg(&alpha)
        .arg(&beta)
        .arg("50"));
    assert_success(&output);
    let profile = workspace.profile("gmon.out");

    let mut unload_orders = Vec::new();
    for (name, lib) in [("libalpha.so", &alpha), ("libbeta.so", &beta)] {
        let loads = instances(&profile, name);
        assert_eq!(loads.len(), 50, "{name}: one load instance per cycle");
        let mut keys: Vec<u32> = loads.iter().map(|m| m.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(
            keys.len(),
            50,
            "{name}: every load instance has its own key"
        );
        for module in &loads {
            assert!(
                is_unloaded(module),
                "{name} key {} is marked UNLOADED",
                module.key
            );
            assert_ne!(module.unload_order, 0);
            unload_orders.push((module.load_order, module.unload_order));
        }
        let prefix = if name == "libalpha.so" {
            "alpha"
        } else {
            "beta"
        };
        let leaf = function(lib, &format!("{prefix}_leaf"));
        let work = function(lib, &format!("{prefix}_work"));
        let setup = function(lib, &format!("{prefix}_setup"));
        for (cycle, module) in loads.iter().enumerate() {
            let cycle = cycle as u64;
            let expected_leaf = if prefix == "alpha" {
                cycle + 1
            } else {
                2 * cycle + 1
            };
            assert_eq!(
                calls_into(module, &leaf),
                expected_leaf,
                "{name} cycle {cycle}: own counts only"
            );
            assert_eq!(calls_into(module, &work), 1, "{name} cycle {cycle}");
            assert_eq!(
                calls_into(module, &setup),
                1,
                "{name} cycle {cycle}: the constructor's call is counted"
            );
        }
        let expected_leaf_total = if prefix == "alpha" {
            50 * 51 / 2
        } else {
            50 * 50
        };
        assert_eq!(
            calls_over_instances(&profile, name, &leaf),
            expected_leaf_total,
            "{name}"
        );
        assert_eq!(calls_over_instances(&profile, name, &work), 50, "{name}");
        assert_eq!(calls_over_instances(&profile, name, &setup), 50, "{name}");
    }
    // Load instance n is unloaded before load instance n + 1 of anything is loaded: unload order follows load
    // order exactly.
    unload_orders.sort_unstable();
    let orders: Vec<u32> = unload_orders.iter().map(|&(_, unload)| unload).collect();
    assert!(
        orders.windows(2).all(|w| w[0] < w[1]),
        "unload order follows load order: {orders:?}"
    );
}

#[test]
fn the_same_plugin_reloaded_is_a_new_load_instance() {
    let workspace = Workspace::new();
    let (alpha, _) = build_plugins(&workspace);
    let app = workspace.program("reload", &[source("reload.c")], &["-ldl"]);
    let output = run(workspace.command_with_runtime(&app).arg(&alpha));
    assert_success(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let biases: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("bias 0x"))
        .map(|hex| u64::from_str_radix(hex, 16).unwrap())
        .collect();
    assert_eq!(biases.len(), 2, "{stdout}");

    let profile = workspace.profile("gmon.out");
    let loads = instances(&profile, "libalpha.so");
    assert_eq!(loads.len(), 2);
    assert_ne!(loads[0].key, loads[1].key);
    assert_eq!(
        (loads[0].load_bias.0, loads[1].load_bias.0),
        (biases[0], biases[1])
    );
    if biases[0] != biases[1] {
        eprintln!(
            "note: the loader did not reuse the address this time ({biases:x?}); counts still checked"
        );
    }
    let leaf = function(&alpha, "alpha_leaf");
    assert_eq!(
        calls_into(loads[0], &leaf),
        3,
        "first instance keeps its own counts"
    );
    assert_eq!(
        calls_into(loads[1], &leaf),
        5,
        "second instance never receives the first one's counts"
    );
    assert!(loads.iter().all(|m| is_unloaded(m)));
    assert!(loads[0].unload_order < loads[1].unload_order);
}

#[test]
fn churn_of_plugins_while_another_thread_calls_one_at_the_highest_rate() {
    const ITERATIONS: u64 = 20_000;
    // At the highest rate each sample costs a timer interrupt, and on a shared virtual machine that cost swings
    // with the host's load (at 100 kHz, before the rate was capped at 10 kHz, the same 300 cycles took from 2 s
    // to 8 minutes). 100 cycles keep the churn and bound the wait.
    const CYCLES: u64 = 100;
    let workspace = Workspace::new();
    let (alpha, beta) = build_plugins(&workspace);
    let app = workspace.program("churn", &[source("churn.c")], &["-ldl", "-lpthread"]);
    let output = run(workspace
        .command_with_runtime(&app)
        .env("MSLPROF_HZ", "10000")
        .arg(&alpha)
        .arg(&beta)
        .arg(ITERATIONS.to_string())
        .arg(CYCLES.to_string()));
    assert_success(&output);
    let profile = workspace.profile("gmon.out");

    let alpha_loads = instances(&profile, "libalpha.so");
    assert_eq!(alpha_loads.len(), 1);
    assert_eq!(
        calls_into(alpha_loads[0], &function(&alpha, "alpha_work")),
        ITERATIONS
    );
    assert_eq!(
        calls_into(alpha_loads[0], &function(&alpha, "alpha_leaf")),
        10 * ITERATIONS
    );
    let beta_loads = instances(&profile, "libbeta.so");
    assert_eq!(beta_loads.len() as u64, CYCLES);
    let setup = function(&beta, "beta_setup");
    let leaf = function(&beta, "beta_leaf");
    for module in &beta_loads {
        assert!(is_unloaded(module));
        assert_eq!(calls_into(module, &setup), 1, "key {}", module.key);
        assert_eq!(calls_into(module, &leaf), 1, "key {}", module.key);
    }
    assert!(
        profile.header.total_samples > 0,
        "sampling ran during the churn"
    );
}

#[test]
fn three_forked_children_write_their_own_files() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "forker", "forker.c");
    let output = run(&mut workspace.command_with_runtime(&app));
    assert_success(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let children: Vec<u32> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("child "))
        .map(|rest| rest.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(children.len(), 3, "{stdout}");

    let mut expected: Vec<String> = children
        .iter()
        .map(|pid| format!("gmon.out.{pid}"))
        .collect();
    expected.push("gmon.out".to_string());
    expected.sort();
    assert_eq!(profile_files(&workspace), expected);

    let parent = workspace.profile("gmon.out");
    assert_eq!(
        unit_calls(&workspace, &parent),
        10,
        "parent: 7 before the forks, 3 after"
    );
    assert_eq!(parent.header.flags & header_flags::FORKED_CHILD, 0);
    for (index, pid) in children.iter().enumerate() {
        let child = workspace.profile(&format!("gmon.out.{pid}"));
        assert_eq!(child.header.pid, *pid);
        assert_ne!(child.header.flags & header_flags::FORKED_CHILD, 0);
        assert_eq!(child.header.flags & header_flags::INCOMPLETE, 0);
        // The child's profile covers only the child: it starts at the fork, after the parent's start-up and
        // its 7 calls.
        assert!(
            child.header.start_time_ns > parent.header.start_time_ns
                && child.header.start_time_ns <= child.header.end_time_ns,
            "child {index}: starts at {} (parent {})",
            child.header.start_time_ns,
            parent.header.start_time_ns
        );
        assert_eq!(
            unit_calls(&workspace, &child),
            (index as u64 + 1) * 100,
            "child {index}: only its own calls"
        );
    }
}

#[test]
fn fork_then_exec_writes_the_pre_exec_image_and_the_new_image_separately() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "forkexec", "forkexec.c");
    let output = run(&mut workspace.command_with_runtime(&app));
    assert_success(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let child: u32 = stdout
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .expect("child pid");

    let pre_exec_name = format!("gmon.out.{child}.pre-exec");
    let image_name = format!("gmon.out.{child}");
    let mut expected = vec![
        "gmon.out".to_string(),
        image_name.clone(),
        pre_exec_name.clone(),
    ];
    expected.sort();
    assert_eq!(profile_files(&workspace), expected);

    let parent = workspace.profile("gmon.out");
    assert_eq!(unit_calls(&workspace, &parent), 2);
    let pre_exec = workspace.profile(&pre_exec_name);
    assert_eq!(unit_calls(&workspace, &pre_exec), 5);
    let flags = pre_exec.header.flags;
    assert_ne!(flags & header_flags::PRE_EXEC, 0);
    assert_ne!(flags & header_flags::FORKED_CHILD, 0);
    assert_ne!(flags & header_flags::INCOMPLETE, 0);
    assert_eq!(pre_exec.header.incomplete_cause, IncompleteCause::Exec);
    let image = workspace.profile(&image_name);
    assert_eq!(unit_calls(&workspace, &image), 11);
    assert_eq!(
        image.header.flags & (header_flags::PRE_EXEC | header_flags::INCOMPLETE),
        0
    );
    assert_eq!(image.header.pid, child);
}

#[test]
fn a_shell_running_three_programs_leaves_four_files() {
    let workspace = Workspace::new();
    build_units_program(&workspace, "app", "app.c");
    let output = run(workspace
        .command_with_runtime(std::path::Path::new("sh"))
        .args(["-c", "./app; ./app; ./app"]));
    assert_success(&output);
    let files = profile_files(&workspace);
    assert_eq!(files.len(), 4, "{files:?}");
    assert!(files.contains(&"gmon.out".to_string()), "{files:?}");
    let shell = workspace.profile("gmon.out");
    assert_eq!(String::from_utf8_lossy(&shell.header.program_name), "sh");
    for name in files.iter().filter(|n| *n != "gmon.out") {
        let pid: u32 = name
            .strip_prefix("gmon.out.")
            .and_then(|p| p.parse().ok())
            .expect(name);
        let app = workspace.profile(name);
        assert_eq!(app.header.pid, pid);
        assert_eq!(String::from_utf8_lossy(&app.header.program_name), "app");
        assert_eq!(unit_calls(&workspace, &app), 13, "{name}: its own counts");
    }
}

/// How a process ended, as its parent sees it.
fn ending(status: ExitStatus) -> (Option<i32>, Option<i32>, bool) {
    (status.code(), status.signal(), status.core_dumped())
}

#[test]
fn abnormal_ends_write_an_incomplete_profile_and_keep_the_exit_status() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "endings", "endings.c");
    let cases: [(&str, IncompleteCause, i32); 13] = [
        ("exit", IncompleteCause::None, 0),
        ("overflow", IncompleteCause::Signal, libc_signal::SIGSEGV),
        ("_exit", IncompleteCause::UnderscoreExit, 0),
        ("_Exit", IncompleteCause::UnderscoreExit, 0),
        ("thread-exit", IncompleteCause::ExitFromThread, 0),
        ("segv", IncompleteCause::Signal, libc_signal::SIGSEGV),
        ("bus", IncompleteCause::Signal, libc_signal::SIGBUS),
        ("ill", IncompleteCause::Signal, libc_signal::SIGILL),
        ("fpe", IncompleteCause::Signal, libc_signal::SIGFPE),
        ("abort", IncompleteCause::Signal, libc_signal::SIGABRT),
        ("term", IncompleteCause::Signal, libc_signal::SIGTERM),
        ("int", IncompleteCause::Signal, libc_signal::SIGINT),
        ("hup", IncompleteCause::Signal, libc_signal::SIGHUP),
    ];
    for (how, cause, signal) in cases {
        let _ = std::fs::remove_file(workspace.join("gmon.out"));
        let plain = run(workspace.command(&app).arg(how));
        let profiled = run(workspace.command_with_runtime(&app).arg(how));
        assert_eq!(
            ending(profiled.status),
            ending(plain.status),
            "{how}: same exit status / signal / core dump as without the runtime; stderr:\n{}",
            String::from_utf8_lossy(&profiled.stderr)
        );
        let profile = workspace.profile("gmon.out");
        assert_eq!(profile.header.incomplete_cause, cause, "{how}");
        assert_eq!(profile.header.incomplete_signal, signal as u32, "{how}");
        let incomplete = profile.header.flags & header_flags::INCOMPLETE != 0;
        assert_eq!(
            incomplete,
            cause != IncompleteCause::None,
            "{how}: INCOMPLETE flag"
        );
        assert_eq!(
            unit_calls(&workspace, &profile),
            17,
            "{how}: what was collected is in the file"
        );
    }
}

#[test]
fn abnormal_end_dumps_can_be_turned_off() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "endings", "endings.c");
    for how in ["segv", "_exit"] {
        let plain = run(workspace.command(&app).arg(how));
        let profiled = run(workspace
            .command_with_runtime(&app)
            .env("MSLPROF_ABNORMAL_DUMP", "0")
            .arg(how));
        assert_eq!(ending(profiled.status), ending(plain.status), "{how}");
        assert!(
            profile_files(&workspace).is_empty(),
            "{how}: no profile with MSLPROF_ABNORMAL_DUMP=0"
        );
    }
}

/// Linux x86_64 signal numbers (the tests crate does not depend on libc).
mod libc_signal {
    pub const SIGHUP: i32 = 1;
    pub const SIGINT: i32 = 2;
    pub const SIGILL: i32 = 4;
    pub const SIGABRT: i32 = 6;
    pub const SIGBUS: i32 = 7;
    pub const SIGFPE: i32 = 8;
    pub const SIGSEGV: i32 = 11;
    pub const SIGTERM: i32 = 15;
}

#[test]
fn the_programs_own_signal_handling_is_unchanged() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "handlers", "handlers.c");
    let expected_stdout = [
        ("query", "before default\nafter mine\n"),
        ("exit-handler", "caught\n"),
        ("reraise", "handled\n"),
        ("eintr", "eintr\n"),
        ("ignored-exec", "survived\n"),
    ];
    for (how, stdout) in expected_stdout {
        let _ = std::fs::remove_file(workspace.join("gmon.out"));
        let plain = run(workspace.command(&app).arg(how));
        assert_eq!(
            String::from_utf8_lossy(&plain.stdout),
            stdout,
            "{how}: the fixture itself"
        );
        let profiled = run(workspace.command_with_runtime(&app).arg(how));
        assert_eq!(
            String::from_utf8_lossy(&profiled.stdout),
            stdout,
            "{how}: same behaviour under the runtime; stderr:\n{}",
            String::from_utf8_lossy(&profiled.stderr)
        );
        assert_eq!(ending(profiled.status), ending(plain.status), "{how}");
    }
    // The program's handler ended the process with _exit: that is what the profile says.
    let _ = std::fs::remove_file(workspace.join("gmon.out"));
    run(workspace.command_with_runtime(&app).arg("exit-handler"));
    let profile = workspace.profile("gmon.out");
    assert_eq!(
        profile.header.incomplete_cause,
        IncompleteCause::UnderscoreExit
    );
    assert_eq!(unit_calls(&workspace, &profile), 17);
    // The program's handler put SIG_DFL back and let the fault happen again: the profile names the signal.
    let _ = std::fs::remove_file(workspace.join("gmon.out"));
    run(workspace.command_with_runtime(&app).arg("reraise"));
    let profile = workspace.profile("gmon.out");
    assert_eq!(profile.header.incomplete_cause, IncompleteCause::Signal);
    assert_eq!(
        profile.header.incomplete_signal,
        libc_signal::SIGSEGV as u32
    );
}

#[test]
fn a_signal_that_interrupts_malloc_still_gets_its_profile_written() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "endings", "endings.c");
    let mut child = workspace
        .command_with_runtime(&app)
        .arg("term-in-malloc")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start endings");
    let status = wait_at_most_20s(
        &mut child,
        "the process hung: the signal-time dump must not need malloc's lock",
    );
    assert_eq!(status.signal(), Some(libc_signal::SIGTERM));
    let profile = workspace.profile("gmon.out");
    assert_eq!(profile.header.incomplete_cause, IncompleteCause::Signal);
    assert_eq!(
        profile.header.incomplete_signal,
        libc_signal::SIGTERM as u32
    );
    assert_eq!(unit_calls(&workspace, &profile), 17);
}

#[test]
fn vfork_and_posix_spawn_children_leave_the_parent_profile_alone() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "app", "app.c");
    let spawner = workspace.program("spawn", &[source("spawn.c")], &["-L.", "-lunits"]);
    let output = run(workspace.command_with_runtime(&spawner).arg(&app));
    assert_success(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    let [_, spawned, _, vforked, _, quitter, _, status] = fields[..] else {
        panic!("unexpected output {stdout:?}");
    };
    assert_eq!(
        status, "3",
        "the vfork child's _exit status reaches the parent"
    );
    let mut expected = vec![
        "gmon.out".to_string(),
        format!("gmon.out.{spawned}"),
        format!("gmon.out.{vforked}"),
    ];
    expected.sort();
    assert_eq!(
        profile_files(&workspace),
        expected,
        "no file from the vfork child {quitter} that only called _exit"
    );
    let parent = workspace.profile("gmon.out");
    assert_eq!(
        unit_calls(&workspace, &parent),
        10,
        "4 before and 6 after the children"
    );
    assert_eq!(parent.header.flags & header_flags::INCOMPLETE, 0);
    for pid in [spawned, vforked] {
        let child = workspace.profile(&format!("gmon.out.{pid}"));
        assert_eq!(unit_calls(&workspace, &child), 13, "{pid}");
        assert_eq!(child.header.flags & header_flags::PRE_EXEC, 0);
    }
}

#[test]
fn the_last_thread_ending_after_main_pthread_exit_is_a_complete_run() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "endings", "endings.c");
    let output = run(workspace
        .command_with_runtime(&app)
        .arg("main-pthread-exit"));
    assert_success(&output);
    let profile = workspace.profile("gmon.out");
    assert_eq!(profile.header.flags & header_flags::INCOMPLETE, 0);
    assert_eq!(profile.header.incomplete_cause, IncompleteCause::None);
    assert_eq!(unit_calls(&workspace, &profile), 20);
}

#[test]
fn threads_still_calling_at_exit_do_not_corrupt_the_profile() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "endings", "endings.c");
    for round in 0..5 {
        let _ = std::fs::remove_file(workspace.join("gmon.out"));
        let output = run(workspace.command_with_runtime(&app).arg("busy-exit"));
        assert_success(&output);
        let profile = workspace.profile("gmon.out");
        assert_eq!(
            profile.header.flags & header_flags::INCOMPLETE,
            0,
            "round {round}: exit from the main thread"
        );
        let unit = function(&workspace.join("libunits.so"), "unit");
        let units = instances(&profile, "libunits.so");
        assert_eq!(units.len(), 1);
        assert!(
            calls_into(units[0], &unit) >= 17 + 3,
            "round {round}: the busy threads' calls are in (each made one before main exited)"
        );
        assert!(
            units[0].arcs.iter().all(|arc| arc.count > 0),
            "round {round}: no torn records"
        );
    }
}

#[test]
fn nested_loads_dependencies_and_dlmopen_are_seen_before_their_constructors_run() {
    let workspace = Workspace::new();
    let (alpha, beta) = build_plugins(&workspace);
    let plugin = source("plugin.c");
    let gamma = workspace.shared_library(
        "libgamma.so",
        std::slice::from_ref(&plugin),
        &["-pg", "-DPLUGIN=gamma"],
    );
    workspace.shared_library("libdelta.so", &[plugin], &["-pg", "-DPLUGIN=delta"]);
    workspace.shared_library("libnested.so", &[source("nested.c")], &["-ldl"]);
    workspace.shared_library(
        "libwithdep.so",
        &[source("withdep.c")],
        &["-L.", "-Wl,--no-as-needed", "-lbeta", "-Wl,-rpath,$ORIGIN"],
    );
    let app = workspace.program("loads", &[source("loads.c")], &["-ldl"]);
    let output = run(workspace.command_with_runtime(&app).arg(workspace.path()));
    assert_success(&output);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
    let profile = workspace.profile("gmon.out");

    // A dlopen nested in a constructor: libalpha.so was registered before its own constructor ran.
    let alpha_loads = instances(&profile, "libalpha.so");
    assert_eq!(alpha_loads.len(), 1);
    assert_eq!(
        calls_into(alpha_loads[0], &function(&alpha, "alpha_setup")),
        1
    );
    assert_eq!(
        calls_into(alpha_loads[0], &function(&alpha, "alpha_leaf")),
        2
    );
    // A dependency: libbeta.so came with libwithdep.so, its constructor's call counted too.
    let beta_loads = instances(&profile, "libbeta.so");
    assert_eq!(beta_loads.len(), 1);
    assert_eq!(calls_into(beta_loads[0], &function(&beta, "beta_setup")), 1);
    assert_eq!(calls_into(beta_loads[0], &function(&beta, "beta_leaf")), 3);
    assert_eq!(instances(&profile, "libwithdep.so").len(), 1);
    assert_eq!(instances(&profile, "libnested.so").len(), 1);
    // dlmopen into the base namespace behaves as dlopen.
    let gamma_loads = instances(&profile, "libgamma.so");
    assert_eq!(gamma_loads.len(), 1);
    assert_eq!(
        calls_into(gamma_loads[0], &function(&gamma, "gamma_setup")),
        1
    );
    assert_eq!(
        calls_into(gamma_loads[0], &function(&gamma, "gamma_leaf")),
        5
    );
    // A new namespace is outside what the runtime sees (documented); the program still ran it (stdout "ok").
    assert!(instances(&profile, "libdelta.so").is_empty());
    assert!(
        alpha_loads
            .iter()
            .chain(&beta_loads)
            .all(|m| !is_unloaded(m))
    );
}

#[test]
fn fork_while_another_thread_is_inside_dlopen_does_not_wait_for_it() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "forkduringopen", "forkduringopen.c");
    let waiter = workspace.shared_library("libwaiter.so", &[source("waiter.c")], &[]);
    let mut child = workspace
        .command_with_runtime(&app)
        .arg(&waiter)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start forkduringopen");
    let status = wait_at_most_20s(
        &mut child,
        "deadlock: fork waited for a dlopen whose constructor waited for the fork",
    );
    assert!(status.success(), "{status:?}");
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    let pid: u32 = stdout
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .expect("child pid");
    let parent = workspace.profile("gmon.out");
    assert_eq!(unit_calls(&workspace, &parent), 8);
    assert_eq!(instances(&parent, "libwaiter.so").len(), 1);
    let forked = workspace.profile(&format!("gmon.out.{pid}"));
    assert_eq!(unit_calls(&workspace, &forked), 5);
}

#[test]
fn threads_forking_at_once_each_get_their_mask_back_and_every_child_its_file() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "forkstorm", "forkstorm.c");
    let output = run(&mut workspace.command_with_runtime(&app));
    assert_success(&output);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "blocked 0\nchildren 40\n"
    );
    let files = profile_files(&workspace);
    assert_eq!(files.len(), 41, "{files:?}");
    for name in files.iter().filter(|n| *n != "gmon.out") {
        let child = workspace.profile(name);
        assert_eq!(unit_calls(&workspace, &child), 1, "{name}");
        assert_ne!(child.header.flags & header_flags::FORKED_CHILD, 0);
    }
}

#[test]
fn time_spent_in_a_constructor_during_dlopen_is_the_new_modules() {
    let workspace = Workspace::new();
    let spinner = workspace.shared_library("libspinner.so", &[source("spinner.c")], &["-O0"]);
    let app = workspace.program("openone", &[source("openone.c")], &["-ldl"]);
    // The constructor spins until the runtime has counted 15 more samples (the test hooks tell it how many).
    let output = run(workspace
        .command_with_test_hooks_runtime(&app)
        .arg(&spinner));
    assert_success(&output);
    let profile = workspace.profile("gmon.out");
    let loads = instances(&profile, "libspinner.so");
    assert_eq!(loads.len(), 1);
    let total = profile.header.total_samples;
    // About 15 samples or more; all of them taken before the rescan that follows dlopen could register it.
    assert!(
        loads[0].samples * 10 >= total * 8 && loads[0].samples >= 10,
        "libspinner.so has {} of {total} samples ({} unknown)",
        loads[0].samples,
        profile.header.unknown_samples
    );
    assert_eq!(mslprof_tests::histogram_total(loads[0]), loads[0].samples);
}

#[test]
fn gprofdir_names_carry_the_pid_for_forked_children_and_pre_exec_images() {
    let workspace = Workspace::new();
    let app = build_units_program(&workspace, "forkexec", "forkexec.c");
    let directory = workspace.join("profiles");
    std::fs::create_dir(&directory).unwrap();
    let output = run(workspace
        .command_with_runtime(&app)
        .env("GPROFDIR", &directory));
    assert_success(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let child: u32 = stdout
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .expect("child pid");
    let mut names: Vec<String> = std::fs::read_dir(&directory)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let parent_pid = parent_pid_among(&directory, &names, child);
    let mut expected = vec![
        format!("{parent_pid}.forkexec"),
        format!("{child}.forkexec"),
        format!("{child}.forkexec.pre-exec"),
    ];
    expected.sort();
    assert_eq!(names, expected);
    let pre_exec =
        mslprof_tests::read_profile(&directory.join(format!("{child}.forkexec.pre-exec")));
    assert_ne!(pre_exec.header.flags & header_flags::PRE_EXEC, 0);
    assert_eq!(unit_calls(&workspace, &pre_exec), 5);
    let image = mslprof_tests::read_profile(&directory.join(format!("{child}.forkexec")));
    assert_eq!(unit_calls(&workspace, &image), 11);
    assert!(
        profile_files(&workspace).is_empty(),
        "nothing written outside GPROFDIR"
    );
}

/// The pid of the one file in `names` that is neither the child's nor its pre-exec image.
fn parent_pid_among(directory: &std::path::Path, names: &[String], child: u32) -> u32 {
    let parent = names
        .iter()
        .find(|n| !n.starts_with(&format!("{child}.")))
        .unwrap_or_else(|| panic!("no parent file in {}: {names:?}", directory.display()));
    parent.split('.').next().unwrap().parse().unwrap()
}

#[test]
fn a_dlclose_that_only_drops_a_reference_is_not_an_unload() {
    let workspace = Workspace::new();
    let (alpha, _) = build_plugins(&workspace);
    let app = workspace.program("refcount", &[source("refcount.c")], &["-ldl"]);
    let output = run(workspace.command_with_runtime(&app).arg(&alpha));
    assert_success(&output);
    let profile = workspace.profile("gmon.out");
    let loads = instances(&profile, "libalpha.so");
    assert_eq!(
        loads.len(),
        2,
        "one instance until the last dlclose, then a new one"
    );
    let leaf = function(&alpha, "alpha_leaf");
    assert!(is_unloaded(loads[0]));
    assert_eq!(
        calls_into(loads[0], &leaf),
        4,
        "calls after the first dlclose still count in the first instance"
    );
    assert!(
        !is_unloaded(loads[1]),
        "the third dlopen's instance is still loaded at exit"
    );
    assert_eq!(loads[1].unload_order, 0);
    assert_eq!(calls_into(loads[1], &leaf), 6);
}
