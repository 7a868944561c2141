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

pub use libc::CLOCK_REALTIME;

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
/// `cookie` as its `si_value`, firing every `period_ns` nanoseconds of this thread's CPU time.
pub fn start_thread_cpu_timer(
    signal: i32,
    cookie: usize,
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
    let period = libc::timespec {
        tv_sec: (period_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (period_ns % 1_000_000_000) as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: period,
        it_value: period,
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

pub type SignalHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void);
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

/// A sigaction that runs `handler` with SA_SIGINFO | SA_RESTART and nothing else blocked.
pub fn sampling_action(handler: SignalHandler) -> libc::sigaction {
    // SAFETY: sigaction is plain data; all-zero is valid (empty mask, no flags).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    action
}

/// Blocks the signals of `mask` in this thread for the life of the returned guard. Async-signal-safe.
pub struct MaskGuard(libc::sigset_t);

impl MaskGuard {
    pub fn block(mask: &libc::sigset_t) -> MaskGuard {
        // SAFETY: sigset_t is plain data.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, mask, &mut old) };
        MaskGuard(old)
    }
}

impl Drop for MaskGuard {
    fn drop(&mut self) {
        // SAFETY: restoring the mask saved in `block`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Unblocks `signal` in this thread and sends it to the thread (used to give a signal its default action).
pub fn unblock_and_raise(signal: i32) {
    // SAFETY: sigset_t is plain data; the calls get valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
}

/// Calls a program's signal handler as the kernel would have.
///
/// # Safety
/// `handler` must be the address of a handler the program installed, with the SA_SIGINFO calling convention
/// when `siginfo` is true; `info` and `context` are the ones our handler received.
pub unsafe fn call_program_handler(
    handler: usize,
    siginfo: bool,
    signal: i32,
    info: *mut libc::siginfo_t,
    context: *mut c_void,
) {
    if siginfo {
        // SAFETY: the program registered it with SA_SIGINFO, so it has this signature.
        let handler: SignalHandler =
            unsafe { std::mem::transmute::<usize, SignalHandler>(handler) };
        handler(signal, info, context);
    } else {
        // SAFETY: a plain handler takes only the signal number.
        let handler: extern "C" fn(i32) =
            unsafe { std::mem::transmute::<usize, extern "C" fn(i32)>(handler) };
        handler(signal);
    }
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
