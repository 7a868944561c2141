//! Issue 12: `cargo install --path analyzer --root DIR`, then `DIR/bin/mslprof run -- ./app` works with
//! nothing else: the release binary carries the runtime and writes it to a private folder when no
//! `libmslprof.so` is found beside it. (A release build from scratch: about a minute and a half here.)

use std::path::Path;
use std::process::Command;

use mslprof_tests::analyzer::scratch;
use mslprof_tests::{assert_success, run};

#[test]
fn installed_binary_runs_programs_with_nothing_else() {
    let dir = scratch("install");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = run(Command::new(cargo)
        .args(["install", "--locked", "--offline", "--path"])
        .arg(workspace.join("analyzer"))
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--target-dir")
        .arg(dir.join("target"))
        .env_remove("MSLPROF_NO_EMBED"));
    assert_success(&out, "cargo install");
    let bin = dir.join("root/bin");
    let installed: Vec<_> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        installed,
        vec![std::ffi::OsString::from("mslprof")],
        "only the binary"
    );
    // Keep the build products out of the way: only the installed binary is left.
    std::fs::remove_dir_all(dir.join("target")).unwrap();

    std::fs::write(
        dir.join("app.c"),
        "static int leaf(int x) { return x + 1; }\n\
         int main(void) { volatile int a = 0; for (int i = 0; i < 1000; i++) a = leaf(a); return a == 1000 ? 3 : 0; }\n",
    )
    .unwrap();
    assert_success(
        &run(Command::new("cc")
            .current_dir(&*dir)
            .args(["-pg", "-O0", "-o", "app", "app.c"])),
        "cc",
    );
    let out = run(Command::new(bin.join("mslprof"))
        .current_dir(&*dir)
        .env_remove("MSLPROF_LIBRARY")
        .env_remove("LD_PRELOAD")
        .env("TMPDIR", &*dir)
        .args(["run", "-b", "-p", "--", "./app"]));
    assert_eq!(out.status.code(), Some(3), "the program's exit status");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.ends_with(" leaf") && l.split_whitespace().nth(3) == Some("1000")),
        "{err}"
    );
}
