//! The one place with foreign calls and other unsafe code: the demanglers of GNU binutils (`bfd_demangle`
//! from the system's libbfd, the very function gprof calls) and of libstdc++ (`__cxa_demangle`), both
//! looked up at run time so mslprof depends on neither; and read-only file mappings.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

type CxaDemangle =
    unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;

/// The address of `symbol` in the shared library `library` (a file name or path), loaded with `dlopen` and
/// never closed; `None` when either is missing.
fn dlopen_symbol(library: &CStr, symbol: &CStr) -> Option<usize> {
    // SAFETY: `library` is a valid NUL-terminated string; dlopen has no other preconditions, and the libraries
    // loaded here (libstdc++, libbfd) have no constructors that touch our state.
    let handle = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: `handle` is a live handle from dlopen (never closed), `symbol` a valid C string.
    let f = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if f.is_null() { None } else { Some(f as usize) }
}

/// Copies a NUL-terminated string that a C demangler allocated with malloc, and frees it; `None` for null.
///
/// # Safety
/// `out` is null or a NUL-terminated string allocated with malloc that nothing else uses or frees.
unsafe fn take_malloced_string(out: *mut c_char) -> Option<String> {
    if out.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees `out` is a live NUL-terminated string.
    let s = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `out` came from malloc and is freed exactly once, here (the caller's contract).
    unsafe { libc::free(out.cast::<c_void>()) };
    Some(s)
}

fn cxa_demangle_fn() -> Option<CxaDemangle> {
    static FN: OnceLock<Option<usize>> = OnceLock::new();
    let addr = FN.get_or_init(|| dlopen_symbol(c"libstdc++.so.6", c"__cxa_demangle"));
    // SAFETY: the address is `__cxa_demangle` from libstdc++, whose C ABI signature is `CxaDemangle`.
    addr.map(|a| unsafe { std::mem::transmute::<usize, CxaDemangle>(a) })
}

/// Demangle an Itanium C++ ABI name with libstdc++'s demangler, if libstdc++ is installed.
pub fn cxa_demangle(name: &str) -> Option<String> {
    let f = cxa_demangle_fn()?;
    let c = CString::new(name).ok()?;
    let mut status: c_int = 0;
    // SAFETY: `c` is a valid C string; a null output buffer and length ask the demangler to allocate with
    // malloc, and `status` is a valid out-pointer.
    let out = unsafe {
        f(
            c.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut status,
        )
    };
    // SAFETY: the demangler returns null or a NUL-terminated string it allocated with malloc, now ours.
    let s = unsafe { take_malloced_string(out) }?;
    if status == 0 { Some(s) } else { None }
}

/// Map a file read-only. Profiles and ELF files can be large; only the pages actually used are read.
/// A directory is refused as such (mapping one would fail with ENODEV, "No such device").
pub fn map_file(path: &std::path::Path) -> std::io::Result<memmap2::Mmap> {
    let f = std::fs::File::open(path)?;
    if f.metadata()?.is_dir() {
        return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
    }
    // SAFETY: the mapping is read-only and private. If another process truncates the file while it is
    // mapped, reading the lost pages raises SIGBUS: the same risk GNU binutils and every mmap-based tool
    // accept for input files.
    unsafe { memmap2::Mmap::map(&f) }
}

/// Tell the kernel the first `upto` bytes of a read-only file mapping will not be read again, so their
/// pages stop counting against the process (they are re-read from the file if touched after all).
pub fn release_prefix(map: &memmap2::Mmap, upto: usize) {
    let page = 4096;
    let len = (upto.min(map.len()) / page) * page;
    if len == 0 {
        return;
    }
    // SAFETY: the mapping is private and read-only, so dropping its pages loses no data: a later access
    // faults the file contents back in. Errors only mean the pages stay resident.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, len) };
}

type BfdDemangle = unsafe extern "C" fn(*mut c_void, *const c_char, c_int) -> *mut c_char;

/// The system's libbfd (`libbfd-<version>-system.so` on Debian, `libbfd-<version>.so` elsewhere), newest
/// first.
fn libbfd_candidates() -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/lib64",
        "/usr/lib",
    ] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut found: Vec<std::path::PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libbfd-") && n.ends_with(".so"))
            })
            .collect();
        found.sort();
        found.reverse();
        out.extend(found);
    }
    out
}

fn bfd_demangle_fn() -> Option<BfdDemangle> {
    static FN: OnceLock<Option<usize>> = OnceLock::new();
    let addr = FN.get_or_init(|| {
        libbfd_candidates().into_iter().find_map(|lib| {
            let path = CString::new(lib.into_os_string().into_encoded_bytes()).ok()?;
            dlopen_symbol(&path, c"bfd_demangle")
        })
    });
    // SAFETY: the address is libbfd's `bfd_demangle`, whose C signature is `BfdDemangle`.
    addr.map(|a| unsafe { std::mem::transmute::<usize, BfdDemangle>(a) })
}

/// Whether GNU binutils' demangler is available.
pub fn have_bfd_demangler() -> bool {
    bfd_demangle_fn().is_some()
}

/// Demangle `name` exactly as gprof does (`bfd_demangle` with `DMGL_ANSI | DMGL_PARAMS`), if libbfd is
/// installed. `None` when it is not, or when the name is not mangled.
pub fn bfd_demangle(name: &str) -> Option<String> {
    const DMGL_PARAMS: c_int = 1;
    const DMGL_ANSI: c_int = 2;
    let f = bfd_demangle_fn()?;
    let c = CString::new(name).ok()?;
    // SAFETY: a null bfd is allowed (no leading-character handling); `c` is a valid C string.
    let out = unsafe { f(std::ptr::null_mut(), c.as_ptr(), DMGL_ANSI | DMGL_PARAMS) };
    // SAFETY: libbfd returns null or a NUL-terminated string allocated with malloc, now ours.
    unsafe { take_malloced_string(out) }
}

/// The real user id of this process.
pub fn user_id() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}
