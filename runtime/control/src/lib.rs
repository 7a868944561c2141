//! Rust access to the dumps on demand of libmslprof.so: [`dump`] writes the profile so far, [`set_profiling`]
//! pauses and resumes it. The runtime's functions are looked up when first used (`dlsym`), so a program built
//! with this crate runs unchanged without the runtime: the calls then report [`std::io::ErrorKind::Unsupported`]
//! or do nothing.
//!
//! ```no_run
//! // Run under LD_PRELOAD=.../libmslprof.so (or link with -lmslprof).
//! mslprof_control::dump(Some(std::path::Path::new("before-reload.out"))).ok();
//! mslprof_control::dump(None).ok(); // gmon.out.1, gmon.out.2, ...
//! ```

mod sys;

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether libmslprof.so is in this process.
pub fn runtime_present() -> bool {
    sys::runtime().is_some()
}

/// Writes the profile collected so far to `path`, or (`None`) to the usual profile path with `.N` appended
/// (N = 1, 2, ...), as C's `mslprof_dump` does. Counting goes on.
///
/// Errors: `Unsupported` without the runtime (or when profiling is not active), `InvalidInput` for a path
/// with a NUL byte, else the error of creating or writing the file.
pub fn dump(path: Option<&Path>) -> io::Result<()> {
    let runtime = sys::runtime()
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "libmslprof.so is not loaded"))?;
    let path = path
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .transpose()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    runtime.dump(path.as_deref())
}

/// Pauses (`false`) or resumes (`true`) profiling, as C's `moncontrol`. Does nothing without the runtime;
/// returns whether the runtime was there.
pub fn set_profiling(on: bool) -> bool {
    match sys::runtime() {
        Some(runtime) => {
            runtime.moncontrol(on);
            true
        }
        None => false,
    }
}
