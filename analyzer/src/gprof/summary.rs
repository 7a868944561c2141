//! The `gmon.sum` files `-s` writes for GNU and BSD input: the summed histogram and one arc per pair of
//! functions, in gprof's layout and order.

use mslprof_format::model::Histogram;

use crate::gprof::graph::Graph;
use crate::input::Input;

/// gprof's `gmon.sum` for `--file-format=bsd|4.4bsd`: the 4.4BSD header when asked for or when the rate is
/// not the host's clock tick (100 Hz on Linux), else the old one; the summed samples of the (single) range and
/// one arc per pair of functions (symbol addresses, in the order of the GNU summary), little-endian 8-byte.
pub fn bsd(g: &Graph, hist: &Histogram, hz: u32, format: mslprof_format::InputFormat) -> Vec<u8> {
    use mslprof_format::{BsdLayout, GnuTarget, Header, Module, Profile, SourceFormat};
    let layout = if format == mslprof_format::InputFormat::Bsd44 || hz != 100 {
        BsdLayout::Bsd44
    } else {
        BsdLayout::Old
    };
    let mut arcs = Vec::new();
    for s in 0..g.nsyms {
        for &a in g.syms[s].children.iter().rev() {
            let arc = &g.arcs[a];
            arcs.push(mslprof_format::Arc {
                caller_key: 0,
                caller_address: g.syms[arc.parent].symbol.addr,
                callee_address: g.syms[arc.child].symbol.addr,
                count: arc.count,
            });
        }
    }
    let profile = Profile {
        format: SourceFormat::Bsd,
        header: Header {
            hz,
            ..Header::default()
        },
        modules: vec![Module {
            histogram: Some(hist.clone()),
            arcs,
            ..Module::default()
        }],
        stacks: None,
    };
    let mut out = Vec::new();
    // Only fails on a profile the BSD layout cannot hold; BSD input has at most one histogram range.
    let _ = mslprof_format::write_bsd(&profile, GnuTarget::default(), layout, &mut out);
    out
}

/// gprof's `gmon.sum`: GNU format, histograms then arcs (symbol addresses, per caller in table order).
pub fn gnu(
    g: &Graph,
    hist: &Histogram,
    hz: u32,
    dim: &str,
    abbrev: char,
    inputs: &[Input],
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"gmon");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 12]);
    for r in &hist.ranges {
        out.push(0);
        out.extend_from_slice(&r.start.0.to_le_bytes());
        out.extend_from_slice(&r.end.0.to_le_bytes());
        out.extend_from_slice(&(r.buckets.len() as u32).to_le_bytes());
        out.extend_from_slice(&hz.to_le_bytes());
        let mut d = [0u8; 15];
        for (i, b) in dim.bytes().take(15).enumerate() {
            d[i] = b;
        }
        out.extend_from_slice(&d);
        out.push(abbrev as u8);
        let mut dense = vec![0u16; r.buckets.len() as usize];
        for (i, c) in r.buckets.nonzero() {
            dense[i as usize] = c as u16;
        }
        for v in dense {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    for s in 0..g.nsyms {
        for &a in g.syms[s].children.iter().rev() {
            let arc = &g.arcs[a];
            out.push(1);
            out.extend_from_slice(&g.syms[arc.parent].symbol.addr.0.to_le_bytes());
            out.extend_from_slice(&g.syms[arc.child].symbol.addr.0.to_le_bytes());
            out.extend_from_slice(&(arc.count as u32).to_le_bytes());
        }
    }
    let bbs: Vec<_> = inputs
        .iter()
        .flat_map(|i| i.profile.modules[0].basic_blocks.iter().copied())
        .collect();
    if !bbs.is_empty() {
        out.push(2);
        out.extend_from_slice(&(bbs.len() as u32).to_le_bytes());
        for b in bbs {
            out.extend_from_slice(&b.address.0.to_le_bytes());
            out.extend_from_slice(&b.count.to_le_bytes());
        }
    }
    out
}
