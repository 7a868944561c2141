//! Exact call counts through the real mcount stub when a thread's working set (50 000 arcs) is far
//! larger than its first call cache, so the cache grows while a signal handler keeps calling
//! instrumented code; also in a program that locks all its memory.

use mslprof_format::model::Profile;
use mslprof_tests::Workspace;
use mslprof_tests::callcounts::{
    build_library, pg_flags, profile_call_graph, run_signal_fixture, run_signal_fixture_preloading,
};

#[test]
fn fifty_thousand_call_sites_with_signals_count_exactly() {
    let workspace = Workspace::new();
    let (handled, profile) = run_signal_fixture(&workspace, "large", &pg_flags("-O1"));
    assert_large_counts_exact(handled, &profile);
}

/// `mlockall` makes the kernel map the whole of every reservation the runtime makes (arc tables, call caches)
/// and keep the pages it gives back when a call cache grows or is emptied (`MADV_DONTNEED` fails on locked
/// pages): the counts stay exact.
#[test]
fn fifty_thousand_call_sites_count_exactly_in_a_program_that_locks_its_memory() {
    let workspace = Workspace::new();
    build_library(&workspace, "mlockall", &["mlockall.c"], &[]);
    let (handled, profile, stderr) = run_signal_fixture_preloading(
        &workspace,
        "large",
        &pg_flags("-O1"),
        Some(&workspace.join("libmlockall.so")),
    );
    if stderr.contains("mlockall refused") {
        eprintln!(
            "skipped: this process may not lock its memory ({})",
            stderr.trim()
        );
        return;
    }
    assert_large_counts_exact(handled, &profile);
}

/// The counts every run of `large.c` must have: 40 rounds of 1 000 call sites in each of 50 groups, and 10
/// calls per signal handled.
fn assert_large_counts_exact(handled: u64, profile: &Profile) {
    assert!(handled > 0);
    let graph = profile_call_graph(profile, &|name| {
        name.starts_with("group") || ["on_alarm", "m_work", "h_work"].contains(&name)
    });
    let from_groups: Vec<u64> = graph
        .iter()
        .filter(|((caller, callee), _)| caller.starts_with("group") && callee == "m_work")
        .map(|(_, &count)| count)
        .collect();
    assert_eq!(from_groups.len(), 50, "{graph:?}");
    // 1 000 call sites per group, 40 rounds.
    assert!(
        from_groups.iter().all(|&count| count == 40_000),
        "{from_groups:?}"
    );
    assert_eq!(graph[&("on_alarm".into(), "h_work".into())], 10 * handled);
    assert_eq!(profile.header.dropped_arcs, 0);
    // One arc per call site of m_work, plus main's one indirect call site into each group.
    let called_once_per_round = profile
        .modules
        .iter()
        .flat_map(|module| &module.arcs)
        .filter(|arc| arc.count == 40)
        .count();
    assert_eq!(called_once_per_round, 50_000 + 50);
}
