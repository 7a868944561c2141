//! Exact function bounds for mslprof (multi-module) reports, so that no sample or arc is charged to a
//! function that did not run it.
//!
//! gprof lets every symbol reach the next one; in a stripped library that charges whole regions to the
//! nearest preceding exported symbol. Here each symbol covers only its own `st_size` bytes, and what lies
//! between known functions is named by what is known about it:
//! - PLT stubs, decoded from `.plt`, `.plt.sec` and `.plt.got` (x86-64), are `name@plt`;
//! - a function known only from its `.eh_frame` FDE (start and length) is `fn_<hex>`, always shown with
//!   its module (`fn_1a2b40@libcrypto.so.3`);
//! - any other executable range of 64 bytes or more is one row named `<module>+0x<hex>`; a module with
//!   neither symbols nor unwind tables is thus one row. Shorter ranges are alignment padding and stay with
//!   the function before them (a histogram bucket may straddle a function's end).
//!
//! GNU `gmon.out` input never comes here: gprof's own rules apply to it, byte for byte.

use mslprof_format::LinkAddress;
use std::collections::HashMap;

use addr2line::gimli;
use gimli::UnwindSection as _;
use object::{Object, ObjectSection, ObjectSymbol, ObjectSymbolTable, SectionFlags};

use crate::elf::symtab::FunctionSymbol;

/// Ranges shorter than this between two known functions are taken as padding of the first.
const PADDING: u64 = 64;

/// One address range with what is known of it.
struct Piece {
    addr: LinkAddress,
    /// 0 = unknown (reaches the next known start).
    size: u64,
    sym: FunctionSymbol,
}

fn synthetic(name: String, addr: LinkAddress, qualified: bool) -> FunctionSymbol {
    FunctionSymbol {
        name,
        addr,
        is_func: true,
        is_static: true,
        synthetic: qualified,
        ..FunctionSymbol::default()
    }
}

/// Executable sections as `[start, end)` ranges, sorted.
fn exec_ranges(file: &object::File<'_>) -> Vec<(LinkAddress, LinkAddress)> {
    let mut v: Vec<(LinkAddress, LinkAddress)> = file
        .sections()
        .filter(|s| {
            matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
        })
        .filter(|s| s.size() > 0)
        .map(|s| (LinkAddress(s.address()), LinkAddress(s.address() + s.size())))
        .collect();
    v.sort_unstable();
    v
}

/// Start and length of every function an `.eh_frame` FDE describes.
pub fn fde_ranges(file: &object::File<'_>) -> Vec<(LinkAddress, u64)> {
    let mut out = Vec::new();
    let Some(sec) = file.section_by_name(".eh_frame") else {
        return out;
    };
    let Ok(data) = sec.data() else { return out };
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let mut eh = gimli::EhFrame::new(data, endian);
    eh.set_address_size(if file.is_64() { 8 } else { 4 });
    let mut bases = gimli::BaseAddresses::default().set_eh_frame(sec.address());
    if let Some(t) = file.section_by_name(".text") {
        bases = bases.set_text(t.address());
    }
    if let Some(g) = file.section_by_name(".got") {
        bases = bases.set_got(g.address());
    }
    let mut entries = eh.entries(&bases);
    // A malformed table ends the walk; what was read so far is kept.
    while let Ok(Some(entry)) = entries.next() {
        if let gimli::CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o))
            && fde.len() > 0
        {
            out.push((LinkAddress(fde.initial_address()), fde.len()));
        }
    }
    out
}

/// PLT stubs of an x86-64 module: `(address, size, name@plt)`.
pub fn plt_stubs(file: &object::File<'_>) -> Vec<(LinkAddress, u64, String)> {
    let mut out = Vec::new();
    if file.architecture() != object::Architecture::X86_64 {
        return out;
    }
    // GOT slot -> the symbol it is resolved to.
    let mut slots: HashMap<u64, String> = HashMap::new();
    let (Some(relocs), Some(dynsym)) = (file.dynamic_relocations(), file.dynamic_symbol_table())
    else {
        return out;
    };
    for (offset, r) in relocs {
        if let object::RelocationTarget::Symbol(idx) = r.target()
            && let Ok(sym) = dynsym.symbol_by_index(idx)
            && let Ok(name) = sym.name()
            && !name.is_empty()
        {
            let name = name.split('@').next().unwrap_or(name);
            slots.insert(offset, name.to_string());
        }
    }
    for sec in file.sections() {
        let Ok(name) = sec.name() else { continue };
        if !matches!(name, ".plt" | ".plt.sec" | ".plt.got") {
            continue;
        }
        let Ok(data) = sec.data() else { continue };
        let entsize = match sec.flags() {
            SectionFlags::Elf { .. } if name == ".plt.got" && sec.size() % 16 != 0 => 8,
            _ => 16,
        };
        for (k, entry) in data.chunks(entsize).enumerate() {
            let entry_addr = sec.address() + (k * entsize) as u64;
            // `jmp *disp32(%rip)` (possibly after `endbr64` and a `bnd` prefix).
            let Some(pos) = entry.windows(2).position(|w| w == [0xff, 0x25]) else {
                continue;
            };
            let Some(disp) = entry.get(pos + 2..pos + 6) else {
                continue;
            };
            let disp = i32::from_le_bytes([disp[0], disp[1], disp[2], disp[3]]);
            let target = (entry_addr + pos as u64 + 6).wrapping_add_signed(i64::from(disp));
            if let Some(sym) = slots.get(&target) {
                out.push((
                    LinkAddress(entry_addr),
                    entsize as u64,
                    format!("{sym}@plt"),
                ));
            }
        }
    }
    out
}

/// Lay out a module's functions with exact bounds. `syms` are the selected symbols (any order, sizes in
/// `size`); `module` names the rows of unknown ranges. The result is sorted, one entry per address, with
/// contiguous coverage of the executable sections, `end_addr` set.
pub fn layout(
    file: &object::File<'_>,
    syms: Vec<FunctionSymbol>,
    module: &str,
) -> Vec<FunctionSymbol> {
    let exec = exec_ranges(file);
    let exec_start = exec.first().map_or(LinkAddress(0), |r| r.0);
    let exec_end = exec.iter().map(|r| r.1).max().unwrap_or(LinkAddress(0));
    // The largest size given to an address (aliases may have a size where the chosen name has none).
    let mut sizes: HashMap<LinkAddress, u64> = HashMap::new();
    for s in &syms {
        let e = sizes.entry(s.addr).or_insert(0);
        *e = (*e).max(s.size);
    }
    let chosen = crate::elf::symtab::finalize(syms, LinkAddress(0));
    let mut pieces: Vec<Piece> = chosen
        .into_iter()
        .map(|s| Piece {
            addr: s.addr,
            size: sizes.get(&s.addr).copied().unwrap_or(0),
            sym: s,
        })
        .collect();
    pieces.sort_by_key(|p| p.addr);
    // Whether a piece of the sorted `pieces` starts at `addr` or covers it: `reach[i]` is the furthest
    // end of the pieces up to i (a large symbol may cover several later starts). Binary search instead
    // of a scan per PLT stub.
    let mut reach: Vec<LinkAddress> = Vec::with_capacity(pieces.len());
    let mut furthest = LinkAddress(0);
    for p in &pieces {
        if p.size > 0 {
            furthest = furthest.max(p.addr + p.size);
        }
        reach.push(furthest);
    }
    let covered = |pieces: &[Piece], addr: LinkAddress| {
        let i = pieces.partition_point(|p| p.addr < addr);
        pieces.get(i).is_some_and(|p| p.addr == addr) || (i > 0 && addr < reach[i - 1])
    };
    let mut extra = Vec::new();
    for (addr, size, name) in plt_stubs(file) {
        if !covered(&pieces, addr) {
            extra.push(Piece {
                addr,
                size,
                sym: synthetic(name, addr, false),
            });
        }
    }
    pieces.append(&mut extra);
    pieces.sort_by_key(|p| p.addr);
    let mut fdes = fde_ranges(file);
    fdes.sort_unstable();
    // FDEs in address order: each new piece is checked against the nearest piece below it, which is
    // the nearest symbol or the last FDE piece added, and all are merged in once (no insertion in the
    // middle of the vector per FDE: librustc_driver has some 200 000 of them).
    let mut added: Vec<Piece> = Vec::new();
    for (addr, len) in fdes {
        // A symbol without a size at the FDE's start takes the FDE's length.
        if let Ok(i) = pieces.binary_search_by_key(&addr, |p| p.addr) {
            if pieces[i].size == 0 {
                pieces[i].size = len;
            }
            continue;
        }
        let covers = |p: &Piece| p.size > 0 && p.addr < addr && addr < p.addr + p.size;
        let i = pieces.partition_point(|p| p.addr < addr);
        let below = pieces[..i].last();
        let last_added = added.last();
        let nearest = match (below, last_added) {
            (Some(b), Some(a)) => Some(if a.addr > b.addr { a } else { b }),
            (b, a) => b.or(a),
        };
        if last_added.is_some_and(|a| a.addr == addr) || nearest.is_some_and(covers) {
            continue;
        }
        added.push(Piece {
            addr,
            size: len,
            sym: synthetic(format!("fn_{addr:x}"), addr, true),
        });
    }
    pieces.append(&mut added);
    pieces.sort_by_key(|p| p.addr);
    let gap = |addr: LinkAddress| Piece {
        addr,
        size: 0,
        sym: synthetic(format!("{module}+{addr:#x}"), addr, false),
    };
    let mut out: Vec<FunctionSymbol> = Vec::with_capacity(pieces.len() + 8);
    let first = pieces.first().map_or(exec_end, |p| p.addr);
    let mut all: Vec<Piece> = Vec::with_capacity(pieces.len() + 8);
    if exec_start < first {
        all.push(gap(exec_start));
    }
    let n = pieces.len();
    let mut it = pieces.into_iter().peekable();
    for _ in 0..n {
        let Some(p) = it.next() else { break };
        let next = it.peek().map_or(exec_end.max(p.addr + p.size), |q| q.addr);
        let end = if p.size > 0 {
            (p.addr + p.size).min(next)
        } else {
            next
        };
        let after = if next > end && next - end >= PADDING {
            Some(gap(end))
        } else {
            None
        };
        all.push(p);
        all.extend(after);
    }
    for (i, p) in all.iter().enumerate() {
        let next = all
            .get(i + 1)
            .map_or_else(|| exec_end.max(p.addr + p.size.max(1)), |q| q.addr);
        let mut s = p.sym.clone();
        s.size = p.size;
        s.end_addr = next.wrapping_sub(1);
        out.push(s);
    }
    out
}
