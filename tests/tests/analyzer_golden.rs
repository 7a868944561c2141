//! Committed golden files: GNU gprof 2.40's output for a -pg build of Lua 5.4 (see
//! tests/golden/analyzer/lua/README.md) and for one built with -g too, for the line-level options
//! (tests/golden/analyzer/lua-g/README.md). `mslprof` must print exactly the same bytes. With
//! `MSLPROF_REGENERATE_GOLDEN=1` the files are rewritten from `gprof` instead.

use std::path::PathBuf;
use std::process::Command;

use mslprof_tests::analyzer::{first_difference, lua_debug_golden_dir, lua_golden_dir};

const CASES: &[(&str, &str)] = &[
    ("b.txt", "-b"),
    ("b_p_z.txt", "-b -p -z"),
    ("b_q.txt", "-b -q"),
    ("b_p_a.txt", "-b -p -a"),
    ("b_T.txt", "-b -T"),
    ("b_q_n_N.txt", "-b -q -nluaV_execute -NluaH_resize"),
    ("b_e_f.txt", "-b -e luaD_call -f luaV_execute"),
    ("b_k.txt", "-b -k luaV_execute/luaD_precall"),
    ("i.txt", "-i"),
];

/// Line-level options on the `-g` build.
const DEBUG_CASES: &[(&str, &str)] = &[
    ("b_l_p.txt", "-b -l -p"),
    ("b_l_p_z.txt", "-b -l -p -z"),
    ("b_l_q.txt", "-b -l -q"),
    ("b_C.txt", "-b -C"),
    ("b_l_C.txt", "-b -l -C"),
    ("b_r.txt", "-b -r"),
];

#[test]
fn lua_reports_match_gprof_golden_files() {
    check_golden_files(&lua_golden_dir(), CASES);
}

#[test]
fn lua_line_level_reports_match_gprof_golden_files() {
    check_golden_files(&lua_debug_golden_dir(), DEBUG_CASES);
}

/// Annotated source (`-A`, with `-x`, `-t`, `-L`) of the `-g` build, compared live with the installed GNU
/// gprof rather than with a committed file: the listing quotes the Lua sources (about 1 MB), which are the
/// `lua-src` crate's in cargo's registry (a dev-dependency), found with `-I`.
#[test]
fn lua_annotated_source_matches_gprof() {
    let dir = lua_debug_golden_dir();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    let sources = mslprof_tests::lua_sources(&workspace).expect("the lua-src crate's sources");
    let include = format!("-I{}", sources.display());
    for opts in ["-b -A", "-b -A -x", "-b -A -t5", "-b -A -L"] {
        let run = |tool: PathBuf| {
            let out = Command::new(&tool)
                .current_dir(&dir)
                .args(opts.split_whitespace())
                .arg(&include)
                .args(["lua", "gmon.out"])
                .output()
                .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
            assert!(
                out.status.success(),
                "{} {opts}: {}",
                tool.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).expect("UTF-8")
        };
        let gnu = run(PathBuf::from("gprof"));
        let ours = run(mslprof_tests::analyzer_binary());
        assert!(
            gnu.lines().count() > 20_000,
            "{opts}: gprof annotated the sources"
        );
        if let Some((line, ours_line, gnu_line)) = first_difference(ours.as_bytes(), gnu.as_bytes())
        {
            panic!(
                "{opts}: mslprof differs from gprof at line {line}:\n  mslprof: {ours_line}\n  gprof:   {gnu_line}"
            );
        }
    }
}

/// Runs mslprof (or, when regenerating, gprof) with each case's options on `dir`'s `lua gmon.out` and
/// compares with the case's file.
fn check_golden_files(dir: &std::path::Path, cases: &[(&str, &str)]) {
    let regenerate = std::env::var_os("MSLPROF_REGENERATE_GOLDEN").is_some();
    let tool = if regenerate {
        PathBuf::from("gprof")
    } else {
        mslprof_tests::analyzer_binary()
    };
    for (file, opts) in cases {
        let out = Command::new(&tool)
            .current_dir(dir)
            .args(opts.split_whitespace())
            .args(["lua", "gmon.out"])
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{opts}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if regenerate {
            std::fs::write(dir.join(file), &out.stdout).unwrap();
            continue;
        }
        let want = std::fs::read(dir.join(file)).unwrap();
        if let Some((line, got, want)) = first_difference(&out.stdout, &want) {
            panic!(
                "mslprof {opts} differs from {file} at line {line}:\n  got:  {got:?}\n  want: {want:?}"
            );
        }
    }
}
