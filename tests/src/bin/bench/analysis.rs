//! Report generation speed and memory: mslprof against GNU gprof on the same GNU gmon.out, small (a real
//! `-pg` run) and large (a synthetic profile over rustc's librustc_driver), and mslprof on a real sampling
//! profile of rustc.

use crate::measure::{Invocation, interleaved};
use crate::report::{Section, ms, ratio};
use crate::{Env, Scale, fixtures};
use mslprof_format::{
    Buckets, GnuTarget, Header, HistRange, Histogram, Module, Profile, SourceFormat, module_flags,
};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use std::path::{Path, PathBuf};

/// A small deterministic pseudo-random sequence (xorshift64*), so the synthetic inputs (this suite's profile,
/// the generated call-counting programs) are the same every run.
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Shuffles `items` (Fisher–Yates).
    pub fn permute<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// librustc_driver of the toolchain that runs this harness.
fn rustc_driver() -> Option<PathBuf> {
    let out = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let lib = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()).join("lib");
    std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librustc_driver-"))
        })
}

/// Writes a GNU gmon.out over `.text` of `elf`: 4 bytes of text per 16-bit bin, `samples` random non-zero bins,
/// and `arcs` random arcs between its function symbols. Returns the number of function symbols.
fn synthetic_gmon(elf: &Path, out: &Path, samples: u64, arcs: u64) -> Result<usize, String> {
    let data = std::fs::read(elf).map_err(|e| format!("{}: {e}", elf.display()))?;
    let file = object::File::parse(&*data).map_err(|e| format!("{}: {e}", elf.display()))?;
    let text = file.section_by_name(".text").ok_or("no .text")?;
    let (low, size) = (text.address(), text.size());
    let mut funcs: Vec<u64> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() >= low && s.address() < low + size)
        .map(|s| s.address())
        .collect();
    funcs.sort_unstable();
    funcs.dedup();
    if funcs.is_empty() {
        return Err(format!("{}: no function symbols in .text", elf.display()));
    }
    let nbins = size / 4;
    let mut rng = Xorshift(0x9E37_79B9_7F4A_7C15);
    let mut bins = vec![0u16; nbins as usize];
    for _ in 0..samples {
        let b = rng.below(nbins) as usize;
        bins[b] = bins[b].saturating_add(1 + rng.below(20) as u16);
    }
    let mut arc_list = Vec::with_capacity(arcs as usize);
    for _ in 0..arcs {
        let from = funcs[rng.below(funcs.len() as u64) as usize] + 4 + rng.below(64);
        let to = funcs[rng.below(funcs.len() as u64) as usize];
        arc_list.push(mslprof_format::Arc {
            caller_key: 0,
            caller_address: mslprof_format::LinkAddress(from),
            callee_address: mslprof_format::LinkAddress(to),
            count: 1 + rng.below(1000),
        });
    }
    let profile = Profile {
        stacks: None,
        format: SourceFormat::Gnu { version: 1 },
        header: Header {
            hz: 100,
            sample_period_ns: 10_000_000,
            dimension: b"seconds".to_vec(),
            dimension_abbrev: b's',
            ..Header::default()
        },
        modules: vec![Module {
            key: 0,
            flags: module_flags::PROFILED | module_flags::MAIN_PROGRAM,
            histogram: Some(Histogram {
                bucket_bits: 16,
                ranges: vec![HistRange {
                    start: mslprof_format::LinkAddress(low),
                    end: mslprof_format::LinkAddress(low + nbins * 4),
                    buckets: Buckets::Dense16(bins),
                }],
            }),
            arcs: arc_list,
            ..Module::default()
        }],
    };
    let f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    mslprof_format::write_gnu(&profile, GnuTarget::default(), std::io::BufWriter::new(f))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(funcs.len())
}

/// Samples in the synthetic profile.
const SYNTHETIC_SAMPLES: u64 = 2_000_000;

/// Runs [`synthetic_gmon`] in a child process (this program with `--synthetic-gmon`). A child inherits its
/// parent's peak RSS through fork and exec, so building the 62 MB histogram here would be charged to every
/// program measured afterwards.
fn synthetic_gmon_in_child(elf: &Path, out: &Path, arcs: u64) -> Result<usize, String> {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let output = std::process::Command::new(me)
        .arg("--synthetic-gmon")
        .args([elf.as_os_str(), out.as_os_str()])
        .arg(arcs.to_string())
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("--synthetic-gmon printed no function count: {e}"))
}

/// The child side of [`synthetic_gmon_in_child`]: `args` are the ELF file, the output and the arc count;
/// prints the number of function symbols.
pub fn synthetic_gmon_main(args: &[String]) -> Result<(), String> {
    let [elf, out, arcs] = args else {
        return Err("usage: bench --synthetic-gmon ELF OUT ARCS".into());
    };
    let arcs = arcs.parse().map_err(|e| format!("arc count: {e}"))?;
    let nfuncs = synthetic_gmon(Path::new(elf), Path::new(out), SYNTHETIC_SAMPLES, arcs)?;
    println!("{nfuncs}");
    Ok(())
}

/// A generated C program of about 100 000 source lines (2 000 functions of 50 statement lines each, called
/// in a loop for about a second), built with `-O1 -pg -g`: a line-level profile's line tables at scale.
fn build_many_lines(dir: &Path) -> Result<(PathBuf, usize), String> {
    use std::fmt::Write as _;
    const FUNCTIONS: usize = 2000;
    const STATEMENTS: usize = 48;
    let mut c = String::from("#include <stdio.h>\nvolatile unsigned long sink;\n");
    for f in 0..FUNCTIONS {
        let _ = writeln!(
            c,
            "__attribute__((noinline)) unsigned long f{f}(unsigned long x)\n{{"
        );
        for s in 0..STATEMENTS {
            let _ = writeln!(c, "    x = x * {} + (x >> {});", 3 + 2 * (s % 5), 1 + s % 7);
        }
        c.push_str("    return x;\n}\n");
    }
    c.push_str("int main(void)\n{\n    unsigned long x = 1;\n    for (int round = 0; round < 2000; round++) {\n");
    for f in 0..FUNCTIONS {
        let _ = writeln!(c, "        x = f{f}(x);");
    }
    c.push_str("    }\n    sink = x;\n    printf(\"%lu\\n\", x);\n    return 0;\n}\n");
    let lines = c.lines().count();
    let src = dir.join("many_lines.c");
    std::fs::write(&src, c).map_err(|e| format!("{}: {e}", src.display()))?;
    fixtures::cc(
        dir,
        &[
            "-O1",
            "-pg",
            "-g",
            "-o",
            "many_lines",
            &src.to_string_lossy(),
        ],
    )?;
    Ok((dir.join("many_lines"), lines))
}

pub fn run(env: &Env) -> Result<Section, String> {
    let dir = env.folder("analysis")?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let compare = |label: &str,
                   options: &[&str],
                   exe: &Path,
                   gmon: &Path,
                   runs: usize,
                   rows: &mut Vec<Vec<String>>|
     -> Result<(), String> {
        let mut args: Vec<String> = options.iter().map(|o| o.to_string()).collect();
        args.extend([
            exe.to_string_lossy().into_owned(),
            gmon.to_string_lossy().into_owned(),
        ]);
        let invs = [
            Invocation::new("GNU gprof 2.40", "gprof", &dir).args(args.clone()),
            Invocation::new("mslprof", &env.analyzer, &dir).args(args.clone()),
        ];
        let med = interleaved(&invs, runs)?;
        for (i, inv) in invs.iter().enumerate() {
            rows.push(vec![
                label.to_string(),
                inv.label.clone(),
                ms(med[i].wall),
                format!("{}", med[i].max_rss_kib),
                if i == 1 {
                    ratio(med[1].wall.as_secs_f64(), med[0].wall.as_secs_f64())
                } else {
                    String::new()
                },
                med[i].runs.to_string(),
            ]);
        }
        Ok(())
    };

    // Small: a real -pg run under glibc.
    let fib = fixtures::build_fib(&dir)?;
    crate::measure::run_once(&Invocation::new("fib", &fib.pg, &dir).args(["1", "30"]))?;
    compare(
        "fib_fp -pg, real gmon.out",
        &["-b"],
        &fib.pg,
        &dir.join("gmon.out"),
        env.runs,
        &mut rows,
    )?;

    // Large: synthetic GNU gmon.out over librustc_driver.
    if env.scale != Scale::Quick {
        match rustc_driver() {
            Some(driver) => {
                let arc_counts: &[u64] = if env.scale == Scale::Full {
                    &[20_000, 200_000]
                } else {
                    &[20_000]
                };
                for &arcs in arc_counts {
                    let gmon = dir.join(format!("driver-{arcs}.gmon"));
                    let nfuncs = synthetic_gmon_in_child(&driver, &gmon, arcs)?;
                    compare(
                        &format!("librustc_driver, {nfuncs} functions, {arcs} arcs"),
                        &["-b"],
                        &driver,
                        &gmon,
                        1,
                        &mut rows,
                    )?;
                }
            }
            None => notes.push("librustc_driver not found: large-input rows skipped.".into()),
        }
    }
    // Line-level profiles (-l): Lua 5.4 built with -g (the committed golden input), and a generated
    // 100 000-line C program built with -pg -g and run here.
    let lua = env.workspace.join("tests/golden/analyzer/lua-g");
    compare(
        "Lua 5.4 `-pg -g`, `-l -b` (line-level flat profile and call graph)",
        &["-l", "-b"],
        &lua.join("lua"),
        &lua.join("gmon.out"),
        env.runs,
        &mut rows,
    )?;
    let lines_dir = dir.join("lines");
    std::fs::create_dir_all(&lines_dir).map_err(|e| e.to_string())?;
    let (program, source_lines) = build_many_lines(&lines_dir)?;
    crate::measure::run_once(&Invocation::new("many_lines", &program, &lines_dir))?;
    compare(
        &format!("generated C program of {source_lines} lines `-pg -g`, `-l -b`"),
        &["-l", "-b"],
        &program,
        &lines_dir.join("gmon.out"),
        env.runs,
        &mut rows,
    )?;
    notes.push("Target: each line-level profile (`-l`) in under 2 s.".into());
    // A real sampling profile: rustc compiling a small crate with every module profiled.
    if let Some(rustc) = crate::sampling::real_rustc() {
        let rdir = dir.join("rustc");
        std::fs::create_dir_all(&rdir).map_err(|e| e.to_string())?;
        std::fs::write(
            rdir.join("small.rs"),
            "pub fn f(v: &[u64]) -> u64 { v.iter().map(|x| x * 3).sum() }\n",
        )
        .map_err(|e| e.to_string())?;
        crate::measure::run_once(
            &Invocation::new("rustc", &rustc, &rdir)
                .args(["--crate-type", "lib", "-O", "small.rs"])
                .env("LD_PRELOAD", env.runtime.to_string_lossy()),
        )?;
        let report = Invocation::new("mslprof", &env.analyzer, &rdir).arg("-b");
        let med = interleaved(std::slice::from_ref(&report), env.runs)?;
        rows.push(vec![
            "rustc sampling profile of every module (LD_PROFILE unset), modules found from the file".into(),
            "mslprof".into(),
            ms(med[0].wall),
            med[0].max_rss_kib.to_string(),
            String::new(),
            med[0].runs.to_string(),
        ]);
        notes.push("Target: a sampling profile of a real rustc run is reported in under 2 s (no GNU counterpart: gprof reads one module).".into());
    }
    notes.push("Targets: on the large input mslprof under 1/10 of GNU gprof's wall time with no more peak memory; on small inputs not slower.".into());
    Ok(Section {
        title: "Report generation: mslprof against GNU gprof".into(),
        intro: "Both programs print the report of the same GNU gmon.out (`-b`, and `-l -b` for line-level rows) to /dev/null. The large input is a GNU gmon.out \
                over `.text` of rustc's librustc_driver (4 bytes per 16-bit bin, 2 000 000 random samples, random arcs between \
                its functions), generated deterministically by the harness."
            .into(),
        header: ["input", "program", "wall ms (median)", "peak RSS KiB", "mslprof / gprof", "runs"].iter().map(|s| s.to_string()).collect(),
        rows,
        notes,
    })
}
