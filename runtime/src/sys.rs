//! The one place where the runtime calls libc or reads machine state: memory reservation, stderr lines,
//! errno, auxiliary vector, symbol lookup.

use std::ffi::CStr;
use std::os::raw::c_void;

/// Reserves `len` bytes of zeroed, private, anonymous memory that costs nothing until touched.
pub fn reserve_zeroed(len: usize) -> Option<usize> {
    // SAFETY: an anonymous private mapping at an address the kernel picks has no preconditions.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (address != libc::MAP_FAILED).then_some(address as usize)
}

/// Writes the concatenation of `parts` to stderr with one write(2) call when it fits 1 KiB (so lines from
/// several processes do not interleave). No allocation; safe in a signal handler. errno is preserved.
pub fn stderr_line(parts: &[&[u8]]) {
    let saved = SavedErrno::save();
    let mut buffer = [0u8; 1024];
    let mut used = 0;
    for part in parts {
        let n = part.len().min(buffer.len() - used);
        buffer[used..used + n].copy_from_slice(&part[..n]);
        used += n;
    }
    if used == buffer.len() {
        buffer[used - 1] = b'\n';
    }
    write_all(2, &buffer[..used]).ok();
    drop(saved);
}

/// Restores errno when dropped: loader-hooks' guard, the one both crates use.
pub use mslprof_loader_hooks::SavedErrno;

/// This thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

/// Writes all of `bytes` to `fd`, retrying on EINTR and short writes.
pub fn write_all(fd: i32, mut bytes: &[u8]) -> Result<(), i32> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const c_void, bytes.len()) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// `getauxval(AT_SECURE) != 0`: the process runs setuid/setgid or with other elevated credentials.
pub fn is_secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// The next definition of `name` after this library (`dlsym(RTLD_NEXT)`), e.g. libc's `sigaction`.
pub fn next_symbol(name: &CStr) -> Option<usize> {
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name has no further preconditions.
    let address = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!address.is_null()).then_some(address as usize)
}

/// The global definition of `name` (`dlsym(RTLD_DEFAULT)`), e.g. a symbol the program defines.
pub fn global_symbol(name: &CStr) -> Option<usize> {
    // SAFETY: as in next_symbol.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address as usize)
}

/// Reads an `int` at an address a symbol lookup returned.
///
/// # Safety
/// `address` must be the address of a live, aligned `int`.
pub unsafe fn read_int(address: usize) -> i32 {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::read_volatile(address as *const i32) }
}

pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

pub fn getppid() -> u32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() as u32 }
}

/// The kernel thread id of the calling thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// `clock_gettime(clock)` in nanoseconds (0 on failure).
pub fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return 0;
    }
    now.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(now.tv_nsec)
}

pub use libc::CLOCK_REALTIME;

/// The whole process's (all threads', finished ones included) user and system CPU time in nanoseconds, from
/// `getrusage(RUSAGE_SELF)`; `None` on failure. A plain syscall: no allocation, errno preserved, safe in a
/// signal handler.
pub fn process_cpu_ns() -> Option<(u64, u64)> {
    let saved = SavedErrno::save();
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer for the call.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0;
    drop(saved);
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_usec).unwrap_or(0).saturating_mul(1000))
    };
    ok.then(|| (ns(usage.ru_utime), ns(usage.ru_stime)))
}

/// A per-thread CPU-time timer (the kernel's timer id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadTimer(usize);

impl ThreadTimer {
    pub fn id(self) -> usize {
        self.0
    }

    pub fn from_id(id: usize) -> ThreadTimer {
        ThreadTimer(id)
    }
}

/// Creates a timer on the calling thread's CPU clock that sends `signal` to the calling thread with
/// `cookie` as its `si_value`, first after `first_ns` and then every `period_ns` nanoseconds of this thread's
/// CPU time.
pub fn start_thread_cpu_timer(
    signal: i32,
    cookie: usize,
    first_ns: u64,
    period_ns: u64,
) -> Result<ThreadTimer, i32> {
    // SAFETY: sigevent is plain data; all-zero is a valid starting value.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_notify = libc::SIGEV_THREAD_ID;
    event.sigev_signo = signal;
    event.sigev_value = libc::sigval {
        sival_ptr: cookie as *mut c_void,
    };
    event.sigev_notify_thread_id = gettid();
    let mut timer: libc::timer_t = std::ptr::null_mut();
    // SAFETY: both pointers are valid for the call; CLOCK_THREAD_CPUTIME_ID names the calling thread's clock.
    if unsafe { libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut event, &mut timer) } != 0 {
        return Err(errno());
    }
    let timespec = |ns: u64| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: timespec(period_ns),
        it_value: timespec(first_ns.max(1)),
    };
    // SAFETY: `timer` was just created; `spec` is valid; the old value is not wanted.
    if unsafe { libc::timer_settime(timer, 0, &spec, std::ptr::null_mut()) } != 0 {
        let error = errno();
        // SAFETY: deleting the timer we just created.
        unsafe { libc::timer_delete(timer) };
        return Err(error);
    }
    Ok(ThreadTimer(timer as usize))
}

/// Deletes a timer created by [`start_thread_cpu_timer`].
pub fn delete_timer(timer: ThreadTimer) {
    // SAFETY: the id came from timer_create; a stale id only makes timer_delete fail with EINVAL.
    unsafe { libc::timer_delete(timer.0 as libc::timer_t) };
}

/// A thread-specific slot whose destructor runs at thread exit (pthread keys).
pub fn create_thread_key(
    destructor: unsafe extern "C" fn(*mut c_void),
) -> Option<libc::pthread_key_t> {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; the destructor is a valid function for the process's life.
    (unsafe { libc::pthread_key_create(&mut key, Some(destructor)) } == 0).then_some(key)
}

pub fn set_thread_value(key: libc::pthread_key_t, value: usize) {
    // SAFETY: the key was created by create_thread_key and is never deleted.
    unsafe { libc::pthread_setspecific(key, value as *const c_void) };
}

/// The fields of a SIGPROF's siginfo that the sampler needs.
#[derive(Clone, Copy, Debug)]
pub struct SignalOrigin {
    pub code: i32,
    pub value: usize,
    pub overrun: i32,
}

/// Reads code, timer value and overrun count from a handler's siginfo.
///
/// # Safety
/// `info` must be the siginfo pointer the kernel passed to an SA_SIGINFO handler, or null.
pub unsafe fn signal_origin(info: *const libc::siginfo_t) -> SignalOrigin {
    // SAFETY: guaranteed by the caller.
    let Some(info) = (unsafe { info.as_ref() }) else {
        return SignalOrigin {
            code: 0,
            value: 0,
            overrun: 0,
        };
    };
    if info.si_code != libc::SI_TIMER {
        return SignalOrigin {
            code: info.si_code,
            value: 0,
            overrun: 0,
        };
    }
    // SAFETY: for SI_TIMER the timer fields of the union are the ones the kernel filled in.
    let (value, overrun) = unsafe { (info.si_value().sival_ptr as usize, info.si_overrun()) };
    SignalOrigin {
        code: info.si_code,
        value,
        overrun,
    }
}

pub use libc::SI_TIMER;

/// The interrupted program counter from a handler's ucontext.
///
/// # Safety
/// `context` must be the ucontext pointer the kernel passed to an SA_SIGINFO handler, or null.
pub unsafe fn interrupted_pc(context: *const c_void) -> usize {
    let context = context as *const libc::ucontext_t;
    // SAFETY: guaranteed by the caller.
    let Some(context) = (unsafe { context.as_ref() }) else {
        return 0;
    };
    #[cfg(target_arch = "x86_64")]
    {
        context.uc_mcontext.gregs[libc::REG_RIP as usize] as usize
    }
    #[cfg(target_arch = "aarch64")]
    {
        context.uc_mcontext.pc as usize
    }
}

pub type SigactionFn =
    unsafe extern "C" fn(i32, *const libc::sigaction, *mut libc::sigaction) -> i32;

/// Calls the real `sigaction` (found with [`next_symbol`]; our own exported one interposes it).
///
/// # Safety
/// `real` must be libc's `sigaction`; the pointers must be null or valid.
pub unsafe fn call_sigaction(
    real: usize,
    signal: i32,
    action: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> i32 {
    // SAFETY: `real` is libc's sigaction (caller's guarantee), whose signature is SigactionFn.
    let real: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(real) };
    // SAFETY: pointers valid or null, as the caller guarantees.
    unsafe { real(signal, action, old) }
}

/// Registers `function` to run at `exit()` (in this library's `__cxa_atexit` list).
pub fn at_exit(function: extern "C" fn()) -> bool {
    // SAFETY: the function lives as long as the library, which is never unloaded while the process runs.
    unsafe { libc::atexit(function) == 0 }
}

/// The first element of `/proc/self/cmdline` (argv[0]).
pub fn argv0() -> Vec<u8> {
    std::fs::read("/proc/self/cmdline")
        .ok()
        .and_then(|c| c.split(|&b| b == 0).next().map(<[u8]>::to_vec))
        .unwrap_or_default()
}

/// Which pages of `[address, address + len)` are resident (`mincore`); `None` if the kernel refuses.
/// `address` must be page-aligned.
pub fn resident_pages(address: usize, len: usize) -> Option<Vec<bool>> {
    let page = page_size();
    let pages = len.div_ceil(page);
    let mut vector = vec![0u8; pages];
    // SAFETY: `vector` has one byte per page of the range; mincore only writes into it.
    let result = unsafe { libc::mincore(address as *mut c_void, len, vector.as_mut_ptr()) };
    (result == 0).then(|| vector.iter().map(|b| b & 1 != 0).collect())
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
}

// ==== rt-mcount section: memory for arc tables, mcount stubs, gmon interposition helpers ====

/// Runs `f` and restores `errno` afterwards, so calls made from `mcount` or a signal handler leave
/// the interrupted code's `errno` untouched.
fn preserving_errno<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: __errno_location returns the calling thread's errno slot; it is always valid and
    // async-signal-safe.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: `slot` points to this thread's errno.
    let saved = unsafe { *slot };
    let result = f();
    // SAFETY: as above.
    unsafe { *slot = saved };
    result
}

/// Maps `len` bytes of zeroed, private, anonymous memory; `None` if the kernel refuses.
/// Async-signal-safe (one system call), errno preserved.
pub fn map_zeroed(len: usize) -> Option<*mut u8> {
    preserving_errno(|| {
        // SAFETY: an anonymous private mapping at an address of the kernel's choice touches no
        // existing memory.
        let base = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        (base != libc::MAP_FAILED).then_some(base.cast::<u8>())
    })
}

/// Unmaps memory obtained from [`map_zeroed`].
///
/// # Safety
/// `base` and `len` must be exactly a mapping returned by [`map_zeroed`], and nothing may use it
/// afterwards.
pub unsafe fn unmap(base: *mut u8, len: usize) {
    preserving_errno(|| {
        // SAFETY: the caller guarantees the range is one of our mappings that nothing uses.
        unsafe { libc::munmap(base.cast(), len) };
    });
}

/// Gives the pages of a [`map_zeroed`] mapping back to the kernel; they read as zero afterwards.
pub fn discard(base: *mut u8, len: usize) {
    preserving_errno(|| {
        // SAFETY: MADV_DONTNEED on a private anonymous mapping of ours only zeroes its pages; the
        // callers (fork-time reset) guarantee nothing writes it concurrently.
        unsafe { libc::madvise(base.cast(), len, libc::MADV_DONTNEED) };
    });
}

/// Saves every register an instrumented function may still need, aligns the stack, calls
/// `$record(frompc, selfpc)` and restores them. Expects `push rbp; mov rbp, rsp` done, with
/// `frompc` in rdi and `selfpc` in rsi not yet loaded: `$load` loads them from the frame.
///
/// Saved: rax (vector-argument count of a variadic call), rcx, rdx, rsi, rdi, r8, r9 (integer
/// arguments), r10 (static chain / DRAP), r11, and xmm0–xmm7 in full 128 bits (vector and
/// floating-point arguments). Not saved: the upper halves of ymm0–ymm7/zmm0–zmm7, xmm8–15, x87 and
/// MXCSR: the Rust code on this path is compiled for baseline x86_64 (SSE2 only, never VEX/EVEX
/// encoded, so it cannot change an upper half) and calls no libc function that could (no string
/// functions; only `mmap` on a table's first use or growth), so `__m256`/`__m512` arguments
/// arrive intact; the register-preservation test passes `__m256` arguments to prove it.
macro_rules! mcount_stub {
    ($load:literal, $record:path) => {
        core::arch::naked_asm!(
            "push rbp",
            "mov rbp, rsp",
            "and rsp, -16",
            "sub rsp, 208",
            "movaps [rsp], xmm0",
            "movaps [rsp + 16], xmm1",
            "movaps [rsp + 32], xmm2",
            "movaps [rsp + 48], xmm3",
            "movaps [rsp + 64], xmm4",
            "movaps [rsp + 80], xmm5",
            "movaps [rsp + 96], xmm6",
            "movaps [rsp + 112], xmm7",
            "mov [rsp + 128], rax",
            "mov [rsp + 136], rcx",
            "mov [rsp + 144], rdx",
            "mov [rsp + 152], rsi",
            "mov [rsp + 160], rdi",
            "mov [rsp + 168], r8",
            "mov [rsp + 176], r9",
            "mov [rsp + 184], r10",
            "mov [rsp + 192], r11",
            $load,
            "call {record}",
            "movaps xmm0, [rsp]",
            "movaps xmm1, [rsp + 16]",
            "movaps xmm2, [rsp + 32]",
            "movaps xmm3, [rsp + 48]",
            "movaps xmm4, [rsp + 64]",
            "movaps xmm5, [rsp + 80]",
            "movaps xmm6, [rsp + 96]",
            "movaps xmm7, [rsp + 112]",
            "mov rax, [rsp + 128]",
            "mov rcx, [rsp + 136]",
            "mov rdx, [rsp + 144]",
            "mov rsi, [rsp + 152]",
            "mov rdi, [rsp + 160]",
            "mov r8, [rsp + 168]",
            "mov r9, [rsp + 176]",
            "mov r10, [rsp + 184]",
            "mov r11, [rsp + 192]",
            "mov rsp, rbp",
            "pop rbp",
            "ret",
            record = sym $record,
        )
    };
}

/// The fast path shared by the exported stubs: with only rax, rcx, rdx and rsi saved (pushed), look
/// the (frompc, selfpc) pair up in this thread's call cache and add 1 to the cached counter. It
/// writes nothing but the counter. Anything else (cache miss, stale generation, paused, a call
/// nested in the Rust side, the cache rewritten by a signal handler meanwhile) restores the four
/// registers and jumps to the full stub, which saves everything and calls Rust.
///
/// Cache layout (`mcount::ThreadCache`): generation at 0, write sequence (u32) at 8, pointer to the
/// entries at 16 (null: miss), set mask (u32) at 24, shared-stripe flag (u8) at 28; sets of two
/// 32-byte entries (frompc, selfpc, counter), the set being
/// `((selfpc * 0x9E3779B97F4A7C15) >> 44) + (frompc >> 2)` masked with the set mask (4095 at
/// first; the Rust side makes the cache larger when the thread's working set does not fit): call
/// sites near each other fill neighbouring sets. The cache is current when its generation equals `modules::CURRENT ^ mcount::CACHE_STATE` (the pause bit makes every lookup miss). The
/// write sequence is odd while Rust code of this thread may be changing the entries, and is
/// checked again after the counter pointer is loaded: a signal handler that ran in between and
/// went through the Rust side sends this call to the slow path too, uncounted so far.
macro_rules! mcount_fast_path {
    ($frompc:literal, $selfpc:literal, $slow:path) => {
        core::arch::naked_asm!(
            "push rax",
            "push rcx",
            "push rdx",
            "push rsi",
            "mov rdx, qword ptr fs:[0]",
            "add rdx, qword ptr [rip + mslprof_thread_cache@GOTTPOFF]",
            "mov rax, qword ptr [rip + {table}]",
            "xor rax, qword ptr [rip + {state}]",
            "cmp qword ptr [rdx], rax",
            "jne 2f",
            concat!("mov rax, ", $selfpc),
            "movabs rcx, 0x9E3779B97F4A7C15",
            "imul rax, rcx",
            "shr rax, 44",
            concat!("mov rcx, ", $frompc),
            "shr rcx, 2",
            "add rax, rcx",
            "and eax, dword ptr [rdx + 24]",
            "shl rax, 6",
            "mov ecx, dword ptr [rdx + 8]",
            "test ecx, 1",
            "jnz 2f",
            "mov rsi, qword ptr [rdx + 16]",
            "test rsi, rsi",
            "jz 2f",
            "add rax, rsi",
            concat!("mov rsi, ", $frompc),
            "cmp qword ptr [rax], rsi",
            "jne 5f",
            concat!("mov rsi, ", $selfpc),
            "cmp qword ptr [rax + 8], rsi",
            "jne 5f",
            "mov rax, qword ptr [rax + 16]",
            "6:",
            "cmp dword ptr [rdx + 8], ecx",
            "jne 2f",
            "test rax, rax",
            "jz 1f",
            "cmp byte ptr [rdx + 28], 0",
            "jne 4f",
            "add qword ptr [rax], 1",
            "1:",
            "pop rsi",
            "pop rdx",
            "pop rcx",
            "pop rax",
            "ret",
            "4:",
            "lock add qword ptr [rax], 1",
            "jmp 1b",
            // Second way of the set.
            "5:",
            concat!("mov rsi, ", $frompc),
            "cmp qword ptr [rax + 32], rsi",
            "jne 2f",
            concat!("mov rsi, ", $selfpc),
            "cmp qword ptr [rax + 40], rsi",
            "jne 2f",
            "mov rax, qword ptr [rax + 48]",
            "jmp 6b",
            // Miss: leave the cache to the Rust side.
            "2:",
            "pop rsi",
            "pop rdx",
            "pop rcx",
            "pop rax",
            "jmp {slow}",
            state = sym crate::mcount::CACHE_STATE,
            table = sym crate::modules::CURRENT,
            slow = sym $slow,
        )
    };
}

/// `-pg` (gcc, clang) calls this after the instrumented function's prologue: that function's frame
/// pointer is in rbp, so `selfpc` is our return address and `frompc` the instrumented function's
/// own return address, the word above its saved frame pointer (as glibc's `_mcount` takes them).
///
/// # Safety
/// Only compiler-generated profiling calls may call this, with rbp the instrumented function's
/// frame pointer.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mcount() {
    // After the four pushes: [rsp + 32] = selfpc; [rbp + 8] = frompc.
    mcount_fast_path!("qword ptr [rbp + 8]", "qword ptr [rsp + 32]", mcount_slow)
}

/// The other name of [`mcount`] (glibc exports both; some compilers call `_mcount`).
///
/// # Safety
/// As [`mcount`].
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _mcount() {
    mcount_fast_path!("qword ptr [rbp + 8]", "qword ptr [rsp + 32]", mcount_slow)
}

/// `-pg -mfentry` calls this as the first instruction of the instrumented function, before its
/// prologue: `selfpc` is our return address and `frompc` the word above it (the instrumented
/// function's return address).
///
/// # Safety
/// Only compiler-generated profiling calls may call this.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fentry__() {
    // After the four pushes: [rsp + 32] = selfpc, [rsp + 40] = frompc.
    mcount_fast_path!("qword ptr [rsp + 40]", "qword ptr [rsp + 32]", fentry_slow)
}

/// Slow path of [`mcount`]: entered by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn mcount_slow() {
    // After our `push rbp`: [rbp] = instrumented function's rbp, [rbp + 8] = selfpc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        crate::mcount::record_call
    )
}

/// Slow path of [`__fentry__`]: entered by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn fentry_slow() {
    // After our `push rbp`: [rbp + 8] = selfpc, [rbp + 16] = frompc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp + 16]",
        crate::mcount::record_call
    )
}

/// Bytes of the per-thread call cache header (see `mcount::ThreadCache`), in `.tbss`.
pub const THREAD_CACHE_BYTES: usize = 64;

// The per-thread call cache lives in this library's static TLS block, addressed with the
// initial-exec model (`@gottpoff` + `fs`): two instructions, no `__tls_get_addr` call, no
// allocation, valid in signal handlers. Static TLS is fine because the runtime is loaded at start-up
// (LD_PRELOAD or DT_NEEDED); every new thread gets it zeroed.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 64",
    ".globl mslprof_thread_cache",
    ".hidden mslprof_thread_cache",
    ".type mslprof_thread_cache,@object",
    ".size mslprof_thread_cache, 64",
    "mslprof_thread_cache:",
    ".zero 64",
    ".popsection",
);

/// Address of the calling thread's call-cache header ([`THREAD_CACHE_BYTES`] zero-initialised,
/// 64-byte aligned bytes that belong to this thread for its lifetime).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_cache_block() -> *mut u8 {
    let address: usize;
    // SAFETY: reads the thread pointer (fs:0, the TCB's self pointer on x86_64 glibc) and the
    // linker-provided TLS offset of our own `.tbss` symbol; touches no other memory.
    unsafe {
        core::arch::asm!(
            "mov {address}, qword ptr fs:[0]",
            "add {address}, qword ptr [rip + mslprof_thread_cache@GOTTPOFF]",
            address = out(reg) address,
            options(nostack, readonly, pure),
        );
    }
    address as *mut u8
}

/// Adds 1 to `counter` with one non-locked instruction. A signal on the calling thread cannot
/// split it, but another core can: only for counters no other thread writes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn increment_unshared(counter: &core::sync::atomic::AtomicU64) {
    // SAFETY: `counter` is a valid, aligned u64; the add is one instruction on memory that the
    // caller guarantees no other thread writes, and readers on other cores see the old or the new
    // value (aligned 8-byte accesses are atomic on x86_64).
    unsafe {
        core::arch::asm!(
            "add qword ptr [{counter}], 1",
            counter = in(reg) counter.as_ptr(),
            options(nostack),
        );
    }
}

/// Calls `start` (the runtime's start-up, from the first `mcount` of a process whose other
/// libraries' constructors run before the runtime's own) with the whole extended register state
/// saved around it by `xsave`/`xrstor`: start-up runs libc code (string functions using AVX/AVX-512)
/// that would otherwise clobber the upper halves of vector arguments the instrumented function is
/// about to read. The general-purpose and xmm0–7 registers are already saved by the mcount stub.
///
/// # Safety
/// `start` must be safe to call here; the CPU must be x86_64 (XSAVE is used only when the OS
/// enabled it, CPUID.1:ECX.OSXSAVE).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn call_preserving_vector_state(start: extern "C" fn() -> bool) -> bool {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "push rbx",
        "push r12",
        "mov r12, rdi",
        "mov eax, 1",
        "cpuid",
        "bt ecx, 27",
        "jnc 2f",
        "mov eax, 0xd",
        "xor ecx, ecx",
        "cpuid",
        // ebx = XSAVE area bytes for the features enabled in XCR0; 64-byte aligned, header zeroed.
        "sub rsp, rbx",
        "sub rsp, 64",
        "and rsp, -64",
        "xor eax, eax",
        "mov [rsp + 512], rax",
        "mov [rsp + 520], rax",
        "mov [rsp + 528], rax",
        "mov [rsp + 536], rax",
        "mov [rsp + 544], rax",
        "mov [rsp + 552], rax",
        "mov [rsp + 560], rax",
        "mov [rsp + 568], rax",
        "xor ecx, ecx",
        "xgetbv",
        "xsave [rsp]",
        "call r12",
        "mov r12d, eax",
        "xor ecx, ecx",
        "xgetbv",
        "xrstor [rsp]",
        "movzx eax, r12b",
        "jmp 3f",
        "2:",
        "call r12",
        "3:",
        "lea rsp, [rbp - 16]",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
    )
}

// ==== end of rt-mcount section ====

// ==== lh section: loader events (lifecycle.rs) ====

/// Sets an environment variable (the root-process marker), at start-up.
pub fn set_environment_variable(name: &str, value: &str) {
    // SAFETY: called once from the runtime's start-up, before the program's main runs and normally before it
    // has other threads; the environment is not read concurrently by this library.
    unsafe { std::env::set_var(name, value) };
}

/// Creates `path` (NUL-terminated) for writing: new file only, never through a symlink, mode 0644 minus the
/// umask. Async-signal-safe. Returns the descriptor.
pub fn create_new_file(path: &[u8]) -> Option<i32> {
    debug_assert_eq!(path.last(), Some(&0));
    // SAFETY: `path` is NUL-terminated; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    (fd >= 0).then_some(fd)
}

/// Closes a descriptor. Async-signal-safe.
pub fn close_file(fd: i32) {
    // SAFETY: closing a descriptor we opened.
    unsafe { libc::close(fd) };
}

/// `rename(from, to)`, both NUL-terminated. Async-signal-safe.
pub fn rename_file(from: &[u8], to: &[u8]) -> bool {
    // SAFETY: both are NUL-terminated paths.
    unsafe {
        libc::rename(
            from.as_ptr() as *const libc::c_char,
            to.as_ptr() as *const libc::c_char,
        ) == 0
    }
}

/// `unlink(path)`, NUL-terminated. Async-signal-safe.
pub fn remove_file(path: &[u8]) {
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::unlink(path.as_ptr() as *const libc::c_char) };
}

// A weak reference to the program's link-time bucket-size symbol (config::BUCKET_SIZE_SYMBOL). Because
// libmslprof.so refers to it, a program linked with `-lmslprof` that defines it gets it exported to its
// dynamic symbol table by the linker, where `global_symbol` finds it; without a definition it resolves to 0.
// The section is marked retained so that --gc-sections keeps the reference.
core::arch::global_asm!(
    ".pushsection .data.rel.ro.mslprof_bucket_size_reference,\"awR\",%progbits",
    ".balign 8",
    ".weak mslprof_profilebucketsize",
    ".8byte mslprof_profilebucketsize",
    ".popsection",
);

/// Sets this thread's errno (for C entry points that report errors the C way).
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = value };
}

/// A close-on-exec pipe whose write end does not block: `(read end, write end)`.
pub fn wakeup_pipe() -> Option<(i32, i32)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let made = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0;
    if !made {
        return None;
    }
    // SAFETY: fcntl on a descriptor just created.
    unsafe {
        let flags = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Some((fds[0], fds[1]))
}

/// Writes one byte to `fd` (a wakeup pipe's write end); a full pipe already holds a wakeup. Async-signal-safe;
/// errno is preserved.
pub fn poke(fd: i32) {
    let saved = SavedErrno::save();
    let byte = 1u8;
    // SAFETY: one byte from a live local.
    unsafe { libc::write(fd, (&raw const byte).cast::<c_void>(), 1) };
    drop(saved);
}

/// Waits until `fd` is readable or `timeout_ms` passes (-1: no timeout); then reads what is there. True
/// when something was read.
pub fn wait_and_drain(fd: i32, timeout_ms: i32) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
    if ready <= 0 {
        return false;
    }
    let mut buffer = [0u8; 64];
    // SAFETY: reads into a live local buffer of that length.
    unsafe { libc::read(fd, buffer.as_mut_ptr().cast::<c_void>(), buffer.len()) > 0 }
}

/// Installs `handler` (plain, one int argument) for `signal` with libc's own `sigaction`, SA_RESTART.
pub fn install_plain_handler(signal: i32, handler: extern "C" fn(i32)) -> bool {
    let Some(real) = next_symbol(c"sigaction") else {
        return false;
    };
    // SAFETY: sigaction is plain data; all-zero is valid (empty mask, no flags).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as usize;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: `real` is libc's sigaction; the action is valid and no old action is asked for.
    unsafe { call_sigaction(real, signal, &action, std::ptr::null_mut()) == 0 }
}

/// The number of signal `name` (`USR2`, `SIGUSR2`, `RTMIN+3` or a number).
pub fn signal_number(name: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(name).ok()?.trim();
    if let Ok(n) = text.parse::<i32>() {
        return (1..=libc::SIGRTMAX()).contains(&n).then_some(n);
    }
    let upper = text.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some(rest) = bare.strip_prefix("RTMIN") {
        let offset: i32 = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('+')?.parse().ok()?
        };
        let n = libc::SIGRTMIN() + offset;
        return (n <= libc::SIGRTMAX()).then_some(n);
    }
    let n = match bare {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CHLD" => libc::SIGCHLD,
        "CONT" => libc::SIGCONT,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "VTALRM" => libc::SIGVTALRM,
        "WINCH" => libc::SIGWINCH,
        "IO" | "POLL" => libc::SIGIO,
        "PWR" => libc::SIGPWR,
        "SYS" => libc::SIGSYS,
        _ => return None,
    };
    Some(n)
}

// ==== re-exec section: LD_PROFILE without glibc's own profiler (reexec.rs) ====

/// The process's environment array (`environ`), as getenv and the program see it.
pub fn environment_array() -> *mut *const libc::c_char {
    unsafe extern "C" {
        static mut environ: *mut *const libc::c_char;
    }
    // SAFETY: reading the pointer value of libc's `environ`; called from the constructor, before the program
    // can change it concurrently.
    unsafe { *std::ptr::addr_of!(environ) }
}

/// The string `AT_EXECFN` points to: the path the kernel was asked to execute.
pub fn exec_file_name() -> Option<std::ffi::CString> {
    // SAFETY: getauxval has no preconditions; a non-zero AT_EXECFN is a NUL-terminated string on the stack.
    let address = unsafe { libc::getauxval(libc::AT_EXECFN) };
    if address == 0 {
        return None;
    }
    // SAFETY: see above; the string lives as long as the process.
    Some(unsafe { CStr::from_ptr(address as *const libc::c_char) }.to_owned())
}

/// True when both paths name the same file (device and inode), following symlinks.
pub fn same_file(a: &CStr, b: &CStr) -> bool {
    // SAFETY: stat is plain data.
    let mut first: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut second: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated paths and valid out-pointers.
    let ok = unsafe {
        libc::stat(a.as_ptr(), &mut first) == 0 && libc::stat(b.as_ptr(), &mut second) == 0
    };
    ok && first.st_dev == second.st_dev && first.st_ino == second.st_ino
}

/// `execve(path, argv, envp)` with NULL-terminated arrays; returns errno when it fails (it does not return
/// when it succeeds). The caller's errno is left as it was.
pub fn execute(path: &CStr, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> i32 {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    let saved = errno();
    // SAFETY: `path` is NUL-terminated and both arrays are NULL-terminated arrays of NUL-terminated strings
    // that outlive the call. The system call itself: the loader hooks interpose execve (exec events).
    unsafe {
        libc::syscall(
            libc::SYS_execve,
            path.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
        )
    };
    let failure = errno();
    // SAFETY: restoring this thread's errno.
    unsafe { *libc::__errno_location() = saved };
    failure
}

/// Stops the process's `ITIMER_PROF` timer and returns its previous setting.
pub fn disarm_profiling_timer() -> libc::itimerval {
    // SAFETY: itimerval is plain data.
    let zero: libc::itimerval = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut previous: libc::itimerval = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to itimerval values. The system call itself: the runtime interposes setitimer.
    unsafe { libc::syscall(libc::SYS_setitimer, libc::ITIMER_PROF, &zero, &mut previous) };
    previous
}

/// Restores an `ITIMER_PROF` setting returned by [`disarm_profiling_timer`].
pub fn rearm_profiling_timer(setting: &libc::itimerval) {
    // SAFETY: valid pointer; the old value is not wanted. The system call itself, as above.
    unsafe {
        libc::syscall(
            libc::SYS_setitimer,
            libc::ITIMER_PROF,
            setting,
            std::ptr::null_mut::<libc::itimerval>(),
        )
    };
}

/// A file's inode number and birth time (ns since the epoch), if the file system records one.
pub fn inode_and_birth(path: &CStr) -> Option<(u64, i128)> {
    // SAFETY: statx is plain data.
    let mut info: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: NUL-terminated path and a valid out-pointer.
    let result = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            path.as_ptr(),
            0,
            libc::STATX_INO | libc::STATX_BTIME,
            &mut info,
        )
    };
    if result != 0 || info.stx_mask & libc::STATX_BTIME == 0 {
        return None;
    }
    let birth =
        i128::from(info.stx_btime.tv_sec) * 1_000_000_000 + i128::from(info.stx_btime.tv_nsec);
    Some((info.stx_ino, birth))
}

/// When this process started, in ns since the epoch, rounded down to the kernel's clock tick
/// (`/proc/self/stat` field 22 against `CLOCK_BOOTTIME`).
pub fn process_start_ns() -> Option<i128> {
    let stat = std::fs::read("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let after_name = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let field = after_name
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(19)?;
    let ticks: i128 = std::str::from_utf8(field).ok()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = i128::from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) });
    if per_second <= 0 {
        return None;
    }
    let since_boot = i128::from(clock_ns(libc::CLOCK_BOOTTIME));
    let now = i128::from(clock_ns(libc::CLOCK_REALTIME));
    Some(now - since_boot + ticks * 1_000_000_000 / per_second)
}
