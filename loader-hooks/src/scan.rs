//! Start-up scan of the loaded objects: one [`ModuleInfo`] per ELF module mapped in the process.
//!
//! Everything is read from the loader's own records (`dl_iterate_phdr`) and from the objects' mapped memory:
//! no file is opened except `/proc/self/exe` (to name the main program). Addresses of executable ranges are
//! link-time addresses (runtime address − load bias), the space symbol tables use; every step from a link-time
//! address of the loader's records to a runtime one is [`LoadBias::runtime_address`].

use mslprof_format::{LinkAddress, LoadBias, RuntimeAddress};

use crate::sys::{self, LoadedObject, ProgramHeader};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_NOTE: u32 = 4;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
const PF_X: u32 = 1;
const PF_R: u32 = 4;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_NEEDED: u64 = 1;
const DT_SONAME: u64 = 14;
const NT_GNU_BUILD_ID: u32 = 3;
/// Longest soname read from memory; longer ones are cut (SPEC.md limits strings to 4096 bytes).
const MAX_SONAME: usize = 4096;
/// The name the vDSO gets, since it has no file.
pub const VDSO_NAME: &[u8] = b"[vdso]";

/// A half-open range `[start, end)` of link-time addresses of one module (runtime address − load bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkRange {
    pub start: u64,
    pub end: u64,
}

impl LinkRange {
    /// The first address of the range.
    pub fn start_address(&self) -> LinkAddress {
        LinkAddress(self.start)
    }

    /// The first address after the range.
    pub fn end_address(&self) -> LinkAddress {
        LinkAddress(self.end)
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// What the loader knows about one loaded ELF module.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ModuleInfo {
    /// Load bias: runtime address = link-time address + bias ([`ModuleInfo::load_bias`] is the typed view).
    pub bias: usize,
    /// Full path as the loader knew it (`/proc/self/exe` for the main program, empty for the vDSO).
    pub path: Vec<u8>,
    /// The last component of `path` (`[vdso]` for the vDSO): what LD_PROFILE matches first.
    pub file_name: Vec<u8>,
    /// `DT_SONAME`, empty when the module has none.
    pub soname: Vec<u8>,
    /// Descriptor of the GNU build-id note, empty when the module has none.
    pub build_id: Vec<u8>,
    /// Executable PT_LOAD segments, link-time addresses, sorted by start.
    pub exec_ranges: Vec<LinkRange>,
    pub is_main: bool,
    pub is_vdso: bool,
    pub is_dynamic_linker: bool,
    /// Runtime address of the dynamic section (`PT_DYNAMIC`), 0 when the module has none.
    pub dynamic: usize,
    /// The part the loader makes read-only after relocation (`PT_GNU_RELRO`, link-time addresses): where
    /// the GOT is.
    pub relro: Option<LinkRange>,
    /// The unwinders' search table `.eh_frame_hdr` (`PT_GNU_EH_FRAME`, link-time addresses), when the module
    /// has one.
    pub eh_frame_hdr: Option<LinkRange>,
    /// The file-backed parts of the readable PT_LOAD segments (link-time `[p_vaddr, p_vaddr + p_filesz)`),
    /// sorted by start: where the module's own bytes (such as `.eh_frame`) can be read while it is loaded.
    pub readable_ranges: Vec<LinkRange>,
    /// Loaded at start-up: the main program, the vDSO, the `LD_PRELOAD` libraries and what they all need
    /// (`DT_NEEDED`, transitively), ld.so among them. glibc never unloads these (only what `dlopen` loaded),
    /// so their memory stays readable for the life of the process ([`scan`] says how they are found).
    pub loaded_at_start_up: bool,
}

impl ModuleInfo {
    /// The load bias, typed: the one conversion between this module's link-time and runtime addresses.
    pub fn load_bias(&self) -> LoadBias {
        LoadBias(self.bias as u64)
    }

    /// The executable ranges as runtime `[start, end)`, in the order of `exec_ranges`.
    pub fn runtime_ranges(&self) -> impl Iterator<Item = (RuntimeAddress, RuntimeAddress)> + '_ {
        let bias = self.load_bias();
        self.exec_ranges.iter().map(move |range| {
            (
                bias.runtime_address(range.start_address()),
                bias.runtime_address(range.end_address()),
            )
        })
    }

    /// Runtime address range `[lowest start, highest end)` covering every executable segment.
    pub fn runtime_span(&self) -> Option<(RuntimeAddress, RuntimeAddress)> {
        let bias = self.load_bias();
        let first = self.exec_ranges.first()?;
        let last = self.exec_ranges.last()?;
        Some((
            bias.runtime_address(first.start_address()),
            bias.runtime_address(last.end_address()),
        ))
    }
}

/// One PT_LOAD segment of a loaded object, at runtime addresses.
pub(crate) struct LoadSegment {
    /// Where the segment's memory starts.
    pub start: RuntimeAddress,
    /// The end of its memory image (`p_memsz`; past the file-backed part it is zero-filled).
    pub end: RuntimeAddress,
    /// How many bytes from `start` hold the file's bytes (`p_filesz`).
    pub file_len: usize,
    pub readable: bool,
    pub executable: bool,
}

impl LoadSegment {
    pub fn contains(&self, address: RuntimeAddress) -> bool {
        self.start <= address && address < self.end
    }
}

/// The runtime address of a program header's link-time `vaddr` in `object`.
fn runtime_address(object: &LoadedObject<'_>, vaddr: u64) -> RuntimeAddress {
    object.bias.runtime_address(LinkAddress(vaddr))
}

/// The PT_LOAD segments of `object`, in program-header order.
pub(crate) fn load_segments<'a>(
    object: &'a LoadedObject<'_>,
) -> impl Iterator<Item = LoadSegment> + 'a {
    object
        .program_headers
        .iter()
        .filter(|h| h.p_type == PT_LOAD)
        .map(|h| LoadSegment {
            start: runtime_address(object, h.p_vaddr),
            end: runtime_address(object, h.p_vaddr.wrapping_add(h.p_memsz)),
            file_len: h.p_filesz as usize,
            readable: h.p_flags & PF_R != 0,
            executable: h.p_flags & PF_X != 0,
        })
}

/// `address + offset`, None past the end of the address space.
fn advance(address: RuntimeAddress, offset: usize) -> Option<RuntimeAddress> {
    Some(RuntimeAddress(address.0.checked_add(offset as u64)?))
}

/// The result of one scan: the modules and the loader's add/remove counters at that moment.
#[derive(Clone, Debug, Default)]
pub struct LoaderScan {
    pub modules: Vec<ModuleInfo>,
    /// `dlpi_adds`: objects added since the process started (changes on every dlopen that loads something).
    pub adds: u64,
    /// `dlpi_subs`: objects removed since the process started.
    pub subs: u64,
}

/// Every module loaded right now, in the loader's order (main program first).
pub fn scan_loaded_modules() -> Vec<ModuleInfo> {
    scan().modules
}

/// Every module loaded right now, with the loader's counters.
pub fn scan() -> LoaderScan {
    let exe_path = std::fs::read_link("/proc/self/exe")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default();
    let identity = ProcessIdentity {
        main_phdr: sys::aux_value(sys::AT_PHDR),
        vdso_base: sys::aux_value(sys::AT_SYSINFO_EHDR),
        interpreter_base: sys::aux_value(sys::AT_BASE),
    };
    let mut result = LoaderScan::default();
    let mut needed = Vec::new();
    sys::for_each_loaded_object(&mut |object| {
        result.adds = object.adds;
        result.subs = object.subs;
        let (module, its_needs) = describe(object, &identity, &exe_path);
        result.modules.push(module);
        needed.push(its_needs);
    });
    mark_loaded_at_start_up(&mut result.modules, &needed);
    result
}

/// Sets [`ModuleInfo::loaded_at_start_up`] on `modules` (in the loader's order; `needed[i]` holds the
/// `DT_NEEDED` names of `modules[i]`). ld.so maps every start-up object before any code of the program runs
/// and appends whatever `dlopen` loads later to the end of its list, so the start-up objects are a prefix of
/// the list: everything up to the last module reached from the main program through `DT_NEEDED`, extended
/// by what the modules of that prefix need in turn (the preloaded libraries sit between the main program and
/// its dependencies, and their own dependencies may come last). A name is provided by the first module, in
/// the loader's order, whose soname or file name it is (ld.so reuses a loaded object of that name). An
/// unmatched name only shortens the prefix: such a module is then treated as one that may be unloaded.
fn mark_loaded_at_start_up(modules: &mut [ModuleInfo], needed: &[Vec<Vec<u8>>]) {
    let provider = |name: &[u8]| {
        modules.iter().position(|m| {
            m.soname == name || m.file_name == name || (name.contains(&b'/') && m.path == name)
        })
    };
    let mut reached: Vec<bool> = modules.iter().map(|m| m.is_main).collect();
    let mut to_visit: Vec<usize> = (0..modules.len()).filter(|&i| reached[i]).collect();
    let mut prefix_end = 0;
    loop {
        while let Some(i) = to_visit.pop() {
            for name in needed.get(i).into_iter().flatten() {
                if let Some(j) = provider(name)
                    && !reached[j]
                {
                    reached[j] = true;
                    to_visit.push(j);
                }
            }
        }
        let Some(last) = reached.iter().rposition(|&r| r) else {
            return;
        };
        // Every module up to `last` loaded at start-up: what those not yet visited need did too.
        to_visit.extend((prefix_end..=last).filter(|&i| !reached[i]));
        for &i in &to_visit {
            reached[i] = true;
        }
        prefix_end = last + 1;
        if to_visit.is_empty() {
            break;
        }
    }
    for (i, module) in modules.iter_mut().enumerate() {
        module.loaded_at_start_up = i < prefix_end || module.is_vdso;
    }
}

/// Auxiliary-vector values that tell the main program, the vDSO and ld.so apart.
struct ProcessIdentity {
    main_phdr: usize,
    vdso_base: usize,
    interpreter_base: usize,
}

/// What is known of `object`, and the names it needs (`DT_NEEDED`, in order).
fn describe(
    object: &LoadedObject<'_>,
    identity: &ProcessIdentity,
    exe_path: &[u8],
) -> (ModuleInfo, Vec<Vec<u8>>) {
    let headers = object.program_headers;
    let lowest_vaddr = headers
        .iter()
        .filter(|h| h.p_type == PT_LOAD)
        .map(|h| h.p_vaddr & !(page_size() as u64 - 1))
        .min()
        .unwrap_or(0);
    let base = runtime_address(object, lowest_vaddr).as_usize();
    let phdr_address = headers.as_ptr() as usize;
    let is_main = identity.main_phdr != 0 && phdr_address == identity.main_phdr;
    let is_vdso = identity.vdso_base != 0 && base == identity.vdso_base;
    let is_dynamic_linker =
        !is_main && identity.interpreter_base != 0 && base == identity.interpreter_base;

    let path = if is_main {
        if exe_path.is_empty() {
            object.name.to_vec()
        } else {
            exe_path.to_vec()
        }
    } else if is_vdso {
        Vec::new()
    } else {
        object.name.to_vec()
    };
    let file_name = if is_vdso {
        VDSO_NAME.to_vec()
    } else {
        path.rsplit(|&b| b == b'/')
            .next()
            .unwrap_or_default()
            .to_vec()
    };

    let memory = ModuleMemory::new(object);
    let (soname, needed) = memory.dynamic_names(headers);
    let mut exec_ranges: Vec<LinkRange> = headers
        .iter()
        .filter(|h| h.p_type == PT_LOAD && h.p_flags & PF_X != 0 && h.p_memsz > 0)
        .map(|h| LinkRange {
            start: h.p_vaddr,
            end: h.p_vaddr + h.p_memsz,
        })
        .collect();
    exec_ranges.sort();
    let mut readable_ranges: Vec<LinkRange> = headers
        .iter()
        .filter(|h| h.p_type == PT_LOAD && h.p_flags & PF_R != 0 && h.p_filesz > 0)
        .map(|h| LinkRange {
            start: h.p_vaddr,
            end: h.p_vaddr + h.p_filesz,
        })
        .collect();
    readable_ranges.sort();

    let module = ModuleInfo {
        bias: object.bias.0 as usize,
        path,
        file_name,
        soname: soname.unwrap_or_default(),
        build_id: memory.build_id(headers).unwrap_or_default(),
        exec_ranges,
        is_main,
        is_vdso,
        is_dynamic_linker,
        dynamic: headers
            .iter()
            .find(|h| h.p_type == PT_DYNAMIC)
            .map_or(0, |h| runtime_address(object, h.p_vaddr).as_usize()),
        relro: headers
            .iter()
            .find(|h| h.p_type == PT_GNU_RELRO && h.p_memsz > 0)
            .map(|h| LinkRange {
                start: h.p_vaddr,
                end: h.p_vaddr + h.p_memsz,
            }),
        eh_frame_hdr: headers
            .iter()
            .find(|h| h.p_type == PT_GNU_EH_FRAME && h.p_memsz > 0)
            .map(|h| LinkRange {
                start: h.p_vaddr,
                end: h.p_vaddr + h.p_memsz,
            }),
        readable_ranges,
        loaded_at_start_up: false,
    };
    (module, needed)
}

/// A module's dynamic string table (`DT_STRTAB`, `DT_STRSZ` bytes long), read through its [`ModuleMemory`].
struct DynamicStrings<'a> {
    memory: &'a ModuleMemory,
    start: RuntimeAddress,
    limit: usize,
}

impl DynamicStrings<'_> {
    /// The NUL-terminated name at `offset`, cut at [`MAX_SONAME`] bytes or where memory stops being readable.
    fn name(&self, offset: u64) -> Option<Vec<u8>> {
        let offset = usize::try_from(offset).ok()?;
        if offset >= self.limit {
            return None;
        }
        let available = (self.limit - offset).min(MAX_SONAME);
        let start = advance(self.start, offset)?;
        let mut name = Vec::new();
        for i in 0..available {
            let byte = *self.memory.bytes(advance(start, i)?, 1)?.first()?;
            if byte == 0 {
                return Some(name);
            }
            name.push(byte);
        }
        Some(name)
    }
}

fn page_size() -> usize {
    sys::page_size()
}

/// The readable memory of one loaded object, with bounds-checked reads.
struct ModuleMemory {
    bias: LoadBias,
    /// Readable PT_LOAD segments as runtime `[start, end)`. Only the file-backed part is sure to hold the file's
    /// bytes; the rest is zero-filled but mapped.
    readable: Vec<(RuntimeAddress, RuntimeAddress)>,
}

impl ModuleMemory {
    fn new(object: &LoadedObject<'_>) -> Self {
        let readable = load_segments(object)
            .filter(|segment| segment.readable)
            .map(|segment| (segment.start, segment.end))
            .collect();
        ModuleMemory {
            bias: object.bias,
            readable,
        }
    }

    /// `len` bytes at runtime `address`, if they lie inside one readable segment.
    fn bytes(&self, address: RuntimeAddress, len: usize) -> Option<&[u8]> {
        let end = advance(address, len)?;
        if !self.readable.iter().any(|&(s, e)| s <= address && end <= e) {
            return None;
        }
        // SAFETY: the range lies inside a readable PT_LOAD segment of an object that the loader holds while
        // dl_iterate_phdr runs its callback (we are inside it).
        Some(unsafe { sys::mapped_bytes(address, len) })
    }

    /// The bytes of the segment `header`.
    fn segment(&self, header: &ProgramHeader) -> Option<&[u8]> {
        self.bytes(
            self.bias.runtime_address(LinkAddress(header.p_vaddr)),
            header.p_filesz as usize,
        )
    }

    /// A dynamic-section pointer value as a runtime address. glibc relocates DT_STRTAB in place for ordinary
    /// objects (absolute) but not for the vDSO (link-time); tell them apart by which one is readable.
    fn dynamic_pointer(&self, value: u64) -> Option<RuntimeAddress> {
        let absolute = RuntimeAddress(value);
        let relocated = self.bias.runtime_address(LinkAddress(value));
        [absolute, relocated]
            .into_iter()
            .find(|&a| self.bytes(a, 1).is_some())
    }

    /// `DT_SONAME` and the `DT_NEEDED` names (in order), read in one pass over the dynamic section; nothing
    /// when there is none.
    fn dynamic_names(&self, headers: &[ProgramHeader]) -> (Option<Vec<u8>>, Vec<Vec<u8>>) {
        let Some(dynamic) = headers
            .iter()
            .find(|h| h.p_type == PT_DYNAMIC)
            .and_then(|h| self.segment(h))
        else {
            return (None, Vec::new());
        };
        let word = std::mem::size_of::<usize>();
        let (mut strtab, mut strsz, mut soname, mut needed) = (None, None, None, Vec::new());
        for entry in dynamic.chunks_exact(2 * word) {
            let tag = read_word(&entry[..word]);
            let value = read_word(&entry[word..]);
            match tag {
                DT_NULL => break,
                DT_STRTAB => strtab = Some(value),
                DT_STRSZ => strsz = Some(value),
                DT_SONAME => soname = Some(value),
                DT_NEEDED => needed.push(value),
                _ => {}
            }
        }
        let Some(start) = strtab.and_then(|value| self.dynamic_pointer(value)) else {
            return (None, Vec::new());
        };
        let strings = DynamicStrings {
            memory: self,
            start,
            limit: strsz
                .and_then(|s| usize::try_from(s).ok())
                .unwrap_or(usize::MAX),
        };
        (
            soname.and_then(|offset| strings.name(offset)),
            needed
                .into_iter()
                .filter_map(|offset| strings.name(offset))
                .collect(),
        )
    }

    fn build_id(&self, headers: &[ProgramHeader]) -> Option<Vec<u8>> {
        for header in headers.iter().filter(|h| h.p_type == PT_NOTE) {
            let Some(notes) = self.segment(header) else {
                continue;
            };
            let align = if header.p_align == 8 { 8 } else { 4 };
            if let Some(id) = find_gnu_build_id(notes, align) {
                return Some(id.to_vec());
            }
        }
        None
    }
}

fn read_word(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = bytes.len().min(8);
    buf[..n].copy_from_slice(&bytes[..n]);
    if n == 4 {
        u64::from(u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]))
    } else {
        u64::from_ne_bytes(buf)
    }
}

fn align_up(value: usize, align: usize) -> Option<usize> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

/// Walks ELF notes (namesz, descsz, type, name, desc; each padded to `align`) for the GNU build-id.
fn find_gnu_build_id(mut notes: &[u8], align: usize) -> Option<&[u8]> {
    while notes.len() >= 12 {
        let field =
            |i: usize| u32::from_ne_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]);
        let (namesz, descsz, kind) = (field(0) as usize, field(4) as usize, field(8));
        let desc_start = align_up(12usize.checked_add(namesz)?, align)?;
        let next = align_up(desc_start.checked_add(descsz)?, align)?;
        let name = notes.get(12..12 + namesz)?;
        let desc = notes.get(desc_start..desc_start + descsz)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc);
        }
        notes = notes.get(next..).unwrap_or_default();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(file_name: &str, soname: &str, is_main: bool) -> ModuleInfo {
        ModuleInfo {
            file_name: file_name.as_bytes().to_vec(),
            soname: soname.as_bytes().to_vec(),
            is_main,
            ..ModuleInfo::default()
        }
    }

    #[test]
    fn the_start_up_modules_are_the_prefix_the_program_and_preloaded_libraries_need() {
        // The loader's order: the program, a preloaded library, the program's libraries, the preloaded
        // library's own dependency last, then two libraries dlopen loaded (one needed by nothing, one that
        // shares a name with nothing either).
        let mut modules = vec![
            named("app", "", true),
            named("libpreload.so", "libpreload.so", false),
            named("libfoo.so.1.2", "libfoo.so.1", false),
            named("libc.so.6", "libc.so.6", false),
            named(
                "libonly_preload_needs.so",
                "libonly_preload_needs.so",
                false,
            ),
            named("plugin.so", "plugin.so", false),
            named("libbar.so", "libbar.so", false),
        ];
        let needed: Vec<Vec<Vec<u8>>> = [
            &["libfoo.so.1", "libc.so.6"][..],
            &["libonly_preload_needs.so", "libc.so.6"],
            &["libc.so.6"],
            &[],
            &["libc.so.6"],
            &["libbar.so", "libc.so.6"],
            &[],
        ]
        .iter()
        .map(|names| names.iter().map(|n| n.as_bytes().to_vec()).collect())
        .collect();
        mark_loaded_at_start_up(&mut modules, &needed);
        let marks: Vec<bool> = modules.iter().map(|m| m.loaded_at_start_up).collect();
        assert_eq!(marks, [true, true, true, true, true, false, false]);
    }

    #[test]
    fn a_library_dlopen_loads_is_not_a_start_up_module_and_the_rest_are() {
        // SAFETY: a valid NUL-terminated name; libresolv is part of glibc, not loaded by test programs.
        let handle = unsafe { libc::dlopen(c"libresolv.so.2".as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null());
        let modules = scan_loaded_modules();
        let resolv = modules
            .iter()
            .find(|m| m.soname == b"libresolv.so.2")
            .expect("libresolv.so.2 loaded");
        assert!(!resolv.loaded_at_start_up, "{modules:#?}");
        for module in modules
            .iter()
            .filter(|m| m.is_main || m.is_vdso || m.is_dynamic_linker || m.soname == b"libc.so.6")
        {
            assert!(
                module.loaded_at_start_up,
                "{}",
                String::from_utf8_lossy(&module.file_name)
            );
        }
        // SAFETY: the handle came from dlopen above.
        unsafe { libc::dlclose(handle) };
    }

    #[test]
    fn scan_finds_main_program_libc_ldso_and_vdso() {
        let modules = scan_loaded_modules();
        let main: Vec<_> = modules.iter().filter(|m| m.is_main).collect();
        assert_eq!(main.len(), 1, "{modules:#?}");
        let exe = std::env::current_exe()
            .unwrap()
            .into_os_string()
            .into_encoded_bytes();
        assert_eq!(main[0].path, exe);
        assert!(!main[0].exec_ranges.is_empty());
        assert!(
            !main[0].build_id.is_empty(),
            "rustc links test binaries with a build-id"
        );

        let libc = modules
            .iter()
            .find(|m| m.file_name == b"libc.so.6")
            .expect("libc.so.6 loaded");
        assert_eq!(libc.soname, b"libc.so.6");
        assert!(!libc.is_main && !libc.is_vdso && !libc.is_dynamic_linker);

        let ldso: Vec<_> = modules.iter().filter(|m| m.is_dynamic_linker).collect();
        assert_eq!(ldso.len(), 1, "{modules:#?}");
        assert!(
            ldso[0].file_name.starts_with(b"ld-linux"),
            "{:?}",
            String::from_utf8_lossy(&ldso[0].file_name)
        );
        assert!(ldso[0].soname.starts_with(b"ld-linux"));

        let vdso: Vec<_> = modules.iter().filter(|m| m.is_vdso).collect();
        assert_eq!(vdso.len(), 1, "{modules:#?}");
        assert_eq!(vdso[0].file_name, VDSO_NAME);
        assert!(vdso[0].path.is_empty());
        assert!(
            vdso[0].soname.starts_with(b"linux-vdso") || vdso[0].soname.starts_with(b"linux-gate")
        );
    }

    #[test]
    fn exec_ranges_are_link_time_and_contain_this_function() {
        let pc = exec_ranges_are_link_time_and_contain_this_function as *const () as usize;
        let modules = scan_loaded_modules();
        let main = modules.iter().find(|m| m.is_main).unwrap();
        let pc = RuntimeAddress::from_usize(pc);
        let link_pc = main.load_bias().link_address(pc);
        assert!(
            main.exec_ranges
                .iter()
                .any(|r| r.start_address() <= link_pc && link_pc < r.end_address()),
            "{main:#?} {link_pc:#x}"
        );
        assert!(main.runtime_ranges().any(|(lo, hi)| lo <= pc && pc < hi));
        let (lo, hi) = main.runtime_span().unwrap();
        assert!(lo <= pc && pc < hi);
    }

    #[test]
    fn build_id_matches_readelf_notes_walker() {
        // name "GNU\0", desc 4 bytes, type 3; preceded by an unrelated note.
        let mut notes = Vec::new();
        for (name, desc, kind) in [
            (&b"XY\0"[..], &[9u8, 9][..], 1u32),
            (b"GNU\0", &[1, 2, 3, 4], 3),
        ] {
            notes.extend((name.len() as u32).to_ne_bytes());
            notes.extend((desc.len() as u32).to_ne_bytes());
            notes.extend(kind.to_ne_bytes());
            notes.extend(name);
            notes.resize(align_up(notes.len(), 4).unwrap(), 0);
            notes.extend(desc);
            notes.resize(align_up(notes.len(), 4).unwrap(), 0);
        }
        assert_eq!(find_gnu_build_id(&notes, 4), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(find_gnu_build_id(&notes[..notes.len() - 2], 4), None);
        assert_eq!(find_gnu_build_id(&[0xff; 40], 4), None);
    }
}
