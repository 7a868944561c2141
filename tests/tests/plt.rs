//! Calls through the PLT into modules not compiled for counting (issue 10), counted by the `LD_AUDIT` module
//! libmslprof_audit.so: exact counts and callers, lazy binding and bind-now, `MSLPROF_PLT=0`, no double
//! counting of `-pg` code, and function addresses unchanged.

use std::path::PathBuf;
use std::process::Command;

use mslprof_format::model::Profile;
use mslprof_tests::callcounts::{CallGraph, profile_call_graph, run_ok};
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
    // mcount's own arc, counted once: the program's calls into itself are not redirected.
    assert_eq!(
        arcs.get(&("main".into(), "pg_parse".into())),
        Some(&1),
        "{arcs:?}"
    );
}
