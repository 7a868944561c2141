//! Profiles a process's descendants left beside its own: `gmon.out.<pid>` and `gmon.out.<pid>.pre-exec`
//! next to `gmon.out` (the names the runtime gives them). When a wrapper (a shell, `timeout`) was the root
//! process, its `gmon.out` holds little and the real program's data is in these.

use std::path::{Path, PathBuf};

/// Whether `name` is `<base>.<digits>` or `<base>.<digits>.pre-exec`.
fn is_descendant_name(base: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(base).and_then(|r| r.strip_prefix('.')) else {
        return false;
    };
    let pid = rest.strip_suffix(".pre-exec").unwrap_or(rest);
    !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())
}

/// The descendants' profiles beside `profile`, sorted by name.
pub fn descendants_of(profile: &Path) -> Vec<PathBuf> {
    let Some(base) = profile.file_name().and_then(|n| n.to_str()) else {
        return Vec::new();
    };
    let dir = match profile.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| is_descendant_name(base, &e.file_name().to_string_lossy()))
        .map(|e| dir.join(e.file_name()))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::is_descendant_name;

    #[test]
    fn descendant_names() {
        assert!(is_descendant_name("gmon.out", "gmon.out.123"));
        assert!(is_descendant_name("gmon.out", "gmon.out.123.pre-exec"));
        assert!(!is_descendant_name("gmon.out", "gmon.out"));
        assert!(!is_descendant_name("gmon.out", "gmon.out.sum"));
        assert!(!is_descendant_name("gmon.out", "gmon.out.parts"));
    }
}
