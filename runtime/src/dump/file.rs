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

/// Bytes a dump buffers before each `write`: a profile of 200 000 arcs is 4 MB, which 1 KiB writes (the
/// stream encoder's own buffer, kept small for alternate signal stacks) would make 6 000 system calls. More
/// than 64 KiB saves few calls, and each further page of the fresh mapping costs a page fault.
const SINK_BUFFER_BYTES: usize = 64 << 10;
/// Bytes the buffer holds before its first `write`; each `write` doubles it, up to [`SINK_BUFFER_BYTES`]. A
/// profile of a few thousand arcs (tens of KiB) then touches half the buffer's pages or fewer, for one or
/// two more calls, and a large one makes two more calls in all.
const FIRST_WRITE_BYTES: usize = 16 << 10;

/// A sink writing to a file descriptor through a buffer in a mapping of its own (not the stack: dumps run
/// on alternate signal stacks), or straight through when that mapping cannot be made. [`FdSink::flush`]
/// writes what is buffered; the mapping goes when the sink is dropped.
pub struct FdSink {
    fd: i32,
    buffer: *mut u8,
    buffered: usize,
    /// Bytes buffered before the next `write` (at most [`SINK_BUFFER_BYTES`]).
    limit: usize,
}

impl FdSink {
    pub fn new(fd: i32) -> FdSink {
        FdSink {
            fd,
            buffer: sys::map_zeroed(SINK_BUFFER_BYTES).unwrap_or(core::ptr::null_mut()),
            buffered: 0,
            limit: FIRST_WRITE_BYTES,
        }
    }

    /// Writes what is buffered.
    pub fn flush(&mut self) -> Result<(), i32> {
        if self.buffered == 0 {
            return Ok(());
        }
        // SAFETY: `buffer` is our live mapping of SINK_BUFFER_BYTES bytes (non-null whenever `buffered`
        // is non-zero), of which the first `buffered` were written.
        let pending = unsafe { core::slice::from_raw_parts(self.buffer, self.buffered) };
        self.buffered = 0;
        self.limit = (self.limit * 2).min(SINK_BUFFER_BYTES);
        sys::write_all(self.fd, pending)
    }
}

impl Sink for FdSink {
    type Error = i32;
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), i32> {
        if self.buffer.is_null() || bytes.len() > self.limit {
            self.flush()?;
            return sys::write_all(self.fd, bytes);
        }
        if self.buffered + bytes.len() > self.limit {
            self.flush()?;
        }
        // SAFETY: `buffered + bytes.len() ≤ limit ≤ SINK_BUFFER_BYTES` (a flush only raises `limit`), inside
        // our live mapping, which `bytes` (borrowed from the encoder) cannot overlap.
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.buffer.add(self.buffered),
                bytes.len(),
            )
        };
        self.buffered += bytes.len();
        Ok(())
    }
}

impl Drop for FdSink {
    fn drop(&mut self) {
        if !self.buffer.is_null() {
            // SAFETY: `buffer` is exactly our mapping of SINK_BUFFER_BYTES bytes, no longer borrowed.
            unsafe { sys::unmap(self.buffer, SINK_BUFFER_BYTES) };
        }
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
    let mut sink = FdSink::new(fd);
    let written = fill(&mut sink).and_then(|()| sink.flush());
    drop(sink);
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

    /// Pieces smaller and larger than the buffer, across its growth, reach the descriptor whole and in order.
    #[test]
    fn the_sink_writes_every_piece_in_order_while_its_buffer_grows() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (writer, mut reader) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        let sizes = [1, 100, 5_000, 16_384, 20_000, 70_000, 3, 65_536, 100_000, 7];
        let pieces: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(index, &size)| (0..size).map(|at| (at * 7 + index) as u8).collect())
            .collect();
        let expected = pieces.concat();
        let reading = std::thread::spawn(move || {
            let mut all = Vec::new();
            reader.read_to_end(&mut all).expect("the bytes written");
            all
        });
        let mut sink = FdSink::new(writer.as_raw_fd());
        for piece in &pieces {
            sink.write_all(piece).expect("a write");
        }
        sink.flush().expect("the last write");
        drop(sink);
        drop(writer);
        assert!(reading.join().expect("the reader") == expected);
    }
}
