//! The one place with foreign calls: the C++ runtime's demangler (`__cxa_demangle` from libstdc++, the
//! same demangler GNU binutils uses), looked up at run time so mslprof does not depend on libstdc++.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

type CxaDemangle =
    unsafe extern "C" fn(*const c_char, *mut c_char, *mut usize, *mut c_int) -> *mut c_char;

fn cxa_demangle_fn() -> Option<CxaDemangle> {
    static FN: OnceLock<Option<usize>> = OnceLock::new();
    let addr = FN.get_or_init(|| {
        let lib = CString::new("libstdc++.so.6").ok()?;
        let sym = CString::new("__cxa_demangle").ok()?;
        // SAFETY: both arguments are valid NUL-terminated strings; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: `handle` is a live handle from dlopen (never closed), `sym` a valid C string.
        let f = unsafe { libc::dlsym(handle, sym.as_ptr()) };
        if f.is_null() { None } else { Some(f as usize) }
    });
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
    if out.is_null() {
        return None;
    }
    // SAFETY: on success the demangler returned a NUL-terminated string it allocated with malloc.
    let s = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `out` came from malloc inside the demangler and is freed exactly once.
    unsafe { libc::free(out.cast::<c_void>()) };
    if status == 0 { Some(s) } else { None }
}

/// Map a file read-only. Profiles and ELF files can be large; only the pages actually used are read.
pub fn map_file(path: &std::path::Path) -> std::io::Result<memmap2::Mmap> {
    let f = std::fs::File::open(path)?;
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
