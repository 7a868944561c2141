//! Load and unload events: `dlopen`, `dlmopen` and `dlclose` interposed without changing who the caller is.
//!
//! # Mechanism (see also loader-hooks/README.md)
//!
//! libmslprof.so defines `dlopen`, `dlmopen` and `dlclose` (exports.rs). Each is a small assembly stub
//! (stubs.rs) that
//!
//! 1. takes the *loader lock* (a re-entrant lock of ours, see [`LoaderLock`]) so that our table and the
//!    loader's list of objects change together: no other thread can map a new object over a range that was just
//!    unmapped before our table has dropped the old one;
//! 2. calls the real function (libc's, found with `dlsym(RTLD_NEXT)`) so that **the return address glibc sees
//!    lies in the caller's own module**. glibc picks the "calling object" from that return address, and uses it
//!    for `$ORIGIN`, `DT_RPATH`/`DT_RUNPATH` and the namespace. An interposer that simply calls the real `dlopen`
//!    makes libmslprof.so the caller and breaks that look-up (uftrace issue #1904). Our stub instead pushes two
//!    return addresses: first our continuation, then the address of a `ret` (byte `0xC3`) inside the caller's
//!    own executable segment, and *jumps* to the real function. glibc sees a return address in the caller's
//!    module; when it returns, the `ret` there pops our continuation;
//! 3. in the continuation, compares the loader's `dlpi_adds`/`dlpi_subs` counters with the last ones seen and,
//!    when they moved, rescans with `dl_iterate_phdr` and hands the whole set to the runtime, which diffs it
//!    against its table. This catches dependencies, nested `dlopen` from constructors, objects removed by a
//!    failed `dlopen`, and loads that did not go through our stub (glibc-internal ones such as NSS);
//! 4. releases the lock and returns the real function's result with `errno` as the real function left it.
//!
//! A `dlclose` that only drops a reference changes neither counter, so it is not an unload.
//!
//! *Before any of its code runs*: constructors run inside the real `dlopen`, before the continuation. The
//! runtime therefore also calls [`refresh_during_open`] when code in no known module runs on the thread that
//! holds the loader lock (an mcount from a constructor of a `-pg` module), which registers the new modules at
//! that moment; samples that hit unknown code while a `dlopen` is in progress are kept aside by the runtime and
//! attributed when the rescan has registered the module ([`open_in_progress`]).
//!
//! Not covered: objects loaded into another namespace by `dlmopen(LM_ID_NEWLM)` are not visible to
//! `dl_iterate_phdr` from the base namespace (glibc reports the caller's namespace only), and their `mcount`
//! binds to that namespace's own libc, so they are counted as unknown code. CET shadow stacks, if a future
//! glibc enables them for a process that has libmslprof.so loaded, would reject the pushed return address;
//! libmslprof.so is not marked SHSTK-compatible, so glibc keeps them off.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use mslprof_format::RuntimeAddress;

use crate::events::{self, LoadCause};
use crate::scan::{self, LoaderScan};
use crate::sys;

/// A re-entrant lock that serialises our interposed loader calls with our rescans.
///
/// Re-entrant because a constructor run by `dlopen` may call `dlopen` again on the same thread. Never taken
/// in a signal handler. Waiting uses a futex, so a thread waiting for a long `dlopen` elsewhere sleeps.
pub struct LoaderLock {
    /// 0 free, 1 locked, 2 locked with waiters.
    state: AtomicU32,
    /// Kernel thread id of the owner, 0 when free.
    owner: AtomicI32,
    /// Recursion depth of the owner.
    depth: AtomicU32,
}

impl LoaderLock {
    const fn new() -> Self {
        LoaderLock {
            state: AtomicU32::new(0),
            owner: AtomicI32::new(0),
            depth: AtomicU32::new(0),
        }
    }

    pub fn lock(&self) {
        let me = sys::thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            self.depth.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.state.swap(2, Ordering::Acquire) != 0 {
                sys::futex_wait(&self.state, 2);
            }
        }
        self.owner.store(me, Ordering::Relaxed);
        self.depth.store(1, Ordering::Relaxed);
    }

    /// Takes the lock if it is free (or already ours); never waits.
    pub fn try_lock(&self) -> bool {
        let me = sys::thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            self.depth.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.owner.store(me, Ordering::Relaxed);
        self.depth.store(1, Ordering::Relaxed);
        true
    }

    pub fn unlock(&self) {
        if self.depth.fetch_sub(1, Ordering::Relaxed) > 1 {
            return;
        }
        self.owner.store(0, Ordering::Relaxed);
        if self.state.swap(0, Ordering::Release) == 2 {
            sys::futex_wake_one(&self.state);
        }
    }

    /// Whether the calling thread holds the lock. Async-signal-safe.
    pub fn held_by_this_thread(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == sys::thread_id()
    }

    /// Whether any thread holds the lock (a load or unload is in progress). Async-signal-safe.
    pub fn is_held(&self) -> bool {
        self.state.load(Ordering::Relaxed) != 0
    }

    /// In a forked child, whose only thread is the one that called fork (with a new thread id): that thread
    /// held the lock (it forked from inside a `dlopen`), so it stays the owner, without waiters.
    #[unsafe(link_section = "mslprof_fork_text")]
    fn adopt_in_child(&self) {
        self.owner.store(sys::thread_id(), Ordering::Relaxed);
        self.state.store(1, Ordering::Relaxed);
    }

    /// In a forked child whose forking thread did not hold the lock: any holder was another thread, which does
    /// not exist in the child.
    #[unsafe(link_section = "mslprof_fork_text")]
    fn reset_in_child(&self) {
        self.owner.store(0, Ordering::Relaxed);
        self.depth.store(0, Ordering::Relaxed);
        self.state.store(0, Ordering::Relaxed);
    }
}

/// The one loader lock.
#[unsafe(link_section = "mslprof_fork_data")]
pub static LOADER_LOCK: LoaderLock = LoaderLock::new();

/// Loader counters (`dlpi_adds`, `dlpi_subs`) at the last scan handed to the runtime; `u64::MAX` before the
/// first.
static SEEN_ADDS: AtomicU64 = AtomicU64::new(u64::MAX);
static SEEN_SUBS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Set while a rescan runs, so that allocation inside it (which may run instrumented code of a malloc we do
/// not know yet) does not start another.
#[unsafe(link_section = "mslprof_fork_data")]
static RESCANNING: AtomicU32 = AtomicU32::new(0);

/// Addresses of the real functions, resolved once (0 until then).
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLMOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

/// Which interposed function a stub stands for.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    Open = 0,
    OpenInNamespace = 1,
    Close = 2,
}

impl Entry {
    fn from_raw(raw: u32) -> Entry {
        match raw {
            0 => Entry::Open,
            1 => Entry::OpenInNamespace,
            _ => Entry::Close,
        }
    }

    fn real(self) -> usize {
        let (slot, name): (&AtomicUsize, &[u8]) = match self {
            Entry::Open => (&REAL_DLOPEN, b"dlopen\0"),
            Entry::OpenInNamespace => (&REAL_DLMOPEN, b"dlmopen\0"),
            Entry::Close => (&REAL_DLCLOSE, b"dlclose\0"),
        };
        let known = slot.load(Ordering::Relaxed);
        if known != 0 {
            return known;
        }
        let found = sys::next_definition(name);
        slot.store(found, Ordering::Relaxed);
        found
    }
}

/// Resolves the real functions ahead of time, so that the first `dlopen` does not call `dlsym` (which would
/// reset a pending `dlerror` message).
pub(crate) fn resolve_real_functions() {
    for entry in [Entry::Open, Entry::OpenInNamespace, Entry::Close] {
        entry.real();
    }
}

/// Called by the stubs (through `stubs::dispatch_loader_call`) before the real function: take the loader lock,
/// find a `ret` in the caller's module to return through (None: not found, the stub uses its own), and the real
/// function.
pub(crate) fn before_loader_call(return_address: usize, entry: u32) -> (Option<usize>, usize) {
    let _errno = sys::SavedErrno::save();
    LOADER_LOCK.lock();
    let entry = Entry::from_raw(entry);
    let caller_ret = std::panic::catch_unwind(|| {
        return_instruction_in_module_of(RuntimeAddress::from_usize(return_address))
    })
    .unwrap_or(None);
    (caller_ret.map(RuntimeAddress::as_usize), entry.real())
}

/// Called by the stubs after the real function returned `result`: rescan if the loader's counters moved,
/// release the lock.
pub(crate) extern "C" fn after_loader_call(entry: u32) {
    let _errno = sys::SavedErrno::save();
    let cause = match Entry::from_raw(entry) {
        Entry::Open | Entry::OpenInNamespace => LoadCause::AfterOpen,
        Entry::Close => LoadCause::AfterClose,
    };
    let _ = std::panic::catch_unwind(|| refresh_locked(cause));
    LOADER_LOCK.unlock();
}

/// If the loader's counters moved since the last scan, scan and tell the runtime. The caller holds the lock.
fn refresh_locked(cause: LoadCause) {
    if RESCANNING.swap(1, Ordering::Acquire) == 1 {
        return;
    }
    let (adds, subs) = loader_counters();
    if adds != SEEN_ADDS.load(Ordering::Relaxed) || subs != SEEN_SUBS.load(Ordering::Relaxed) {
        let current = scan::scan();
        deliver(&current, cause);
    }
    RESCANNING.store(0, Ordering::Release);
}

/// Hands a scan to the runtime and records its counters as seen.
fn deliver(current: &LoaderScan, cause: LoadCause) {
    SEEN_ADDS.store(current.adds, Ordering::Relaxed);
    SEEN_SUBS.store(current.subs, Ordering::Relaxed);
    if let Some(events) = events::handler() {
        events.modules_changed(current, cause);
    }
}

/// The loader's `dlpi_adds`/`dlpi_subs` right now.
fn loader_counters() -> (u64, u64) {
    let mut counters = (0, 0);
    sys::for_each_loaded_object(&mut |object| counters = (object.adds, object.subs));
    counters
}

/// Start-up (POST_INIT + first LOAD_COMPLETE): scan everything loaded now and hand it to the runtime.
pub(crate) fn startup_scan() {
    LOADER_LOCK.lock();
    RESCANNING.store(1, Ordering::Relaxed);
    let _ = std::panic::catch_unwind(|| deliver(&scan::scan(), LoadCause::Explicit));
    RESCANNING.store(0, Ordering::Relaxed);
    LOADER_LOCK.unlock();
}

/// Rescan now if the loaded set changed (fork, exec, termination, or whenever the runtime wants to be sure).
/// Never from a signal handler.
pub fn refresh() {
    LOADER_LOCK.lock();
    let _ = std::panic::catch_unwind(|| refresh_locked(LoadCause::Explicit));
    LOADER_LOCK.unlock();
}

/// For the runtime's mcount slow path: code in no known module ran. If this thread is inside an interposed
/// `dlopen` (it holds the loader lock), the code belongs to a module that is being initialised (a constructor):
/// register the new modules now, before the rest of that code runs. Returns true if a rescan was done.
///
/// Must not be called from a signal handler (it calls `dl_iterate_phdr` and allocates).
pub fn refresh_during_open() -> bool {
    if !LOADER_LOCK.held_by_this_thread() || RESCANNING.load(Ordering::Relaxed) != 0 {
        return false;
    }
    let _errno = sys::SavedErrno::save();
    std::panic::catch_unwind(|| refresh_locked(LoadCause::DuringOpen)).is_ok()
}

/// Whether some thread is inside an interposed `dlopen`/`dlclose` right now (samples in unknown code may belong
/// to a module that is being loaded). Async-signal-safe.
pub fn open_in_progress() -> bool {
    LOADER_LOCK.is_held()
}

/// Runs `f` while no `dlopen` or `dlclose` can run (holding the loader lock), unless one is running now or
/// this thread is inside one: then `None`, at once. For a signal handler that reads and writes modules' code
/// (`mcount::plt_sites`): async-signal-safe (the lock is taken without waiting; releasing it may wake a
/// waiter with one `futex` call).
pub fn while_loader_idle<R>(f: impl FnOnce() -> R) -> Option<R> {
    // An interrupted `lock` or `unlock` of this thread may be between its steps: never re-enter.
    if LOADER_LOCK.held_by_this_thread() || !LOADER_LOCK.try_lock() {
        return None;
    }
    let result = f();
    LOADER_LOCK.unlock();
    Some(result)
}

/// What the fork prepare handler did with the loader lock (kept by fork.rs until the parent's or child's handler).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ForkLock {
    /// The forking thread held the lock before the fork (it forked from inside a `dlopen`).
    held_before: bool,
    /// Prepare took one level of the lock.
    took: bool,
}

impl ForkLock {
    /// Two bits (fork.rs keeps them from the prepare handler to the next).
    pub(crate) fn bits(self) -> u8 {
        u8::from(self.held_before) | u8::from(self.took) << 1
    }

    pub(crate) fn from_bits(bits: u8) -> ForkLock {
        ForkLock {
            held_before: bits & 1 != 0,
            took: bits & 2 != 0,
        }
    }
}

/// `pthread_atfork` prepare: take the loader lock if that costs no waiting, so that the parent's table is not
/// changed during the fork. It never waits: a thread inside `dlopen` may be waiting (in a constructor) for the
/// forking thread, and the module table is consistent at any instant anyway (one pointer swap).
pub(crate) fn lock_for_fork() -> ForkLock {
    let held_before = LOADER_LOCK.held_by_this_thread();
    ForkLock {
        held_before,
        took: LOADER_LOCK.try_lock(),
    }
}

pub(crate) fn unlock_after_fork_in_parent(lock: ForkLock) {
    if lock.took {
        LOADER_LOCK.unlock();
    }
}

/// In the child only the forking thread exists: it keeps the lock if it held it before the fork (a fork from a
/// constructor run by `dlopen`), otherwise the lock and the rescan flag start free.
#[unsafe(link_section = "mslprof_fork_text")]
pub(crate) fn reset_after_fork(lock: ForkLock) {
    if lock.held_before {
        LOADER_LOCK.adopt_in_child();
        if lock.took {
            LOADER_LOCK.unlock();
        }
    } else {
        LOADER_LOCK.reset_in_child();
        RESCANNING.store(0, Ordering::Relaxed);
    }
}

/// A `ret` instruction inside the executable segment of the module that contains `address` (the caller's
/// return address); inside the main program when `address` is in no module, since glibc then treats the main
/// program as the caller too. None if none is found.
fn return_instruction_in_module_of(address: RuntimeAddress) -> Option<RuntimeAddress> {
    const RET: u8 = 0xC3;
    let main_phdr = sys::aux_value(sys::AT_PHDR);
    let mut in_caller = None;
    let mut in_main = None;
    sys::for_each_loaded_object(&mut |object| {
        if in_caller.is_some() {
            return;
        }
        let contains_address = scan::load_segments(object).any(|s| s.contains(address));
        let is_main = object.program_headers.as_ptr() as usize == main_phdr;
        let wanted = contains_address || (is_main && in_main.is_none());
        if !wanted {
            return;
        }
        for segment in scan::load_segments(object).filter(|s| s.readable && s.executable) {
            // SAFETY: a readable, executable PT_LOAD segment of an object that the loader lock (held by us)
            // keeps mapped for the duration of this look-up.
            let text = unsafe { sys::mapped_bytes(segment.start, segment.file_len) };
            // Prefer the `ret` that ends the caller's own function: the first one after the return address.
            let from = usize::try_from(address.0.saturating_sub(segment.start.0))
                .unwrap_or(usize::MAX)
                .min(text.len());
            let found = text[from..]
                .iter()
                .position(|&b| b == RET)
                .map(|i| from + i)
                .or_else(|| text.iter().position(|&b| b == RET));
            if let Some(offset) = found {
                let ret = Some(RuntimeAddress(segment.start.0 + offset as u64));
                if contains_address {
                    in_caller = ret;
                } else {
                    in_main = ret;
                }
                break;
            }
        }
    });
    in_caller.or(in_main)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn somewhere_in_this_module() -> RuntimeAddress {
        RuntimeAddress::from_usize(somewhere_in_this_module as *const () as usize)
    }

    #[test]
    fn the_ret_found_is_a_ret_in_the_callers_module() {
        let address = somewhere_in_this_module();
        let ret = return_instruction_in_module_of(address).expect("a ret");
        // SAFETY: `ret` lies in a mapped executable segment of this test program.
        assert_eq!(unsafe { sys::mapped_bytes(ret, 1) }, [0xC3]);
        let module_of = |pc: RuntimeAddress| {
            let mut found = None;
            sys::for_each_loaded_object(&mut |object| {
                if scan::load_segments(object).any(|s| s.contains(pc)) {
                    found = Some(object.bias);
                }
            });
            found
        };
        assert_eq!(
            module_of(ret),
            module_of(address),
            "same object as the caller"
        );
    }

    #[test]
    fn an_address_in_no_module_uses_the_main_program() {
        let ret = return_instruction_in_module_of(RuntimeAddress(8));
        assert!(ret.is_some(), "the main program has a ret");
    }

    #[test]
    fn the_loader_lock_is_reentrant_and_exclusive() {
        static LOCK: LoaderLock = LoaderLock::new();
        LOCK.lock();
        LOCK.lock();
        assert!(LOCK.held_by_this_thread());
        assert!(LOCK.try_lock(), "re-entrant try_lock");
        LOCK.unlock();
        std::thread::spawn(|| assert!(!LOCK.try_lock(), "another thread cannot take it"))
            .join()
            .unwrap();
        LOCK.unlock();
        assert!(LOCK.is_held(), "one level still held");
        LOCK.unlock();
        assert!(!LOCK.is_held());
        let counter = std::sync::Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        LOCK.lock();
                        // A non-atomic read-modify-write under the lock: lost updates would show a race.
                        let value = counter.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        counter.store(value + 1, Ordering::Relaxed);
                        LOCK.unlock();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 4000);
    }
}
