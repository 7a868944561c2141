//! Issue 15: input that is neither an ELF file nor a profile is refused with what it is, and exit status 1.

use std::process::Command;

use mslprof_tests::analyzer::scratch;
use mslprof_tests::{analyzer_binary, run};

#[test]
fn text_files_and_folders_are_refused() {
    let dir = scratch("bad-input");
    // A real mslprof profile in the folder, which the bad arguments must not fall back to silently.
    let prog = dir.join("prog");
    std::fs::write(dir.join("main.c"), "int main(void) { return 0; }\n").unwrap();
    mslprof_tests::cc(&dir, ["-o", "prog", "main.c"]);
    let ran = run(Command::new(&prog)
        .current_dir(&*dir)
        .env("LD_PRELOAD", mslprof_tests::runtime_library())
        .env_remove("GPROFDIR")
        .env_remove("GMON_OUT_PREFIX"));
    assert!(ran.status.success());
    assert!(dir.join("gmon.out").exists());
    std::fs::write(dir.join("notes.txt"), "some notes\nnot a profile\n").unwrap();
    std::fs::create_dir(dir.join("somedir")).unwrap();
    for (args, want) in [
        (
            vec!["notes.txt"],
            "mslprof: notes.txt: not an ELF file or a profile\n",
        ),
        (
            vec!["somedir"],
            "mslprof: somedir: is a folder, not an ELF file or a profile\n",
        ),
        (
            vec!["prog", "notes.txt"],
            "mslprof: notes.txt: not a profile (it is a text file; a profile is the gmon.out a profiled program writes)\n",
        ),
    ] {
        let out = run(Command::new(analyzer_binary())
            .current_dir(&*dir)
            .args(&args));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let good = run(Command::new(analyzer_binary())
        .current_dir(&*dir)
        .args(["prog", "gmon.out"]));
    assert_eq!(good.status.code(), Some(0));
}

/// In a folder without `gmon.out`, a single bad argument is diagnosed by its own name (it used to be taken
/// as the executable, and the error named the default profile `gmon.out` instead); a GNU gmon.out given
/// alone is a profile, not the executable.
#[test]
fn a_single_bad_argument_is_named_without_a_gmon_out() {
    let dir = scratch("bad-input-alone");
    std::fs::write(dir.join("notes.txt"), "some notes\nnot a profile\n").unwrap();
    std::fs::write(dir.join("empty.out"), "").unwrap();
    std::fs::create_dir(dir.join("SOME_FOLDER")).unwrap();
    for (arg, want) in [
        (
            "missing.out",
            "mslprof: missing.out: No such file or directory (os error 2)\n",
        ),
        (
            "SOME_FOLDER",
            "mslprof: SOME_FOLDER: is a folder, not an ELF file or a profile\n",
        ),
        (
            "notes.txt",
            "mslprof: notes.txt: not an ELF file or a profile\n",
        ),
        (
            "empty.out",
            "mslprof: empty.out: is empty (0 bytes): not an ELF file or a profile\n",
        ),
    ] {
        let out = run(Command::new(analyzer_binary()).current_dir(&*dir).arg(arg));
        assert_eq!(out.status.code(), Some(1), "{arg}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{arg}");
        assert!(out.stdout.is_empty(), "{arg}");
    }
    // A GNU gmon.out alone: read as the profile (against a.out), not taken for the executable.
    std::fs::write(
        dir.join("main.c"),
        "int twice(int x) { return 2 * x; }\nint main(void) { return twice(0); }\n",
    )
    .unwrap();
    mslprof_tests::cc(&dir, ["-pg", "-O0", "-o", "a.out", "main.c"]);
    let ran = run(Command::new(dir.join("a.out")).current_dir(&*dir));
    assert!(ran.status.success());
    std::fs::rename(dir.join("gmon.out"), dir.join("gnu.out")).unwrap();
    let out = run(Command::new(analyzer_binary())
        .current_dir(&*dir)
        .args(["-b", "-q", "gnu.out"]));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("twice [1]"),
        "{out:?}"
    );
}
