//! `LD_PROFILE` without glibc's own profiler: when the program starts with `LD_PROFILE` set, the runtime's
//! constructor executes the same program once more, at once, with the variable renamed to
//! `MSLPROF_LD_PROFILE`, which ld.so does not read; the new image's constructor renames it back before
//! anything else reads the environment.
//!
//! ld.so reads `LD_PROFILE` before any library runs. Whenever it is set, ld.so sends every lazily bound PLT
//! call of the process through `_dl_runtime_profile` for the whole run, and when it names exactly one
//! library, ld.so also profiles that library itself (`/var/tmp/NAME.profile`, its own `SIGPROF` timer).
//! Nothing a library does after start-up undoes that, so the runtime starts the process again without it.
//! Why this design and its limits: runtime/README.md, "glibc's own LD_PROFILE".
//!
//! The same restart loads the PLT-counting audit module (libmslprof_audit.so, next to the runtime) when
//! `LD_AUDIT` does not already name it and `MSLPROF_PLT` is not `0`, with enough static TLS for every library
//! loaded at start-up (`GLIBC_TUNABLES=glibc.rtld.optional_static_tls=…`, unless the user set that tunable):
//! under an audit module glibc would otherwise refuse libraries with much initial-exec TLS. The second image
//! gives both variables back their old values before the program runs, so its children inherit neither.

use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::os::unix::ffi::OsStrExt;

use crate::sys;

/// The variable as ld.so reads it.
const LD_PROFILE: &[u8] = b"LD_PROFILE=";
/// The same entry, renamed for the second image; dropping its first [`PREFIX_LEN`] bytes gives it back.
const MOVED: &[u8] = b"MSLPROF_LD_PROFILE=";
const PREFIX_LEN: usize = MOVED.len() - LD_PROFILE.len();
/// How far a file's birth time may lag the moment it was created (the kernel's coarse clock).
const COARSE_CLOCK_LAG_NS: i128 = 10_000_000;
/// `MSLPROF_REEXEC=0` keeps ld.so's own profiler (no second image).
const OPT_OUT: &[u8] = b"MSLPROF_REEXEC=0";
/// Prefix of the entries in which the restart saves a variable it set for the second image:
/// `MSLPROF_REEXEC_SET_LD_AUDIT=LD_AUDIT=old` (the old entry whole), or `MSLPROF_REEXEC_SET_LD_AUDIT=` when the
/// variable was not set.
const SAVED: &[u8] = b"MSLPROF_REEXEC_SET_";
/// The audit module's file, looked for next to the runtime's.
const AUDIT_FILE: &[u8] = b"libmslprof_audit.so";
/// The tunable that sizes the static TLS surplus under an audit module (glibc BZ #31991).
const STATIC_TLS_TUNABLE: &[u8] = b"glibc.rtld.optional_static_tls";
/// The least surplus asked for: `mslprof run`'s (analyzer/src/cli/commands.rs), enough for rustc.
const MIN_STATIC_TLS: usize = 65536;

/// The entries of a NULL-terminated environment array (empty for a null array).
///
/// # Safety
/// `array` is null or a NULL-terminated array of NUL-terminated strings that stays valid and unchanged while
/// the result is used.
unsafe fn entries<'a>(array: *mut *const c_char) -> Vec<(usize, &'a CStr)> {
    let mut found = Vec::new();
    if array.is_null() {
        return found;
    }
    for index in 0.. {
        // SAFETY: the array is NULL-terminated (caller), and we stop at the NULL.
        let entry = unsafe { *array.add(index) };
        if entry.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string (caller).
        found.push((index, unsafe { CStr::from_ptr(entry) }));
    }
    found
}

/// Gives `LD_PROFILE` back its name in an image started by [`before_start`]: every `MSLPROF_LD_PROFILE=v`
/// entry becomes `LD_PROFILE=v` (the same bytes, from offset [`PREFIX_LEN`]). True if there was one.
///
/// # Safety
/// As [`entries`], and no other thread reads the array meanwhile.
unsafe fn restore(array: *mut *const c_char) -> bool {
    let mut restored = false;
    // SAFETY: forwarded from the caller.
    for (index, entry) in unsafe { entries(array) } {
        if entry.to_bytes().starts_with(MOVED) {
            // SAFETY: `index` is within the array; the new pointer stays inside the same string, whose bytes
            // from there on read `LD_PROFILE=...`.
            unsafe { *array.add(index) = entry.as_ptr().add(PREFIX_LEN) };
            restored = true;
        }
    }
    restored
}

/// Removes entry `index` of a NULL-terminated array, moving the later ones down.
///
/// # Safety
/// As [`restore`]; `index` is an entry of the array (before its NULL).
unsafe fn remove_entry(array: *mut *const c_char, index: usize) {
    let mut at = index;
    loop {
        // SAFETY: `at + 1` is at most the NULL's index (caller); the NULL is moved down too.
        let next = unsafe { *array.add(at + 1) };
        // SAFETY: as above.
        unsafe { *array.add(at) = next };
        if next.is_null() {
            break;
        }
        at += 1;
    }
}

/// In the second image, gives back the variables that the restart set for it (`MSLPROF_REEXEC_SET_…`
/// entries, see [`SAVED`]): their old entries, or none when they were not set; the saving entries go too.
///
/// # Safety
/// As [`restore`].
unsafe fn undo_set_variables(array: *mut *const c_char) {
    loop {
        // SAFETY: forwarded from the caller.
        let current = unsafe { entries(array) };
        let Some(&(saved_index, saved)) = current
            .iter()
            .find(|(_, e)| e.to_bytes().starts_with(SAVED))
        else {
            break;
        };
        let rest = &saved.to_bytes()[SAVED.len()..];
        let name_len = rest.iter().position(|&b| b == b'=').unwrap_or(rest.len());
        let set = current.iter().find(|(_, e)| {
            let bytes = e.to_bytes();
            bytes.len() > name_len
                && bytes[..name_len] == rest[..name_len]
                && bytes[name_len] == b'='
        });
        let mut removals = vec![saved_index];
        if let Some(&(set_index, _)) = set {
            if rest.len() > name_len + 1 {
                // SAFETY: `set_index` is within the array; the new pointer stays inside the saving entry,
                // whose bytes from there on read `NAME=old`, and which lives as long as the process.
                unsafe { *array.add(set_index) = saved.as_ptr().add(SAVED.len() + name_len + 1) };
            } else {
                removals.push(set_index);
            }
        }
        // The later entry first, so that the earlier index stays right.
        removals.sort_unstable_by(|a, b| b.cmp(a));
        for index in removals {
            // SAFETY: both indexes are entries of the array (found above).
            unsafe { remove_entry(array, index) };
        }
    }
}

/// Takes every `NAME=…` entry out of the process's environment arrays (`environ`, and the constructor's `envp`
/// when it differs): for variables that only the runtime reads, once it has read them.
pub fn hide_variable(envp: *mut *const c_char, name: &[u8]) {
    let environ = sys::environment_array();
    let second = if envp == environ {
        std::ptr::null_mut()
    } else {
        envp
    };
    for array in [environ, second] {
        if array.is_null() {
            continue;
        }
        // SAFETY: the process's NULL-terminated environment arrays; the constructor runs before the program's
        // threads. Entries are removed from the last one down, so earlier indexes stay right.
        unsafe {
            for (index, entry) in entries(array).into_iter().rev() {
                let bytes = entry.to_bytes();
                if bytes.len() > name.len() && bytes.starts_with(name) && bytes[name.len()] == b'='
                {
                    remove_entry(array, index);
                }
            }
        }
    }
}

/// The runtime's first step, from its constructor. `envp` is the environment the constructor was given;
/// `may_execute` is false when the runtime has already started. Either returns (nothing to do, the second
/// image, or the re-exec failed) or does not return (the program starts again without `LD_PROFILE`).
pub fn before_start(envp: *mut *const c_char, may_execute: bool) {
    let environ = sys::environment_array();
    // SAFETY: both are the process's NULL-terminated environment arrays; the constructor runs before the
    // program's threads.
    let second_image = unsafe { restore(environ) | (envp != environ && restore(envp)) };
    if second_image {
        // SAFETY: as above.
        unsafe {
            undo_set_variables(environ);
            if envp != environ {
                undo_set_variables(envp);
            }
        }
    }
    if second_image || !may_execute || sys::is_secure_execution() {
        return;
    }
    let array = if environ.is_null() { envp } else { environ };
    // SAFETY: as above.
    let current = unsafe { entries(array) };
    let asks_for_ld_profile = current.iter().any(|(_, e)| {
        let bytes = e.to_bytes();
        // ld.so ignores an empty LD_PROFILE.
        bytes.starts_with(LD_PROFILE) && bytes.len() > LD_PROFILE.len()
    });
    if !asks_for_ld_profile || current.iter().any(|(_, e)| e.to_bytes() == OPT_OUT) {
        return;
    }
    // An execve ends every other thread: a process that already has threads is past its start-up.
    if std::fs::read_dir("/proc/self/task").map_or(true, |tasks| tasks.count() != 1) {
        return;
    }
    if let Err(reason) = execute_again(&current) {
        sys::stderr_line(&[
            b"mslprof: cannot restart the program without glibc's LD_PROFILE profiler (",
            reason.as_bytes(),
            b"); carrying on with it\n",
        ]);
    }
}

/// Executes the running program again with `LD_PROFILE` renamed; returns only on failure.
fn execute_again(current: &[(usize, &CStr)]) -> Result<(), String> {
    // The arguments as the kernel received them: when the program was started through ld.so explicitly
    // (`ld-linux-x86-64.so.2 [options] ./app args`), these include ld.so and its options.
    let mut cmdline =
        std::fs::read("/proc/self/cmdline").map_err(|e| format!("/proc/self/cmdline: {e}"))?;
    if cmdline.pop() != Some(0) {
        return Err("/proc/self/cmdline is empty".into());
    }
    let arguments: Vec<CString> = cmdline
        .split(|&b| b == 0)
        .map(|a| CString::new(a).expect("split at NUL"))
        .collect();
    let renamed: Vec<CString> = current
        .iter()
        .filter(|(_, e)| e.to_bytes().starts_with(LD_PROFILE))
        .map(|(_, e)| {
            let mut moved = MOVED[..PREFIX_LEN].to_vec();
            moved.extend_from_slice(e.to_bytes());
            CString::new(moved).expect("no NUL inside")
        })
        .collect();
    let mut renamed_iter = renamed.iter();
    let mut environment: Vec<*const c_char> = current
        .iter()
        .map(|(_, e)| match e.to_bytes().starts_with(LD_PROFILE) {
            true => renamed_iter.next().expect("one per entry").as_ptr(),
            false => e.as_ptr(),
        })
        .collect();
    let counting = plt_counting_variables(current);
    for entry in &counting {
        let name_len = entry
            .to_bytes()
            .iter()
            .position(|&b| b == b'=')
            .unwrap_or(0)
            + 1;
        let name = &entry.to_bytes()[..name_len];
        // The last entry of a name is the one getenv and ld.so read, hence the new value replaces them all.
        environment.retain(|&e| {
            // SAFETY: every pointer in `environment` is a NUL-terminated entry of `current` or of `renamed`.
            !unsafe { CStr::from_ptr(e) }.to_bytes().starts_with(name)
        });
        environment.push(entry.as_ptr());
    }
    environment.push(std::ptr::null());
    let (path, skip) = program_path(&arguments)?;
    let arguments = &arguments[skip..];
    let mut argv: Vec<*const c_char> = arguments.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // ld.so's own profiler (a single LD_PROFILE name that matched a library) has already started: its
    // ITIMER_PROF timer would survive the execve and kill the new image, whose SIGPROF is back to its default
    // action, and it has created its output file.
    let timer = sys::disarm_profiling_timer();
    if let Some(file) = glibc_profile_file(current) {
        sys::remove_file(file.to_bytes_with_nul());
    }
    let errno = sys::execute(&path, &argv, &environment);
    sys::rearm_profiling_timer(&timer);
    Err(format!("execve {}: errno {errno}", path.to_string_lossy()))
}

/// The entries that make the second image count calls through the PLT: `LD_AUDIT` with the audit module next to
/// the runtime (before the user's modules), `GLIBC_TUNABLES` with enough static TLS for the libraries loaded now
/// (unless the user sized it), and for each a `MSLPROF_REEXEC_SET_` entry holding the old one. None when
/// `MSLPROF_PLT=0`, when `LD_AUDIT` already names the audit module, or when it is not next to the runtime.
fn plt_counting_variables(current: &[(usize, &CStr)]) -> Vec<CString> {
    let value = |prefix: &[u8]| {
        current
            .iter()
            .rev()
            .map(|(_, e)| e.to_bytes())
            .find(|e| e.starts_with(prefix))
    };
    let plt_off = value(b"MSLPROF_PLT=") == Some(b"MSLPROF_PLT=0");
    let old_audit = value(b"LD_AUDIT=");
    if plt_off
        || old_audit.is_some_and(|a| {
            a[b"LD_AUDIT=".len()..]
                .split(|&b| b == b':' || b == b' ')
                .any(|m| m.ends_with(AUDIT_FILE))
        })
    {
        return Vec::new();
    }
    let Some(audit) = audit_library() else {
        return Vec::new();
    };
    let mut added = Vec::new();
    let mut set = |name: &[u8], new_value: Vec<u8>, old: Option<&[u8]>| {
        let mut entry = name.to_vec();
        entry.push(b'=');
        entry.extend_from_slice(&new_value);
        let mut saved = SAVED.to_vec();
        saved.extend_from_slice(name);
        saved.push(b'=');
        saved.extend_from_slice(old.unwrap_or_default());
        added.extend(CString::new(entry).ok());
        added.extend(CString::new(saved).ok());
    };
    let mut audits = audit;
    if let Some(old) = old_audit
        .map(|a| &a[b"LD_AUDIT=".len()..])
        .filter(|a| !a.is_empty())
    {
        audits.push(b':');
        audits.extend_from_slice(old);
    }
    set(b"LD_AUDIT", audits, old_audit);
    let old_tunables = value(b"GLIBC_TUNABLES=");
    let tunables = old_tunables.map_or(&[][..], |t| &t[b"GLIBC_TUNABLES=".len()..]);
    if !tunables
        .windows(STATIC_TLS_TUNABLE.len())
        .any(|w| w == STATIC_TLS_TUNABLE)
    {
        let bytes = sys::loaded_tls_bytes()
            .saturating_add(4096)
            .next_multiple_of(4096)
            .max(MIN_STATIC_TLS);
        let mut new_value = tunables.to_vec();
        if !new_value.is_empty() {
            new_value.push(b':');
        }
        new_value.extend_from_slice(STATIC_TLS_TUNABLE);
        new_value.push(b'=');
        new_value.extend_from_slice(bytes.to_string().as_bytes());
        set(b"GLIBC_TUNABLES", new_value, old_tunables);
    }
    added
}

/// The audit module's path, next to the runtime's own file (as the loader knew it), if it is there.
fn audit_library() -> Option<Vec<u8>> {
    let here = mslprof_format::RuntimeAddress::from_usize(audit_library as *const () as usize);
    let modules = mslprof_loader_hooks::scan_loaded_modules();
    let runtime = modules.iter().find(|m| {
        m.runtime_ranges()
            .any(|(start, end)| start <= here && here < end)
    })?;
    let directory_len = runtime
        .path
        .iter()
        .rposition(|&b| b == b'/')
        .map_or(0, |i| i + 1);
    let mut path = runtime.path[..directory_len].to_vec();
    path.extend_from_slice(AUDIT_FILE);
    std::path::Path::new(std::ffi::OsStr::from_bytes(&path))
        .is_file()
        .then_some(path)
}

/// The output file of ld.so's own profiler (`$LD_PROFILE_OUTPUT/NAME.profile`, by default
/// `/var/tmp/NAME.profile`) when this process's ld.so created it: it is mapped into this process and was born
/// after the process started. A file that existed before (data of earlier runs without the runtime) is left.
fn glibc_profile_file(current: &[(usize, &CStr)]) -> Option<CString> {
    // ld.so takes the last of repeated entries; it ignores an empty LD_PROFILE_OUTPUT.
    let value = |prefix: &[u8]| {
        current
            .iter()
            .rev()
            .find_map(|(_, e)| e.to_bytes().strip_prefix(prefix))
            .filter(|v| !v.is_empty())
    };
    let name = value(LD_PROFILE)?;
    let directory = value(b"LD_PROFILE_OUTPUT=").unwrap_or(b"/var/tmp");
    let mut path = directory.to_vec();
    path.push(b'/');
    path.extend_from_slice(name);
    path.extend_from_slice(b".profile");
    let path = CString::new(path).ok()?;
    let (inode, birth) = sys::inode_and_birth(&path)?;
    // File times come from the kernel's coarse clock, up to one scheduler tick (at most 10 ms) behind.
    if birth < sys::process_start_ns()? - COARSE_CLOCK_LAG_NS {
        return None;
    }
    let mut suffix = b"/".to_vec();
    suffix.extend_from_slice(name);
    suffix.extend_from_slice(b".profile");
    let maps = std::fs::read("/proc/self/maps").ok()?;
    let mapped_here = maps.split(|&b| b == b'\n').any(|line| {
        let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let inode_field = fields.nth(4);
        let file = fields.next();
        inode_field == Some(inode.to_string().as_bytes())
            && file.is_some_and(|f| f.ends_with(&suffix))
    });
    mapped_here.then_some(path)
}

/// The path to execute and how many leading `arguments` (from `/proc/self/cmdline`) to drop: the path the
/// kernel was given (`AT_EXECFN`, so `/proc/self/comm`, `$ORIGIN` and the program's idea of its own path stay
/// the same) when it still names the running file; for a script (`#!`), whose running file is its interpreter
/// and whose arguments start with the interpreter and its option, the script itself, from its own argument on;
/// else the running file's own path.
fn program_path(arguments: &[CString]) -> Result<(CString, usize), String> {
    let running = c"/proc/self/exe";
    if let Some(given) = sys::exec_file_name() {
        if sys::same_file(&given, running) {
            return Ok((given, 0));
        }
        let is_script = std::fs::File::open(std::ffi::OsStr::from_bytes(given.to_bytes()))
            .and_then(|mut file| {
                let mut start = [0u8; 2];
                std::io::Read::read_exact(&mut file, &mut start).map(|()| start == *b"#!")
            })
            .unwrap_or(false);
        let script = arguments.iter().skip(1).take(2).position(|a| *a == given);
        if let (true, Some(script)) = (is_script, script) {
            return Ok((given, script + 1));
        }
    }
    let target =
        std::fs::read_link("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let target =
        CString::new(target.as_os_str().as_bytes()).map_err(|_| "/proc/self/exe has a NUL")?;
    Ok((target, 0))
}
