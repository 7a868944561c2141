//! The analyzer against GNU gprof 2.40, live: C and C++ fixtures are built with `-pg`, run to produce a
//! GNU gmon.out, and `mslprof` must print byte for byte what `gprof` prints for the same files and
//! options. Also bad input (one line, exit 1, no panic) and a closed stdout (quiet, exit 0).

use std::path::Path;
use std::process::{Command, Stdio};

use mslprof_tests::analyzer::{
    assert_same, build_and_run, build_and_run_recursion, fixtures, lua_golden_dir, run_in, scratch,
    split, tools_present,
};
use mslprof_tests::analyzer_binary as mslprof;

const TABLE_OPTIONS: &[&str] = &[
    "-b", "-b -p -z", "-b -q", "-b -p -a", "-b -T", "-b -z", "-b -P", "-b -Q",
];

#[test]
fn recursion_and_cycles_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("recursion");
    build_and_run_recursion(&dir, "gmon.out.rec");
    let files = ["rec", "gmon.out.rec"];
    assert_same(&dir, TABLE_OPTIONS, &files);
    // No file arguments: a.out and gmon.out in the working directory, as gprof.
    std::fs::copy(dir.join("rec"), dir.join("a.out")).unwrap();
    std::fs::copy(dir.join("gmon.out.rec"), dir.join("gmon.out")).unwrap();
    assert_same(&dir, &["-b", "-b -z"], &[]);
    assert_same(
        &dir,
        &[
            "-b -q -n mid -N leaf",
            "-b -q -nrec -Nmid",
            "-b -e mid -f main",
            "-b -E leaf",
            "-b -F mid",
            "-b -k mid/leaf",
            "-b -m 2",
            "-b -pleaf",
            "-b -Pleaf",
            "-b -qa",
            "-b -Qb",
            "-b -Qmain/mid",
            "-b -w 50",
            "-b -T -z",
        ],
        &files,
    );
}

#[test]
fn three_function_cycle_pointers_and_statics_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("cycles");
    let srcs = ["cycles_main.c", "cycles_other.c"];
    build_and_run(&dir, "gcc", &["-pg", "-O0"], &srcs, "o0", "gmon.o0");
    build_and_run(&dir, "gcc", &["-pg", "-O2"], &srcs, "o2", "gmon.o2");
    build_and_run(&dir, "gcc", &["-pg", "-O1", "-g"], &srcs, "g", "gmon.g");
    build_and_run(
        &dir,
        "gcc",
        &["-pg", "-O0", "-no-pie"],
        &srcs,
        "nopie",
        "gmon.nopie",
    );
    for (p, g) in [
        ("o0", "gmon.o0"),
        ("o2", "gmon.o2"),
        ("g", "gmon.g"),
        ("nopie", "gmon.nopie"),
    ] {
        assert_same(&dir, TABLE_OPTIONS, &[p, g]);
        assert_same(
            &dir,
            &["-b -q -nfa -Nhelper", "-b -k fa/fb", "-b -D -z", "-i"],
            &[p, g],
        );
    }
    // Source-file symspecs and the `(file)` suffix of static functions need DWARF.
    assert_same(
        &dir,
        &[
            "-b -pcycles_main.c:helper",
            "-b -Pcycles_other.c",
            "-b -qcycles_other.c:helper",
            "-b -L",
            "-b -w120 -z",
        ],
        &["g", "gmon.g"],
    );
}

#[test]
fn cxx_names_are_demangled_like_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("cxx");
    build_and_run(
        &dir,
        "g++",
        &["-pg", "-O0"],
        &["templates.cc"],
        "cxx",
        "gmon.cxx",
    );
    build_and_run(
        &dir,
        "g++",
        &["-pg", "-O0", "-g"],
        &["globals.cc"],
        "glob",
        "gmon.glob",
    );
    assert_same(
        &dir,
        &["-b -z", "-b -z -T", "-b -z --no-demangle"],
        &["glob", "gmon.glob"],
    );
    assert_same(
        &dir,
        &[
            "-b",
            "-b -z",
            "-b --no-demangle",
            "-b -T",
            "-b --demangle=gnu-v3",
        ],
        &["cxx", "gmon.cxx"],
    );
}

#[test]
fn several_profiles_are_summed_and_sum_file_matches() {
    if !tools_present() {
        return;
    }
    let dir = scratch("sum");
    build_and_run_recursion(&dir, "run1");
    let again = Command::new(dir.join("rec"))
        .current_dir(&dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(again.success());
    std::fs::rename(dir.join("gmon.out"), dir.join("run2")).unwrap();
    assert_same(&dir, &["-b", "-b -q -z"], &["rec", "run1", "run2"]);

    let ours_dir = assert_same_sum(&dir, "-s", &["rec", "run1", "run2"]);
    assert_same(&ours_dir, &["-b", "-i"], &["rec", "gmon.sum"]);
}

/// `opts` (with `-s`) run by mslprof and by gprof over copies of `files` (the executable first): same stdout
/// and exit status, and the same GNU `gmon.sum` bytes. Returns the directory holding mslprof's `gmon.sum`.
fn assert_same_sum(dir: &Path, opts: &str, files: &[&str]) -> std::path::PathBuf {
    let theirs_dir = dir.join("theirs");
    let ours_dir = dir.join("ours");
    for d in [&theirs_dir, &ours_dir] {
        std::fs::create_dir_all(d).unwrap();
        for f in files {
            std::fs::copy(dir.join(f), d.join(f)).unwrap();
        }
    }
    let mut args = split(opts);
    args.extend(files.iter().map(|f| f.to_string()));
    let a = run_in(&ours_dir, &mslprof(), &args);
    let b = run_in(&theirs_dir, Path::new("gprof"), &args);
    assert_eq!(a.status.code(), b.status.code());
    assert_eq!(a.stdout, b.stdout);
    let ours = std::fs::read(ours_dir.join("gmon.sum")).expect("mslprof wrote gmon.sum");
    let theirs = std::fs::read(theirs_dir.join("gmon.sum")).expect("gprof wrote gmon.sum");
    // gprof leaves the header's 12 spare bytes (offset 8..20) uninitialised; everything else must match.
    assert_eq!(ours.len(), theirs.len(), "gmon.sum size");
    assert!(
        ours[..8] == theirs[..8] && ours[20..] == theirs[20..],
        "gmon.sum differs from gprof's"
    );
    assert_eq!(&ours[8..20], &[0u8; 12], "spare header bytes are zero");
    ours_dir
}

#[test]
fn bad_input_gives_one_line_and_exit_1() {
    if !tools_present() {
        return;
    }
    let dir = scratch("damage");
    let gmon = build_and_run_recursion(&dir, "gmon.out");
    let bytes = std::fs::read(&gmon).unwrap();
    let m = mslprof();
    let check = |args: &[&str], what: &str| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let out = run_in(&dir, &m, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{what}: exit status; stderr {err}"
        );
        assert_eq!(err.lines().count(), 1, "{what}: want one line, got {err:?}");
        assert!(err.starts_with("mslprof: "), "{what}: {err:?}");
        assert!(!err.contains("panicked"), "{what}: {err:?}");
    };
    // Every truncation point of the header and a sample of later ones.
    let mut cuts: Vec<usize> = (0..40.min(bytes.len())).collect();
    cuts.extend((40..bytes.len()).step_by(97));
    for cut in cuts {
        std::fs::write(dir.join("cut"), &bytes[..cut]).unwrap();
        let out = run_in(&dir, &m, &split("-b rec cut"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "cut at {cut}: {err}");
        if cut < 20 {
            assert_eq!(out.status.code(), Some(1), "cut at {cut} accepted");
        }
        if out.status.code() != Some(0) {
            assert_eq!(err.lines().count(), 1, "cut at {cut}: {err:?}");
            assert!(err.starts_with("mslprof: cut: "), "cut at {cut}: {err:?}");
        }
    }
    std::fs::write(
        dir.join("foreign"),
        b"this is not a profile at all, just some text\n",
    )
    .unwrap();
    check(&["rec", "foreign"], "foreign file");
    check(&["rec", "missing.out"], "missing profile");
    check(&["missing-exe", "gmon.out"], "missing executable");
    std::fs::copy(fixtures().join("recursion.c"), dir.join("notelf")).unwrap();
    check(&["notelf", "gmon.out"], "executable that is not ELF");
}

#[test]
fn closed_stdout_is_quiet() {
    if !tools_present() {
        return;
    }
    let dir = scratch("pipe");
    build_and_run_recursion(&dir, "gmon.out");
    let mut child = Command::new(mslprof())
        .current_dir(&dir)
        .args(["-z", "rec", "gmon.out"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// xorshift64*, so the random graphs are the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// The defined text symbols' addresses of the golden Lua binary, copied into `dir` (sorted, unique),
/// or `None` without `nm`.
fn lua_functions(dir: &Path) -> Option<Vec<u64>> {
    let golden = lua_golden_dir().join("lua");
    std::fs::copy(&golden, dir.join("lua")).unwrap();
    let nm = Command::new("nm")
        .args(["--defined-only", golden.to_str().unwrap()])
        .output()
        .ok()?;
    let mut funcs: Vec<u64> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (a, t) = (it.next()?, it.next()?);
            (t == "t" || t == "T")
                .then(|| u64::from_str_radix(a, 16).ok())
                .flatten()
        })
        .collect();
    funcs.sort_unstable();
    funcs.dedup();
    Some(funcs)
}

/// A random GNU gmon.out over `funcs`: a histogram, then `arcs` arcs between `chosen` random functions,
/// the callee drawn from the first `hubs` of them half of the time (so some functions have many callers).
fn random_gmon(funcs: &[u64], seed: u64, chosen: u64, arcs: u64, hubs: u64) -> Vec<u8> {
    let low = funcs[0] & !3;
    let high = (funcs[funcs.len() - 1] + 0x400) & !3;
    // Odd seeds: an odd span and a bucket count that does not divide it (fractional scale, which
    // gprof computes in integers first).
    let high = if seed % 2 == 1 { high + 1 } else { high };
    let nbins = if seed % 2 == 1 {
        (high - low) / 3
    } else {
        (high - low) / 4
    };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed);
    let mut f = Vec::new();
    f.extend_from_slice(b"gmon");
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&[0; 12]);
    f.push(0);
    f.extend_from_slice(&low.to_le_bytes());
    f.extend_from_slice(&high.to_le_bytes());
    f.extend_from_slice(&(nbins as u32).to_le_bytes());
    f.extend_from_slice(&100u32.to_le_bytes());
    f.extend_from_slice(b"seconds\0\0\0\0\0\0\0\0s");
    let mut bins = vec![0u16; nbins as usize];
    for _ in 0..3000 {
        bins[rng.below(nbins) as usize] += 1 + rng.below(8) as u16;
    }
    for b in bins {
        f.extend_from_slice(&b.to_le_bytes());
    }
    let picked: Vec<u64> = (0..chosen)
        .map(|_| funcs[rng.below(funcs.len() as u64) as usize])
        .collect();
    for i in 0..arcs {
        f.push(1);
        let from = picked[rng.below(chosen) as usize] + 4 + rng.below(40);
        let to = if hubs > 0 && i % 2 == 0 {
            picked[rng.below(hubs) as usize]
        } else {
            picked[rng.below(chosen) as usize]
        };
        f.extend_from_slice(&from.to_le_bytes());
        f.extend_from_slice(&to.to_le_bytes());
        f.extend_from_slice(&(1 + rng.below(49) as u32).to_le_bytes());
    }
    f
}

/// Dense random call graphs (many overlapping cycles, repeated arcs, self-calls) over the functions of
/// the golden Lua binary: cycle numbering, cycle membership, propagation and every tie-break must come
/// out as in gprof.
#[test]
fn random_call_graphs_match_gprof() {
    random_graphs_match_gprof("random", 1..=6, (60, 150, 0), &["-b", "-b -T -z"]);
}

/// `-r` (suggested function order) on random call graphs large enough for every stage of gprof's
/// placement: functions called from many sites grouped first, chains along the heaviest arcs, the rest.
#[test]
fn function_ordering_matches_gprof() {
    random_graphs_match_gprof(
        "ordering",
        1..=4,
        (400, 3000, 12),
        &["-r", "-b -r -z", "-b -r -p -q"],
    );
}

/// For each seed, a [`random_gmon`] over the golden Lua binary's functions with `shape`'s arguments,
/// read by mslprof and by gprof with each of `option_sets`: the outputs must be the same.
fn random_graphs_match_gprof(
    scratch_name: &str,
    seeds: std::ops::RangeInclusive<u64>,
    shape: (u64, u64, u64),
    option_sets: &[&str],
) {
    if !tools_present() {
        return;
    }
    let dir = scratch(scratch_name);
    let Some(funcs) = lua_functions(&dir) else {
        eprintln!("SKIPPED: no `nm`");
        return;
    };
    let (functions, arcs, hubs) = shape;
    for seed in seeds {
        let name = format!("{scratch_name}{seed}.gmon");
        std::fs::write(
            dir.join(&name),
            random_gmon(&funcs, seed, functions, arcs, hubs),
        )
        .unwrap();
        assert_same(&dir, option_sets, &["lua", &name]);
    }
}

/// Split a GNU gmon.out into (header, histogram records, arc records).
fn split_records(bytes: &[u8]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let (mut hist, mut arcs) = (Vec::new(), Vec::new());
    let mut i = 20;
    while i < bytes.len() {
        match bytes[i] {
            0 => {
                let nbins = u32::from_le_bytes(bytes[i + 17..i + 21].try_into().unwrap()) as usize;
                let len = 1 + 8 + 8 + 4 + 4 + 15 + 1 + 2 * nbins;
                hist.extend_from_slice(&bytes[i..i + len]);
                i += len;
            }
            1 => {
                arcs.extend_from_slice(&bytes[i..i + 21]);
                i += 21;
            }
            t => panic!("unexpected record tag {t}"),
        }
    }
    (bytes[..20].to_vec(), hist, arcs)
}

/// Profiles with only a histogram, only arcs (gprof then divides by a zero rate and prints `-nan`), or
/// nothing at all; and `-p`/`-q` asked for a table the profile cannot give (exit status 1).
#[test]
fn partial_profiles_match_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("partial");
    let gmon = build_and_run_recursion(&dir, "gmon.out");
    let (header, hist, arcs) = split_records(&std::fs::read(gmon).unwrap());
    std::fs::write(dir.join("hist"), [header.clone(), hist].concat()).unwrap();
    std::fs::write(dir.join("arcs"), [header.clone(), arcs].concat()).unwrap();
    std::fs::write(dir.join("empty"), &header).unwrap();
    let m = mslprof();
    for (file, opts) in [
        ("hist", "-b"),
        ("hist", "-b -z"),
        ("arcs", "-b"),
        ("arcs", "-b -z"),
        ("arcs", "-b -T"),
        ("empty", "-b"),
    ] {
        assert_same(&dir, &[opts], &["rec", file]);
    }
    for (file, opts) in [("hist", "-b -q"), ("arcs", "-b -p"), ("empty", "-b -p")] {
        let mut args = split(opts);
        args.extend(["rec".to_string(), file.to_string()]);
        let ours = run_in(&dir, &m, &args);
        let theirs = run_in(&dir, Path::new("gprof"), &args);
        assert_eq!(ours.status.code(), theirs.status.code(), "{opts} {file}");
        assert_eq!(ours.status.code(), Some(1));
        assert_eq!(String::from_utf8_lossy(&ours.stderr).lines().count(), 1);
    }
}

/// Histogram records in an order that is not by address: an empty range above the program's text first,
/// then the real one twice (gprof sums it). gprof keeps ranges in the order of their first record and
/// writes `gmon.sum` in that order, so the reader must not sort them.
#[test]
fn histogram_records_keep_their_file_order_like_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("hist-order");
    let gmon = build_and_run_recursion(&dir, "gmon.out");
    let (header, hist, arcs) = split_records(&std::fs::read(gmon).unwrap());
    let low = u64::from_le_bytes(hist[1..9].try_into().unwrap());
    let high = u64::from_le_bytes(hist[9..17].try_into().unwrap());
    let nbins = u32::from_le_bytes(hist[17..21].try_into().unwrap()) as usize;
    assert_eq!(hist.len(), 41 + 2 * nbins, "one histogram record");
    // Same span and bin count, hence the same scale, as gprof requires.
    let mut above = vec![0u8];
    above.extend_from_slice(&high.to_le_bytes());
    above.extend_from_slice(&(2 * high - low).to_le_bytes());
    above.extend_from_slice(&hist[17..41]);
    above.extend(std::iter::repeat_n(0u8, 2 * nbins));
    let file = [header, above, hist.clone(), arcs, hist].concat();
    std::fs::write(dir.join("two"), file).unwrap();
    assert_same(&dir, &["-b", "-b -p -z", "-b -q"], &["rec", "two"]);
    assert_same_sum(&dir, "-s", &["rec", "two"]);
    // `-i` counts the records as the file holds them: three histogram records, though two are summed
    // (gprof describes the last file only).
    assert_same(&dir, &["-i"], &["rec", "two"]);
}

/// A statically linked -pg program: thousands of libc symbols (IFUNCs, weak aliases, local labels).
#[test]
fn static_program_matches_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("static");
    let srcs = ["cycles_main.c", "cycles_other.c"];
    let mut cmd = Command::new("gcc");
    cmd.args(["-pg", "-O1", "-static", "-o"])
        .arg(dir.join("st"));
    for s in srcs {
        cmd.arg(fixtures().join(s));
    }
    if !cmd.output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: no static libc to link against");
        return;
    }
    let run = Command::new(dir.join("st"))
        .current_dir(&dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(run.success());
    assert_same(
        &dir,
        &["-b", "-b -p -z", "-b -q -z", "-b -T -z", "-b -p -a -z"],
        &["st", "gmon.out"],
    );
}

/// The same profile in the old BSD layout (no magic, no rate: gprof assumes 100 Hz).
#[test]
fn old_bsd_layout_matches_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("bsd");
    let gmon = build_and_run_recursion(&dir, "gmon.out");
    let bsd = bsd_from_gnu(&std::fs::read(gmon).unwrap(), None);
    std::fs::write(dir.join("bsd.out"), bsd).unwrap();
    assert_same(&dir, &["-b", "-b -z", "-b -T", "-i"], &["rec", "bsd.out"]);
}

/// A GNU gmon.out (one histogram record, little-endian, 8-byte addresses) rewritten as a BSD one: the old
/// header when `rate` is `None` (its 4 bytes of padding are read as two more samples), else the 4.4BSD header
/// with that profiling rate.
fn bsd_from_gnu(gmon: &[u8], rate: Option<u32>) -> Vec<u8> {
    let (_, hist, arcs) = split_records(gmon);
    let low = u64::from_le_bytes(hist[1..9].try_into().unwrap());
    let high = u64::from_le_bytes(hist[9..17].try_into().unwrap());
    let samples = &hist[41..];
    let mut bsd = Vec::new();
    bsd.extend_from_slice(&low.to_le_bytes());
    bsd.extend_from_slice(&high.to_le_bytes());
    match rate {
        None => {
            bsd.extend_from_slice(&(24 + samples.len() as u32).to_le_bytes());
            bsd.extend_from_slice(&[0; 4]);
        }
        Some(hz) => {
            bsd.extend_from_slice(&(40 + samples.len() as u32).to_le_bytes());
            bsd.extend_from_slice(&0x0005_1879u32.to_le_bytes());
            bsd.extend_from_slice(&hz.to_le_bytes());
            bsd.extend_from_slice(&[0; 12]);
        }
    }
    bsd.extend_from_slice(samples);
    for a in arcs.chunks(21) {
        bsd.extend_from_slice(&a[1..17]);
        bsd.extend_from_slice(
            &u64::from(u32::from_le_bytes(a[17..21].try_into().unwrap())).to_le_bytes(),
        );
    }
    bsd
}

/// `--file-format`/`-O`: input read in the forced layout, `-s` writing `gmon.sum` as BSD (old header at
/// 100 Hz, 4.4BSD when asked for or at another rate) or GNU, byte for byte as gprof 2.40; the combinations
/// gprof refuses are refused with exit status 1, one stderr line and no `gmon.sum`.
#[test]
fn file_format_reads_and_writes_like_gprof() {
    if !tools_present() {
        return;
    }
    let dir = scratch("file-format");
    let gmon = std::fs::read(build_and_run_recursion(&dir, "gmon.out")).unwrap();
    std::fs::write(dir.join("old.out"), bsd_from_gnu(&gmon, None)).unwrap();
    std::fs::write(dir.join("new.out"), bsd_from_gnu(&gmon, Some(100))).unwrap();
    std::fs::write(dir.join("new2.out"), bsd_from_gnu(&gmon, Some(100))).unwrap();
    std::fs::write(dir.join("fast.out"), bsd_from_gnu(&gmon, Some(1000))).unwrap();

    assert_same(
        &dir,
        &[
            "-b -O bsd",
            "-b --file-format=4.4bsd",
            "-i -Obsd",
            "-b -O auto",
        ],
        &["rec", "new.out"],
    );
    assert_same(&dir, &["-b -O bsd", "-b -z -O auto"], &["rec", "old.out"]);
    assert_same(
        &dir,
        &["-b -O magic", "-i --file-format=magic"],
        &["rec", "gmon.out"],
    );
    assert_same_sum(&dir, "-s -O magic", &["rec", "gmon.out"]);

    let bsd_sums = [
        ("-s -O bsd", "old.out", 20),
        ("-s --file-format=bsd", "new.out", 20),
        ("-s --file-format=4.4bsd", "new.out", 40),
        ("-s -Obsd", "fast.out", 40),
        ("-s -O 4.4bsd", "fast.out", 40),
        ("-s -O bsd", "new.out new2.out", 20),
    ];
    for (i, (opts, files, header)) in bsd_sums.into_iter().enumerate() {
        let sub = dir.join(format!("sum{i}"));
        let mut names = vec!["rec"];
        names.extend(files.split_whitespace());
        let ours_dir = assert_same_bsd_sum(&dir, &sub, opts, &names, header);
        // The summary reads back to the same report.
        assert_same(&ours_dir, &["-b", "-b -O bsd"], &["rec", "gmon.sum"]);
    }

    // (options, file, whether gprof is run too). gprof reads a GNU file forced to `bsd` as a BSD header whose
    // "addresses" span gigabytes, and allocates a 16 GiB histogram (about 30 s) before it gives up, so those
    // two cases check only that mslprof refuses them, at once.
    let refused = [
        ("-b -O magic", "old.out", true),
        ("-b -O bsd", "gmon.out", false),
        ("-b -O 4.4bsd", "old.out", true),
        ("-b -O 4.4bsd", "gmon.out", true),
        ("-b -O prof", "gmon.out", true),
        ("-b -O nosuch", "gmon.out", true),
        ("-s -O bsd", "gmon.out", false),
        ("-s --file-format=magic", "new.out", true),
    ];
    for (opts, file, with_gprof) in refused {
        let programs = if with_gprof {
            vec![mslprof(), Path::new("gprof").to_path_buf()]
        } else {
            vec![mslprof()]
        };
        for program in programs {
            let _ = std::fs::remove_file(dir.join("gmon.sum"));
            let mut args = split(opts);
            args.extend(["rec".to_string(), file.to_string()]);
            let out = run_in(&dir, &program, &args);
            let err = String::from_utf8_lossy(&out.stderr);
            let who = format!("{} {}", program.display(), args.join(" "));
            assert_eq!(out.status.code(), Some(1), "{who}: {err}");
            assert!(out.stdout.is_empty(), "{who}: printed a report");
            assert!(!dir.join("gmon.sum").exists(), "{who}: wrote gmon.sum");
            if program == mslprof() {
                assert_eq!(err.lines().count(), 1, "{who}: {err:?}");
                assert!(err.starts_with("mslprof: "), "{who}: {err:?}");
            }
        }
    }
}

/// Like [`assert_same_sum`] for a BSD `gmon.sum` (which has no uninitialised bytes): the files must be equal,
/// with a header of `header` bytes. Works in `sub`, a fresh directory below `dir`.
fn assert_same_bsd_sum(
    dir: &Path,
    sub: &Path,
    opts: &str,
    files: &[&str],
    header: usize,
) -> std::path::PathBuf {
    let theirs_dir = sub.join("theirs");
    let ours_dir = sub.join("ours");
    for d in [&theirs_dir, &ours_dir] {
        std::fs::create_dir_all(d).unwrap();
        for f in files {
            std::fs::copy(dir.join(f), d.join(f)).unwrap();
        }
    }
    let mut args = split(opts);
    args.extend(files.iter().map(|f| f.to_string()));
    let a = run_in(&ours_dir, &mslprof(), &args);
    let b = run_in(&theirs_dir, Path::new("gprof"), &args);
    assert_eq!(a.status.code(), Some(0), "{opts} {files:?}: {a:?}");
    assert_eq!(b.status.code(), Some(0), "gprof {opts} {files:?}: {b:?}");
    assert_eq!(a.stdout, b.stdout);
    let ours = std::fs::read(ours_dir.join("gmon.sum")).expect("mslprof wrote gmon.sum");
    let theirs = std::fs::read(theirs_dir.join("gmon.sum")).expect("gprof wrote gmon.sum");
    assert_eq!(
        ours, theirs,
        "{opts} {files:?}: gmon.sum differs from gprof's"
    );
    let ncnt = u32::from_le_bytes(ours[16..20].try_into().unwrap()) as usize;
    assert!(ncnt >= header && ours.len() >= ncnt, "{opts}: ncnt {ncnt}");
    assert_eq!((ours.len() - ncnt) % 24, 0, "{opts}: whole arc records");
    if header == 40 {
        assert_eq!(&ours[20..24], &0x0005_1879u32.to_le_bytes());
    } else {
        assert_ne!(&ours[20..24], &0x0005_1879u32.to_le_bytes());
    }
    ours_dir
}
