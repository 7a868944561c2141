//! Symbol selection on real ELF files built here: separate debug files found through
//! `.gnu_debuglink` for stripped programs, compiler-split parts (`foo.cold`) kept for multi-module
//! reports but dropped the gprof way for GNU input, and the `.dynsym` fallback for stripped libraries.

use std::path::Path;
use std::process::Command;

use mslprof_analyzer::elf::symbols::{self, SelectOptions};
use mslprof_tests::analyzer::have;
use mslprof_tests::cc;

fn run(dir: &Path, prog: &str, args: &[&str]) -> bool {
    Command::new(prog)
        .args(args)
        .current_dir(dir)
        .status()
        .is_ok_and(|s| s.success())
}

/// A test's own temporary folder, removed when the test ends.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mslprof-syms-{name}-"))
        .tempdir()
        .unwrap()
}

const SRC: &str = r#"
static int helper(int x) { return x * 7; }
int exported(int x) { return helper(x) + 1; }
__asm__(".text\n.type work.cold, @function\nwork.cold:\n ret\n.size work.cold, 1\n");
int main(void) { return exported(3) == 0; }
"#;

/// `SRC` built as the program `p` in a new scratch directory `name`; `None` (after a SKIPPED line) without
/// a C compiler.
fn built_program(name: &str) -> Option<tempfile::TempDir> {
    let tmp = scratch(name);
    let dir = tmp.path();
    std::fs::write(dir.join("p.c"), SRC).unwrap();
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return None;
    }
    cc(dir, ["-O0", "-o", "p", "p.c"]);
    Some(tmp)
}

fn names(path: &Path, opts: SelectOptions) -> (Vec<String>, bool) {
    let ms = symbols::load(path, opts).expect("symbols");
    (
        ms.symbols.iter().map(|s| s.name.clone()).collect(),
        ms.dynamic_only,
    )
}

#[test]
fn stripped_program_uses_its_debuglink_file() {
    let Some(tmp) = built_program("debuglink") else {
        return;
    };
    let dir = tmp.path();
    let (before, _) = names(&dir.join("p"), SelectOptions::default());
    assert!(before.contains(&"helper".to_string()), "{before:?}");
    if !run(dir, "objcopy", &["--only-keep-debug", "p", "p.debug"])
        || !run(dir, "strip", &["p"])
        || !run(dir, "objcopy", &["--add-gnu-debuglink=p.debug", "p"])
    {
        eprintln!("SKIPPED: no `objcopy`/`strip`");
        return;
    }
    let (after, dynamic_only) = names(&dir.join("p"), SelectOptions::default());
    assert!(!dynamic_only, "the debug file's .symtab is used");
    assert_eq!(after, before, "same functions as before stripping");
}

#[test]
fn split_parts_are_kept_only_for_multi_module_reports() {
    let Some(tmp) = built_program("cold") else {
        return;
    };
    let dir = tmp.path();
    let (gnu, _) = names(&dir.join("p"), SelectOptions::default());
    assert!(
        !gnu.iter().any(|n| n == "work.cold"),
        "gprof drops foo.cold: {gnu:?}"
    );
    let (ours, _) = names(
        &dir.join("p"),
        SelectOptions {
            keep_split_parts: true,
            ..SelectOptions::default()
        },
    );
    assert!(ours.iter().any(|n| n == "work.cold"), "{ours:?}");
}

#[test]
fn stripped_library_falls_back_to_dynamic_symbols() {
    let tmp = scratch("dynsym");
    let dir = tmp.path();
    std::fs::write(
        dir.join("l.c"),
        SRC.replace("int main(void) { return exported(3) == 0; }", ""),
    )
    .unwrap();
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return;
    }
    cc(dir, ["-O0", "-fPIC", "-shared", "-o", "libl.so", "l.c"]);
    if !run(dir, "strip", &["libl.so"]) {
        eprintln!("SKIPPED: no `strip`");
        return;
    }
    let (syms, dynamic_only) = names(&dir.join("libl.so"), SelectOptions::default());
    assert!(dynamic_only);
    assert!(syms.contains(&"exported".to_string()), "{syms:?}");
    assert!(
        !syms.contains(&"helper".to_string()),
        "statics are gone with .symtab"
    );
}
