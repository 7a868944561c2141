//! The one place where the runtime calls libc or the kernel: thin wrappers, in this order: errno and stderr;
//! memory; files and descriptors; the process (ids, clocks, environment, exec); symbols; threads and timers;
//! signals. (The mcount family's assembly is in `mcount/x86_64.rs`.)

use std::ffi::CStr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// Restores errno when dropped: loader-hooks' guard, the one both crates use.
pub use mslprof_loader_hooks::SavedErrno;

/// This thread's errno.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno (for C entry points that report errors the C way).
pub fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = value };
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

/// Maps `len` bytes of zeroed, private, anonymous memory; `None` if the kernel refuses.
/// Async-signal-safe (one system call), errno preserved.
pub fn map_zeroed(len: usize) -> Option<*mut u8> {
    map_anonymous(0, len, libc::MAP_NORESERVE)
}

/// One private anonymous read-write mapping of `len` bytes with `flags` added, at `address` (0: the
/// kernel's choice); `None` if the kernel refuses. Async-signal-safe, errno preserved.
fn map_anonymous(address: usize, len: usize, flags: libc::c_int) -> Option<*mut u8> {
    let _errno = SavedErrno::save();
    // SAFETY: an anonymous private mapping that replaces nothing (the callers never pass MAP_FIXED)
    // touches no existing memory.
    let base = unsafe {
        libc::mmap(
            address as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    (base != libc::MAP_FAILED).then_some(base.cast::<u8>())
}

/// Unmaps memory obtained from [`map_zeroed`].
///
/// # Safety
/// `base` and `len` must be exactly a mapping returned by [`map_zeroed`], and nothing may use it
/// afterwards.
pub unsafe fn unmap(base: *mut u8, len: usize) {
    let _errno = SavedErrno::save();
    // SAFETY: the caller guarantees the range is one of our mappings that nothing uses.
    unsafe { libc::munmap(base.cast(), len) };
}

/// Maps `len` bytes of private anonymous read-write memory exactly at `address`, if nothing is mapped there
/// (`MAP_FIXED_NOREPLACE`); `None` otherwise. A kernel older than 4.17 takes the address as a hint: a
/// mapping placed elsewhere is given back.
pub fn map_exactly_at(address: usize, len: usize) -> Option<*mut u8> {
    // MAP_FIXED_NOREPLACE never replaces an existing mapping: the kernel fails instead.
    let base = map_anonymous(address, len, libc::MAP_FIXED_NOREPLACE)?;
    if base as usize != address {
        // SAFETY: the mapping the kernel just made for us elsewhere, which nothing uses.
        unsafe { unmap(base, len) };
        return None;
    }
    Some(base)
}

/// Makes the pages of `[address, address + len)` read-only and executable (`executable`) or read-only
/// (`!executable`), or readable and writable (`writable`). False when the kernel refuses.
///
/// # Safety
/// Nothing may run code in, or write to, pages that lose that permission.
pub unsafe fn protect(address: usize, len: usize, writable: bool, executable: bool) -> bool {
    let _errno = SavedErrno::save();
    let mut prot = libc::PROT_READ;
    if writable {
        prot |= libc::PROT_WRITE;
    }
    if executable {
        prot |= libc::PROT_EXEC;
    }
    // SAFETY: the caller guarantees no code depends on the permissions taken away.
    unsafe { libc::mprotect(address as *mut c_void, len, prot) == 0 }
}

/// Sets the protection of the pages of `[address, address + len)` to exactly `prot` (`PROT_*` bits, as
/// [`page_protections`] read them). False when the kernel refuses. Async-signal-safe, errno kept.
///
/// # Safety
/// Nothing may run code in, or write to, pages that lose that permission.
pub unsafe fn protect_exactly(address: usize, len: usize, prot: i32) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: the caller guarantees no code depends on the permissions taken away.
    unsafe { libc::mprotect(address as *mut c_void, len, prot) == 0 }
}

/// How a page is mapped, from `/proc/self/maps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageAccess {
    /// Its `PROT_*` bits.
    pub prot: i32,
    /// Whether the mapping is shared (a write would reach the file or the other processes).
    pub shared: bool,
    /// Whether `/proc/self/maps` listed it at all.
    pub mapped: bool,
}

/// Fills `access[i]` with how `pages[i]` is mapped now (`pages` sorted ascending), from one pass over
/// `/proc/self/maps`: the protection the program (or the loader) chose, which a rewrite of code must give
/// back exactly. False when the file cannot be read. Async-signal-safe: open/read/close into a buffer on the
/// stack, no allocation, errno kept.
pub fn page_protections(pages: &[usize], access: &mut [PageAccess]) -> bool {
    let _errno = SavedErrno::save();
    access.iter_mut().for_each(|a| *a = PageAccess::default());
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return false;
    }
    let mut buffer = [0u8; 4096];
    let (mut held, mut next_page, mut complete) = (0usize, 0usize, false);
    // Set while the rest of a line longer than the buffer is being dropped.
    let mut dropping = false;
    // Gives the pages in a line's range its access; maps lines come in address order, as the pages.
    let mut note = |line: &[u8]| {
        if let Some((low, high, line_access)) = maps_line(line) {
            while next_page < pages.len() && pages[next_page] < high {
                if pages[next_page] >= low {
                    access[next_page] = line_access;
                }
                next_page += 1;
            }
        }
    };
    loop {
        // SAFETY: reads into the free part of the buffer.
        let read =
            unsafe { libc::read(fd, buffer[held..].as_mut_ptr().cast(), buffer.len() - held) };
        let Ok(read) = usize::try_from(read) else {
            if errno() == libc::EINTR {
                continue;
            }
            break;
        };
        if read == 0 {
            complete = true;
            break;
        }
        held += read;
        let mut start = 0;
        while let Some(end) = buffer[start..held].iter().position(|&b| b == b'\n') {
            if !dropping {
                note(&buffer[start..start + end]);
            }
            dropping = false;
            start += end + 1;
        }
        if start == 0 && held == buffer.len() {
            // A line longer than the buffer (a very long path): its start is enough, the rest is dropped.
            if !dropping {
                note(&buffer[..held]);
            }
            dropping = true;
            start = held;
        }
        buffer.copy_within(start..held, 0);
        held -= start;
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    complete
}

/// The range and access of one `/proc/self/maps` line (`start-end perms ...`, hexadecimal addresses).
fn maps_line(line: &[u8]) -> Option<(usize, usize, PageAccess)> {
    let mut fields = line.split(|&b| b == b' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let dash = range.iter().position(|&b| b == b'-')?;
    let hex = |digits: &[u8]| {
        core::str::from_utf8(digits)
            .ok()
            .and_then(|digits| usize::from_str_radix(digits, 16).ok())
    };
    let (low, high) = (hex(&range[..dash])?, hex(&range[dash + 1..])?);
    let [r, w, x, kind] = perms.get(..4)?.try_into().ok()?;
    let bit = |flag: u8, letter: u8, value: i32| if flag == letter { value } else { 0 };
    let prot = bit(r, b'r', libc::PROT_READ)
        | bit(w, b'w', libc::PROT_WRITE)
        | bit(x, b'x', libc::PROT_EXEC);
    Some((
        low,
        high,
        PageAccess {
            prot,
            shared: kind == b's',
            mapped: true,
        },
    ))
}

/// Sleeps for `micros` microseconds (EINTR ends it early). Async-signal-safe, errno kept.
#[cfg(feature = "test-hooks")]
pub fn sleep_micros(micros: u64) {
    let _errno = SavedErrno::save();
    let time = libc::timespec {
        tv_sec: (micros / 1_000_000) as libc::time_t,
        tv_nsec: (micros % 1_000_000 * 1000) as libc::c_long,
    };
    // SAFETY: a valid timespec; the remainder is not wanted.
    unsafe { libc::nanosleep(&time, core::ptr::null_mut()) };
}

/// Threads of this process, from field 20 (`num_threads`) of `/proc/self/stat`; `None` when it cannot be
/// read. Async-signal-safe: open/read/close into a buffer on the stack, errno kept.
pub fn thread_count() -> Option<usize> {
    let _errno = SavedErrno::save();
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/stat".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buffer = [0u8; 512];
    // SAFETY: reads at most the buffer's length into it.
    let read = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    let line = buffer.get(..usize::try_from(read).ok()?)?;
    stat_thread_count(line)
}

/// `num_threads` of a `/proc/PID/stat` line (its start is enough): the 18th field after the command name,
/// which ends at the line's last `)`.
fn stat_thread_count(line: &[u8]) -> Option<usize> {
    let after_name = line.iter().rposition(|&b| b == b')')? + 1;
    let field = line[after_name..]
        .split(|&b| b == b' ')
        .filter(|field| !field.is_empty())
        .nth(17)?;
    core::str::from_utf8(field).ok()?.parse().ok()
}

/// Registers this process for [`sync_cores`] (`membarrier`'s private expedited core-serialising command,
/// Linux 4.16 on); false where the kernel lacks it.
pub fn register_core_sync() -> bool {
    membarrier(libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE)
}

/// Makes every running thread of this process execute a core-serialising instruction before this returns,
/// so that none runs code it fetched before the call (the cross-modifying-code protocol). Needs
/// [`register_core_sync`]. Async-signal-safe (one system call), errno kept.
pub fn sync_cores() -> bool {
    membarrier(libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)
}

/// `membarrier(command, 0, 0)`: whether it succeeded. errno kept.
fn membarrier(command: libc::c_int) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: membarrier takes two integers and a CPU id, and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, command, 0, 0) == 0 }
}

/// Stores two bytes of code at `address` with one instruction, so that a thread fetching them sees either
/// the old two or the new two.
///
/// # Safety
/// `address` and the next byte must be writable and in one cache line (x86 makes a store within a line
/// atomic); the caller follows the cross-modifying-code protocol for the rest.
#[cfg(target_arch = "x86_64")]
pub unsafe fn store_code_pair(address: usize, bytes: [u8; 2]) {
    let value = u16::from_le_bytes(bytes);
    // SAFETY: as the caller guarantees; one `mov word` store, no other memory touched.
    unsafe {
        core::arch::asm!(
            "mov word ptr [{address}], {value:x}",
            address = in(reg) address,
            value = in(reg) value,
            options(nostack, preserves_flags),
        )
    };
}

/// Blocks every signal on this thread; the mask to give [`restore_signals`]. Async-signal-safe.
pub fn block_signals() -> libc::sigset_t {
    let _errno = SavedErrno::save();
    // SAFETY: sigset_t is plain data, filled by sigfillset and pthread_sigmask before use.
    let mut all: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: valid pointers to sigset_t values on this stack.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    old
}

/// Whether the calling thread blocks `signal`. Async-signal-safe.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn signal_blocked(signal: i32) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: sigset_t is plain data, filled by pthread_sigmask before use.
    let mut mask: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: a query (no new mask) into a valid sigset_t on this stack.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, core::ptr::null(), &mut mask) == 0
            && libc::sigismember(&mask, signal) == 1
    }
}

/// Restores the signal mask [`block_signals`] returned. Async-signal-safe.
pub fn restore_signals(mask: &libc::sigset_t) {
    let _errno = SavedErrno::save();
    // SAFETY: a valid mask from `block_signals`.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, core::ptr::null_mut()) };
}

/// Gives the pages of a [`map_zeroed`] mapping back to the kernel; they read as zero afterwards.
pub fn discard(base: *mut u8, len: usize) {
    let _errno = SavedErrno::save();
    // SAFETY: MADV_DONTNEED on a private anonymous mapping of ours only zeroes its pages; the callers
    // (fork-time reset) guarantee nothing writes it concurrently.
    unsafe { libc::madvise(base.cast(), len, libc::MADV_DONTNEED) };
}

/// Asks for transparent huge pages on a [`map_zeroed`] mapping (a hint: ignored where THP is off).
/// Large tables walked call after call then cost one TLB entry per 2 MiB instead of per 4 KiB.
pub fn prefer_huge_pages(base: *mut u8, len: usize) {
    let _errno = SavedErrno::save();
    // SAFETY: MADV_HUGEPAGE only changes how the kernel backs our own private anonymous mapping; the
    // contents stay as they are.
    unsafe { libc::madvise(base.cast(), len, libc::MADV_HUGEPAGE) };
}

/// Makes every page of `[base, base + len)` of a [`map_zeroed`] mapping resident and writable now
/// (`MADV_POPULATE_WRITE`, Linux 5.14), in one system call instead of a read fault and a write fault per
/// page later. A hint: older kernels refuse it and the pages are then faulted in as they are touched.
pub fn populate(base: *mut u8, len: usize) {
    let _errno = SavedErrno::save();
    // SAFETY: populating our own private anonymous read-write mapping only allocates its zero pages.
    unsafe { libc::madvise(base.cast(), len, libc::MADV_POPULATE_WRITE) };
}

/// Which pages of `[address, address + len)` are resident (`mincore`): bit 0 of `pages[i]` for page i. False
/// when the kernel refuses or `pages` is too short. `address` must be page-aligned. Allocates nothing.
#[cfg(test)]
pub fn resident_pages(address: usize, len: usize, pages: &mut [u8]) -> bool {
    if len.div_ceil(page_size()) > pages.len() {
        return false;
    }
    let _errno = SavedErrno::save();
    // SAFETY: `pages` has at least one byte per page of the range (checked above); mincore only writes into it.
    unsafe { libc::mincore(address as *mut c_void, len, pages.as_mut_ptr()) == 0 }
}

/// Page faults the calling thread has taken that needed no I/O (`getrusage(RUSAGE_THREAD)`: `ru_minflt`).
#[cfg(test)]
pub fn thread_minor_faults() -> u64 {
    rusage(libc::RUSAGE_THREAD).map_or(0, |usage| u64::try_from(usage.ru_minflt).unwrap_or(0))
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as usize } else { 4096 }
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

/// Creates `path` (NUL-terminated) for writing: new file only, never through a symlink, mode 0644 minus the
/// umask. Async-signal-safe. Returns the descriptor or errno.
pub fn create_new_file(path: &[u8]) -> Result<i32, i32> {
    debug_assert_eq!(path.last(), Some(&0));
    // SAFETY: `path` is NUL-terminated; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd >= 0 { Ok(fd) } else { Err(errno()) }
}

/// Closes a descriptor. Async-signal-safe.
pub fn close_file(fd: i32) {
    // SAFETY: closing a descriptor we opened.
    unsafe { libc::close(fd) };
}

/// `rename(from, to)`, both NUL-terminated. Async-signal-safe. Errno on failure.
pub fn rename_file(from: &[u8], to: &[u8]) -> Result<(), i32> {
    // SAFETY: both are NUL-terminated paths.
    let renamed = unsafe {
        libc::rename(
            from.as_ptr() as *const libc::c_char,
            to.as_ptr() as *const libc::c_char,
        ) == 0
    };
    if renamed { Ok(()) } else { Err(errno()) }
}

/// `unlink(path)`, NUL-terminated. Async-signal-safe.
pub fn remove_file(path: &[u8]) {
    // SAFETY: `path` is NUL-terminated.
    unsafe { libc::unlink(path.as_ptr() as *const libc::c_char) };
}

/// Appends `bytes` to the file at `path` (NUL-terminated), creating it (mode 0644) if needed.
pub fn append_to_file(path: &[u8], bytes: &[u8]) -> Result<(), i32> {
    debug_assert_eq!(path.last(), Some(&0));
    let _errno = SavedErrno::save();
    // SAFETY: `path` is NUL-terminated; open has no other preconditions.
    let fd = unsafe {
        libc::open(
            path.as_ptr() as *const libc::c_char,
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(errno());
    }
    let written = write_all(fd, bytes);
    close_file(fd);
    written
}

/// Copies the file at `from` to a new or emptied file at `to` (both NUL-terminated), through a buffer on the
/// stack: no allocation, errno kept. Gives up quietly on any error.
pub fn copy_file(from: &[u8], to: &[u8]) {
    let _errno = SavedErrno::save();
    // SAFETY: NUL-terminated paths; the descriptors are closed below.
    let (source, target) = unsafe {
        (
            libc::open(
                from.as_ptr() as *const libc::c_char,
                libc::O_RDONLY | libc::O_CLOEXEC,
            ),
            libc::open(
                to.as_ptr() as *const libc::c_char,
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            ),
        )
    };
    if source >= 0 && target >= 0 {
        let mut buffer = [0u8; 4096];
        loop {
            // SAFETY: reads at most the buffer's length into it.
            let read = unsafe { libc::read(source, buffer.as_mut_ptr().cast(), buffer.len()) };
            match usize::try_from(read) {
                Ok(0) => break,
                Ok(read) => {
                    if write_all(target, &buffer[..read]).is_err() {
                        break;
                    }
                }
                Err(_) if errno() == libc::EINTR => {}
                Err(_) => break,
            }
        }
    }
    for fd in [source, target] {
        if fd >= 0 {
            close_file(fd);
        }
    }
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

/// The process id: loader-hooks' `syscall` instruction, inlined rather than libc's wrapper: a forked child runs
/// it on its way out of `fork`, where each code page not yet run in the child costs a page fault (loader-hooks'
/// fork.rs).
#[inline]
pub fn getpid() -> u32 {
    mslprof_loader_hooks::sys::process_id() as u32
}

pub fn getppid() -> u32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() as u32 }
}

/// The kernel thread id of the calling thread; loader-hooks' `syscall` instruction, as [`getpid`].
#[inline]
pub fn gettid() -> i32 {
    mslprof_loader_hooks::sys::thread_id()
}

/// `getauxval(AT_SECURE) != 0`: the process runs setuid/setgid or with other elevated credentials.
pub fn is_secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
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
    timespec_ns(now)
}

/// A `timespec` in nanoseconds (saturating).
fn timespec_ns(time: libc::timespec) -> i64 {
    time.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(time.tv_nsec)
}

/// [`clock_ns`] by a `syscall` instruction rather than the vDSO, for the fork path (see [`getpid`]: the vDSO's
/// code is one more page a forked child would fault in).
#[inline]
pub fn clock_ns_by_syscall(clock: libc::clockid_t) -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid out-pointer for the call.
    if unsafe {
        syscalls::syscall!(
            syscalls::Sysno::clock_gettime,
            clock,
            &mut now as *mut libc::timespec
        )
    }
    .is_err()
    {
        return 0;
    }
    timespec_ns(now)
}

pub use libc::{CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID, CLOCK_REALTIME};

/// The whole process's (all threads', finished ones included) user and system CPU time in nanoseconds, from
/// `getrusage(RUSAGE_SELF)`; `None` on failure. A plain syscall: no allocation, errno preserved, safe in a
/// signal handler.
pub fn process_cpu_ns() -> Option<(u64, u64)> {
    rusage_cpu_ns(libc::RUSAGE_SELF)
}

/// The calling thread's user and system CPU time in nanoseconds (`getrusage(RUSAGE_THREAD)`); `None` on
/// failure.
pub fn thread_cpu_ns() -> Option<(u64, u64)> {
    rusage_cpu_ns(libc::RUSAGE_THREAD)
}

/// The user and system CPU time `getrusage(who)` gives, in nanoseconds; `None` on failure.
fn rusage_cpu_ns(who: libc::c_int) -> Option<(u64, u64)> {
    let usage = rusage(who)?;
    let ns = |t: libc::timeval| {
        u64::try_from(t.tv_sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_usec).unwrap_or(0).saturating_mul(1000))
    };
    Some((ns(usage.ru_utime), ns(usage.ru_stime)))
}

/// `getrusage(who)`; `None` on failure. A plain syscall: no allocation, errno preserved, safe in a signal
/// handler.
fn rusage(who: libc::c_int) -> Option<libc::rusage> {
    let _errno = SavedErrno::save();
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid out-pointer for the call.
    (unsafe { libc::getrusage(who, &mut usage) } == 0).then_some(usage)
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

/// The first element of `/proc/self/cmdline` (argv[0]).
pub fn argv0() -> Vec<u8> {
    std::fs::read("/proc/self/cmdline")
        .ok()
        .and_then(|c| c.split(|&b| b == 0).next().map(<[u8]>::to_vec))
        .unwrap_or_default()
}

/// Registers `function` to run at `exit()` (in this library's `__cxa_atexit` list).
pub fn at_exit(function: extern "C" fn()) -> bool {
    // SAFETY: the function lives as long as the library, which is never unloaded while the process runs.
    unsafe { libc::atexit(function) == 0 }
}

/// Sets an environment variable (the root-process marker), at start-up.
pub fn set_environment_variable(name: &str, value: &str) {
    // SAFETY: called once from the runtime's start-up, before the program's main runs and normally before it
    // has other threads; the environment is not read concurrently by this library.
    unsafe { std::env::set_var(name, value) };
}

/// The process's environment array (`environ`), as getenv and the program see it.
pub fn environment_array() -> *mut *const libc::c_char {
    unsafe extern "C" {
        static mut environ: *mut *const libc::c_char;
    }
    // SAFETY: reading the pointer value of libc's `environ`; called from the constructor, before the program
    // can change it concurrently.
    unsafe { *std::ptr::addr_of!(environ) }
}

/// Whether libc's initialiser has set `environ` (it is null while ld.so is still relocating modules, and
/// getenv then finds nothing).
pub fn environment_ready() -> bool {
    !environment_array().is_null()
}

/// Bytes of thread-local storage of every module loaded now: their `PT_TLS` sizes, each rounded up to its
/// alignment (`dl_iterate_phdr`; at start-up, before the program's threads).
pub fn loaded_tls_bytes() -> usize {
    unsafe extern "C" fn add(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        total: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: dl_iterate_phdr passes a valid info whose dlpi_phdr holds dlpi_phnum program headers, and
        // `total` is the `usize` given below.
        let (info, total) = unsafe { (&*info, &mut *total.cast::<usize>()) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: see above.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        for header in headers.iter().filter(|h| h.p_type == libc::PT_TLS) {
            let size = usize::try_from(header.p_memsz).unwrap_or(usize::MAX);
            let align = usize::try_from(header.p_align).unwrap_or(1).max(1);
            *total = total.saturating_add(size.checked_next_multiple_of(align).unwrap_or(size));
        }
        0
    }
    let mut total = 0usize;
    // SAFETY: `add` matches the callback type and only reads what the loader hands it; `total` outlives the
    // call.
    unsafe { libc::dl_iterate_phdr(Some(add), (&raw mut total).cast()) };
    total
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

/// `execve(path, argv, envp)` with NULL-terminated arrays; returns errno when it fails (it does not return
/// when it succeeds). The caller's errno is left as it was.
pub fn execute(path: &CStr, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> i32 {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    let _errno = SavedErrno::save();
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
    errno()
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

/// A thread's start routine, as `pthread_create` takes it.
pub type ThreadStartRoutine = extern "C" fn(*mut c_void) -> *mut c_void;
type PthreadCreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    ThreadStartRoutine,
    *mut c_void,
) -> i32;

/// Calls the real `pthread_create` (found with [`next_symbol`]; our own exported one interposes it).
///
/// # Safety
/// `real` must be libc's `pthread_create`; the arguments are those of `pthread_create(3)`.
pub unsafe fn call_pthread_create(
    real: usize,
    thread: *mut libc::pthread_t,
    attributes: *const libc::pthread_attr_t,
    routine: ThreadStartRoutine,
    argument: *mut c_void,
) -> i32 {
    // SAFETY: `real` is libc's pthread_create (caller's guarantee), whose signature is PthreadCreateFn.
    let real: PthreadCreateFn = unsafe { std::mem::transmute::<usize, PthreadCreateFn>(real) };
    // SAFETY: the caller's arguments, as pthread_create(3) requires.
    unsafe { real(thread, attributes, routine, argument) }
}

/// Detaches a thread [`call_pthread_create`] started: its resources go when it ends, and nobody joins it.
pub fn detach_thread(thread: libc::pthread_t) {
    // SAFETY: `thread` is a thread just created and not yet detached or joined.
    unsafe { libc::pthread_detach(thread) };
}

/// Names the calling thread (`PR_SET_NAME`: at most 15 bytes), as `ps -L` and `/proc/PID/task/TID/comm` show it.
pub fn name_this_thread(name: &CStr) {
    let _errno = SavedErrno::save();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of which it keeps 15 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
}

/// Waits until one of `fds` has a requested event or `timeout_ms` passes (`revents` set); an interruption by a
/// signal counts as a timeout.
pub fn poll_descriptors(fds: &mut [libc::pollfd], timeout_ms: i32) {
    let _errno = SavedErrno::save();
    // SAFETY: `fds` is a valid array of pollfd of the length given.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
}

/// A thread-specific slot whose destructor runs at thread exit (pthread keys).
pub fn create_thread_key(
    destructor: unsafe extern "C" fn(*mut c_void),
) -> Option<libc::pthread_key_t> {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; the destructor is a valid function for the process's life.
    (unsafe { libc::pthread_key_create(&mut key, Some(destructor)) } == 0).then_some(key)
}

#[unsafe(link_section = "mslprof_fork_text")]
pub fn set_thread_value(key: libc::pthread_key_t, value: usize) {
    // SAFETY: the key was created by create_thread_key and is never deleted.
    unsafe { libc::pthread_setspecific(key, value as *const c_void) };
}

/// The calling thread's value for `key` (0: none set).
#[unsafe(link_section = "mslprof_fork_text")]
pub fn thread_value(key: libc::pthread_key_t) -> usize {
    // SAFETY: the key was created by create_thread_key and is never deleted.
    unsafe { libc::pthread_getspecific(key) as usize }
}

/// A CPU-time timer (the kernel's timer id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimer(usize);

impl CpuTimer {
    pub fn id(self) -> usize {
        self.0
    }

    pub fn from_id(id: usize) -> CpuTimer {
        CpuTimer(id)
    }
}

/// Whose CPU time a timer of [`start_cpu_timer`] counts, and which thread its signal goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuClock {
    /// The calling thread's; the signal goes to that thread.
    Thread,
    /// The process's (all its threads'); the kernel picks a thread that does not block the signal (the
    /// running one when it can). A forked child has no such timer.
    Process,
}

/// Creates a timer on `clock` that sends `signal` with `cookie` as its `si_value`, first after `first_ns` and
/// then every `period_ns` nanoseconds of that clock's CPU time. The timer calls are `syscall` instructions made
/// here, not libc's wrappers (a forked child arms its timer on its way out of `fork`, see [`getpid`]); the id is
/// the kernel's, which is also what glibc's `timer_t` holds for a timer that signals. Errors are the kernel's
/// errno values; errno itself is left alone.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn start_cpu_timer(
    clock: CpuClock,
    signal: i32,
    cookie: usize,
    first_ns: u64,
    period_ns: u64,
) -> Result<CpuTimer, i32> {
    // SAFETY: sigevent is plain data; all-zero is a valid starting value.
    let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
    event.sigev_signo = signal;
    event.sigev_value = libc::sigval {
        sival_ptr: cookie as *mut c_void,
    };
    let clock = match clock {
        CpuClock::Thread => {
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_notify_thread_id = gettid();
            libc::CLOCK_THREAD_CPUTIME_ID
        }
        CpuClock::Process => {
            event.sigev_notify = libc::SIGEV_SIGNAL;
            libc::CLOCK_PROCESS_CPUTIME_ID
        }
    };
    let mut id: libc::c_int = 0;
    // SAFETY: both pointers are valid for the call (the kernel's sigevent layout is libc's); the clock is the
    // calling thread's or process's.
    unsafe {
        syscalls::syscall!(
            syscalls::Sysno::timer_create,
            clock,
            &mut event as *mut libc::sigevent,
            &mut id as *mut libc::c_int
        )
    }
    .map_err(|error| error.into_raw())?;
    let timer = CpuTimer(id as usize);
    if let Err(error) = set_timer_period(timer, first_ns, period_ns) {
        delete_timer(timer);
        return Err(error);
    }
    Ok(timer)
}

/// Deletes a timer created by [`start_cpu_timer`].
pub fn delete_timer(timer: CpuTimer) {
    // SAFETY: the id came from timer_create; a stale id only makes timer_delete fail with EINVAL.
    let _ = unsafe { syscalls::syscall!(syscalls::Sysno::timer_delete, timer.0) };
}

/// Sets a timer of [`start_cpu_timer`] going: next expiry after `first_ns`, then every `period_ns` of its clock.
/// Async-signal-safe (a system call); the error is the kernel's errno value, errno itself is left alone.
#[unsafe(link_section = "mslprof_fork_text")]
pub fn set_timer_period(timer: CpuTimer, first_ns: u64, period_ns: u64) -> Result<(), i32> {
    let timespec = |ns: u64| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: timespec(period_ns),
        it_value: timespec(first_ns.max(1)),
    };
    // SAFETY: a timer id from timer_create (a stale one makes the call fail with EINVAL); `spec` is valid and
    // the old value is not asked for.
    unsafe {
        syscalls::syscall!(
            syscalls::Sysno::timer_settime,
            timer.0,
            0,
            &spec as *const libc::itimerspec,
            0usize
        )
    }
    .map(|_| ())
    .map_err(|error| error.into_raw())
}

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER3` (96 bytes): a software sampling event with a sample
/// period and, for records with stacks, the user registers and stack bytes a sample copies.
#[repr(C)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    /// `wakeup_events`, or `wakeup_watermark` (bytes) with [`PERF_ATTR_FLAG_WATERMARK`].
    wakeup: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
const PERF_ATTR_FLAG_DISABLED: u64 = 1 << 0;
const PERF_ATTR_FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const PERF_ATTR_FLAG_EXCLUDE_HV: u64 = 1 << 6;
const PERF_ATTR_FLAG_WATERMARK: u64 = 1 << 14;
const PERF_SAMPLE_IP: u64 = 1 << 0;
const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;
/// `PERF_REG_X86_BP`, `_SP` and `_IP`: the user registers a sample with a stack records, in this order.
const PERF_REGS_BP_SP_IP: u64 = (1 << 6) | (1 << 7) | (1 << 8);
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
/// `_IO('$', 0)`.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
/// `_IOW('$', 4, __u64)`.
const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
/// `_IOR('$', 7, __u64 *)`.
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
const F_SETSIG: i32 = 10;
const F_SETOWN_EX: i32 = 15;
const F_OWNER_TID: i32 = 0;
/// `si_code` of a signal sent for an fd's `O_ASYNC` notification with data to read (`POLL_IN`).
pub const POLL_IN: i32 = 1;
/// Lowest descriptor a task-clock event may have: 0, 1 and 2 are the program's, open or not.
const LOWEST_EVENT_FD: i32 = 3;

/// `struct f_owner_ex`.
#[repr(C)]
struct OwnerEx {
    kind: i32,
    pid: libc::pid_t,
}

/// A per-thread task-clock perf event ([`open_task_clock`]): its descriptor and the kernel's id for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskClock {
    pub fd: i32,
    pub id: u64,
}

/// What a task-clock event writes into its ring ([`map_event_ring`]) at each sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleRecord {
    /// Nothing: the event only signals.
    None,
    /// A `PERF_RECORD_SAMPLE` of the user pc (`PERF_SAMPLE_IP`).
    Pc,
    /// A `PERF_RECORD_SAMPLE` of the user pc, the user registers rbp, rsp and rip (`PERF_SAMPLE_REGS_USER`) and
    /// up to `stack_bytes` of the user stack from rsp up (`PERF_SAMPLE_STACK_USER`; a multiple of 8, below
    /// 65 536).
    PcAndStack { stack_bytes: u32 },
}

/// Opens a disabled `PERF_COUNT_SW_TASK_CLOCK` event on the calling thread that, once enabled
/// ([`enable_task_clock`]), sends `signal` to this very thread
/// (`F_SETOWN_EX`/`F_OWNER_TID`, `F_SETSIG`, `O_ASYNC`) each time `period_ns` of its CPU time in user mode
/// elapses (`exclude_kernel`, which `perf_event_paranoid` 2 requires): the signal's `si_code` is [`POLL_IN`]
/// and its `si_fd` the descriptor. With a `record`, each sample is also a record in the event's ring once one
/// is mapped ([`map_event_ring`]), and the descriptor polls readable once `wake_bytes` of records wait there
/// (the ring's size: never). The descriptor is `O_CLOEXEC` and never 0, 1 or 2. Errno when the kernel refuses
/// (EACCES/EPERM: paranoid or seccomp; ENOSYS; EMFILE). Async-signal-safe (system calls only); errno
/// preserved.
pub fn open_task_clock(
    signal: i32,
    period_ns: u64,
    record: SampleRecord,
    wake_bytes: u32,
) -> Result<TaskClock, i32> {
    let _errno = SavedErrno::save();
    let (sample_type, sample_regs_user, sample_stack_user) = match record {
        SampleRecord::None => (0, 0, 0),
        SampleRecord::Pc => (PERF_SAMPLE_IP, 0, 0),
        SampleRecord::PcAndStack { stack_bytes } => (
            PERF_SAMPLE_IP | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER,
            PERF_REGS_BP_SP_IP,
            stack_bytes,
        ),
    };
    let records = record != SampleRecord::None;
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_TASK_CLOCK,
        sample_period: period_ns.max(1),
        sample_type,
        read_format: 0,
        flags: PERF_ATTR_FLAG_DISABLED
            | PERF_ATTR_FLAG_EXCLUDE_KERNEL
            | PERF_ATTR_FLAG_EXCLUDE_HV
            | if records { PERF_ATTR_FLAG_WATERMARK } else { 0 },
        wakeup: if records { wake_bytes } else { 0 },
        bp_type: 0,
        config1: 0,
        config2: 0,
        branch_sample_type: 0,
        sample_regs_user,
        sample_stack_user,
        clockid: 0,
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it states; pid 0 and cpu -1 mean the calling
    // thread on any CPU; no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    } as i32;
    if fd < 0 {
        return Err(errno());
    }
    let fd = above_standard_streams(fd)?;
    let owner = OwnerEx {
        kind: F_OWNER_TID,
        pid: gettid(),
    };
    // SAFETY: fcntl on our own descriptor; `owner` is a valid f_owner_ex for F_SETOWN_EX.
    let ready = unsafe {
        libc::fcntl(fd, F_SETOWN_EX, &owner as *const OwnerEx) == 0
            && libc::fcntl(fd, F_SETSIG, signal) == 0
            && libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC) == 0
    };
    let mut id = 0u64;
    // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer.
    let named = ready && unsafe { libc::ioctl(fd, PERF_EVENT_IOC_ID, &mut id as *mut u64) } == 0;
    if !named {
        let error = errno();
        close_file(fd);
        return Err(error);
    }
    Ok(TaskClock { fd, id })
}

/// `fd` itself when above 2, else a duplicate above 2 (`O_CLOEXEC`) with `fd` closed: the program may reopen
/// its standard streams at any time.
fn above_standard_streams(fd: i32) -> Result<i32, i32> {
    if fd >= LOWEST_EVENT_FD {
        return Ok(fd);
    }
    // SAFETY: duplicating our own descriptor.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, LOWEST_EVENT_FD) };
    let error = errno();
    close_file(fd);
    if high < 0 { Err(error) } else { Ok(high) }
}

/// Starts the event counting (and signalling). Async-signal-safe; errno preserved.
pub fn enable_task_clock(event: TaskClock) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: PERF_EVENT_IOC_ENABLE takes no argument; `event.fd` is our perf event.
    unsafe { libc::ioctl(event.fd, PERF_EVENT_IOC_ENABLE, 0) == 0 }
}

/// Whether `event.fd` still is that event: false once the program closed the descriptor (and perhaps reused
/// its number). Async-signal-safe; errno preserved.
pub fn task_clock_is_open(event: TaskClock) -> bool {
    let _errno = SavedErrno::save();
    let mut id = 0u64;
    // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer; on a descriptor that is no perf event the
    // call fails and writes nothing.
    (unsafe { libc::ioctl(event.fd, PERF_EVENT_IOC_ID, &mut id as *mut u64) } == 0)
        && id == event.id
}

/// Sets the event's sample period from the next one on. Async-signal-safe; errno preserved.
pub fn set_task_clock_period(event: TaskClock, period_ns: u64) -> bool {
    let _errno = SavedErrno::save();
    let period = period_ns.max(1);
    // SAFETY: PERF_EVENT_IOC_PERIOD reads one u64 through the pointer.
    unsafe { libc::ioctl(event.fd, PERF_EVENT_IOC_PERIOD, &period as *const u64) == 0 }
}

/// Closes the event's descriptor if it still is that event (the program may have closed it and reused the
/// number). Async-signal-safe; errno preserved.
pub fn close_task_clock(event: TaskClock) {
    let _errno = SavedErrno::save();
    if task_clock_is_open(event) {
        close_file(event.fd);
    }
}

/// Stops the event's signals (`O_ASYNC` off): its samples go only to its ring. Async-signal-safe; errno
/// preserved.
pub fn stop_task_clock_signals(event: TaskClock) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: fcntl F_SETFL on our own perf event: clears O_ASYNC (perf events take no other status flag).
    unsafe { libc::fcntl(event.fd, libc::F_SETFL, 0) == 0 }
}

/// Restarts the event's signals (`O_ASYNC` on), from any thread: they still go to the event's own thread.
/// Async-signal-safe; errno preserved.
pub fn start_task_clock_signals(event: TaskClock) -> bool {
    let _errno = SavedErrno::save();
    // SAFETY: fcntl F_SETFL on our own perf event: sets O_ASYNC.
    unsafe { libc::fcntl(event.fd, libc::F_SETFL, libc::O_ASYNC) == 0 }
}

/// Offsets of `data_head` and `data_tail` in `struct perf_event_mmap_page`.
const RING_DATA_HEAD: usize = 1024;
const RING_DATA_TAIL: usize = 1032;

/// Maps the ring of `event`: its header page (`struct perf_event_mmap_page`) and `data_bytes` of records (a
/// power of two number of pages), which start one page in. The
/// mapping holds the event: it samples on after its descriptor is closed, until [`unmap_event_ring`]. The
/// kernel does not copy it into a forked child. `None` when refused (EPERM beyond `perf_event_mlock_kb` and
/// `RLIMIT_MEMLOCK`, ENOMEM). Async-signal-safe; errno preserved.
pub fn map_event_ring(event: TaskClock, data_bytes: usize) -> Option<*mut u8> {
    let _errno = SavedErrno::save();
    // SAFETY: a new shared mapping of our own perf event's ring; it replaces nothing.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            page_size() + data_bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            event.fd,
            0,
        )
    };
    (base != libc::MAP_FAILED).then_some(base.cast::<u8>())
}

/// Unmaps a ring from [`map_event_ring`].
///
/// # Safety
/// `base` and `data_bytes` must be a ring [`map_event_ring`] returned, unused afterwards.
pub unsafe fn unmap_event_ring(base: *mut u8, data_bytes: usize) {
    // SAFETY: as the caller guarantees.
    unsafe { unmap(base, page_size() + data_bytes) };
}

/// The ring's `data_head`: the kernel has written every record before it (acquire: their bytes are visible).
///
/// # Safety
/// `base` is a ring from [`map_event_ring`], still mapped.
pub unsafe fn ring_head(base: *const u8) -> u64 {
    // SAFETY: `data_head` is an aligned u64 in the ring's header page, which the kernel updates; read as an
    // atomic.
    unsafe { (*base.add(RING_DATA_HEAD).cast::<AtomicU64>()).load(Ordering::Acquire) }
}

/// The ring's `data_tail`, which only its reader (us) writes.
///
/// # Safety
/// As [`ring_head`].
pub unsafe fn ring_tail(base: *const u8) -> u64 {
    // SAFETY: `data_tail`, an aligned u64 in the header page, written only through [`set_ring_tail`].
    unsafe { (*base.add(RING_DATA_TAIL).cast::<AtomicU64>()).load(Ordering::Relaxed) }
}

/// Gives the records before `tail` back to the kernel (release: they were read before).
///
/// # Safety
/// As [`ring_head`].
pub unsafe fn set_ring_tail(base: *const u8, tail: u64) {
    // SAFETY: as in `ring_tail`.
    unsafe { (*base.add(RING_DATA_TAIL).cast::<AtomicU64>()).store(tail, Ordering::Release) }
}

type SetitimerFn = unsafe extern "C" fn(i32, *const libc::itimerval, *mut libc::itimerval) -> i32;

/// Calls libc's `setitimer` (the next definition after ours); -1 when there is none.
///
/// # Safety
/// The arguments are those of `setitimer(2)`.
pub unsafe fn next_setitimer(
    which: i32,
    value: *const libc::itimerval,
    old: *mut libc::itimerval,
) -> i32 {
    let Some(real) = next_symbol(c"setitimer") else {
        return -1;
    };
    // SAFETY: `real` is libc's setitimer, whose signature is SetitimerFn.
    let real: SetitimerFn = unsafe { std::mem::transmute::<usize, SetitimerFn>(real) };
    // SAFETY: the caller's arguments.
    unsafe { real(which, value, old) }
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

/// The fields of a SIGPROF's siginfo that the sampler needs.
#[derive(Clone, Copy, Debug)]
pub struct SignalOrigin {
    pub code: i32,
    /// `si_value` of a timer's signal (`SI_TIMER`), else 0.
    pub value: usize,
    pub overrun: i32,
    /// `si_fd` of an `O_ASYNC` descriptor's signal (`POLL_IN`), else -1.
    pub fd: i32,
}

/// Offset of `si_fd` in a 64-bit siginfo: after `si_signo`, `si_errno`, `si_code`, padding and `si_band`.
const SIGINFO_FD_OFFSET: usize = 24;

/// Reads code, timer value, overrun count and descriptor from a handler's siginfo.
///
/// # Safety
/// `info` must be the siginfo pointer the kernel passed to an SA_SIGINFO handler, or null.
pub unsafe fn signal_origin(info: *const libc::siginfo_t) -> SignalOrigin {
    let mut origin = SignalOrigin {
        code: 0,
        value: 0,
        overrun: 0,
        fd: -1,
    };
    // SAFETY: guaranteed by the caller.
    let Some(siginfo) = (unsafe { info.as_ref() }) else {
        return origin;
    };
    origin.code = siginfo.si_code;
    if siginfo.si_code == libc::SI_TIMER {
        // SAFETY: for SI_TIMER the timer fields of the union are the ones the kernel filled in.
        (origin.value, origin.overrun) =
            unsafe { (siginfo.si_value().sival_ptr as usize, siginfo.si_overrun()) };
    } else if siginfo.si_code == POLL_IN {
        // SAFETY: for POLL_IN the kernel filled in the poll fields of the union (si_band, si_fd); siginfo_t
        // is 128 bytes, so the offset is inside it.
        origin.fd = unsafe {
            std::ptr::read_unaligned(info.cast::<u8>().add(SIGINFO_FD_OFFSET).cast::<i32>())
        };
    }
    origin
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

// ---------------------------------------------------------------------------------------------------------
// Call stacks (`stacks`): the interrupted registers, the stacks a walk may read, and our own memory read
// without faulting.
// ---------------------------------------------------------------------------------------------------------

/// The interrupted `(rip, rsp, rbp)` from a handler's ucontext (zeros for a null context).
///
/// # Safety
/// `context` must be the ucontext pointer the kernel passed to an SA_SIGINFO handler, or null.
#[cfg(target_arch = "x86_64")]
pub unsafe fn interrupted_registers(context: *const c_void) -> (usize, usize, usize) {
    let context = context as *const libc::ucontext_t;
    // SAFETY: guaranteed by the caller.
    let Some(context) = (unsafe { context.as_ref() }) else {
        return (0, 0, 0);
    };
    let registers = &context.uc_mcontext.gregs;
    (
        registers[libc::REG_RIP as usize] as usize,
        registers[libc::REG_RSP as usize] as usize,
        registers[libc::REG_RBP as usize] as usize,
    )
}

/// Offsets of the saved `(rip, rsp, rbp)` in a `ucontext_t` as the kernel lays it out in a signal frame
/// (`struct ucontext` then `struct sigcontext`: glibc's `ucontext_t` and `REG_*` indices mirror them).
#[cfg(target_arch = "x86_64")]
pub fn ucontext_register_offsets() -> (usize, usize, usize) {
    let gregs = std::mem::offset_of!(libc::ucontext_t, uc_mcontext)
        + std::mem::offset_of!(libc::mcontext_t, gregs);
    let word = std::mem::size_of::<libc::greg_t>();
    (
        gregs + libc::REG_RIP as usize * word,
        gregs + libc::REG_RSP as usize * word,
        gregs + libc::REG_RBP as usize * word,
    )
}

/// The body of a naked `extern "C"` function whose fourth argument points to at least three writable words: it
/// stores there its caller's registers as they will be once it returns (pc: the return address; sp: just above
/// it; rbp unchanged), then jumps to `$target` with the same arguments (the `test-hooks` export
/// `mslprof_test_walk_here` in exports.rs).
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
macro_rules! store_caller_registers_and_jump {
    ($target:path) => {
        core::arch::naked_asm!(
            "mov rax, [rsp]",
            "mov [rcx], rax",
            "lea rax, [rsp + 8]",
            "mov [rcx + 8], rax",
            "mov [rcx + 16], rbp",
            "jmp {target}",
            target = sym $target,
        )
    };
}
#[cfg(all(feature = "test-hooks", target_arch = "x86_64"))]
pub(crate) use store_caller_registers_and_jump;

/// The calling thread's stack as `[lowest, highest)` (`pthread_getattr_np`). Not async-signal-safe (for the
/// main thread glibc reads `/proc/self/maps`).
pub fn current_thread_stack() -> Option<(usize, usize)> {
    let _errno = SavedErrno::save();
    // SAFETY: pthread_attr_t is plain data, initialised by pthread_getattr_np before use and destroyed after.
    unsafe {
        let mut attributes: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attributes) != 0 {
            return None;
        }
        let mut address: *mut c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let found = libc::pthread_attr_getstack(&attributes, &mut address, &mut size) == 0;
        libc::pthread_attr_destroy(&mut attributes);
        let low = address as usize;
        (found && size != 0).then(|| (low, low.saturating_add(size)))
    }
}

/// The calling thread's alternate signal stack as `[lowest, highest)`, when it has one enabled.
/// Async-signal-safe, errno preserved.
pub fn alternate_signal_stack() -> Option<(usize, usize)> {
    let _errno = SavedErrno::save();
    // SAFETY: stack_t is plain data; sigaltstack with a null new stack only fills `old`.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sigaltstack(std::ptr::null(), &mut old) } != 0
        || old.ss_flags & libc::SS_DISABLE != 0
        || old.ss_size == 0
    {
        return None;
    }
    let low = old.ss_sp as usize;
    Some((low, low.saturating_add(old.ss_size)))
}

/// Copies our own memory at `address` into `buffer` with `process_vm_readv` on our own pid, one page per
/// iovec, so the copy stops at the first unmapped page instead of faulting; returns the bytes copied from
/// the start. Async-signal-safe (one system call), errno preserved.
pub fn read_own_memory(address: usize, buffer: &mut [u8]) -> usize {
    const MOST_PAGES: usize = 32;
    let page = 4096;
    let _errno = SavedErrno::save();
    let mut remote = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MOST_PAGES];
    let mut pieces = 0;
    let mut at = address;
    let end = address.saturating_add(buffer.len());
    while at < end && pieces < MOST_PAGES {
        let next = ((at / page) + 1).saturating_mul(page).min(end);
        remote[pieces] = libc::iovec {
            iov_base: at as *mut c_void,
            iov_len: next - at,
        };
        pieces += 1;
        at = next;
    }
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: at - address,
    };
    // SAFETY: process_vm_readv only writes `local` (our buffer, of that length) and reads the remote ranges
    // through the kernel, which reports an unmapped page as a short count or EFAULT instead of faulting.
    let copied = unsafe {
        libc::syscall(
            libc::SYS_process_vm_readv,
            libc::getpid(),
            &local as *const libc::iovec,
            1usize,
            remote.as_ptr(),
            pieces,
            0usize,
        )
    };
    if copied > 0 { copied as usize } else { 0 }
}

/// The `sa_restorer` that libc gives the kernel for `signal`'s handler (glibc's `__restore_rt`, the code that
/// a signal handler returns into), 0 if unknown. Not for signal handlers.
pub fn signal_restorer(signal: i32) -> usize {
    let Some(real) = next_symbol(c"sigaction") else {
        return 0;
    };
    // SAFETY: sigaction is plain data, filled by the call.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `real` is libc's sigaction; only the old action is asked for.
    if unsafe { call_sigaction(real, signal, std::ptr::null(), &mut old) } != 0 {
        return 0;
    }
    old.sa_restorer.map_or(0, |f| f as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_protections_are_read_as_the_program_set_them() {
        let page = page_size();
        let base = map_zeroed(3 * page).expect("a mapping") as usize;
        // SAFETY: our own fresh mapping; nothing runs in it.
        assert!(unsafe { protect_exactly(base + page, page, libc::PROT_READ | libc::PROT_EXEC) });
        // SAFETY: as above.
        assert!(unsafe { protect_exactly(base + 2 * page, page, libc::PROT_NONE) });
        let pages = [base, base + page, base + 2 * page, 4096];
        let mut access = [PageAccess::default(); 4];
        assert!(page_protections(&pages, &mut access));
        let prots: Vec<(i32, bool)> = access.iter().map(|a| (a.prot, a.mapped)).collect();
        assert_eq!(
            prots,
            [
                (libc::PROT_READ | libc::PROT_WRITE, true),
                (libc::PROT_READ | libc::PROT_EXEC, true),
                (libc::PROT_NONE, true),
                (0, false)
            ]
        );
        assert!(access.iter().all(|a| !a.shared));
        // SAFETY: our own mapping, no longer used.
        unsafe { unmap(base as *mut u8, 3 * page) };
        let line = b"7f00-7f10 r-xs 00000000 08:01 42 /a path with spaces";
        assert_eq!(
            maps_line(line),
            Some((
                0x7f00,
                0x7f10,
                PageAccess {
                    prot: libc::PROT_READ | libc::PROT_EXEC,
                    shared: true,
                    mapped: true
                }
            ))
        );
    }

    #[test]
    fn the_thread_count_is_the_eighteenth_field_after_the_command_name() {
        let line =
            b"4242 (a (b) c) R 1 4242 4242 0 -1 4194304 100 0 0 0 5 1 0 0 20 0 3 0 1234 5678";
        assert_eq!(stat_thread_count(line), Some(3));
        assert_eq!(stat_thread_count(b"4242 (x) R 1 2"), None);
        let tasks = std::fs::read_dir("/proc/self/task")
            .map(|dir| dir.count())
            .ok();
        assert_eq!(thread_count(), tasks);
    }
}
