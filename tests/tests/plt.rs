//! Calls through the PLT into modules not compiled for counting (issue 10), counted by the `LD_AUDIT` module
//! libmslprof_audit.so: exact counts and callers, lazy binding and bind-now, `MSLPROF_PLT=0`, no double
//! counting of `-pg` code, function addresses unchanged, and calls counted when only the caller's module is
//! selected.

use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_format::model::Profile;
use mslprof_tests::callcounts::{self, CallGraph, Symbols, profile_call_graph, run_ok};
use mslprof_tests::{Workspace, audit_library, fixtures_dir};

fn source(name: &str) -> PathBuf {
    fixtures_dir("plt").join(name)
}

/// The program under the runtime with the audit module.
fn counted(workspace: &Workspace, program: &std::path::Path) -> Command {
    let mut command = workspace.command_with_runtime(program);
    command.env("LD_AUDIT", audit_library());
    command
}

/// `mslprof ARGS` run in the workspace: its standard output.
fn report(workspace: &Workspace, args: &[&str]) -> String {
    run_ok(
        Command::new(mslprof_tests::analyzer_binary())
            .current_dir(workspace.path())
            .args(args),
    )
}

fn graph(profile: &Profile, names: &[&str]) -> CallGraph {
    profile_call_graph(profile, &|name| names.contains(&name))
}

/// libleaf.so and plt_main, both without -pg, linked with `link_flags`.
fn leaf_program(workspace: &Workspace, link_flags: &[&str]) -> PathBuf {
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
    let mut flags = vec!["-L.", "-lleaf", "-ldl"];
    flags.extend(link_flags);
    workspace.program("plt_main", &[source("plt_main.c")], &flags)
}

const EXPECTED_OUTPUT: &str = "sum 1499999500000 same address 1\n";

#[test]
fn a_million_plt_calls_into_an_uninstrumented_library_are_counted_exactly_lazy_and_bind_now() {
    for link_flags in [&[][..], &["-Wl,-z,now"][..]] {
        let workspace = Workspace::new();
        let program = leaf_program(&workspace, link_flags);
        assert_eq!(run_ok(&mut workspace.command(&program)), EXPECTED_OUTPUT);
        let stdout = run_ok(&mut counted(&workspace, &program));
        assert_eq!(stdout, EXPECTED_OUTPUT, "output changed ({link_flags:?})");
        let arcs = graph(&workspace.profile("gmon.out"), &["plt_caller", "plt_leaf"]);
        assert_eq!(
            arcs.get(&("plt_caller".into(), "plt_leaf".into())),
            Some(&1_000_000),
            "{link_flags:?}: {arcs:?}"
        );
        assert_eq!(arcs.len(), 1, "{arcs:?}");
    }
}

#[test]
fn ld_bind_now_in_the_environment_is_counted_too() {
    let workspace = Workspace::new();
    let program = leaf_program(&workspace, &[]);
    let stdout = run_ok(counted(&workspace, &program).env("LD_BIND_NOW", "1"));
    assert_eq!(stdout, EXPECTED_OUTPUT);
    let arcs = graph(&workspace.profile("gmon.out"), &["plt_caller", "plt_leaf"]);
    assert_eq!(
        arcs.get(&("plt_caller".into(), "plt_leaf".into())),
        Some(&1_000_000)
    );
}

#[test]
fn mslprof_plt_0_turns_plt_counting_off() {
    let workspace = Workspace::new();
    let program = leaf_program(&workspace, &[]);
    let stdout = run_ok(counted(&workspace, &program).env("MSLPROF_PLT", "0"));
    assert_eq!(stdout, EXPECTED_OUTPUT);
    let arcs = graph(&workspace.profile("gmon.out"), &["plt_caller", "plt_leaf"]);
    assert!(arcs.is_empty(), "{arcs:?}");
}

#[test]
fn libc_calls_from_a_pg_program_are_counted_once_with_their_caller() {
    let workspace = Workspace::new();
    let program = workspace.program(
        "libc_caller",
        &[source("libc_caller.c")],
        &["-pg", "-fno-builtin"],
    );
    let stdout = run_ok(&mut counted(&workspace, &program));
    assert_eq!(stdout, "sum 2500000000\n");
    let arcs = graph(&workspace.profile("gmon.out"), &["main", "pg_parse", "abs"]);
    assert_eq!(
        arcs.get(&("pg_parse".into(), "abs".into())),
        Some(&100_000),
        "{arcs:?}"
    );
    // The runtime's own calls are not counted, not even those libc makes for it through its PLT.
    let flat = report(&workspace, &["-b", "-p", "gmon.out"]);
    assert!(!flat.contains(" realloc"), "{flat}");
    assert!(flat.contains(" abs (PLT)\n"), "{flat}");
    // mcount's own arc, counted once: the program's calls into itself are not redirected.
    assert_eq!(
        arcs.get(&("main".into(), "pg_parse".into())),
        Some(&1),
        "{arcs:?}"
    );
}

#[test]
fn four_threads_racing_to_bind_are_counted_exactly_lazy_and_bind_now() {
    for link_flags in [&[][..], &["-Wl,-z,now"][..]] {
        let workspace = Workspace::new();
        workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
        let mut flags = vec!["-L.", "-lleaf", "-pthread"];
        flags.extend(link_flags);
        let program = workspace.program(
            "plt_threads",
            &[source("plt_threads.c"), source("plt_caller.c")],
            &flags,
        );
        let stdout = run_ok(&mut counted(&workspace, &program));
        assert_eq!(stdout, "total 5999998000000\n");
        let arcs = graph(&workspace.profile("gmon.out"), &["plt_caller", "plt_leaf"]);
        assert_eq!(
            arcs.get(&("plt_caller".into(), "plt_leaf".into())),
            Some(&4_000_000),
            "{link_flags:?}: {arcs:?}"
        );
    }
}

#[test]
fn a_dlopened_uninstrumented_plugin_calling_libc_is_counted_across_50_loads_and_unloads() {
    let workspace = Workspace::new();
    let plugin = workspace.shared_library("libplugin.so", &[source("plugin.c")], &["-fno-builtin"]);
    let program = workspace.program("plt_dlopen", &[source("plt_dlopen.c")], &["-ldl"]);
    let stdout = run_ok(counted(&workspace, &program).arg(&plugin));
    assert_eq!(stdout, "total 12500000\n");
    let arcs = graph(&workspace.profile("gmon.out"), &["plugin_work", "abs"]);
    assert_eq!(
        arcs.get(&("plugin_work".into(), "abs".into())),
        Some(&50_000),
        "{arcs:?}"
    );
}

#[test]
fn a_forked_child_counts_only_its_own_plt_calls() {
    let workspace = Workspace::new();
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
    let program = workspace.program(
        "plt_fork",
        &[source("plt_fork.c"), source("plt_caller.c")],
        &["-L.", "-lleaf"],
    );
    let stdout = run_ok(&mut counted(&workspace, &program));
    let child_line = "child 135001349500";
    assert!(stdout.contains(child_line), "{stdout}");
    let child_pid = stdout
        .split("child pid ")
        .nth(1)
        .and_then(|rest| rest.trim().parse::<u32>().ok())
        .unwrap_or_else(|| panic!("no child pid in {stdout:?}"));
    assert!(stdout.contains("parent 60001399500 child pid"), "{stdout}");
    let names = ["plt_caller", "plt_leaf"];
    let arc = ("plt_caller".to_string(), "plt_leaf".to_string());
    let parent = graph(&workspace.profile("gmon.out"), &names);
    assert_eq!(parent.get(&arc), Some(&201_000), "{parent:?}");
    let child = graph(&workspace.profile(&format!("gmon.out.{child_pid}")), &names);
    assert_eq!(child.get(&arc), Some(&300_000), "{child:?}");
}

#[test]
fn a_pg_library_called_through_the_plt_is_counted_once_by_mcount() {
    let workspace = Workspace::new();
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &["-pg"]);
    let program = workspace.program(
        "plt_main",
        &[source("plt_main.c")],
        &["-L.", "-lleaf", "-ldl"],
    );
    let stdout = run_ok(&mut counted(&workspace, &program));
    assert_eq!(stdout, EXPECTED_OUTPUT);
    let arcs = graph(&workspace.profile("gmon.out"), &["plt_caller", "plt_leaf"]);
    assert_eq!(
        arcs.get(&("plt_caller".into(), "plt_leaf".into())),
        Some(&1_000_000),
        "{arcs:?}"
    );
}

#[test]
fn callers_in_modules_that_are_not_profiled_are_named_without_entries() {
    let workspace = Workspace::new();
    let program = leaf_program(&workspace, &[]);
    let stdout = run_ok(counted(&workspace, &program).env("MSLPROF_PROFILE", "libleaf.so"));
    assert_eq!(stdout, EXPECTED_OUTPUT);
    let report = report(&workspace, &["-b", "gmon.out"]);
    let graph_lines: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.contains("Call graph"))
        .collect();
    let entry = graph_lines
        .iter()
        .position(|l| l.starts_with('[') && l.ends_with(" plt_leaf [1]"))
        .unwrap_or_else(|| panic!("no entry for plt_leaf:\n{report}"));
    assert!(
        graph_lines[entry - 1].contains(" 1000000/1000000     plt_caller@plt_main ["),
        "{report}"
    );
    assert!(graph_lines[entry].contains(" 1000000 "), "{report}");
    // No entry (flat or call graph) of its own for a function of the unprofiled program.
    assert!(
        !report.lines().any(|l| {
            l.trim_end().ends_with("plt_caller@plt_main")
                || (l.starts_with('[') && l.contains("plt_caller"))
        }),
        "{report}"
    );
    assert!(!report.contains("<spontaneous>\n[1]"), "{report}");
}

/// libleaf.so (built with `leaf_flags`) and caller_only (calls into libleaf, libm and libc, without -pg), linked
/// with `link_flags`.
fn caller_only_program(workspace: &Workspace, leaf_flags: &[&str], link_flags: &[&str]) -> PathBuf {
    workspace.shared_library("libleaf.so", &[source("leaf.c")], leaf_flags);
    let mut flags = vec!["-fno-builtin", "-L.", "-lleaf", "-lm"];
    flags.extend(link_flags);
    workspace.program(
        "caller_only",
        &[source("caller_only.c"), source("plt_caller.c")],
        &flags,
    )
}

const CALLER_ONLY_OUTPUT: &str = "sum 1499999500000 cbrt 32443 sin 246 abs 1000000\n";

/// Every arc of `profile` as (caller function in `program`, callee module's file name, count); panics on an
/// arc whose caller is not in `program`.
fn arcs_from_program(profile: &Profile, program: &std::path::Path) -> Vec<(String, String, u64)> {
    let key = profile
        .modules
        .iter()
        .find(|m| m.is_main_program())
        .map(|m| m.key)
        .expect("the program is in the profile");
    let symbols = Symbols::of(program);
    let mut arcs: Vec<(String, String, u64)> = profile
        .modules
        .iter()
        .flat_map(|module| module.arcs.iter().map(move |arc| (module, arc)))
        .map(|(module, arc)| {
            assert_eq!(arc.caller_key, key, "a caller outside the program: {arc:?}");
            let caller = symbols
                .function_at(arc.caller_address.0)
                .unwrap_or("?")
                .to_string();
            (
                caller,
                String::from_utf8_lossy(&module.name).into_owned(),
                arc.count,
            )
        })
        .collect();
    arcs.sort();
    arcs
}

#[test]
fn plt_calls_are_counted_when_only_the_callers_module_is_selected_lazy_and_bind_now() {
    for (link_flags, variable) in [
        (&[][..], "MSLPROF_PROFILE"),
        (&["-Wl,-z,now"][..], "MSLPROF_PROFILE"),
        (&[][..], "LD_PROFILE"),
    ] {
        let workspace = Workspace::new();
        let program = caller_only_program(&workspace, &[], link_flags);
        assert_eq!(run_ok(&mut workspace.command(&program)), CALLER_ONLY_OUTPUT);
        let stdout = run_ok(
            counted(&workspace, &program)
                .env(variable, "a.out")
                .env("LD_PROFILE_OUTPUT", workspace.path()),
        );
        let case = format!("{variable}=a.out {link_flags:?}");
        assert_eq!(stdout, CALLER_ONLY_OUTPUT, "{case}");
        let profile = workspace.profile("gmon.out");
        // Only the program is selected; the modules it calls carry the arcs (CALLEE_ARCS), no histogram.
        for module in &profile.modules {
            assert_eq!(module.is_profiled(), module.is_main_program(), "{case}");
            if !module.arcs.is_empty() && !module.is_profiled() {
                assert!(
                    module.histogram.is_none() && module.may_have_arcs(),
                    "{case}"
                );
            }
        }
        // Exactly the program's calls through the PLT, from their callers (sin is an IFUNC: its variant,
        // __sin_fma or another, depends on the CPU, so it is checked by module); none between the modules
        // that are not selected (libleaf's, libm's and libc's own calls into libc).
        let expected = [
            ("abs_caller", "libc.so.6", 2000),
            ("cbrt_caller", "libm.so.6", 3000),
            ("main", "libc.so.6", 1),
            ("plt_caller", "libleaf.so", 1_000_000),
            ("sin_caller", "libm.so.6", 7000),
        ]
        .map(|(caller, module, count)| (caller.to_string(), module.to_string(), count));
        assert_eq!(arcs_from_program(&profile, &program), expected, "{case}");

        let report = report(&workspace, &["-b", "gmon.out"]);
        let flat: Vec<&str> = report
            .lines()
            .skip_while(|l| !l.starts_with("Flat profile"))
            .take_while(|l| !l.contains("Call graph"))
            .collect();
        for (calls, name) in [("1000000", "plt_leaf"), ("2000", "abs")] {
            assert!(
                flat.iter().any(|l| l.ends_with(&format!("  {name} (PLT)"))
                    && l.split_whitespace().nth(3) == Some(calls)),
                "{case}: no flat row for {name}:\n{report}"
            );
        }
        assert!(
            report
                .contains("In a module that is not profiled, only the calls from profiled modules"),
            "{case}:\n{report}"
        );
        let graph_lines: Vec<&str> = report
            .lines()
            .skip_while(|l| !l.contains("Call graph"))
            .collect();
        for (caller, callee, calls) in [
            ("plt_caller", "plt_leaf", 1_000_000),
            ("abs_caller", "abs", 2000),
        ] {
            let entry = graph_lines
                .iter()
                .position(|l| {
                    l.starts_with('[') && l.contains(&format!(" {calls}         {callee} ["))
                })
                .unwrap_or_else(|| panic!("{case}: no entry for {callee}:\n{report}"));
            // One caller line, the program's function, with all the calls.
            assert!(
                graph_lines[entry - 1].contains(&format!(" {calls}/{calls}"))
                    && graph_lines[entry - 1].contains(&format!(" {caller} [")),
                "{case}:\n{report}"
            );
            assert!(
                graph_lines[entry - 2].starts_with("---")
                    || graph_lines[entry - 2].starts_with("index"),
                "{case}:\n{report}"
            );
        }
    }
}

#[test]
fn calls_into_a_pg_library_that_is_not_selected_stay_uncounted_when_only_the_caller_is_selected() {
    // mcount counts the -pg library's functions, so the audit module does not redirect calls into it: with only
    // the program selected they are not counted (the library is not profiled), while the program's calls into
    // libc and libm still are.
    let workspace = Workspace::new();
    let program = caller_only_program(&workspace, &["-pg"], &[]);
    let stdout = run_ok(counted(&workspace, &program).env("MSLPROF_PROFILE", "a.out"));
    assert_eq!(stdout, CALLER_ONLY_OUTPUT);
    let profile = workspace.profile("gmon.out");
    let arcs = arcs_from_program(&profile, &program);
    assert!(
        !arcs.iter().any(|(_, module, _)| module == "libleaf.so"),
        "{arcs:?}"
    );
    assert!(
        arcs.contains(&("abs_caller".into(), "libc.so.6".into(), 2000)),
        "{arcs:?}"
    );
}

#[test]
fn the_ld_profile_restart_loads_the_audit_module_with_room_for_much_initial_exec_tls() {
    // A bare LD_PRELOAD with LD_PROFILE: the restart that moves LD_PROFILE away from ld.so also loads the audit
    // module, with the static TLS that the libraries loaded at start-up need (40 000 bytes of initial-exec TLS
    // here, which glibc refuses under an audit module by default), and gives the program the environment it was
    // started with.
    let workspace = Workspace::new();
    workspace.shared_library("libbig_tls.so", &[source("big_tls.c")], &[]);
    let program = workspace.program(
        "big_tls_main",
        &[source("big_tls_main.c")],
        &["-L.", "-lbig_tls"],
    );
    let bare = workspace
        .command(&program)
        .env("LD_AUDIT", audit_library())
        .env_remove("GLIBC_TUNABLES")
        .output()
        .expect("runs");
    assert!(
        !bare.status.success() && String::from_utf8_lossy(&bare.stderr).contains("static TLS"),
        "glibc's own limit under an audit module: {bare:?}"
    );
    for (tunables, shown) in [
        (None, "(unset)"),
        (Some("glibc.malloc.check=0"), "glibc.malloc.check=0"),
    ] {
        let mut command = workspace.command_with_runtime(&program);
        command.env("LD_PROFILE", "a.out").env_remove("LD_AUDIT");
        match tunables {
            Some(value) => command.env("GLIBC_TUNABLES", value),
            None => command.env_remove("GLIBC_TUNABLES"),
        };
        let stdout = run_ok(&mut command);
        assert_eq!(
            stdout,
            format!("sum 1000 LD_AUDIT (unset) GLIBC_TUNABLES {shown}\n")
        );
        let profile = workspace.profile("gmon.out");
        // main's calls through the PLT: big_tls_touch, and getenv twice and printf in libc, once each.
        let expected = [
            ("libbig_tls.so", 1000),
            ("libc.so.6", 1),
            ("libc.so.6", 1),
            ("libc.so.6", 1),
        ]
        .map(|(module, count)| ("main".to_string(), module.to_string(), count));
        assert_eq!(
            arcs_from_program(&profile, &program),
            expected,
            "GLIBC_TUNABLES {tunables:?}"
        );
        // ld.so's own profiler wrote nothing (LD_PROFILE_OUTPUT is the workspace).
        let glibc_files: Vec<_> = std::fs::read_dir(workspace.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".profile"))
            .collect();
        assert!(glibc_files.is_empty(), "{glibc_files:?}");
    }
    // MSLPROF_PLT=0: no audit module, so the program runs as it did, without call counts.
    let stdout = run_ok(
        workspace
            .command_with_runtime(&program)
            .env("LD_PROFILE", "a.out")
            .env("MSLPROF_PLT", "0")
            .env_remove("LD_AUDIT")
            .env_remove("GLIBC_TUNABLES"),
    );
    assert_eq!(stdout, "sum 1000 LD_AUDIT (unset) GLIBC_TUNABLES (unset)\n");
    assert!(
        workspace
            .profile("gmon.out")
            .modules
            .iter()
            .all(|m| m.arcs.is_empty())
    );
}

/// `tool ARGS` (binutils): its standard output.
fn binutils(tool: &str, args: &[&std::ffi::OsStr]) -> String {
    run_ok(Command::new(tool).args(args))
}

/// Checks that `function`'s disassembly in `elf` (objdump) has an instruction `mnemonic` naming `target`
/// (e.g. `jmp` and `<kinds_tls_add@plt>`); panics with the function's disassembly otherwise.
fn assert_disassembly_has(elf: &Path, function: &str, mnemonic: &str, target: &str) {
    let code = binutils(
        "objdump",
        &[
            "-d".as_ref(),
            "--no-show-raw-insn".as_ref(),
            elf.as_os_str(),
        ],
    );
    let header = format!("<{function}>:");
    let body: Vec<&str> = code
        .lines()
        .skip_while(|l| !l.ends_with(&header))
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(
        body.iter()
            .any(|l| l.contains(mnemonic) && l.contains(target)),
        "{body:#?}"
    );
}

/// libkinds.so (-mtls-dialect=gnu2) and plt_kinds (-O2, non-PIE), both uninstrumented, with the program's
/// output under the runtime and the audit module, which must equal the output without them.
fn kinds_program(workspace: &Workspace) -> (PathBuf, PathBuf) {
    let library = workspace.shared_library(
        "libkinds.so",
        &[source("kinds.c")],
        &["-O2", "-mtls-dialect=gnu2"],
    );
    let program = workspace.program(
        "plt_kinds",
        &[source("plt_kinds.c")],
        &["-O2", "-no-pie", "-fno-builtin", "-L.", "-lkinds"],
    );
    let plain = run_ok(&mut workspace.command(&program));
    assert_eq!(
        plain,
        "twice 9999900000 strlen 1450000 tls 5000050000 local 10000000000 self 14999850000\n"
    );
    assert_eq!(run_ok(&mut counted(workspace, &program)), plain);
    (library, program)
}

fn kinds_graph(workspace: &Workspace) -> CallGraph {
    profile_call_graph(&workspace.profile("gmon.out"), &|name| {
        [
            "ifunc_caller",
            "libc_ifunc_caller",
            "tail_hop",
            "tail_outer",
            "irelative_caller",
            "kinds_twice_plain",
            "kinds_tls_add",
            "local_twice_plain",
            "kinds_self_caller",
            "kinds_inner",
            "main",
        ]
        .contains(&name)
    })
}

#[test]
fn ifunc_symbols_called_through_the_plt_are_counted_exactly_under_the_variant_ld_so_chose() {
    let workspace = Workspace::new();
    kinds_program(&workspace);
    let arcs = kinds_graph(&workspace);
    // The fixture library's own IFUNC: its resolver picks kinds_twice_plain.
    assert_eq!(
        arcs.get(&("ifunc_caller".into(), "kinds_twice_plain".into())),
        Some(&100_000),
        "{arcs:?}"
    );
    // libc's strlen is an IFUNC too. Its variant depends on the CPU (__strlen_avx2, __strlen_evex, ...) and
    // is a local symbol of libc.so.6, so the arc is checked by module: one arc, into libc, 100 000 calls.
    let profile = workspace.profile("gmon.out");
    let symbols = Symbols::of(&workspace.path().join("plt_kinds"));
    let program_key = profile
        .modules
        .iter()
        .find(|m| m.path.ends_with(b"/plt_kinds"))
        .map(|m| m.key);
    let from_strlen_caller: Vec<(&[u8], u64)> = profile
        .modules
        .iter()
        .flat_map(|module| module.arcs.iter().map(move |arc| (module, arc)))
        .filter(|(_, arc)| {
            Some(arc.caller_key) == program_key
                && symbols.function_at(arc.caller_address.0) == Some("libc_ifunc_caller")
        })
        .map(|(module, arc)| (&module.path[..], arc.count))
        .collect();
    assert_eq!(from_strlen_caller.len(), 1, "{from_strlen_caller:?}");
    let (callee_module, count) = from_strlen_caller[0];
    assert!(
        String::from_utf8_lossy(callee_module).contains("/libc.so"),
        "{from_strlen_caller:?}"
    );
    assert_eq!(count, 100_000);
}

#[test]
fn a_tail_call_through_the_plt_is_counted_exactly_with_the_callers_caller() {
    let workspace = Workspace::new();
    let (_, program) = kinds_program(&workspace);
    // The fixture is what it claims: tail_hop ends with `jmp kinds_tls_add@plt`.
    assert_disassembly_has(&program, "tail_hop", "jmp", "<kinds_tls_add@plt>");
    let arcs = kinds_graph(&workspace);
    // kinds_tls_add returns straight to tail_outer, whose call site the arc names.
    assert_eq!(
        arcs.get(&("tail_outer".into(), "kinds_tls_add".into())),
        Some(&100_000),
        "{arcs:?}"
    );
    assert!(
        !arcs.keys().any(|(caller, callee)| caller == "tail_hop"
            || (callee == "kinds_tls_add" && caller != "tail_outer")),
        "{arcs:?}"
    );
}

#[test]
fn a_librarys_calls_through_its_own_plt_are_not_counted() {
    let workspace = Workspace::new();
    let (library, _) = kinds_program(&workspace);
    // The fixture is what it claims: kinds_self_caller calls kinds_inner through libkinds.so's PLT.
    assert_disassembly_has(&library, "kinds_self_caller", "call", "<kinds_inner@plt>");
    let arcs = kinds_graph(&workspace);
    // The call into the library is counted; the library's 100 000 calls to itself never leave it.
    assert_eq!(
        arcs.get(&("main".into(), "kinds_self_caller".into())),
        Some(&1),
        "{arcs:?}"
    );
    assert!(
        !arcs.keys().any(|(_, callee)| callee == "kinds_inner"),
        "{arcs:?}"
    );
}

#[test]
fn tlsdesc_and_irelative_relocations_keep_the_program_right_and_are_never_counted_wrongly() {
    let workspace = Workspace::new();
    let (library, program) = kinds_program(&workspace);
    // The fixtures have the relocations the test is about.
    let library_relocations = binutils("readelf", &["-rW".as_ref(), library.as_os_str()]);
    assert!(
        library_relocations
            .lines()
            .any(|l| l.contains("R_X86_64_TLSDESC") && l.contains("kinds_tls_total")),
        "{library_relocations}"
    );
    let program_relocations = binutils("readelf", &["-rW".as_ref(), program.as_os_str()]);
    assert!(
        program_relocations.contains("R_X86_64_IRELATIVE"),
        "{program_relocations}"
    );
    let arcs = kinds_graph(&workspace);
    // The function reading its TLS through a descriptor is counted like any other (the output above shows
    // the thread-local total right); the descriptor call itself is no PLT binding.
    assert_eq!(
        arcs.get(&("tail_outer".into(), "kinds_tls_add".into())),
        Some(&100_000),
        "{arcs:?}"
    );
    // The program's own IFUNC, bound by IRELATIVE (no symbol, so no la_symbind64): a call inside one module,
    // not counted, and nothing else is counted in its place.
    assert!(
        !arcs
            .keys()
            .any(|(caller, callee)| caller == "irelative_caller" || callee == "local_twice_plain"),
        "{arcs:?}"
    );
    // The two arcs above and main's one call of kinds_self_caller.
    assert_eq!(arcs.len(), 3, "{arcs:?}");
}

#[test]
fn arguments_reach_the_function_called_through_the_plt_intact() {
    // The register-preservation fixtures of the callcounts tests (integers, doubles, mixed, __m128,
    // variadic with its vector count in rax, __m256 with AVX), built without instrumentation: every call of
    // the program into its library goes through the PLT and a counting stub.
    let avx = callcounts::cpu_has_avx();
    for optimization in ["-O0", "-O2"] {
        let workspace = Workspace::new();
        let mut flags = callcounts::common_flags(optimization);
        if avx {
            flags.push("-mavx".into());
        }
        callcounts::build_library(&workspace, "ccr", &["ccr.c"], &flags);
        let program = callcounts::build_program(&workspace, "regs", &["regs.c"], &["ccr"], &flags);
        assert_eq!(run_ok(&mut counted(&workspace, &program)), "regs ok\n");
        let profile = workspace.profile("gmon.out");
        let arcs = profile_call_graph(&profile, &|name| name == "main" || name.starts_with("r_"));
        let mut expected = vec!["r_doubles", "r_ints", "r_m128", "r_mixed", "r_variadic"];
        if avx {
            expected.push("r_m256");
        }
        for name in expected {
            assert_eq!(
                arcs.get(&("main".into(), name.into())),
                Some(&3),
                "{optimization} {name}: {arcs:?}"
            );
        }
    }
}

#[test]
fn a_program_with_its_own_malloc_calling_through_the_plt_runs_and_is_counted_under_ld_profile() {
    // ld.so allocates the audit module's thread-local storage with the program's malloc, whose PLT call
    // comes back into the audit module (rustc with jemalloc crashed so under LD_PROFILE=ALL, which makes
    // ld.so bind every slot lazily through its profiling trampoline). MSLPROF_REEXEC=0 keeps that trampoline
    // for the whole run; the default restart is tested too.
    for reexec in ["0", "1"] {
        let workspace = Workspace::new();
        workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
        let program = workspace.program(
            "own_malloc",
            &[source("own_malloc.c")],
            &["-L.", "-lleaf", "-fno-builtin"],
        );
        let stdout = run_ok(
            counted(&workspace, &program)
                .env("LD_PROFILE", "ALL")
                .env("LD_PROFILE_OUTPUT", workspace.path())
                .env("MSLPROF_REEXEC", reexec),
        );
        assert_eq!(
            stdout, "sum 1499500 allocated 1\n",
            "MSLPROF_REEXEC={reexec}"
        );
        let arcs = graph(
            &workspace.profile("gmon.out"),
            &["own_malloc_caller", "plt_leaf"],
        );
        assert_eq!(
            arcs.get(&("own_malloc_caller".into(), "plt_leaf".into())),
            Some(&1000),
            "MSLPROF_REEXEC={reexec}: {arcs:?}"
        );
    }
}

#[test]
fn plt_calls_from_constructors_before_the_runtime_do_not_keep_ld_profile_from_restarting_the_program()
 {
    // A constructor running before the runtime's calls through the PLT. Were that call counted in the first
    // image, it would start the runtime early, and a started runtime does not restart the program: ld.so's
    // profiling trampoline would then stay for the whole run (rustc's LLVM constructors did this).
    let workspace = Workspace::new();
    workspace.shared_library("libleaf.so", &[source("leaf.c")], &[]);
    workspace.shared_library("libctor.so", &[source("ctor.c")], &["-L.", "-lleaf"]);
    let program = workspace.program(
        "plt_ctor_main",
        &[source("plt_ctor_main.c"), source("plt_caller.c")],
        &["-L.", "-Wl,--no-as-needed", "-lctor", "-lleaf"],
    );
    let stdout = run_ok(counted(&workspace, &program).env("LD_PROFILE", "ALL"));
    assert_eq!(stdout, "sum 1499500 ctor 145 restarted 1\n");
    let arcs = graph(
        &workspace.profile("gmon.out"),
        &["plt_caller", "ctor_calls", "plt_leaf"],
    );
    assert_eq!(
        arcs.get(&("plt_caller".into(), "plt_leaf".into())),
        Some(&1000),
        "{arcs:?}"
    );
    assert_eq!(
        arcs.get(&("ctor_calls".into(), "plt_leaf".into())),
        Some(&10),
        "{arcs:?}"
    );
}

/// plt_sites.c's output line for `calls` calls of `site_leaf` (`x & 7` summed over `x` in `0..calls` or, through
/// the tail call, `1..=calls`: the same for a multiple of 8), and the state it reports.
fn site_line(label: &str, calls: u64, state: &str) -> String {
    format!("{label} {} site {state}", calls / 8 * 28)
}

#[test]
fn hot_plt_calls_are_counted_in_stubs_of_their_own_exactly_with_threads_and_after_fork() {
    const CALLS: u64 = 40_000_000;
    const CHILD_CALLS: u64 = 3_000_000;
    let workspace = Workspace::new();
    workspace.shared_library("libsiteleaf.so", &[source("site_leaf.c")], &[]);
    workspace.shared_library(
        "libsiteearly.so",
        &[source("site_early.c")],
        &["-L.", "-lsiteleaf"],
    );
    let flags = [
        "-L.",
        "-lsiteleaf",
        "-pthread",
        "-ldl",
        "-foptimize-sibling-calls",
    ];
    let program = workspace.program("plt_sites", &[source("plt_sites.c")], &flags);
    // A library constructor's call through the PLT starts the runtime inside a counting call.
    let early = workspace.program(
        "plt_sites_early",
        &[source("plt_sites.c")],
        &[&flags[..], &["-Wl,--no-as-needed", "-lsiteearly"]].concat(),
    );
    let cases = [
        (&program, "call", 1, "1", "rewritten"),
        (&program, "call", 4, "1", "rewritten"),
        (&program, "call", 2, "0", "plt"),
        (&program, "tail", 1, "1", "redirected"),
        (&program, "tail", 4, "1", "redirected"),
        (&program, "tail", 2, "0", "audit"),
        // A site stub first, then the audit stub its calls went through redirected for another caller.
        (&program, "both", 1, "1", "rewritten redirected"),
        (&program, "both", 4, "1", "rewritten redirected"),
        (&early, "call", 2, "1", "rewritten"),
        (&early, "tail", 2, "1", "redirected"),
    ];
    for (program, how, threads, sites, state) in cases {
        for profile in std::fs::read_dir(workspace.path())
            .expect("the workspace")
            .flatten()
        {
            if profile
                .file_name()
                .to_string_lossy()
                .starts_with("gmon.out")
            {
                std::fs::remove_file(profile.path()).expect("an old profile removed");
            }
        }
        let per_thread = CALLS / threads;
        // The threads call on until the site is in the state expected (the look can come late on a loaded
        // machine), and say how many calls they made.
        let stdout = run_ok(
            counted(&workspace, program)
                .env("MSLPROF_PLT_SITES", sites)
                .args([threads, per_thread, CHILD_CALLS].map(|n| n.to_string()))
                .args([how, state]),
        );
        let context = format!(
            "{}, {how}, {threads} threads, MSLPROF_PLT_SITES={sites}: {stdout}",
            program.display()
        );
        let calls = stdout
            .lines()
            .find_map(|line| line.strip_prefix("calls "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no calls line: {context}"));
        assert!(calls >= CALLS && calls % 8 == 0, "{context}");
        assert!(
            stdout.starts_with(&format!("{}\n", site_line("sum", calls, state))),
            "{context}"
        );
        assert!(
            stdout.contains(&site_line("child", CHILD_CALLS, state)),
            "{context}"
        );
        let child_pid = stdout
            .split(" pid ")
            .nth(1)
            .and_then(|rest| rest.trim().parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no child pid in {stdout:?}"));
        let names = ["loop", "site_leaf"];
        let arc = ("loop".to_string(), "site_leaf".to_string());
        let parent = graph(&workspace.profile("gmon.out"), &names);
        assert_eq!(parent.get(&arc), Some(&calls), "{context}: {parent:?}");
        let child = graph(&workspace.profile(&format!("gmon.out.{child_pid}")), &names);
        assert_eq!(child.get(&arc), Some(&CHILD_CALLS), "{context}: {child:?}");
    }
}
