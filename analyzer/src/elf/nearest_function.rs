//! The ELF function BFD names for a `.text` address that DWARF gives no function for: binutils 2.40's
//! `_bfd_elf_find_function`, which GNU gprof's `-l` reaches through `bfd_find_nearest_line`.
//!
//! BFD weighs every symbol of the section except data, TLS, file and section symbols (and annobin's
//! hidden, local, untyped zero-size markers), each with its ELF size (1 when zero). The answer is the
//! symbol with the highest address at or below the address, whether or not it reaches that far; at one
//! address the largest wins, then the first in symbol-table order. BFD keeps the last answer and gives it
//! again, without searching, for any address inside that symbol: gprof asks in address order, so a
//! function keeps the addresses of a smaller symbol nested in it (`main` over a label inside `main`).
//! Compiler clones (`foo.part.0`, `foo.isra.0`) are symbols here, where gprof's function table has none.

use object::{Object, ObjectSection, ObjectSymbol, SymbolFlags, SymbolSection};

/// One symbol as BFD weighs it.
#[derive(Clone, Debug)]
struct TextSymbol {
    name: String,
    addr: u64,
    /// ELF size, at least 1.
    size: u64,
}

/// `_bfd_elf_find_function` over one file's `.text`, with its one-answer cache.
#[derive(Clone, Debug, Default)]
pub struct NearestFunction {
    /// In symbol-table order.
    syms: Vec<TextSymbol>,
    /// Indices into `syms` by address, then size (largest first), then symbol-table order: the first of
    /// the last group at or below an address is BFD's answer.
    by_addr: Vec<usize>,
    /// The last answer.
    cached: Option<usize>,
}

impl NearestFunction {
    /// The symbols of `file`'s section `.text` that BFD considers.
    pub fn new(file: &object::File<'_>) -> Self {
        let Some(text) = file.section_by_name(".text").map(|s| s.index()) else {
            return Self::default();
        };
        let mut syms = Vec::new();
        for sym in file.symbols() {
            let SymbolFlags::Elf { st_info, st_other } = sym.flags() else {
                continue;
            };
            if sym.section() != SymbolSection::Section(text) {
                continue;
            }
            let st_type = st_info & 0xf;
            // BSF_OBJECT (object, common), BSF_SECTION_SYM, BSF_FILE, BSF_THREAD_LOCAL, BSF_RELC, BSF_SRELC.
            if matches!(st_type, 1 | 3 | 4 | 5 | 6 | 8 | 9) {
                continue;
            }
            let is_local = st_info >> 4 == object::elf::STB_LOCAL;
            let hidden = st_other & 3 == object::elf::STV_HIDDEN;
            if sym.size() == 0 && is_local && st_type == object::elf::STT_NOTYPE && hidden {
                continue;
            }
            syms.push(TextSymbol {
                name: sym.name().unwrap_or("").to_string(),
                addr: sym.address(),
                size: sym.size().max(1),
            });
        }
        let mut by_addr: Vec<usize> = (0..syms.len()).collect();
        by_addr.sort_by(|&l, &r| {
            (syms[l].addr, std::cmp::Reverse(syms[l].size), l).cmp(&(
                syms[r].addr,
                std::cmp::Reverse(syms[r].size),
                r,
            ))
        });
        NearestFunction {
            syms,
            by_addr,
            cached: None,
        }
    }

    /// Where BFD's answer can change: where a symbol starts, and where one ends that another starts inside
    /// of (elsewhere the answer is the nearest symbol below, cached or not).
    pub fn boundaries(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.syms.len());
        for (k, &i) in self.by_addr.iter().enumerate() {
            let s = &self.syms[i];
            out.push(s.addr);
            let end = s.addr.saturating_add(s.size);
            let next_start = self.by_addr[k + 1..]
                .iter()
                .map(|&j| self.syms[j].addr)
                .find(|&a| a > s.addr);
            if next_start.is_some_and(|a| a < end) {
                out.push(end);
            }
        }
        out
    }

    /// BFD's answer for `addr`, given the questions asked before (in address order).
    pub fn find(&mut self, addr: u64) -> Option<&str> {
        let hit = self.cached.is_some_and(|i| {
            let s = &self.syms[i];
            s.addr <= addr && addr - s.addr < s.size
        });
        if !hit {
            let below = self.by_addr.partition_point(|&i| self.syms[i].addr <= addr);
            self.cached = below.checked_sub(1).map(|last| {
                let top = self.syms[self.by_addr[last]].addr;
                self.by_addr[self.by_addr[..below].partition_point(|&i| self.syms[i].addr < top)]
            });
        }
        self.cached.map(|i| self.syms[i].name.as_str())
    }

    /// The address of the symbol of BFD's last answer.
    pub fn cached_addr(&self) -> Option<u64> {
        self.cached.map(|i| self.syms[i].addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finder(syms: &[(&str, u64, u64)]) -> NearestFunction {
        let syms: Vec<TextSymbol> = syms
            .iter()
            .map(|&(name, addr, size)| TextSymbol {
                name: name.to_string(),
                addr,
                size,
            })
            .collect();
        let mut by_addr: Vec<usize> = (0..syms.len()).collect();
        by_addr.sort_by_key(|&i| (syms[i].addr, std::cmp::Reverse(syms[i].size), i));
        NearestFunction {
            syms,
            by_addr,
            cached: None,
        }
    }

    // The layout of a hand-written assembler file whose answers were read from libbfd 2.40
    // (`bfd_find_nearest_line` on an executable whose DWARF has a line table and no functions).
    const NESTED: [(&str, u64, u64); 5] = [
        ("inner", 0x112b, 2),
        ("alias_small", 0x112f, 2),
        ("alias_big", 0x112f, 4),
        ("after", 0x1134, 1),
        ("main", 0x1129, 11),
    ];

    #[test]
    fn fresh_questions_get_the_nearest_symbol_below() {
        for (addr, want) in [
            (0x112b, "inner"),
            (0x112d, "inner"),
            (0x112f, "alias_big"),
            (0x1133, "alias_big"),
            (0x1135, "after"),
        ] {
            assert_eq!(finder(&NESTED).find(addr), Some(want), "{addr:#x}");
        }
        assert_eq!(finder(&NESTED).find(0x1000), None);
    }

    #[test]
    fn answers_change_at_starts_and_at_the_ends_of_enclosing_symbols() {
        let mut b = finder(&NESTED).boundaries();
        b.sort_unstable();
        b.dedup();
        assert_eq!(b, [0x1129, 0x112b, 0x112f, 0x1134]);
    }

    #[test]
    fn questions_in_address_order_keep_the_enclosing_answer() {
        let mut f = finder(&NESTED);
        let names: Vec<_> = (0x1129..0x1138)
            .map(|a| f.find(a).unwrap_or("-").to_string())
            .collect();
        let mut want = vec!["main"; 11];
        want.extend(["after"; 4]);
        assert_eq!(names, want);
    }
}
