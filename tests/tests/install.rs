//! Issue 12: `cargo install --locked --path analyzer --root DIR`, then `DIR/bin/mslprof run -- ./app` works with
//! nothing else: the release binary carries the runtime and writes it to a private folder when no
//! `libmslprof.so` is found beside it, with the PLT-counting audit module beside it, so calls from code built
//! without -pg are counted too (`--no-plt` turns that off). (A release build from scratch: about two minutes.)

use std::path::Path;
use std::process::Command;

use mslprof_tests::analyzer::scratch;
use mslprof_tests::{assert_success, cc, run};

#[test]
fn installed_binary_runs_programs_with_nothing_else() {
    let dir = scratch("install");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // README.md's own command, with the lock file's versions (`--locked`), offline as in CI, into the scratch
    // folder instead of ~/.local.
    let readme = std::fs::read_to_string(workspace.join("README.md")).unwrap();
    let told = readme
        .lines()
        .find(|l| l.starts_with("cargo install "))
        .expect("README.md tells how to install");
    let told: Vec<&str> = told.split_whitespace().collect();
    assert!(told.contains(&"--locked"), "README.md: {told:?}");
    let arguments = told[1..].iter().map(|&a| match a {
        "analyzer" => workspace.join("analyzer").into_os_string(),
        "~/.local" => dir.join("root").into_os_string(),
        other => other.into(),
    });
    let out = run(Command::new(cargo)
        .args(arguments)
        .arg("--offline")
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
    cc(&dir, ["-pg", "-O0", "-o", "app", "app.c"]);
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

    // Built without -pg: calls into libleaf.so (also without -pg) and into libc are counted at the PLT by the
    // embedded audit module, written beside the embedded runtime.
    std::fs::write(
        dir.join("leaf.c"),
        "int plt_leaf(int x) { return x * 3 + 1; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("plain.c"),
        "#include <stdlib.h>\nint plt_leaf(int);\n\
         int main(void) { int s = 0; for (int i = 0; i < 777; i++) s += plt_leaf(i); \
         for (int i = 0; i < 333; i++) s += abs(-i); return s > 0 ? 0 : 1; }\n",
    )
    .unwrap();
    cc(
        &dir,
        ["-O0", "-fPIC", "-shared", "-o", "libleaf.so", "leaf.c"],
    );
    cc(
        &dir,
        "-O0 -fno-builtin -o plain plain.c -L. -lleaf -Wl,-rpath,$ORIGIN".split(' '),
    );
    let calls = |extra: &[&str]| {
        let out = run(Command::new(bin.join("mslprof"))
            .current_dir(&*dir)
            .env_remove("MSLPROF_LIBRARY")
            .env_remove("MSLPROF_PLT")
            .env_remove("LD_AUDIT")
            .env_remove("LD_PRELOAD")
            .env("TMPDIR", &*dir)
            .arg("run")
            .args(extra)
            .args(["-b", "-p", "--", "./plain"]));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let count = |name: &str| {
            err.lines()
                .find(|l| l.ends_with(&format!(" {name} (PLT)")))
                .and_then(|l| l.split_whitespace().nth(3).map(str::to_string))
        };
        (count("plt_leaf"), count("abs"), err)
    };
    let (leaf, abs, err) = calls(&[]);
    assert_eq!(leaf.as_deref(), Some("777"), "{err}");
    assert_eq!(abs.as_deref(), Some("333"), "{err}");
    let (leaf, abs, err) = calls(&["--no-plt"]);
    assert_eq!((leaf, abs), (None, None), "{err}");
}
