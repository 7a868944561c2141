//! Which modules LD_PROFILE selects (HP-UX MSLP paper §2.2.6, issue 3).
//!
//! `LD_PROFILE` is a colon-separated list of module *names*, not paths. A name selects a module when it equals
//! the module's file name, its file name without the version suffix after `.so` (`libc.so` selects
//! `libc.so.6`), or its `DT_SONAME`; `a.out` selects the main program. `ALL`, an unset `LD_PROFILE`, or one
//! that holds no non-empty entry select every module. Each name remembers whether it matched, so the names
//! that matched nothing can be reported once at exit.

use std::sync::atomic::{AtomicBool, Ordering};

use mslprof_loader_hooks::ModuleInfo;

/// The parsed `LD_PROFILE`.
#[derive(Debug)]
pub enum Selection {
    /// Every module is profiled.
    All,
    /// Only modules matching one of these names.
    Names(Vec<SelectedName>),
}

/// One `LD_PROFILE` entry and whether any module has matched it yet.
#[derive(Debug)]
pub struct SelectedName {
    pub name: Vec<u8>,
    matched: AtomicBool,
}

impl Selection {
    /// Parses the value of `LD_PROFILE` (`None` when it is unset).
    pub fn parse(value: Option<&[u8]>) -> Selection {
        let Some(value) = value else {
            return Selection::All;
        };
        let names: Vec<&[u8]> = value
            .split(|&b| b == b':')
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() || names.contains(&&b"ALL"[..]) {
            return Selection::All;
        }
        let mut unique: Vec<SelectedName> = Vec::new();
        for name in names {
            if !unique.iter().any(|u| u.name == name) {
                unique.push(SelectedName {
                    name: name.to_vec(),
                    matched: AtomicBool::new(false),
                });
            }
        }
        Selection::Names(unique)
    }

    /// Whether `module` is selected; records which names matched it.
    pub fn selects(&self, module: &ModuleInfo) -> bool {
        match self {
            Selection::All => true,
            Selection::Names(names) => {
                let mut selected = false;
                for entry in names {
                    if name_matches(&entry.name, module) {
                        entry.matched.store(true, Ordering::Relaxed);
                        selected = true;
                    }
                }
                selected
            }
        }
    }

    /// The names that have matched no module so far.
    pub fn unmatched(&self) -> impl Iterator<Item = &[u8]> {
        let names: &[SelectedName] = match self {
            Selection::All => &[],
            Selection::Names(names) => names,
        };
        names
            .iter()
            .filter(|n| !n.matched.load(Ordering::Relaxed))
            .map(|n| n.name.as_slice())
    }
}

/// The LD_PROFILE name rules for one name and one module.
pub fn name_matches(name: &[u8], module: &ModuleInfo) -> bool {
    if name == b"a.out" {
        return module.is_main;
    }
    name == module.file_name.as_slice()
        || name == without_version_suffix(&module.file_name)
        || (!module.soname.is_empty() && name == module.soname.as_slice())
}

/// `libfoo.so.1.2.3` → `libfoo.so`; names without a numeric suffix after `.so` are returned unchanged.
pub fn without_version_suffix(file_name: &[u8]) -> &[u8] {
    let mut search_from = 0;
    while let Some(pos) = find(&file_name[search_from..], b".so.") {
        let so_end = search_from + pos + 3;
        let suffix = &file_name[so_end + 1..];
        if !suffix.is_empty() && suffix.iter().all(|&b| b.is_ascii_digit() || b == b'.') {
            return &file_name[..so_end];
        }
        search_from = so_end;
    }
    file_name
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(file_name: &str, soname: &str, is_main: bool) -> ModuleInfo {
        ModuleInfo {
            path: format!("/some/dir/{file_name}").into_bytes(),
            file_name: file_name.as_bytes().to_vec(),
            soname: soname.as_bytes().to_vec(),
            is_main,
            ..ModuleInfo::default()
        }
    }

    #[test]
    fn version_suffix_is_removed_only_when_numeric() {
        assert_eq!(without_version_suffix(b"libc.so.6"), b"libc.so");
        assert_eq!(without_version_suffix(b"libfoo.so.1.2.3"), b"libfoo.so");
        assert_eq!(without_version_suffix(b"libfoo.so"), b"libfoo.so");
        assert_eq!(without_version_suffix(b"libfoo.so.x"), b"libfoo.so.x");
        assert_eq!(without_version_suffix(b"libx.so.so.3"), b"libx.so.so");
        assert_eq!(without_version_suffix(b"app"), b"app");
    }

    #[test]
    fn names_match_file_name_unversioned_name_soname_and_a_out() {
        let libc = module("libc.so.6", "libc.so.6", false);
        let foo = module("libfoo.so.1.2.3", "libfoo.so.1", false);
        let app = module("myapp", "", true);
        assert!(name_matches(b"libc.so", &libc));
        assert!(name_matches(b"libc.so.6", &libc));
        assert!(!name_matches(b"libc", &libc));
        assert!(!name_matches(b"/lib/libc.so.6", &libc));
        assert!(name_matches(b"libfoo.so", &foo));
        assert!(name_matches(b"libfoo.so.1", &foo));
        assert!(name_matches(b"libfoo.so.1.2.3", &foo));
        assert!(!name_matches(b"libfoo.so.1.2", &foo));
        assert!(name_matches(b"a.out", &app));
        assert!(name_matches(b"myapp", &app));
        assert!(!name_matches(b"a.out", &libc));
    }

    #[test]
    fn all_unset_and_empty_lists_select_everything() {
        let libc = module("libc.so.6", "libc.so.6", false);
        for value in [
            None,
            Some(&b"ALL"[..]),
            Some(b"libx.so:ALL"),
            Some(b""),
            Some(b"::"),
        ] {
            assert!(
                matches!(Selection::parse(value), Selection::All),
                "{value:?}"
            );
            assert!(Selection::parse(value).selects(&libc));
        }
    }

    #[test]
    fn unmatched_names_are_reported_and_empty_entries_ignored() {
        let selection = Selection::parse(Some(b":a.out::libc.so:libnothere.so:"));
        assert!(selection.selects(&module("app", "", true)));
        assert!(selection.selects(&module("libc.so.6", "libc.so.6", false)));
        assert!(!selection.selects(&module("libm.so.6", "libm.so.6", false)));
        let unmatched: Vec<&[u8]> = selection.unmatched().collect();
        assert_eq!(unmatched, vec![&b"libnothere.so"[..]]);
    }
}
