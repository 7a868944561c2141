//! A loaded module's dynamic symbol table read in memory: which symbols it defines and which it imports.
//!
//! Shared by the audit module (which decides from it which bindings to redirect) and the runtime (which
//! includes this file with `#[path]` to know which unselected modules are reached only through the audit's
//! stubs), so that both apply the one rule of [`DynamicSymbols::plt_role`]. Only `core`/`std` and raw reads: nothing
//! here allocates or calls libc.

use std::ffi::{CStr, c_char};

/// Imports that mark a module whose functions count their own calls (built with -pg, -mfentry or
/// -finstrument-functions).
pub const COUNTING_IMPORTS: [&[u8]; 4] = [
    b"mcount",
    b"_mcount",
    b"__fentry__",
    b"__cyg_profile_func_enter",
];

/// What a module is to PLT counting, from its dynamic symbols (the vDSO, which has no file name the audit
/// module can rely on, is told apart by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PltRole {
    /// ld.so (it defines `_rtld_global`, whatever its file is called): nothing is redirected into or out of it.
    DynamicLinker,
    /// libmslprof.so (it defines `mslprof_plt_entry` and `mslprof_plt_abi`): the run-time address of its
    /// counting entry, and of `mslprof_plt_arena` where the stubs' arena is announced to it (0 if it has
    /// none). Its own calls are never counted and nothing is redirected into it.
    Runtime { entry: usize, arena: usize },
    /// It imports one of [`COUNTING_IMPORTS`]: mcount counts calls into it, so only its calls out go through
    /// the stubs.
    CountsItself,
    /// Anything else: calls into it are counted by the audit module's stubs.
    CountedAtThePlt,
}

/// `Elf64_Dyn`.
#[repr(C)]
pub struct Elf64Dyn {
    d_tag: i64,
    d_val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
pub struct Elf64Sym {
    st_name: u32,
    pub st_info: u8,
    st_other: u8,
    st_shndx: u16,
    pub st_value: u64,
    st_size: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const SHN_UNDEF: u16 = 0;

/// A loaded module's dynamic symbol table.
pub struct DynamicSymbols {
    base: usize,
    symbols: &'static [Elf64Sym],
    strings: *const c_char,
    /// The hash tables ld.so looks names up in (the GNU one when there are both).
    gnu_hash: Option<GnuHash>,
    sysv_hash: Option<SysvHash>,
}

/// A module's `DT_GNU_HASH` table, as run-time addresses of its parts.
#[derive(Clone, Copy)]
struct GnuHash {
    buckets: *const u32,
    bucket_count: usize,
    /// `chains[i - symoffset]` is the hash of symbol `i` (low bit: the last of its bucket's chain).
    chains: *const u32,
    symoffset: usize,
}

/// A module's `DT_HASH` table, as run-time addresses of its parts.
#[derive(Clone, Copy)]
struct SysvHash {
    buckets: *const u32,
    bucket_count: usize,
    /// `chains[i]` is the next symbol of symbol `i`'s bucket (0 ends it).
    chains: *const u32,
}

impl DynamicSymbols {
    /// The symbols of the module loaded at `base` (its load bias, `l_addr`) with its dynamic section at
    /// `dynamic`; `None` when it has no symbol table ld.so can use.
    ///
    /// # Safety
    /// `dynamic` is the run-time address of the dynamic section of a module ld.so has loaded and set up, and
    /// the module stays loaded while the result is used.
    pub unsafe fn new(base: usize, dynamic: *const Elf64Dyn) -> Option<DynamicSymbols> {
        let (mut hash, mut gnu_hash, mut strtab, mut symtab) = (0, 0, 0, 0);
        let mut dynamic = dynamic;
        if dynamic.is_null() {
            return None;
        }
        loop {
            // SAFETY: the dynamic section is an array ended by DT_NULL.
            let entry = unsafe { &*dynamic };
            // ld.so relocates the pointers of a writable dynamic section; a read-only one keeps link-time
            // addresses.
            let address = entry.d_val as usize;
            let address = if address < base {
                address + base
            } else {
                address
            };
            match entry.d_tag {
                DT_NULL => break,
                DT_HASH => hash = address,
                DT_GNU_HASH => gnu_hash = address,
                DT_STRTAB => strtab = address,
                DT_SYMTAB => symtab = address,
                _ => {}
            }
            // SAFETY: not past DT_NULL yet.
            dynamic = unsafe { dynamic.add(1) };
        }
        if strtab == 0 || symtab == 0 {
            return None;
        }
        let count = if hash != 0 {
            // SAFETY: DT_HASH is `nbucket, nchain, ...`; nchain is the number of symbols.
            unsafe { *(hash as *const u32).add(1) as usize }
        } else if gnu_hash != 0 {
            // SAFETY: a DT_GNU_HASH table as ld.so itself reads it.
            unsafe { gnu_hash_symbol_count(gnu_hash as *const u32) }
        } else {
            return None;
        };
        // SAFETY: the headers of the tables the dynamic section names, as ld.so reads them: DT_GNU_HASH is
        // `nbuckets, symoffset, bloom_size, bloom_shift`, 64-bit bloom words, buckets, chains; DT_HASH is
        // `nbucket, nchain`, buckets, chains.
        let (gnu_hash, sysv_hash) = unsafe {
            let gnu = (gnu_hash != 0).then(|| {
                let table = gnu_hash as *const u32;
                let bucket_count = *table as usize;
                let buckets = table.add(4 + *table.add(2) as usize * 2);
                GnuHash {
                    buckets,
                    bucket_count,
                    chains: buckets.add(bucket_count),
                    symoffset: *table.add(1) as usize,
                }
            });
            let sysv = (hash != 0).then(|| {
                let table = hash as *const u32;
                let bucket_count = *table as usize;
                SysvHash {
                    buckets: table.add(2),
                    bucket_count,
                    chains: table.add(2 + bucket_count),
                }
            });
            (gnu, sysv)
        };
        // SAFETY: DT_SYMTAB holds `count` symbols, mapped for as long as the module is (the caller keeps it
        // loaded while the result is used).
        let symbols = unsafe { std::slice::from_raw_parts(symtab as *const Elf64Sym, count) };
        Some(DynamicSymbols {
            base,
            symbols,
            strings: strtab as *const c_char,
            gnu_hash,
            sysv_hash,
        })
    }

    fn symbol_name(&self, symbol: &Elf64Sym) -> &[u8] {
        // SAFETY: st_name is an offset into the module's NUL-terminated string table.
        unsafe { CStr::from_ptr(self.strings.add(symbol.st_name as usize)) }.to_bytes()
    }

    /// Run-time address of the symbol `name` when this module defines it (found through the module's hash
    /// table, as ld.so finds it: a module of a hundred thousand symbols is not read whole).
    pub fn defined(&self, name: &[u8]) -> Option<usize> {
        let found = match (self.gnu_hash, self.sysv_hash) {
            (Some(table), _) => self.find_gnu(table, name, Want::Definition),
            (None, Some(table)) => self.find_sysv(table, name, Want::Definition),
            // `new` makes none for a module without a hash table.
            (None, None) => None,
        };
        found.map(|s| self.base + s.st_value as usize)
    }

    /// True when the module imports (leaves undefined) any of `names`. A GNU hash table hashes only the
    /// symbols from its `symoffset` on, and linkers put the undefined ones before it: those few are read,
    /// and each name is also looked up in the table in case one was hashed all the same. A System V table
    /// hashes every symbol.
    pub fn imports_any(&self, names: &[&[u8]]) -> bool {
        match (self.gnu_hash, self.sysv_hash) {
            (Some(table), _) => {
                let unhashed = &self.symbols[..table.symoffset.min(self.symbols.len())];
                unhashed
                    .iter()
                    .any(|s| Want::Import.wants(s) && names.contains(&self.symbol_name(s)))
                    || names
                        .iter()
                        .any(|name| self.find_gnu(table, name, Want::Import).is_some())
            }
            (None, Some(table)) => names
                .iter()
                .any(|name| self.find_sysv(table, name, Want::Import).is_some()),
            // `new` makes none for a module without a hash table.
            (None, None) => false,
        }
    }

    /// Symbol `index` when it is named `name` and is what `want` asks for.
    fn matching(&self, index: usize, name: &[u8], want: Want) -> Option<&'static Elf64Sym> {
        self.symbols
            .get(index)
            .filter(|s| want.wants(s) && self.symbol_name(s) == name)
    }

    fn find_gnu(&self, table: GnuHash, name: &[u8], want: Want) -> Option<&'static Elf64Sym> {
        if table.bucket_count == 0 {
            return None;
        }
        let hash = gnu_hash(name);
        // SAFETY: the bucket index is below the table's bucket count.
        let mut index = unsafe { *table.buckets.add(hash as usize % table.bucket_count) } as usize;
        // A bucket of 0 is empty; a chain runs from its bucket's first symbol to the one whose hash has the
        // low bit set, each symbol at or past symoffset with its hash in the chains (which cover every
        // symbol up to the count `gnu_hash_symbol_count` found).
        while index >= table.symoffset.max(1) && index < self.symbols.len() {
            // SAFETY: as above: `index - symoffset` is within the chains.
            let chain_hash = unsafe { *table.chains.add(index - table.symoffset) };
            if chain_hash | 1 == hash | 1
                && let Some(symbol) = self.matching(index, name, want)
            {
                return Some(symbol);
            }
            if chain_hash & 1 != 0 {
                return None;
            }
            index += 1;
        }
        None
    }

    fn find_sysv(&self, table: SysvHash, name: &[u8], want: Want) -> Option<&'static Elf64Sym> {
        if table.bucket_count == 0 {
            return None;
        }
        // SAFETY: the bucket index is below the bucket count.
        let mut index = unsafe {
            *table
                .buckets
                .add(sysv_hash(name) as usize % table.bucket_count)
        } as usize;
        // A chain's links are symbol indexes, each checked against the symbol count (the chains' length)
        // before it is followed; a loop of links ends after as many steps as there are symbols.
        for _ in 0..self.symbols.len() {
            if index == 0 || index >= self.symbols.len() {
                break;
            }
            if let Some(symbol) = self.matching(index, name, want) {
                return Some(symbol);
            }
            // SAFETY: `index` is below the symbol count.
            index = unsafe { *table.chains.add(index) } as usize;
        }
        None
    }

    /// What a scan of every symbol finds: the tests' reference for the hash tables.
    #[cfg(test)]
    fn find_by_scan(&self, name: &[u8], want: Want) -> Option<&'static Elf64Sym> {
        (0..self.symbols.len()).find_map(|index| self.matching(index, name, want))
    }

    /// For tests: each named symbol of this module (a definition or an import), and what each way of
    /// looking its name up finds.
    #[cfg(test)]
    #[allow(
        dead_code,
        reason = "the runtime's tests use it, the audit module's do not"
    )]
    pub fn lookups(&self) -> Vec<Lookup> {
        let address = |found: Option<&Elf64Sym>| found.map(|s| self.base + s.st_value as usize);
        self.symbols
            .iter()
            .filter(|s| s.st_name != 0)
            .filter_map(|s| {
                let want = [Want::Definition, Want::Import]
                    .into_iter()
                    .find(|want| want.wants(s))?;
                let name = self.symbol_name(s);
                let import = want == Want::Import;
                Some(Lookup {
                    name: name.to_vec(),
                    address: if import {
                        0
                    } else {
                        self.base + s.st_value as usize
                    },
                    import,
                    // A GNU table need not hash imports (`imports_any` reads those before symoffset).
                    by_gnu_hash: self
                        .gnu_hash
                        .filter(|_| !import)
                        .map(|table| address(self.find_gnu(table, name, want))),
                    by_sysv_hash: self
                        .sysv_hash
                        .map(|table| address(self.find_sysv(table, name, want))),
                    by_scan: address(self.find_by_scan(name, want)),
                    imported: import.then(|| self.imports_any(&[name])),
                })
            })
            .collect()
    }

    /// The one rule the audit module redirects by and the runtime counts by.
    pub fn plt_role(&self) -> PltRole {
        if self.defined(b"_rtld_global").is_some() {
            return PltRole::DynamicLinker;
        }
        if let (Some(entry), Some(_)) = (
            self.defined(b"mslprof_plt_entry"),
            self.defined(b"mslprof_plt_abi"),
        ) {
            let arena = self.defined(b"mslprof_plt_arena").unwrap_or(0);
            return PltRole::Runtime { entry, arena };
        }
        if self.imports_any(&COUNTING_IMPORTS) {
            PltRole::CountsItself
        } else {
            PltRole::CountedAtThePlt
        }
    }
}

/// What a look-up of a name wants: a definition (with an address), or an import (undefined).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Definition,
    Import,
}

impl Want {
    fn wants(self, symbol: &Elf64Sym) -> bool {
        match self {
            Want::Definition => symbol.st_shndx != SHN_UNDEF && symbol.st_value != 0,
            Want::Import => symbol.st_shndx == SHN_UNDEF,
        }
    }
}

/// A named symbol and what each way of looking its name up found (outer `None`: the module has no such
/// table; a found address: one of a definition of the name, not necessarily this one; an import is found
/// at address 0 plus the symbol's value, and `imported` is what `imports_any` says of its name).
#[cfg(test)]
#[allow(
    dead_code,
    reason = "the runtime's tests use it, the audit module's do not"
)]
pub struct Lookup {
    pub name: Vec<u8>,
    pub address: usize,
    pub import: bool,
    pub by_gnu_hash: Option<Option<usize>>,
    pub by_sysv_hash: Option<Option<usize>>,
    pub by_scan: Option<usize>,
    pub imported: Option<bool>,
}

/// The GNU hash of a symbol name (`dl_new_hash`).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// The System V ELF hash of a symbol name (`_dl_elf_hash`).
fn sysv_hash(name: &[u8]) -> u32 {
    name.iter().fold(0u32, |h, &c| {
        let h = (h << 4).wrapping_add(u32::from(c));
        (h ^ ((h & 0xf000_0000) >> 24)) & 0x0fff_ffff
    })
}

/// Symbols in a module with only a GNU hash table: one past the highest index any chain reaches.
///
/// # Safety
/// `table` is a valid DT_GNU_HASH table with its symbol table mapped.
unsafe fn gnu_hash_symbol_count(table: *const u32) -> usize {
    // SAFETY: header `nbuckets, symoffset, bloom_size, bloom_shift`, 64-bit bloom words, buckets, chains.
    unsafe {
        let buckets_count = *table as usize;
        let symoffset = *table.add(1) as usize;
        let bloom_words = *table.add(2) as usize;
        let buckets = table.add(4 + bloom_words * 2);
        let chains = buckets.add(buckets_count);
        let last_bucket = (0..buckets_count)
            .map(|i| *buckets.add(i) as usize)
            .max()
            .unwrap_or(0);
        if last_bucket < symoffset {
            return symoffset;
        }
        let mut index = last_bucket;
        while *chains.add(index - symoffset) & 1 == 0 {
            index += 1;
        }
        index + 1
    }
}
