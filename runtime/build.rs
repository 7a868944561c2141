//! Link options for the shipped `libmslprof.so`.

fn main() {
    // `-z defs`: every symbol the library refers to must be defined in it or in a library it links against.
    // A reference left undefined (once, a label that `global_asm!` kept local to one codegen unit) would
    // otherwise only show when a program preloads the library and dies with "undefined symbol".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    // `-z now`: the library's own references to libc are bound when it loads, not at their first call. Bound
    // lazily, those first made in a forked child (its atfork handler's) were looked up again in every
    // child, whose copy of the GOT the lookup then wrote: ld.so's symbol lookup was a tenth of a child's
    // time in a fork loop. (Nor does a signal handler then ever enter the dynamic linker.)
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,now");
}
