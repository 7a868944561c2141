//! Typed errors of the profile readers: what is wrong and at which byte offset it was found.

/// What is wrong with a profile file. Each variant names the problem; [`ReadError`] adds where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Not an mslprof, GNU or BSD profile.
    #[error("bad magic: not an mslprof, GNU gmon.out or BSD gmon.out profile")]
    BadMagic,
    /// The mslprof byte-order mark is neither `0x0A0B0C0D` in big- nor in little-endian order.
    #[error("bad byte-order mark")]
    BadByteOrderMark,
    /// An mslprof file of another major version, or a GNU gmon.out of a version other than 0 or 1.
    #[error("unsupported major version {0}")]
    UnsupportedVersion(u32),
    /// A field, record or section runs past the end of the file (or of its enclosing record).
    #[error("truncated {0}")]
    Truncated(&'static str),
    /// A section this reader does not know, marked critical.
    #[error("unknown critical section (tag {0})")]
    UnknownCriticalSection(u32),
    /// A required section is absent (or FILE_HEADER is not first).
    #[error("missing {0} section")]
    MissingSection(&'static str),
    /// A required section appears twice.
    #[error("duplicate {0} section")]
    DuplicateSection(&'static str),
    /// A count or size above the limits of SPEC.md §8.
    #[error("limit exceeded: {0}")]
    LimitExceeded(&'static str),
    /// A field holds a value the format does not allow.
    #[error("bad value: {0}")]
    BadValue(&'static str),
    /// An offset/size pair points outside the DATA payload.
    #[error("offset out of range: {0}")]
    OffsetOutOfRange(&'static str),
    /// Two data ranges (or two GNU histogram records) overlap.
    #[error("overlapping data: {0}")]
    OverlappingData(&'static str),
    /// An arc's caller key is neither reserved nor in the KEY_TABLE.
    #[error("unknown key {0:#x}")]
    UnknownKey(u32),
    /// A key appears twice in the KEY_TABLE or in MODULE_HEADERS.
    #[error("duplicate key {0:#x}")]
    DuplicateKey(u32),
    /// Two fields that must agree do not (a count and a size, or a count and its table).
    #[error("count mismatch: {0}")]
    CountMismatch(&'static str),
    /// A GNU gmon.out record tag other than 0, 1 or 2.
    #[error("unknown GNU gmon.out record tag {0}")]
    UnknownRecordTag(u8),
    /// GNU histogram records that GNU gprof refuses to combine (dimension or scale changed).
    #[error("incompatible histogram records: {0}")]
    IncompatibleHistograms(&'static str),
    /// The [`crate::GnuTarget`] given by the caller is not usable (address size not 4 or 8).
    #[error("unsupported target: {0}")]
    UnsupportedTarget(&'static str),
}

/// A read failure: the problem and the byte offset (from the start of the file) where it was detected.
///
/// Displays as `<problem> at offset 0x<hex>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at offset {offset:#x}")]
pub struct ReadError {
    pub kind: ErrorKind,
    pub offset: u64,
}

impl ReadError {
    pub fn new(kind: ErrorKind, offset: u64) -> Self {
        ReadError { kind, offset }
    }
}
