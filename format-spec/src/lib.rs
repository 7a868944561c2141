//! Writer and reader of the mslprof profile format (see SPEC.md), and of GNU/BSD gmon.out.
//!
//! - [`read`] reads any of the three formats into a [`Profile`]; [`detect`] only tells which one a file is.
//! - [`write()`] writes a [`Profile`] as an mslprof file; [`stream`] is the allocation-free encoder under it that
//!   the runtime uses directly.
//! - [`write_gnu`] writes a single-module profile as a GNU gmon.out for GNU gprof.
//! - [`naming`] is the rule that names the runtime's output files (`GPROFDIR`, `GMON_OUT_PREFIX`, `gmon.out`).

pub mod address;
mod bsd;
mod decode;
pub mod error;
mod gnu;
mod layout;
pub mod model;
mod mslprof;
pub mod naming;
pub mod stream;
mod write;

use std::io;

pub use address::{LinkAddress, LoadBias, RuntimeAddress};
pub use bsd::BsdLayout;
pub use error::{ErrorKind, ReadError};
pub use gnu::RecordCounts;
pub use model::*;

/// Byte order and address width of GNU/BSD gmon.out input: those of the ELF file the profile belongs to.
/// Unused for mslprof files, which carry their own byte-order mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GnuTarget {
    pub big_endian: bool,
    /// 4 or 8.
    pub address_size: u8,
}

impl Default for GnuTarget {
    /// Little-endian, 8-byte addresses (x86_64, aarch64).
    fn default() -> Self {
        GnuTarget {
            big_endian: false,
            address_size: 8,
        }
    }
}

/// The three on-disk formats [`read`] understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    Mslprof,
    Gnu,
    /// Old 4.2BSD or 4.4BSD gmon.out. It has no magic: a file that is neither of the others is taken as BSD, as
    /// GNU gprof does.
    Bsd,
}

/// Which format `bytes` is in: mslprof by its magic (or a prefix of it, for a file cut short), GNU by `gmon`,
/// else BSD if at least 16 bytes long (the smallest BSD header that gprof can read); `None` otherwise.
pub fn detect(bytes: &[u8]) -> Option<FileFormat> {
    let n = bytes.len().min(layout::MAGIC.len());
    if n > 0 && bytes[..n] == layout::MAGIC[..n] {
        Some(FileFormat::Mslprof)
    } else if bytes.starts_with(&gnu::GMON_MAGIC) {
        Some(FileFormat::Gnu)
    } else if bytes.len() >= 16 {
        Some(FileFormat::Bsd)
    } else {
        None
    }
}

fn check_target(target: GnuTarget) -> Result<(), ReadError> {
    if target.address_size == 4 || target.address_size == 8 {
        Ok(())
    } else {
        Err(ReadError::new(
            ErrorKind::UnsupportedTarget("address size must be 4 or 8"),
            0,
        ))
    }
}

/// Reads a profile in any supported format. `target` describes GNU/BSD input (see [`GnuTarget`]).
///
/// Never panics, allocates no more than the file's size justifies, and always terminates. Arcs of an mslprof
/// file come back sorted by (caller key, caller address, callee address) with duplicates added up and padding
/// records (count 0) dropped, and its stacks normalised likewise ([`Stacks::normalize`]). Arcs of a GNU or BSD
/// file keep the file's order and duplicates, as gprof sees them (its call-graph order and tie-breaks depend on
/// that order).
pub fn read(bytes: &[u8], target: GnuTarget) -> Result<Profile, ReadError> {
    read_releasing(bytes, target, &mut |_| {})
}

/// Like [`read`], calling `release(n)` now and then while it decodes a GNU gmon.out histogram, with the number
/// of leading bytes of `bytes` it will not look at again. A caller reading from a file mapping can let those
/// pages go, so that a large histogram does not sit in memory twice (once mapped, once decoded).
pub fn read_releasing(
    bytes: &[u8],
    target: GnuTarget,
    release: &mut dyn FnMut(usize),
) -> Result<Profile, ReadError> {
    read_as(bytes, target, InputFormat::Auto, release)
}

/// The layout GNU/BSD input is read in: gprof's `--file-format` (`auto`, `magic`, `bsd`, `4.4bsd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InputFormat {
    /// By the file's magic (see [`detect`]).
    #[default]
    Auto,
    /// GNU gmon.out only: anything without the `gmon` magic is refused as [`ErrorKind::BadMagic`].
    Magic,
    /// BSD gmon.out (either header), even when the file starts with `gmon`.
    Bsd,
    /// 4.4BSD gmon.out only: an old 4.2BSD header is refused as [`ErrorKind::BadMagic`].
    Bsd44,
}

/// Like [`read_releasing`], reading GNU/BSD input in the layout `format` names (mslprof files, told by their
/// magic, are read as such whatever `format` says; the caller decides whether that combination makes sense).
pub fn read_as(
    bytes: &[u8],
    target: GnuTarget,
    format: InputFormat,
    release: &mut dyn FnMut(usize),
) -> Result<Profile, ReadError> {
    let detected = detect(bytes);
    if detected != Some(FileFormat::Mslprof) {
        match format {
            InputFormat::Auto => {}
            InputFormat::Magic if detected == Some(FileFormat::Gnu) => {}
            InputFormat::Magic if bytes.len() < 20 => {
                return Err(ReadError::new(
                    ErrorKind::Truncated("GNU gmon.out header"),
                    bytes.len() as u64,
                ));
            }
            InputFormat::Magic => return Err(ReadError::new(ErrorKind::BadMagic, 0)),
            InputFormat::Bsd | InputFormat::Bsd44 => {
                check_target(target)?;
                return bsd::read(bytes, target, format == InputFormat::Bsd44).map(|(p, _)| p);
            }
        }
    }
    match detected {
        Some(FileFormat::Mslprof) => mslprof::read(bytes),
        Some(FileFormat::Gnu) => {
            check_target(target)?;
            gnu::read(bytes, target, release).map(|(p, _)| p)
        }
        Some(FileFormat::Bsd) => {
            check_target(target)?;
            bsd::read(bytes, target, false).map(|(p, _)| p)
        }
        None if bytes.is_empty() => Err(ReadError::new(ErrorKind::Truncated("profile"), 0)),
        None => Err(ReadError::new(ErrorKind::BadMagic, 0)),
    }
}

/// For a GNU or BSD gmon.out: how many records of each kind it holds, as `gprof -i` reports them.
/// `None` for an mslprof file.
pub fn record_counts(bytes: &[u8], target: GnuTarget) -> Result<Option<RecordCounts>, ReadError> {
    record_counts_as(bytes, target, InputFormat::Auto)
}

/// Like [`record_counts`], reading GNU/BSD input in the layout `format` names (see [`read_as`]).
pub fn record_counts_as(
    bytes: &[u8],
    target: GnuTarget,
    format: InputFormat,
) -> Result<Option<RecordCounts>, ReadError> {
    if detect(bytes) != Some(FileFormat::Mslprof) {
        match format {
            InputFormat::Bsd | InputFormat::Bsd44 => {
                check_target(target)?;
                return bsd::read(bytes, target, format == InputFormat::Bsd44)
                    .map(|(_, c)| Some(c));
            }
            InputFormat::Magic if detect(bytes) != Some(FileFormat::Gnu) => {
                return read_as(bytes, target, format, &mut |_| {}).map(|_| None);
            }
            _ => {}
        }
    }
    match detect(bytes) {
        Some(FileFormat::Mslprof) => Ok(None),
        Some(FileFormat::Gnu) => {
            check_target(target)?;
            gnu::read(bytes, target, &mut |_| {}).map(|(_, c)| Some(c))
        }
        Some(FileFormat::Bsd) => {
            check_target(target)?;
            bsd::read(bytes, target, false).map(|(_, c)| Some(c))
        }
        None => read(bytes, target).map(|_| None),
    }
}

/// Writes `profile` as an mslprof file in the machine's byte order.
///
/// Each module's histogram is written dense or sparse, whichever is smaller (dense on a tie). Arcs are written
/// sorted, with duplicates added up and zero counts left out, and stacks (a STACKS section when
/// `profile.stacks` is `Some`) likewise ([`Stacks::normalize`]); basic-block counts (GNU input only) have no
/// place in the format and are not written. A profile that breaks a rule of SPEC.md (duplicate keys, an arc or
/// stack frame from an unknown key, a 16-bit histogram holding a count above 65535, ranges inconsistent with
/// their buckets, strings or stack depths over the limits) is refused with [`io::ErrorKind::InvalidInput`]
/// before anything is written. For every profile it accepts, [`read`] gives back an equal profile up to that
/// normalisation of arcs and stacks.
pub fn write(profile: &Profile, w: impl io::Write) -> io::Result<()> {
    write::write(profile, WriteOptions::default(), w)
}

/// Choices [`write_with`] leaves open to its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Byte order of the file (readers accept both). Default: the machine's.
    pub big_endian: bool,
    /// Histogram encoding. Default: [`stream::Encoding::Auto`], the smaller of dense and sparse.
    pub encoding: stream::Encoding,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            big_endian: cfg!(target_endian = "big"),
            encoding: stream::Encoding::Auto,
        }
    }
}

/// Like [`write()`], with an explicit byte order and histogram encoding (for tests and conversion tools).
pub fn write_with(profile: &Profile, options: WriteOptions, w: impl io::Write) -> io::Result<()> {
    write::write(profile, options, w)
}

/// Writes a profile with exactly one module as a GNU gmon.out (version 1) that GNU gprof 2.40 reads.
///
/// Addresses are written as they are (link-time addresses of that module). A histogram bucket above 65535 is
/// spread over several histogram records of the same range, and an arc count above 2^32−1 over several arc
/// records: gprof adds them up. Arcs whose caller is another module or unknown are written with caller address
/// 0 (gprof shows them as spontaneous). `hz` is the header's `hz` (or 1e9 / `sample_period_ns` if `hz` is 0).
pub fn write_gnu(profile: &Profile, target: GnuTarget, w: impl io::Write) -> io::Result<()> {
    gnu::write(profile, target, w)
}

/// Writes a profile with exactly one module and at most one histogram range as a BSD gmon.out in `layout`
/// (what gprof 2.40 writes for `-s --file-format=bsd|4.4bsd`; see SPEC.md §"BSD gmon.out"). Samples are
/// 16-bit (a larger count keeps its low 16 bits); arc fields are of the target's address width; the 4.4BSD
/// layout carries `header.hz`.
pub fn write_bsd(
    profile: &Profile,
    target: GnuTarget,
    layout: BsdLayout,
    w: impl io::Write,
) -> io::Result<()> {
    bsd::write(profile, target, layout, w)
}
