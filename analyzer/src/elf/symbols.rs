//! Function symbols of one ELF module, selected the way GNU gprof selects them, sorted by address and
//! with duplicates at one address resolved as gprof does, so reports match gprof's line for line.
//!
//! Selection (gprof's `core_sym_class` over BFD's symbol classes): a defined symbol qualifies when it is
//! a global or weak text symbol (weak symbols of any section that are not data objects count as text),
//! or a local text symbol whose name is non-empty, has no `$`, and uses `.` only for numeric suffixes
//! (`foo.123`, `foo.constprop.0`, `foo.clone.3`; so `foo.cold` and `foo.part.0` are not functions of
//! their own: their addresses fall to the symbol before them, as in gprof). File and section symbols,
//! undefined, common and absolute symbols, indirect functions and GNU-unique symbols do not qualify.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSymbol, SectionFlags, SymbolFlags, SymbolSection};

pub use crate::elf::symtab::{FunctionSymbol, LinkAddress, finalize};

/// What was read from one module's ELF file.
#[derive(Clone, Debug, Default)]
pub struct ModuleSymbols {
    /// Sorted by address, one symbol per address, `end_addr` set.
    pub symbols: Vec<FunctionSymbol>,
    /// GNU build-id of the ELF file, if it has one.
    pub build_id: Option<Vec<u8>>,
    /// True when only `.dynsym` was available (the module's symbol table is stripped).
    pub dynamic_only: bool,
    pub big_endian: bool,
    pub address_size: u8,
    /// Where the symbols came from when a separate debug file was used.
    pub debug_file: Option<PathBuf>,
    /// The source files of the symbols, in the order gprof keeps them (its `first_src_file` list: most
    /// recently seen first, seen in symbol-table order, then, with `-l`, in line-symbol order).
    pub source_files: Vec<String>,
    /// True when the module imports one of [`COUNTING_IMPORTS`] (built with -pg, -mfentry or
    /// -finstrument-functions): its functions count their own calls. Calls into any other module can only
    /// have been counted at the PLT (runtime/README.md, "Calls through the PLT").
    pub counts_own_calls: bool,
}

/// Imports of a module whose functions count their own calls.
pub const COUNTING_IMPORTS: [&str; 4] = [
    "mcount",
    "_mcount",
    "__fentry__",
    "__cyg_profile_func_enter",
];

/// Options that change which symbols are kept.
#[derive(Clone, Copy, Debug, Default)]
pub struct SelectOptions {
    /// `-a`: drop local (static) symbols.
    pub no_static: bool,
    /// `-D`: drop static symbols that are not marked as functions.
    pub ignore_non_functions: bool,
    /// mslprof's own rule for multi-module reports: also keep compiler-split parts of functions
    /// (`foo.cold`, `foo.part.0`, `foo.isra.0`, …) as functions of their own, so their samples are not
    /// credited to whatever function happens to precede them, and let the last function of a module
    /// reach the end of its executable sections (BOLT-processed libraries have several).
    pub keep_split_parts: bool,
    /// `-l`: add one symbol per source line (see [`crate::elf::lines`]).
    pub lines: bool,
    /// mslprof's rule for multi-module reports: a function covers only its own bytes; PLT stubs, functions
    /// known from unwind tables and unknown ranges get rows of their own (see [`crate::elf::bounds`]).
    pub exact_bounds: bool,
}

/// Which symbols get their source file and line from the DWARF line tables (gprof's `get_src_info`).
#[derive(Clone, Copy, Debug, Default)]
pub enum SourcesWanted<'a> {
    /// Every symbol: what `-A`, `-C`, `-l`, file symspecs, orderings and the exports read.
    #[default]
    Every,
    /// Only static functions that overlap one of these link-time ranges `[start, end)` (sorted, disjoint:
    /// where the module's samples are and the entries of its functions that were called): a report prints a
    /// file name for no other function (its index lists functions with samples or calls and names the file
    /// of a static one), so a module whose printed functions are all global has its line tables not read at
    /// all (a libc's separate debug file holds megabytes of them).
    StaticOverlapping(&'a [(u64, u64)]),
}

/// Failure to use a module's file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SymbolError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not in executable format: {0}")]
    NotElf(String),
    #[error("has no symbols")]
    NoSymbols,
}

/// BFD's one-letter section type for a symbol's section: `t` for text, anything else is not text.
fn section_is_text(name: &str, flags: SectionFlags) -> bool {
    const TABLE: &[(&str, bool)] = &[
        ("*DEBUG*", false),
        (".bss", false),
        ("zerovars", false),
        (".data", false),
        ("vars", false),
        (".rdata", false),
        (".rodata", false),
        (".sbss", false),
        (".scommon", false),
        (".sdata", false),
        (".text", true),
        ("code", true),
        (".drectve", false),
        (".edata", false),
        (".idata", false),
        (".pdata", false),
    ];
    for (prefix, text) in TABLE {
        if let Some(rest) = name.strip_prefix(prefix) {
            let next = rest.bytes().next();
            if next.is_none_or(|b| b == b'.' || b == b'$' || b.is_ascii_digit()) {
                return *text;
            }
        }
    }
    match flags {
        SectionFlags::Elf { sh_flags } => sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0,
        _ => false,
    }
}

/// gprof's filter on local symbol names, applied to the name as it sits in the string table: `strtab`
/// starts at the name and runs to the end of the loaded data (bytes past it read as NUL).
///
/// gprof 2.40 steps one byte past the terminating NUL when a name ends in an accepted `.digits` suffix
/// (`foo.constprop.0`), so it goes on to judge the *next* string of the string table as well: a name like
/// `foo.constprop.0` followed in `.strtab` by `bar.isra.0` is rejected. This reproduces that walk.
fn static_name_ok_in(strtab: &[u8]) -> bool {
    let at = |i: usize| strtab.get(i).copied().unwrap_or(0);
    let strlen = |i: usize| (i..).take_while(|&k| at(k) != 0).count();
    if at(0) == 0 {
        return false;
    }
    let mut i = 0usize;
    // Bounded: every step advances `i`, and bytes past the end read as NUL, which stops the walk.
    while at(i) != 0 {
        if at(i) == b'$' {
            return false;
        }
        while at(i) == b'.' {
            let mut digit_seen = false;
            let rest = &strtab[i.min(strtab.len())..];
            if strlen(i) > 7 && rest.starts_with(b".clone.") {
                i += 6;
            } else if strlen(i) > 11 && rest.starts_with(b".constprop.") {
                i += 10;
            }
            i += 1;
            while at(i) != 0 {
                let c = at(i);
                if digit_seen && c == b'.' {
                    break;
                } else if c.is_ascii_digit() {
                    digit_seen = true;
                } else {
                    return false;
                }
                i += 1;
            }
        }
        i += 1;
    }
    !strtab.starts_with(b"__gnu_compiled") && !strtab.starts_with(b"___gnu_compiled")
}

/// The same filter for a lone name (no string table after it).
#[cfg(test)]
fn static_name_ok(name: &str) -> bool {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    static_name_ok_in(&v)
}

/// Classify one symbol: `Some(is_static)` when gprof keeps it.
fn classify<'d, S: ObjectSymbol<'d>>(
    file: &object::File<'d>,
    data: &'d [u8],
    sym: &S,
    opts: SelectOptions,
) -> Option<bool> {
    let (st_info, _) = match sym.flags() {
        SymbolFlags::Elf { st_info, st_other } => (st_info, st_other),
        _ => return None,
    };
    let st_type = st_info & 0xf;
    let st_bind = st_info >> 4;
    if st_type == object::elf::STT_FILE || st_type == object::elf::STT_SECTION {
        return None;
    }
    let is_local = st_bind == object::elf::STB_LOCAL;
    if opts.no_static && is_local {
        return None;
    }
    let section_index = match sym.section() {
        SymbolSection::Section(i) => Some(i),
        SymbolSection::Absolute => None,
        _ => return None,
    };
    if st_type == object::elf::STT_GNU_IFUNC {
        return None;
    }
    if st_bind == object::elf::STB_WEAK {
        return if st_type == object::elf::STT_OBJECT {
            None
        } else {
            Some(false)
        };
    }
    if st_bind == object::elf::STB_GNU_UNIQUE {
        return None;
    }
    if st_bind != object::elf::STB_LOCAL && st_bind != object::elf::STB_GLOBAL {
        return None;
    }
    let section = file.section_by_index(section_index?).ok()?;
    let section_name = section.name().unwrap_or("");
    if !section_is_text(section_name, section.flags()) {
        return None;
    }
    if !is_local {
        return Some(false);
    }
    let name = sym.name_bytes().ok()?;
    // The string table bytes from this name on, when the name lies in the loaded file.
    let base = data.as_ptr() as usize;
    let p = name.as_ptr() as usize;
    let ok = if p >= base && p + name.len() <= base + data.len() {
        static_name_ok_in(&data[p - base..])
    } else {
        let mut v = name.to_vec();
        v.push(0);
        static_name_ok_in(&v)
    };
    let split_part = opts.keep_split_parts
        && st_type == object::elf::STT_FUNC
        && !name.is_empty()
        && !name.contains(&b'$');
    if !ok && !split_part {
        return None;
    }
    if opts.ignore_non_functions && st_type != object::elf::STT_FUNC {
        return None;
    }
    Some(true)
}

/// The GNU build-id of an ELF file.
pub fn build_id_of(file: &object::File<'_>) -> Option<Vec<u8>> {
    file.build_id().ok().flatten().map(|b| b.to_vec())
}

/// `bytes` in lower-case hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Candidate separate debug files for a module: by build-id, then by `.gnu_debuglink`.
pub fn debug_file_candidates(path: &Path, file: &object::File<'_>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(id) = build_id_of(file)
        && id.len() > 1
    {
        out.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            hex(&id[..1]),
            hex(&id[1..])
        )));
    }
    if let Ok(Some((name, _crc))) = file.gnu_debuglink() {
        let name = String::from_utf8_lossy(name).into_owned();
        let dir = path.parent().unwrap_or(Path::new("."));
        out.push(dir.join(&name));
        out.push(dir.join(".debug").join(&name));
        let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let rel = abs.strip_prefix("/").unwrap_or(&abs);
        out.push(Path::new("/usr/lib/debug").join(rel).join(&name));
    }
    out
}

fn collect<'d>(
    file: &object::File<'d>,
    data: &'d [u8],
    dynamic: bool,
    opts: SelectOptions,
) -> Vec<FunctionSymbol> {
    let mut out = Vec::new();
    let iter: Box<dyn Iterator<Item = object::Symbol<'d, '_>>> = if dynamic {
        Box::new(file.dynamic_symbols())
    } else {
        Box::new(file.symbols())
    };
    for sym in iter {
        let Some(is_static) = classify(file, data, &sym, opts) else {
            continue;
        };
        let name = sym.name().unwrap_or("");
        let name = if dynamic {
            name.split('@').next().unwrap_or(name)
        } else {
            name
        };
        let is_func = matches!(sym.flags(), SymbolFlags::Elf { st_info, .. } if st_info & 0xf == object::elf::STT_FUNC);
        out.push(FunctionSymbol {
            name: name.to_string(),
            addr: LinkAddress(sym.address()),
            end_addr: LinkAddress(0),
            is_func,
            is_static,
            file: None,
            line: 0,
            mapped: false,
            size: sym.size(),
            synthetic: false,
        });
    }
    out
}

fn text_end_of(file: &object::File<'_>, opts: SelectOptions) -> LinkAddress {
    let last = if opts.keep_split_parts {
        file.sections()
            .filter(|s| {
                matches!(s.flags(), SectionFlags::Elf { sh_flags } if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
            })
            .map(|s| (s.address() + s.size()).wrapping_sub(1))
            .max()
    } else {
        file.section_by_name(".text")
            .map(|s| (s.address() + s.size()).wrapping_sub(1))
    };
    LinkAddress(last.unwrap_or(0))
}

/// Add the files of `syms` not in `files` yet, in the order of `syms`.
fn add_source_files(files: &mut Vec<String>, syms: &[FunctionSymbol]) {
    let mut seen: std::collections::HashSet<String> = files.iter().cloned().collect();
    for f in syms.iter().filter_map(|s| s.file.as_ref()) {
        if seen.insert(f.clone()) {
            files.push(f.clone());
        }
    }
}

/// Fill in source file and line of each symbol from DWARF line tables, as gprof's `get_src_info` does;
/// returns the files in the order they were first seen.
fn attach_sources(
    file: &object::File<'_>,
    syms: &mut [FunctionSymbol],
    wanted: SourcesWanted<'_>,
) -> Vec<String> {
    let wanted = sources_wanted(syms, wanted);
    if !wanted.contains(&true) {
        return Vec::new();
    }
    crate::elf::lines::with_dwarf_and_first_rows(file, |ctx, first_rows| {
        for (s, _) in syms.iter_mut().zip(&wanted).filter(|(_, w)| **w) {
            if let Some((f, l)) = crate::elf::lines::source_position(ctx, first_rows, s.addr.0)
                && l != 0
            {
                s.file = Some(f);
                s.line = l;
            }
        }
    });
    let mut files = Vec::new();
    add_source_files(&mut files, syms);
    files
}

/// Which of `syms` get a source position (see [`SourcesWanted`]). A symbol's extent here, before the table is
/// finalized, reaches the next symbol's start (or its own size, if longer), as the report's rows may.
fn sources_wanted(syms: &[FunctionSymbol], wanted: SourcesWanted<'_>) -> Vec<bool> {
    let SourcesWanted::StaticOverlapping(ranges) = wanted else {
        return vec![true; syms.len()];
    };
    let mut starts: Vec<u64> = syms.iter().map(|s| s.addr.0).collect();
    starts.sort_unstable();
    // A static symbol at the address of a global one is never printed: the table keeps the global name
    // (`symtab::finalize`).
    let global: std::collections::HashSet<u64> = syms
        .iter()
        .filter(|s| !s.is_static)
        .map(|s| s.addr.0)
        .collect();
    syms.iter()
        .map(|s| {
            if !s.is_static || global.contains(&s.addr.0) {
                return false;
            }
            let next = starts
                .get(starts.partition_point(|&a| a <= s.addr.0))
                .copied()
                .unwrap_or(u64::MAX);
            let end = next.max(s.addr.0.saturating_add(s.size.max(1)));
            let first = ranges.partition_point(|&(_, range_end)| range_end <= s.addr.0);
            ranges.get(first).is_some_and(|&(start, _)| start < end)
        })
        .collect()
}

/// `-l`: finalize the function symbols, then add the line symbols of `.text` from the DWARF of `dwarf`
/// (the module itself or its separate debug file) and finalize the whole table, as gprof does.
fn with_line_symbols(
    dwarf: &object::File<'_>,
    module: &object::File<'_>,
    funcs: Vec<FunctionSymbol>,
    text_end: LinkAddress,
) -> Vec<FunctionSymbol> {
    let funcs = finalize(funcs, text_end);
    let Some(text) = module
        .section_by_name(".text")
        .map(|s| s.address()..s.address() + s.size())
    else {
        return funcs;
    };
    let functions = crate::elf::lines::function_boundaries(dwarf);
    // gprof's symbols are the module's; a stripped module's are in its debug file.
    let symbol_file = if module.symbols().next().is_some() {
        module
    } else {
        dwarf
    };
    let mut nearest = crate::elf::nearest_function::NearestFunction::new(symbol_file);
    let first_rows = crate::elf::lines::FirstFileRows::new(dwarf);
    let Some(mut all) = crate::elf::lines::with_dwarf(dwarf, |ctx| {
        crate::elf::lines::line_symbols(ctx, &funcs, &mut nearest, &first_rows, text, &functions)
    }) else {
        return funcs;
    };
    all.extend(funcs);
    finalize(all, text_end)
}

/// The first separate debug file of the module at `path` (by build-id, then `.gnu_debuglink`; one whose
/// build-id differs is skipped) for which `f` gives a value.
fn first_debug_file<T>(
    path: &Path,
    file: &object::File<'_>,
    mut f: impl for<'d> FnMut(&Path, &'d [u8], &object::File<'d>) -> Option<T>,
) -> Option<T> {
    let build_id = build_id_of(file);
    for cand in debug_file_candidates(path, file) {
        let Ok(dmap) = crate::sys::map_file(&cand) else {
            continue;
        };
        let ddata: &[u8] = &dmap;
        let Ok(dfile) = object::File::parse(ddata) else {
            continue;
        };
        if build_id.is_some() && build_id_of(&dfile).is_some() && build_id_of(&dfile) != build_id {
            continue;
        }
        if let Some(v) = f(&cand, ddata, &dfile) {
            return Some(v);
        }
    }
    None
}

/// Run `f` over the separate debug file of the module at `path` that has DWARF line tables, if any.
pub(crate) fn with_debug_file<T>(
    path: &Path,
    file: &object::File<'_>,
    f: impl FnOnce(&object::File<'_>) -> T,
) -> Option<T> {
    let mut f = Some(f);
    first_debug_file(path, file, |_, _, dfile| {
        dfile.section_by_name(".debug_line")?;
        f.take().map(|f| f(dfile))
    })
}

/// Read and select the function symbols of the ELF file at `path`.
pub fn load(path: &Path, opts: SelectOptions) -> Result<ModuleSymbols, SymbolError> {
    load_mapped(path, opts, None, SourcesWanted::Every)
}

/// [`load`], with `-R`'s function-to-file map applied before the table is finalized, and source positions for
/// the symbols `sources` asks for.
pub fn load_mapped(
    path: &Path,
    opts: SelectOptions,
    map: Option<&crate::elf::filemap::FileMap>,
    sources: SourcesWanted<'_>,
) -> Result<ModuleSymbols, SymbolError> {
    let data = crate::sys::map_file(path)?;
    let data: &[u8] = &data;
    let file = object::File::parse(data).map_err(|e| SymbolError::NotElf(e.to_string()))?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(SymbolError::NotElf("not an ELF file".into()));
    }
    let build_id = build_id_of(&file);
    let big_endian = !file.is_little_endian();
    let address_size = if file.is_64() { 8 } else { 4 };
    let text_end = text_end_of(&file, opts);
    let has_symtab = file.symbols().next().is_some();
    let counts_own_calls = file.dynamic_symbols().any(|symbol| {
        symbol.is_undefined()
            && symbol
                .name()
                .is_ok_and(|name| COUNTING_IMPORTS.contains(&name))
    });
    let module = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let found = |syms: Vec<FunctionSymbol>,
                 dynamic_only: bool,
                 debug_file: Option<PathBuf>,
                 mut source_files: Vec<String>| {
        let syms = match map {
            Some(m) => m.apply(syms),
            None => syms,
        };
        let syms = if opts.exact_bounds {
            crate::elf::bounds::layout(&file, syms, &module)
        } else {
            finalize(syms, text_end)
        };
        add_source_files(&mut source_files, &syms);
        source_files.reverse();
        ModuleSymbols {
            source_files,
            symbols: syms,
            build_id: build_id.clone(),
            dynamic_only,
            big_endian,
            address_size,
            debug_file,
            counts_own_calls,
        }
    };
    if has_symtab {
        let mut syms = collect(&file, data, false, opts);
        if syms.is_empty() && !opts.exact_bounds {
            return Err(SymbolError::NoSymbols);
        }
        let mut files = Vec::new();
        if file.section_by_name(".debug_line").is_some() {
            files = attach_sources(&file, &mut syms, sources);
            if opts.lines {
                syms = with_line_symbols(&file, &file, syms, text_end);
            }
        } else if let Some(s) = with_debug_file(path, &file, |dfile| {
            files = attach_sources(dfile, &mut syms, sources);
            if opts.lines {
                with_line_symbols(dfile, &file, std::mem::take(&mut syms), text_end)
            } else {
                std::mem::take(&mut syms)
            }
        }) {
            syms = s;
        }
        return Ok(found(syms, false, None, files));
    }
    if let Some(found_in_debug) = first_debug_file(path, &file, |cand, ddata, dfile| {
        let mut syms = collect(dfile, ddata, false, opts);
        if syms.is_empty() {
            return None;
        }
        let files = attach_sources(dfile, &mut syms, sources);
        if opts.lines {
            syms = with_line_symbols(dfile, &file, syms, text_end);
        }
        Some(found(syms, false, Some(cand.to_path_buf()), files))
    }) {
        return Ok(found_in_debug);
    }
    let syms = collect(&file, data, true, opts);
    if syms.is_empty() && !opts.exact_bounds {
        return Err(SymbolError::NoSymbols);
    }
    Ok(found(syms, true, None, Vec::new()))
}

/// How names are demangled for printing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Demangle {
    #[default]
    Auto,
    Gnu,
    Rust,
    None,
}

impl Demangle {
    pub fn from_style(style: &str) -> Option<Demangle> {
        match style {
            "auto" | "gnu-v3" | "gnu" | "java" | "gnat" | "dlang" => Some(Demangle::Gnu),
            "rust" => Some(Demangle::Rust),
            "none" => Some(Demangle::None),
            _ => None,
        }
    }
}

/// The printable form of a symbol name.
pub fn demangle(name: &str, style: Demangle) -> String {
    if style == Demangle::None {
        return name.to_string();
    }
    // GNU binutils' own demangler, when installed, gives gprof's names exactly (including its quirks). Loading
    // it costs a few milliseconds, so it is loaded only once a name could be mangled at all: bfd_demangle
    // (libiberty's auto style) leaves every other name as it is.
    if style == Demangle::Auto && !may_be_mangled(name) {
        return name.to_string();
    }
    if style == Demangle::Auto && crate::sys::have_bfd_demangler() {
        return crate::sys::bfd_demangle(name).unwrap_or_else(|| name.to_string());
    }
    demangle_without_bfd(name, style)
}

/// Whether libiberty's auto style could demangle `name`: Rust (`_R`, `__R`, legacy `_ZN`), the C++ v3 ABI
/// (`_Z`) and its `_GLOBAL_` constructor/destructor names, after the one leading `.` that bfd_demangle skips.
fn may_be_mangled(name: &str) -> bool {
    let n = name.strip_prefix('.').unwrap_or(name);
    ["_Z", "_R", "__R", "_GLOBAL_"]
        .iter()
        .any(|p| n.starts_with(p))
}

/// The demanglers used when libbfd is absent (or a style other than gprof's default is asked for):
/// rustc-demangle for Rust names, then libstdc++'s `__cxa_demangle` (if installed), then cpp_demangle.
fn demangle_without_bfd(name: &str, style: Demangle) -> String {
    if (name.starts_with("_R") || (name.starts_with("_ZN") && style != Demangle::Gnu))
        && let Ok(d) = rustc_demangle::try_demangle(name)
    {
        let legacy_rust = name.starts_with("_R") || {
            let s = format!("{d}");
            s.rsplit("::").next().is_some_and(|h| {
                h.len() == 17 && h.starts_with('h') && h[1..].bytes().all(|b| b.is_ascii_hexdigit())
            })
        };
        if legacy_rust {
            return format!("{d:#}");
        }
    }
    if style == Demangle::Rust {
        return name.to_string();
    }
    if name.starts_with("_Z")
        && let Some(d) = crate::sys::cxa_demangle(name)
    {
        return d;
    }
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(s) = sym.demangle(&cpp_demangle::DemangleOptions::default())
    {
        return s;
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn symbol(name: &str, addr: u64, size: u64, is_static: bool) -> FunctionSymbol {
        FunctionSymbol {
            name: name.into(),
            addr: LinkAddress(addr),
            is_func: true,
            is_static,
            size,
            ..FunctionSymbol::default()
        }
    }

    #[test]
    fn sources_are_wanted_for_printed_static_functions_only_unless_every_one_is() {
        let syms = [
            symbol("used_static", 0x100, 0x10, true),
            symbol("unused_static", 0x200, 0x10, true),
            symbol("global", 0x300, 0x10, false),
            symbol("alias_of_global", 0x300, 0x10, true),
            // No size: reaches the next symbol, where the sample is.
            symbol("sizeless_static", 0x400, 0, true),
            symbol("last", 0x500, 0x10, false),
        ];
        let used = [(0x104, 0x105), (0x300, 0x301), (0x480, 0x490)];
        assert_eq!(
            sources_wanted(&syms, SourcesWanted::StaticOverlapping(&used)),
            [true, false, false, false, true, false]
        );
        assert_eq!(sources_wanted(&syms, SourcesWanted::Every), [true; 6]);
    }

    #[test]
    fn names_are_demangled_without_libbfd() {
        let cases = [
            ("_ZN3foo3barEv", Demangle::Auto, "foo::bar()"),
            ("_Z5greetPKc", Demangle::Gnu, "greet(char const*)"),
            (
                "_ZN4core3fmt5write17h0123456789abcdefE",
                Demangle::Auto,
                "core::fmt::write",
            ),
            ("_ZN3foo3barEv", Demangle::Rust, "_ZN3foo3barEv"),
            ("main", Demangle::Auto, "main"),
        ];
        for (name, style, want) in cases {
            assert_eq!(demangle_without_bfd(name, style), want, "{name} {style:?}");
        }
    }

    #[test]
    fn static_names_follow_gprof_rules() {
        assert!(static_name_ok("leaf"));
        assert!(static_name_ok("foo.123"));
        assert!(static_name_ok("foo.constprop.0"));
        assert!(static_name_ok("foo.clone.3"));
        assert!(!static_name_ok("foo.cold"));
        assert!(!static_name_ok("foo.part.0"));
        assert!(!static_name_ok("foo.isra.0"));
        assert!(!static_name_ok("a$b"));
        assert!(!static_name_ok(""));
        assert!(!static_name_ok("__gnu_compiled_c"));
        // gprof reads on into the next string-table entry after an accepted `.digits` suffix.
        assert!(!static_name_ok_in(b"sweep.constprop.0\0gen.isra.0\0"));
        assert!(static_name_ok_in(b"sweep.constprop.0\0dothecall\0"));
        assert!(static_name_ok_in(b"plain\0gen.isra.0\0"));
    }

    #[test]
    fn demangles_cpp_and_rust() {
        assert_eq!(demangle("_Z3fooi", Demangle::Auto), "foo(int)");
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE", Demangle::Auto),
            "core::fmt::write"
        );
        assert_eq!(demangle("_Z3fooi", Demangle::None), "_Z3fooi");
        assert_eq!(demangle("main", Demangle::Auto), "main");
    }

    fn sym(name: &str, addr: u64, is_func: bool, is_static: bool) -> FunctionSymbol {
        FunctionSymbol {
            name: name.into(),
            addr: LinkAddress(addr),
            end_addr: LinkAddress(0),
            is_func,
            is_static,
            ..FunctionSymbol::default()
        }
    }

    #[test]
    fn finalize_prefers_global_function_without_underscore() {
        let out = finalize(
            vec![
                sym("_alias", 0x10, true, false),
                sym("local", 0x10, true, true),
                sym("real", 0x10, true, false),
                sym("next", 0x20, true, false),
            ],
            LinkAddress(0x2f),
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].name, "real");
        assert_eq!(out[0].end_addr, LinkAddress(0x1f));
        assert_eq!(out[1].end_addr, LinkAddress(0x2f));
    }
}
