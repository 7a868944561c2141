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
