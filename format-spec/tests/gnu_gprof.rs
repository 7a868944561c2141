//! GNU and BSD gmon.out against GNU gprof 2.40: files produced here by `gcc -pg` programs (PIE and non-PIE)
//! are read and compared with what `gprof -i`, `gprof -b -p` and `gprof -b -q` report for the same file; files
//! written by `write_gnu` (and BSD files built here) must make gprof print exactly what the original does.
//! Skipped, with a message, where `gcc` or `gprof` is missing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_format::*;

const PROGRAM: &str = r#"
#include <stdio.h>
static volatile unsigned long sink;
__attribute__((noinline)) static void leaf(int n) { for (int i = 0; i < n; i++) sink += i; }
__attribute__((noinline)) void middle(int n) { leaf(n); leaf(n / 2); }
__attribute__((noinline)) void top(int n) { for (int i = 0; i < 3; i++) middle(n); }
typedef void (*fn)(int);
int main(void) {
    fn f = middle;
    for (int i = 0; i < 20; i++) top(3000000);
    for (int i = 0; i < 5; i++) f(1000);
    printf("%lu\n", sink);
    return 0;
}
"#;

fn tool_missing() -> Option<&'static str> {
    for tool in ["gcc", "gprof", "nm"] {
        let ok = Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(tool);
        }
    }
    None
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tool output is UTF-8")
}

fn gprof(exe: &Path, gmon: &Path, args: &[&str]) -> String {
    run(Command::new("gprof").args(args).arg(exe).arg(gmon))
}

/// A `-pg` build of PROGRAM run once in `dir`: (executable, its gmon.out).
fn build_and_run(dir: &Path, name: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    let src = dir.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join(name);
    run(Command::new("gcc")
        .args(["-pg", "-O1"])
        .args(flags)
        .arg("-o")
        .arg(&exe)
        .arg(&src));
    let work = dir.join(format!("{name}.run"));
    std::fs::create_dir_all(&work).unwrap();
    run(Command::new(&exe).current_dir(&work));
    (exe, work.join("gmon.out"))
}

/// Function symbols (text) of `exe`, sorted by address.
fn functions(exe: &Path) -> Vec<(u64, String)> {
    let out = run(Command::new("nm").arg("--defined-only").arg(exe));
    let mut syms: Vec<(u64, String)> = out
        .lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
            let kind = parts.next()?;
            let name = parts.next()?;
            matches!(kind, "t" | "T").then(|| (addr, name.to_string()))
        })
        .collect();
    syms.sort();
    syms
}

fn function_at(syms: &[(u64, String)], addr: u64) -> Option<&str> {
    let i = syms.partition_point(|(a, _)| *a <= addr);
    i.checked_sub(1).map(|i| syms[i].1.as_str())
}

/// `gprof -i`: (version, histogram records, call-graph records, basic-block records).
fn gprof_info(exe: &Path, gmon: &Path) -> (u32, u64, u64, u64) {
    let out = gprof(exe, gmon, &["-i"]);
    let number = |needle: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in gprof -i output:\n{out}"));
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    let version = out
        .split("(version ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .expect("version in gprof -i");
    (
        version,
        number("histogram record"),
        number("call-graph record"),
        number("basic-block count record"),
    )
}

/// Flat profile (`gprof -b -p`): function → calls, for functions with a calls column.
fn gprof_calls(exe: &Path, gmon: &Path) -> BTreeMap<String, u64> {
    let out = gprof(exe, gmon, &["-b", "-p"]);
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // %time cumulative self calls self/call total/call name
            (f.len() == 7).then(|| Some((f[6].to_string(), f[3].parse().ok()?)))?
        })
        .collect()
}

/// Call graph (`gprof -b -q`): (caller, callee) → count, from each entry's parent lines `self children a/b name [i]`.
fn gprof_arcs(exe: &Path, gmon: &Path) -> BTreeMap<(String, String), u64> {
    let out = gprof(exe, gmon, &["-b", "-q"]);
    let mut arcs = BTreeMap::new();
    let mut parents: Vec<(String, u64)> = Vec::new();
    for line in out.lines() {
        if line.starts_with("-----") {
            parents.clear();
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with('[') {
            // [i] %time self children called name [i]
            let name = f[f.len() - 2].to_string();
            for (caller, count) in parents.drain(..) {
                *arcs.entry((caller, name.clone())).or_insert(0) += count;
            }
        } else if f.len() == 5 && f[2].contains('/') {
            let count = f[2].split('/').next().unwrap().parse().unwrap();
            parents.push((f[3].to_string(), count));
        }
    }
    arcs
}

/// "granularity: each sample hit covers N byte(s) for X% of T seconds" → (N, T).
fn gprof_granularity(exe: &Path, gmon: &Path) -> (u64, String) {
    let out = gprof(exe, gmon, &["-b", "-q"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("granularity"))
        .expect("granularity line");
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[5].parse().unwrap(), f[f.len() - 2].to_string())
}

fn check_against_gprof(exe: &Path, gmon: &Path) -> Profile {
    let bytes = std::fs::read(gmon).unwrap();
    assert_eq!(detect(&bytes), Some(FileFormat::Gnu));
    let profile = read(&bytes, GnuTarget::default()).expect("gcc -pg output reads");
    assert_eq!(profile.format, SourceFormat::Gnu { version: 1 });

    // gprof -i: record counts.
    let counts = record_counts(&bytes, GnuTarget::default())
        .unwrap()
        .unwrap();
    let (version, hist, cg, bb) = gprof_info(exe, gmon);
    assert_eq!(
        (
            counts.version,
            counts.histogram_records,
            counts.call_graph_records,
            counts.basic_block_records
        ),
        (version, hist, cg, bb)
    );
    let [module] = profile.modules.as_slice() else {
        panic!("one module")
    };
    assert_eq!(module.key, 0);
    assert_eq!(
        module.flags,
        module_flags::MAIN_PROGRAM | module_flags::PROFILED
    );
    // glibc writes each (from, self) pair once, so no arc was merged.
    assert_eq!(module.arcs.len() as u64, cg);

    // Histogram: one range covering the program's functions; gprof's granularity and total time.
    let syms = functions(exe);
    let h = module.histogram.as_ref().expect("histogram");
    assert_eq!(h.bucket_bits, 16);
    assert_eq!(h.ranges.len() as u64, hist);
    let r = &h.ranges[0];
    for name in ["leaf", "middle", "top", "main"] {
        let (addr, _) = syms.iter().find(|(_, n)| n == name).expect("symbol");
        assert!(
            r.start <= LinkAddress(*addr) && *addr < r.end.0,
            "{name} at {addr:#x} in the histogram range"
        );
    }
    let (granularity, total_seconds) = gprof_granularity(exe, gmon);
    assert_eq!((r.span() / 2 / r.buckets.len()) * 2, granularity);
    assert_eq!(profile.header.hz, 100);
    assert_eq!(profile.header.sample_period_ns, 10_000_000);
    assert_eq!(profile.header.dimension, b"seconds");
    assert_eq!(profile.header.dimension_abbrev, b's');
    let samples = r.buckets.total();
    assert_eq!(profile.header.total_samples, samples);
    assert!(samples > 0, "the program ran long enough to be sampled");
    // gprof counts only samples that fall in a function; this program spends all its time in its own code.
    assert_eq!(format!("{:.2}", samples as f64 / 100.0), total_seconds);

    // Arcs: by function, exactly what gprof's call graph shows; calls per function as in the flat profile.
    let mut ours: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for arc in &module.arcs {
        assert_eq!(arc.caller_key, 0);
        let callee = function_at(&syms, arc.callee_address.0)
            .expect("callee symbol")
            .to_string();
        *calls.entry(callee.clone()).or_insert(0) += arc.count;
        if let Some(caller) = function_at(&syms, arc.caller_address.0)
            && arc.caller_address >= r.start
        {
            *ours.entry((caller.to_string(), callee)).or_insert(0) += arc.count;
        }
    }
    assert_eq!(ours, gprof_arcs(exe, gmon));
    assert_eq!(calls, gprof_calls(exe, gmon));
    assert_eq!(calls.get("leaf"), Some(&130));
    assert_eq!(calls.get("middle"), Some(&65));
    assert_eq!(calls.get("top"), Some(&20));
    profile
}

/// write_gnu of what was read makes gprof print exactly the same tables.
fn check_write_gnu(exe: &Path, gmon: &Path, profile: &Profile) {
    let copy = gmon.with_extension("copy");
    let mut out = Vec::new();
    write_gnu(profile, GnuTarget::default(), &mut out).unwrap();
    std::fs::write(&copy, &out).unwrap();
    for args in [&["-b", "-p"][..], &["-b", "-q"], &["-b", "-p", "-z"]] {
        assert_eq!(
            gprof(exe, &copy, args),
            gprof(exe, gmon, args),
            "gprof {args:?}"
        );
    }
    let back = read(&out, GnuTarget::default()).unwrap();
    assert_eq!(&back, profile);
}

/// The same data as a 4.4BSD and an old-BSD gmon.out: our reader gives the same module; gprof reads the
/// 4.4BSD one (which carries its rate) with the same flat profile.
fn check_bsd(exe: &Path, gmon: &Path, profile: &Profile) {
    let module = &profile.modules[0];
    let h = module.histogram.as_ref().unwrap();
    let r = &h.ranges[0];
    let bins: Vec<u16> = {
        let mut v = vec![0u16; r.buckets.len() as usize];
        for (i, c) in r.buckets.nonzero() {
            v[i as usize] = c as u16;
        }
        v
    };
    for bsd44 in [true, false] {
        let header_size: u32 = if bsd44 { 40 } else { 20 };
        let mut b = Vec::new();
        b.extend_from_slice(&r.start.0.to_le_bytes());
        b.extend_from_slice(&r.end.0.to_le_bytes());
        b.extend_from_slice(&(header_size + 2 * bins.len() as u32).to_le_bytes());
        if bsd44 {
            b.extend_from_slice(&0x0005_1879u32.to_le_bytes());
            b.extend_from_slice(&100u32.to_le_bytes());
            b.extend_from_slice(&[0; 12]);
        }
        for c in &bins {
            b.extend_from_slice(&c.to_le_bytes());
        }
        for a in &module.arcs {
            b.extend_from_slice(&a.caller_address.0.to_le_bytes());
            b.extend_from_slice(&a.callee_address.0.to_le_bytes());
            b.extend_from_slice(&a.count.to_le_bytes());
        }
        assert_eq!(detect(&b), Some(FileFormat::Bsd));
        let p = read(&b, GnuTarget::default()).expect("BSD file reads");
        assert_eq!(p.format, SourceFormat::Bsd);
        assert_eq!(
            p.modules, profile.modules,
            "same module as from the GNU file"
        );
        assert_eq!(p.header.hz, if bsd44 { 100 } else { 0 });
        let counts = record_counts(&b, GnuTarget::default()).unwrap().unwrap();
        let path = gmon.with_extension(if bsd44 { "bsd44" } else { "bsd" });
        std::fs::write(&path, &b).unwrap();
        let (_, hist, cg, _) = gprof_info(exe, &path);
        assert_eq!(
            (counts.histogram_records, counts.call_graph_records),
            (hist, cg)
        );
        if bsd44 {
            assert_eq!(
                gprof(exe, &path, &["-b", "-p"]),
                gprof(exe, gmon, &["-b", "-p"])
            );
        }
    }
}

fn gcc_pg_case(flags: &[&str], name: &str) {
    if let Some(tool) = tool_missing() {
        eprintln!("skipping GNU gmon.out test {name}: {tool} is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, gmon) = build_and_run(dir.path(), name, flags);
    let profile = check_against_gprof(&exe, &gmon);
    check_write_gnu(&exe, &gmon, &profile);
    check_bsd(&exe, &gmon, &profile);
}

#[test]
fn gcc_pg_pie_matches_gprof() {
    gcc_pg_case(&["-fPIE", "-pie"], "pie");
}

#[test]
fn gcc_pg_no_pie_matches_gprof() {
    gcc_pg_case(&["-fno-PIE", "-no-pie"], "nopie");
}

/// Counts beyond GNU's field widths survive: a bucket above 65535 becomes several histogram records of the
/// same range and an arc above 2^32−1 several arc records; gprof adds them up exactly as our reader does.
#[test]
fn write_gnu_spreads_wide_counts_over_records_gprof_adds_up() {
    if let Some(tool) = tool_missing() {
        eprintln!("skipping: {tool} is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (exe, gmon) = build_and_run(dir.path(), "wide", &["-no-pie"]);
    let mut profile = read(&std::fs::read(&gmon).unwrap(), GnuTarget::default()).unwrap();
    let syms = functions(&exe);
    let leaf = syms.iter().find(|(_, n)| n == "leaf").unwrap().0;
    let top = syms.iter().find(|(_, n)| n == "top").unwrap().0;
    {
        let module = &mut profile.modules[0];
        let r = &mut module.histogram.as_mut().unwrap().ranges[0];
        // A bin wholly inside leaf (gprof splits a bin that straddles two functions).
        let bytes_per_bin = r.span() as f64 / r.buckets.len() as f64;
        let bin = ((leaf - r.start.0) as f64 / bytes_per_bin) as usize + 2;
        let mut values = vec![0u32; r.buckets.len() as usize];
        values[bin] = 150_000; // 1500.00 seconds at 100 Hz
        r.buckets = Buckets::Dense32(values);
        module.arcs = vec![Arc {
            caller_key: 0,
            caller_address: LinkAddress(top + 1),
            callee_address: LinkAddress(leaf),
            count: 5_000_000_000,
        }];
    }
    let mut out = Vec::new();
    write_gnu(&profile, GnuTarget::default(), &mut out).unwrap();
    let path = dir.path().join("wide.gmon");
    std::fs::write(&path, &out).unwrap();
    // 150000 = 65535 + 65535 + 18930: three records; 5e9 = 4294967295 + 705032705: two.
    assert_eq!(gprof_info(&exe, &path), (1, 3, 2, 0));
    let back = read(&out, GnuTarget::default()).unwrap();
    // Two records for the one arc, in file order; they add up to the original count.
    let parts: Vec<u64> = back.modules[0].arcs.iter().map(|a| a.count).collect();
    assert_eq!(
        parts,
        vec![u64::from(u32::MAX), 5_000_000_000 - u64::from(u32::MAX)]
    );
    assert_eq!(back.modules[0].histogram, profile.modules[0].histogram);
    assert_eq!(gprof_calls(&exe, &path).get("leaf"), Some(&5_000_000_000));
    // gprof's time for leaf is ten times what it shows for a tenth of the samples in a single record.
    let leaf_seconds = |path: &Path| -> f64 {
        let flat = gprof(&exe, path, &["-b", "-p"]);
        let line = flat
            .lines()
            .find(|l| l.ends_with(" leaf"))
            .unwrap()
            .to_string();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let wide = leaf_seconds(&path);
    if let Some(Buckets::Dense32(v)) = profile.modules[0]
        .histogram
        .as_mut()
        .map(|h| &mut h.ranges[0].buckets)
    {
        v.iter_mut().for_each(|c| *c /= 10);
    }
    let mut out = Vec::new();
    write_gnu(&profile, GnuTarget::default(), &mut out).unwrap();
    let tenth = dir.path().join("tenth.gmon");
    std::fs::write(&tenth, &out).unwrap();
    assert_eq!(gprof_info(&exe, &tenth), (1, 1, 2, 0));
    let narrow = leaf_seconds(&tenth);
    assert!(
        narrow > 100.0 && (wide - 10.0 * narrow).abs() < 0.01,
        "{wide} vs {narrow}"
    );
}

/// Big-endian and 32-bit targets (no cross compiler here): write_gnu and the reader agree, and the bytes are
/// laid out as gprof's gmon_io.c reads them.
#[test]
fn gnu_big_endian_32_bit_round_trip() {
    let target = GnuTarget {
        big_endian: true,
        address_size: 4,
    };
    let profile = Profile {
        stacks: None,
        format: SourceFormat::Gnu { version: 1 },
        header: Header {
            hz: 1000,
            sample_period_ns: 1_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            total_samples: 3,
            ..Header::default()
        },
        modules: vec![Module {
            flags: module_flags::MAIN_PROGRAM | module_flags::PROFILED,
            samples: 3,
            histogram: Some(Histogram {
                bucket_bits: 16,
                ranges: vec![HistRange {
                    start: LinkAddress(0x8000),
                    end: LinkAddress(0x8010),
                    buckets: Buckets::Dense16(vec![0, 1, 2, 0]),
                }],
            }),
            arcs: vec![Arc {
                caller_key: 0,
                caller_address: LinkAddress(0x8004),
                callee_address: LinkAddress(0x8008),
                count: 7,
            }],
            basic_blocks: vec![BasicBlockCount {
                address: LinkAddress(0x8000),
                count: 2,
            }],
            ..Module::default()
        }],
    };
    let mut out = Vec::new();
    write_gnu(&profile, target, &mut out).unwrap();
    // Header 20, histogram 1+4+4+4+4+15+1+8, arc 1+4+4+4, bb 1+4+4+4.
    assert_eq!(out.len(), 20 + 41 + 13 + 13);
    assert_eq!(&out[..8], b"gmon\0\0\0\x01");
    assert_eq!(&out[21..25], &0x8000u32.to_be_bytes());
    assert_eq!(read(&out, target).unwrap(), profile);
    // Addresses that do not fit the target are refused.
    let mut wide = profile.clone();
    wide.modules[0].arcs[0].callee_address = LinkAddress(1 << 40);
    assert!(write_gnu(&wide, target, Vec::new()).is_err());
}
