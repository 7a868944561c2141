//! `-c` / `--static-call-graph`: call instructions found in each function's machine code become arcs
//! with a zero count when the run never took them (gprof's `find_call`). x86-64 code is decoded with
//! `iced-x86`, so backward calls are found as well as forward ones; on mslprof profiles a call into a
//! PLT entry resolves to the function of another module of the profile that the entry jumps to.

use std::collections::HashMap;
use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};
use mslprof_format::LinkAddress;
use object::{Object, ObjectSection, ObjectSymbol, SectionKind};

use crate::gprof::graph::Graph;

/// Debugging lines (`-d` bit 256) describing what the scan found, one per call found.
pub type DebugLines = Vec<String>;

/// Why a module's machine code cannot be scanned for calls (`-c` then warns and goes on without it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    #[error("{0}")]
    Read(#[from] std::io::Error),
    #[error("{0}")]
    Parse(#[from] object::Error),
    #[error("-c is not supported for architecture {0:?}")]
    Architecture(object::Architecture),
}

/// Add the static arcs of `module`'s functions to `g`, reading code from the ELF file at `path`.
/// `accept` filters call targets (GNU input: the address must lie in a histogram range, as in gprof);
/// `cross_module` resolves PLT calls to functions of the other modules of `g` by symbol name.
pub fn add_static_arcs(
    g: &mut Graph,
    module: usize,
    path: &Path,
    accept: &dyn Fn(LinkAddress) -> bool,
    cross_module: bool,
    debug: &mut DebugLines,
) -> Result<(), ScanError> {
    let data = std::fs::read(path)?;
    let file = object::File::parse(&*data)?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(ScanError::Architecture(file.architecture()));
    }
    let plt = if cross_module {
        plt_targets(&file)
    } else {
        HashMap::new()
    };
    let by_name: HashMap<&str, usize> = if cross_module {
        let mut m = HashMap::new();
        for (i, s) in g.syms[..g.nsyms].iter().enumerate() {
            // Only functions with entries of their own: not other modules' PLT stubs, and not the
            // functions of modules that were not profiled (they only name callers).
            if s.module != module
                && !s.symbol.name.ends_with("@plt")
                && g.modules[s.module].profiled
            {
                m.entry(s.symbol.name.as_str()).or_insert(i);
            }
        }
        m
    } else {
        HashMap::new()
    };
    let mut found = Vec::new();
    let range = g.modules[module].syms.clone();
    for parent in range.clone() {
        let start = g.syms[parent].symbol.addr;
        let end = if parent + 1 < range.end {
            g.syms[parent + 1].symbol.addr
        } else {
            LinkAddress(g.syms[parent].symbol.end_addr.0.saturating_add(1))
        };
        let Some(code) = code_bytes(&file, start.0, end.0) else {
            continue;
        };
        let mut decoder = Decoder::with_ip(64, code, start.0, DecoderOptions::NONE);
        let mut ins = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut ins);
            if ins.mnemonic() != Mnemonic::Call || ins.op0_kind() != OpKind::NearBranch64 {
                continue;
            }
            let target = LinkAddress(ins.near_branch_target());
            // A call into the PLT goes to the function its slot names, in another module of the profile
            // (its stub, `name@plt` in an mslprof report, is not a function of its own here).
            let child = match plt.get(&target.0) {
                Some(name) => by_name.get(name.as_str()).copied(),
                None => g
                    .lookup(module, target)
                    .filter(|&c| g.syms[c].symbol.addr == target && accept(target)),
            };
            if let Some(child) = child {
                found.push((parent, child, ins.ip()));
            }
        }
    }
    for (parent, child, site) in found {
        let what = if g.arc_index.contains_key(&(parent, child)) {
            "recorded arc"
        } else {
            "static arc, count 0"
        };
        debug.push(format!(
            "[findcall] {:#x}: {} calls {} ({what})",
            site, g.syms[parent].display, g.syms[child].display
        ));
        g.add_arc(parent, child, 0);
    }
    Ok(())
}

/// The bytes of `[start, end)` in an executable section, if the range lies in one.
pub(crate) fn code_bytes<'a>(file: &object::File<'a>, start: u64, end: u64) -> Option<&'a [u8]> {
    file.sections().find_map(|s| {
        let section_end = s.address().saturating_add(s.size());
        if s.kind() != SectionKind::Text || start < s.address() || start >= section_end {
            return None;
        }
        let end = end.min(section_end);
        s.data_range(start, end.checked_sub(start)?).ok().flatten()
    })
}

/// GOT slot address → name of the symbol a dynamic relocation puts there.
pub(crate) fn got_slots(file: &object::File<'_>) -> HashMap<u64, String> {
    let mut slots = HashMap::new();
    if let Some(relocs) = file.dynamic_relocations() {
        let dynsyms: Vec<_> = file.dynamic_symbols().collect();
        for (offset, r) in relocs {
            if let object::RelocationTarget::Symbol(idx) = r.target()
                && let Some(sym) = dynsyms.iter().find(|s| s.index() == idx)
                && let Ok(name) = sym.name()
            {
                slots.insert(offset, name.to_string());
            }
        }
    }
    slots
}

/// PLT entry address → name of the function it jumps to: each entry's indirect `jmp [rip+got]`
/// reads a GOT slot that a jump-slot relocation names.
pub(crate) fn plt_targets(file: &object::File<'_>) -> HashMap<u64, String> {
    let slots = got_slots(file);
    let mut out = HashMap::new();
    for s in file.sections() {
        let Ok(name) = s.name() else { continue };
        if !matches!(name, ".plt" | ".plt.sec" | ".plt.got") {
            continue;
        }
        let Ok(code) = s.data() else { continue };
        // Entries are 16 bytes; the first jump of each is the one through its GOT slot.
        for (k, entry) in code.chunks(16).enumerate() {
            let ip = s.address().wrapping_add(16 * k as u64);
            let mut decoder = Decoder::with_ip(64, entry, ip, DecoderOptions::NONE);
            let mut ins = Instruction::default();
            while decoder.can_decode() {
                decoder.decode_out(&mut ins);
                if ins.mnemonic() == Mnemonic::Jmp {
                    if ins.is_ip_rel_memory_operand()
                        && let Some(name) = slots.get(&ins.ip_rel_memory_address())
                    {
                        out.insert(ip, name.clone());
                    }
                    break;
                }
            }
        }
    }
    out
}
