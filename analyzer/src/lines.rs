//! Line symbols for line-by-line profiles (`-l`): one symbol per run of addresses that DWARF maps to
//! the same (function, file, line), as GNU gprof's `core_create_line_syms` makes them.
//!
//! gprof asks BFD for the source position of every byte of `.text`; a new symbol starts wherever the
//! function name, the file or the line changes. BFD's answer only changes where a line-table row, a
//! function range or an inlined function's range starts or ends, so this walks those boundaries instead of
//! every byte: the same symbols,
//! without gprof's cost on a big program. The function name is the innermost (inlined) function's, as
//! BFD gives it; where DWARF has no function, the ELF function symbol containing the address.

use mslprof_format::LinkAddress;
use std::borrow::Cow;

use addr2line::gimli;
use object::{Object, ObjectSection};

use crate::symtab::FunctionSymbol;

/// The DWARF line and function lookup of one ELF file.
pub type Context<'a> = addr2line::Context<gimli::EndianSlice<'a, gimli::RunTimeEndian>>;

/// The DWARF sections of `file` and its byte order; `None` when it has no line table or they cannot be read.
fn dwarf_sections<'a>(
    file: &'a object::File<'_>,
) -> Option<(gimli::DwarfSections<Cow<'a, [u8]>>, gimli::RunTimeEndian)> {
    file.section_by_name(".debug_line")?;
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Cow<'a, [u8]>, gimli::Error> {
        Ok(file
            .section_by_name(id.name())
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[])))
    };
    Some((gimli::DwarfSections::load(load).ok()?, endian))
}

/// Run `f` over the DWARF of `file`; `None` when it has no line table or its DWARF cannot be read.
pub fn with_dwarf<T>(file: &object::File<'_>, f: impl FnOnce(&Context<'_>) -> T) -> Option<T> {
    let (sections, endian) = dwarf_sections(file)?;
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    let ctx = addr2line::Context::from_dwarf(dwarf).ok()?;
    Some(f(&ctx))
}

/// Where inlined code begins and ends (`DW_TAG_inlined_subroutine` ranges): the innermost function BFD
/// names changes there, also between two line-table rows.
pub fn inline_boundaries(file: &object::File<'_>) -> Vec<u64> {
    let mut out = Vec::new();
    let Some((sections, endian)) = dwarf_sections(file) else {
        return out;
    };
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    let mut units = dwarf.units();
    while let Ok(Some(header)) = units.next() {
        let Ok(unit) = dwarf.unit(header) else {
            continue;
        };
        let mut entries = unit.entries();
        while let Ok(Some((_, entry))) = entries.next_dfs() {
            if entry.tag() != gimli::DW_TAG_inlined_subroutine {
                continue;
            }
            if let Ok(mut ranges) = dwarf.die_ranges(&unit, entry) {
                while let Ok(Some(range)) = ranges.next() {
                    out.extend([range.begin, range.end]);
                }
            }
        }
    }
    out
}

/// BFD's `get_src_info` for one address: innermost function name, file and (non-zero) line.
fn source_of(
    ctx: &Context<'_>,
    funcs: &[FunctionSymbol],
    addr: u64,
) -> Option<(String, String, u32)> {
    let loc = ctx.find_location(addr).ok()??;
    let (file, line) = (loc.file?, loc.line?);
    if line == 0 {
        return None;
    }
    let mut name = None;
    if let Ok(mut frames) = ctx.find_frames(addr).skip_all_loads()
        && let Ok(Some(frame)) = frames.next()
        && let Some(f) = frame.function
        && let Ok(n) = f.raw_name()
    {
        name = Some(n.into_owned());
    }
    let name = match name {
        Some(n) => n,
        None => containing(funcs, LinkAddress(addr))?.name.clone(),
    };
    Some((name, file.to_string(), line))
}

/// The function symbol whose range holds `addr` (gprof's `sym_lookup`).
fn containing(funcs: &[FunctionSymbol], addr: LinkAddress) -> Option<&FunctionSymbol> {
    let i = funcs.partition_point(|s| s.addr <= addr).checked_sub(1)?;
    let s = &funcs[i];
    (addr <= s.end_addr).then_some(s)
}

/// The line symbols of `text` (the range gprof walks, usually `.text`), in address order. `funcs` are the
/// module's finalized function symbols: they give a line symbol its static flag, and a name where DWARF
/// has none.
pub fn line_symbols(
    ctx: &Context<'_>,
    funcs: &[FunctionSymbol],
    text: std::ops::Range<u64>,
    inline_boundaries: &[u64],
) -> Vec<FunctionSymbol> {
    let mut starts: Vec<u64> = inline_boundaries
        .iter()
        .copied()
        .filter(|a| text.contains(a))
        .collect();
    if let Ok(rows) = ctx.find_location_range(text.start, text.end) {
        starts.extend(rows.map(|(addr, _, _)| addr.max(text.start)));
    }
    starts.extend(funcs.iter().map(|f| f.addr.0).filter(|a| text.contains(a)));
    starts.sort_unstable();
    starts.dedup();
    let mut out: Vec<FunctionSymbol> = Vec::new();
    for addr in starts {
        let Some((name, file, line)) = source_of(ctx, funcs, addr) else {
            continue;
        };
        let same_function = out
            .last()
            .is_some_and(|p| p.name == name && p.file.as_deref() == Some(file.as_str()));
        if same_function && out.last().is_some_and(|p| p.line == line) {
            continue;
        }
        let is_static = if same_function {
            out.last().is_some_and(|p| p.is_static)
        } else {
            containing(funcs, LinkAddress(addr)).is_some_and(|s| s.is_static)
        };
        out.push(FunctionSymbol {
            name,
            addr: LinkAddress(addr),
            end_addr: LinkAddress(0),
            is_func: false,
            is_static,
            file: Some(file),
            line,
            ..FunctionSymbol::default()
        });
    }
    out
}
