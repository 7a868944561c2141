//! The one place where loader-hooks calls libc: dl_iterate_phdr, getauxval and raw reads of mapped ELF memory.

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

/// ELF program header. mslprof supports 64-bit Linux targets (x86_64, aarch64) only.
#[cfg(target_pointer_width = "64")]
pub type ProgramHeader = libc::Elf64_Phdr;

/// One object as `dl_iterate_phdr` reports it, borrowed for the duration of the callback.
pub struct LoadedObject<'a> {
    /// `dlpi_addr`: the load bias (runtime address − link-time address).
    pub bias: usize,
    /// `dlpi_name` (empty for the main program).
    pub name: &'a [u8],
    pub program_headers: &'a [ProgramHeader],
    /// `dlpi_adds` / `dlpi_subs`: how many objects the loader has added / removed so far.
    pub adds: u64,
    pub subs: u64,
}

/// Calls `visit` once per loaded object, in the loader's order, while the loader's lock is held.
pub fn for_each_loaded_object(visit: &mut dyn FnMut(&LoadedObject<'_>)) {
    unsafe extern "C" fn callback(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut &mut dyn FnMut` passed below, alive for the whole dl_iterate_phdr call.
        let visit = unsafe { &mut *(data as *mut &mut dyn FnMut(&LoadedObject<'_>)) };
        // SAFETY: glibc passes a valid dl_phdr_info for the duration of the callback.
        let info = unsafe { &*info };
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader's link map.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let program_headers = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: dlpi_phdr points to dlpi_phnum program headers mapped with the object.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        // dlpi_adds/dlpi_subs exist only when the loader's struct is big enough to hold them.
        let has_counters = size >= std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
        let object = LoadedObject {
            bias: info.dlpi_addr as usize,
            name,
            program_headers,
            adds: if has_counters { info.dlpi_adds } else { 0 },
            subs: if has_counters { info.dlpi_subs } else { 0 },
        };
        // A panic must not unwind through the C loader.
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(&object))).is_err() {
            return 1;
        }
        0
    }
    let mut visit = visit;
    // SAFETY: the callback only dereferences what glibc hands it and our own closure pointer.
    unsafe {
        libc::dl_iterate_phdr(
            Some(callback),
            &mut visit as *mut &mut dyn FnMut(&LoadedObject<'_>) as *mut c_void,
        );
    }
}

/// `getauxval(kind)`, 0 when absent.
pub fn aux_value(kind: libc::c_ulong) -> usize {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(kind) as usize }
}

/// The system page size (a power of two).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 && (size as usize).is_power_of_two() {
        size as usize
    } else {
        4096
    }
}

pub use libc::{AT_BASE, AT_PHDR, AT_SYSINFO_EHDR};

/// Borrows `len` bytes of the process's memory at `address`.
///
/// # Safety
/// `[address, address + len)` must lie in readable memory that stays mapped for `'a` (for example inside a
/// readable PT_LOAD segment of an object that cannot be unloaded meanwhile).
pub unsafe fn mapped_bytes<'a>(address: usize, len: usize) -> &'a [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(address as *const u8, len) }
}
