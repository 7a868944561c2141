//! Issue 15, "never name a function that did not run": on mslprof profiles, samples are charged only to
//! the function whose bytes they hit. Stripped modules are named from their unwind tables, PLT stubs as
//! `name@plt`, and a module with neither symbols nor unwind tables is one row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_format::model::{Buckets, HistRange};
use mslprof_tests::analyzer::{have, scratch};
use mslprof_tests::{analyzer_binary, assert_success, cc, fixtures_dir, run, runtime_library};
use object::{Object, ObjectSymbol};

fn fixture(name: &str) -> PathBuf {
    fixtures_dir("bounds").join(name)
}

/// Builds `u/libbounds.so`, its stripped copy `s/libbounds.so` and `prog` linked against the copy.
fn build(dir: &Path) {
    std::fs::create_dir_all(dir.join("u")).unwrap();
    std::fs::create_dir_all(dir.join("s")).unwrap();
    let lib = fixture("libbounds.c");
    cc(
        dir,
        [
            "-O1",
            "-fPIC",
            "-shared",
            "-o",
            "u/libbounds.so",
            lib.to_str().unwrap(),
        ],
    );
    std::fs::copy(dir.join("u/libbounds.so"), dir.join("s/libbounds.so")).unwrap();
    let out = run(Command::new("strip")
        .args(["--strip-all"])
        .arg(dir.join("s/libbounds.so")));
    assert_success(&out, "strip");
    let main = fixture("bounds_main.c");
    cc(
        dir,
        [
            "-O1",
            "-o",
            "prog",
            main.to_str().unwrap(),
            "-Ls",
            "-lbounds",
        ],
    );
}

/// Runs `program` under the runtime in `dir` with `MSLPROF_PROFILE=selection`.
fn profile_run(dir: &Path, program: &str, selection: &str, iterations: &str) {
    let out = run(Command::new(dir.join(program))
        .arg(iterations)
        .current_dir(dir)
        .env("LD_LIBRARY_PATH", dir.join("s"))
        .env("LD_PRELOAD", runtime_library())
        .env("MSLPROF_PROFILE", selection)
        .env("MSLPROF_HZ", "1000")
        .env_remove("LD_PROFILE"));
    assert_success(&out, program);
}

/// The flat profile's rows as name -> self seconds (as printed).
fn flat_rows(dir: &Path, program: &str, profile: &str) -> BTreeMap<String, String> {
    let out = run(Command::new(analyzer_binary())
        .current_dir(dir)
        .args(["-b", "-p", program, profile]));
    assert_success(&out, "mslprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut rows = BTreeMap::new();
    let mut in_flat = false;
    for line in text.lines() {
        if line.starts_with(" time ") {
            in_flat = true;
            continue;
        }
        if in_flat {
            if line.trim().is_empty() {
                break;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            rows.insert(f[f.len() - 1].to_string(), f[2].to_string());
        }
    }
    rows
}

fn symbol_addresses(elf: &Path) -> BTreeMap<String, u64> {
    let data = std::fs::read(elf).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .map(|s| (s.name().unwrap().to_string(), s.address()))
        .collect()
}

#[test]
fn stripped_library_samples_land_in_their_real_functions() {
    if !have("strip") {
        eprintln!("SKIPPED: `strip` (binutils) is not installed");
        return;
    }
    let dir = scratch("bounds-stripped");
    build(&dir);
    profile_run(&dir, "prog", "libbounds.so", "200000000");
    let stripped = flat_rows(&dir, "prog", "gmon.out");
    // The same profile read with the symbols of the unstripped copy (same code, same addresses).
    std::fs::copy(dir.join("u/libbounds.so"), dir.join("s/libbounds.so")).unwrap();
    let named = flat_rows(&dir, "prog", "gmon.out");
    let addresses = symbol_addresses(&dir.join("u/libbounds.so"));
    assert!(
        named.contains_key("hot_mix"),
        "the static hot function has samples: {named:?}"
    );
    assert_eq!(stripped.len(), named.len(), "{stripped:?}\n{named:?}");
    for (name, seconds) in &named {
        let by_address = format!("fn_{:x}@libbounds.so", addresses[name]);
        let got = stripped.get(name).or_else(|| stripped.get(&by_address));
        assert_eq!(
            got,
            Some(seconds),
            "{name} ({by_address}) in the stripped report {stripped:?}"
        );
    }
    assert!(
        !stripped.contains_key("bounds_tiny") || named.contains_key("bounds_tiny"),
        "a static function's samples went to an exported neighbour: {stripped:?}"
    );
}

/// `objdump -d`'s PLT stub names and addresses (binutils is the oracle).
fn objdump_plt(elf: &Path) -> Vec<(u64, String)> {
    let out = run(Command::new("objdump").arg("-d").arg(elf));
    assert_success(&out, "objdump");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.split_once(' ')?;
            let name = rest.strip_prefix('<')?.strip_suffix(">:")?;
            name.ends_with("@plt")
                .then(|| Some((u64::from_str_radix(addr, 16).ok()?, name.to_string())))?
        })
        .collect()
}

#[test]
fn samples_in_plt_stubs_are_named_as_stubs() {
    if !have("objdump") {
        eprintln!("SKIPPED: `objdump` (binutils) is not installed");
        return;
    }
    let dir = scratch("bounds-plt");
    build(&dir);
    profile_run(&dir, "prog", "a.out", "1000");
    // A tight loop through a PLT stub spends too little time in it for sampling to see it reliably: put
    // seven samples on each stub objdump names in the real profile, and read that back.
    let stubs = objdump_plt(&dir.join("prog"));
    assert!(stubs.len() >= 2, "objdump found PLT stubs: {stubs:?}");
    let mut profile = mslprof_tests::read_profile(&dir.join("gmon.out"));
    let main = profile
        .modules
        .iter_mut()
        .find(|m| m.is_main_program())
        .unwrap();
    let hist = main.histogram.as_mut().expect("main program histogram");
    let range = hist.ranges[0].clone();
    let width = (range.end - range.start) / range.buckets.len();
    let mut entries: Vec<(u64, u32)> = stubs
        .iter()
        .map(|(a, _)| ((a - range.start.0) / width, 7))
        .collect();
    entries.sort_unstable();
    hist.ranges = vec![HistRange {
        buckets: Buckets::Sparse {
            len: range.buckets.len(),
            entries,
        },
        ..range
    }];
    main.samples = 7 * stubs.len() as u64;
    profile.header.total_samples = main.samples;
    let mut bytes = Vec::new();
    mslprof_format::write(&profile, &mut bytes).unwrap();
    std::fs::write(dir.join("plt.out"), bytes).unwrap();
    let rows = flat_rows(&dir, "prog", "plt.out");
    assert!(!rows.contains_key("_init"), "{rows:?}");
    for (_, name) in &stubs {
        assert!(rows.contains_key(name), "{name} in {rows:?}");
    }
    assert_eq!(rows.len(), stubs.len(), "{rows:?}");
}

#[test]
fn module_without_symbols_or_unwind_tables_is_one_row() {
    if !have("strip") {
        eprintln!("SKIPPED: `strip` (binutils) is not installed");
        return;
    }
    let dir = scratch("bounds-bare");
    build(&dir);
    let out = run(Command::new("strip")
        .args(["--strip-all", "-R", ".eh_frame", "-R", ".eh_frame_hdr"])
        .arg(dir.join("prog")));
    assert_success(&out, "strip");
    profile_run(&dir, "prog", "a.out", "100000000");
    let rows = flat_rows(&dir, "prog", "gmon.out");
    let module_rows: Vec<&String> = rows.keys().filter(|n| !n.ends_with("@plt")).collect();
    assert_eq!(module_rows.len(), 1, "{rows:?}");
    assert!(module_rows[0].starts_with("prog+0x"), "{rows:?}");
}

/// perf's samples in `libcrypto.so.3` as (link-time address or symbol, percent of all samples).
fn perf_libcrypto_rows(data: &Path) -> Vec<(String, f64)> {
    let out = run(Command::new("perf")
        .args(["report", "--stdio", "-q", "--sort", "dso,sym", "-i"])
        .arg(data));
    assert_success(&out, "perf report");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || !f[1].starts_with("libcrypto.so") {
                return None;
            }
            Some((f[3].to_string(), f[0].trim_end_matches('%').parse().ok()?))
        })
        .collect()
}

#[test]
fn openssl_speed_rows_are_real_functions_and_agree_with_perf() {
    if let Some(why) = mslprof_tests::perf_unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let Ok(openssl) = which("openssl") else {
        eprintln!("SKIPPED: `openssl` is not installed");
        return;
    };
    let dir = scratch("bounds-openssl");
    let out = run(Command::new("perf")
        .args([
            "record",
            "-q",
            "-e",
            "cpu-clock",
            "-o",
            "perf.data",
            "--",
            "env",
        ])
        // Only openssl runs under the runtime, not perf.
        .arg(format!("LD_PRELOAD={}", runtime_library().display()))
        .arg("MSLPROF_PROFILE=libcrypto.so")
        // A thousand samples rather than a hundred: the top row's share then has a sampling error well under
        // the 5 points allowed below (about 2 points at 100 Hz, on a busy host less).
        .arg("MSLPROF_HZ=1000")
        .arg(&openssl)
        .args(["speed", "-seconds", "1", "sha256"])
        .current_dir(&dir)
        .env_remove("LD_PROFILE"));
    assert_success(&out, "perf record openssl speed");
    let report = run(Command::new(analyzer_binary())
        .current_dir(&dir)
        .args(["-b", "-p"])
        .arg(&openssl)
        .arg("gmon.out"));
    assert_success(&report, "mslprof");
    let text = String::from_utf8_lossy(&report.stdout).into_owned();
    let crypto_path = text
        .lines()
        .find_map(|l| l.split_whitespace().find(|w| w.contains("/libcrypto.so")))
        .map(|w| w.trim_end_matches(':'))
        .expect("libcrypto.so in the module table")
        .to_string();
    let rows = flat_rows(&dir, openssl.to_str().unwrap(), "gmon.out");
    let (top_name, _) = rows
        .iter()
        .max_by(|a, b| {
            a.1.parse::<f64>()
                .unwrap()
                .total_cmp(&b.1.parse::<f64>().unwrap())
        })
        .expect("rows");
    // Every named row is a real symbol of libcrypto; every other row says it is an address.
    let data = std::fs::read(&crypto_path).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let exported: BTreeMap<String, (u64, u64)> = elf
        .dynamic_symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| {
            let name = s.name().unwrap().split('@').next().unwrap().to_string();
            (name, (s.address(), s.size()))
        })
        .collect();
    for name in rows.keys() {
        assert!(
            exported.contains_key(name)
                || name.starts_with("fn_")
                || name.ends_with("@plt")
                || name.starts_with("libcrypto.so"),
            "row {name} is neither a libcrypto function nor an address"
        );
    }
    // The top row's range: an exported symbol's, or the unwind table's FDE at fn_ADDR.
    let (start, end) = if let Some(hex) = top_name
        .strip_prefix("fn_")
        .and_then(|r| r.split('@').next())
    {
        let start = u64::from_str_radix(hex, 16).unwrap();
        (start, fde_end(&crypto_path, start))
    } else {
        let (a, s) = exported[top_name];
        (a, a + s)
    };
    let perf = perf_libcrypto_rows(&dir.join("perf.data"));
    let all: f64 = perf.iter().map(|r| r.1).sum();
    let inside: f64 = perf
        .iter()
        .filter(|(sym, _)| {
            sym.strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .is_some_and(|a| a >= start && a < end)
                || sym == top_name
        })
        .map(|r| r.1)
        .sum();
    let perf_share = 100.0 * inside / all;
    let ours: f64 = text
        .lines()
        .find(|l| l.ends_with(top_name.as_str()))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("top row's share");
    eprintln!("top row {top_name}: mslprof {ours:.2} %, perf {perf_share:.2} %");
    assert!(
        (ours - perf_share).abs() <= 5.0,
        "top row {top_name} [{start:#x}, {end:#x}): mslprof {ours:.2} %, perf {perf_share:.2} %"
    );
}

fn which(tool: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(tool))
                .find(|f| f.is_file())
        })
        .ok_or(())
}

/// The end of the `.eh_frame` FDE starting at `start`, as `readelf --debug-dump=frames` gives it.
fn fde_end(elf: &str, start: u64) -> u64 {
    let out = run(Command::new("readelf").args(["--debug-dump=frames", elf]));
    let want = format!("pc={start:016x}..");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let rest = &l[l.find(&want)? + want.len()..];
            u64::from_str_radix(rest.trim(), 16).ok()
        })
        .unwrap_or_else(|| panic!("readelf lists no FDE at {start:#x} in {elf}"))
}
