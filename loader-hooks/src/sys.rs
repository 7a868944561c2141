//! The one place where loader-hooks calls libc or makes system calls: dl_iterate_phdr, getauxval, raw reads of
//! mapped ELF memory, dlsym, the futex behind the loader lock, fork handlers, signal actions and masks, and the
//! process-ending calls. The assembly (exec-family and loader stubs) is in stubs.rs.
//!
//! The signal part is public: the runtime's SIGPROF policy (`program_sigprof.rs`) uses the same wrappers and
//! types, so the program's signal actions are read and set one way in the whole library.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use mslprof_format::{LoadBias, RuntimeAddress};

/// ELF program header. mslprof supports 64-bit Linux targets (x86_64, aarch64) only.
#[cfg(target_pointer_width = "64")]
pub(crate) type ProgramHeader = libc::Elf64_Phdr;

/// One object as `dl_iterate_phdr` reports it, borrowed for the duration of the callback.
pub(crate) struct LoadedObject<'a> {
    /// `dlpi_addr`: the load bias (runtime address − link-time address).
    pub bias: LoadBias,
    /// `dlpi_name` (empty for the main program).
    pub name: &'a [u8],
    pub program_headers: &'a [ProgramHeader],
    /// `dlpi_adds` / `dlpi_subs`: how many objects the loader has added / removed so far.
    pub adds: u64,
    pub subs: u64,
}

/// Calls `visit` once per loaded object, in the loader's order, while the loader's lock is held.
pub(crate) fn for_each_loaded_object(visit: &mut dyn FnMut(&LoadedObject<'_>)) {
    unsafe extern "C" fn callback(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut &mut dyn FnMut` passed below, alive for the whole dl_iterate_phdr call.
        let visit = unsafe { &mut *(data as *mut &mut dyn FnMut(&LoadedObject<'_>)) };
        // SAFETY: glibc passes a valid dl_phdr_info for the duration of the callback.
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader's link map.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let program_headers = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers mapped with the object.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        // dlpi_adds/dlpi_subs exist only when the loader's struct is big enough to hold them.
        let has_counters = size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
        let object = LoadedObject {
            bias: LoadBias(info.dlpi_addr),
            name,
            program_headers,
            adds: if has_counters { info.dlpi_adds } else { 0 },
            subs: if has_counters { info.dlpi_subs } else { 0 },
        };
        // A panic must not unwind through the C loader.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(&object))).is_err() {
            return 1;
        }
        0
    }
    let mut visit = visit;
    // SAFETY: the callback only dereferences what glibc hands it and our own closure pointer.
    unsafe {
        libc::dl_iterate_phdr(
            Some(callback),
            &mut visit as *mut &mut dyn FnMut(&LoadedObject<'_>) as *mut c_void,
        );
    }
}

/// `getauxval(kind)`, 0 when absent.
pub(crate) fn aux_value(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}

/// The system page size (a power of two).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 && (size as usize).is_power_of_two() {
        size as usize
    } else {
        4096
    }
}

pub(crate) use libc::{AT_BASE, AT_PHDR, AT_SYSINFO_EHDR};

/// Borrows `len` bytes of the process's memory at `address`.
///
/// # Safety
/// `[address, address + len)` must lie in readable memory that stays mapped for `'a` (for example inside a
/// readable PT_LOAD segment of an object that cannot be unloaded meanwhile).
pub(crate) unsafe fn mapped_bytes<'a>(address: RuntimeAddress, len: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(address.as_usize() as *const u8, len) }
}

// ---------------------------------------------------------------------------------------------------------
// Loader events: symbol look-up of the functions we interpose, the thread/process identity calls, the futex
// behind the loader lock, fork handlers, the environment, a short sleep.
// ---------------------------------------------------------------------------------------------------------

/// The next definition of `name` after libmslprof.so in the lookup order (libc's), or 0.
///
/// `name` must be NUL-terminated.
pub(crate) fn next_definition(name: &[u8]) -> usize {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle for a caller inside a loaded object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) as usize }
}

/// The calling thread's kernel thread id. Async-signal-safe. A `syscall` instruction inlined here, not libc's
/// wrapper: the fork path runs it in the child, where every code page not yet run there costs a page fault.
#[inline]
pub fn thread_id() -> i32 {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { syscalls::raw_syscall!(syscalls::Sysno::gettid) as i32 }
}

/// The calling process's id (never cached, so correct in a vfork/clone child). Async-signal-safe; a `syscall`
/// instruction inlined here, as [`thread_id`].
#[inline]
pub fn process_id() -> i32 {
    // SAFETY: getpid takes no argument and cannot fail.
    unsafe { syscalls::raw_syscall!(syscalls::Sysno::getpid) as i32 }
}

/// Blocks until `*word != expected` may hold (spurious wake-ups allowed).
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a valid, aligned u32 for the whole call; FUTEX_WAIT_PRIVATE only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes one thread blocked in [`futex_wait`] on `word`.
pub(crate) fn futex_wake_one(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE_PRIVATE does not access it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1,
        );
    }
}

/// The thread's errno, saved so that our bookkeeping inside an interposed call leaves it as the real call set it.
pub struct SavedErrno(c_int);

impl SavedErrno {
    pub fn save() -> Self {
        // SAFETY: __errno_location always returns the calling thread's errno slot.
        SavedErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        // SAFETY: as in `save`.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// Registers fork handlers (`pthread_atfork`). Returns false when glibc refused (out of memory).
pub(crate) fn register_fork_handlers(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> bool {
    // SAFETY: the handlers are plain functions of this library, which is never unloaded.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) == 0 }
}

/// Reads an environment variable without allocating (`getenv`). Not for use in a signal handler.
pub(crate) fn environment_value(name: &[u8]) -> Option<&'static [u8]> {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is NUL-terminated; getenv returns a pointer into the environment or NULL.
    let value = unsafe { libc::getenv(name.as_ptr() as *const c_char) };
    if value.is_null() {
        None
    } else {
        // SAFETY: a non-NULL getenv result is a NUL-terminated string that lives as long as the environment
        // entry; we read it immediately at start-up, before the program can change its environment.
        Some(unsafe { CStr::from_ptr(value) }.to_bytes())
    }
}

/// Sleeps about 10 ms (nanosleep). Async-signal-safe.
pub(crate) fn sleep_10ms() {
    let pause = libc::timespec {
        tv_sec: 0,
        tv_nsec: 10_000_000,
    };
    // SAFETY: `pause` is a valid timespec; the remainder pointer may be NULL.
    unsafe {
        libc::nanosleep(&pause, std::ptr::null_mut());
    }
}

// ---------------------------------------------------------------------------------------------------------
// Signals: actions (through libc's own `sigaction`, since the runtime exports one), masks, delivery. Public for
// the runtime's SIGPROF policy.
// ---------------------------------------------------------------------------------------------------------

/// A signal disposition as `sigaction` reports it.
pub type SignalAction = libc::sigaction;
/// The handler type of an SA_SIGINFO action.
pub type SignalHandler = extern "C" fn(c_int, *mut SignalInfo, *mut c_void);
/// What the kernel tells an SA_SIGINFO handler about one delivery.
pub type SignalInfo = libc::siginfo_t;
/// A set of signals (an action's mask, a thread's mask).
pub type SignalMask = libc::sigset_t;
/// A handler value as `signal(2)` takes and returns it (`SIG_DFL`, `SIG_IGN`, `SIG_ERR` or a function).
pub type SignalDisposition = libc::sighandler_t;
/// An interval timer's setting, as `setitimer(2)` takes it.
pub type TimerSetting = libc::itimerval;

pub use libc::{
    ITIMER_PROF, SA_NODEFER, SA_ONSTACK, SA_RESETHAND, SA_RESTART, SA_SIGINFO, SIG_DFL, SIG_ERR,
    SIG_IGN, SIGABRT, SIGBUS, SIGFPE, SIGHUP, SIGILL, SIGINT, SIGPROF, SIGSEGV, SIGTERM,
};

/// How many 64-bit words a [`SignalMask`] holds.
pub const MASK_WORDS: usize = std::mem::size_of::<SignalMask>() / 8;

/// The words of `mask`, to keep it in atomics.
pub fn mask_words(mask: &SignalMask) -> [u64; MASK_WORDS] {
    // SAFETY: sigset_t is plain data of exactly MASK_WORDS 64-bit words.
    unsafe { std::mem::transmute_copy(mask) }
}

/// The mask made of `words` (the inverse of [`mask_words`]).
pub fn mask_from_words(words: &[u64; MASK_WORDS]) -> SignalMask {
    // SAFETY: same size, plain data; any bit pattern is a valid sigset_t.
    unsafe { std::mem::transmute_copy(words) }
}

/// The empty mask.
pub fn no_signals() -> SignalMask {
    mask_from_words(&[0; MASK_WORDS])
}

/// The mask holding every signal.
pub fn all_signals() -> SignalMask {
    let mut mask = no_signals();
    // SAFETY: a valid sigset_t of ours.
    unsafe { libc::sigfillset(&mut mask) };
    mask
}

/// The signals a fault in a handler raises at once (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS): never
/// blocked by the runtime's own handlers, since the kernel kills a process whose fault signal is blocked.
const FAULT_SIGNALS: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Every signal but the [`FAULT_SIGNALS`]: what a handler of the runtime's blocks while it runs, so that no
/// handler of the program's runs on top of it, in the middle of its work. A signal that comes meanwhile is
/// delivered as the handler returns, to the code it interrupted.
pub fn all_but_fault_signals() -> SignalMask {
    let mut mask = all_signals();
    for signal in FAULT_SIGNALS {
        // SAFETY: a valid sigset_t of ours and a valid signal number.
        unsafe { libc::sigdelset(&mut mask, signal) };
    }
    mask
}

/// The mask the kernel would give a handler of `signal` installed with `flags` and `mask`, delivered into the
/// code `context` interrupted: that code's mask, `mask`, and `signal` itself unless SA_NODEFER.
///
/// # Safety
/// `context` is the ucontext the kernel passed to an SA_SIGINFO handler.
pub unsafe fn delivery_mask(
    context: *const c_void,
    signal: c_int,
    flags: c_int,
    mask: &SignalMask,
) -> SignalMask {
    // SAFETY: the kernel's ucontext, as the caller guarantees.
    let interrupted = unsafe { (*(context as *const libc::ucontext_t)).uc_sigmask };
    let mut words = mask_words(&interrupted);
    for (word, added) in words.iter_mut().zip(mask_words(mask)) {
        *word |= added;
    }
    let mut delivered = mask_from_words(&words);
    if flags & SA_NODEFER == 0 {
        // SAFETY: a valid sigset_t of ours and a valid signal number.
        unsafe { libc::sigaddset(&mut delivered, signal) };
    }
    delivered
}

/// libc's `sigaction`, found once (the runtime exports its own `sigaction`, which must not be re-entered).
fn real_sigaction() -> usize {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let known = REAL.load(Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let found = next_definition(b"sigaction\0");
    REAL.store(found, Ordering::Relaxed);
    found
}

/// Resolves libc's `sigaction` ahead of any signal handler needing it.
pub fn resolve_real_sigaction() -> bool {
    real_sigaction() != 0
}

/// libc's `sigaction(signal, action, old)` with its result and errno; -1 (errno untouched) if libc's cannot be
/// found. Async-signal-safe once resolved.
///
/// # Safety
/// As `sigaction(2)`: `action` and `old` are null or valid.
pub unsafe fn real_sigaction_call(
    signal: c_int,
    action: *const SignalAction,
    old: *mut SignalAction,
) -> c_int {
    let real = real_sigaction();
    if real == 0 {
        return -1;
    }
    type SigactionFn = unsafe extern "C" fn(c_int, *const SignalAction, *mut SignalAction) -> c_int;
    // SAFETY: `real` is libc's sigaction, found by dlsym(RTLD_NEXT).
    let real: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(real) };
    // SAFETY: null or valid pointers, as the caller guarantees.
    unsafe { real(signal, action, old) }
}

/// libc's `sigaction(signal, new, old)`; false on failure. Async-signal-safe once resolved.
pub fn set_and_get_action(
    signal: c_int,
    new: Option<&SignalAction>,
    old: Option<&mut SignalAction>,
) -> bool {
    let new = new.map_or(std::ptr::null(), |n| n as *const SignalAction);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut SignalAction);
    // SAFETY: both pointers are null or valid sigaction structs.
    unsafe { real_sigaction_call(signal, new, old) == 0 }
}

/// An all-zero action: SIG_DFL, empty mask, no flags.
pub fn empty_action() -> SignalAction {
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL with an empty mask.
    unsafe { std::mem::zeroed() }
}

/// An action running `handler` with `flags` (SA_SIGINFO added) and `mask` blocked while it runs.
pub fn handler_action(handler: SignalHandler, flags: c_int, mask: &SignalMask) -> SignalAction {
    let mut action = empty_action();
    action.sa_sigaction = handler as usize;
    action.sa_flags = flags | SA_SIGINFO;
    action.sa_mask = *mask;
    action
}

/// Whether the kernel itself generated this delivery (a fault; `si_code > 0`), rather than `kill`, `raise`
/// or a timer.
///
/// # Safety
/// `info` is null or the siginfo the kernel passed to an SA_SIGINFO handler.
pub unsafe fn sent_by_kernel(info: *const SignalInfo) -> bool {
    // SAFETY: null or valid, as the caller guarantees.
    unsafe { info.as_ref() }.is_some_and(|info| info.si_code > 0)
}

/// Calls a program's handler the way the kernel would have: plain or SA_SIGINFO form. Masks are the caller's
/// business.
///
/// # Safety
/// `handler` must be a real handler (not SIG_DFL/SIG_IGN) that the program installed for `signal`, with
/// `siginfo` telling its form, and `info`/`context` the kernel's values for this delivery.
pub unsafe fn call_program_handler(
    handler: usize,
    siginfo: bool,
    signal: c_int,
    info: *mut SignalInfo,
    context: *mut c_void,
) {
    // SAFETY: guaranteed by the caller: `handler` has the form its SA_SIGINFO flag says.
    unsafe {
        if siginfo {
            let handler: SignalHandler = std::mem::transmute::<usize, SignalHandler>(handler);
            handler(signal, info, context);
        } else {
            let handler: extern "C" fn(c_int) =
                std::mem::transmute::<usize, extern "C" fn(c_int)>(handler);
            handler(signal);
        }
    }
}

/// Blocks `signal` in the calling thread; returns whether it was blocked already. Async-signal-safe; the fork
/// handlers call it, so it is `rt_sigprocmask` made here by a `syscall` instruction (see [`thread_id`]), on the
/// kernel's 64-bit mask (libc's wrapper differs only in never blocking its own internal signals).
#[inline]
pub(crate) fn block_signal(signal: c_int) -> bool {
    change_mask_of_one(libc::SIG_BLOCK, signal)
}

/// Unblocks `signal` in the calling thread. Async-signal-safe, a `syscall` as [`block_signal`].
#[inline]
pub fn unblock_signal(signal: c_int) {
    change_mask_of_one(libc::SIG_UNBLOCK, signal);
}

/// `rt_sigprocmask(how, {signal})`; whether `signal` was in the old mask.
#[inline]
fn change_mask_of_one(how: c_int, signal: c_int) -> bool {
    let bit = 1u64 << ((signal - 1) & 63);
    let mut old = 0u64;
    // SAFETY: both masks are valid 8-byte kernel sigsets for the call (size 8, the kernel's); only the calling
    // thread's mask changes.
    unsafe {
        syscalls::raw_syscall!(
            syscalls::Sysno::rt_sigprocmask,
            how,
            &bit as *const u64,
            &mut old as *mut u64,
            8
        )
    };
    old & bit != 0
}

/// Sets this thread's mask for the life of the guard. Async-signal-safe.
pub struct BlockedSignals(SignalMask);

impl BlockedSignals {
    /// Blocks exactly `mask`'s signals.
    pub fn set(mask: &SignalMask) -> BlockedSignals {
        let mut old = no_signals();
        // SAFETY: both pointers are valid.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, &mut old) };
        BlockedSignals(old)
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in `block`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Sends `signal` to the calling thread. Async-signal-safe.
pub fn raise_in_this_thread(signal: c_int) {
    // SAFETY: tgkill to our own thread has no memory preconditions.
    unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            libc::gettid(),
            signal as libc::c_long,
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// Ending the process.
// ---------------------------------------------------------------------------------------------------------

/// Calls libc's `_exit` found at `real`.
///
/// # Safety
/// `real` must be libc's `_exit` (found with [`next_definition`]).
pub(crate) unsafe fn call_exit(real: usize, status: c_int) -> ! {
    // SAFETY: `real` is libc's `_exit` (caller's guarantee), whose signature this is.
    let real: extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(real) };
    real(status)
}

/// Ends the process at once with `status` (the exit_group system call). Async-signal-safe.
pub(crate) fn exit_group(status: c_int) -> ! {
    // SAFETY: exit_group never returns.
    unsafe {
        libc::syscall(libc::SYS_exit_group, status as libc::c_long);
    }
    // exit_group cannot fail; keep the type checker happy without touching libc's exit handlers.
    loop {
        std::hint::spin_loop();
    }
}

// ---------------------------------------------------------------------------------------------------------
// Test-only look-ups for the dynamic_loading unit tests (dlsym on a handle, dlerror).
// ---------------------------------------------------------------------------------------------------------

#[cfg(test)]
pub(crate) use libc::RTLD_NOW;

/// `dlsym(handle, name)`: the address of `name` in the object behind `handle`, 0 if absent.
///
/// # Safety
/// `handle` must be a live handle returned by `dlopen` (not yet closed).
#[cfg(test)]
pub(crate) unsafe fn symbol_address(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: `handle` is live (guaranteed by the caller) and `name` is NUL-terminated.
    unsafe { libc::dlsym(handle, name.as_ptr()) as usize }
}

/// Whether `dlerror` reports a failure of the last dl* call on this thread (reading it clears it).
#[cfg(test)]
pub(crate) fn loader_error_pending() -> bool {
    // SAFETY: dlerror has no preconditions.
    !unsafe { libc::dlerror() }.is_null()
}
