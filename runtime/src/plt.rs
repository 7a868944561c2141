//! What the runtime offers the `LD_AUDIT` module libmslprof_audit.so (runtime/audit/), which counts calls
//! through the PLT: a marker naming this library as the runtime, whose `__fentry__` the module's stubs
//! jump to (glibc's libc.so.6 exports a `__fentry__` of its own, so the name alone does not tell).

/// Exported marker: the version of the stub convention (a stub pushes the callee's address and jumps to
/// `__fentry__`, which counts the arc and returns into the callee).
#[unsafe(no_mangle)]
pub static mslprof_plt_abi: u32 = 1;
