//! Reading profile files into the shared model: GNU gmon.out (and, once the format crate exposes its
//! reader, mslprof files) become a [`Profile`].
//!
//! GNU gmon.out is decoded here with the rules GNU gprof uses: records in file order, histogram records
//! over the same range summed, arcs kept in file order and not merged (the format crate's reader sorts
//! and merges them, which would change gprof's traversal order and so its tie-breaks).

use mslprof_format::model::{
    Arc, BasicBlockCount, Buckets, Header, HistRange, Histogram, Module, Profile, SourceFormat,
    module_flags,
};

/// Byte order and address width of GNU/BSD input (taken from the executable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub big_endian: bool,
    pub address_size: u8,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            big_endian: false,
            address_size: 8,
        }
    }
}

/// What went wrong while decoding a profile, with the byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError {
    pub problem: String,
    pub offset: u64,
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at offset {:#x}", self.problem, self.offset)
    }
}

/// Whether the bytes look like an mslprof profile.
pub fn is_mslprof(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89MSLPROF")
}

/// Whether the bytes look like a GNU gmon.out.
pub fn is_gnu(bytes: &[u8]) -> bool {
    bytes.starts_with(b"gmon")
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    target: Target,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], InputError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(InputError {
                problem: format!("truncated {what}"),
                offset: self.pos as u64,
            }),
        }
    }

    fn u8(&mut self, what: &str) -> Result<u8, InputError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, InputError> {
        let b: [u8; 2] = self.take(2, what)?.try_into().unwrap_or([0; 2]);
        Ok(if self.target.big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        })
    }

    fn u32(&mut self, what: &str) -> Result<u32, InputError> {
        let b: [u8; 4] = self.take(4, what)?.try_into().unwrap_or([0; 4]);
        Ok(if self.target.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn vma(&mut self, what: &str) -> Result<u64, InputError> {
        if self.target.address_size == 4 {
            return self.u32(what).map(u64::from);
        }
        let b: [u8; 8] = self.take(8, what)?.try_into().unwrap_or([0; 8]);
        Ok(if self.target.big_endian {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }
}

/// Decode a GNU gmon.out (magic `gmon`, version 1) as a one-module profile.
pub fn read_gnu(bytes: &[u8], target: Target) -> Result<Profile, InputError> {
    read_gnu_releasing(bytes, target, &|_| {})
}

/// [`read_gnu`], calling `release(n)` now and then with the number of leading bytes already consumed,
/// so that a caller reading from a mapping can let those pages go (a 62 MB histogram then does not sit
/// in memory twice).
pub fn read_gnu_releasing(
    bytes: &[u8],
    target: Target,
    release: &dyn Fn(usize),
) -> Result<Profile, InputError> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        target,
    };
    let magic = c.take(4, "header")?;
    if magic != b"gmon" {
        return Err(InputError {
            problem: "bad magic".into(),
            offset: 0,
        });
    }
    let version = c.u32("header")?;
    c.take(12, "header")?;
    let mut header = Header {
        dimension: b"seconds".to_vec(),
        dimension_abbrev: b's',
        ..Header::default()
    };
    let mut ranges: Vec<(u64, u64, Buckets)> = Vec::new();
    let mut arcs = Vec::new();
    let mut basic_blocks = Vec::new();
    let mut first_hist = true;
    while c.pos < bytes.len() {
        let tag_at = c.pos as u64;
        match c.u8("record tag")? {
            0 => {
                let low = c.vma("histogram header")?;
                let high = c.vma("histogram header")?;
                let bins = c.u32("histogram header")?;
                let rate = c.u32("histogram header")?;
                let dim = c.take(15, "histogram header")?.to_vec();
                let abbrev = c.u8("histogram header")?;
                if bins as usize > (bytes.len() - c.pos) / 2 {
                    return Err(InputError {
                        problem: format!("truncated histogram ({bins} bins)"),
                        offset: tag_at,
                    });
                }
                if high < low || bins == 0 {
                    return Err(InputError {
                        problem: "bad histogram range".into(),
                        offset: tag_at,
                    });
                }
                if first_hist {
                    header.hz = rate;
                    header.sample_period_ns = if rate > 0 {
                        1_000_000_000 / u64::from(rate)
                    } else {
                        0
                    };
                    let end = dim.iter().position(|&b| b == 0).unwrap_or(dim.len());
                    header.dimension = dim[..end].to_vec();
                    header.dimension_abbrev = abbrev;
                    first_hist = false;
                }
                let idx = match ranges.iter().position(|r| r.0 == low && r.1 == high) {
                    Some(i) => i,
                    None => {
                        if ranges.iter().any(|r| low < r.1 && r.0 < high) {
                            return Err(InputError {
                                problem: "overlapping histogram records".into(),
                                offset: tag_at,
                            });
                        }
                        let mut v = Vec::with_capacity(bins as usize);
                        for k in 0..bins {
                            if k % (1 << 20) == 0 {
                                release(c.pos);
                            }
                            v.push(c.u16("histogram")?);
                        }
                        ranges.push((low, high, Buckets::Dense16(v)));
                        continue;
                    }
                };
                if ranges[idx].2.len() != u64::from(bins) {
                    return Err(InputError {
                        problem: "histogram records for one range differ in size".into(),
                        offset: tag_at,
                    });
                }
                let mut sums: Vec<u32> =
                    match std::mem::replace(&mut ranges[idx].2, Buckets::Dense32(Vec::new())) {
                        Buckets::Dense16(v) => v.into_iter().map(u32::from).collect(),
                        Buckets::Dense32(v) => v,
                        Buckets::Sparse { .. } => vec![0; bins as usize],
                    };
                for s in sums.iter_mut() {
                    *s = s.saturating_add(u32::from(c.u16("histogram")?));
                }
                ranges[idx].2 = Buckets::Dense32(sums);
            }
            1 => {
                let from = c.vma("call-graph record")?;
                let to = c.vma("call-graph record")?;
                let count = c.u32("call-graph record")?;
                arcs.push(Arc {
                    caller_key: 0,
                    caller_address: from,
                    callee_address: to,
                    count: u64::from(count),
                });
            }
            2 => {
                let n = c.u32("basic-block record")?;
                for _ in 0..n {
                    let address = c.vma("basic-block record")?;
                    let count = c.vma("basic-block record")?;
                    basic_blocks.push(BasicBlockCount { address, count });
                }
            }
            t => {
                return Err(InputError {
                    problem: format!("unknown record tag {t}"),
                    offset: tag_at,
                });
            }
        }
    }
    let histogram = if ranges.is_empty() {
        None
    } else {
        Some(Histogram {
            bucket_bits: 16,
            ranges: ranges
                .into_iter()
                .map(|(start, end, buckets)| HistRange {
                    start,
                    end,
                    buckets,
                })
                .collect(),
        })
    };
    let module = Module {
        key: 0,
        name: b"a.out".to_vec(),
        flags: module_flags::PROFILED | module_flags::MAIN_PROGRAM,
        load_order: 1,
        histogram,
        arcs,
        basic_blocks,
        ..Module::default()
    };
    Ok(Profile {
        format: SourceFormat::Gnu { version },
        header,
        modules: vec![module],
    })
}

/// Decode any supported profile file. GNU gmon.out is decoded here, keeping arcs in file order (gprof's
/// call-graph traversal and its tie-breaks depend on that order); mslprof and BSD files go through the
/// format crate's reader.
pub fn read_profile(bytes: &[u8], target: Target) -> Result<Profile, InputError> {
    read_profile_releasing(bytes, target, &|_| {})
}

/// [`read_profile`] with a release callback (see [`read_gnu_releasing`]).
pub fn read_profile_releasing(
    bytes: &[u8],
    target: Target,
    release: &dyn Fn(usize),
) -> Result<Profile, InputError> {
    if is_gnu(bytes) {
        return read_gnu_releasing(bytes, target, release);
    }
    let t = mslprof_format::GnuTarget {
        big_endian: target.big_endian,
        address_size: target.address_size,
    };
    mslprof_format::read(bytes, t).map_err(|e| InputError {
        problem: e.kind.to_string(),
        offset: e.offset,
    })
}
