//! The x86_64 assembly of the mcount family: the exported `mcount`/`_mcount`/`__fentry__` stubs with their
//! fast path, the per-thread call-cache block in static TLS, and the xsave trampoline for early start-up.

use super::{CacheEntry, ThreadCache};

/// Saves every register an instrumented function may still need, aligns the stack, calls
/// `$record(frompc, selfpc)` and restores them. Expects `push rbp; mov rbp, rsp` done, with
/// `frompc` in rdi and `selfpc` in rsi not yet loaded: `$load` loads them from the frame.
///
/// Saved: rax (vector-argument count of a variadic call), rcx, rdx, rsi, rdi, r8, r9 (integer
/// arguments), r10 (static chain / DRAP), r11 (the fast path before it already used r11 as scratch,
/// as glibc's `_mcount` does: it is saved here only for the Rust call), and xmm0–xmm7 in full 128
/// bits (vector and floating-point arguments). Not saved: the upper halves of ymm0–ymm7/zmm0–zmm7,
/// xmm8–15, x87 and MXCSR: the Rust code on this path is compiled for baseline x86_64 (SSE2 only,
/// never VEX/EVEX encoded, so it cannot change an upper half) and calls no libc function that could
/// (no string functions; only `mmap` on a table's first use or growth), so `__m256`/`__m512`
/// arguments arrive intact; the register-preservation test passes `__m256` arguments to prove it.
macro_rules! mcount_stub {
    ($load:literal, $record:path) => {
        core::arch::naked_asm!(
            "push rbp",
            "mov rbp, rsp",
            "and rsp, -16",
            "sub rsp, 208",
            "movaps [rsp], xmm0",
            "movaps [rsp + 16], xmm1",
            "movaps [rsp + 32], xmm2",
            "movaps [rsp + 48], xmm3",
            "movaps [rsp + 64], xmm4",
            "movaps [rsp + 80], xmm5",
            "movaps [rsp + 96], xmm6",
            "movaps [rsp + 112], xmm7",
            "mov [rsp + 128], rax",
            "mov [rsp + 136], rcx",
            "mov [rsp + 144], rdx",
            "mov [rsp + 152], rsi",
            "mov [rsp + 160], rdi",
            "mov [rsp + 168], r8",
            "mov [rsp + 176], r9",
            "mov [rsp + 184], r10",
            "mov [rsp + 192], r11",
            $load,
            "call {record}",
            "movaps xmm0, [rsp]",
            "movaps xmm1, [rsp + 16]",
            "movaps xmm2, [rsp + 32]",
            "movaps xmm3, [rsp + 48]",
            "movaps xmm4, [rsp + 64]",
            "movaps xmm5, [rsp + 80]",
            "movaps xmm6, [rsp + 96]",
            "movaps xmm7, [rsp + 112]",
            "mov rax, [rsp + 128]",
            "mov rcx, [rsp + 136]",
            "mov rdx, [rsp + 144]",
            "mov rsi, [rsp + 152]",
            "mov rdi, [rsp + 160]",
            "mov r8, [rsp + 168]",
            "mov r9, [rsp + 176]",
            "mov r10, [rsp + 184]",
            "mov r11, [rsp + 192]",
            "mov rsp, rbp",
            "pop rbp",
            "ret",
            record = sym $record,
        )
    };
}

/// One way of the fast path's lookup, as one assembly template: the entry at `[rax + $way]` (0 or 32) must
/// hold the pair, else jump to `$miss`; on a match, add 1 to its count and jump to the common exit `6`.
macro_rules! mcount_probe_way {
    ($frompc:literal, $selfpc:literal, $way:literal, $miss:literal) => {
        concat!(
            "mov rdx, ",
            $frompc,
            "\n",
            "cmp qword ptr [rax + ",
            $way,
            "], rdx\n",
            "jne ",
            $miss,
            "\n",
            "mov rdx, ",
            $selfpc,
            "\n",
            "cmp qword ptr [rax + ",
            $way,
            " + 8], rdx\n",
            "jne ",
            $miss,
            "\n",
            "add qword ptr [rax + ",
            $way,
            " + 24], 1\n",
            "jmp 6b",
        )
    };
}

/// The fast path shared by the exported stubs: with rax and rdx saved (pushed) and r11 used as scratch
/// (as glibc's `_mcount` does: no compiler keeps a value in r11 across the profiling call), look the
/// (frompc, selfpc) pair up in this thread's call cache and add 1 to the count kept in the entry. It
/// writes nothing but that count and the header's window count around it. Anything else (cache miss,
/// stale generation, paused, a call made while the Rust side of this thread changes the entries)
/// restores the registers and jumps to the full stub, which saves everything and calls Rust.
/// runtime/CALLCOUNTS.md explains it instruction by instruction.
///
/// `$frompc` and `$selfpc` are memory operands (rsp-relative ones as seen after the two pushes).
///
/// Cache layout (`mcount::ThreadCache`): generation at 0 (0 while the Rust side changes the entries, or
/// before they exist), window count (u32) at 8, pointer to the entries at 16, entry mask (u32) at 24; sets
/// of two 32-byte entries (frompc, selfpc, counter, count) in one 64-byte line. A pair's own entry is
/// `frompc >> 2`, masked: one entry per 4 bytes of calling code, so two direct call sites never share one
/// (a direct call is 5 bytes) and the call sites of a program, executed in address order, walk the cache in
/// address order too (the stub prefetches eight lines ahead). A pair not in its own entry may be in the
/// other way of its set (a call site's second callee, when no neighbouring site has that entry as its
/// own), then in the set two or four sets away by bit 4 of selfpc (address XOR 128 or 256), where
/// `record_cached` keeps a call site's further callees (an indirect call, a chain of tail calls returning
/// to one site); a hit in the own entry, every direct call's, is one compare of each address and never
/// looks further.
macro_rules! mcount_fast_path {
    ($frompc:literal, $selfpc:literal, $slow:path) => {
        core::arch::naked_asm!(
            mcount_hit_path!(
                $frompc,
                $selfpc,
                "mov r11, qword ptr [rip + mslprof_thread_cache@GOTTPOFF]",
                "mov rax, qword ptr [rip + {table}]\nxor rax, qword ptr [rip + {state}]",
                "jmp {slow}"
            ),
            state = sym super::CACHE_STATE,
            table = sym crate::modules::CURRENT,
            slow = sym $slow,
        )
    };
}

/// The fast path's instructions as one assembly template, for the exported stubs and for the relocatable
/// copy of `mcount` (`near.rs`). `$tls` loads this thread's cache header offset into r11, `$generation`
/// leaves the current generation (module table XOR counting state) in rax using rax and rdx only, and
/// `$slow` leaves for the full stub with every register but r11 as the instrumented function left it.
macro_rules! mcount_hit_path {
    ($frompc:literal, $selfpc:literal, $tls:literal, $generation:literal, $slow:literal) => {
        concat!(
            "push rax\n",
            "push rdx\n",
            $tls,
            "\n",
            "add dword ptr fs:[r11 + 8], 1\n",
            $generation,
            "\n",
            "cmp qword ptr fs:[r11], rax\n",
            "jne 2f\n",
            "mov rdx, ",
            $frompc,
            "\n",
            "mov rax, rdx\n",
            "shr rax, 2\n",
            "and eax, dword ptr fs:[r11 + 24]\n",
            "shl rax, 5\n",
            "add rax, qword ptr fs:[r11 + 16]\n",
            "prefetcht0 [rax + 512]\n",
            "cmp qword ptr [rax], rdx\n",
            "jne 5f\n",
            "mov rdx, ",
            $selfpc,
            "\n",
            "cmp qword ptr [rax + 8], rdx\n",
            "jne 5f\n",
            "add qword ptr [rax + 24], 1\n",
            "6:\n",
            "sub dword ptr fs:[r11 + 8], 1\n",
            "pop rdx\n",
            "pop rax\n",
            "ret\n",
            // The other way of the set.
            "5:\n",
            "xor rax, 32\n",
            mcount_probe_way!($frompc, $selfpc, 0, "3f"),
            "\n",
            // The alternate set, two sets away or four by bit 4 of selfpc (where `record_cached` keeps a call
            // site's further callees): its two ways.
            "3:\n",
            "and rax, -64\n",
            "xor rax, 128\n",
            "bt ",
            $selfpc,
            ", 4\n",
            "sbb edx, edx\n",
            "and edx, 384\n",
            "xor rax, rdx\n",
            mcount_probe_way!($frompc, $selfpc, 0, "4f"),
            "\n",
            "4:\n",
            mcount_probe_way!($frompc, $selfpc, 32, "2f"),
            "\n",
            // Miss: leave the cache to the Rust side.
            "2:\n",
            "sub dword ptr fs:[r11 + 8], 1\n",
            "pop rdx\n",
            "pop rax\n",
            $slow,
        )
    };
}

/// `-pg` (gcc, clang) calls this after the instrumented function's prologue: that function's frame
/// pointer is in rbp, so `selfpc` is our return address and `frompc` the instrumented function's
/// own return address, the word above its saved frame pointer (as glibc's `_mcount` takes them).
///
/// # Safety
/// Only compiler-generated profiling calls may call this, with rbp the instrumented function's
/// frame pointer.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mcount() {
    // After the two pushes: [rsp + 16] = selfpc; [rbp + 8] = frompc.
    mcount_fast_path!("qword ptr [rbp + 8]", "qword ptr [rsp + 16]", mcount_slow)
}

/// The other name of [`mcount`] (glibc exports both; some compilers call `_mcount`).
///
/// # Safety
/// As [`mcount`].
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _mcount() {
    mcount_fast_path!("qword ptr [rbp + 8]", "qword ptr [rsp + 16]", mcount_slow)
}

/// `-pg -mfentry` calls this as the first instruction of the instrumented function, before its
/// prologue: `selfpc` is our return address and `frompc` the word above it (the instrumented
/// function's return address).
///
/// # Safety
/// Only compiler-generated profiling calls may call this.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fentry__() {
    // After the two pushes: [rsp + 16] = selfpc, [rsp + 24] = frompc.
    mcount_fast_path!("qword ptr [rsp + 24]", "qword ptr [rsp + 16]", fentry_slow)
}

/// Placeholders in [`near_mcount_template`], each an `movabs` immediate that every copy replaces
/// (`near.rs`): the TLS offset of this thread's cache header, the addresses of `modules::CURRENT` and
/// `CACHE_STATE`, and the address of [`mcount_slow`].
pub const NEAR_PLACEHOLDERS: [u64; 4] = [
    0x6d73_6c70_726f_6601,
    0x6d73_6c70_726f_6602,
    0x6d73_6c70_726f_6603,
    0x6d73_6c70_726f_6604,
];

/// The hit path as position-independent code, for a copy next to the code that calls it (`near.rs`,
/// `sites.rs`): `$selfpc` is where it finds selfpc, `$end` the label after it. The four addresses the hit
/// path takes from this library's GOT or by rip-relative loads are `movabs` immediates
/// ([`NEAR_PLACEHOLDERS`]) that each copy replaces; the fourth is the slow path.
macro_rules! near_template {
    ($selfpc:literal, $end:literal) => {
        core::arch::naked_asm!(
            mcount_hit_path!(
                "qword ptr [rbp + 8]",
                $selfpc,
                "movabs r11, 0x6d736c70726f6601",
                "movabs rax, 0x6d736c70726f6602\nmov rax, qword ptr [rax]\nmovabs rdx, 0x6d736c70726f6603\nxor rax, qword ptr [rdx]",
                "movabs r11, 0x6d736c70726f6604\njmp r11"
            ),
            concat!(".globl ", $end),
            concat!(".hidden ", $end),
            concat!($end, ":"),
        )
    };
}

/// [`mcount`] as position-independent code, for a copy next to a module that is far from this library
/// (`near.rs`), whose slow path is [`mcount_slow`]. Never called here.
///
/// # Safety
/// Never to be called: its placeholders are not addresses.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn near_mcount_template() {
    near_template!("qword ptr [rsp + 16]", "mslprof_near_mcount_end")
}

/// The hit path for a rewritten site's stub whose table entry holds another caller, as position-independent
/// code for a copy in each module's stub mapping (`sites.rs`), which the stubs reach by a direct `call` with
/// selfpc pushed; its slow path is [`site_mcount_slow`]. Never called here.
///
/// # Safety
/// Never to be called: its placeholders are not addresses.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn near_site_mcount_template() {
    near_template!("qword ptr [rsp + 24]", "mslprof_near_site_mcount_end")
}

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    /// The first byte after [`near_mcount_template`].
    static mslprof_near_mcount_end: u8;
    /// The first byte after [`near_site_mcount_template`].
    static mslprof_near_site_mcount_end: u8;
}

/// The machine code of [`near_mcount_template`], and the values of its [`NEAR_PLACEHOLDERS`] in this
/// process, in the same order.
#[cfg(target_arch = "x86_64")]
pub fn near_mcount_code() -> (&'static [u8], [u64; 4]) {
    template_code(
        near_mcount_template as *const () as usize,
        core::ptr::addr_of!(mslprof_near_mcount_end) as usize,
        mcount_slow as *const () as usize,
    )
}

/// The machine code of [`near_site_mcount_template`], and the values of its [`NEAR_PLACEHOLDERS`] in this
/// process, in the same order.
#[cfg(target_arch = "x86_64")]
pub fn near_site_mcount_code() -> (&'static [u8], [u64; 4]) {
    template_code(
        near_site_mcount_template as *const () as usize,
        core::ptr::addr_of!(mslprof_near_site_mcount_end) as usize,
        site_mcount_slow as *const () as usize,
    )
}

/// The code of a template at `[start, end)` and its placeholders' values, with `slow` its slow path.
#[cfg(target_arch = "x86_64")]
fn template_code(start: usize, end: usize, slow: usize) -> (&'static [u8], [u64; 4]) {
    let values = [
        thread_cache_tls_offset() as u64,
        core::ptr::addr_of!(crate::modules::CURRENT) as u64,
        core::ptr::addr_of!(super::CACHE_STATE) as u64,
        slow as u64,
    ];
    // SAFETY: [start, end) is a template's code in this library's mapped, never unmapped text.
    let code =
        unsafe { core::slice::from_raw_parts(start as *const u8, end.saturating_sub(start)) };
    (code, values)
}

/// The addresses of [`mcount`] and [`_mcount`]: what a `-pg` module's GOT holds for its profiling calls.
#[cfg(target_arch = "x86_64")]
pub fn mcount_entry_points() -> [usize; 2] {
    [mcount as *const () as usize, _mcount as *const () as usize]
}

/// Slow path of [`mcount`]: entered by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn mcount_slow() {
    // After our `push rbp`: [rbp] = instrumented function's rbp, [rbp + 8] = selfpc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        super::record_call
    )
}

/// The slow path of the rewritten sites' stubs (`sites.rs`), reached from a stub's `call` through its module's
/// trampoline: the stack is as `mcount` sees it, but with the return address into the stub, through which
/// [`super::record_site_call`] finds the function's table and selfpc.
///
/// # Safety
/// Only a stub's `call miss` may reach this, with rbp the instrumented function's frame pointer.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn site_miss() {
    // After our `push rbp`: [rbp] = instrumented function's rbp, [rbp + 8] = the stub's return address.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        super::record_site_call
    )
}

/// The slow path of the rewritten PLT call sites' stubs (`plt_sites.rs`), reached from a stub's `call`
/// through its page's trampoline: above the return address into the stub is the PLT call's own return
/// address (frompc), and [`super::record_site_call`] finds the site's table and callee through the former.
///
/// # Safety
/// Only a PLT site stub's `call` may reach this.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn plt_site_miss() {
    // After our `push rbp`: [rbp + 8] = the stub's return address, [rbp + 16] = frompc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp + 16]",
        super::record_site_call
    )
}

/// Slow path of the stubs' copy of [`near_site_mcount_template`], their way to the thread cache when their
/// table entry holds another caller: a stub runs `lea r11, [rip + back]; push r11; call copy; lea rsp,
/// [rsp + 8]; jmp back`, so the copy finds selfpc (the site's return address) one word above its return
/// address and returns into the stub, so that every `ret` matches its `call` (return prediction). Entered
/// by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn site_mcount_slow() {
    // After our `push rbp`: [rbp] = instrumented function's rbp, [rbp + 16] = selfpc.
    mcount_stub!(
        "mov rsi, [rbp + 16]\nmov rdi, [rbp]\nmov rdi, [rdi + 8]",
        super::record_call
    )
}

/// The `fs`-relative offset of this thread's `ThreadCache::site_region` (the same in every thread: static
/// TLS), for the stubs' `mov rax, fs:[offset]`.
#[cfg(target_arch = "x86_64")]
pub fn site_region_tls_offset() -> Option<i32> {
    let field = core::mem::offset_of!(ThreadCache, site_region) as i64;
    i32::try_from(thread_cache_tls_offset() + field).ok()
}

/// The `fs`-relative offset of this thread's cache header (the same in every thread: static TLS).
#[cfg(target_arch = "x86_64")]
fn thread_cache_tls_offset() -> i64 {
    let tls_offset: i64;
    // SAFETY: reads the linker-provided TLS offset of our own `.tbss` symbol from the GOT.
    unsafe {
        core::arch::asm!(
            "mov {offset}, qword ptr [rip + mslprof_thread_cache@GOTTPOFF]",
            offset = out(reg) tls_offset,
            options(nostack, readonly, pure),
        );
    }
    tls_offset
}

/// Slow path of [`__fentry__`]: entered by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn fentry_slow() {
    // After our `push rbp`: [rbp + 8] = selfpc, [rbp + 16] = frompc.
    mcount_stub!(
        "mov rsi, [rbp + 8]\nmov rdi, [rbp + 16]",
        super::record_call
    )
}

/// Bytes of the per-thread call cache header (see `mcount::ThreadCache`), in `.tbss`.
pub const THREAD_CACHE_BYTES: usize = 128;

// The per-thread call cache lives in this library's static TLS block, addressed with the
// initial-exec model (`@gottpoff` + `fs`): two instructions, no `__tls_get_addr` call, no
// allocation, valid in signal handlers. Static TLS is fine because the runtime is loaded at start-up
// (LD_PRELOAD or DT_NEEDED); every new thread gets it zeroed.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".balign 64",
    ".globl mslprof_thread_cache",
    ".hidden mslprof_thread_cache",
    ".type mslprof_thread_cache,@object",
    ".size mslprof_thread_cache, 128",
    "mslprof_thread_cache:",
    ".zero 128",
    ".popsection",
);

/// Address of the calling thread's call-cache header ([`THREAD_CACHE_BYTES`] zero-initialised,
/// 64-byte aligned bytes that belong to this thread for its lifetime).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_cache_block() -> *mut u8 {
    let address: usize;
    // SAFETY: reads the thread pointer (fs:0, the TCB's self pointer on x86_64 glibc) and the
    // linker-provided TLS offset of our own `.tbss` symbol; touches no other memory.
    unsafe {
        core::arch::asm!(
            "mov {address}, qword ptr fs:[0]",
            "add {address}, qword ptr [rip + mslprof_thread_cache@GOTTPOFF]",
            address = out(reg) address,
            options(nostack, readonly, pure),
        );
    }
    address as *mut u8
}

/// Calls `start` (the runtime's start-up, from the first `mcount` of a process whose other
/// libraries' constructors run before the runtime's own) with the whole extended register state
/// saved around it by `xsave`/`xrstor`: start-up runs libc code (string functions using AVX/AVX-512)
/// that would otherwise clobber the upper halves of vector arguments the instrumented function is
/// about to read. The general-purpose and xmm0–7 registers are already saved by the mcount stub.
///
/// # Safety
/// `start` must be safe to call here; the CPU must be x86_64 (XSAVE is used only when the OS
/// enabled it, CPUID.1:ECX.OSXSAVE).
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
pub unsafe extern "C" fn call_preserving_vector_state(start: extern "C" fn() -> bool) -> bool {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "push rbx",
        "push r12",
        "mov r12, rdi",
        "mov eax, 1",
        "cpuid",
        "bt ecx, 27",
        "jnc 2f",
        "mov eax, 0xd",
        "xor ecx, ecx",
        "cpuid",
        // ebx = XSAVE area bytes for the features enabled in XCR0; 64-byte aligned, header zeroed.
        "sub rsp, rbx",
        "sub rsp, 64",
        "and rsp, -64",
        "xor eax, eax",
        "mov [rsp + 512], rax",
        "mov [rsp + 520], rax",
        "mov [rsp + 528], rax",
        "mov [rsp + 536], rax",
        "mov [rsp + 544], rax",
        "mov [rsp + 552], rax",
        "mov [rsp + 560], rax",
        "mov [rsp + 568], rax",
        "xor ecx, ecx",
        "xgetbv",
        "xsave [rsp]",
        "call r12",
        "mov r12d, eax",
        "xor ecx, ecx",
        "xgetbv",
        "xrstor [rsp]",
        "movzx eax, r12b",
        "jmp 3f",
        "2:",
        "call r12",
        "3:",
        "lea rsp, [rbp - 16]",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
    )
}

// The assembly fast path above depends on this layout.
const _: () = {
    assert!(core::mem::size_of::<ThreadCache>() <= THREAD_CACHE_BYTES);
    assert!(core::mem::offset_of!(ThreadCache, generation) == 0);
    assert!(core::mem::offset_of!(ThreadCache, window) == 8);
    assert!(core::mem::offset_of!(ThreadCache, entries) == 16);
    assert!(core::mem::offset_of!(ThreadCache, entry_mask) == 24);
    assert!(core::mem::size_of::<core::sync::atomic::AtomicUsize>() == 8);
    assert!(core::mem::size_of::<CacheEntry>() == 32);
    assert!(core::mem::offset_of!(CacheEntry, frompc) == 0);
    assert!(core::mem::offset_of!(CacheEntry, selfpc) == 8);
    assert!(core::mem::offset_of!(CacheEntry, count) == 24);
};

/// Entry of the PLT-counting stubs of libmslprof_audit.so (runtime/audit/). A stub runs `push callee;
/// call mslprof_plt_entry; lea rsp, [rsp + 8]; jmp callee`: on entry [rsp] is the stub's return address,
/// [rsp + 8] selfpc (the callee) and [rsp + 16] frompc (the caller's return address). Counts the arc as
/// `__fentry__` does and returns into the stub, so every `ret` matches its `call` (return prediction).
///
/// # Safety
/// Only the audit module's stubs may call this.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mslprof_plt_entry() {
    // After the two pushes: [rsp + 24] = selfpc, [rsp + 32] = frompc.
    mcount_fast_path!("qword ptr [rsp + 32]", "qword ptr [rsp + 24]", plt_slow)
}

/// Slow path of [`mslprof_plt_entry`]: entered by a jump with the original registers and stack.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn plt_slow() {
    // After our `push rbp`: [rbp + 16] = selfpc, [rbp + 24] = frompc.
    mcount_stub!(
        "mov rsi, [rbp + 16]\nmov rdi, [rbp + 24]",
        super::record_call
    )
}
