//! Every symbol loader-hooks exports from libmslprof.so, in one place: the C functions it interposes. Each is a
//! thin entry into its module: the exec family and the loader functions are assembly stubs (stubs.rs) around
//! process.rs and dynamic_loading.rs, `_exit`/`_Exit` call process.rs. (`Lmid_t` is a C `long`.)

use std::ffi::{c_char, c_int, c_long, c_void};

use crate::dynamic_loading::Entry;
use crate::process;
use crate::stubs::{exec_stub, loader_stub};

type CStrPtr = *const c_char;
type CStrArray = *const *const c_char;

// The exec family: the image's profile is written (PRE_EXEC), then libc's function runs with every argument
// untouched. The number is the function's slot in process.rs's table of real functions. The variadic ones are
// declared with their fixed arguments only; the stub forwards everything untouched.
exec_stub! { #[unsafe(no_mangle)] execve, 0, fn(path: CStrPtr, argv: CStrArray, envp: CStrArray) }
exec_stub! { #[unsafe(no_mangle)] execv, 1, fn(path: CStrPtr, argv: CStrArray) }
exec_stub! { #[unsafe(no_mangle)] execvp, 2, fn(file: CStrPtr, argv: CStrArray) }
exec_stub! { #[unsafe(no_mangle)] execvpe, 3, fn(file: CStrPtr, argv: CStrArray, envp: CStrArray) }
exec_stub! { #[unsafe(no_mangle)] execl, 4, fn(path: CStrPtr, arg0: CStrPtr) }
exec_stub! { #[unsafe(no_mangle)] execlp, 5, fn(file: CStrPtr, arg0: CStrPtr) }
exec_stub! { #[unsafe(no_mangle)] execle, 6, fn(path: CStrPtr, arg0: CStrPtr) }
exec_stub! { #[unsafe(no_mangle)] fexecve, 7, fn(fd: c_int, argv: CStrArray, envp: CStrArray) }
exec_stub! {
    #[unsafe(no_mangle)]
    execveat, 8, fn(dirfd: c_int, path: CStrPtr, argv: CStrArray, envp: CStrArray, flags: c_int)
}

// The loader functions: libc's runs with the caller's return address, then the modules it loaded or unloaded
// are reported.
loader_stub! {
    /// `dlopen`, interposed: loads exactly what libc's would (same calling object), then reports the new modules.
    #[unsafe(no_mangle)]
    dlopen, Entry::Open, fn(file: CStrPtr, mode: c_int) -> *mut c_void
}
loader_stub! {
    /// `dlmopen`, interposed like [`dlopen`].
    #[unsafe(no_mangle)]
    dlmopen, Entry::OpenInNamespace, fn(namespace: c_long, file: CStrPtr, mode: c_int) -> *mut c_void
}
loader_stub! {
    /// `dlclose`, interposed: reports the modules it really unloaded (none if it only dropped a reference).
    #[unsafe(no_mangle)]
    dlclose, Entry::Close, fn(handle: *mut c_void) -> c_int
}

/// `_exit`, interposed: the profile is written (INCOMPLETE, cause `_exit`), then the process ends with `status`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "mslprof_fork_text")]
pub extern "C" fn _exit(status: c_int) -> ! {
    process::exit_after_dump(status)
}

/// `_Exit`, interposed like [`_exit`].
#[unsafe(no_mangle)]
pub extern "C" fn _Exit(status: c_int) -> ! {
    process::exit_after_dump(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dynamic_loading, sys};

    #[test]
    fn dlopen_and_dlclose_through_the_stubs_return_what_libc_returns() {
        // The test program itself defines the stubs, so these calls go through them.
        let name = c"libm.so.6";
        // SAFETY: a valid NUL-terminated name and mode.
        let handle = unsafe { dlopen(name.as_ptr(), sys::RTLD_NOW) };
        assert!(!handle.is_null());
        // SAFETY: `handle` came from dlopen.
        let cos = unsafe { sys::symbol_address(handle, c"cos") };
        assert_ne!(cos, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { dlclose(handle) }, 0);
        // SAFETY: a name that does not exist: NULL, with dlerror set.
        let missing = unsafe { dlopen(c"libdoes-not-exist.so".as_ptr(), sys::RTLD_NOW) };
        assert!(missing.is_null());
        assert!(
            sys::loader_error_pending(),
            "dlerror still reports the failure"
        );
        assert!(
            !dynamic_loading::LOADER_LOCK.is_held(),
            "the stubs release the lock"
        );
    }
}
