//! Plain refusals of input that is neither a profile nor an ELF file, before any layout is tried on it:
//! a text file read as a profile is "not a profile", not a BSD layout error; an executable argument that is
//! not ELF is not silently replaced by the recorded program.

use std::path::Path;

use crate::report::Failure;

fn refuse(path: &Path, problem: &str) -> Failure {
    Failure {
        file: path.display().to_string(),
        problem: problem.into(),
    }
}

/// Whether `bytes` read as text: no NUL, and printable ASCII, UTF-8 or whitespace throughout the start.
fn looks_like_text(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(4096)];
    !head.is_empty()
        && !head.contains(&0)
        && head
            .iter()
            .all(|&b| b >= 0x20 || matches!(b, b'\n' | b'\r' | b'\t' | 0x0c))
}

/// Refuse a profile file that is text (profiles are binary in every format mslprof reads).
pub fn check_profile(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    if looks_like_text(bytes) {
        return Err(refuse(
            path,
            "not a profile (it is a text file; a profile is the gmon.out a profiled program writes)",
        ));
    }
    Ok(())
}

/// Refuse an executable argument that is a folder or not an ELF file (for mslprof profiles, whose modules
/// are otherwise found from the paths recorded in them, so a wrong argument would go unnoticed).
pub fn check_executable(path: &Path) -> Result<(), Failure> {
    use std::io::Read;
    if path.is_dir() {
        return Err(refuse(path, "is a folder, not an ELF file or a profile"));
    }
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|e| refuse(path, &e.to_string()))?;
    if file.read_exact(&mut magic).is_err() || &magic != b"\x7fELF" {
        return Err(refuse(path, "not an ELF file or a profile"));
    }
    Ok(())
}
