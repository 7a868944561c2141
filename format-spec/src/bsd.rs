//! Reader of the BSD gmon.out formats GNU gprof accepts when a file lacks the `gmon` magic.
//!
//! Both start with `{lowpc, highpc, ncnt}` (addresses of the target's width, `ncnt` a `u32` byte count of header
//! plus samples). If the `u32` after `ncnt` is `0x00051879` the header is the 4.4BSD `gmonhdr` (then `profrate`
//! and three spare words); otherwise it is the old 4.2BSD header. Then come `(ncnt − header size) / 2` 16-bit
//! samples over `[lowpc, highpc)`, and arcs `{frompc, selfpc, count}` (each of the address width) up to the end
//! of the file, as `gmon_io.c` of GNU gprof 2.40 reads them.

use crate::GnuTarget;
use crate::decode::{Decoder, to_usize};
use crate::error::{ErrorKind, ReadError};
use crate::gnu::{RecordCounts, SingleModule, single_module_profile};
use crate::model::*;

/// `GMONVERSION` of the 4.4BSD header.
pub(crate) const BSD44_VERSION: u32 = 0x0005_1879;

/// Header size in bytes: (old 4.2BSD, 4.4BSD) for a target address size.
pub(crate) fn header_sizes(address_size: u8) -> (usize, usize) {
    let a = usize::from(address_size);
    (2 * a + 4, 2 * a + 4 + 4 + 4 + 12)
}

/// Reads a BSD gmon.out (any file that is neither mslprof nor GNU).
pub(crate) fn read(bytes: &[u8], target: GnuTarget) -> Result<(Profile, RecordCounts), ReadError> {
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
        let caller_address = d.address(size, "BSD arc")?;
        let callee_address = d.address(size, "BSD arc")?;
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
            start: low,
            end: high,
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
