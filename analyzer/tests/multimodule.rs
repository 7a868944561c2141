//! Multi-module reports from mslprof profiles written with the format crate's writer: real ELF modules
//! (a program and two shared libraries, built here with `cc -pg`), histograms and arcs placed on their
//! functions, and the report checked line by line: module-qualified names, the module-index column,
//! cross-module arcs, spontaneous callers, the module table, unprofiled modules and every warning.

use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_analyzer::elf::symbols::{self, SelectOptions};
use mslprof_format::model::*;
use mslprof_format::{LinkAddress, LoadBias};
use mslprof_tests::analyzer::have;
use mslprof_tests::cc;

const APP: &str = r#"
int work_in_foo(int); int cb(int v) { return v * 3; }
int main(void) { return work_in_foo(1) > 1000; }
"#;
const FOO: &str = r#"
int work(int); int bar_work(int);
int work(int v) { int s = 0; for (int i = 0; i < v; i++) s += i; return s + bar_work(v); }
int work_in_foo(int v) { return work(v); }
"#;
const BAR: &str = r#"
int cb(int);
int work(int v) { return v + cb(v); }
int bar_work(int v) { return work(v); }
"#;

struct Built {
    /// Removes the folder when the test is done with it.
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    app: PathBuf,
    foo: PathBuf,
    bar: PathBuf,
}

fn build(name: &str) -> Option<Built> {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return None;
    }
    let tmp = tempfile::Builder::new()
        .prefix(&format!("mslprof-mm-{name}-"))
        .tempdir()
        .unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::write(dir.join("app.c"), APP).unwrap();
    std::fs::write(dir.join("foo.c"), FOO).unwrap();
    std::fs::write(dir.join("bar.c"), BAR).unwrap();
    cc(
        &dir,
        ["-pg", "-O0", "-fPIC", "-shared", "-o", "libfoo.so", "foo.c"],
    );
    cc(
        &dir,
        ["-pg", "-O0", "-fPIC", "-shared", "-o", "libbar.so", "bar.c"],
    );
    cc(
        &dir,
        ["-pg", "-O0", "-o", "app", "app.c", "-L.", "-lfoo", "-lbar"],
    );
    Some(Built {
        app: dir.join("app"),
        foo: dir.join("libfoo.so"),
        bar: dir.join("libbar.so"),
        dir,
        _tmp: tmp,
    })
}

fn addr_of(module: &Path, name: &str) -> u64 {
    let ms = symbols::load(module, SelectOptions::default()).unwrap();
    ms.symbols
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} not in {}", module.display()))
        .addr
        .0
}

fn build_id(module: &Path) -> Vec<u8> {
    symbols::load(module, SelectOptions::default())
        .unwrap()
        .build_id
        .unwrap_or_default()
}

/// A histogram over `[lo, hi)` with 4-byte buckets and `samples` at the given addresses.
fn histogram(lo: u64, hi: u64, samples: &[(u64, u16)]) -> Histogram {
    let lo = lo & !3;
    let hi = (hi + 3) & !3;
    let mut b = vec![0u16; ((hi - lo) / 4) as usize];
    for &(a, n) in samples {
        b[((a - lo) / 4) as usize] += n;
    }
    Histogram {
        bucket_bits: 16,
        ranges: vec![HistRange {
            start: LinkAddress(lo),
            end: LinkAddress(hi),
            buckets: Buckets::Dense16(b),
        }],
    }
}

fn module(key: u32, path: &Path, flags: u32, samples: u64) -> Module {
    Module {
        key,
        path: path.display().to_string().into_bytes(),
        name: path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
            .into_bytes(),
        build_id: build_id(path),
        flags: flags | module_flags::HAS_BUILD_ID,
        load_order: key,
        samples,
        ..Module::default()
    }
}

/// An arc from `caller_address` in module `caller_key` to `callee_address` in the module holding it.
fn arc(caller_key: u32, caller_address: u64, callee_address: u64, count: u64) -> Arc {
    Arc {
        caller_key,
        caller_address: LinkAddress(caller_address),
        callee_address: LinkAddress(callee_address),
        count,
    }
}

/// `m` loaded at `bias`, with a histogram over its two functions `functions` holding one hit
/// (address, samples), and `arcs`.
fn profiled_module(
    mut m: Module,
    bias: u64,
    functions: (u64, u64),
    hit: (u64, u16),
    arcs: Vec<Arc>,
) -> Module {
    let (a, b) = functions;
    m.load_bias = LoadBias(bias);
    m.histogram = Some(histogram(a.min(b), a.max(b) + 64, &[hit]));
    m.arcs = arcs;
    m
}

/// The profile of one imaginary run: 20 samples in main, 30 in work@libfoo, 10 in work@libbar,
/// 10 in an unprofiled libc, 5 outside any module; arcs main→work_in_foo 7, work_in_foo→work@foo 7,
/// work@foo→bar_work 3, unknown→bar_work 2, bar_work→work@bar 5, work@bar→cb 5.
fn profile(b: &Built, bias: u64, key_base: u32) -> Profile {
    let (k_app, k_foo, k_bar, k_libc) = (key_base, key_base + 1, key_base + 2, key_base + 3);
    let main = addr_of(&b.app, "main");
    let cb = addr_of(&b.app, "cb");
    let w_foo = addr_of(&b.foo, "work");
    let wif = addr_of(&b.foo, "work_in_foo");
    let w_bar = addr_of(&b.bar, "work");
    let bw = addr_of(&b.bar, "bar_work");
    let pro = module_flags::PROFILED;
    let app = profiled_module(
        module(k_app, &b.app, pro | module_flags::MAIN_PROGRAM, 20),
        bias,
        (main, cb),
        (main + 8, 20),
        vec![arc(k_bar, w_bar + 12, cb + 4, 5)],
    );
    let libfoo = profiled_module(
        module(k_foo, &b.foo, pro, 30),
        bias + 0x10000,
        (w_foo, wif),
        (w_foo + 12, 30),
        vec![
            arc(k_app, main + 10, wif + 4, 7),
            arc(k_foo, wif + 12, w_foo + 4, 7),
        ],
    );
    let bar = profiled_module(
        module(k_bar, &b.bar, pro, 10),
        bias + 0x20000,
        (w_bar, bw),
        (w_bar + 8, 10),
        vec![
            arc(k_foo, w_foo + 30, bw + 4, 3),
            arc(UNKNOWN_KEY, 0, bw + 4, 2),
            arc(k_bar, bw + 12, w_bar + 4, 5),
        ],
    );
    let libc = Module {
        key: k_libc,
        path: b"/lib/x86_64-linux-gnu/libc.so.6".to_vec(),
        name: b"libc.so.6".to_vec(),
        samples: 10,
        load_order: k_libc,
        ..Module::default()
    };
    Profile {
        stacks: None,
        format: SourceFormat::Mslprof { major: 1, minor: 1 },
        header: Header {
            pid: 4242,
            hz: 100,
            sample_period_ns: 10_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: 75,
            unknown_samples: 5,
            program_name: b"app".to_vec(),
            program_path: b.app.display().to_string().into_bytes(),
            ..Header::default()
        },
        modules: vec![app, libfoo, bar, libc],
    }
}

fn write(dir: &Path, name: &str, p: &Profile) -> PathBuf {
    let path = dir.join(name);
    let mut bytes = Vec::new();
    mslprof_format::write(p, &mut bytes).expect("profile is valid");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn mslprof(dir: &Path, args: &[&str]) -> (String, String, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_mslprof"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code().unwrap_or(-1),
    )
}

fn line_with<'a>(report: &'a str, needle: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{report}"))
}

/// `mslprof -s` over the files `run1` and `run2`: the gmon.sum it writes.
fn sum_of_runs(b: &Built) -> Profile {
    let (_, err, code) = mslprof(&b.dir, &["-s", b.app.to_str().unwrap(), "run1", "run2"]);
    assert_eq!(code, 0, "{err}");
    mslprof_format::read(
        &std::fs::read(b.dir.join("gmon.sum")).unwrap(),
        Default::default(),
    )
    .unwrap()
}

#[test]
fn report_over_three_modules() {
    let Some(b) = build("report") else { return };
    write(&b.dir, "gmon.out", &profile(&b, 0x5555_0000_0000, 1));
    let (out, err, code) = mslprof(&b.dir, &["-b"]);
    assert_eq!(code, 0, "{err}");

    // Flat profile: per-call columns, then the module index, then the name; `work` is in two modules.
    assert_eq!(
        line_with(&out, "work@libfoo.so"),
        " 50.00      0.30     0.30        7    42.86    51.43       1  work@libfoo.so"
    );
    assert_eq!(
        line_with(&out, "  work@libbar.so"),
        " 16.67      0.60     0.10        5    20.00    20.00       2  work@libbar.so"
    );
    assert!(out.contains("   2  bar_work\n"), "{out}");
    let cb = out
        .lines()
        .find(|l| l.ends_with("  cb"))
        .expect("cb in the flat profile");
    assert!(cb.contains("       5 "), "cb is called 5 times: {cb}");
    // Call graph: the cross-module arcs with exact counts, the unknown caller is not an arc.
    assert!(
        line_with(&out, "3/5           work@libfoo.so [")
            .starts_with("                0.00    0.06       3/5 ")
    );
    assert!(out.contains("       5/5           bar_work ["), "{out}");
    // Module table and the unprofiled module with its share of all samples (10 of 75).
    assert!(out.contains("\u{c}\nModules\n"), "{out}");
    assert!(line_with(&out, "libc.so.6 (not profiled)").contains(" 13.33%"));
    assert!(line_with(&out, "13.33%  libc.so.6").starts_with("  13.33%"));
    assert!(line_with(&out, "<outside any module>").contains("6.67%"));
    assert!(
        line_with(&out, &b.foo.display().to_string()).starts_with("     1   40.00%  libfoo.so")
    );
    // Symspecs can name a module.
    let (only_foo, _, _) = mslprof(&b.dir, &["-b", "-pwork@libfoo.so"]);
    assert!(only_foo.contains("work@libfoo.so") && !only_foo.contains("  work@libbar.so\n"));
    let (libbar, _, _) = mslprof(&b.dir, &["-b", "-plibbar.so:"]);
    assert!(
        libbar.contains("work@libbar.so") && !libbar.contains("  work@libfoo.so\n"),
        "{libbar}"
    );
}

#[test]
fn runs_merge_across_aslr_and_keys_and_sum_round_trips() {
    let Some(b) = build("merge") else { return };
    let one = write(&b.dir, "run1", &profile(&b, 0x5555_0000_0000, 1));
    // The second run's threads blocked SIGPROF: so did some of the sum's.
    let mut blocked = profile(&b, 0x7f00_1234_0000, 10);
    blocked.header.flags |= header_flags::SIGPROF_BLOCKED;
    write(&b.dir, "run2", &blocked);
    let (out, err, code) = mslprof(
        &b.dir,
        &["-b", "-p", b.app.to_str().unwrap(), "run1", "run2"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        line_with(&out, "work@libfoo.so"),
        " 50.00      0.60     0.60       14    42.86    51.43       1  work@libfoo.so"
    );
    // -s writes a merged mslprof profile with the summed counts.
    let sum = sum_of_runs(&b);
    assert_eq!(sum.modules.len(), 4, "one module per file, not per run");
    assert_eq!(sum.header.total_samples, 150);
    assert_ne!(sum.header.flags & header_flags::MERGED, 0);
    assert_ne!(sum.header.flags & header_flags::SIGPROF_BLOCKED, 0);
    let libfoo = sum.modules.iter().find(|m| m.name == b"libfoo.so").unwrap();
    assert_eq!(
        libfoo.histogram.as_ref().unwrap().ranges[0].buckets.total(),
        60
    );
    assert_eq!(libfoo.arcs.iter().map(|a| a.count).sum::<u64>(), 28);
    let (again, _, _) = mslprof(&b.dir, &["-b", "-p", b.app.to_str().unwrap(), "gmon.sum"]);
    let tables = |r: &str| r.split("\u{c}\nModules\n").next().unwrap_or("").to_string();
    assert_eq!(
        tables(&again),
        tables(&out),
        "report of gmon.sum equals the report of the two runs"
    );
    let _ = one;
}

/// The stacks of one imaginary run over `profile(b, _, key_base)`'s modules: main→work_in_foo→work@foo→
/// bar_work→work@bar sampled `deep` times, main→work_in_foo→work@foo `shallow` times (if not 0), and libc
/// with an unknown caller (truncated) `in_libc` times (if not 0).
fn stacks(
    b: &Built,
    key_base: u32,
    counts: (u64, u64, u64),
    max_depth: u32,
    dropped: u64,
) -> Stacks {
    let (k_app, k_foo, k_bar, k_libc) = (key_base, key_base + 1, key_base + 2, key_base + 3);
    let main = addr_of(&b.app, "main");
    let w_foo = addr_of(&b.foo, "work");
    let wif = addr_of(&b.foo, "work_in_foo");
    let w_bar = addr_of(&b.bar, "work");
    let bw = addr_of(&b.bar, "bar_work");
    let frame = |key, address| StackFrame {
        key,
        address: LinkAddress(address),
    };
    let (deep, shallow, in_libc) = counts;
    let records = [
        (
            deep,
            0,
            vec![
                frame(k_bar, w_bar + 8),
                frame(k_bar, bw + 13),
                frame(k_foo, w_foo + 31),
                frame(k_foo, wif + 13),
                frame(k_app, main + 11),
            ],
        ),
        (
            shallow,
            0,
            vec![
                frame(k_foo, w_foo + 12),
                frame(k_foo, wif + 13),
                frame(k_app, main + 11),
            ],
        ),
        (
            in_libc,
            stack_flags::TRUNCATED_UNWIND,
            vec![frame(k_libc, 0x1234), frame(UNKNOWN_KEY, 0)],
        ),
    ];
    Stacks {
        max_depth,
        dropped,
        records: records
            .into_iter()
            .filter(|r| r.0 != 0)
            .map(|(count, flags, frames)| StackRecord {
                count,
                flags,
                frames,
            })
            .collect(),
    }
}

#[test]
fn summed_runs_add_up_their_stacks_with_keys_remapped() {
    let Some(b) = build("stacks") else { return };
    let mut run1 = profile(&b, 0x5555_0000_0000, 1);
    run1.stacks = Some(stacks(&b, 1, (6, 0, 2), 16, 1));
    let mut run2 = profile(&b, 0x7f00_1234_0000, 10);
    run2.stacks = Some(stacks(&b, 10, (4, 9, 0), 64, 3));
    write(&b.dir, "run1", &run1);
    write(&b.dir, "run2", &run2);
    let sum = sum_of_runs(&b);
    // The sum's keys, found by module name: the runs' keys 1.. and 10.. both map onto them.
    let key = |name: &[u8]| sum.modules.iter().find(|m| m.name == name).unwrap().key;
    let app_name = b.app.file_name().unwrap().to_string_lossy().into_owned();
    let k_app = key(app_name.as_bytes());
    assert_eq!(
        (key(b"libfoo.so"), key(b"libbar.so"), key(b"libc.so.6")),
        (k_app + 1, k_app + 2, k_app + 3),
        "the sum's keys are in the first run's order"
    );
    // The deep stack of both runs is one record of 6 + 4; the others keep their counts.
    let mut expected = stacks(&b, k_app, (10, 9, 2), 64, 4);
    expected.normalize();
    assert_eq!(sum.stacks, Some(expected));

    // A run without stacks: the sum has none (its samples would be missing from them).
    run2.stacks = None;
    write(&b.dir, "run2", &run2);
    let sum = sum_of_runs(&b);
    assert_eq!(sum.stacks, None);
}

#[test]
fn warnings_go_to_stderr_and_the_report_still_prints() {
    let Some(b) = build("warn") else { return };
    let mut p = profile(&b, 0x5555_0000_0000, 1);
    p.header.flags |= header_flags::INCOMPLETE;
    p.header.incomplete_cause = IncompleteCause::Signal;
    p.header.incomplete_signal = 11;
    p.header.dropped_arcs = 4;
    p.modules[2].saturated_buckets = 2;
    p.modules[1].build_id = vec![0xde, 0xad, 0xbe, 0xef];
    let missing = b.dir.join("libgone.so");
    let mut gone = module(9, &b.bar, module_flags::PROFILED, 0);
    gone.path = missing.display().to_string().into_bytes();
    gone.name = b"libgone.so".to_vec();
    gone.samples = 3;
    gone.histogram = Some(histogram(0x1000, 0x1100, &[(0x1010, 3)]));
    p.modules.push(gone);
    write(&b.dir, "gmon.out", &p);
    let (out, err, code) = mslprof(&b.dir, &["-b"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("warning"), "a warning in the report:\n{out}");
    let head: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mslprof: warning:"))
        .collect();
    let all = head.join("\n");
    assert!(
        all.contains("profile is incomplete (killed by signal 11)"),
        "{all}"
    );
    assert!(all.contains("4 arcs were dropped"), "{all}");
    assert!(
        all.contains("libbar.so: 2 histogram buckets saturated"),
        "{all}"
    );
    assert!(all.contains("libfoo.so: build-id differs"), "{all}");
    assert!(all.contains("libgone.so: No such file"), "{all}");
    assert!(
        out.contains("Flat profile:") && out.contains("Call graph"),
        "rest of the report printed"
    );
}

#[test]
fn damaged_mslprof_files_fail_with_one_line() {
    let Some(b) = build("damage") else { return };
    let path = write(&b.dir, "gmon.out", &profile(&b, 0x5555_0000_0000, 1));
    let bytes = std::fs::read(&path).unwrap();
    for cut in (0..bytes.len()).step_by(13) {
        std::fs::write(b.dir.join("cut"), &bytes[..cut]).unwrap();
        let (_, err, code) = mslprof(&b.dir, &["-b", b.app.to_str().unwrap(), "cut"]);
        assert_eq!(code, 1, "cut at {cut} accepted");
        assert_eq!(err.lines().count(), 1, "cut at {cut}: {err}");
        assert!(err.starts_with("mslprof: cut: "), "{err}");
    }
}
