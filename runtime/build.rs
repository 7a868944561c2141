//! Link options for the shipped `libmslprof.so`.

fn main() {
    // `-z defs`: every symbol the library refers to must be defined in it or in a library it links against.
    // A reference left undefined (once, a label that `global_asm!` kept local to one codegen unit) would
    // otherwise only show when a program preloads the library and dies with "undefined symbol".
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
}
