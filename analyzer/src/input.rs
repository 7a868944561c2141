//! The analysis's input: the profile files (mapped, checked and decoded) and the typed error that stops a
//! report. Every error names the file it concerns; `mslprof` prints it as `mslprof: FILE: PROBLEM`.

use std::path::{Path, PathBuf};

use mslprof_format::model::Profile;
use mslprof_format::{FileFormat, GnuTarget, InputFormat, ReadError};

use crate::elf::symbols::SymbolError;

/// A failure that stops the report. Its text is `FILE: PROBLEM`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened, mapped, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The format reader refused a profile file.
    #[error("{}: {source}", path.display())]
    Format { path: PathBuf, source: ReadError },
    /// A module's ELF file (or an external symbol table) gave no usable symbols.
    #[error("{}: {source}", path.display())]
    Symbols { path: PathBuf, source: SymbolError },
    /// A file is not what its place on the command line asks for.
    #[error("{}: {refusal}", path.display())]
    Refused { path: PathBuf, refusal: Refusal },
    /// The profile files do not add up (histogram records that cannot be summed).
    #[error("{}: {mismatch}", path.display())]
    Mismatch { path: PathBuf, mismatch: Mismatch },
    /// The output asked for needs data the profile does not have.
    #[error("{}: {missing}", path.display())]
    Missing { path: PathBuf, missing: Missing },
    /// The `-R` map file could not be used.
    #[error("{}: {problem}", path.display())]
    MapFile {
        path: PathBuf,
        problem: crate::elf::filemap::MapError,
    },
    /// The executable's code is not where the GNU profile's samples are.
    #[error(
        "{}: does not belong to {}: its code is not where the profile's samples are",
        exe.display(),
        profile.display()
    )]
    NotItsExecutable { exe: PathBuf, profile: PathBuf },
}

/// Why a file given on the command line is refused before it is analysed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error(
        "not a profile (it is a text file; a profile is the gmon.out a profiled program writes)"
    )]
    TextAsProfile,
    #[error("is a folder, not an ELF file or a profile")]
    FolderAsExecutable,
    #[error("not an ELF file or a profile")]
    NotElf,
    #[error("is empty (0 bytes): not an ELF file or a profile")]
    Empty,
    #[error("--file-format applies to GNU/BSD gmon.out, not to mslprof profiles")]
    FileFormatForMslprof,
    #[error("not an mslprof profile (GNU and mslprof profiles cannot be mixed)")]
    MixedFormats,
    #[error("not an mslprof profile (export reads profiles written by libmslprof.so)")]
    NotMslprofForExport,
    #[error(
        "-R (file ordering) applies to GNU gmon.out input; for mslprof profiles use -r, which orders each module"
    )]
    FileOrderForMslprof,
}

/// Histogram records of the inputs that cannot be summed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    #[error("histogram records for one range differ in size")]
    RangeSizes,
    #[error("overlapping histogram records")]
    Overlap,
    #[error("module {module}: histogram ranges of one file differ in size")]
    ModuleRangeSizes { module: String },
}

/// Output asked for that the profile has no data for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Missing {
    #[error("has no histogram, so there is no flat profile (-p)")]
    Histogram,
    #[error("has no call-graph records, so there is no call graph (-q)")]
    CallGraph,
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// `path` refused for `refusal`.
    pub fn refused(path: impl Into<PathBuf>, refusal: Refusal) -> Error {
        Error::Refused {
            path: path.into(),
            refusal,
        }
    }
}

/// One input profile file.
#[derive(Clone, Debug)]
pub struct Input {
    pub path: PathBuf,
    pub profile: Profile,
    /// How many records of each kind a GNU or BSD file holds (read only for `-i`).
    pub records: Option<mslprof_format::RecordCounts>,
}

/// Whether `bytes` start with the whole mslprof magic (a shorter prefix of it is read as GNU/BSD input and
/// refused by the reader).
pub fn is_mslprof(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && mslprof_format::detect(bytes) == Some(FileFormat::Mslprof)
}

/// Whether the file at `p` is an mslprof profile (false when it cannot be read).
pub fn is_mslprof_file(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && is_mslprof(&magic)
}

/// Byte order and address width of an ELF file (for GNU gmon.out decoding).
pub fn elf_target(path: &Path) -> Option<GnuTarget> {
    use std::io::Read;
    let mut ident = [0u8; 16];
    std::fs::File::open(path)
        .ok()?
        .read_exact(&mut ident)
        .ok()?;
    if &ident[..4] != b"\x7fELF" {
        return None;
    }
    Some(GnuTarget {
        big_endian: ident[5] == 2,
        address_size: if ident[4] == 1 { 4 } else { 8 },
    })
}

// Plain refusals of input that is neither a profile nor an ELF file, before any layout is tried on it: a
// text file read as a profile is "not a profile", not a BSD layout error; an executable argument that is
// not ELF is not silently replaced by the recorded program.

/// Whether `bytes` read as text: no NUL, and printable ASCII, UTF-8 or whitespace throughout the start.
fn looks_like_text(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(4096)];
    !head.is_empty()
        && !head.contains(&0)
        && head
            .iter()
            .all(|&b| b >= 0x20 || matches!(b, b'\n' | b'\r' | b'\t' | 0x0c))
}

/// Refuse a profile file that is empty or text (profiles are binary in every format mslprof reads).
fn check_profile(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    if bytes.is_empty() {
        return Err(Error::refused(path, Refusal::Empty));
    }
    if looks_like_text(bytes) {
        return Err(Error::refused(path, Refusal::TextAsProfile));
    }
    Ok(())
}

/// What the first file of gprof's command line (`[executable [profile-files...]]`) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstFile {
    /// The executable (an ELF file, or any other binary file, as gprof takes it).
    Executable,
    /// A profile with a magic number (mslprof or GNU gmon.out): the list of profiles starts here.
    Profile,
}

/// Judges the first file on the command line by its content, as a user means it: a profile with a magic number
/// starts the profiles, anything else binary is the executable. A file that can be neither (missing, a folder,
/// empty, text) is refused here, by its own name, before any default `gmon.out` is looked for.
pub fn first_file(path: &Path) -> Result<FirstFile, Error> {
    use std::io::Read;
    if path.is_dir() {
        return Err(Error::refused(path, Refusal::FolderAsExecutable));
    }
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)
        .and_then(|f| f.take(4096).read_to_end(&mut head))
        .map_err(|e| Error::io(path, e))?;
    if head.is_empty() {
        return Err(Error::refused(path, Refusal::Empty));
    }
    if is_mslprof(&head) || mslprof_format::detect(&head) == Some(FileFormat::Gnu) {
        return Ok(FirstFile::Profile);
    }
    if looks_like_text(&head) {
        return Err(Error::refused(path, Refusal::NotElf));
    }
    Ok(FirstFile::Executable)
}

/// Refuse an executable argument that is a folder or not an ELF file (for mslprof profiles, whose modules
/// are otherwise found from the paths recorded in them, so a wrong argument would go unnoticed).
fn check_executable(path: &Path) -> Result<(), Error> {
    use std::io::Read;
    if path.is_dir() {
        return Err(Error::refused(path, Refusal::FolderAsExecutable));
    }
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    if file.read_exact(&mut magic).is_err() || &magic != b"\x7fELF" {
        return Err(Error::refused(path, Refusal::NotElf));
    }
    Ok(())
}

/// The profile files named on the command line, mapped and checked, not yet decoded.
pub struct Files {
    maps: Vec<(PathBuf, memmap2::Mmap)>,
    /// Whether they are mslprof profiles (else GNU or BSD gmon.out).
    pub mslprof: bool,
}

impl Files {
    /// Map `profiles` read-only and refuse what cannot be analysed: text as a profile (when the format is
    /// detected), a non-ELF executable or `--file-format` for mslprof profiles.
    pub fn open(
        profiles: &[PathBuf],
        exe: Option<&Path>,
        file_format: InputFormat,
    ) -> Result<Files, Error> {
        let mut maps = Vec::new();
        for p in profiles {
            let map = crate::sys::map_file(p).map_err(|e| Error::io(p, e))?;
            maps.push((p.clone(), map));
        }
        let mslprof = maps.iter().any(|(_, b)| is_mslprof(b));
        if file_format == InputFormat::Auto {
            for (p, b) in &maps {
                check_profile(p, b)?;
            }
        }
        if mslprof && let Some(e) = exe {
            check_executable(e)?;
        }
        if mslprof && file_format != InputFormat::Auto {
            let first = profiles.first().cloned().unwrap_or_default();
            return Err(Error::refused(first, Refusal::FileFormatForMslprof));
        }
        Ok(Files { maps, mslprof })
    }

    /// Decode every file for `target` in `file_format`, releasing each file's pages as they are read;
    /// `record_counts` also counts the records as the file holds them (gprof's `-i`, before same-range
    /// records are summed).
    pub fn decode(
        self,
        target: GnuTarget,
        file_format: InputFormat,
        record_counts: bool,
    ) -> Result<Vec<Input>, Error> {
        let mut inputs = Vec::new();
        for (p, b) in self.maps {
            if self.mslprof && !is_mslprof(&b) {
                return Err(Error::refused(p, Refusal::MixedFormats));
            }
            let format_error = |source| Error::Format {
                path: p.clone(),
                source,
            };
            let records = if record_counts {
                mslprof_format::record_counts_as(&b, target, file_format).map_err(format_error)?
            } else {
                None
            };
            let mut release = |upto: usize| crate::sys::release_prefix(&b, upto);
            let profile = mslprof_format::read_as(&b, target, file_format, &mut release)
                .map_err(format_error)?;
            drop(b);
            inputs.push(Input {
                path: p,
                profile,
                records,
            });
        }
        Ok(inputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_file_then_problem() {
        let refused = Error::refused("notes.txt", Refusal::NotElf);
        assert_eq!(
            refused.to_string(),
            "notes.txt: not an ELF file or a profile"
        );
        let mismatch = Error::Mismatch {
            path: "gmon.out".into(),
            mismatch: Mismatch::ModuleRangeSizes {
                module: "libfoo.so".into(),
            },
        };
        assert_eq!(
            mismatch.to_string(),
            "gmon.out: module libfoo.so: histogram ranges of one file differ in size"
        );
        let foreign = Error::NotItsExecutable {
            exe: "a.out".into(),
            profile: "gmon.out".into(),
        };
        assert_eq!(
            foreign.to_string(),
            "a.out: does not belong to gmon.out: its code is not where the profile's samples are"
        );
        let io = Error::io("gmon.sum", std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            io.to_string().starts_with("gmon.sum: Permission denied"),
            "{io}"
        );
    }
}
