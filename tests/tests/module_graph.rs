//! The architecture's rules, checked on the sources: inside each crate the modules depend on each other
//! without cycles (a `crate::x` path in module `y` is an edge y → x), `sys` modules call into no other
//! module, and every `#[no_mangle]` export of a crate lives in its one exports file (the runtime's mcount
//! family excepted: its stubs are assembly next to the Rust they call, and exports.rs lists them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without `//` comments (so doc links and prose are not edges).
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Top-level module of a file under `src`: `a.rs` and `a/…` are module `a`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// The modules that `code` names through `crate::` paths, including `crate::{a, b::c}` groups.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.insert(name);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// Module → modules it uses, for the files of one crate root (`roots`: the files that declare the modules
/// of one compilation unit; other roots' modules are left out).
fn graph(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(src, &file);
        if !modules.contains(&module) {
            continue;
        }
        let used = crate_paths(&code_of(&file));
        let entry = edges.entry(module.clone()).or_default();
        entry.extend(
            used.into_iter()
                .filter(|m| *m != module && modules.contains(m)),
        );
    }
    edges
}

/// The `mod` items of a crate root file.
fn declared_modules(root: &Path) -> BTreeSet<String> {
    code_of(root)
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("pub ").unwrap_or(line);
            let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
            let name = line.strip_prefix("mod ")?;
            name.strip_suffix(';').map(str::to_string)
        })
        .collect()
}

/// One cycle of the graph, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let start = path.iter().position(|n| n == next).expect("on path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(cycle) = visit(next, edges, state, path) {
                        return Some(cycle);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys() {
        if state.get(node).copied().unwrap_or(0) == 0
            && let Some(cycle) = visit(node, edges, &mut state, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

/// (crate folder, the folder of a compilation unit's root file in it, that root file): the root declares the
/// unit's modules, which live in its folder (the analyzer's binary keeps its command line in `src/cli`).
const UNITS: &[(&str, &str, &str)] = &[
    ("runtime", "src", "lib.rs"),
    ("loader-hooks", "src", "lib.rs"),
    ("format-spec", "src", "lib.rs"),
    ("analyzer", "src", "lib.rs"),
    ("analyzer", "src/cli", "main.rs"),
];

#[test]
fn modules_inside_each_crate_depend_on_each_other_without_cycles() {
    let root = workspace();
    for (krate, folder, unit_root) in UNITS {
        let src = root.join(krate).join(folder);
        let modules = declared_modules(&src.join(unit_root));
        assert!(modules.len() > 3, "{krate}/{unit_root}: {modules:?}");
        let edges = graph(&src, &modules);
        assert!(
            find_cycle(&edges).is_none(),
            "{krate}/{folder}/{unit_root}: module cycle {:?}",
            find_cycle(&edges)
        );
        if let Some(sys) = edges.get("sys") {
            assert!(
                sys.is_empty(),
                "{krate}: sys must be a leaf (a syscall layer), but uses {sys:?}"
            );
        }
    }
}

#[test]
fn each_crate_lists_its_exports_in_one_file() {
    let root = workspace();
    for krate in ["runtime", "loader-hooks"] {
        let src = root.join(krate).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for file in files {
            let rel = file.strip_prefix(&src).expect("under src").to_path_buf();
            let allowed = rel == Path::new("exports.rs") || rel.starts_with("mcount");
            if !allowed {
                assert!(
                    !code_of(&file).contains("no_mangle"),
                    "{krate}/src/{}: #[no_mangle] outside exports.rs",
                    rel.display()
                );
            }
        }
    }
}

#[test]
fn the_checker_finds_a_cycle_and_group_paths() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    let cycle = find_cycle(&edges).expect("cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    let names = crate_paths("use crate::{x, y::z};\nlet q = crate::w::f();");
    assert_eq!(
        names,
        ["w", "x", "y"].into_iter().map(String::from).collect()
    );
}
