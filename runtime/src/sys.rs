//! The runtime's one place for libc calls, system calls and assembly.

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

// ==== end of rt-mcount section ====
