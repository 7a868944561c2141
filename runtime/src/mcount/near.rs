//! A copy of `mcount` next to the main program, which `-pg` code there calls instead of the library's own.
//!
//! A `-pg` module calls `mcount` through its GOT, and the loader fills that entry with this library's
//! `mcount`. A PIE main program is mapped at 0x55…, about 40 TB below the shared libraries (0x7f…).
//! On the machines this project measures on, a call to code that far away and its return cost about
//! 0.8 ns more than the same call to code 1 GiB away (runtime/CALLCOUNTS.md, "The call into the
//! runtime"): a third of glibc's whole per-call overhead on fib, paid by every counted call of the main
//! program. So at start-up, if the main program's code is more than 2 GiB from this library's `mcount`,
//! the runtime maps a copy of `mcount`'s code within 128 MiB below it, and points the main program's GOT
//! entries for `mcount` and `_mcount` at the copy. The copy is the same hit path, with the addresses it
//! needs held as immediates ([`super::x86_64::near_mcount_template`]); a miss jumps to the library's slow
//! path, so counting is unchanged. `MSLPROF_NEAR_MCOUNT=0` turns it off (`config::Settings::near_mcount`,
//! checked by the caller). Shared libraries are left alone: they are mapped near this library, and may be
//! unloaded. A sample taken in the copy is counted at the same instruction of the template
//! ([`library_address`]), so the copy's time is this library's (profiling overhead), not code outside every
//! module.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::x86_64::{NEAR_PLACEHOLDERS, near_mcount_code};
use crate::modules::LiveModule;
use crate::sys;
use mslprof_loader_hooks::ModuleInfo;

/// Modules whose code is at least this far from the library's `mcount` get the copy.
const FAR: usize = 1 << 31;
/// The copy's mapping.
const COPY_BYTES: usize = 4096;
/// The copy is placed at the first free one of this many 2 MiB-aligned addresses below the main program.
const PLACEMENT_TRIES: usize = 64;
const PLACEMENT_STEP: usize = 2 << 20;

/// The copy's address (0 until one is mapped).
static COPY: AtomicUsize = AtomicUsize::new(0);

/// `pc` as an address in this library: a PC in the copy becomes the same instruction of
/// `near_mcount_template`, any other PC stays as it is. Async-signal-safe (one atomic load).
pub fn library_address(pc: usize) -> usize {
    let copy = COPY.load(Ordering::Relaxed);
    if copy == 0 {
        return pc;
    }
    let (template, _) = near_mcount_code();
    copied_from(pc, copy, template)
}

/// The address in `template` that `pc` executes when it lies in the copy of it at `copy`; else `pc`.
fn copied_from(pc: usize, copy: usize, template: &[u8]) -> usize {
    match pc.checked_sub(copy) {
        Some(offset) if offset < template.len() => template.as_ptr() as usize + offset,
        _ => pc,
    }
}

/// The copy's start and length, once mapped.
pub fn copy_range() -> Option<(usize, usize)> {
    let copy = COPY.load(Ordering::Relaxed);
    (copy != 0).then(|| (copy, near_mcount_code().0.len()))
}

/// Redirects the main program's GOT entries for `mcount` and `_mcount` to a copy of `mcount` mapped
/// next to it, when the program is far from this library. Returns the number of entries redirected.
/// Run once, at start-up, before the runtime counts.
pub fn redirect_main_program(modules: &[&LiveModule]) -> usize {
    let Some(main) = modules.iter().find(|m| m.info.is_main) else {
        return 0;
    };
    let targets = super::x86_64::mcount_entry_points();
    let info = &main.info;
    let Some((text, _)) = info.runtime_ranges().next() else {
        return 0;
    };
    let text = text.as_usize();
    if text.abs_diff(targets[0]) < FAR {
        return 0;
    }
    let page = sys::page_size();
    let mut copy = None;
    let mut redirected = 0;
    for (word, read_only) in relro_words_holding(info, &targets) {
        if copy.is_none() {
            copy = make_copy(text);
        }
        let Some(copy) = copy else {
            return redirected;
        };
        if store_in_relro(word, copy, read_only, page) {
            redirected += 1;
        }
    }
    redirected
}

/// The words of a module's RELRO segment (its GOT, once relocated) that hold one of `targets` (`mcount` and
/// `_mcount`), each with whether the loader made its page read-only. A module that imports neither has none,
/// and its RELRO (megabytes of vtables in a C++ library) is not read.
pub fn relro_words_holding(
    info: &ModuleInfo,
    targets: &[usize],
) -> Vec<(&'static AtomicUsize, bool)> {
    let Some(relro) = info.relro else {
        return Vec::new();
    };
    if !crate::modules::may_import_any(info, &[b"mcount", b"_mcount"]) {
        return Vec::new();
    }
    let start = (info.bias + relro.start as usize).next_multiple_of(8);
    let end = info.bias + relro.end as usize;
    // The loader made [start, end rounded down to a page) read-only; the rest of the last page stays
    // writable.
    let protected_end = end & !(sys::page_size() - 1);
    (start..end.saturating_sub(7))
        .step_by(8)
        .filter_map(|address| {
            // SAFETY: the module's RELRO segment is mapped readable while the module is loaded (the
            // callers run at start-up, on modules that are never unloaded), and `address` is an aligned
            // word inside it.
            let word: &'static AtomicUsize = unsafe { &*(address as *const AtomicUsize) };
            targets
                .contains(&word.load(Ordering::Relaxed))
                .then_some((word, address < protected_end))
        })
        .collect()
}

/// Maps `len` (at most [`PLACEMENT_STEP`]) bytes of read-write memory at the first free 2 MiB-aligned address
/// below `text`, within [`PLACEMENT_TRIES`] steps, or else above `text_end`: within 130 MiB of the code
/// between them, so that a `rel32` branch reaches either way.
pub fn map_near(text: usize, text_end: usize, len: usize) -> Option<*mut u8> {
    let below = (1..=PLACEMENT_TRIES)
        .filter_map(|k| (text & !(PLACEMENT_STEP - 1)).checked_sub(k * PLACEMENT_STEP));
    let above = (1..=PLACEMENT_TRIES)
        .map(|k| text_end.next_multiple_of(PLACEMENT_STEP) + k * PLACEMENT_STEP);
    below
        .chain(above)
        .find_map(|address| sys::map_exactly_at(address, len))
}

/// Maps a copy of `mcount`'s code just below `text`, with its placeholders filled in; its address.
fn make_copy(text: usize) -> Option<usize> {
    let (code, values) = near_mcount_code();
    if code.is_empty() || code.len() > COPY_BYTES {
        return None;
    }
    let base = map_near(text, text, COPY_BYTES)?;
    // SAFETY: `base` is our own fresh read-write mapping of COPY_BYTES bytes, which nothing else uses yet.
    let bytes = unsafe { std::slice::from_raw_parts_mut(base, COPY_BYTES) };
    let filled = fill_copy(bytes, code, values);
    // SAFETY: nothing runs code in the copy yet, and nothing writes it after this.
    if !filled || !unsafe { sys::protect(base as usize, COPY_BYTES, false, true) } {
        // SAFETY: our own mapping, never handed out.
        unsafe { sys::unmap(base, COPY_BYTES) };
        return None;
    }
    COPY.store(base as usize, Ordering::Relaxed);
    Some(base as usize)
}

/// Writes a template's `code` at the start of `to` with its placeholders replaced by `values`; false when it
/// does not fit or a placeholder is missing.
pub fn fill_copy(to: &mut [u8], code: &[u8], values: [u64; 4]) -> bool {
    let Some(to) = to.get_mut(..code.len()) else {
        return false;
    };
    to.copy_from_slice(code);
    NEAR_PLACEHOLDERS
        .iter()
        .zip(values)
        .all(|(placeholder, value)| replace_all(to, *placeholder, value) > 0)
}

/// Replaces every occurrence of the little-endian bytes of `placeholder` in `code` by those of `value`;
/// how many there were.
fn replace_all(code: &mut [u8], placeholder: u64, value: u64) -> usize {
    let (from, to) = (placeholder.to_le_bytes(), value.to_le_bytes());
    let mut count = 0;
    let mut i = 0;
    while i + 8 <= code.len() {
        if code[i..i + 8] == from {
            code[i..i + 8].copy_from_slice(&to);
            count += 1;
            i += 8;
        } else {
            i += 1;
        }
    }
    count
}

/// Stores `value` into a GOT entry, making its page writable for the store if the loader made it
/// read-only, and giving the page back exactly the protection `/proc/self/maps` showed. False if the kernel
/// refused or the protection could not be read.
fn store_in_relro(word: &AtomicUsize, value: usize, read_only: bool, page: usize) -> bool {
    let page_start = word as *const AtomicUsize as usize & !(page - 1);
    let mut access = [sys::PageAccess::default()];
    let prot = if read_only {
        if !sys::page_protections(&[page_start], &mut access) || !access[0].mapped {
            return false;
        }
        access[0].prot
    } else {
        0
    };
    let opened = read_only && prot & libc::PROT_WRITE == 0;
    // SAFETY: the page only gains write permission; code and readers are unaffected.
    if opened && !unsafe { sys::protect_exactly(page_start, page, prot | libc::PROT_WRITE) } {
        return false;
    }
    // An aligned 8-byte store: a thread calling through the entry meanwhile reads the old or the new
    // address, and both are a working `mcount`.
    word.store(value, Ordering::Release);
    if opened {
        // SAFETY: back to the protection the page had; nothing writes the GOT after relocation.
        unsafe { sys::protect_exactly(page_start, page, prot) };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_wherever_they_occur() {
        let mut code = vec![0x90u8; 40];
        code[3..11].copy_from_slice(&7u64.to_le_bytes());
        code[20..28].copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(replace_all(&mut code, 7, 9), 2);
        assert_eq!(code[3..11], 9u64.to_le_bytes());
        assert_eq!(code[20..28], 9u64.to_le_bytes());
        assert_eq!(replace_all(&mut code, 7, 9), 0);
    }

    #[test]
    fn a_pc_in_the_copy_is_the_same_instruction_of_the_template() {
        let template = [0x90u8; 16];
        let start = template.as_ptr() as usize;
        let copy = 0x5000_0000;
        assert_eq!(copied_from(copy, copy, &template), start);
        assert_eq!(copied_from(copy + 15, copy, &template), start + 15);
        assert_eq!(copied_from(copy + 16, copy, &template), copy + 16);
        assert_eq!(copied_from(copy - 1, copy, &template), copy - 1);
    }

    #[test]
    fn the_templates_hold_each_placeholder() {
        for (code, values) in [
            near_mcount_code(),
            super::super::x86_64::near_site_mcount_code(),
        ] {
            assert!(!code.is_empty() && code.len() <= COPY_BYTES);
            for placeholder in NEAR_PLACEHOLDERS {
                let bytes = placeholder.to_le_bytes();
                assert!(code.windows(8).any(|w| w == bytes), "{placeholder:#x}");
            }
            let mut copy = vec![0u8; code.len()];
            assert!(fill_copy(&mut copy, code, values));
            assert!(!fill_copy(&mut copy[1..], code, values));
        }
    }
}
