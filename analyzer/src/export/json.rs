//! The JSON export: modules, functions, arcs and the profile header as one document that follows
//! `analyzer/schema/report.schema.json` (`"schema_version": 2`). Profiles with sampled stacks add the
//! measured figures: a `stacks` summary, per function inclusive and self samples and seconds, per arc the
//! samples under it, and arcs seen only on the stacks (`"count": null`).

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
        let mut function = json!({
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
        });
        if let Some(m) = &p.measured {
            let fields = function.as_object_mut().expect("an object");
            for (key, samples) in [("total", m.total[s]), ("self", m.leaf[s])] {
                fields.insert(format!("measured_{key}_samples"), json!(samples));
                fields.insert(format!("measured_{key}_seconds"), json!(p.seconds(samples)));
            }
        }
        functions.push(function);
    }
    let measured_arc = |arc: &mut Value, caller: usize, callee: usize| {
        let Some(m) = &p.measured else { return };
        let pair = m.pairs.get(&(caller, callee)).copied().unwrap_or_default();
        let fields = arc.as_object_mut().expect("an object");
        fields.insert("measured_samples".into(), json!(pair.total));
        fields.insert("measured_seconds".into(), json!(p.seconds(pair.total)));
        fields.insert(
            "measured_callee_self_samples".into(),
            json!(pair.callee_self),
        );
    };
    let mut arcs: Vec<Value> = g
        .arcs
        .iter()
        .filter_map(|a| {
            let mut arc = json!({
                "caller": index.get(&a.parent)?,
                "callee": index.get(&a.child)?,
                "count": a.count,
            });
            measured_arc(&mut arc, a.parent, a.child);
            Some(arc)
        })
        .collect();
    // Pairs seen only on the stacks: their calls were not counted.
    let mut stack_only: Vec<(usize, usize)> = p
        .measured
        .iter()
        .flat_map(|m| m.pairs.keys())
        .filter(|pair| !g.arc_index.contains_key(pair))
        .copied()
        .collect();
    stack_only.sort_unstable();
    for (caller, callee) in stack_only {
        let (Some(from), Some(to)) = (index.get(&caller), index.get(&callee)) else {
            continue;
        };
        let mut arc = json!({ "caller": from, "callee": to, "count": null });
        measured_arc(&mut arc, caller, callee);
        arcs.push(arc);
    }
    let mut doc = json!({
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
    });
    if let Some(stacks) = p.stacks() {
        let truncated = stacks
            .stacks
            .iter()
            .filter(|s| s.is_truncated())
            .fold(0u64, |n, s| n.saturating_add(s.count));
        doc.as_object_mut().expect("an object").insert(
            "stacks".into(),
            json!({
                "samples": stacks.samples,
                "seconds": p.seconds(stacks.samples),
                "distinct": stacks.stacks.len(),
                "truncated_samples": truncated,
                "dropped_samples": stacks.dropped,
                "max_depth": stacks.max_depth,
            }),
        );
    }
    doc
}

/// Write `p` as pretty-printed JSON.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, &document(p))?;
    writeln!(out)
}
