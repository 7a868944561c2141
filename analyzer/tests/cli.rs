//! The command line explains itself: every option of `mslprof --help` has a description, under gprof's
//! headings; `-h` is the short form; every subcommand answers `--help`; a directory named as a file is
//! called one.

use std::process::{Command, Output};

fn mslprof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mslprof"))
        .args(args)
        .output()
        .expect("running mslprof")
}

fn stdout_of(args: &[&str]) -> String {
    let output = mslprof(args);
    assert!(
        output.status.success(),
        "mslprof {args:?}: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

#[test]
fn long_help_describes_every_option_under_gprofs_headings() {
    let help = stdout_of(&["--help"]);
    for heading in [
        "Output styles:",
        "Analysis options:",
        "Miscellaneous options:",
    ] {
        assert!(help.contains(heading), "no heading {heading:?} in\n{help}");
    }
    let lines: Vec<&str> = help.lines().collect();
    let mut options = 0;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if !(line.starts_with("  ") && trimmed.starts_with('-')) {
            continue;
        }
        options += 1;
        // clap's long help puts each description on the lines after the option, indented further.
        let next = lines.get(i + 1).copied().unwrap_or("");
        let indent = |s: &str| s.len() - s.trim_start().len();
        assert!(
            !next.trim().is_empty() && indent(next) > indent(line),
            "option without a description: {line:?}"
        );
    }
    assert!(options >= 30, "only {options} options found in\n{help}");
    for letter in [
        "-p", "-P", "-q", "-Q", "-b", "-i", "-L", "-T", "-w", "-a", "-D", "-k", "-m", "-n", "-N",
        "-S", "-z", "-O", "-s", "-v", "-e", "-E", "-f", "-F", "-h",
    ] {
        assert!(
            help.contains(&format!("  {letter}, --")),
            "gprof's {letter} is not listed in\n{help}"
        );
    }
}

#[test]
fn short_help_is_shorter_than_long_help_and_gprofs_h_gives_it() {
    let short = stdout_of(&["-h"]);
    let long = stdout_of(&["--help"]);
    assert!(short.lines().count() < long.lines().count());
    assert!(short.contains("--flat-profile") && short.contains("Usage: mslprof"));
}

#[test]
fn every_subcommand_answers_help() {
    for sub in ["run", "demo", "export"] {
        for flag in ["--help", "-h"] {
            let text = stdout_of(&[sub, flag]);
            assert!(
                text.contains(&format!("Usage: mslprof {sub}")),
                "mslprof {sub} {flag}:\n{text}"
            );
        }
    }
}

#[test]
fn a_directory_named_as_a_file_is_called_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let output = mslprof(&["/bin/true", path]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!("mslprof: {path}: Is a directory (os error 21)\n")
    );
}

#[test]
fn export_refuses_extra_arguments() {
    let output = mslprof(&["export", "a", "b", "c"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).starts_with("mslprof: export: usage:"));
}
