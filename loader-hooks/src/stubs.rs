//! The x86_64 assembly of loader-hooks: the exec-family stubs and the loader stubs (`dlopen`, `dlmopen`,
//! `dlclose`) that keep the caller's return address, plus the lone `ret` they fall back to.
//!
//! The macros generate one naked function each; exports.rs invokes them with the exported names and
//! signatures, so the ABI surface is listed there and an aarch64 port is one new file with the same macros.
//! The Rust side is in process.rs ([`crate::process::before_exec`]) and dynamic_loading.rs
//! ([`crate::dynamic_loading::before_loader_call`], [`crate::dynamic_loading::after_loader_call`]), where the
//! mechanism is described.

use crate::dynamic_loading;

/// Generates a stub for one exec function. All argument registers and `al` (the vector-register count of a
/// variadic call) are preserved and the stack is left exactly as the caller built it (variadic `execl` passes
/// arguments beyond the sixth on the stack), then it jumps to the real function, which never returns here.
/// `before_exec(index)` writes the image's profile and returns the real function (0: fail with -1).
macro_rules! exec_stub {
    ($(#[$attr:meta])* $name:ident, $index:expr, fn($($arg:ident: $ty:ty),*)) => {
        /// Interposed exec function: the profile of the current image is written first (flag PRE_EXEC).
        ///
        /// # Safety
        /// The same contract as the libc function of the same name.
        $(#[$attr])*
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> core::ffi::c_int {
            core::arch::naked_asm!(
                "endbr64",
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "push r8",
                "push r9",
                "push rax",
                "mov edi, {index}",
                "call {before}",
                "mov r11, rax",
                "pop rax",
                "pop r9",
                "pop r8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "test r11, r11",
                "jz 3f",
                "jmp r11",
                "3:",
                "mov eax, -1",
                "ret",
                index = const $index as u32,
                before = sym $crate::process::before_exec,
            )
        }
    };
}
pub(crate) use exec_stub;

/// A lone `ret` in our own text: the fallback return address the loader stubs hand to the real function.
///
/// A naked Rust function rather than a label in `global_asm!`: a label there is local to the codegen unit
/// that holds the assembly, so a release build (several codegen units) left the reference undefined and
/// every program that preloaded the runtime died with "undefined symbol: mslprof_loader_ret".
#[unsafe(naked)]
extern "C" fn loader_ret() {
    core::arch::naked_asm!("ret")
}

/// Where a loader stub must jump and which return address the real function must see (returned in rax:rdx).
#[repr(C)]
pub(crate) struct Dispatch {
    /// Address of a `ret` instruction in the caller's module (or [`loader_ret`] if none can be found).
    caller_ret: usize,
    /// The real function.
    real: usize,
}

/// Called by the loader stubs before the real function: [`dynamic_loading::before_loader_call`], with our own
/// `ret` as the fallback (the call then behaves like an ordinary interposer's: libmslprof.so is the caller).
pub(crate) extern "C" fn dispatch_loader_call(return_address: usize, entry: u32) -> Dispatch {
    let (caller_ret, real) = dynamic_loading::before_loader_call(return_address, entry);
    Dispatch {
        caller_ret: caller_ret.unwrap_or(loader_ret as *const () as usize),
        real,
    }
}

/// Generates one interposing loader stub. On entry the stack holds the caller's return address R
/// (rsp ≡ 8 mod 16). The argument registers are saved, `dispatch_loader_call(R, entry)` returns the `ret`
/// address G and the real function F, the arguments are restored, and the stack becomes `[G][continuation][R]`
/// before jumping to F, so F sees G (in the caller's module) as its return address and runs with the ABI's
/// alignment. F returns to G, whose `ret` pops the continuation, which calls `after_loader_call(entry)` and
/// returns F's result to R.
macro_rules! loader_stub {
    ($(#[$attr:meta])* $name:ident, $entry:expr, fn($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        $(#[$attr])*
        ///
        /// # Safety
        /// The same contract as the libc function of the same name.
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                "endbr64",
                "push rdi",
                "push rsi",
                "push rdx",
                "push rcx",
                "sub rsp, 8",
                "mov rdi, [rsp + 40]",
                "mov esi, {entry}",
                "call {before}",
                "mov r10, rax",
                "mov r11, rdx",
                "add rsp, 8",
                "pop rcx",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "lea rax, [rip + 2f]",
                "push rax",
                "push r10",
                "jmp r11",
                "2:",
                "push rax",
                "mov edi, {entry}",
                "call {after}",
                "pop rax",
                "ret",
                entry = const $entry as u32,
                before = sym $crate::stubs::dispatch_loader_call,
                after = sym $crate::dynamic_loading::after_loader_call,
            )
        }
    };
}
pub(crate) use loader_stub;
