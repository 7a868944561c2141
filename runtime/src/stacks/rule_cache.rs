//! The stack walk's rule cache: the [`Rule`] found for a (load instance, link-time address), kept so that the
//! next walk through that address skips the module's search table and FDE. One cache per scratch slot, in the
//! slot's memory (plain integers, valid all-zero: empty), used only by the handler that holds the slot, so it
//! needs no lock and no atomics. Direct-mapped: a new rule replaces whatever held its entry.
//!
//! Entries never go stale: load-instance keys are never reused (a `dlopen` after a `dlclose` gets a new key)
//! and a load instance's unwind tables are copies that never change, so a (key, address) has one rule for the
//! life of the process, and in a forked child too (it keeps the parent's modules and keys).

use super::unwind::{Cfa, Rule, SavedFp};

/// log2 of the entries in one cache.
const INDEX_BITS: u32 = 10;
/// Entries in one cache: 1024 of 24 bytes, 24 KiB a scratch slot.
pub const ENTRIES: usize = 1 << INDEX_BITS;

/// One cached rule, packed: `shape` says which [`Rule`] (0: the entry is empty), its bytes 1–3 which
/// [`Cfa`], return address and [`SavedFp`] rules; offsets too large for these fields are not cached.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct Entry {
    address: u64,
    key: u32,
    shape: [u8; 4],
    cfa_offset: i32,
    return_address_offset: i16,
    fp_offset: i16,
}

/// `Entry::shape[0]`, 0 being an empty entry.
const FRAME_POINTER: u8 = 1;
const UNFOLLOWABLE: u8 = 2;
const ROW: u8 = 3;

impl Entry {
    /// The entry holding `rule` for (`key`, `address`); `None` when an offset does not fit.
    fn pack(key: u32, address: u64, rule: Rule) -> Option<Entry> {
        let mut entry = Entry {
            address,
            key,
            ..Entry::default()
        };
        let Rule::Row {
            cfa,
            return_address,
            fp,
        } = rule
        else {
            entry.shape[0] = match rule {
                Rule::FramePointer => FRAME_POINTER,
                _ => UNFOLLOWABLE,
            };
            return Some(entry);
        };
        entry.shape[0] = ROW;
        (entry.shape[1], entry.cfa_offset) = match cfa {
            Cfa::SpPlus(offset) => (0, offset.try_into().ok()?),
            Cfa::FpPlus(offset) => (1, offset.try_into().ok()?),
            Cfa::PltEntry => (2, 0),
        };
        (entry.shape[2], entry.return_address_offset) = match return_address {
            None => (0, 0),
            Some(offset) => (1, offset.try_into().ok()?),
        };
        (entry.shape[3], entry.fp_offset) = match fp {
            SavedFp::At(offset) => (0, offset.try_into().ok()?),
            SavedFp::Is(offset) => (1, offset.try_into().ok()?),
            SavedFp::Unchanged => (2, 0),
        };
        Some(entry)
    }

    /// The rule this entry holds; `None` when it is empty (or holds no rule [`Entry::pack`] writes).
    fn unpack(&self) -> Option<Rule> {
        let [shape, cfa, return_address, fp] = self.shape;
        match shape {
            FRAME_POINTER => return Some(Rule::FramePointer),
            UNFOLLOWABLE => return Some(Rule::Unfollowable),
            ROW => {}
            _ => return None,
        }
        let cfa_offset = i64::from(self.cfa_offset);
        let cfa = match cfa {
            0 => Cfa::SpPlus(cfa_offset),
            1 => Cfa::FpPlus(cfa_offset),
            2 => Cfa::PltEntry,
            _ => return None,
        };
        let return_address = match return_address {
            0 => None,
            1 => Some(i64::from(self.return_address_offset)),
            _ => return None,
        };
        let fp = match fp {
            0 => SavedFp::At(i64::from(self.fp_offset)),
            1 => SavedFp::Is(i64::from(self.fp_offset)),
            2 => SavedFp::Unchanged,
            _ => return None,
        };
        Some(Rule::Row {
            cfa,
            return_address,
            fp,
        })
    }
}

/// One walker's cache (see the module's documentation). All-zero bytes are an empty cache with zero counts.
#[derive(Debug)]
#[repr(C)]
pub struct RuleCache {
    entries: [Entry; ENTRIES],
    /// Look-ups answered from the cache, and not, since it was last cleared (wrapping).
    hits: u64,
    misses: u64,
}

/// The entry a (key, address) may occupy: Fibonacci hashing of both, so that addresses a few bytes apart and
/// the same address in two load instances spread over the cache.
fn index(key: u32, address: u64) -> usize {
    let mixed = (address ^ u64::from(key).rotate_right(16)).wrapping_mul(crate::FIBONACCI);
    (mixed >> (u64::BITS - INDEX_BITS)) as usize
}

impl RuleCache {
    /// The rule cached for (`key`, `address`), counted as a hit or a miss.
    pub fn get(&mut self, key: u32, address: u64) -> Option<Rule> {
        let rule = self
            .entries
            .get(index(key, address))
            .filter(|entry| entry.key == key && entry.address == address)
            .and_then(Entry::unpack);
        match rule {
            Some(_) => self.hits = self.hits.wrapping_add(1),
            None => self.misses = self.misses.wrapping_add(1),
        }
        rule
    }

    /// Caches `rule` for (`key`, `address`), in place of what held its entry; a rule with an offset too large
    /// for an entry is not cached.
    pub fn put(&mut self, key: u32, address: u64, rule: Rule) {
        if let (Some(entry), Some(slot)) = (
            Entry::pack(key, address, rule),
            self.entries.get_mut(index(key, address)),
        ) {
            *slot = entry;
        }
    }

    /// Empties the cache and zeroes its counts.
    pub fn clear(&mut self) {
        self.entries.fill(Entry::default());
        (self.hits, self.misses) = (0, 0);
    }

    /// Hits and misses since the cache was last cleared.
    pub fn counts(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// An empty cache on the heap (for walks outside a handler: the test hook, unit tests).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn boxed() -> Box<RuleCache> {
        Box::new(RuleCache {
            entries: [Entry::default(); ENTRIES],
            hits: 0,
            misses: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unwind_tables::{ModuleUnwind, StoreOnStack};
    use gimli::UnwindContext;

    /// The rules of the test program's own code, looked up afresh, at every third byte of its first 256 KiB of
    /// code: (link-time address, rule).
    fn fresh_rules() -> Vec<(u64, Rule)> {
        let main = mslprof_loader_hooks::scan_loaded_modules()
            .into_iter()
            .next()
            .expect("the main program");
        let unwind = ModuleUnwind::of_module(&main).expect("the test program's unwind tables");
        let mut context = UnwindContext::<usize, StoreOnStack>::new_in();
        main.exec_ranges
            .iter()
            .flat_map(|range| (range.start..range.end.min(range.start + (256 << 10))).step_by(3))
            .map(|address| (address, Rule::for_row(unwind.row(address, &mut context))))
            .collect()
    }

    #[test]
    fn a_hit_gives_the_rule_a_fresh_lookup_gives_and_another_key_misses() {
        let rules = fresh_rules();
        let rows = rules
            .iter()
            .filter(|(_, rule)| matches!(rule, Rule::Row { .. }))
            .count();
        assert!(
            rows > rules.len() / 2,
            "{rows} rows of {} addresses",
            rules.len()
        );
        let mut cache = RuleCache::boxed();
        for &(address, rule) in &rules {
            cache.put(7, address, rule);
            assert_eq!(cache.get(7, address), Some(rule), "at {address:#x}");
            assert_eq!(cache.get(8, address), None, "key 8 at {address:#x}");
        }
        assert_eq!(cache.counts(), (rules.len() as u64, rules.len() as u64));
        // Entries left by the loop: each answers for its own (key, address) only, with the fresh rule.
        let mut hits = 0;
        for &(address, rule) in &rules {
            if let Some(cached) = cache.get(7, address) {
                assert_eq!(cached, rule, "at {address:#x}");
                hits += 1;
            }
        }
        assert!(hits >= ENTRIES / 2, "{hits} entries survived");
        cache.clear();
        assert_eq!(cache.counts(), (0, 0));
        assert!(
            rules
                .iter()
                .all(|&(address, _)| cache.get(7, address).is_none())
        );
    }

    #[test]
    fn an_entry_taken_by_a_colliding_address_is_a_miss_never_the_other_rule() {
        let first = Rule::Row {
            cfa: Cfa::SpPlus(16),
            return_address: Some(-8),
            fp: SavedFp::Unchanged,
        };
        let second = Rule::Row {
            cfa: Cfa::FpPlus(16),
            return_address: Some(-8),
            fp: SavedFp::At(-16),
        };
        let colliding = (1..)
            .map(|n| 0x40_1000 + n)
            .find(|&address| index(9, address) == index(3, 0x40_1000))
            .expect("an address with the same entry");
        let mut cache = RuleCache::boxed();
        cache.put(3, 0x40_1000, first);
        cache.put(9, colliding, second);
        assert_eq!(cache.get(3, 0x40_1000), None);
        assert_eq!(cache.get(9, 0x40_1000), None);
        assert_eq!(cache.get(3, colliding), None);
        assert_eq!(cache.get(9, colliding), Some(second));
        cache.put(3, 0x40_1000, Rule::FramePointer);
        assert_eq!(cache.get(9, colliding), None);
        assert_eq!(cache.get(3, 0x40_1000), Some(Rule::FramePointer));
    }

    #[test]
    fn zeroed_memory_is_an_empty_cache_and_rules_that_do_not_fit_are_not_cached() {
        // SAFETY: RuleCache is plain integers; all-zero bytes are a valid value.
        let mut cache = unsafe { Box::<RuleCache>::new_zeroed().assume_init() };
        assert_eq!(cache.get(0, 0), None);
        let rules = [
            Rule::FramePointer,
            Rule::Unfollowable,
            Rule::Row {
                cfa: Cfa::PltEntry,
                return_address: None,
                fp: SavedFp::Is(-24),
            },
            Rule::Row {
                cfa: Cfa::SpPlus(i64::from(i32::MIN)),
                return_address: Some(i64::from(i16::MAX)),
                fp: SavedFp::At(i64::from(i16::MIN)),
            },
        ];
        for (address, rule) in (0x1000..).zip(rules) {
            cache.put(1, address, rule);
            assert_eq!(cache.get(1, address), Some(rule));
        }
        let too_far = [
            Rule::Row {
                cfa: Cfa::FpPlus(1 << 31),
                return_address: Some(-8),
                fp: SavedFp::Unchanged,
            },
            Rule::Row {
                cfa: Cfa::SpPlus(8),
                return_address: Some(-8),
                fp: SavedFp::At(1 << 15),
            },
        ];
        for (address, rule) in (0x2000..).zip(too_far) {
            cache.put(1, address, rule);
            assert_eq!(cache.get(1, address), None, "{rule:?}");
        }
    }
}
