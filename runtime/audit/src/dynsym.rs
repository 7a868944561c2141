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
        // SAFETY: DT_SYMTAB holds `count` symbols, mapped for as long as the module is (the caller keeps it
        // loaded while the result is used).
        let symbols = unsafe { std::slice::from_raw_parts(symtab as *const Elf64Sym, count) };
        Some(DynamicSymbols {
            base,
            symbols,
            strings: strtab as *const c_char,
        })
    }

    fn symbol_name(&self, symbol: &Elf64Sym) -> &[u8] {
        // SAFETY: st_name is an offset into the module's NUL-terminated string table.
        unsafe { CStr::from_ptr(self.strings.add(symbol.st_name as usize)) }.to_bytes()
    }

    /// Run-time address of the symbol `name` when this module defines it.
    pub fn defined(&self, name: &[u8]) -> Option<usize> {
        self.symbols
            .iter()
            .find(|s| s.st_shndx != SHN_UNDEF && s.st_value != 0 && self.symbol_name(s) == name)
            .map(|s| self.base + s.st_value as usize)
    }

    /// True when the module imports (leaves undefined) any of `names`.
    pub fn imports_any(&self, names: &[&[u8]]) -> bool {
        self.symbols
            .iter()
            .filter(|s| s.st_shndx == SHN_UNDEF && s.st_name != 0)
            .any(|s| names.contains(&self.symbol_name(s)))
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
