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
    let saved = ErrnoGuard::save();
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

/// Restores errno when dropped.
pub struct ErrnoGuard(i32);

impl ErrnoGuard {
    pub fn save() -> ErrnoGuard {
        // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
        ErrnoGuard(unsafe { *libc::__errno_location() })
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        // SAFETY: as in save.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// This thread's errno.
pub fn errno() -> i32 {
    // SAFETY: as in ErrnoGuard::save.
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

pub use libc::{CLOCK_PROCESS_CPUTIME_ID, CLOCK_REALTIME};

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
    // After our `push rbp`: [rbp] = instrumented function's rbp, [rbp + 8] = selfpc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        crate::mcount::record_call
    )
}

/// The other name of [`mcount`] (glibc exports both; some compilers call `_mcount`).
///
/// # Safety
/// As [`mcount`].
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _mcount() {
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        crate::mcount::record_call
    )
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
    // After our `push rbp`: [rbp + 8] = selfpc, [rbp + 16] = frompc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp + 16]",
        crate::mcount::record_call
    )
}

// ==== end of rt-mcount section ====
