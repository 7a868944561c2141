//! Reader of the BSD gmon.out formats GNU gprof accepts when a file lacks the `gmon` magic.
//!
//! Both start with `{lowpc, highpc, ncnt}` (addresses of the target's width, `ncnt` a `u32` byte count of header
//! plus samples). If the `u32` after `ncnt` is `0x00051879` the header is the 4.4BSD `gmonhdr` (then `profrate`
//! and three spare words); otherwise it is the old 4.2BSD header. Then come `(ncnt − header size) / 2` 16-bit
//! samples over `[lowpc, highpc)`, and arcs `{frompc, selfpc, count}` (each of the address width) up to the end
//! of the file, as `gmon_io.c` of GNU gprof 2.40 reads them.

use crate::GnuTarget;
use crate::address::LinkAddress;
use crate::decode::{Decoder, to_usize};
use crate::error::{ErrorKind, ReadError};
use crate::gnu::{RecordCounts, SingleModule, single_module_profile};
use crate::model::*;
use std::io::{self, Write};

/// `GMONVERSION` of the 4.4BSD header.
pub(crate) const BSD44_VERSION: u32 = 0x0005_1879;

/// Header size in bytes: (old 4.2BSD, 4.4BSD) for a target address size.
pub(crate) fn header_sizes(address_size: u8) -> (usize, usize) {
    let a = usize::from(address_size);
    (2 * a + 4, 2 * a + 4 + 4 + 4 + 12)
}

/// Reads a BSD gmon.out (any file that is neither mslprof nor GNU). With `require_44` an old 4.2BSD header is
/// refused as [`ErrorKind::BadMagic`] (gprof's `--file-format=4.4bsd`).
pub(crate) fn read(
    bytes: &[u8],
    target: GnuTarget,
    require_44: bool,
) -> Result<(Profile, RecordCounts), ReadError> {
    const WHAT: &str = "BSD gmon.out header";
    let size = target.address_size;
    let mut d = Decoder::new(bytes, 0, bytes.len(), target.big_endian);
    let low = d.address(size, WHAT)?;
    let high = d.address(size, WHAT)?;
    let ncnt_at = d.pos();
    let ncnt = d.u32(WHAT)?;
    let version = d.u32(WHAT)?;
    let (old_size, bsd44_size) = header_sizes(size);
    let (header_size, hz) = if version == BSD44_VERSION {
        let rate = d.u32(WHAT)?;
        (bsd44_size, rate)
    } else if require_44 {
        return Err(ReadError::new(ErrorKind::BadMagic, (ncnt_at + 4) as u64));
    } else {
        (old_size, 0)
    };
    if to_usize(u64::from(ncnt)) < header_size || high < low {
        // gprof: "does not appear to be in gmon.out format".
        return Err(ReadError::new(ErrorKind::BadMagic, ncnt_at as u64));
    }
    let mut d = Decoder::new(bytes, header_size, bytes.len(), target.big_endian);
    if bytes.len() < header_size {
        return Err(ReadError::new(
            ErrorKind::Truncated(WHAT),
            bytes.len() as u64,
        ));
    }
    let bins = (to_usize(u64::from(ncnt)) - header_size) / 2;
    if bins.saturating_mul(2) > d.remaining() {
        return Err(d.error(ErrorKind::Truncated("BSD histogram samples")));
    }
    let mut samples = Vec::with_capacity(bins);
    for _ in 0..bins {
        samples.push(d.u16("BSD histogram samples")?);
    }
    let mut counts = RecordCounts {
        version: 0,
        histogram_records: u64::from(bins > 0),
        ..RecordCounts::default()
    };
    let record = 3 * usize::from(size);
    let mut arcs = Vec::with_capacity(d.remaining() / record);
    // Like gprof, a trailing partial arc record is ignored.
    while d.remaining() >= record {
        let caller_address = LinkAddress(d.address(size, "BSD arc")?);
        let callee_address = LinkAddress(d.address(size, "BSD arc")?);
        let count = d.address(size, "BSD arc")?;
        counts.call_graph_records += 1;
        arcs.push(Arc {
            caller_key: 0,
            caller_address,
            callee_address,
            count,
        });
    }
    let ranges = if bins > 0 {
        vec![HistRange {
            start: LinkAddress(low),
            end: LinkAddress(high),
            buckets: Buckets::Dense16(samples),
        }]
    } else {
        Vec::new()
    };
    let raw = SingleModule {
        format: SourceFormat::Bsd,
        hz,
        dimension: b"seconds".to_vec(),
        dimension_abbrev: b's',
        ranges,
        arcs,
        basic_blocks: Vec::new(),
    };
    Ok((single_module_profile(raw), counts))
}

/// The two BSD header layouts [`write`] can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BsdLayout {
    /// 4.2BSD: `{lowpc, highpc, ncnt}`, no profiling rate (readers assume the system clock rate).
    Old,
    /// 4.4BSD: the old header plus version `0x00051879`, the profiling rate and three spare words.
    Bsd44,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

/// Writes a one-module profile as a BSD gmon.out in `layout`, the way gprof 2.40 writes `gmon.sum` for
/// `--file-format=bsd`/`4.4bsd`: header, one 16-bit sample per bucket of the (at most one) histogram range
/// (counts above 65535 keep their low 16 bits, as gprof's), then `{frompc, selfpc, count}` arcs, each field
/// of the target's address width. No histogram gives `lowpc = highpc = 0` and no samples. The rate written by
/// the 4.4BSD layout is `header.hz`.
pub(crate) fn write(
    profile: &Profile,
    target: GnuTarget,
    layout: BsdLayout,
    out: impl Write,
) -> io::Result<()> {
    let size = target.address_size;
    if size != 4 && size != 8 {
        return Err(invalid("BSD target address size must be 4 or 8"));
    }
    let [module] = profile.modules.as_slice() else {
        return Err(invalid("a BSD gmon.out holds exactly one module"));
    };
    let range = match module.histogram.as_ref().map(|h| h.ranges.as_slice()) {
        None | Some([]) => None,
        Some([r]) => Some(r),
        Some(_) => return Err(invalid("a BSD gmon.out holds at most one histogram range")),
    };
    let (old_size, bsd44_size) = header_sizes(size);
    let header_size = match layout {
        BsdLayout::Old => old_size,
        BsdLayout::Bsd44 => bsd44_size,
    };
    let bins = range.map_or(0, |r| r.buckets.len());
    let ncnt = u32::try_from(bins)
        .ok()
        .and_then(|b| b.checked_mul(2))
        .and_then(|b| b.checked_add(header_size as u32))
        .ok_or_else(|| invalid("histogram too large for a BSD gmon.out"))?;
    let mut w = io::BufWriter::new(out);
    let big = target.big_endian;
    let u32_bytes = |v: u32| {
        if big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let address = |w: &mut dyn Write, v: u64| -> io::Result<()> {
        let narrow =
            || u32::try_from(v).map_err(|_| invalid("address does not fit a 32-bit target"));
        match (size, big) {
            (4, false) => w.write_all(&narrow()?.to_le_bytes()),
            (4, true) => w.write_all(&narrow()?.to_be_bytes()),
            (_, false) => w.write_all(&v.to_le_bytes()),
            (_, true) => w.write_all(&v.to_be_bytes()),
        }
    };
    address(&mut w, range.map_or(0, |r| r.start.0))?;
    address(&mut w, range.map_or(0, |r| r.end.0))?;
    w.write_all(&u32_bytes(ncnt))?;
    if layout == BsdLayout::Bsd44 {
        w.write_all(&u32_bytes(BSD44_VERSION))?;
        w.write_all(&u32_bytes(profile.header.hz))?;
        w.write_all(&[0u8; 12])?;
    }
    if let Some(r) = range {
        let mut dense = vec![0u16; bins as usize];
        for (i, c) in r.buckets.nonzero() {
            if let Some(slot) = dense.get_mut(i as usize) {
                *slot = c as u16;
            }
        }
        for v in dense {
            w.write_all(&if big {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            })?;
        }
    }
    for a in &module.arcs {
        address(&mut w, a.caller_address.0)?;
        address(&mut w, a.callee_address.0)?;
        address(&mut w, a.count)?;
    }
    w.flush()
}
