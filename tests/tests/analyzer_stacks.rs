//! The report's call-graph times measured from sampled stacks: the GNU gprof manual's counter-example
//! (`counter_example.c`, built with -pg by the system cc) with a profile written in the test at the
//! binary's real addresses, whose stacks put all of foo's time under b. `mslprof` must charge it to b,
//! give the uncounted `spin` its caller from the stacks, and print gprof's estimate with `--estimate`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mslprof_format::LinkAddress;
use mslprof_format::model::{
    Arc, Buckets, Header, HistRange, Histogram, Module, Profile, SourceFormat, StackFrame,
    StackRecord, Stacks, UNKNOWN_KEY, module_flags,
};
use mslprof_tests::analyzer::{graph_columns, graph_entry, graph_line};
use mslprof_tests::{Workspace, analyzer_binary, assert_success, run};

/// Builds the counter-example: `counter_example.c` with -pg, `spin` without; every function starts a
/// 16-byte histogram bucket.
fn build_counter_example(ws: &Workspace) -> PathBuf {
    let dir = mslprof_tests::analyzer::fixtures();
    ws.cc([
        "-O1".as_ref(),
        "-falign-functions=16".as_ref(),
        "-c".as_ref(),
        dir.join("counter_example_spin.c").as_os_str(),
    ]);
    let exe = ws.join("counter_example");
    ws.cc([
        "-O0".as_ref(),
        "-pg".as_ref(),
        "-fno-inline".as_ref(),
        "-falign-functions=16".as_ref(),
        "-o".as_ref(),
        exe.as_os_str(),
        dir.join("counter_example.c").as_os_str(),
        "counter_example_spin.o".as_ref(),
    ]);
    exe
}

/// The start of each function symbol of `exe`, and its GNU build-id.
fn functions(exe: &Path) -> (HashMap<String, u64>, Vec<u8>) {
    use object::{Object, ObjectSymbol, SymbolKind};
    let bytes = std::fs::read(exe).expect("read the fixture");
    let elf = object::File::parse(&*bytes).expect("parse the fixture");
    let starts = elf
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 8)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
        .collect();
    let build_id = elf.build_id().ok().flatten().unwrap_or_default().to_vec();
    (starts, build_id)
}

/// One sampled stack, leaf first: the leaf at `leaf`+4, its callers by return addresses inside them
/// (start + 8, as the runtime records them), then a frame in no known module (libc's start-up code).
fn stack(at: &HashMap<String, u64>, count: u64, leaf: &str, callers: &[&str]) -> StackRecord {
    let mut frames = vec![StackFrame {
        key: 1,
        address: LinkAddress(at[leaf] + 4),
    }];
    frames.extend(callers.iter().map(|c| StackFrame {
        key: 1,
        address: LinkAddress(at[*c] + 8),
    }));
    frames.push(StackFrame {
        key: UNKNOWN_KEY,
        address: LinkAddress(0),
    });
    StackRecord {
        count,
        flags: 0,
        frames,
    }
}

/// The profile a run of the counter-example gives: the calls its -pg code counts (none into `spin`), 24
/// samples in spin and 2 in foo, all under b, 1 in a; sampled at 100 Hz. With `stacks`, the stacks too.
fn counter_profile(exe: &Path, stacks: bool) -> Profile {
    let (at, build_id) = functions(exe);
    let lo = ["main", "a", "b", "foo", "spin"]
        .iter()
        .map(|f| at[*f])
        .min()
        .expect("functions")
        & !15;
    let hi = ["main", "a", "b", "foo", "spin"]
        .iter()
        .map(|f| at[*f] + 64)
        .max()
        .expect("functions");
    // Functions start at 16-byte boundaries (-falign-functions=16): a function's first bucket is its own.
    let bucket = |f: &str| (at[f] - lo) / 16;
    let mut entries = vec![(bucket("spin"), 24), (bucket("foo"), 2), (bucket("a"), 1)];
    entries.sort_unstable();
    let arc = |caller: &str, callee: &str, count: u64| Arc {
        caller_key: 1,
        caller_address: LinkAddress(at[caller] + 8),
        callee_address: LinkAddress(at[callee]),
        count,
    };
    let path = exe.as_os_str().as_encoded_bytes().to_vec();
    Profile {
        format: SourceFormat::Mslprof { major: 1, minor: 5 },
        header: Header {
            hz: 100,
            sample_period_ns: 10_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: 27,
            program_name: b"counter_example".to_vec(),
            program_path: path.clone(),
            ..Header::default()
        },
        modules: vec![Module {
            key: 1,
            path,
            name: b"counter_example".to_vec(),
            build_id,
            flags: module_flags::PROFILED | module_flags::MAIN_PROGRAM,
            load_order: 1,
            samples: 27,
            histogram: Some(Histogram {
                bucket_bits: 32,
                ranges: vec![HistRange {
                    start: LinkAddress(lo),
                    end: LinkAddress(lo + (hi - lo).div_ceil(16) * 16),
                    buckets: Buckets::Sparse {
                        len: (hi - lo).div_ceil(16),
                        entries,
                    },
                }],
            }),
            arcs: vec![
                arc("main", "a", 1),
                arc("main", "b", 1),
                arc("a", "foo", 1_000_000),
                arc("b", "foo", 20),
            ],
            ..Module::default()
        }],
        stacks: stacks.then(|| Stacks {
            max_depth: 64,
            dropped: 0,
            records: vec![
                stack(&at, 24, "spin", &["foo", "b", "main"]),
                stack(&at, 2, "foo", &["b", "main"]),
                stack(&at, 1, "a", &["main"]),
            ],
        }),
    }
}

/// Writes `profile` to `name` in `ws` and returns `mslprof OPTIONS name`'s standard output.
fn report(ws: &Workspace, profile: &Profile, name: &str, options: &[&str]) -> String {
    let file = ws.join(name);
    let mut bytes = Vec::new();
    mslprof_format::write(profile, &mut bytes).expect("write the profile");
    std::fs::write(&file, bytes).expect("write the profile file");
    let output = run(std::process::Command::new(analyzer_binary())
        .args(options)
        .arg(&file)
        .current_dir(ws.path()));
    assert_success(&output, "mslprof");
    String::from_utf8(output.stdout).expect("UTF-8 report")
}

/// Asserts the first three columns (self, children, called) of the line naming `name` in `entry` of
/// `report`.
#[track_caller]
fn assert_line(report: &str, entry_of: &str, name: &str, want: [&str; 3]) {
    assert_eq!(
        graph_line(&graph_entry(report, entry_of), name)[..3],
        want,
        "{report}"
    );
}

#[test]
fn foos_time_is_charged_to_the_caller_whose_calls_spent_it() {
    let ws = Workspace::new();
    let exe = build_counter_example(&ws);
    let with_stacks = counter_profile(&exe, true);
    let measured = report(&ws, &with_stacks, "stacks.out", &["-q", "-b"]);
    // All of foo's 0.26 s under b's 20 calls, none under a's million, seen from both ends.
    assert_line(&measured, "foo", "a", ["0.00", "0.00", "1000000/1000020"]);
    assert_line(&measured, "foo", "b", ["0.02", "0.24", "20/1000020"]);
    assert_line(&measured, "b", "foo", ["0.02", "0.24", "20/1000020"]);
    assert_line(&measured, "a", "foo", ["0.00", "0.00", "1000000/1000020"]);
    // main's own line: no self time, 0.27 s of measured children.
    let main = graph_entry(&measured, "main");
    let own = main
        .iter()
        .find(|l| l.starts_with('['))
        .expect("main's line");
    assert_eq!(graph_columns(own).0[2..4], ["0.00", "0.27"], "{measured}");

    // --estimate: gprof's split by call counts, the report of the profile without stacks byte for byte.
    let estimate = report(&ws, &with_stacks, "stacks.out", &["-q", "-b", "--estimate"]);
    let without_stacks = report(
        &ws,
        &counter_profile(&exe, false),
        "plain.out",
        &["-q", "-b"],
    );
    assert_eq!(estimate, without_stacks);
    assert_line(&estimate, "foo", "a", ["0.02", "0.00", "1000000/1000020"]);
    assert_line(&estimate, "foo", "b", ["0.00", "0.00", "20/1000020"]);

    // The flat profile's total/call of b: its measured 0.26 s in one call, against gprof's 0.
    let total_per_call = |options: &[&str]| {
        let flat = report(&ws, &with_stacks, "stacks.out", options);
        let row = flat
            .lines()
            .find(|l| l.ends_with(" b"))
            .unwrap_or_else(|| panic!("no row of b in:\n{flat}"))
            .split_whitespace()
            .nth(5)
            .map(str::to_string);
        row.unwrap_or_default()
    };
    assert_eq!(total_per_call(&["-p", "-b"]), "260.00");
    assert_eq!(total_per_call(&["-p", "-b", "--estimate"]), "0.00");
}

#[test]
fn a_function_without_counted_calls_gets_its_callers_from_the_stacks() {
    let ws = Workspace::new();
    let exe = build_counter_example(&ws);
    let with_stacks = counter_profile(&exe, true);
    let measured = report(&ws, &with_stacks, "stacks.out", &["-q"]);
    // foo called spin 20 times, uncounted: the lines carry the measured time and a count of 0.
    assert_line(&measured, "spin", "foo", ["0.24", "0.00", "0/0"]);
    assert_line(&measured, "foo", "spin", ["0.24", "0.00", "0/0"]);
    let spontaneous = |report: &str| {
        graph_entry(report, "spin")
            .iter()
            .any(|l| l.contains("<spontaneous>"))
    };
    assert!(!spontaneous(&measured), "{measured}");
    // The blurb says where the times come from.
    assert!(
        measured
            .contains(" Times are measured from 27 sampled call stacks, not estimated from the"),
        "{measured}"
    );

    let estimate = report(&ws, &with_stacks, "stacks.out", &["-q", "--estimate"]);
    assert!(spontaneous(&estimate), "{estimate}");
    assert!(
        estimate.contains(" children  seconds in its callees, estimated from the call counts.")
    );
    assert!(!estimate.contains("sampled call stacks"), "{estimate}");
}
