//! pprof's gzip-compressed `profile.proto`: sample types `samples/count` and `calls/count`, the real
//! sampling period in `cpu/nanoseconds`, one `Mapping` per module (path, GNU build-id). A histogram
//! bucket becomes a one-frame sample at its link-time address; an arc becomes a two-frame sample
//! `[callee entry, call site]` whose value is the call count (a caller outside any known function
//! gives a one-frame sample).

pub mod proto;

use std::collections::HashMap;
use std::io::{self, Write};

use mslprof_format::LinkAddress;
use mslprof_format::model::UNKNOWN_KEY;
use prost::Message as _;

use super::Prepared;
use proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

/// Strings, functions and locations numbered as they are first used.
struct Builder<'a> {
    p: &'a Prepared,
    out: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<usize, u64>,
    locations: HashMap<(usize, LinkAddress), u64>,
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

    fn function(&mut self, s: usize) -> u64 {
        if let Some(&id) = self.functions.get(&s) {
            return id;
        }
        let sym = &self.p.analysis.graph.syms[s];
        let (display, raw) = (sym.display.clone(), sym.symbol.name.clone());
        let file = sym.symbol.file.clone().unwrap_or_default();
        let line = i64::from(sym.symbol.line);
        let id = self.out.function.len() as u64 + 1;
        let f = Function {
            id,
            name: self.string(&display),
            system_name: self.string(&raw),
            filename: self.string(&file),
            start_line: line,
        };
        self.out.function.push(f);
        self.functions.insert(s, id);
        id
    }

    /// The location of `address` in module `m`, in function `s`.
    fn location(&mut self, m: usize, address: LinkAddress, s: usize) -> u64 {
        if let Some(&id) = self.locations.get(&(m, address)) {
            return id;
        }
        let function_id = self.function(s);
        let id = self.out.location.len() as u64 + 1;
        self.out.location.push(Location {
            id,
            mapping_id: m as u64 + 1,
            address: address.0,
            line: vec![Line {
                function_id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
        self.locations.insert((m, address), id);
        id
    }
}

/// The profile message for `p`.
pub fn profile(p: &Prepared) -> Profile {
    let mut b = Builder {
        p,
        out: Profile::default(),
        strings: HashMap::new(),
        functions: HashMap::new(),
        locations: HashMap::new(),
    };
    b.string("");
    let samples = ValueType {
        r#type: b.string("samples"),
        unit: b.string("count"),
    };
    let calls = ValueType {
        r#type: b.string("calls"),
        unit: b.string("count"),
    };
    b.out.sample_type = vec![samples, calls];
    b.out.default_sample_type = samples.r#type;
    b.out.period_type = Some(ValueType {
        r#type: b.string("cpu"),
        unit: b.string("nanoseconds"),
    });
    b.out.period = p.period_ns() as i64;
    let h = &p.profile.header;
    b.out.time_nanos = h.start_time_ns;
    b.out.duration_nanos = (h.end_time_ns - h.start_time_ns).max(0);
    let g = &p.analysis.graph;
    for (m, module) in p.profile.modules.iter().enumerate() {
        let limit = g.modules[m]
            .syms
            .clone()
            .map(|s| g.syms[s].symbol.end_addr.0.saturating_add(1))
            .max()
            .unwrap_or(0);
        let path = String::from_utf8_lossy(&module.path).into_owned();
        let mapping = Mapping {
            id: m as u64 + 1,
            memory_start: 0,
            memory_limit: limit,
            file_offset: 0,
            filename: b.string(&path),
            build_id: b.string(&p.build_id(m)),
            has_functions: true,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        };
        b.out.mapping.push(mapping);
    }
    for (m, module) in p.profile.modules.iter().enumerate() {
        if let Some(hist) = &module.histogram {
            for r in &hist.ranges {
                let width = (r.end - r.start) / r.buckets.len().max(1);
                for (i, count) in r.buckets.nonzero() {
                    let addr = r.start + i * width;
                    let Some(s) = g.lookup(m, addr) else { continue };
                    let loc = b.location(m, addr, s);
                    b.out.sample.push(Sample {
                        location_id: vec![loc],
                        value: vec![i64::from(count), 0],
                        label: Vec::new(),
                    });
                }
            }
        }
        for a in &module.arcs {
            let Some(callee) = g.lookup(m, a.callee_address) else {
                continue;
            };
            let entry = g.syms[callee].symbol.addr;
            let mut frames = vec![b.location(m, entry, callee)];
            if a.caller_key != UNKNOWN_KEY {
                let cm = a.caller_key as usize - 1;
                if let Some(caller) = g.lookup(cm, a.caller_address) {
                    frames.push(b.location(cm, a.caller_address, caller));
                }
            }
            b.out.sample.push(Sample {
                location_id: frames,
                value: vec![0, a.count as i64],
                label: Vec::new(),
            });
        }
    }
    b.out
}

/// Write `p` as a gzip-compressed `profile.proto`.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    let bytes = profile(p).encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}
