//! Binaries that moved: `--binary-path DIR` and `MSLPROF_BINARY_PATH` (colon-separated), as perf's
//! `--symfs` and pprof's `PPROF_BINARY_PATH`. When a module's recorded file is missing or its GNU build-id is
//! not the profiled one, each folder is searched: by build-id first (`DIR/.build-id/xx/rest`, with or without
//! `.debug`, then every file directly in DIR), then by file name (`DIR/NAME`).

use std::path::{Path, PathBuf};

/// The environment variable that adds folders after those of `--binary-path`.
pub const VARIABLE: &str = "MSLPROF_BINARY_PATH";

/// The folders of `MSLPROF_BINARY_PATH`, in order (none when unset).
pub fn from_environment() -> Vec<PathBuf> {
    std::env::var_os(VARIABLE)
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The GNU build-id of the ELF file at `path` (`None` when it cannot be read or has none).
pub fn build_id(path: &Path) -> Option<Vec<u8>> {
    let data = crate::sys::map_file(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    crate::elf::symbols::build_id_of(&file)
}

/// The file to read for a module recorded at `recorded` with build-id `wanted` (empty when the profile has
/// none): `recorded` itself when it exists with that build-id (or when no folder is given); else the first
/// match in `folders`, by build-id and then by file name; else `recorded`, for the caller's warnings.
pub fn locate(recorded: &Path, wanted: &[u8], folders: &[PathBuf]) -> PathBuf {
    if folders.is_empty() {
        return recorded.to_path_buf();
    }
    let matches = |p: &Path| wanted.is_empty() || build_id(p).as_deref() == Some(wanted);
    if recorded.is_file() && matches(recorded) {
        return recorded.to_path_buf();
    }
    if wanted.len() > 1 {
        let hex = crate::elf::symbols::hex;
        let (head, rest) = (hex(&wanted[..1]), hex(&wanted[1..]));
        for folder in folders {
            let cached = folder.join(".build-id").join(&head);
            for candidate in [cached.join(&rest), cached.join(format!("{rest}.debug"))] {
                if candidate.is_file() && matches(&candidate) {
                    return candidate;
                }
            }
            let found = std::fs::read_dir(folder).ok().and_then(|entries| {
                let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                files.sort();
                files.into_iter().find(|p| p.is_file() && matches(p))
            });
            if let Some(found) = found {
                return found;
            }
        }
    }
    if let Some(name) = recorded.file_name() {
        for folder in folders {
            let candidate = folder.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    recorded.to_path_buf()
}
