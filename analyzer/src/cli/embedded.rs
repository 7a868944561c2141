//! The runtime and the PLT-counting audit module embedded in release builds of `mslprof` (see `build.rs`),
//! written out when no `libmslprof.so` is found on disk, so that an installed binary runs programs (and counts
//! their calls through the PLT) with nothing else installed.
//!
//! They go to `$TMPDIR/mslprof-<uid>/<hash>/` (`libmslprof.so` and, beside it where `mslprof run` looks for
//! it, `libmslprof_audit.so`): a folder of the user's own (mode 0700, checked
//! to be a real folder owned by the user), named by a hash of the bytes so that every run of one build
//! reuses one pair of files and different builds never mix. A file rather than a `memfd`: descendants that outlive
//! `mslprof` can still load it, and the profile records a path that later reports can read.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

const RUNTIME: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmslprof.so"));
const AUDIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libmslprof_audit.so"));

/// The embedded runtime written to the user's private folder; `None` when nothing is embedded.
pub fn runtime_file() -> Option<Result<PathBuf, String>> {
    if RUNTIME.is_empty() {
        return None;
    }
    Some(write_out())
}

fn write_out() -> Result<PathBuf, String> {
    let uid = mslprof_analyzer::sys::user_id();
    let base = std::env::temp_dir().join(format!("mslprof-{uid}"));
    let mut hasher = std::hash::DefaultHasher::new();
    RUNTIME.hash(&mut hasher);
    AUDIT.hash(&mut hasher);
    let dir = base.join(format!("{:016x}", hasher.finish()));
    let err = |what: &std::path::Path, e: std::io::Error| format!("{}: {e}", what.display());
    for d in [&base, &dir] {
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(d, e)),
        }
        let meta = std::fs::symlink_metadata(d).map_err(|e| err(d, e))?;
        if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
            return Err(format!(
                "{}: not a private folder of this user; the embedded runtime is not written there",
                d.display()
            ));
        }
    }
    // The audit module first: once the runtime is there, it is looked for beside it.
    if !AUDIT.is_empty() {
        write_file(&dir, "libmslprof_audit.so", AUDIT)?;
    }
    write_file(&dir, "libmslprof.so", RUNTIME)
}

/// Writes `bytes` to `dir/name` unless that file holds them already (through a temporary file renamed into
/// place, so a concurrent run never loads a half-written library).
fn write_file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> Result<PathBuf, String> {
    let err = |what: &std::path::Path, e: std::io::Error| format!("{}: {e}", what.display());
    let file = dir.join(name);
    // Mapped and compared in place, the length first: most runs find the library written already.
    if mslprof_analyzer::sys::map_file(&file).is_ok_and(|b| b.len() == bytes.len() && *b == *bytes)
    {
        return Ok(file);
    }
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| err(dir, e))?;
    tmp.write_all(bytes).map_err(|e| err(tmp.path(), e))?;
    tmp.persist(&file).map_err(|e| err(&file, e.error))?;
    Ok(file)
}
