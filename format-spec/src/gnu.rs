//! GNU gmon.out (magic `gmon`, version 1; also version 0 without basic-block records): reader and writer.
//!
//! The reader follows GNU gprof 2.40 (`gmon_io.c`, `hist.c`, `call_graph.c`, `basic_blocks.c`): records are a
//! tag byte then a body; histogram records for the same `[low_pc, high_pc)` are summed, records that overlap
//! another one, or change the dimension or the scale, are refused; ranges stay in the order of their first record
//! (gprof credits samples and writes `gmon.sum` in that order); arcs are kept in file order and not merged
//! (gprof adds duplicates up per function pair, and its call-graph order and tie-breaks follow the file order).
//! The result is a profile with a single module (see [`single_module_profile`]).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::GnuTarget;
use crate::address::LinkAddress;
use crate::decode::{Decoder, to_usize};
use crate::error::{ErrorKind, ReadError};
use crate::model::*;

pub(crate) const GMON_MAGIC: [u8; 4] = *b"gmon";
pub(crate) const GMON_VERSION: u32 = 1;
const TAG_TIME_HIST: u8 = 0;
const TAG_CG_ARC: u8 = 1;
const TAG_BB_COUNT: u8 = 2;
const GNU_DIMENSION_SIZE: usize = 15;
/// How many histogram samples the reader decodes between two calls of its `release` callback.
const RELEASE_EVERY: usize = 1 << 20;

/// How many records of each kind a GNU or BSD gmon.out holds, counted as GNU gprof's `-i` counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// The file's version: 0 or 1 for GNU, 0 for BSD (gprof prints this in `-i`).
    pub version: u32,
    pub histogram_records: u64,
    pub call_graph_records: u64,
    pub basic_block_records: u64,
}

/// Raw contents of a GNU or BSD file before they become a [`Profile`].
pub(crate) struct SingleModule {
    pub format: SourceFormat,
    pub hz: u32,
    pub dimension: Vec<u8>,
    pub dimension_abbrev: u8,
    pub ranges: Vec<HistRange>,
    pub arcs: Vec<Arc>,
    pub basic_blocks: Vec<BasicBlockCount>,
}

/// The one-module profile of a GNU or BSD file: key 0, MAIN_PROGRAM|PROFILED, 16-bit buckets, arcs (file order,
/// duplicates kept) whose caller is the module itself, `hz` = the file's profiling rate and `sample_period_ns` = 1e9 / hz (0 when unknown).
pub(crate) fn single_module_profile(raw: SingleModule) -> Profile {
    let total: u64 = raw
        .ranges
        .iter()
        .fold(0u64, |acc, r| acc.saturating_add(r.buckets.total()));
    let histogram = if raw.ranges.is_empty() {
        None
    } else {
        Some(Histogram {
            bucket_bits: 16,
            ranges: raw.ranges,
        })
    };
    let header = Header {
        hz: raw.hz,
        sample_period_ns: if raw.hz == 0 {
            0
        } else {
            1_000_000_000 / u64::from(raw.hz)
        },
        dimension: raw.dimension,
        dimension_abbrev: raw.dimension_abbrev,
        total_samples: total,
        ..Header::default()
    };
    let module = Module {
        key: 0,
        flags: module_flags::MAIN_PROGRAM | module_flags::PROFILED,
        samples: total,
        histogram,
        arcs: raw.arcs,
        basic_blocks: raw.basic_blocks,
        ..Module::default()
    };
    Profile {
        format: raw.format,
        header,
        modules: vec![module],
        stacks: None,
    }
}

/// The part of a 15-byte dimension field before its first NUL (gprof compares them with `strncmp`).
fn dimension_str(field: &[u8]) -> &[u8] {
    let len = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    &field[..len]
}

/// Histogram records read so far, with the indexes that make each new record O(log n).
struct Histograms {
    ranges: Vec<HistRange>,
    exact: HashMap<(u64, u64), usize>,
    /// Non-empty ranges by start; they are pairwise disjoint.
    by_start: BTreeMap<u64, u64>,
    first: Option<(u32, [u8; GNU_DIMENSION_SIZE], u8, f64)>,
}

impl Histograms {
    fn read_record(
        &mut self,
        d: &mut Decoder<'_>,
        address_size: u8,
        release: &mut dyn FnMut(usize),
    ) -> Result<(), ReadError> {
        const WHAT: &str = "histogram record";
        let at = d.pos();
        let low = d.address(address_size, WHAT)?;
        let high = d.address(address_size, WHAT)?;
        let bins_at = d.pos();
        let bins = d.u32(WHAT)?;
        let rate = d.u32(WHAT)?;
        let mut dimension = [0u8; GNU_DIMENSION_SIZE];
        dimension.copy_from_slice(d.take(GNU_DIMENSION_SIZE, WHAT)?);
        let abbrev = d.u8(WHAT)?;
        if high < low {
            return Err(ReadError::new(
                ErrorKind::BadValue("histogram high_pc below low_pc"),
                at as u64,
            ));
        }
        let scale = ((high - low) / 2) as f64 / f64::from(bins);
        match &self.first {
            None => self.first = Some((rate, dimension, abbrev, scale)),
            Some((_, first_dim, first_abbrev, first_scale)) => {
                if dimension_str(first_dim) != dimension_str(&dimension) {
                    return Err(ReadError::new(
                        ErrorKind::IncompatibleHistograms("dimension unit changed"),
                        at as u64,
                    ));
                }
                if *first_abbrev != abbrev {
                    return Err(ReadError::new(
                        ErrorKind::IncompatibleHistograms("dimension abbreviation changed"),
                        at as u64,
                    ));
                }
                if (first_scale - scale).abs() > 0.000_001 {
                    return Err(ReadError::new(
                        ErrorKind::IncompatibleHistograms("different scales"),
                        at as u64,
                    ));
                }
            }
        }
        let n = to_usize(u64::from(bins));
        if n.saturating_mul(2) > d.remaining() {
            return Err(d.error(ErrorKind::Truncated("histogram samples")));
        }
        let start = d.pos();
        let raw = d.take(2 * n, "histogram samples")?;
        let mut samples = Vec::with_capacity(n);
        for (k, chunk) in raw.chunks(2 * RELEASE_EVERY).enumerate() {
            release(start + k * 2 * RELEASE_EVERY);
            samples.extend(chunk.chunks_exact(2).map(|b| {
                let b = [b[0], b[1]];
                if d.big_endian {
                    u16::from_be_bytes(b)
                } else {
                    u16::from_le_bytes(b)
                }
            }));
        }
        if let Some(&index) = self.exact.get(&(low, high)) {
            let existing = &mut self.ranges[index];
            if existing.buckets.len() != u64::from(bins) {
                return Err(ReadError::new(
                    ErrorKind::IncompatibleHistograms("same range with a different bin count"),
                    bins_at as u64,
                ));
            }
            add_samples(&mut existing.buckets, &samples);
            return Ok(());
        }
        if low < high {
            if let Some((_, &prev_end)) = self.by_start.range(..high).next_back()
                && prev_end > low
            {
                return Err(ReadError::new(
                    ErrorKind::OverlappingData("histogram records overlap"),
                    at as u64,
                ));
            }
            self.by_start.insert(low, high);
        }
        self.exact.insert((low, high), self.ranges.len());
        self.ranges.push(HistRange {
            start: LinkAddress(low),
            end: LinkAddress(high),
            buckets: Buckets::Dense16(samples),
        });
        Ok(())
    }
}

/// Adds `samples` into `buckets` (same length), widening 16-bit buckets to 32 bits when a sum needs it.
pub(crate) fn add_samples(buckets: &mut Buckets, samples: &[u16]) {
    if let Buckets::Dense16(v) = buckets {
        let fits = v
            .iter()
            .zip(samples)
            .all(|(a, b)| a.checked_add(*b).is_some());
        if fits {
            for (a, b) in v.iter_mut().zip(samples) {
                *a += *b;
            }
            return;
        }
        let widened = v.iter().map(|c| u32::from(*c)).collect();
        *buckets = Buckets::Dense32(widened);
    }
    if let Buckets::Dense32(v) = buckets {
        for (a, b) in v.iter_mut().zip(samples) {
            *a = a.saturating_add(u32::from(*b));
        }
    }
}

/// Reads a GNU gmon.out (the caller checked the `gmon` magic). `release(n)` is called now and then with the
/// number of leading bytes already decoded (see [`crate::read_releasing`]).
pub(crate) fn read(
    bytes: &[u8],
    target: GnuTarget,
    release: &mut dyn FnMut(usize),
) -> Result<(Profile, RecordCounts), ReadError> {
    let size = target.address_size;
    let mut d = Decoder::new(bytes, 0, bytes.len(), target.big_endian);
    d.skip(4, "gmon.out header")?;
    let version = d.u32("gmon.out header")?;
    if version != GMON_VERSION && version != 0 {
        return Err(ReadError::new(ErrorKind::UnsupportedVersion(version), 4));
    }
    d.skip(12, "gmon.out header")?;
    let mut counts = RecordCounts {
        version,
        ..RecordCounts::default()
    };
    let mut hist = Histograms {
        ranges: Vec::new(),
        exact: HashMap::new(),
        by_start: BTreeMap::new(),
        first: None,
    };
    let mut arcs = Vec::new();
    let mut basic_blocks = Vec::new();
    while !d.is_empty() {
        let tag_at = d.pos();
        match d.u8("record tag")? {
            TAG_TIME_HIST => {
                counts.histogram_records += 1;
                hist.read_record(&mut d, size, release)?;
            }
            TAG_CG_ARC => {
                counts.call_graph_records += 1;
                let caller_address = LinkAddress(d.address(size, "call-graph record")?);
                let callee_address = LinkAddress(d.address(size, "call-graph record")?);
                let count = d.u32("call-graph record")?;
                arcs.push(Arc {
                    caller_key: 0,
                    caller_address,
                    callee_address,
                    count: u64::from(count),
                });
            }
            TAG_BB_COUNT => {
                counts.basic_block_records += 1;
                if version == 0 {
                    // Version 0 basic-block records hold host-dependent fields gprof itself cannot read portably.
                    return Err(ReadError::new(
                        ErrorKind::UnsupportedVersion(0),
                        tag_at as u64,
                    ));
                }
                let n = d.u32("basic-block record")?;
                let need = u64::from(n).saturating_mul(2 * u64::from(size));
                if need > d.remaining() as u64 {
                    return Err(d.error(ErrorKind::Truncated("basic-block record")));
                }
                for _ in 0..n {
                    let address = LinkAddress(d.address(size, "basic-block record")?);
                    let count = d.address(size, "basic-block record")?;
                    basic_blocks.push(BasicBlockCount { address, count });
                }
            }
            tag => {
                return Err(ReadError::new(
                    ErrorKind::UnknownRecordTag(tag),
                    tag_at as u64,
                ));
            }
        }
    }
    let (hz, dimension, dimension_abbrev) = match hist.first {
        Some((rate, dim, abbrev, _)) => (rate, dimension_str(&dim).to_vec(), abbrev),
        None => (0, b"seconds".to_vec(), b's'),
    };
    let raw = SingleModule {
        format: SourceFormat::Gnu { version },
        hz,
        dimension,
        dimension_abbrev,
        ranges: hist.ranges,
        arcs,
        basic_blocks,
    };
    Ok((single_module_profile(raw), counts))
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Encodes integers in the target's byte order and address width.
struct GnuEncoder<W: Write> {
    out: W,
    target: GnuTarget,
}

impl<W: Write> GnuEncoder<W> {
    fn u8(&mut self, v: u8) -> io::Result<()> {
        self.out.write_all(&[v])
    }
    fn u16(&mut self, v: u16) -> io::Result<()> {
        let b = if self.target.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.out.write_all(&b)
    }
    fn u32(&mut self, v: u32) -> io::Result<()> {
        let b = if self.target.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.out.write_all(&b)
    }
    fn address(&mut self, v: u64) -> io::Result<()> {
        if self.target.address_size == 4 {
            let v =
                u32::try_from(v).map_err(|_| invalid("address does not fit a 32-bit target"))?;
            self.u32(v)
        } else {
            let b = if self.target.big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            };
            self.out.write_all(&b)
        }
    }
}

/// Writes `profile` as a GNU gmon.out (version 1) that GNU gprof reads; see [`crate::write_gnu`].
pub(crate) fn write(profile: &Profile, target: GnuTarget, out: impl Write) -> io::Result<()> {
    if target.address_size != 4 && target.address_size != 8 {
        return Err(invalid("GNU target address size must be 4 or 8"));
    }
    let [module] = profile.modules.as_slice() else {
        return Err(invalid("a GNU gmon.out holds exactly one module"));
    };
    let header = &profile.header;
    if header.dimension.len() > GNU_DIMENSION_SIZE {
        return Err(invalid("dimension longer than 15 bytes"));
    }
    let hz = if header.hz != 0 || header.sample_period_ns == 0 {
        header.hz
    } else {
        u32::try_from(1_000_000_000 / header.sample_period_ns).unwrap_or(u32::MAX)
    };
    let mut dimension = [0u8; GNU_DIMENSION_SIZE];
    dimension[..header.dimension.len()].copy_from_slice(&header.dimension);
    let mut e = GnuEncoder {
        out: io::BufWriter::new(out),
        target,
    };
    e.out.write_all(&GMON_MAGIC)?;
    e.u32(GMON_VERSION)?;
    e.out.write_all(&[0u8; 12])?;
    if let Some(histogram) = &module.histogram {
        for range in &histogram.ranges {
            if let Buckets::Sparse { len, entries } = &range.buckets {
                let mut previous: Option<u64> = None;
                for &(index, _) in entries {
                    if index >= *len || previous.is_some_and(|p| index <= p) {
                        return Err(invalid(
                            "sparse buckets must be strictly increasing and inside their range",
                        ));
                    }
                    previous = Some(index);
                }
            }
        }
        for range in &histogram.ranges {
            let bins = u32::try_from(range.buckets.len())
                .map_err(|_| invalid("histogram range with more than 2^32-1 buckets"))?;
            if bins == 0 {
                continue;
            }
            // gprof adds records with the same range, so counts above 65535 are spread over several records.
            let max = range.buckets.nonzero().map(|(_, c)| c).max().unwrap_or(0);
            let layers = max.div_ceil(u32::from(u16::MAX)).max(1);
            for layer in 0..layers {
                e.u8(TAG_TIME_HIST)?;
                e.address(range.start.0)?;
                e.address(range.end.0)?;
                e.u32(bins)?;
                e.u32(hz)?;
                e.out.write_all(&dimension)?;
                e.u8(header.dimension_abbrev)?;
                let already = u64::from(layer) * u64::from(u16::MAX);
                let layer_value = |count: u32| -> u16 {
                    let rest = u64::from(count).saturating_sub(already);
                    u16::try_from(rest.min(u64::from(u16::MAX))).unwrap_or(u16::MAX)
                };
                let mut next = 0u64;
                for (index, count) in range.buckets.nonzero() {
                    while next < index {
                        e.u16(0)?;
                        next += 1;
                    }
                    e.u16(layer_value(count))?;
                    next = index + 1;
                }
                while next < u64::from(bins) {
                    e.u16(0)?;
                    next += 1;
                }
            }
        }
    }
    for arc in &module.arcs {
        // A caller in another module (or unknown) has no address in this module's space: spontaneous.
        let from = if arc.caller_key == module.key {
            arc.caller_address
        } else {
            LinkAddress(0)
        };
        let mut rest = arc.count;
        loop {
            let part = u32::try_from(rest).unwrap_or(u32::MAX);
            e.u8(TAG_CG_ARC)?;
            e.address(from.0)?;
            e.address(arc.callee_address.0)?;
            e.u32(part)?;
            rest -= u64::from(part);
            if rest == 0 {
                break;
            }
        }
    }
    if !module.basic_blocks.is_empty() {
        let n = u32::try_from(module.basic_blocks.len())
            .map_err(|_| invalid("more than 2^32-1 basic blocks"))?;
        e.u8(TAG_BB_COUNT)?;
        e.u32(n)?;
        for bb in &module.basic_blocks {
            e.address(bb.address.0)?;
            e.address(bb.count)?;
        }
    }
    e.out.flush()
}
