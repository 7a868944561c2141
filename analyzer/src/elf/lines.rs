//! Line symbols for line-by-line profiles (`-l`): one symbol per run of addresses that DWARF maps to
//! the same (function, file, line), as GNU gprof's `core_create_line_syms` makes them.
//!
//! gprof asks BFD for the source position of every byte of `.text`; a new symbol starts wherever the
//! function name, the file or the line changes. BFD's answer only changes where a line-table row, a
//! function range, an inlined function's range or an ELF symbol starts or ends, so this walks those
//! boundaries instead of every byte: the same symbols, without gprof's cost on a big program. Names and
//! files are BFD 2.40's, quirks included (analyzer/README.md, "-l"): the DWARF function's name where it is
//! a linkage name; BFD's ELF symbol lookup ([`NearestFunction`]) where DWARF has no function; and the
//! names BFD settles on for C++ functions without a linkage name.

use mslprof_format::LinkAddress;
use std::borrow::Cow;
use std::collections::HashMap;

use addr2line::gimli;
use object::{Object, ObjectSection};

use crate::elf::nearest_function::NearestFunction;
use crate::elf::symtab::FunctionSymbol;

/// The DWARF reader of one ELF file.
type Reader<'a> = gimli::EndianSlice<'a, gimli::RunTimeEndian>;

/// The DWARF line and function lookup of one ELF file.
pub type Context<'a> = addr2line::Context<Reader<'a>>;

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
    // Location lists and macros serve no lookup here: left empty, they are never decompressed (libc's
    // location lists are a quarter of its compressed DWARF).
    let unused = |id| {
        matches!(
            id,
            gimli::SectionId::DebugLoc
                | gimli::SectionId::DebugLocLists
                | gimli::SectionId::DebugMacinfo
                | gimli::SectionId::DebugMacro
        )
    };
    let load = |id: gimli::SectionId| -> Result<Cow<'a, [u8]>, gimli::Error> {
        Ok(file
            .section_by_name(id.name())
            .filter(|_| !unused(id))
            .and_then(|s| s.uncompressed_data().ok())
            .unwrap_or(Cow::Borrowed(&[])))
    };
    Some((gimli::DwarfSections::load(load).ok()?, endian))
}

/// Run `f` over the DWARF of `file`; `None` when it has no line table or its DWARF cannot be read.
pub fn with_dwarf<T>(file: &object::File<'_>, f: impl FnOnce(&Context<'_>) -> T) -> Option<T> {
    let (sections, endian) = dwarf_sections(file)?;
    let ctx = context_of(&sections, endian)?;
    Some(f(&ctx))
}

/// [`with_dwarf`], also giving `f` the [`FirstFileRows`] of the same DWARF: its sections are read (and
/// decompressed) once for both.
pub fn with_dwarf_and_first_rows<T>(
    file: &object::File<'_>,
    f: impl FnOnce(&Context<'_>, &FirstFileRows) -> T,
) -> Option<T> {
    let (sections, endian) = dwarf_sections(file)?;
    let first_rows = FirstFileRows::of_sections(&sections, endian);
    let ctx = context_of(&sections, endian)?;
    Some(f(&ctx, &first_rows))
}

/// The line and function lookup over `sections`.
fn context_of<'a>(
    sections: &'a gimli::DwarfSections<Cow<'_, [u8]>>,
    endian: gimli::RunTimeEndian,
) -> Option<Context<'a>> {
    let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// Where functions and inlined code begin and end (`DW_TAG_subprogram` and `DW_TAG_inlined_subroutine`
/// ranges): the function BFD names changes there, also between two line-table rows.
pub fn function_boundaries(file: &object::File<'_>) -> Vec<u64> {
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
            if entry.tag() != gimli::DW_TAG_inlined_subroutine
                && entry.tag() != gimli::DW_TAG_subprogram
            {
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

/// A file path as addr2line renders it: the unit's directory, the file's directory unless it is entry 0,
/// the file's name (an absolute part replaces what is before it).
fn render_path<'d>(
    unit: gimli::UnitRef<'_, Reader<'d>>,
    header: &gimli::LineProgramHeader<Reader<'d>>,
    file: &gimli::FileEntry<Reader<'d>>,
) -> Option<String> {
    let mut path = unit
        .comp_dir
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut push = |part: &str| {
        if part.starts_with('/') {
            path = part.to_string();
        } else {
            if !path.is_empty() && !path.ends_with('/') {
                path.push('/');
            }
            path.push_str(part);
        }
    };
    if file.directory_index() != 0
        && let Some(dir) = file.directory(header)
    {
        push(&unit.attr_string(dir).ok()?.to_string_lossy());
    }
    push(&unit.attr_string(file.path_name()).ok()?.to_string_lossy());
    Some(path)
}

/// The rows BFD 2.40 gives another file than the line table does: in a DWARF 5 line program, the rows of
/// a sequence before its first `DW_LNS_set_file` (whose file register is 1 by default) carry file entry
/// 0's name in BFD. Only programs where entries 0 and 1 name different files are affected (link-time
/// optimised code: entry 0 is `<artificial>` there).
#[derive(Clone, Debug, Default)]
pub struct FirstFileRows {
    /// Address ranges, sorted by start, and the file BFD names there.
    ranges: Vec<(u64, u64, String)>,
}

impl FirstFileRows {
    /// Scan the line programs of `file`'s DWARF.
    pub fn new(file: &object::File<'_>) -> Self {
        match dwarf_sections(file) {
            Some((sections, endian)) => Self::of_sections(&sections, endian),
            None => FirstFileRows { ranges: Vec::new() },
        }
    }

    /// Scan the line programs of `sections`.
    fn of_sections(
        sections: &gimli::DwarfSections<Cow<'_, [u8]>>,
        endian: gimli::RunTimeEndian,
    ) -> Self {
        let mut ranges = Vec::new();
        let dwarf = sections.borrow(|s| gimli::EndianSlice::new(s, endian));
        let mut units = dwarf.units();
        while let Ok(Some(header)) = units.next() {
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let Some(program) = unit.line_program.as_ref() else {
                continue;
            };
            let h = program.header();
            if h.version() < 5 || h.maximum_operations_per_instruction() != 1 || h.line_range() == 0
            {
                continue;
            }
            let unit_ref = unit.unit_ref(&dwarf);
            let path = |i| render_path(unit_ref, h, h.file(i)?);
            let (Some(first), Some(second)) = (path(0), path(1)) else {
                continue;
            };
            if first != second {
                Self::scan(h, &first, &mut ranges);
            }
        }
        ranges.sort_by_key(|r| r.0);
        FirstFileRows { ranges }
    }

    /// Add the ranges of the rows before each sequence's first file change in the program of `h`.
    fn scan(
        h: &gimli::LineProgramHeader<Reader<'_>>,
        file: &str,
        ranges: &mut Vec<(u64, u64, String)>,
    ) {
        let step = u64::from(h.minimum_instruction_length());
        let advance = |opcode: u8| u64::from(opcode.wrapping_sub(h.opcode_base()) / h.line_range());
        let (mut address, mut file_set, mut first_row) = (0u64, false, None::<u64>);
        let mut close = |first_row: &mut Option<u64>, end: u64| {
            if let Some(start) = first_row.take()
                && start < end
            {
                ranges.push((start, end, file.to_string()));
            }
        };
        let mut instructions = h.instructions();
        while let Ok(Some(instruction)) = instructions.next_instruction(h) {
            let row = match instruction {
                gimli::LineInstruction::Special(opcode) => {
                    address = address.wrapping_add(step.wrapping_mul(advance(opcode)));
                    true
                }
                gimli::LineInstruction::Copy => true,
                gimli::LineInstruction::AdvancePc(n) => {
                    address = address.wrapping_add(step.wrapping_mul(n));
                    false
                }
                gimli::LineInstruction::ConstAddPc => {
                    address = address.wrapping_add(step.wrapping_mul(advance(255)));
                    false
                }
                gimli::LineInstruction::FixedAddPc(n) => {
                    address = address.wrapping_add(u64::from(n));
                    false
                }
                gimli::LineInstruction::SetAddress(a) => {
                    address = a;
                    false
                }
                gimli::LineInstruction::SetFile(_) => {
                    file_set = true;
                    false
                }
                gimli::LineInstruction::EndSequence => {
                    close(&mut first_row, address);
                    (address, file_set) = (0, false);
                    false
                }
                _ => false,
            };
            if row && !file_set {
                first_row.get_or_insert(address);
            } else if row {
                close(&mut first_row, address);
            }
        }
    }

    /// The file BFD names at `addr`, where it differs from the line table's.
    pub fn file_at(&self, addr: u64) -> Option<&str> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= addr)
            .checked_sub(1)?;
        let (_, end, file) = &self.ranges[i];
        (addr < *end).then_some(file.as_str())
    }
}

/// BFD's source position of `addr`: the line table's file and line, with [`FirstFileRows`]' file.
pub fn source_position(
    ctx: &Context<'_>,
    first_rows: &FirstFileRows,
    addr: u64,
) -> Option<(String, u32)> {
    let loc = ctx.find_location(addr).ok()??;
    let (file, line) = (loc.file?, loc.line?);
    let file = first_rows.file_at(addr).unwrap_or(file);
    Some((file.to_string(), line))
}

/// Whether BFD's function names in a unit of `language` are its linkage names (`mangle_style` is 0):
/// C, Fortran 77, Pascal, PL/I, Cobol, UPC and assembler. For other languages only a
/// `DW_AT_linkage_name` is one.
fn names_are_linkage_names(language: Option<gimli::DwLang>) -> bool {
    use gimli::constants::*;
    language.is_some_and(|l| {
        [
            DW_LANG_C89,
            DW_LANG_C,
            DW_LANG_Cobol74,
            DW_LANG_Cobol85,
            DW_LANG_Fortran77,
            DW_LANG_Pascal83,
            DW_LANG_PLI,
            DW_LANG_C99,
            DW_LANG_UPC,
            DW_LANG_C11,
            DW_LANG_Mips_Assembler,
            // DW_LANG_Upc, DW_LANG_HP_Basic91, DW_LANG_HP_IMacro, DW_LANG_HP_Assembler (binutils'
            // dwarf2.h; gimli does not name them).
            gimli::DwLang(0x8765),
            gimli::DwLang(0x8004),
            gimli::DwLang(0x8006),
            gimli::DwLang(0x8007),
        ]
        .contains(&l)
    })
}

/// What BFD knows of the function DIE at `offset`: whether a `DW_AT_linkage_name` names it (on the DIE
/// itself or the DIEs it refers to by `DW_AT_abstract_origin` or `DW_AT_specification`), and the start
/// of its first address range.
fn die_facts(
    unit: gimli::UnitRef<'_, Reader<'_>>,
    offset: gimli::UnitOffset,
) -> (bool, Option<u64>) {
    let first_range = unit
        .entry(offset)
        .ok()
        .and_then(|e| unit.die_ranges(&e).ok()?.next().ok()?)
        .map(|r| r.begin);
    let mut next = Some(offset);
    for _ in 0..8 {
        let Some(Ok(entry)) = next.map(|o| unit.entry(o)) else {
            break;
        };
        next = None;
        let mut attrs = entry.attrs();
        while let Ok(Some(attr)) = attrs.next() {
            match (attr.name(), attr.value()) {
                (gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name, _) => {
                    return (true, first_range);
                }
                (
                    gimli::DW_AT_abstract_origin | gimli::DW_AT_specification,
                    gimli::AttributeValue::UnitRef(o),
                ) => next = Some(o),
                _ => {}
            }
        }
    }
    (false, first_range)
}

/// The function name BFD gives each address, with the state BFD keeps between questions.
///
/// gprof's `core_create_line_syms` walks `.text` twice, counting symbols and then making them, and BFD
/// changes its answers in between: the first question about a function that has no linkage name
/// (`main` in C++) is answered with the ELF symbol's name and settles the name BFD gives it from then on,
/// which is what the symbols made in the second walk carry. So the names given here are the second
/// walk's, with the first walk's questions to `_bfd_elf_find_function` asked too (its cache sees both).
struct FunctionNames<'n> {
    /// `_bfd_elf_find_function` as the first walk asks it.
    first: &'n mut NearestFunction,
    /// `_bfd_elf_find_function` as the second walk asks it.
    second: NearestFunction,
    /// Functions named by `DW_AT_name` alone in a language whose names are not linkage names, once asked
    /// about (by unit and DIE): the name BFD keeps for them.
    settled: HashMap<(gimli::UnitSectionOffset, gimli::UnitOffset), String>,
}

impl FunctionNames<'_> {
    /// BFD's function name for `addr` (`_bfd_dwarf2_find_nearest_line`) in gprof's second walk: the
    /// best-fitting DWARF function's when that is a linkage name; the ELF symbol's where DWARF has no
    /// function (`_bfd_elf_find_function`). A function without a linkage name is named by the ELF symbol
    /// BFD found for it at the first question if that symbol starts where the function's first range
    /// does, by its own name otherwise.
    fn name(&mut self, ctx: &Context<'_>, addr: u64) -> Option<String> {
        let frame = match ctx.find_frames(addr).skip_all_loads() {
            Ok(mut frames) => frames.next().ok().flatten(),
            Err(_) => None,
        };
        let Some((function, die)) = frame.and_then(|f| Some((f.function?, f.dw_die_offset))) else {
            self.first.find(addr);
            return self.second.find(addr).map(str::to_string);
        };
        let own = function.raw_name().ok()?.into_owned();
        if names_are_linkage_names(function.language) {
            return Some(own);
        }
        let unit = ctx.find_dwarf_and_unit(addr).skip_all_loads();
        let (Some(unit), Some(offset)) = (unit, die) else {
            return Some(own);
        };
        let key = (unit.header.offset(), offset);
        if let Some(settled) = self.settled.get(&key) {
            return Some(settled.clone());
        }
        let (linkage, first_range) = die_facts(unit, offset);
        let elf = if linkage {
            None
        } else {
            self.first.find(addr).map(str::to_string)
        };
        let name = match elf {
            Some(elf) if self.first.cached_addr() == first_range => elf,
            _ => own,
        };
        self.settled.insert(key, name.clone());
        Some(name)
    }
}

/// BFD's `get_src_info` for one address: function name, file and (non-zero) line. The name is asked for
/// first, whatever the line, as BFD looks the function up for every address.
fn source_of(
    ctx: &Context<'_>,
    names: &mut FunctionNames<'_>,
    first_rows: &FirstFileRows,
    addr: u64,
) -> Option<(String, String, u32)> {
    let name = names.name(ctx, addr);
    let (file, line) = source_position(ctx, first_rows, addr)?;
    if line == 0 {
        return None;
    }
    Some((name?, file, line))
}

/// The function symbol whose range holds `addr` (gprof's `sym_lookup`).
fn containing(funcs: &[FunctionSymbol], addr: LinkAddress) -> Option<&FunctionSymbol> {
    let i = funcs.partition_point(|s| s.addr <= addr).checked_sub(1)?;
    let s = &funcs[i];
    (addr <= s.end_addr).then_some(s)
}

/// The line symbols of `text` (the range gprof walks, usually `.text`), in address order. `funcs` are the
/// module's finalized function symbols: they give a line symbol its static flag. `nearest` names the
/// addresses DWARF gives no function for, as BFD does.
pub fn line_symbols(
    ctx: &Context<'_>,
    funcs: &[FunctionSymbol],
    nearest: &mut NearestFunction,
    first_rows: &FirstFileRows,
    text: std::ops::Range<u64>,
    function_boundaries: &[u64],
) -> Vec<FunctionSymbol> {
    let mut starts: Vec<u64> = function_boundaries
        .iter()
        .copied()
        .chain(nearest.boundaries())
        .filter(|a| text.contains(a))
        .collect();
    if let Ok(rows) = ctx.find_location_range(text.start, text.end) {
        starts.extend(rows.map(|(addr, _, _)| addr.max(text.start)));
    }
    starts.extend(funcs.iter().map(|f| f.addr.0).filter(|a| text.contains(a)));
    starts.push(text.start);
    starts.sort_unstable();
    starts.dedup();
    let mut names = FunctionNames {
        second: nearest.clone(),
        first: nearest,
        settled: HashMap::new(),
    };
    let mut out: Vec<FunctionSymbol> = Vec::new();
    for addr in starts {
        let Some((name, file, line)) = source_of(ctx, &mut names, first_rows, addr) else {
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
