//! `LD_PROFILE` with the runtime present: the runtime restarts the program once without glibc's own
//! profiler, so nothing reaches ld.so's output folder, and the program's output and exit status stay the same.

use std::path::{Path, PathBuf};
use std::process::Output;

use mslprof_format::model::module_flags;
use mslprof_tests::{Workspace, analyzer_binary, fixtures_dir, module, run};

/// The dynamic linker as a program, for a start through ld.so explicitly.
const DYNAMIC_LINKER: &str = "/lib64/ld-linux-x86-64.so.2";

struct Fixture {
    ws: Workspace,
    app: PathBuf,
}

impl Fixture {
    fn build() -> Fixture {
        let ws = Workspace::new();
        let source = |name: &str| fixtures_dir("ld_profile").join(name);
        ws.shared_library(
            "libfoo.so",
            &[source("libfoo.c")],
            &["-Wl,-soname,libfoo.so"],
        );
        let app = ws.program("app", &[source("app.c")], &["libfoo.so"]);
        Fixture { ws, app }
    }

    /// A fresh, empty folder for ld.so's own profiler output (`LD_PROFILE_OUTPUT`).
    fn output_folder(&self, name: &str) -> PathBuf {
        let folder = self.ws.join(name);
        std::fs::create_dir(&folder).unwrap();
        folder
    }

    /// Runs the app (through ld.so when `through_ld_so`) with `LD_PROFILE=libfoo.so` and ld.so's output in
    /// `folder`, with or without the runtime.
    fn run(&self, with_runtime: bool, through_ld_so: bool, folder: &Path) -> Output {
        let mut command = match (with_runtime, through_ld_so) {
            (true, false) => self.ws.command_with_runtime(&self.app),
            (false, false) => self.ws.command(&self.app),
            (true, true) => self.ws.command_with_runtime(Path::new(DYNAMIC_LINKER)),
            (false, true) => self.ws.command(Path::new(DYNAMIC_LINKER)),
        };
        if through_ld_so {
            command.arg("./app");
        }
        command
            .args(["two words", "", "last"])
            .env("LD_PROFILE", "libfoo.so")
            .env("LD_PROFILE_OUTPUT", folder);
        run(&mut command)
    }
}

fn entries(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn ld_profile_names_one_library_and_ld_so_writes_nothing() {
    let fixture = Fixture::build();
    for through_ld_so in [false, true] {
        // Without the runtime, glibc's ld.so profiles libfoo.so itself: the fixture does reach its profiler.
        let plain_folder = fixture.output_folder(&format!("plain-{through_ld_so}"));
        let plain = fixture.run(false, through_ld_so, &plain_folder);
        assert_eq!(plain.status.code(), Some(3));
        assert_eq!(entries(&plain_folder), ["libfoo.so.profile"]);

        let _ = std::fs::remove_file(fixture.ws.join("gmon.out"));
        let folder = fixture.output_folder(&format!("runtime-{through_ld_so}"));
        let profiled = fixture.run(true, through_ld_so, &folder);
        let stderr = String::from_utf8_lossy(&profiled.stderr);
        assert_eq!(profiled.status.code(), Some(3), "{stderr}");
        assert_eq!(
            String::from_utf8_lossy(&profiled.stdout),
            String::from_utf8_lossy(&plain.stdout)
        );
        assert!(
            String::from_utf8_lossy(&plain.stdout)
                .contains("LD_PROFILE=libfoo.so\nMSLPROF_LD_PROFILE=(unset)\n")
        );
        assert_eq!(stderr, "", "through ld.so: {through_ld_so}");
        assert_eq!(
            entries(&folder),
            Vec::<String>::new(),
            "through ld.so: {through_ld_so}"
        );

        // The runtime's profile selects libfoo.so, as LD_PROFILE asked.
        let profile = fixture.ws.profile("gmon.out");
        for m in &profile.modules {
            let selected = m.flags & module_flags::PROFILED != 0;
            let name = String::from_utf8_lossy(&m.name);
            assert_eq!(selected, name == "libfoo.so", "{name}");
        }
        assert!(module(&profile, "libfoo.so").flags & module_flags::PROFILED != 0);
    }
}

/// An output file from an earlier run without the runtime is neither removed nor changed.
#[test]
fn an_earlier_glibc_profile_is_left_alone() {
    let fixture = Fixture::build();
    let folder = fixture.output_folder("sprof");
    assert_eq!(fixture.run(false, false, &folder).status.code(), Some(3));
    let earlier = std::fs::read(folder.join("libfoo.so.profile")).unwrap();
    // The runtime knows its process's start time to the clock tick, and file times lag: a file born less than
    // 20 ms before the start counts as the process's own (runtime/README.md).
    std::thread::sleep(std::time::Duration::from_millis(100));
    let profiled = fixture.run(true, false, &folder);
    assert_eq!(profiled.status.code(), Some(3));
    assert_eq!(entries(&folder), ["libfoo.so.profile"]);
    assert_eq!(
        std::fs::read(folder.join("libfoo.so.profile")).unwrap(),
        earlier
    );
}

/// `mslprof run` hands LD_PROFILE to the runtime under another name: no restart, and still nothing from ld.so.
#[test]
fn mslprof_run_keeps_ld_profile_away_from_ld_so() {
    let fixture = Fixture::build();
    let folder = fixture.output_folder("sprof");
    let mut command = fixture.ws.command(&analyzer_binary());
    command
        .args(["run", "./app", "x"])
        .env("LD_PROFILE", "libfoo.so")
        .env("LD_PROFILE_OUTPUT", &folder);
    let output = run(&mut command);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("argv[1]=[x]\nLD_PROFILE=libfoo.so\nMSLPROF_LD_PROFILE=(unset)\n"),
        "{stdout}"
    );
    assert_eq!(entries(&folder), Vec::<String>::new());
    let profile = fixture.ws.profile("gmon.out");
    assert!(module(&profile, "libfoo.so").flags & module_flags::PROFILED != 0);
    assert!(module(&profile, "app").flags & module_flags::PROFILED == 0);
}

/// A script (`#!`) is restarted as itself, not as its interpreter: same arguments, same process name.
#[test]
fn a_script_keeps_its_name_and_arguments() {
    let ws = Workspace::new();
    // Written under another name and copied by `cp`: a file this process opened for writing could still be
    // open in a child another test thread forks meanwhile, and executing it would fail with ETXTBSY.
    let text = ws.join("script.txt");
    std::fs::write(
        &text,
        "#!/bin/sh\necho \"$0 $# [$1] [$2] LD_PROFILE=$LD_PROFILE\"\ncat /proc/$$/comm\nexit 4\n",
    )
    .unwrap();
    let copied = run(ws.command(Path::new("cp")).arg(&text).arg("script.sh"));
    assert!(copied.status.success(), "cp: {copied:?}");
    std::fs::set_permissions(
        ws.join("script.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let outputs: Vec<Output> = [false, true]
        .into_iter()
        .map(|with_runtime| {
            let mut command = match with_runtime {
                true => ws.command_with_runtime(Path::new("./script.sh")),
                false => ws.command(Path::new("./script.sh")),
            };
            command
                .args(["two words", ""])
                .env("LD_PROFILE", "libc.so")
                .env("GPROFDIR", "");
            run(&mut command)
        })
        .collect();
    assert_eq!(outputs[0].status.code(), Some(4));
    assert_eq!(
        String::from_utf8_lossy(&outputs[0].stdout),
        "./script.sh 2 [two words] [] LD_PROFILE=libc.so\nscript.sh\n"
    );
    assert_eq!(outputs[1].status.code(), Some(4));
    assert_eq!(outputs[1].stdout, outputs[0].stdout);
    assert_eq!(String::from_utf8_lossy(&outputs[1].stderr), "");
}
