//! What the exports read from a module's file beyond its symbols: instruction boundaries and call
//! instructions (x86-64, decoded with `iced-x86`), source positions with inlined frames (DWARF through
//! addr2line, as `lines.rs` opens it, from the file or its separate debug file) and the executable segment
//! (pprof's mapping). Link-time addresses throughout.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic};
use object::{Object, ObjectSegment, SegmentFlags};

use crate::elf::lines::{Context, with_dwarf};
use crate::elf::symbols::COUNTING_IMPORTS;
use crate::gprof::staticcalls::{code_bytes, got_slots, plt_targets};

/// One source frame of an address: the innermost is where the instruction's line is, the others are the
/// calls of the inlined functions around it (the outermost is the real function).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The DWARF function (for inlined frames, the inlined function), as its name is written.
    pub function: Option<String>,
    pub file: Option<String>,
    /// 0 when unknown.
    pub line: u32,
}

/// The loadable executable segment holding the code: pprof's `Mapping` start, limit and file offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}

/// What the exports ask of one module.
#[derive(Default)]
pub struct Wanted {
    /// Functions to decode, as `[start, end)`.
    pub functions: Vec<(u64, u64)>,
    /// Histogram buckets with samples, as `[start, end)`.
    pub buckets: Vec<(u64, u64)>,
    /// Return addresses of recorded calls (call sites in this module).
    pub returns: Vec<u64>,
    /// Further addresses whose source position is needed (function entries).
    pub entries: Vec<u64>,
}

/// The answers for one module.
#[derive(Debug, Default)]
pub struct ModuleCode {
    /// Instruction starts of the decoded functions, sorted.
    starts: Vec<u64>,
    /// Return address → the call instruction that ends there.
    calls: HashMap<u64, u64>,
    /// Entries of the decoded functions, and of those among them that count their calls (they call
    /// `mcount`, `__fentry__`, ... before anything else calls).
    decoded: HashSet<u64>,
    counting: HashSet<u64>,
    /// Source frames (innermost first) of the addresses asked for.
    positions: HashMap<u64, Vec<Frame>>,
    /// Whether the module (or its debug file) has DWARF line tables.
    pub has_lines: bool,
    pub segment: Option<Segment>,
}

impl ModuleCode {
    /// Decode and look up what `wanted` asks in the ELF file at `path`; an empty answer when the file
    /// cannot be read (every lookup then falls back to the address it was given).
    pub fn load(path: &Path, wanted: &Wanted) -> ModuleCode {
        let mut code = ModuleCode::default();
        let Ok(data) = crate::sys::map_file(path) else {
            return code;
        };
        let Ok(file) = object::File::parse(&*data) else {
            return code;
        };
        code.segment = file
            .segments()
            .filter(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0))
            .map(|s| Segment {
                start: s.address(),
                limit: s.address().saturating_add(s.size()),
                offset: s.file_range().0,
            })
            .next();
        if file.architecture() == object::Architecture::X86_64 {
            code.decode(&file, &wanted.functions);
        }
        let mut addresses: Vec<u64> = wanted
            .buckets
            .iter()
            .map(|&(start, end)| code.cost_address(start, end))
            .chain(wanted.returns.iter().map(|&r| code.call_site(r)))
            .chain(wanted.entries.iter().copied())
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        let mut look_up = |ctx: &Context<'_>| {
            for &a in &addresses {
                code.positions.insert(a, frames(ctx, a));
            }
        };
        code.has_lines = with_dwarf(&file, &mut look_up).is_some()
            || crate::elf::symbols::with_debug_file(path, &file, |debug| {
                with_dwarf(debug, &mut look_up).is_some()
            })
            .unwrap_or(false);
        code
    }

    fn decode(&mut self, file: &object::File<'_>, functions: &[(u64, u64)]) {
        let counting =
            |name: Option<&String>| name.is_some_and(|n| COUNTING_IMPORTS.contains(&n.as_str()));
        let (plt, slots) = (plt_targets(file), got_slots(file));
        let mut ins = Instruction::default();
        for &(start, end) in functions {
            let Some(bytes) = code_bytes(file, start, end) else {
                continue;
            };
            self.decoded.insert(start);
            let mut first_call = true;
            let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
            while decoder.can_decode() {
                decoder.decode_out(&mut ins);
                if ins.is_invalid() {
                    break;
                }
                self.starts.push(ins.ip());
                if ins.mnemonic() == Mnemonic::Call {
                    self.calls.insert(ins.next_ip(), ins.ip());
                    // -pg code calls the counting function first (through the PLT or the GOT).
                    if first_call {
                        let target = if ins.is_ip_rel_memory_operand() {
                            slots.get(&ins.ip_rel_memory_address())
                        } else {
                            plt.get(&ins.near_branch_target())
                        };
                        if counting(target) {
                            self.counting.insert(start);
                        }
                        first_call = false;
                    }
                }
            }
        }
        self.starts.sort_unstable();
        self.starts.dedup();
    }

    /// Where the samples of the bucket `[start, end)` are placed: its first whole instruction; the
    /// instruction that holds `start` when none begins in the bucket; `start` when the code is unknown.
    pub fn cost_address(&self, start: u64, end: u64) -> u64 {
        let i = self.starts.partition_point(|&a| a < start);
        match self.starts.get(i) {
            Some(&a) if a < end => a,
            _ if i > 0 && self.starts[i - 1] + 15 > start => self.starts[i - 1],
            _ => start,
        }
    }

    /// Whether the function at `entry` counts its calls (`None` when its code was not decoded).
    pub fn counts_calls(&self, entry: u64) -> Option<bool> {
        self.decoded
            .contains(&entry)
            .then(|| self.counting.contains(&entry))
    }

    /// The address of the call instruction that returns to `ret`; `ret` itself when no decoded call ends
    /// there.
    pub fn call_site(&self, ret: u64) -> u64 {
        self.calls.get(&ret).copied().unwrap_or(ret)
    }

    /// The source frames of `addr` (innermost first), when asked for and known.
    pub fn frames(&self, addr: u64) -> &[Frame] {
        self.positions.get(&addr).map_or(&[], Vec::as_slice)
    }

    /// The innermost source position of `addr`: `(file, line)`; `None` where DWARF gives no line (line 0
    /// is compiler-made code).
    pub fn position(&self, addr: u64) -> Option<(&str, u32)> {
        let f = self.frames(addr).first()?;
        Some((f.file.as_deref()?, f.line)).filter(|&(_, line)| line > 0)
    }
}

/// addr2line's frames of `addr`, innermost first.
fn frames(ctx: &Context<'_>, addr: u64) -> Vec<Frame> {
    let mut out = Vec::new();
    if let Ok(mut iter) = ctx.find_frames(addr).skip_all_loads() {
        while let Ok(Some(f)) = iter.next() {
            out.push(Frame {
                function: f
                    .function
                    .and_then(|n| n.demangle().ok().map(|n| n.into_owned())),
                file: f.location.as_ref().and_then(|l| l.file.map(str::to_string)),
                line: f.location.and_then(|l| l.line).unwrap_or(0),
            });
        }
    }
    if out.is_empty()
        && let Ok(Some(loc)) = ctx.find_location(addr)
    {
        out.push(Frame {
            function: None,
            file: loc.file.map(str::to_string),
            line: loc.line.unwrap_or(0),
        });
    }
    out
}
