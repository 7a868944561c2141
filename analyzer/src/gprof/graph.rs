//! The process-wide symbol table the analysis works on: every selected function of every module, in
//! module order and then address order, plus one pseudo-symbol per cycle, and the call-graph arcs
//! between them. This mirrors the state GNU gprof keeps per symbol, so its algorithms apply unchanged.

use std::collections::HashMap;
use std::ops::Range;

use mslprof_format::LinkAddress;

use crate::elf::symtab::FunctionSymbol;

/// "No symbol" in the linked lists below.
pub const NONE: usize = usize::MAX;
/// Topological order of a symbol not yet visited.
pub const DFN_NAN: i64 = 0;
/// Topological order of a symbol on the depth-first stack or in an open cycle.
pub const DFN_BUSY: i64 = -1;

/// One function (or, with `is_cycle`, one cycle as a whole).
#[derive(Clone, Debug, Default)]
pub struct Sym {
    /// The function as the symbol table gives it (name mangled, link-time address); empty for a cycle.
    pub symbol: FunctionSymbol,
    /// Name as printed (demangled, module-qualified where ambiguous).
    pub display: String,
    /// `@module` suffix when the name alone is ambiguous across modules (empty otherwise).
    pub qualifier: String,
    pub module: usize,
    pub is_cycle: bool,

    pub scaled_addr: u64,
    /// Samples credited to this function (fractional).
    pub hist_time: f64,

    pub ncalls: u64,
    pub self_calls: u64,
    pub child_time: f64,
    pub prop_fract: f64,
    pub prop_self: f64,
    pub prop_child: f64,
    pub print_flag: bool,
    pub top_order: i64,
    pub cyc_num: u32,
    pub cyc_head: usize,
    pub cyc_next: usize,
    /// Call-graph index (1-based; 0 = none).
    pub index: usize,
    /// Arcs into this symbol, in the order they were first seen.
    pub parents: Vec<usize>,
    /// Arcs out of this symbol, in the order they were first seen.
    pub children: Vec<usize>,
}

impl Sym {
    /// The symbol-table name with its module qualifier (what BSD-style output prints).
    pub fn raw_display(&self) -> String {
        format!("{}{}", self.symbol.name, self.qualifier)
    }
}

/// One caller→callee arc between two symbols.
#[derive(Clone, Debug, Default)]
pub struct CgArc {
    pub parent: usize,
    pub child: usize,
    pub count: u64,
    pub time: f64,
    pub child_time: f64,
    /// Known only from sampled stacks: the calls along it were not counted (`count` is 0 and printed blank).
    pub stacks_only: bool,
}

/// A module as the analysis sees it.
#[derive(Clone, Debug, Default)]
pub struct ModuleView {
    /// Short name (file name, `a.out`-style for GNU input).
    pub name: String,
    /// Full path of the ELF file used for symbols (or the recorded one).
    pub path: String,
    /// Its symbols in [`Graph::syms`].
    pub syms: Range<usize>,
    /// Address unit of its histogram (GNU gprof scales addresses by 2-byte units).
    pub unit: u64,
    /// Emulate gprof's treatment of the table's last symbol (never credited with samples).
    pub gnu_last_symbol: bool,
    /// Samples that fell in this module (from the profile header, or counted).
    pub samples: u64,
    pub profiled: bool,
    /// Source files named by its symbols, in the order gprof lists them (see `ModuleSymbols`).
    pub source_files: Vec<String>,
    /// Its functions do not count their own calls: the calls they show were counted at the PLT, only
    /// those that entered them from other modules.
    pub plt_counted: bool,
    /// Not profiled, yet it holds arcs (format flag CALLEE_ARCS): the calls that profiled modules made into
    /// it through the PLT. Its functions that were called get entries (calls, no time: it has no histogram).
    pub callee_arcs: bool,
}

/// Symbols, arcs and modules of the whole process.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub syms: Vec<Sym>,
    /// Number of real symbols; cycle pseudo-symbols follow.
    pub nsyms: usize,
    pub arcs: Vec<CgArc>,
    pub arc_index: HashMap<(usize, usize), usize>,
    pub num_cycles: usize,
    pub modules: Vec<ModuleView>,
}

impl Graph {
    /// The symbol of `module` covering `addr`, as gprof's `sym_lookup` finds it.
    pub fn lookup(&self, module: usize, addr: LinkAddress) -> Option<usize> {
        let range = self.modules.get(module)?.syms.clone();
        let table = &self.syms[range.clone()];
        let pos = table.partition_point(|s| s.symbol.addr <= addr);
        if pos == 0 {
            return None;
        }
        let s = &table[pos - 1];
        if addr > s.symbol.end_addr {
            return None;
        }
        Some(range.start + pos - 1)
    }

    /// Add `count` calls along parent→child (gprof's `arc_add`).
    pub fn add_arc(&mut self, parent: usize, child: usize, count: u64) {
        if let Some(&a) = self.arc_index.get(&(parent, child)) {
            self.arcs[a].count += count;
            return;
        }
        let id = self.arcs.len();
        self.arcs.push(CgArc {
            parent,
            child,
            count,
            ..CgArc::default()
        });
        self.arc_index.insert((parent, child), id);
        self.syms[parent].children.push(id);
        self.syms[child].parents.push(id);
    }

    /// The cycle pseudo-symbol of cycle `num` (1-based).
    pub fn cycle(&self, num: usize) -> usize {
        self.nsyms + num - 1
    }
}
