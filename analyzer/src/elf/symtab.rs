//! One function symbol as the analysis keeps it, and gprof's rule for a module's table of them: sorted by
//! address, one symbol per address, each covering the addresses up to the next one. The symbol readers
//! (ELF symbols, DWARF lines, unwind-table bounds, `-R` maps) all produce and finalize these.

pub use mslprof_format::LinkAddress;

/// One selected symbol before analysis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionSymbol {
    pub name: String,
    /// Link-time address (the ELF `st_value`).
    pub addr: LinkAddress,
    /// Last address covered (inclusive), filled in by [`finalize`].
    pub end_addr: LinkAddress,
    /// ELF `STT_FUNC`.
    pub is_func: bool,
    /// Local binding.
    pub is_static: bool,
    /// Source file (from DWARF), when known.
    pub file: Option<String>,
    pub line: u32,
    /// `-R`: the symbol stands for an object file of the map (its name is the file's).
    pub mapped: bool,
    /// ELF `st_size` (0 when unknown).
    pub size: u64,
    /// Named by mslprof from its address (`fn_1a2b40`): always printed with its module.
    pub synthetic: bool,
}

/// Sort by address and keep one symbol per address as gprof's `symtab_finalize` does; set `end_addr`
/// where it is not set yet.
pub fn finalize(mut syms: Vec<FunctionSymbol>, text_end: LinkAddress) -> Vec<FunctionSymbol> {
    syms.sort_by(|l, r| {
        l.addr
            .cmp(&r.addr)
            .then_with(|| r.is_func.cmp(&l.is_func))
            .then_with(|| l.is_static.cmp(&r.is_static))
    });
    let mut out: Vec<FunctionSymbol> = Vec::with_capacity(syms.len());
    for src in syms {
        if let Some(last) = out.last_mut()
            && last.addr == src.addr
        {
            let s0 = src.name.as_bytes().first().copied().unwrap_or(0);
            let d0 = last.name.as_bytes().first().copied().unwrap_or(0);
            let s1 = src.name.as_bytes().get(1).copied().unwrap_or(0);
            let d1 = last.name.as_bytes().get(1).copied().unwrap_or(0);
            // Same address: prefer global over static, then function over non-function, then a name
            // without a leading underscore (or with one underscore over two).
            let fewer_underscores = d0 == b'_' && (s0 != b'_' || (s1 != b'_' && d1 == b'_'));
            let better = if src.is_static != last.is_static {
                !src.is_static
            } else if src.is_func != last.is_func {
                src.is_func
            } else {
                fewer_underscores
            };
            if better {
                *last = src;
            }
            continue;
        }
        if let Some(last) = out.last_mut()
            && last.end_addr == LinkAddress(0)
        {
            last.end_addr = src.addr.wrapping_sub(1);
        }
        // A symbol whose range was set by an earlier pass (function symbols under `-l`) is kept only if
        // that range is not empty, as in gprof.
        if src.end_addr == LinkAddress(0) || src.addr <= src.end_addr {
            out.push(src);
        }
    }
    if let Some(last) = out.last_mut()
        && last.end_addr == LinkAddress(0)
    {
        last.end_addr = text_end;
    }
    out
}

/// The flat-profile row of the profiler's own time (mslprof input).
pub const OVERHEAD_ROW: &str = "[mslprof_overhead]";
