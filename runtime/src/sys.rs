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
