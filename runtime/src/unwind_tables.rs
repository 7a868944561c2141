//! Each module's unwind tables (`.eh_frame_hdr` and the `.eh_frame` it indexes) where a stack walk may read
//! them at any moment: in place for modules loaded at start-up, which are never unloaded, and copied, when the
//! module is added (outside any handler), for those `dlopen` loaded; and their look-up without allocation,
//! for the stack walks of `stacks`.

use std::sync::atomic::{AtomicBool, Ordering};

use gimli::{
    BaseAddresses, EhFrame, EhFrameHdr, EndianSlice, NativeEndian, ParsedEhFrameHdr, Pointer,
    Register, RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection, UnwindTableRow,
};
use mslprof_loader_hooks::ModuleInfo;

/// Whether modules added from now on copy their tables (stacks are on).
static WANTED: AtomicBool = AtomicBool::new(false);

/// Modules added from now on copy their unwind tables (`true`) or not.
pub fn set_wanted(wanted: bool) {
    WANTED.store(wanted, Ordering::Relaxed);
}

/// Whether modules copy their unwind tables when added.
pub fn wanted() -> bool {
    WANTED.load(Ordering::Relaxed)
}

type Slice = EndianSlice<'static, NativeEndian>;

/// Unwind tables bigger than this are not used (the module is walked by frame pointer only).
const MOST_TABLE_BYTES: u64 = 256 << 20;

/// One module's unwind tables, with link-time base addresses, so lookups take link-time addresses.
///
/// A module `dlopen` loaded can be unmapped by `dlclose` on another thread at any moment, and the runtime hears
/// of it only after the loader has unmapped it (loader-hooks reports unloads when `dlclose` returns). A walk
/// reading such a module's own `.eh_frame` could then fault, so its tables are copied when it is added; the
/// copies live as long as the process (like the [`crate::modules::LiveModule`] that owns them). The modules
/// loaded at start-up ([`ModuleInfo::loaded_at_start_up`]: the program, its libraries, the preloaded ones) are
/// never unloaded, and their tables are read where they are: copying them would cost every process at start-up
/// (the `.eh_frame` of a rustc-sized library is megabytes) and every `fork` after (the copies are memory a
/// fork maps again). Either way the walk reads no module code (the signal trampoline is known by its address).
pub struct ModuleUnwind {
    header: ParsedEhFrameHdr<Slice>,
    eh_frame: EhFrame<Slice>,
    bases: BaseAddresses,
}

impl std::fmt::Debug for ModuleUnwind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleUnwind").finish_non_exhaustive()
    }
}

/// `len` bytes of the loaded module `info` at link-time `start`, when they lie in its readable, file-backed
/// memory: in place for a module loaded at start-up, else copied.
fn module_bytes(info: &ModuleInfo, start: u64, len: u64) -> Option<&'static [u8]> {
    let end = start.checked_add(len)?;
    if len == 0
        || len > MOST_TABLE_BYTES
        || !info
            .readable_ranges
            .iter()
            .any(|r| r.start <= start && end <= r.end)
    {
        return None;
    }
    let address = (info.bias as u64).wrapping_add(start) as usize;
    // SAFETY: the range lies inside a readable, file-backed PT_LOAD segment of a module the loader reported
    // just now; it stays mapped while the module is added (start-up, or the loader event with the loader lock
    // held), and for the life of the process when the module was loaded at start-up (never unloaded).
    let bytes = unsafe { std::slice::from_raw_parts(address as *const u8, len as usize) };
    if info.loaded_at_start_up {
        Some(bytes)
    } else {
        Some(Vec::leak(bytes.to_vec()))
    }
}

impl ModuleUnwind {
    /// The unwind tables of the loaded module `info` (its `.eh_frame_hdr` and the `.eh_frame` it points to, up
    /// to the end of the segment holding it: in place or copied, see [`ModuleUnwind`]); `None` when it has no
    /// usable search table. Allocates: never from a handler.
    pub fn of_module(info: &ModuleInfo) -> Option<ModuleUnwind> {
        let header_range = info.eh_frame_hdr?;
        let header_bytes = module_bytes(info, header_range.start, header_range.len())?;
        let bases = BaseAddresses::default().set_eh_frame_hdr(header_range.start);
        let header = EhFrameHdr::new(header_bytes, NativeEndian)
            .parse(&bases, 8)
            .ok()?;
        let Pointer::Direct(eh_frame_start) = header.eh_frame_ptr() else {
            return None;
        };
        let segment = info
            .readable_ranges
            .iter()
            .find(|r| r.start <= eh_frame_start && eh_frame_start < r.end)?;
        let eh_frame_bytes = module_bytes(info, eh_frame_start, segment.end - eh_frame_start)?;
        let bases = bases
            .set_eh_frame(eh_frame_start)
            .set_text(info.exec_ranges.first().map_or(0, |r| r.start));
        header.table()?;
        Some(ModuleUnwind {
            header,
            eh_frame: EhFrame::new(eh_frame_bytes, NativeEndian),
            bases,
        })
    }

    /// The call-frame information row for link-time `address`, if the tables have one. No allocation: the
    /// context's storage is inline.
    pub fn row<'c>(
        &self,
        address: u64,
        context: &'c mut UnwindContext<usize, StoreOnStack>,
    ) -> Option<&'c UnwindTableRow<usize, StoreOnStack>> {
        self.header
            .table()?
            .unwind_info_for_address(
                &self.eh_frame,
                &self.bases,
                context,
                address,
                |section, bases, offset| section.cie_from_offset(bases, offset),
            )
            .ok()
    }
}

/// Register rule storage of a fixed size, inside the context (no allocation): x86-64 code saves at most the
/// seven callee-saved registers and the return address, with rarely more than one remembered state.
pub struct StoreOnStack;

impl<T: gimli::ReaderOffset> UnwindContextStorage<T> for StoreOnStack {
    type Rules = [(Register, RegisterRule<T>); 16];
    type Stack = [UnwindTableRow<T, Self>; 2];
}
