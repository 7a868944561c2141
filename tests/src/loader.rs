//! Helpers for the loader-event tests (tests/tests/loader.rs): building the loader fixtures, finding functions
//! by name in a module, and summing call counts over a module's load instances.

use std::path::{Path, PathBuf};
use std::process::Command;

use mslprof_format::model::{Module, Profile, module_flags};

use crate::{Workspace, fixtures_dir};

/// A fixture source of tests/fixtures/loader/.
pub fn source(name: &str) -> PathBuf {
    fixtures_dir("loader").join(name)
}

/// Builds the two `-pg` plugins: (libalpha.so, libbeta.so).
pub fn build_plugins(workspace: &Workspace) -> (PathBuf, PathBuf) {
    let plugin = source("plugin.c");
    let alpha = workspace.shared_library(
        "libalpha.so",
        std::slice::from_ref(&plugin),
        &["-pg", "-DPLUGIN=alpha"],
    );
    let beta = workspace.shared_library("libbeta.so", &[plugin], &["-pg", "-DPLUGIN=beta"]);
    (alpha, beta)
}

/// Builds `-pg` libunits.so and a program from `fixture` linked against it.
pub fn build_units_program(workspace: &Workspace, name: &str, fixture: &str) -> PathBuf {
    workspace.shared_library("libunits.so", &[source("units.c")], &["-pg"]);
    workspace.program(name, &[source(fixture)], &["-L.", "-lunits", "-lpthread"])
}

/// A defined function of an ELF file: its link-time range `[start, end)`.
#[derive(Clone, Debug)]
pub struct Function {
    pub name: String,
    pub start: u64,
    pub end: u64,
}

/// The sized functions of `elf`, from `nm -S --defined-only` (binutils is installed with gprof).
pub fn functions(elf: &Path) -> Vec<Function> {
    let output = Command::new("nm")
        .args(["-S", "--defined-only"])
        .arg(elf)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm on {}: {e}", elf.display()));
    assert!(output.status.success(), "nm {} failed", elf.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [address, size, kind, name] = fields[..] else {
                return None;
            };
            if !matches!(kind, "T" | "t") {
                return None;
            }
            let start = u64::from_str_radix(address, 16).ok()?;
            let size = u64::from_str_radix(size, 16).ok()?;
            Some(Function {
                name: name.to_string(),
                start,
                end: start + size,
            })
        })
        .collect()
}

/// The function `name` of `elf`.
pub fn function(elf: &Path, name: &str) -> Function {
    functions(elf)
        .into_iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no function {name} in {}", elf.display()))
}

/// Every load instance in `profile` of the module with file name `name`, in load order.
pub fn instances<'a>(profile: &'a Profile, name: &str) -> Vec<&'a Module> {
    let mut found: Vec<&Module> = profile
        .modules
        .iter()
        .filter(|m| m.name == name.as_bytes())
        .collect();
    found.sort_by_key(|m| m.load_order);
    found
}

/// Calls into `callee` recorded in one load instance (arcs whose callee address lies in the function).
pub fn calls_into(module: &Module, callee: &Function) -> u64 {
    module
        .arcs
        .iter()
        .filter(|arc| callee.start <= arc.callee_address.0 && arc.callee_address.0 < callee.end)
        .map(|arc| arc.count)
        .sum()
}

/// Calls into `callee` summed over all load instances of the module named `name`.
pub fn calls_over_instances(profile: &Profile, name: &str, callee: &Function) -> u64 {
    instances(profile, name)
        .iter()
        .map(|m| calls_into(m, callee))
        .sum()
}

/// Whether a module carries the UNLOADED flag.
pub fn is_unloaded(module: &Module) -> bool {
    module.flags & module_flags::UNLOADED != 0
}

/// Names of the profile files (`gmon.out*`) in the workspace, sorted.
pub fn profile_files(workspace: &Workspace) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(workspace.path())
        .expect("workspace directory")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("gmon.out"))
        .collect();
    names.sort();
    names
}
