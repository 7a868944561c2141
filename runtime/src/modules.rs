//! The live module table: every module of the process, looked up by PC from signal handlers without locks.
//!
//! The table is an immutable, sorted array of address ranges published through one atomic pointer. Readers
//! (the SIGPROF handler, mcount) load the pointer and binary-search: no lock, no allocation, async-signal-safe.
//! Writers (start-up, and the loader hooks on dlopen/dlclose) serialise on a mutex, build a new table and
//! publish it. Tables and [`LiveModule`]s are never freed, because a reader may still hold one: a retired table
//! costs a few dozen bytes per module, and a module's counters must survive its unload anyway (they are dumped
//! at exit as that load instance's data).

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use mslprof_format::{LinkAddress, LoadBias, RuntimeAddress};
use mslprof_loader_hooks::ModuleInfo;

use crate::histogram::{BucketBits, Histogram};
use crate::selection::Selection;

// The audit module's reader of a loaded module's dynamic symbols, shared so that both apply one rule.
#[path = "../audit/src/dynsym.rs"]
#[allow(
    dead_code,
    reason = "the audit module uses more of it than the runtime"
)]
mod dynsym;

/// One load instance of one module.
#[derive(Debug)]
pub struct LiveModule {
    /// Unique per load instance, never reused, never `UNKNOWN_KEY`.
    pub key: u32,
    /// Runtime address = link-time address + bias; [`LiveModule::link_address`] is the one conversion.
    pub load_bias: LoadBias,
    /// LD_PROFILE selected it: it has a histogram (and, with the mcount half, arc storage).
    pub profiled: bool,
    /// 1, 2, … in the order modules were seen (start-up scan order, then each load).
    pub load_order: u32,
    pub info: ModuleInfo,
    /// `None` for unprofiled modules, or when the histogram could not be reserved.
    pub histogram: Option<Histogram>,
    /// Samples whose PC fell in this module (profiled or not).
    pub samples: AtomicU64,
    /// Call-graph arcs into this module (recorded when profiled, or when `plt_counted` and the caller is
    /// profiled; maps nothing until used).
    pub arcs: crate::arcs::ArcTable,
    /// Not profiled, and calls into it reach the runtime only through the audit module's PLT stubs (it imports
    /// none of the counting entries, and is neither ld.so, the vDSO nor the runtime: the modules the audit
    /// module redirects calls into). The calls that profiled modules make into it are counted in `arcs`, so a
    /// selected caller sees what it calls (written with the format's CALLEE_ARCS flag).
    pub plt_counted: bool,
    /// Its unwind tables, copied when it was added, for the stack walks (`None` when stacks are off or it has
    /// no `.eh_frame_hdr`).
    pub unwind: Option<crate::unwind_tables::ModuleUnwind>,
    /// 0 while loaded; else the unload order number.
    unload_order: AtomicU32,
    /// Executable ranges as runtime addresses `[start, end)`, sorted.
    runtime_ranges: Vec<(RuntimeAddress, RuntimeAddress)>,
}

impl LiveModule {
    pub fn new(
        key: u32,
        load_order: u32,
        info: ModuleInfo,
        profiled: bool,
        bucket_bits: BucketBits,
    ) -> LiveModule {
        let histogram = if profiled {
            Histogram::new(&info.exec_ranges, bucket_bits)
        } else {
            None
        };
        let load_bias = info.load_bias();
        let runtime_ranges = info.runtime_ranges().collect();
        let plt_counted = !profiled && reached_only_through_plt(&info);
        let unwind = crate::unwind_tables::wanted()
            .then(|| crate::unwind_tables::ModuleUnwind::of_module(&info))
            .flatten();
        LiveModule {
            key,
            load_bias,
            profiled,
            load_order,
            info,
            histogram,
            samples: AtomicU64::new(0),
            arcs: crate::arcs::ArcTable::new(),
            plt_counted,
            unwind,
            unload_order: AtomicU32::new(0),
            runtime_ranges,
        }
    }

    /// Whether `pc` is in one of this module's executable segments.
    pub fn contains_address(&self, pc: RuntimeAddress) -> bool {
        self.contains_bytes(pc, 1)
    }

    /// Whether the `len` bytes from `start` lie in one of this module's executable segments.
    pub fn contains_bytes(&self, start: RuntimeAddress, len: usize) -> bool {
        let (start, len) = (start.as_usize(), len.max(1));
        self.runtime_ranges.iter().any(|&(low, high)| {
            low.as_usize() <= start && start.saturating_add(len) <= high.as_usize()
        })
    }

    /// The span of this module's executable segments, `[lowest start, highest end)` as runtime addresses
    /// (`(usize::MAX, 0)` when it has none): where its stubs must be within a `rel32` of.
    pub fn code_span(&self) -> (usize, usize) {
        self.runtime_ranges
            .iter()
            .filter(|(start, end)| start < end)
            .fold((usize::MAX, 0), |(low, high), &(start, end)| {
                (low.min(start.as_usize()), high.max(end.as_usize()))
            })
    }

    /// The one conversion from the process's addresses to the module's: what histograms, arcs and files hold.
    pub fn link_address(&self, pc: RuntimeAddress) -> LinkAddress {
        self.load_bias.link_address(pc)
    }

    /// Counts one sample at `pc` (which must be in this module). Async-signal-safe.
    pub fn record_sample(&self, pc: RuntimeAddress) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        if let Some(histogram) = &self.histogram {
            histogram.record(self.link_address(pc));
        }
    }

    pub fn unload_order(&self) -> u32 {
        self.unload_order.load(Ordering::Relaxed)
    }

    pub fn is_unloaded(&self) -> bool {
        self.unload_order() != 0
    }
}

/// Whether the audit module (runtime/audit/) redirects the calls into `info` through its counting stubs: the
/// same rule as its `la_objopen` (`DynamicSymbols::plt_role`), on the module's dynamic symbols in memory. Not
/// async-signal-safe (reads the module while it is being added, never from a handler).
fn reached_only_through_plt(info: &ModuleInfo) -> bool {
    if info.is_vdso || info.is_dynamic_linker {
        return false;
    }
    dynamic_symbols(info)
        .is_some_and(|symbols| symbols.plt_role() == dynsym::PltRole::CountedAtThePlt)
}

/// Whether `info` may import one of `names` (false only when its dynamic symbols say it imports none: a
/// module's GOT holds the address of another's function only through such an import). Reads the module's
/// symbol table: not for handlers.
pub(crate) fn may_import_any(info: &ModuleInfo, names: &[&[u8]]) -> bool {
    dynamic_symbols(info).is_none_or(|symbols| symbols.imports_any(names))
}

/// The dynamic symbols of `info`, when it has a dynamic section with a symbol table ld.so can use.
fn dynamic_symbols(info: &ModuleInfo) -> Option<dynsym::DynamicSymbols> {
    if info.dynamic == 0 {
        return None;
    }
    // SAFETY: `info` describes a module the loader reported, with its dynamic section at `info.dynamic`; it
    // stays mapped while the caller holds it (a module being added to the table, whose unloads go through
    // the same serialised update, or one present at start-up, which is never unloaded).
    unsafe { dynsym::DynamicSymbols::new(info.bias, info.dynamic as *const _) }
}

/// One published table.
#[derive(Debug, Default)]
pub(crate) struct Table {
    /// Executable ranges of loaded modules, sorted by start, non-overlapping.
    by_address: Vec<Range>,
    /// Every load instance ever created, loaded or not, in load order.
    all: Vec<&'static LiveModule>,
}

/// The published table (read directly by the mcount fast path in `mcount/x86_64.rs` as its generation).
pub(crate) static CURRENT: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());
static WRITER: Mutex<()> = Mutex::new(());
static NEXT_KEY: AtomicU32 = AtomicU32::new(1);
static NEXT_UNLOAD: AtomicU32 = AtomicU32::new(1);

fn current() -> Option<&'static Table> {
    let table = CURRENT.load(Ordering::Acquire);
    // SAFETY: every non-null pointer stored in CURRENT comes from Box::leak and is never freed.
    unsafe { table.as_ref() }
}

type Range = (RuntimeAddress, RuntimeAddress, &'static LiveModule);

thread_local! {
    /// The range of the current table that this thread's last [`find_address`] found, as the address of its
    /// entry (one word: a signal handler on this thread sees it whole), or 0. An `mcount` slow path meets the
    /// callees of one module again and again.
    static LAST_FOUND: Cell<usize> = const { Cell::new(0) };
}

/// The loaded module whose executable segments contain `pc`. Lock-free and async-signal-safe.
pub fn find_address(pc: RuntimeAddress) -> Option<&'static LiveModule> {
    let table = current()?;
    let slots = &table.by_address;
    let last = LAST_FOUND.with(Cell::get);
    let offset = last.wrapping_sub(slots.as_ptr() as usize);
    if offset < core::mem::size_of_val(slots.as_slice()) {
        // SAFETY: `last` is the address of an entry of the current table's `by_address` (checked: inside the
        // slice, and only entry addresses are stored); tables are never freed.
        let &(start, end, module) = unsafe { &*(last as *const Range) };
        if start <= pc && pc < end {
            return Some(module);
        }
    }
    let after = slots.partition_point(|&(start, _, _)| start <= pc);
    let found = slots.get(after.checked_sub(1)?)?;
    let &(_, end, module) = found;
    if pc < end {
        LAST_FOUND.with(|cell| cell.set(found as *const Range as usize));
        Some(module)
    } else {
        None
    }
}

/// mcount slow path: `selfpc` is in no known module. If the calling thread is inside `dlopen`, this is code of
/// a module being initialised (a constructor): register the new modules now and return the callee's.
/// Not async-signal-safe in that case (it scans), which is why only the `dlopen` thread does it.
pub fn module_loaded_during_open(selfpc: RuntimeAddress) -> Option<&'static LiveModule> {
    if !mslprof_loader_hooks::open_in_progress() {
        return None;
    }
    if mslprof_loader_hooks::refresh_during_open() {
        find_address(selfpc)
    } else {
        None
    }
}

/// In a forked child, whose profile covers only the child: forgets every sample the parent had counted
/// (the arcs are mcount's to reset). Only valid while no handler can write (after fork there is one thread).
/// A module without samples is left untouched: its histogram is all zero (a sample is counted in `samples`
/// before its bucket), and storing into it would cost the child a copy-on-write fault.
pub fn reset_samples_after_fork() {
    for module in all() {
        if module.samples.load(Ordering::Relaxed) == 0 {
            continue;
        }
        module.samples.store(0, Ordering::Relaxed);
        if let Some(histogram) = &module.histogram {
            histogram.reset();
        }
    }
}

/// Changes whenever a new table is published (a load or unload): a cache of lookups made under one
/// generation is stale under another (used by the mcount call cache).
pub fn generation() -> usize {
    CURRENT.load(Ordering::Acquire) as usize
}

/// Every load instance created so far, in load order (loaded and unloaded ones).
pub fn all() -> &'static [&'static LiveModule] {
    current().map_or(&[], |t| t.all.as_slice())
}

/// The load instance with this key (loaded or unloaded).
pub fn by_key(key: u32) -> Option<&'static LiveModule> {
    all().iter().copied().find(|m| m.key == key)
}

/// How new modules are set up: which ones are profiled and with which bucket width.
#[derive(Debug)]
pub struct ModulePolicy<'a> {
    pub selection: &'a Selection,
    pub bucket_bits: BucketBits,
}

/// A change to the table, applied atomically by [`update`].
#[derive(Debug)]
pub struct TableUpdate<'a> {
    policy: &'a ModulePolicy<'a>,
    all: Vec<&'static LiveModule>,
}

impl TableUpdate<'_> {
    /// Adds a newly loaded module (gets a new key) and returns it.
    pub fn add(&mut self, info: ModuleInfo) -> &'static LiveModule {
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let profiled = self.policy.selection.selects(&info);
        let module = LiveModule::new(key, key, info, profiled, self.policy.bucket_bits);
        let module: &'static LiveModule = Box::leak(Box::new(module));
        self.all.push(module);
        module
    }

    /// Marks a module unloaded: it leaves the address lookup but keeps its data for the dump.
    pub fn unload(&mut self, key: u32) {
        if let Some(module) = self.all.iter().find(|m| m.key == key && !m.is_unloaded()) {
            module.unload_order.store(
                NEXT_UNLOAD.fetch_add(1, Ordering::Relaxed),
                Ordering::Relaxed,
            );
        }
    }

    /// Loaded modules, in load order.
    pub fn loaded(&self) -> impl Iterator<Item = &'static LiveModule> + '_ {
        self.all.iter().copied().filter(|m| !m.is_unloaded())
    }
}

/// Applies `change` and publishes the resulting table. Writers are serialised; readers never wait.
pub fn update<R>(policy: &ModulePolicy<'_>, change: impl FnOnce(&mut TableUpdate<'_>) -> R) -> R {
    let _writer = WRITER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut pending = TableUpdate {
        policy,
        all: all().to_vec(),
    };
    let result = change(&mut pending);
    let mut by_address: Vec<(RuntimeAddress, RuntimeAddress, &'static LiveModule)> = pending
        .loaded()
        .flat_map(|m| {
            m.runtime_ranges
                .iter()
                .map(move |&(start, end)| (start, end, m))
        })
        .filter(|&(start, end, _)| start < end)
        .collect();
    by_address.sort_by_key(|&(start, end, _)| (start, end));
    // Overlapping ranges would make the binary search ambiguous; a later module cannot overlap a loaded one in
    // a sane process, but keep the table well-formed whatever the loader reported.
    by_address.dedup_by(|next, previous| next.0 < previous.1);
    let table = Box::leak(Box::new(Table {
        by_address,
        all: pending.all,
    }));
    CURRENT.store(table, Ordering::Release);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash tables find every name a loaded module defines, as a scan of all its symbols does, and
    /// names it does not define nowhere; every name it imports is an import by `imports_any`, and names it
    /// does not import are not. ld.so and libc have both kinds of table.
    #[test]
    fn hash_lookups_of_dynamic_symbols_agree_with_a_scan() {
        let mut tables = [0; 2];
        let (mut names, mut imports) = (0, 0);
        for info in mslprof_loader_hooks::scan_loaded_modules() {
            if info.dynamic == 0 || info.is_vdso {
                continue;
            }
            // The modules a test process starts with stay loaded.
            let Some(symbols) = dynamic_symbols(&info) else {
                continue;
            };
            let lookups = symbols.lookups();
            let mut definitions = std::collections::HashMap::<&[u8], Vec<usize>>::new();
            for lookup in lookups.iter().filter(|lookup| !lookup.import) {
                definitions
                    .entry(&lookup.name)
                    .or_default()
                    .push(lookup.address);
            }
            for lookup in &lookups {
                let shown = String::from_utf8_lossy(&lookup.name);
                // A name defined at two versions is found at one of them; an import is found at all.
                let finds = |found: &Option<usize>| {
                    found.is_some_and(|address| {
                        lookup.import || definitions[lookup.name.as_slice()].contains(&address)
                    })
                };
                assert!(finds(&lookup.by_scan), "{shown}");
                for (kind, found) in [lookup.by_gnu_hash, lookup.by_sysv_hash].iter().enumerate() {
                    if let Some(found) = found {
                        assert!(finds(found), "{shown} by table {kind}: {found:x?}");
                        tables[kind] += 1;
                    }
                }
                if lookup.import {
                    assert_eq!(lookup.imported, Some(true), "{shown} imported");
                    imports += 1;
                } else {
                    names += 1;
                }
            }
            assert_eq!(symbols.defined(b"no such symbol, surely"), None);
            assert!(!symbols.imports_any(&[b"no such symbol, surely", b"mcount"]));
        }
        assert!(
            names > 1000 && imports > 100 && tables[0] > 1000 && tables[1] > 1000,
            "{names} {imports} {tables:?}"
        );
    }

    fn find(pc: usize) -> Option<&'static LiveModule> {
        find_address(RuntimeAddress::from_usize(pc))
    }
    use mslprof_loader_hooks::LinkRange;

    fn info(name: &str, bias: usize, ranges: &[(u64, u64)]) -> ModuleInfo {
        ModuleInfo {
            bias,
            path: format!("/lib/{name}").into_bytes(),
            file_name: name.as_bytes().to_vec(),
            exec_ranges: ranges
                .iter()
                .map(|&(start, end)| LinkRange { start, end })
                .collect(),
            ..ModuleInfo::default()
        }
    }

    // One test owns the global table, so the checks run in a fixed order.
    #[test]
    fn find_add_unload_and_reload() {
        let selection = Selection::parse(Some(b"liba.so"));
        let policy = ModulePolicy {
            selection: &selection,
            bucket_bits: BucketBits::Sixteen,
        };
        let (a, b) = update(&policy, |u| {
            (
                u.add(info("liba.so", 0x10_0000, &[(0x1000, 0x2000)])),
                u.add(info("libb.so", 0x20_0000, &[(0, 0x100)])),
            )
        });
        assert!(a.profiled && a.histogram.is_some());
        assert!(!b.profiled && b.histogram.is_none());
        assert_ne!(a.key, b.key);
        assert_eq!(find(0x10_1000).map(|m| m.key), Some(a.key));
        assert_eq!(find(0x10_1fff).map(|m| m.key), Some(a.key));
        assert!(find(0x10_2000).is_none());
        assert!(find(0x10_0fff).is_none());
        assert_eq!(find(0x20_0000).map(|m| m.key), Some(b.key));
        assert!(
            a.contains_address(RuntimeAddress(0x10_1234))
                && !a.contains_address(RuntimeAddress(0x20_0000))
        );
        assert_eq!(
            a.link_address(RuntimeAddress(0x10_1234)),
            LinkAddress(0x1234)
        );

        a.record_sample(RuntimeAddress(0x10_1234));
        assert_eq!(a.samples.load(Ordering::Relaxed), 1);
        assert_eq!(a.histogram.as_ref().unwrap().total(), 1);

        update(&policy, |u| u.unload(a.key));
        assert!(a.is_unloaded());
        assert!(find(0x10_1234).is_none());
        let again = update(&policy, |u| {
            u.add(info("liba.so", 0x10_0000, &[(0x1000, 0x2000)]))
        });
        assert_ne!(again.key, a.key, "a reload is a new load instance");
        assert_eq!(find(0x10_1234).map(|m| m.key), Some(again.key));
        assert_eq!(
            again.samples.load(Ordering::Relaxed),
            0,
            "a reload never inherits the old counts"
        );
        assert_eq!(all().len(), 3);
        assert_eq!(by_key(a.key).map(|m| m.unload_order()), Some(1));
    }
}
