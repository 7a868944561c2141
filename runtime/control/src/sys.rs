//! The crate's raw calls: finding the runtime's C functions with `dlsym` and calling them.

use std::ffi::{CStr, c_char, c_int};
use std::io;
use std::sync::OnceLock;

type DumpFn = unsafe extern "C" fn(*const c_char) -> c_int;
type MoncontrolFn = unsafe extern "C" fn(c_int);

/// The runtime's entry points.
#[derive(Clone, Copy)]
pub struct Runtime {
    dump: DumpFn,
    moncontrol: MoncontrolFn,
}

fn symbol(name: &CStr) -> Option<usize> {
    // SAFETY: RTLD_DEFAULT searches the global scope; the name is NUL-terminated.
    let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!address.is_null()).then_some(address as usize)
}

/// The runtime, looked up once.
pub fn runtime() -> Option<Runtime> {
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    *RUNTIME.get_or_init(|| {
        let dump = symbol(c"mslprof_dump")?;
        // `moncontrol` is libc's too: the runtime's is the one found first when mslprof_dump is there
        // (it is preloaded or linked before libc).
        let moncontrol = symbol(c"moncontrol")?;
        // SAFETY: these are the runtime's exported functions, with these C signatures
        // (runtime/include/mslprof.h).
        unsafe {
            Some(Runtime {
                dump: std::mem::transmute::<usize, DumpFn>(dump),
                moncontrol: std::mem::transmute::<usize, MoncontrolFn>(moncontrol),
            })
        }
    })
}

impl Runtime {
    pub fn dump(self, path: Option<&CStr>) -> io::Result<()> {
        let pointer = path.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: the pointer is null or a NUL-terminated string alive for the call.
        if unsafe { (self.dump)(pointer) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn moncontrol(self, on: bool) {
        // SAFETY: moncontrol takes any int.
        unsafe { (self.moncontrol)(c_int::from(on)) }
    }
}
