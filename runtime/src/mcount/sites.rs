//! Rewritten `-pg` call sites: each `call *mcount@GOTPCREL(%rip)` of a module becomes a jump to a stub of
//! its own, which counts the call in a table that belongs to the function and to the thread, and jumps back.
//!
//! runtime/CALLCOUNTS.md ("Jumping to a per-function stub") measured the design: a jump to a stub and back
//! costs Lua's interpreter about 0.4 ns less per call than a call and its return, and a table per function
//! needs one compare (the caller's return address) where the thread cache needs two. This file holds the
//! parts that do not depend on the process: finding the sites in a module's code and encoding a stub.
//!
//! **A site** is `ff 15 disp32` (`call *[rip + disp32]`) whose operand is a GOT entry holding `mcount` or
//! `_mcount`, after the `-pg` prologue: `push rbp; mov rbp, rsp` (`55 48 89 e5`), then only pushes of
//! callee-saved registers and `sub rsp, imm` (gcc -O2 puts those before the call in 516 of the 680 functions
//! of the bench's `liblua.so`). The stub reads the caller's return address at `[rbp + 8]`, as `mcount` does.
//! A site becomes `jmp stub` (`e9 rel32`) and a `nop`; the stub jumps back to the instruction after the site.
//!
//! **A stub** ([`STUB_BYTES`] bytes) looks the caller's return address up in the function's table, a slice
//! of [`TABLE_ENTRIES`] entries at a fixed offset in the thread's site region, whose address is a TLS word:
//! ```text
//!  0  push rax
//!  1  mov rax, [rbp + 8]            the caller's return address
//!  5  shl eax, 3                    ((frompc >> 2) mod TABLE_ENTRIES) * 32
//!  8  and eax, INDEX_MASK
//! 13  add rax, fs:[tls]             + the thread's site region
//! 22  mov r11, [rax + table]        the entry's frompc
//! 29  cmp r11, [rbp + 8]
//! 33  jne 49
//! 35  add qword [rax + table + 24], 1
//! 43  pop rax
//! 44  jmp back
//! 49  pop rax                       a miss: as if `mcount` were called from the site
//! 50  call miss                     (the region's trampoline to the slow path)
//! 55  jmp back
//! 60  table (u32), selfpc (u64)     read by the slow path through its return address
//! ```

/// Entries of one function's table: callers whose return addresses differ in bits 2–9 never collide.
pub const TABLE_ENTRIES: usize = 256;
/// Bytes of one function's table (entries are 32 bytes, as the thread cache's).
pub const TABLE_BYTES: usize = TABLE_ENTRIES * 32;
/// Bytes of one stub, rounded up to 16.
pub const STUB_BYTES: usize = 80;
/// Where the slow path finds a stub's table offset and selfpc: this far after the return address of its
/// `call miss`.
pub const METADATA_AFTER_MISS_CALL: usize = 5;
/// Offset of the return address of a stub's `call miss` in the stub.
pub const MISS_RETURN: usize = 55;
/// The start of the `-pg` prologue before a site.
const PROLOGUE: [u8; 4] = [0x55, 0x48, 0x89, 0xe5];
/// Most bytes between the prologue's start and the site: `mov rbp, rsp`, six pushes, a `sub rsp, imm32`.
const PROLOGUE_REACH: usize = PROLOGUE.len() + 6 * 2 + 7;
/// Bytes of a site (`call *[rip + disp32]`).
pub const SITE_BYTES: usize = 6;
/// Mask of the table index, already multiplied by the entry size.
const INDEX_MASK: u32 = ((TABLE_ENTRIES - 1) * 32) as u32;

/// The sites in `text` (mapped at `text_start`) whose operand is one of `got_entries` (runtime addresses of
/// GOT entries holding `mcount`), as runtime addresses of their first byte, in order.
pub fn find_sites(text: &[u8], text_start: usize, got_entries: &[usize]) -> Vec<usize> {
    let mut sites = Vec::new();
    if got_entries.is_empty() {
        return sites;
    }
    let mut i = PROLOGUE.len();
    while i + SITE_BYTES <= text.len() {
        if text[i] == 0xff && text[i + 1] == 0x15 && after_prologue(text, i) {
            let disp = i32::from_le_bytes([text[i + 2], text[i + 3], text[i + 4], text[i + 5]]);
            let next = text_start.wrapping_add(i + SITE_BYTES);
            let operand = next.wrapping_add_signed(disp as isize);
            if got_entries.contains(&operand) {
                sites.push(text_start + i);
                i += SITE_BYTES;
                continue;
            }
        }
        i += 1;
    }
    sites
}

/// Whether the code before `site` is the `-pg` prologue: `push rbp; mov rbp, rsp`, then pushes and at most
/// one `sub rsp, imm` (each tried as a start, the rest must decode exactly up to the site).
fn after_prologue(text: &[u8], site: usize) -> bool {
    (PROLOGUE.len()..=PROLOGUE_REACH.min(site)).any(|back| {
        let start = site - back;
        text[start..start + PROLOGUE.len()] == PROLOGUE
            && frame_setup_ends_at(&text[start + PROLOGUE.len()..site])
    })
}

/// Whether `code` is only pushes of registers followed by at most one `sub rsp, imm8/imm32`.
fn frame_setup_ends_at(mut code: &[u8]) -> bool {
    loop {
        code = match code {
            [] => return true,
            [0x50..=0x57, rest @ ..] | [0x41, 0x50..=0x57, rest @ ..] => rest,
            [0x48, 0x83, 0xec, _] | [0x48, 0x81, 0xec, _, _, _, _] => return true,
            _ => return false,
        };
    }
}

/// The `rel32` of a branch at `from` (address of the byte after it) to `to`, when it reaches.
fn rel32(from: usize, to: usize) -> Option<i32> {
    i32::try_from(to as isize - from as isize).ok()
}

/// The bytes that replace a site at `site`: `jmp stub; nop`. `None` when the stub is out of reach.
pub fn site_jump(site: usize, stub: usize) -> Option<[u8; SITE_BYTES]> {
    let rel = rel32(site + 5, stub)?.to_le_bytes();
    Some([0xe9, rel[0], rel[1], rel[2], rel[3], 0x90])
}

/// The stub at `stub` for the site at `site`: its function's table at `table` bytes into the thread's site
/// region, whose address is at `fs:[tls]`; a miss calls `miss`. `None` when a branch does not reach or the
/// table is beyond a 32-bit displacement.
pub fn encode_stub(
    stub: usize,
    site: usize,
    tls: i32,
    table: u32,
    miss: usize,
) -> Option<[u8; STUB_BYTES]> {
    let back = site + SITE_BYTES;
    let table_disp = i32::try_from(table).ok()?;
    let count_disp = table_disp.checked_add(24)?;
    let mut code = Vec::with_capacity(STUB_BYTES);
    // A branch's rel32, from the end of the instruction being written (opcode and rel32 still to come).
    let branch = |code: &Vec<u8>, to: usize| rel32(stub + code.len() + 5, to);
    code.push(0x50);
    code.extend([0x48, 0x8b, 0x45, 0x08]);
    code.extend([0xc1, 0xe0, 0x03]);
    code.push(0x25);
    code.extend(INDEX_MASK.to_le_bytes());
    code.extend([0x64, 0x48, 0x03, 0x04, 0x25]);
    code.extend(tls.to_le_bytes());
    code.extend([0x4c, 0x8b, 0x98]);
    code.extend(table_disp.to_le_bytes());
    code.extend([0x4c, 0x3b, 0x5d, 0x08]);
    // jne over the hit's add, pop and jmp (8 + 1 + 5 bytes).
    code.extend([0x75, 0x0e]);
    code.extend([0x48, 0x83, 0x80]);
    code.extend(count_disp.to_le_bytes());
    code.push(0x01);
    code.push(0x58);
    let hit_back = branch(&code, back)?;
    code.push(0xe9);
    code.extend(hit_back.to_le_bytes());
    code.push(0x58);
    let to_miss = branch(&code, miss)?;
    code.push(0xe8);
    code.extend(to_miss.to_le_bytes());
    debug_assert_eq!(code.len(), MISS_RETURN);
    let miss_back = branch(&code, back)?;
    code.push(0xe9);
    code.extend(miss_back.to_le_bytes());
    debug_assert_eq!(code.len(), MISS_RETURN + METADATA_AFTER_MISS_CALL);
    code.extend(table.to_le_bytes());
    code.extend((back as u64).to_le_bytes());
    code.resize(STUB_BYTES, 0xcc);
    code.try_into().ok()
}

/// What the slow path needs from the stub whose `call miss` returned to `miss_return`: the function's table
/// offset in the site region and its selfpc.
///
/// # Safety
/// `miss_return` must be the return address of a stub's `call miss`.
pub unsafe fn stub_metadata(miss_return: usize) -> (u32, usize) {
    let at = miss_return + METADATA_AFTER_MISS_CALL;
    // SAFETY: the caller guarantees a stub, whose metadata follows its last jump; stubs are never unmapped.
    unsafe {
        (
            (at as *const u32).read_unaligned(),
            ((at + 4) as *const u64).read_unaligned() as usize,
        )
    }
}

/// The offset of the entry a call from `frompc` uses in the table at `table`.
pub fn entry_offset(table: u32, frompc: usize) -> usize {
    table as usize + ((frompc << 3) as u32 & INDEX_MASK) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_with_site(at: usize, disp: i32) -> Vec<u8> {
        let mut text = vec![0x90u8; 64];
        text[at - 4..at].copy_from_slice(&PROLOGUE);
        text[at] = 0xff;
        text[at + 1] = 0x15;
        text[at + 2..at + 6].copy_from_slice(&disp.to_le_bytes());
        text
    }

    #[test]
    fn a_site_is_the_call_through_the_mcount_entry_after_the_prologue() {
        let start = 0x1000;
        let text = text_with_site(10, 0x200);
        let entry = start + 16 + 0x200;
        assert_eq!(find_sites(&text, start, &[entry]), vec![start + 10]);
        assert!(find_sites(&text, start, &[entry + 8]).is_empty());
        let mut no_prologue = text.clone();
        no_prologue[7] = 0x90;
        assert!(find_sites(&no_prologue, start, &[entry]).is_empty());
    }

    #[test]
    fn pushes_and_a_stack_adjustment_may_come_between_the_prologue_and_the_site() {
        let start = 0x1000;
        // push rbp; mov rbp, rsp; push r13; push r12; push rbx; sub rsp, 8; call *[rip + 0x200]
        let mut text = vec![0x90u8; 8];
        text.extend([
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x55, 0x41, 0x54, 0x53, 0x48, 0x83, 0xec, 0x08,
        ]);
        let site = text.len();
        text.extend([0xff, 0x15, 0x00, 0x02, 0x00, 0x00, 0xc3]);
        let entry = start + site + 6 + 0x200;
        assert_eq!(find_sites(&text, start, &[entry]), vec![start + site]);
        // A `mov` in between is not frame set-up.
        text[12] = 0x89;
        assert!(find_sites(&text, start, &[entry]).is_empty());
    }

    #[test]
    fn the_site_jumps_to_its_stub_and_the_stub_back() {
        let (site, stub) = (0x40_0000usize, 0x30_0000usize);
        let jump = site_jump(site, stub).unwrap();
        assert_eq!(jump[0], 0xe9);
        let rel = i32::from_le_bytes(jump[1..5].try_into().unwrap());
        assert_eq!((site as isize + 5 + rel as isize) as usize, stub);
        let code = encode_stub(stub, site, -0x100, 3 * TABLE_BYTES as u32, stub + 0x1000).unwrap();
        let back = |at: usize| {
            let rel = i32::from_le_bytes(code[at + 1..at + 5].try_into().unwrap());
            (stub as isize + at as isize + 5 + rel as isize) as usize
        };
        assert_eq!((code[44], back(44)), (0xe9, site + SITE_BYTES));
        assert_eq!((code[50], back(50)), (0xe8, stub + 0x1000));
        assert_eq!((code[55], back(55)), (0xe9, site + SITE_BYTES));
        // SAFETY: `code` holds a whole stub; its metadata follows the miss call.
        let (table, selfpc) = unsafe { stub_metadata(code.as_ptr() as usize + MISS_RETURN) };
        assert_eq!((table, selfpc), (3 * TABLE_BYTES as u32, site + SITE_BYTES));
        assert!(site_jump(site, site + (3 << 30)).is_none());
    }

    #[test]
    fn callers_four_bytes_apart_use_neighbouring_entries() {
        assert_eq!(entry_offset(0, 0x1000), 0);
        assert_eq!(entry_offset(0, 0x1004), 32);
        assert_eq!(
            entry_offset(TABLE_BYTES as u32, 0x1000 + 4 * 255),
            2 * TABLE_BYTES - 32
        );
        assert_eq!(entry_offset(0, 0x1000 + 4 * 256), 0);
    }
}
