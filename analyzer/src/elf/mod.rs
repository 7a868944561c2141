//! Reading the profiled binaries: ELF symbol tables, their bounds and file map, DWARF lines, and where a
//! module's file is found (`binpath`). Uses only the crate's `sys` and `qsort`; the analyses and reports
//! build on it.

pub mod binpath;
pub mod bounds;
pub mod filemap;
pub mod lines;
pub mod nearest_function;
pub mod symbols;
pub mod symtab;
