//! Committed golden files: GNU gprof 2.40's output for a -pg build of Lua 5.4 (see
//! tests/golden/analyzer/lua/README.md). `mslprof` must print exactly the same bytes. With
//! `MSLPROF_REGENERATE_GOLDEN=1` the files are rewritten from `gprof` instead.

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/analyzer/lua")
}

fn mslprof() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("mslprof");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --all-targets` first",
        bin.display()
    );
    bin
}

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

#[test]
fn lua_reports_match_gprof_golden_files() {
    let dir = golden_dir();
    let regenerate = std::env::var_os("MSLPROF_REGENERATE_GOLDEN").is_some();
    let tool = if regenerate {
        PathBuf::from("gprof")
    } else {
        mslprof()
    };
    for (file, opts) in CASES {
        let out = Command::new(&tool)
            .current_dir(&dir)
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
        if out.stdout != want {
            let (a, b) = (
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&want),
            );
            let line = a
                .lines()
                .zip(b.lines())
                .position(|(x, y)| x != y)
                .unwrap_or(0);
            panic!(
                "mslprof {opts} differs from {file} at line {}:\n  got:  {:?}\n  want: {:?}",
                line + 1,
                a.lines().nth(line).unwrap_or("<end>"),
                b.lines().nth(line).unwrap_or("<end>")
            );
        }
    }
}
