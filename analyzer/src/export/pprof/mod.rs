//! pprof's gzip-compressed `profile.proto`: sample types `samples/count`, `cpu/nanoseconds` (the
//! default) and `calls/count`, the real sampling period in `cpu/nanoseconds`, one `Mapping` per module
//! (path, executable segment, GNU build-id). Time: with sampled stacks, one sample per distinct stack
//! (leaf first: the sampled instruction, then each caller's call instruction); without, a histogram
//! bucket becomes a one-frame sample at its first whole instruction. A recorded call becomes a two-frame
//! sample `[callee entry, call instruction]` whose value is the call count (calls from outside any known
//! function: a one-frame sample at the entry). Locations carry DWARF's source lines, inlined functions
//! first.

pub mod proto;

use std::collections::HashMap;
use std::io::{self, Write};

use prost::Message as _;

use super::Prepared;
use super::code::ModuleCode;
use crate::stages::stacks::Frame;
use proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

/// The page size mappings are aligned to.
const PAGE: u64 = 0x1000;

/// A pprof function: a symbol of the analysis, or a function inlined into one (named by DWARF).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum FunctionKey {
    Symbol(usize),
    Inlined(String, String),
    /// A stack frame no symbol covers, named as the report names it (`module+0xADDR`, `[unknown]`).
    Unnamed(String),
}

/// Strings, functions and locations numbered as they are first used.
struct Builder<'a> {
    p: &'a Prepared,
    code: &'a [ModuleCode],
    /// Per module, what is added to a link-time address to place it in the process's address space.
    bias: Vec<u64>,
    out: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<FunctionKey, u64>,
    locations: HashMap<(usize, u64), u64>,
}

impl Builder<'_> {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn function(&mut self, key: FunctionKey) -> u64 {
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let (display, raw, file, start_line) = match &key {
            FunctionKey::Symbol(s) => {
                let sym = &self.p.analysis.graph.syms[*s];
                let entry = self.code[sym.module].position(sym.symbol.addr.0);
                let (file, line) = match (&sym.symbol.file, entry) {
                    (Some(f), _) if sym.symbol.line > 0 => (f.clone(), sym.symbol.line),
                    (_, Some((f, l))) => (f.to_string(), l),
                    (f, None) => (f.clone().unwrap_or_default(), sym.symbol.line),
                };
                (sym.display.clone(), sym.symbol.name.clone(), file, line)
            }
            FunctionKey::Inlined(name, file) => (name.clone(), name.clone(), file.clone(), 0),
            FunctionKey::Unnamed(name) => (name.clone(), name.clone(), String::new(), 0),
        };
        let id = self.out.function.len() as u64 + 1;
        let f = Function {
            id,
            name: self.string(&display),
            system_name: self.string(&raw),
            filename: self.string(&file),
            start_line: i64::from(start_line),
        };
        self.out.function.push(f);
        self.functions.insert(key, id);
        id
    }

    /// The location of a stack's frame at `depth` (0: the leaf).
    fn frame_location(&mut self, depth: usize, f: &Frame) -> u64 {
        let address = self.p.frame_address(self.code, depth, f);
        match (f.module, f.sym) {
            (Some(m), Some(s)) => self.location(m, address, s),
            (module, _) => {
                let key = (module.unwrap_or(usize::MAX), address);
                if let Some(&id) = self.locations.get(&key) {
                    return id;
                }
                let name = f.name(&self.p.analysis.graph);
                let line = vec![Line {
                    function_id: self.function(FunctionKey::Unnamed(name)),
                    line: 0,
                    column: 0,
                }];
                self.add_location(key, module, address, line)
            }
        }
    }

    /// A new location at `address` of `module` (none: outside every module), remembered under `key`.
    fn add_location(
        &mut self,
        key: (usize, u64),
        module: Option<usize>,
        address: u64,
        line: Vec<Line>,
    ) -> u64 {
        let id = self.out.location.len() as u64 + 1;
        self.out.location.push(Location {
            id,
            mapping_id: module.map_or(0, |m| m as u64 + 1),
            address: module.map_or(0, |m| address.wrapping_add(self.bias[m])),
            line,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// The location of `address` in module `m`, in function `s`, with its source lines from DWARF
    /// (inlined functions first, the function `s` last).
    fn location(&mut self, m: usize, address: u64, s: usize) -> u64 {
        if let Some(&id) = self.locations.get(&(m, address)) {
            return id;
        }
        let code = self.code;
        let frames = code[m].frames(address);
        let mut line = Vec::with_capacity(frames.len().max(1));
        for (i, f) in frames.iter().enumerate() {
            let key = match &f.function {
                Some(name) if i + 1 < frames.len() => {
                    FunctionKey::Inlined(name.clone(), f.file.clone().unwrap_or_default())
                }
                _ => FunctionKey::Symbol(s),
            };
            line.push(Line {
                function_id: self.function(key),
                line: i64::from(f.line),
                column: 0,
            });
        }
        if line.is_empty() {
            line.push(Line {
                function_id: self.function(FunctionKey::Symbol(s)),
                line: 0,
                column: 0,
            });
        }
        self.add_location((m, address), Some(m), address, line)
    }
}

/// The profile message for `p`.
pub fn profile(p: &Prepared) -> Profile {
    let code = p.code();
    let costs = p.costs(code);
    let call_sites = p.call_sites(code);
    let g = &p.analysis.graph;
    // Where each module's code lies (link-time): its executable segment where the file can be read,
    // else the range of the addresses written.
    let mut used: Vec<Option<(u64, u64)>> = vec![None; p.profile.modules.len()];
    let mut widen = |m: usize, a: u64| {
        let (lo, hi) = used[m].unwrap_or((a, a));
        used[m] = Some((lo.min(a), hi.max(a + 1)));
    };
    for c in &costs {
        widen(c.module, c.address);
    }
    for c in &call_sites {
        widen(c.caller_module, c.site);
        widen(g.syms[c.callee].module, g.syms[c.callee].symbol.addr.0);
    }
    for s in p.active_functions() {
        widen(g.syms[s].module, g.syms[s].symbol.addr.0);
    }
    for stack in p.stacks().iter().flat_map(|s| &s.stacks) {
        for (depth, f) in stack.frames.iter().enumerate() {
            if let Some(m) = f.module {
                widen(m, p.frame_address(code, depth, f));
            }
        }
    }
    let ranges: Vec<(u64, u64, u64)> = (0..p.profile.modules.len())
        .map(|m| match (code[m].segment, used[m]) {
            // Whole pages, as the process mapped them (pprof takes an unaligned mapping for a kernel's).
            (Some(seg), _) => {
                let lead = seg.start % PAGE;
                (
                    seg.start - lead,
                    seg.limit.div_ceil(PAGE).saturating_mul(PAGE),
                    seg.offset.saturating_sub(lead),
                )
            }
            (None, Some((lo, hi))) => (lo, hi, 0),
            (None, None) => (0, 0, 0),
        })
        .collect();
    let bias = place(p, &ranges);
    let mut b = Builder {
        p,
        code,
        bias: bias.clone(),
        out: Profile::default(),
        strings: HashMap::new(),
        functions: HashMap::new(),
        locations: HashMap::new(),
    };
    b.string("");
    let value_type = |b: &mut Builder<'_>, kind: &str, unit: &str| ValueType {
        r#type: b.string(kind),
        unit: b.string(unit),
    };
    let samples = value_type(&mut b, "samples", "count");
    let cpu = value_type(&mut b, "cpu", "nanoseconds");
    let calls = value_type(&mut b, "calls", "count");
    b.out.sample_type = vec![samples, cpu, calls];
    b.out.default_sample_type = cpu.r#type;
    b.out.period_type = Some(cpu);
    let period = p.period_ns() as i64;
    b.out.period = period;
    let h = &p.profile.header;
    b.out.time_nanos = h.start_time_ns;
    b.out.duration_nanos = (h.end_time_ns - h.start_time_ns).max(0);
    let time_sample = |location_id: Vec<u64>, samples: u64| {
        let n = i64::try_from(samples).unwrap_or(i64::MAX);
        Sample {
            location_id,
            value: vec![n, n.saturating_mul(period), 0],
            label: Vec::new(),
        }
    };
    match p.stacks() {
        Some(stacks) => {
            for stack in &stacks.stacks {
                let frames = stack
                    .frames
                    .iter()
                    .enumerate()
                    .map(|(depth, f)| b.frame_location(depth, f))
                    .collect();
                b.out.sample.push(time_sample(frames, stack.count));
            }
        }
        None => {
            for c in costs {
                let loc = b.location(c.module, c.address, c.function);
                b.out.sample.push(time_sample(vec![loc], c.samples));
            }
        }
    }
    let mut from_known = HashMap::new();
    for c in call_sites {
        let entry = g.syms[c.callee].symbol.addr.0;
        let frames = vec![
            b.location(g.syms[c.callee].module, entry, c.callee),
            b.location(c.caller_module, c.site, c.caller),
        ];
        *from_known.entry(c.callee).or_insert(0u64) += c.count;
        b.out.sample.push(Sample {
            location_id: frames,
            value: vec![0, 0, c.count as i64],
            label: Vec::new(),
        });
    }
    // Calls whose caller is in no known function: one frame, the callee's entry.
    for s in p.active_functions() {
        let Some(all) = p.calls(s) else { continue };
        let sym = &g.syms[s];
        let rest = all.saturating_sub(from_known.get(&s).copied().unwrap_or(0));
        if rest > 0 {
            let loc = b.location(sym.module, sym.symbol.addr.0, s);
            b.out.sample.push(Sample {
                location_id: vec![loc],
                value: vec![0, 0, rest as i64],
                label: Vec::new(),
            });
        }
    }
    for (m, module) in p.profile.modules.iter().enumerate() {
        let (start, limit, offset) = ranges[m];
        let path = String::from_utf8_lossy(&module.path).into_owned();
        let lines = code[m].has_lines;
        let mapping = Mapping {
            id: m as u64 + 1,
            memory_start: start.wrapping_add(bias[m]),
            memory_limit: limit.wrapping_add(bias[m]),
            file_offset: offset,
            filename: b.string(&path),
            build_id: b.string(&p.build_id(m)),
            has_functions: true,
            has_filenames: lines,
            has_line_numbers: lines,
            has_inline_frames: lines,
        };
        b.out.mapping.push(mapping);
    }
    b.out
}

/// Each module's load bias: the one recorded (the first load instance's; 0 for the main program), moved up past the modules
/// below it where code ranges `(start, limit, _)` would overlap (instances of summed runs, or reloads), so
/// that every address of the profile names one module, as pprof assumes.
fn place(p: &Prepared, ranges: &[(u64, u64, u64)]) -> Vec<u64> {
    const ALIGN: u64 = 0x20_0000;
    // The main program stays at its link-time addresses: Go's own `go tool pprof` disassembles
    // (`-disasm`) at the addresses of the file, whatever the mapping says.
    let mut bias: Vec<u64> = p
        .profile
        .modules
        .iter()
        .map(|m| {
            if m.is_main_program() {
                0
            } else {
                m.load_bias.0
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..ranges.len())
        .filter(|&m| ranges[m].1 > ranges[m].0)
        .collect();
    order.sort_by_key(|&m| ranges[m].0.wrapping_add(bias[m]));
    let mut end = 0u64;
    for m in order {
        let (start, limit, _) = ranges[m];
        if start.wrapping_add(bias[m]) < end || start.checked_add(bias[m]).is_none() {
            bias[m] = end
                .div_ceil(ALIGN)
                .saturating_mul(ALIGN)
                .saturating_sub(start & !(ALIGN - 1));
        }
        end = end.max(limit.saturating_add(bias[m]));
    }
    bias
}

/// Write `p` as a gzip-compressed `profile.proto`.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    let bytes = profile(p).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}
