//! Bounds-checked, byte-order-aware decoding of fixed-width fields, shared by every reader.
//!
//! A [`Decoder`] walks a window `[pos, end)` of the whole file, so every error carries the absolute file offset
//! of the field that could not be read.

use crate::error::{ErrorKind, ReadError};

/// A cursor over `bytes[pos..end]`, where `bytes` is the whole file.
#[derive(Clone)]
pub(crate) struct Decoder<'a> {
    bytes: &'a [u8],
    pos: usize,
    end: usize,
    pub big_endian: bool,
}

impl<'a> Decoder<'a> {
    /// A decoder over `file[start..end]`; `start`/`end` are clamped to the file.
    pub fn new(file: &'a [u8], start: usize, end: usize, big_endian: bool) -> Self {
        let end = end.min(file.len());
        Decoder {
            bytes: file,
            pos: start.min(end),
            end,
            big_endian,
        }
    }

    /// Absolute offset of the next byte.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Absolute offset of the next byte, as reported in errors.
    pub fn offset(&self) -> u64 {
        self.pos as u64
    }

    pub fn remaining(&self) -> usize {
        self.end - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    /// An error of `kind` at the current position.
    pub fn error(&self, kind: ErrorKind) -> ReadError {
        ReadError::new(kind, self.offset())
    }

    /// The next `n` bytes, or `Truncated(what)` at the current position.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ReadError> {
        if n > self.remaining() {
            return Err(self.error(ErrorKind::Truncated(what)));
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.bytes[start..self.pos])
    }

    /// Skips `n` bytes (or fails like [`Decoder::take`]).
    pub fn skip(&mut self, n: usize, what: &'static str) -> Result<(), ReadError> {
        self.take(n, what).map(|_| ())
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ReadError> {
        let slice = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, ReadError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, ReadError> {
        let a = self.array(what)?;
        Ok(if self.big_endian {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        })
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, ReadError> {
        let a = self.array(what)?;
        Ok(if self.big_endian {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, ReadError> {
        let a = self.array(what)?;
        Ok(if self.big_endian {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        })
    }

    pub fn i64(&mut self, what: &'static str) -> Result<i64, ReadError> {
        let a = self.array(what)?;
        Ok(if self.big_endian {
            i64::from_be_bytes(a)
        } else {
            i64::from_le_bytes(a)
        })
    }

    /// An address of `size` bytes (4 or 8), zero-extended.
    pub fn address(&mut self, size: u8, what: &'static str) -> Result<u64, ReadError> {
        if size == 4 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }
}

/// Converts a file-derived `u64` to `usize`, treating values that do not fit as past the end of the file.
pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}
