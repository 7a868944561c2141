//! libmslprof_audit.so, the `LD_AUDIT` module that counts calls through the PLT (issue 10).
//!
//! ld.so (glibc ≥ 2.35) asks `la_symbind64` for the address to write into every PLT slot it binds, lazily or
//! at start-up (bind-now), in the program and in every library `dlopen` loads later. For a function defined in
//! a module that is not compiled for counting (no `mcount`, `__fentry__` or `__cyg_profile_func_enter`
//! import), this module answers with a 32-byte stub: `push` the function's address, `call` the runtime's
//! `mslprof_plt_entry` (libmslprof.so, in the program's namespace), drop the pushed address, `jmp` to the
//! function. The entry counts the arc (caller's return address, function entry) with the same per-thread
//! cache and arc tables as mcount's `__fentry__`, keeps every register and returns into the stub, so every
//! `ret` matches its `call` (return prediction stays right) and the function runs as if called directly.
//!
//! What is never redirected: symbols looked up with `dlsym`/`dlvsym` (the program sees the real address),
//! data symbols, bindings into ld.so, the vDSO, the runtime itself or a module that mcount already counts,
//! bindings from the runtime, and everything outside the program's own namespace (`dlmopen`). Nothing is
//! redirected when libmslprof.so is not loaded or `MSLPROF_PLT=0`. Only `JUMP_SLOT` bindings reach
//! `la_symbind64`, so a function's address as the program takes it (`GLOB_DAT`, `-fno-plt`) never changes.

mod dynsym;
mod sys;

use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use dynsym::{Elf64Sym, PltRole};
use sys::{LinkMap, Module};

/// The audit interface version this module implements (`LAV_CURRENT` of glibc 2.36).
const LAV_CURRENT: u32 = 2;
const LA_FLG_BINDTO: u32 = 0x01;
const LA_FLG_BINDFROM: u32 = 0x02;
const LA_SYMB_DLSYM: u32 = 0x08;
const LA_SYMB_DLVSYM: u32 = 0x10;
/// The program's own link-map namespace.
const LM_ID_BASE: isize = 0;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

/// False with `MSLPROF_PLT=0`.
static ENABLED: AtomicBool = AtomicBool::new(false);
/// Run-time address of libmslprof.so's `mslprof_plt_entry` (0: the runtime is not loaded).
static COUNT_ENTRY: AtomicUsize = AtomicUsize::new(0);

/// `MSLPROF_PERF_MAP=1`: the stubs' arena is named in perf's map file (`sys::stub`).
static PERF_MAP: AtomicBool = AtomicBool::new(false);

/// Whether `MSLPROF_PERF_MAP=1` asked for perf's map file.
fn perf_map_wanted() -> bool {
    PERF_MAP.load(Ordering::Relaxed)
}

/// First call from ld.so: accept its interface version and read `MSLPROF_PLT` and `MSLPROF_PERF_MAP`.
#[unsafe(no_mangle)]
pub extern "C" fn la_version(version: u32) -> u32 {
    PERF_MAP.store(
        std::env::var_os("MSLPROF_PERF_MAP").is_some_and(|v| v == "1"),
        Ordering::Relaxed,
    );
    let off = std::env::var_os("MSLPROF_PLT").is_some_and(|v| v == "0");
    ENABLED.store(!off && !restarting(), Ordering::Relaxed);
    if version == 0 {
        0
    } else {
        version.min(LAV_CURRENT)
    }
}

/// True in an image that the runtime is about to execute again without `LD_PROFILE` (runtime/src/reexec.rs:
/// the variable is set and not empty, and `MSLPROF_REEXEC=0` is not). Nothing is redirected there. Other
/// libraries' constructors run before the runtime's, and a call they make through a stub would start the
/// runtime early, which then must not restart the program (rustc's LLVM constructors did so, and the whole
/// run stayed under ld.so's profiling trampoline). The new image has the variable renamed and counts.
fn restarting() -> bool {
    std::env::var_os("LD_PROFILE").is_some_and(|v| !v.is_empty())
        && std::env::var_os("MSLPROF_REEXEC").is_none_or(|v| v != "0")
}

/// Called for each module loaded: decides whether bindings from it and to it come to `la_symbind64`.
///
/// # Safety
/// Called by ld.so with a valid link map.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_objopen(map: *const LinkMap, lmid: isize, _cookie: *mut usize) -> u32 {
    if !ENABLED.load(Ordering::Relaxed) || lmid != LM_ID_BASE || map.is_null() {
        return 0;
    }
    // SAFETY: ld.so hands over the link map of a module it has just mapped, with its dynamic section.
    let Some(module) = (unsafe { Module::from_link_map(map) }) else {
        return 0;
    };
    // The vDSO: no symbol says what it is, its name does.
    if module.name().starts_with(b"linux-") {
        return 0;
    }
    match module.plt_role() {
        PltRole::DynamicLinker => 0,
        PltRole::Runtime { entry, arena } => {
            // The runtime: its own calls are never counted, and nothing is redirected into it.
            sys::announce_arena_to(arena);
            COUNT_ENTRY.store(entry, Ordering::Release);
            0
        }
        // mcount counts calls into it already: only its calls out are redirected.
        PltRole::CountsItself => LA_FLG_BINDFROM,
        PltRole::CountedAtThePlt => LA_FLG_BINDTO | LA_FLG_BINDFROM,
    }
}

/// Called for each `JUMP_SLOT` binding between two modules `la_objopen` accepted (and for `dlsym`): returns
/// the address ld.so writes into the PLT slot.
///
/// # Safety
/// Called by ld.so with a valid symbol and flags.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn la_symbind64(
    sym: *const Elf64Sym,
    _ndx: u32,
    refcook: *mut usize,
    defcook: *mut usize,
    flags: *mut u32,
    _symname: *const c_char,
) -> usize {
    // SAFETY: ld.so passes a symbol whose st_value holds the resolved run-time address, and its flags.
    let (target, kind, flags) = unsafe { ((*sym).st_value as usize, (*sym).st_info & 0xf, *flags) };
    let entry = COUNT_ENTRY.load(Ordering::Acquire);
    // The cookies are the two modules' own audit slots: the same slot means a module binding a symbol it
    // defines itself (a call to one of its interposable functions). Such a call never leaves its module, and
    // the count of a PLT-counted function is the calls that entered it from outside (libLLVM's calls to its
    // own exported functions would otherwise be most of what rustc's PLT counting costs).
    if flags & (LA_SYMB_DLSYM | LA_SYMB_DLVSYM) != 0
        || refcook == defcook
        || entry == 0
        || target == 0
        || !(kind == STT_FUNC || kind == STT_GNU_IFUNC)
    {
        return target;
    }
    // Lock-free and without thread-local storage: ld.so allocates a module's TLS block with the program's
    // malloc on first use (rustc's jemalloc), whose own PLT calls would come back here. A signal handler
    // binding a slot while this thread is in here gets a stub of its own.
    sys::stub(entry, target).unwrap_or(target)
}
