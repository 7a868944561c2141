//! The unsafe half of the audit module: reading a loaded module's dynamic symbols through its link map, and
//! the executable memory holding the counting stubs.

use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::dynsym::{DynamicSymbols, Elf64Dyn, PltRole};

/// glibc's `struct link_map`, its public head (`<link.h>`).
#[repr(C)]
pub struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const Elf64Dyn,
    l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// A loaded module: its name and dynamic symbol table.
pub struct Module {
    name: &'static [u8],
    symbols: DynamicSymbols,
}

impl Module {
    /// The module behind `map`, or `None` when it has no symbol table ld.so can use.
    ///
    /// # Safety
    /// `map` is a link map ld.so has set up (mapped, dynamic section read), valid for the process's life.
    pub unsafe fn from_link_map(map: *const LinkMap) -> Option<Module> {
        // SAFETY: caller.
        let map = unsafe { &*map };
        let name = if map.l_name.is_null() {
            &[][..]
        } else {
            // SAFETY: l_name is a NUL-terminated string owned by ld.so.
            unsafe { CStr::from_ptr(map.l_name) }.to_bytes()
        };
        // SAFETY: the link map's own load bias and dynamic section (caller).
        let symbols = unsafe { DynamicSymbols::new(map.l_addr, map.l_ld) }?;
        Some(Module {
            // SAFETY: ld.so keeps the name for the link map's life; a module unloaded is never read again.
            name: unsafe { std::mem::transmute::<&[u8], &'static [u8]>(name) },
            symbols,
        })
    }

    pub fn name(&self) -> &[u8] {
        self.name
    }

    /// What the module is to PLT counting (see [`DynamicSymbols::plt_role`]).
    pub fn plt_role(&self) -> PltRole {
        self.symbols.plt_role()
    }
}

/// Bytes of address space reserved for stubs, once: pages are backed only as stubs are written (2 M stubs).
const ARENA_BYTES: usize = 64 << 20;
/// Bytes per stub: `push qword [rip + 18]` (6), `call qword [rip + to the arena's first word]` (6),
/// `lea rsp, [rsp + 8]` (5), `jmp qword [rip + 1]` (6), `int3` (1), the target address (8).
const STUB_BYTES: usize = 32;

/// The arena: its base (0 until first use). Its first word holds the counting entry that every stub calls.
static ARENA: AtomicUsize = AtomicUsize::new(0);
/// libmslprof.so's `mslprof_plt_arena` (two words: base and length), where the arena is announced so that
/// the runtime counts samples in the stubs as its own, the cost of profiling (0: none).
static ANNOUNCE_TO: AtomicUsize = AtomicUsize::new(0);
/// Bytes of the arena handed out so far (the first stub's slot holds the entry).
static USED: AtomicUsize = AtomicUsize::new(STUB_BYTES);

/// The arena, mapped on first use (threads racing to map it keep the first mapping); `None` when no memory
/// can be had.
fn arena(entry: usize) -> Option<usize> {
    let base = ARENA.load(Ordering::Acquire);
    if base != 0 {
        return Some(base);
    }
    // SAFETY: a fresh private anonymous mapping, reserved without swap; the stubs must be writable while made
    // and executable while other threads already run the earlier ones.
    let fresh = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ARENA_BYTES,
            libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if fresh == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the first word of our new mapping, not yet visible to anyone.
    unsafe { (fresh as *mut usize).write(entry) };
    match ARENA.compare_exchange(0, fresh as usize, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            announce(fresh as usize);
            if crate::perf_map_wanted() {
                name_for_perf(fresh as usize);
            }
            Some(fresh as usize)
        }
        Err(first) => {
            // SAFETY: our own mapping, which nobody else has seen.
            unsafe { libc::munmap(fresh, ARENA_BYTES) };
            Some(first)
        }
    }
}

/// Remembers where the runtime wants to learn the arena's place (`mslprof_plt_arena`), and tells it at once:
/// the base and length if the arena exists already, else the length alone (calls through the PLT are
/// counted in this process).
pub fn announce_arena_to(slot: usize) {
    ANNOUNCE_TO.store(slot, Ordering::Release);
    announce(ARENA.load(Ordering::Acquire));
}

/// Writes the arena's length and, once it exists (`base` not 0), its base into the runtime's
/// `mslprof_plt_arena`, length first: a reader that sees the base sees the length, and the length alone
/// says that calls through the PLT are counted.
fn announce(base: usize) {
    let slot = ANNOUNCE_TO.load(Ordering::Acquire);
    if slot == 0 {
        return;
    }
    // SAFETY: `slot` is the address of libmslprof.so's exported `mslprof_plt_arena`, two aligned
    // `AtomicUsize` that live as long as the process (the runtime is never unloaded).
    let words = unsafe { &*(slot as *const [AtomicUsize; 2]) };
    words[1].store(ARENA_BYTES, Ordering::Release);
    if base != 0 {
        words[0].store(base, Ordering::Release);
    }
}

/// A new stub that counts a call through `entry` and continues at `target`; `None` when the arena cannot be
/// mapped or is full (the slot then stays direct: uncounted, never wrong). Lock-free, allocation-free and
/// reentrant: a signal handler may call it while it runs on the same thread.
pub fn stub(entry: usize, target: usize) -> Option<usize> {
    let base = arena(entry)?;
    let offset = USED.fetch_add(STUB_BYTES, Ordering::Relaxed);
    if offset + STUB_BYTES > ARENA_BYTES {
        return None;
    }
    let stub = base + offset;
    let to_entry = (base as isize - (stub as isize + 12)) as i32;
    let mut code = [0xccu8; STUB_BYTES];
    // push qword [rip + 18]: the callee's address, at offset 24.
    code[..6].copy_from_slice(&[0xff, 0x35, 18, 0, 0, 0]);
    // call qword [rip + to the arena's first word]: the runtime's entry.
    code[6..8].copy_from_slice(&[0xff, 0x15]);
    code[8..12].copy_from_slice(&to_entry.to_le_bytes());
    // lea rsp, [rsp + 8]: drops the callee's address (flags untouched).
    code[12..17].copy_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x08]);
    // jmp qword [rip + 1]: the callee, with the caller's return address on top of the stack.
    code[17..23].copy_from_slice(&[0xff, 0x25, 1, 0, 0, 0]);
    code[24..32].copy_from_slice(&target.to_le_bytes());
    // SAFETY: `offset + STUB_BYTES <= ARENA_BYTES`: the stub lies inside our mapping, and `fetch_add` gave
    // these bytes to this call alone; nobody runs the stub before we return its address.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), stub as *mut u8, STUB_BYTES) };
    Some(stub)
}

/// `MSLPROF_PERF_MAP=1`: appends the arena's line to perf's map file for this process
/// (`/tmp/perf-PID.map`, `START SIZE name` in hexadecimal; libmslprof.so appends the lines of its own
/// code), so that perf names the stubs' time instead of showing `[JIT] tid N`. Allocation-free (a stub may
/// be made in a signal handler); gives up quietly.
fn name_for_perf(base: usize) {
    let mut line = [0u8; 96];
    let mut used = 0;
    let mut put = |bytes: &[u8]| {
        let end = (used + bytes.len()).min(line.len());
        line[used..end].copy_from_slice(&bytes[..end - used]);
        used = end;
    };
    let mut digits = [0u8; 16];
    put(hex(base as u64, &mut digits));
    put(b" ");
    put(hex(ARENA_BYTES as u64, &mut digits));
    put(b" mslprof PLT counting stubs\n");
    let mut path = [0u8; 40];
    let mut at = 0;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let mut pid_digits = [0u8; 20];
    let mut decimal = pid_digits.len();
    let mut rest = pid;
    loop {
        decimal -= 1;
        pid_digits[decimal] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for part in [&b"/tmp/perf-"[..], &pid_digits[decimal..], b".map\0"] {
        path[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    // SAFETY: errno is this thread's; kept across the calls below.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: writes the line's bytes from our buffer; one short line, appended whole.
        unsafe {
            libc::write(fd, line.as_ptr().cast(), used);
            libc::close(fd);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// `value` in lowercase hexadecimal, without leading zeros, in `digits`.
fn hex(value: u64, digits: &mut [u8; 16]) -> &[u8] {
    let mut at = digits.len();
    let mut rest = value;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[(rest % 16) as usize];
        rest /= 16;
        if rest == 0 {
            break;
        }
    }
    &digits[at..]
}
