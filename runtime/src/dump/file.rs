//! The one temporary-file-then-rename step of every dump, without the heap (it also runs in fatal-signal
//! handlers).
//!
//! The profile is written to a new file in the destination's directory (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode
//! 0644 minus the umask), named `.<file name>.<pid>.<attempt>.tmp`, and renamed over the destination, so
//! readers never see a partial file and a symlink planted at the destination is replaced, never followed.

use mslprof_format::stream::Sink;

use crate::sys;

/// Longest path (with its NUL) a dump writes to.
pub const PATH_BYTES: usize = 4096;

/// A sink writing straight to a file descriptor (the stream encoder buffers 1 KiB on its own).
pub struct FdSink(pub i32);

impl Sink for FdSink {
    type Error = i32;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), i32> {
        sys::write_all(self.0, bytes)
    }
}

/// Writes the temporary name for `path` (no NUL) and `attempt` into `out`, NUL-terminated; returns its length
/// without the NUL, or `None` when it does not fit.
pub fn temporary_name(path: &[u8], pid: u32, attempt: u32, out: &mut [u8]) -> Option<usize> {
    let split = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    let (directory, base) = path.split_at(split);
    let base: &[u8] = if base.is_empty() { b"gmon.out" } else { base };
    let mut pid_digits = [0u8; 10];
    let mut attempt_digits = [0u8; 10];
    let parts: [&[u8]; 8] = [
        directory,
        b".",
        base,
        b".",
        decimal(u64::from(pid), &mut pid_digits),
        b".",
        decimal(u64::from(attempt), &mut attempt_digits),
        b".tmp",
    ];
    let mut used = 0;
    for part in parts {
        out.get_mut(used..used + part.len())?.copy_from_slice(part);
        used += part.len();
    }
    *out.get_mut(used)? = 0;
    Some(used)
}

/// `value` in decimal, in the tail of `digits`.
pub fn decimal(mut value: u64, digits: &mut [u8]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 || at == 0 {
            break;
        }
    }
    &digits[at..]
}

/// Why a dump file could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileError {
    /// The temporary file could not be created (errno).
    Create(i32),
    /// Writing or renaming failed (errno; 0 when the profile itself was refused).
    Write(i32),
}

impl FileError {
    pub fn errno(self) -> i32 {
        match self {
            FileError::Create(e) | FileError::Write(e) => e,
        }
    }
}

/// Creates the temporary file named by `temporary` (NUL-terminated), lets `fill` write the profile to it, and
/// renames it to `path` (NUL-terminated). On failure the temporary file is removed.
pub fn write_through(
    path: &[u8],
    temporary: &[u8],
    fill: impl FnOnce(&mut FdSink) -> Result<(), i32>,
) -> Result<(), FileError> {
    let fd = sys::create_new_file(temporary).map_err(FileError::Create)?;
    let mut sink = FdSink(fd);
    let written = fill(&mut sink);
    sys::close_file(fd);
    let result = written.and_then(|()| sys::rename_file(temporary, path));
    if result.is_err() {
        sys::remove_file(temporary);
    }
    result.map_err(FileError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(path: &[u8], pid: u32, attempt: u32) -> Option<Vec<u8>> {
        let mut out = [0u8; 64];
        let len = temporary_name(path, pid, attempt, &mut out)?;
        assert_eq!(out[len], 0);
        Some(out[..len].to_vec())
    }

    #[test]
    fn temporary_names_sit_next_to_the_file_and_are_hidden() {
        assert_eq!(name(b"gmon.out", 42, 0).unwrap(), b".gmon.out.42.0.tmp");
        assert_eq!(name(b"d/7.app", 7, 12).unwrap(), b"d/.7.app.7.12.tmp");
        assert_eq!(name(b"/x/", 1, 0).unwrap(), b"/x/.gmon.out.1.0.tmp");
        assert_eq!(name(&[b'a'; 60], 1, 0), None);
        let mut digits = [0u8; 20];
        assert_eq!(decimal(0, &mut digits), b"0");
        assert_eq!(decimal(u64::MAX, &mut digits), b"18446744073709551615");
    }
}
