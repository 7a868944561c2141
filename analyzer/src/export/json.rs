//! The JSON export: modules, functions, arcs and the profile header as one document that follows
//! `analyzer/schema/report.schema.json` (`"schema_version": 2`).

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::{Value, json};

use super::Prepared;

/// The schema version written as `schema_version`; raised when a field changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 2;

/// The JSON Schema the output follows.
pub const SCHEMA: &str = include_str!("../../schema/report.schema.json");

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The document for `p`.
pub fn document(p: &Prepared) -> Value {
    let g = &p.analysis.graph;
    let h = &p.profile.header;
    let modules: Vec<Value> = p
        .profile
        .modules
        .iter()
        .enumerate()
        .map(|(i, m)| {
            json!({
                "index": i,
                "name": g.modules[i].name,
                "path": text(&m.path),
                "build_id": p.build_id(i),
                "profiled": m.is_profiled(),
                "main_program": m.is_main_program(),
                "load_instances": p.instances[i],
                "bucket_width": p.bucket_width(i),
                "samples": m.samples,
                "profiling_overhead": p.is_profiler(i),
                "calls_counted_at_plt_only": g.modules[i].plt_counted,
            })
        })
        .collect();
    let code = p.code();
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut functions = Vec::new();
    for s in p.active_functions() {
        let sym = &g.syms[s];
        index.insert(s, functions.len());
        let (file, line) = match (
            &sym.symbol.file,
            code[sym.module].position(sym.symbol.addr.0),
        ) {
            (Some(f), _) if sym.symbol.line > 0 => (Some(f.clone()), Some(sym.symbol.line)),
            (_, Some((f, l))) => (Some(f.to_string()), (l > 0).then_some(l)),
            (f, None) => (f.clone(), None),
        };
        let calls = p.calls(s);
        functions.push(json!({
            "name": sym.display,
            "symbol": sym.symbol.name,
            "module": sym.module,
            "address": sym.symbol.addr.0,
            "self_samples": p.self_samples(s),
            "total_samples": p.total_samples(s),
            "total_samples_estimated": true,
            "calls": calls,
            "calls_at_plt_only": calls.is_some() && g.modules[sym.module].plt_counted,
            "file": file,
            "line": line,
        }));
    }
    let arcs: Vec<Value> = g
        .arcs
        .iter()
        .filter_map(|a| {
            Some(json!({
                "caller": index.get(&a.parent)?,
                "callee": index.get(&a.child)?,
                "count": a.count,
            }))
        })
        .collect();
    json!({
        "schema_version": SCHEMA_VERSION,
        "creator": format!("mslprof {}", env!("CARGO_PKG_VERSION")),
        "header": {
            "pid": h.pid,
            "ppid": h.ppid,
            "program_name": text(&h.program_name),
            "program_path": text(&h.program_path),
            "hz": h.hz,
            "sample_period_ns": p.period_ns(),
            "start_time_ns": h.start_time_ns,
            "end_time_ns": h.end_time_ns,
            "total_samples": h.total_samples,
            "unknown_samples": h.unknown_samples,
            "dropped_samples": h.dropped_samples,
            "dropped_arcs": h.dropped_arcs,
            "incomplete": h.flags & mslprof_format::model::header_flags::INCOMPLETE != 0,
            "user_time_ns": h.cpu_time.map(|c| c.user_ns),
            "system_time_ns": h.cpu_time.map(|c| c.system_ns),
        },
        "modules": modules,
        "functions": functions,
        "arcs": arcs,
        "warnings": p.warnings,
    })
}

/// Write `p` as pretty-printed JSON.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &document(p))?;
    writeln!(out)
}
