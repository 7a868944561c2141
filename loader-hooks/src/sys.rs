//! The one place where loader-hooks calls libc or uses assembly: dl_iterate_phdr, getauxval, raw reads of mapped
//! ELF memory, the loader-event calls (dlsym, futex, signals, exit_group) and the naked-assembly stubs that
//! interpose the exec family and dlopen/dlmopen/dlclose.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

/// ELF program header. mslprof supports 64-bit Linux targets (x86_64, aarch64) only.
#[cfg(target_pointer_width = "64")]
pub type ProgramHeader = libc::Elf64_Phdr;

/// One object as `dl_iterate_phdr` reports it, borrowed for the duration of the callback.
pub struct LoadedObject<'a> {
    /// `dlpi_addr`: the load bias (runtime address − link-time address).
    pub bias: usize,
    /// `dlpi_name` (empty for the main program).
    pub name: &'a [u8],
    pub program_headers: &'a [ProgramHeader],
    /// `dlpi_adds` / `dlpi_subs`: how many objects the loader has added / removed so far.
    pub adds: u64,
    pub subs: u64,
}

/// Calls `visit` once per loaded object, in the loader's order, while the loader's lock is held.
pub fn for_each_loaded_object(visit: &mut dyn FnMut(&LoadedObject<'_>)) {
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
            bias: info.dlpi_addr as usize,
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
pub fn aux_value(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}

/// The system page size (a power of two).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 && (size as usize).is_power_of_two() {
        size as usize
    } else {
        4096
    }
}

pub use libc::{AT_BASE, AT_PHDR, AT_SYSINFO_EHDR};

/// Borrows `len` bytes of the process's memory at `address`.
///
/// # Safety
/// `[address, address + len)` must lie in readable memory that stays mapped for `'a` (for example inside a
/// readable PT_LOAD segment of an object that cannot be unloaded meanwhile).
pub unsafe fn mapped_bytes<'a>(address: usize, len: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(address as *const u8, len) }
}

// ---------------------------------------------------------------------------------------------------------
// Loader events (owned by the loader-hooks engineer): symbol look-up of the functions we interpose, the
// thread/process identity calls, the futex behind the loader lock, signals and the process-ending syscalls.
// ---------------------------------------------------------------------------------------------------------

use std::os::raw::c_char;
use std::sync::atomic::AtomicU32;

/// The next definition of `name` after libmslprof.so in the lookup order (libc's), or 0.
///
/// `name` must be NUL-terminated.
pub fn next_definition(name: &[u8]) -> usize {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle for a caller inside a loaded object.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) as usize }
}

/// The calling thread's kernel thread id. Async-signal-safe.
pub fn thread_id() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// The calling process's id (never cached by glibc, so correct in a vfork/clone child). Async-signal-safe.
pub fn process_id() -> i32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() }
}

/// Blocks until `*word != expected` may hold (spurious wake-ups allowed).
pub fn futex_wait(word: &AtomicU32, expected: u32) {
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
pub fn futex_wake_one(word: &AtomicU32) {
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
pub fn register_fork_handlers(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> bool {
    // SAFETY: the handlers are plain functions of this library, which is never unloaded.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) == 0 }
}

/// Blocks `signal` in the calling thread; returns whether it was blocked already.
pub fn block_signal(signal: c_int) -> bool {
    // SAFETY: both sets are valid local values; pthread_sigmask and sigismember only read/write them.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, signal);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::sigismember(&old, signal) == 1
    }
}

/// A signal disposition as `sigaction` reports it.
pub type SignalAction = libc::sigaction;

/// The handler type of an SA_SIGINFO action.
pub type SignalHandler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

/// libc's `sigaction` (the runtime exports its own `sigaction`, which must not be re-entered from here).
fn real_sigaction() -> usize {
    static REAL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let known = REAL.load(std::sync::atomic::Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    let found = next_definition(b"sigaction\0");
    REAL.store(found, std::sync::atomic::Ordering::Relaxed);
    found
}

/// Resolves libc's `sigaction` ahead of any signal handler needing it.
pub fn resolve_real_sigaction() -> bool {
    real_sigaction() != 0
}

/// libc's `sigaction(signal, new, old)`; false on failure. Async-signal-safe once resolved.
pub fn set_and_get_action(
    signal: c_int,
    new: Option<&SignalAction>,
    old: Option<&mut SignalAction>,
) -> bool {
    let real = real_sigaction();
    if real == 0 {
        return false;
    }
    type SigactionFn = unsafe extern "C" fn(c_int, *const SignalAction, *mut SignalAction) -> c_int;
    // SAFETY: `real` is libc's sigaction, found by dlsym(RTLD_NEXT).
    let real: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(real) };
    let new = new.map_or(std::ptr::null(), |n| n as *const SignalAction);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut SignalAction);
    // SAFETY: both pointers are null or valid sigaction structs.
    unsafe { real(signal, new, old) == 0 }
}

/// An all-zero action: SIG_DFL, empty mask, no flags.
pub fn empty_action() -> SignalAction {
    // SAFETY: sigaction is plain data; all-zero is SIG_DFL with an empty mask.
    unsafe { std::mem::zeroed() }
}

/// An action running `handler` with `flags` (SA_SIGINFO added) and `mask` (None: every signal).
pub fn handler_action(
    handler: SignalHandler,
    flags: c_int,
    mask: Option<&libc::sigset_t>,
) -> SignalAction {
    let mut action = empty_action();
    action.sa_sigaction = handler as usize;
    action.sa_flags = flags | libc::SA_SIGINFO;
    match mask {
        Some(mask) => action.sa_mask = *mask,
        // SAFETY: a valid sigset_t inside our local struct.
        None => unsafe {
            libc::sigfillset(&mut action.sa_mask);
        },
    }
    action
}

/// Calls a program's handler the way the kernel would have. The program's mask must already be in force (here
/// the kernel applied it, since our real action carries the program's mask and flags; the runtime's SIGPROF
/// handler blocks it itself).
///
/// # Safety
/// `handler` must be a real handler (not SIG_DFL/SIG_IGN) that the program installed for `signal`, with
/// `siginfo` telling its form, and `info`/`context` the kernel's values for this delivery.
pub unsafe fn call_program_handler(
    handler: usize,
    siginfo: bool,
    signal: c_int,
    info: *mut libc::siginfo_t,
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

/// Unblocks `signal` in the calling thread. Async-signal-safe.
pub fn unblock_signal(signal: c_int) {
    // SAFETY: valid local sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
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

/// Ends the process at once with `status` (the exit_group system call). Async-signal-safe.
pub fn exit_group(status: c_int) -> ! {
    // SAFETY: exit_group never returns.
    unsafe {
        libc::syscall(libc::SYS_exit_group, status as libc::c_long);
    }
    // exit_group cannot fail; keep the type checker happy without touching libc's exit handlers.
    loop {
        std::hint::spin_loop();
    }
}

/// Reads an environment variable without allocating (`getenv`). Not for use in a signal handler.
pub fn environment_value(name: &[u8]) -> Option<&'static [u8]> {
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
pub fn sleep_10ms() {
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
// Test-only look-ups for the dynamic_loading unit tests (dlsym on a handle, dlerror).
// ---------------------------------------------------------------------------------------------------------

/// `dlsym(handle, name)`: the address of `name` in the object behind `handle`, 0 if absent.
///
/// # Safety
/// `handle` must be a live handle returned by `dlopen` (not yet closed).
#[cfg(test)]
pub unsafe fn symbol_address(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: `handle` is live (guaranteed by the caller) and `name` is NUL-terminated.
    unsafe { libc::dlsym(handle, name.as_ptr()) as usize }
}

/// Whether `dlerror` reports a failure of the last dl* call on this thread (reading it clears it).
#[cfg(test)]
pub fn loader_error_pending() -> bool {
    // SAFETY: dlerror has no preconditions.
    !unsafe { libc::dlerror() }.is_null()
}

// ---------------------------------------------------------------------------------------------------------
// Assembly: exec-family stubs. The Rust side (`before_exec`, which writes the PRE_EXEC profile and returns the
// real function) is in process.rs.
// ---------------------------------------------------------------------------------------------------------

/// Generates a stub for one exec function. All argument registers and `al` (the vector-register count of a
/// variadic call) are preserved and the stack is left exactly as the caller built it (variadic `execl` passes
/// arguments beyond the sixth on the stack), then it jumps to the real function, which never returns here.
macro_rules! exec_stub {
    ($name:ident, $index:expr, fn($($arg:ident: $ty:ty),*)) => {
        /// Interposed exec function: the profile of the current image is written first (flag PRE_EXEC).
        ///
        /// # Safety
        /// The same contract as the libc function of the same name.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> libc::c_int {
            core::arch::naked_asm!(
                "endbr64",
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "push r8",
                "push r9",
                "push rax",
                "mov edi, {index}",
                "call {before}",
                "mov r11, rax",
                "pop rax",
                "pop r9",
                "pop r8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "test r11, r11",
                "jz 3f",
                "jmp r11",
                "3:",
                "mov eax, -1",
                "ret",
                index = const $index as u32,
                before = sym crate::process::before_exec,
            )
        }
    };
}

type CStrPtr = *const libc::c_char;
type CStrArray = *const *const libc::c_char;

exec_stub!(
    execve,
    0,
    fn(path: CStrPtr, argv: CStrArray, envp: CStrArray)
);
exec_stub!(execv, 1, fn(path: CStrPtr, argv: CStrArray));
exec_stub!(execvp, 2, fn(file: CStrPtr, argv: CStrArray));
exec_stub!(
    execvpe,
    3,
    fn(file: CStrPtr, argv: CStrArray, envp: CStrArray)
);
// The variadic ones are declared with their fixed arguments only; the stub forwards everything untouched.
exec_stub!(execl, 4, fn(path: CStrPtr, arg0: CStrPtr));
exec_stub!(execlp, 5, fn(file: CStrPtr, arg0: CStrPtr));
exec_stub!(execle, 6, fn(path: CStrPtr, arg0: CStrPtr));
exec_stub!(
    fexecve,
    7,
    fn(fd: libc::c_int, argv: CStrArray, envp: CStrArray)
);
exec_stub!(
    execveat,
    8,
    fn(dirfd: libc::c_int, path: CStrPtr, argv: CStrArray, envp: CStrArray, flags: libc::c_int)
);

// ---------------------------------------------------------------------------------------------------------
// Assembly: loader stubs (dlopen, dlmopen, dlclose) that keep the caller's return address. The Rust side
// (`before_loader_call`/`after_loader_call`: loader lock, finding the caller's `ret`, rescans) and the
// mechanism's description are in dynamic_loading.rs.
// ---------------------------------------------------------------------------------------------------------

/// A lone `ret` in our own text: the fallback return address the loader stubs hand to the real function.
///
/// A naked Rust function rather than a label in `global_asm!`: a label there is local to the codegen unit
/// that holds the assembly, so a release build (several codegen units) left the reference undefined and
/// every program that preloaded the runtime died with "undefined symbol: mslprof_loader_ret".
#[unsafe(naked)]
extern "C" fn loader_ret() {
    core::arch::naked_asm!("ret")
}

/// The address of the lone `ret` in our own text ([`loader_ret`]): the fallback return address the loader
/// stubs hand to the real function when no `ret` is found in the caller's module.
pub fn stub_ret_address() -> usize {
    loader_ret as *const () as usize
}

/// Generates one interposing stub. On entry the stack holds the caller's return address R (rsp ≡ 8 mod 16).
/// The argument registers are saved, `before_loader_call(R, entry)` returns the `ret` address G and the real
/// function F, the arguments are restored, and the stack becomes `[G][continuation][R]` before jumping to F,
/// so F sees G (in the caller's module) as its return address and runs with the ABI's alignment. F returns to
/// G, whose `ret` pops the continuation, which calls `after_loader_call(entry)` and returns F's result to R.
macro_rules! interposer {
    ($(#[$doc:meta])* $name:ident, $entry:expr, fn($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The same contract as the libc function of the same name.
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                "endbr64",
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "sub rsp, 8",
                "mov rdi, [rsp + 40]",
                "mov esi, {entry}",
                "call {before}",
                "mov r10, rax",
                "mov r11, rdx",
                "add rsp, 8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "lea rax, [rip + 2f]",
                "push rax",
                "push r10",
                "jmp r11",
                "2:",
                "push rax",
                "mov edi, {entry}",
                "call {after}",
                "pop rax",
                "ret",
                entry = const $entry as u32,
                before = sym crate::dynamic_loading::before_loader_call,
                after = sym crate::dynamic_loading::after_loader_call,
            )
        }
    };
}

interposer!(
    /// `dlopen`, interposed: loads exactly what libc's would (same calling object), then reports the new modules.
    dlopen, crate::dynamic_loading::Entry::Open,
    fn(file: *const libc::c_char, mode: libc::c_int) -> *mut libc::c_void
);
interposer!(
    /// `dlmopen`, interposed like [`dlopen`].
    dlmopen, crate::dynamic_loading::Entry::OpenInNamespace,
    fn(namespace: libc::Lmid_t, file: *const libc::c_char, mode: libc::c_int) -> *mut libc::c_void
);
interposer!(
    /// `dlclose`, interposed: reports the modules it really unloaded (none if it only dropped a reference).
    dlclose, crate::dynamic_loading::Entry::Close, fn(handle: *mut libc::c_void) -> libc::c_int
);
