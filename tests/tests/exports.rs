//! `mslprof export` read back by each format's real consumer: callgrind_annotate (callgrind), the
//! checked-in prost types (pprof), the JSON schema (json, with boon), Graphviz `dot` (dot, svg) and GNU
//! gprof (gmon), on the three-module demo and on a dlopen/dlclose fixture; and gprof2dot reading the text
//! report. Counts are exact.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::process::Command;

use mslprof_analyzer::export::pprof::proto;
use mslprof_tests::analyzer::{build_demo, have, mslprof, mslprof_ok};
use mslprof_tests::{Workspace, assert_success, loader, run};
use prost::Message;

/// The demo built and run under the runtime: its workspace, with `gmon.out` in it.
fn profiled_demo() -> Option<Workspace> {
    profiled_demo_at(None)
}

/// [`profiled_demo`], sampled at `hz` samples per CPU-second (`MSLPROF_HZ`) when given, else at the default.
fn profiled_demo_at(hz: Option<u32>) -> Option<Workspace> {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return None;
    }
    let ws = Workspace::new();
    let demo = build_demo(&ws);
    let mut command = ws.command_with_runtime(&demo);
    if let Some(hz) = hz {
        command.env("MSLPROF_HZ", hz.to_string());
    }
    assert_success(&run(&mut command), "demo");
    Some(ws)
}

/// [`profiled_demo`] when `tool` is installed; `None` with a SKIPPED line naming its `package` otherwise.
fn profiled_demo_for(tool: &str, package: &str) -> Option<Workspace> {
    profiled_demo_for_at(tool, package, None)
}

/// [`profiled_demo_for`] sampled at `hz` ([`profiled_demo_at`]).
fn profiled_demo_for_at(tool: &str, package: &str, hz: Option<u32>) -> Option<Workspace> {
    if !have(tool) {
        eprintln!("SKIPPED: no `{tool}` ({package})");
        return None;
    }
    profiled_demo_at(hz)
}

/// reload.c: libalpha.so opened, used (alpha_work(3)), closed, opened again, used (alpha_work(5)), closed.
fn profiled_reload() -> Option<Workspace> {
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return None;
    }
    let ws = Workspace::new();
    loader::build_plugins(&ws);
    let app = ws.program("reload", &[loader::source("reload.c")], &["-pg", "-ldl"]);
    let mut cmd = ws.command_with_runtime(&app);
    cmd.arg(ws.join("libalpha.so"));
    assert_success(&run(&mut cmd), "reload");
    Some(ws)
}

/// The calls column of `name`'s line in mslprof's flat profile.
fn report_calls(dir: &Path, name: &str) -> u64 {
    let out = mslprof_ok(dir, &["-b", "-p"]);
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    report
        .lines()
        .find(|l| l.ends_with(&format!("  {name}")))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no call count for {name}:\n{report}"))
}

/// callgrind_annotate's calling tree: `(caller, callee) -> calls`, names as `file:function [object]`
/// reduced to `function [object file name]`. Every function is listed (`--threshold=100`, inclusive costs),
/// including those with no samples, so arcs between them are read too: a caller always has a `fn=` block,
/// which holds its `calls=` lines.
fn callgrind_callers(file: &Path) -> HashMap<(String, String), u64> {
    // From `/`: callgrind_annotate shortens `fl=` names under its working directory but not `cfi=` ones.
    let out = run(Command::new("callgrind_annotate")
        .current_dir("/")
        .args([
            "--tree=calling",
            "--threshold=100",
            "--inclusive=yes",
            "--auto=no",
        ])
        .arg(file));
    assert_success(&out, "callgrind_annotate");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let short = |s: &str| -> String {
        // "file:function [/path/obj]" -> "function [obj]"
        let (left, obj) = s.split_once(" [").unwrap_or((s, ""));
        let func = left.rsplit(':').next().unwrap_or(left);
        let obj = obj.trim_end_matches(']');
        format!("{func} [{}]", obj.rsplit('/').next().unwrap_or(obj))
    };
    let mut caller: Option<String> = None;
    let mut arcs = HashMap::new();
    for line in text.lines() {
        if let Some(i) = line.find("  *  ") {
            caller = Some(short(&line[i + 5..]));
        } else if let Some(i) = line.find("  >   ") {
            let rest = &line[i + 6..];
            let (name, tail) = rest.split_once(" (").expect("callee line");
            let count: u64 = tail
                .split_once("x)")
                .map(|(n, _)| n.replace(',', ""))
                .and_then(|n| n.parse().ok())
                .expect("call count");
            let obj = tail.split_once("x) ").map_or("", |(_, o)| o);
            let caller = caller
                .clone()
                .expect("a callee line follows its caller's line");
            arcs.insert((caller, short(&format!("{name} {obj}"))), count);
        } else if line.trim().is_empty() {
            caller = None;
        }
    }
    arcs
}

#[test]
fn callgrind_export_reads_back_in_callgrind_annotate() {
    let Some(ws) = profiled_demo_for("callgrind_annotate", "valgrind") else {
        return;
    };
    let out = mslprof_ok(ws.path(), &["export", "--format", "callgrind"]);
    let pid = ws.profile("gmon.out").header.pid;
    let file = ws.join(&format!("callgrind.out.{pid}"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("callgrind.out.{pid}")),
        "the default name is callgrind.out.PID"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# callgrind format");
    assert!(lines.contains(&"version: 1") && lines.contains(&"positions: instr line"));
    let events = lines.iter().position(|l| *l == "events: Samples").unwrap();
    assert!(
        lines[events + 1].starts_with("summary: "),
        "summary follows events"
    );
    // Every cfn= has its cob= right before it (with the cfi= between them).
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("cfn=") {
            assert!(lines[i - 2].starts_with("cob="), "line {i}: {l}");
        }
    }
    let arcs = callgrind_callers(&file);
    let arc = |caller: &str, callee: &str| {
        arcs.get(&(caller.to_string(), callee.to_string()))
            .copied()
            .unwrap_or_else(|| panic!("no arc {caller} -> {callee} in {arcs:#?}"))
    };
    assert_eq!(
        arc("main [demo]", "text_count_words [libtext.so]"),
        report_calls(ws.path(), "text_count_words")
    );
    assert_eq!(arc("main [demo]", "text_count_words [libtext.so]"), 200);
    assert_eq!(arc("main [demo]", "shapes_total_area [libshapes.so]"), 200);
    assert_eq!(
        arc("text_count_words [libtext.so]", "demo_score_word [demo]"),
        200 * 12 * 200 * 24
    );
    assert_eq!(arc("text_odd [libtext.so]", "text_even [libtext.so]"), 10);
    assert_eq!(
        arc("text_bad_recursion [libtext.so]", "text_even [libtext.so]"),
        1
    );
}

#[test]
fn callgrind_export_of_a_dlopen_run_counts_every_load_instance() {
    let Some(ws) = profiled_reload() else { return };
    if !have("callgrind_annotate") {
        eprintln!("SKIPPED: no `callgrind_annotate` (valgrind)");
        return;
    }
    mslprof_ok(
        ws.path(),
        &["export", "--format", "callgrind", "-o", "cg.out"],
    );
    let arcs = callgrind_callers(&ws.join("cg.out"));
    assert_eq!(
        arcs.get(&(
            "alpha_work [libalpha.so]".to_string(),
            "alpha_leaf [libalpha.so]".to_string()
        )),
        Some(&8),
        "{arcs:#?}"
    );
    assert_eq!(
        arcs.get(&(
            "once [reload]".to_string(),
            "alpha_work [libalpha.so]".to_string()
        )),
        Some(&2),
        "{arcs:#?}"
    );
}

fn validate_json(dir: &Path) -> serde_json::Value {
    let out = mslprof_ok(dir, &["export", "--format", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_follows_schema(&doc);
    doc
}

/// Checks `doc` against analyzer/schema/report.schema.json.
fn assert_follows_schema(doc: &serde_json::Value) {
    let schema =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../analyzer/schema/report.schema.json");
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    let id = compiler
        .compile(schema.to_str().unwrap(), &mut schemas)
        .unwrap_or_else(|e| panic!("the schema does not compile: {e}"));
    if let Err(e) = schemas.validate(doc, id) {
        panic!("the export does not follow the schema: {e:#}");
    }
    assert_eq!(doc["schema_version"], 2);
}

/// `(function name, module name) -> calls` of a JSON export (functions whose calls were counted).
fn json_calls(doc: &serde_json::Value) -> HashMap<(String, String), u64> {
    let modules = doc["modules"].as_array().unwrap();
    doc["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| {
            let m = f["module"].as_u64().unwrap() as usize;
            Some((
                (
                    f["name"].as_str().unwrap().to_string(),
                    modules[m]["name"].as_str().unwrap().to_string(),
                ),
                f["calls"].as_u64()?,
            ))
        })
        .collect()
}

#[test]
fn json_export_follows_its_schema_with_exact_counts() {
    let Some(ws) = profiled_demo() else { return };
    let doc = validate_json(ws.path());
    let calls = json_calls(&doc);
    let call = |f: &str, m: &str| calls.get(&(f.to_string(), m.to_string())).copied();
    assert_eq!(call("text_count_words", "libtext.so"), Some(200));
    assert_eq!(call("shapes_total_area", "libshapes.so"), Some(200));
    assert_eq!(call("demo_score_word", "demo"), Some(200 * 12 * 200 * 24));
    assert_eq!(call("text_even", "libtext.so"), Some(11));
    let profile = ws.profile("gmon.out");
    let modules = doc["modules"].as_array().unwrap();
    assert_eq!(modules.len(), profile.modules.len());
    for (m, j) in profile.modules.iter().zip(modules) {
        assert_eq!(j["path"], String::from_utf8_lossy(&m.path).as_ref());
        let hex: String = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(j["build_id"], hex);
        assert_eq!(j["samples"], m.samples);
    }
    assert_eq!(doc["header"]["pid"], profile.header.pid);
    assert_eq!(doc["header"]["total_samples"], profile.header.total_samples);
    // Every arc's count is the callee's calls when it has one caller.
    let functions = doc["functions"].as_array().unwrap();
    let arc = doc["arcs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| functions[a["callee"].as_u64().unwrap() as usize]["name"] == "text_count_words")
        .expect("arc into text_count_words");
    assert_eq!(
        functions[arc["caller"].as_u64().unwrap() as usize]["name"],
        "main"
    );
    assert_eq!(arc["count"], 200);
}

#[test]
fn json_export_of_two_dlopen_runs_sums_them() {
    let Some(ws) = profiled_reload() else { return };
    std::fs::copy(ws.join("gmon.out"), ws.join("second.out")).unwrap();
    let doc = validate_json(ws.path());
    let calls = json_calls(&doc);
    assert_eq!(
        calls.get(&("alpha_leaf".into(), "libalpha.so".into())),
        Some(&8)
    );
    assert_eq!(
        calls.get(&("alpha_setup".into(), "libalpha.so".into())),
        Some(&2)
    );
    let out = mslprof_ok(
        ws.path(),
        &["export", "--format", "json", "gmon.out", "second.out"],
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let calls = json_calls(&doc);
    assert_eq!(
        calls.get(&("alpha_leaf".into(), "libalpha.so".into())),
        Some(&16)
    );
    let alpha = doc["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "libalpha.so")
        .unwrap();
    assert_eq!(alpha["load_instances"], 4, "two instances per run");
}

fn decode_pprof(path: &Path) -> proto::Profile {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut bytes)
        .expect("gzip");
    proto::Profile::decode(bytes.as_slice()).expect("profile.proto")
}

/// `(leaf function, caller function or "") -> calls` of the two-frame (or caller-less) call samples.
fn pprof_calls(p: &proto::Profile) -> HashMap<(String, String), i64> {
    let s = |i: i64| p.string_table[i as usize].clone();
    let function_of = |loc: u64| {
        let l = &p.location[loc as usize - 1];
        assert_eq!(l.id, loc);
        let f = &p.function[l.line[0].function_id as usize - 1];
        s(f.name)
    };
    let mut calls = HashMap::new();
    for sample in &p.sample {
        if sample.value[2] == 0 {
            continue;
        }
        let callee = function_of(sample.location_id[0]);
        let caller = sample
            .location_id
            .get(1)
            .map(|&l| function_of(l))
            .unwrap_or_default();
        *calls.entry((callee, caller)).or_insert(0) += sample.value[2];
    }
    calls
}

#[test]
fn pprof_export_round_trips_through_the_proto_types() {
    let Some(ws) = profiled_demo() else { return };
    mslprof_ok(ws.path(), &["export", "--format", "pprof"]);
    let p = decode_pprof(&ws.join("profile.pb.gz"));
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(p.string_table[0], "");
    let types: Vec<_> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("samples", "count"),
            ("cpu", "nanoseconds"),
            ("calls", "count")
        ]
    );
    assert_eq!(s(p.default_sample_type), "cpu");
    let period = p.period_type.unwrap();
    assert_eq!((s(period.r#type), s(period.unit)), ("cpu", "nanoseconds"));
    let profile = ws.profile("gmon.out");
    assert_eq!(p.period as u64, profile.header.sample_period_ns);
    assert_eq!(p.mapping.len(), profile.modules.len());
    for (m, map) in profile.modules.iter().zip(&p.mapping) {
        assert_eq!(s(map.filename), String::from_utf8_lossy(&m.path));
        let hex: String = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(s(map.build_id), hex);
        assert!(map.has_functions);
    }
    let calls = pprof_calls(&p);
    let call = |callee: &str, caller: &str| calls.get(&(callee.to_string(), caller.to_string()));
    assert_eq!(call("text_count_words", "main"), Some(&200));
    assert_eq!(call("shapes_total_area", "main"), Some(&200));
    assert_eq!(
        call("demo_score_word", "text_count_words"),
        Some(&(200 * 12 * 200 * 24))
    );
    assert_eq!(call("text_even", "text_odd"), Some(&10));
    // Every sample of a module lands in the samples whose leaf is in that module's mapping: with stacks, one
    // sample per recorded stack; without, one-frame samples of the histogram (less the buckets outside any
    // function). A short run may leave a library without samples, so every module is checked and the run as a
    // whole must have some.
    let mut total = 0;
    for (module, map) in profile.modules.iter().zip(&p.mapping) {
        let leaf_in_module = |x: &&proto::Sample| {
            x.value[0] > 0
                && x.location_id
                    .first()
                    .is_some_and(|&l| p.location[l as usize - 1].mapping_id == map.id)
                && (profile.stacks.is_some() || x.location_id.len() == 1)
        };
        let samples_in_module: i64 = p
            .sample
            .iter()
            .filter(leaf_in_module)
            .map(|x| x.value[0])
            .sum();
        let expected = match &profile.stacks {
            Some(stacks) => stacks
                .records
                .iter()
                .filter(|r| r.frames[0].key == module.key)
                .map(|r| r.count)
                .sum(),
            None => mslprof_tests::histogram_total(module),
        };
        let name = String::from_utf8_lossy(&module.path);
        assert_eq!(samples_in_module as u64, expected, "samples in {name}");
        total += expected;
    }
    assert!(total > 0, "no sample in the run");
}

#[test]
fn pprof_export_of_a_dlopen_run() {
    let Some(ws) = profiled_reload() else { return };
    mslprof_ok(
        ws.path(),
        &["export", "--format", "pprof", "-o", "reload.pb.gz"],
    );
    let p = decode_pprof(&ws.join("reload.pb.gz"));
    let calls = pprof_calls(&p);
    assert_eq!(
        calls.get(&("alpha_leaf".into(), "alpha_work".into())),
        Some(&8)
    );
    assert_eq!(calls.get(&("alpha_work".into(), "once".into())), Some(&2));
}

fn dot_missing() -> bool {
    let missing = !Command::new("dot")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if missing {
        eprintln!("SKIPPED: Graphviz `dot` is not installed (apt-get install graphviz)");
    }
    missing
}

#[test]
fn dot_export_renders_with_graphviz() {
    let Some(ws) = profiled_demo() else { return };
    let out = mslprof_ok(
        ws.path(),
        &[
            "export",
            "--format",
            "dot",
            "--node-threshold",
            "0",
            "--edge-threshold",
            "0",
        ],
    );
    let dot = String::from_utf8_lossy(&out.stdout).into_owned();
    for module in ["demo", "libtext.so", "libshapes.so"] {
        assert!(
            dot.contains(&format!("label=\"{module}\";")),
            "cluster {module}:\n{dot}"
        );
    }
    assert!(dot.contains("subgraph cluster_"));
    // text_count_words → demo_score_word, with its exact count on the edge.
    assert!(
        dot.lines()
            .any(|l| l.contains(" -> ") && l.contains("\\n11520000×\"")),
        "{dot}"
    );
    if dot_missing() {
        return;
    }
    std::fs::write(ws.join("graph.dot"), &dot).unwrap();
    let svg = run(Command::new("dot")
        .args(["-Tsvg"])
        .arg(ws.join("graph.dot")));
    assert_success(&svg, "dot -Tsvg");
    let svg = String::from_utf8_lossy(&svg.stdout);
    assert!(svg.contains("<svg"), "{svg}");
    // Node and edge labels survive Graphviz: the exact call counts are printed.
    assert!(svg.contains("text_count_words"), "{svg}");
    assert!(svg.contains("11520000×"), "{svg}");
    assert!(svg.contains(">libtext.so<"), "{svg}");
    // The same graph rendered by mslprof itself. The thresholds are 0 here too: with the defaults (0.5 % and
    // 0.1 %), whether text_count_words and its edges are drawn depends on where the samples fell (a noisy CI
    // host left it out).
    mslprof_ok(
        ws.path(),
        &[
            "export",
            "--format",
            "svg",
            "--node-threshold",
            "0",
            "--edge-threshold",
            "0",
            "-o",
            "g.svg",
        ],
    );
    let direct = std::fs::read_to_string(ws.join("g.svg")).unwrap();
    assert!(direct.contains("<svg"), "{direct}");
    assert!(direct.contains("text_count_words"), "{direct}");
    assert!(direct.contains("11520000×"), "{direct}");
}

#[test]
fn dot_thresholds_leave_out_small_nodes() {
    let Some(ws) = profiled_demo() else { return };
    let all = mslprof_ok(
        ws.path(),
        &["export", "--format", "dot", "--node-threshold", "0"],
    );
    let none = mslprof_ok(
        ws.path(),
        &["export", "--format", "dot", "--node-threshold", "101"],
    );
    let all = String::from_utf8_lossy(&all.stdout);
    let none = String::from_utf8_lossy(&none.stdout);
    assert!(all.contains("text_even"), "{all}");
    assert!(
        !none.contains("text_even") && !none.contains("subgraph"),
        "{none}"
    );
}

#[test]
fn svg_without_graphviz_says_how_to_install_it() {
    let Some(ws) = profiled_demo() else { return };
    let out = run(Command::new(mslprof_tests::analyzer_binary())
        .current_dir(ws.path())
        .env("PATH", "/nonexistent")
        .args(["export", "--format", "svg"]));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("install graphviz"), "{err}");
}

#[test]
fn export_errors_name_the_file() {
    let ws = Workspace::new();
    std::fs::write(ws.join("junk"), b"not a profile").unwrap();
    for format in ["json", "callgrind", "pprof", "dot", "gmon"] {
        let out = mslprof(ws.path(), &["export", "--format", format, "junk"]);
        assert_eq!(out.status.code(), Some(1), "{format}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("mslprof: junk: "), "{format}: {err}");
    }
    let out = mslprof(ws.path(), &["export", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gmon.out"));
}

/// `function -> calls` from GNU gprof's flat profile (`-b -p`) of `module` with its exported `gmon`.
fn gprof_calls(dir: &Path, module: &str, gmon: &Path) -> HashMap<String, u64> {
    let out = run(Command::new("gprof")
        .current_dir(dir)
        .args(["-b", "-p", module])
        .arg(gmon));
    assert_success(&out, "gprof");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // % cumulative self calls self/call total/call name
            if f.len() != 7 {
                return None;
            }
            Some((f[6].to_string(), f[3].parse().ok()?))
        })
        .collect()
}

#[test]
fn gmon_export_keeps_cross_module_calls_for_gprof() {
    let Some(ws) = profiled_demo_for("gprof", "gprof") else {
        return;
    };
    let doc = validate_json(ws.path());
    let ours = json_calls(&doc);
    mslprof_ok(ws.path(), &["export", "--format", "gmon", "-o", "gnu"]);
    for module in ["demo", "libtext.so", "libshapes.so"] {
        let want: HashMap<String, u64> = ours
            .iter()
            .filter(|((_, m), calls)| m == module && **calls > 0)
            .map(|((f, _), c)| (f.clone(), *c))
            .collect();
        let gnu = ws.join(&format!("gnu/gmon.{module}.out"));
        let got = gprof_calls(ws.path(), module, &gnu);
        assert_eq!(got, want, "{module}: gprof's calls, then mslprof's");
    }
    // The calls from the program into the libraries are among them.
    let text = gprof_calls(ws.path(), "libtext.so", &ws.join("gnu/gmon.libtext.so.out"));
    assert_eq!(text.get("text_count_words"), Some(&200));
}

#[test]
fn gprof2dot_parses_the_text_call_graph() {
    let Some(ws) = profiled_demo() else { return };
    if !Command::new("gprof2dot")
        .arg("--help")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("SKIPPED: `gprof2dot` is not installed (pip install gprof2dot)");
        return;
    }
    let report = mslprof_ok(ws.path(), &[]);
    std::fs::write(ws.join("report.txt"), &report.stdout).unwrap();
    let out = run(Command::new("gprof2dot").current_dir(ws.path()).args([
        "-f",
        "prof",
        "-n",
        "0",
        "-e",
        "0",
        "report.txt",
    ]));
    assert_success(&out, "gprof2dot -f prof");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dot = String::from_utf8_lossy(&out.stdout);
    // gprof2dot labels nodes with the calls it parsed from the call graph: all three modules' functions
    // are there with their exact counts.
    for (function, calls) in [
        ("text_count_words", 200),
        ("shapes_total_area", 200),
        ("demo_score_word", 200 * 12 * 200 * 24),
    ] {
        let label = dot
            .lines()
            .find(|l| l.contains(&format!("label=\"{function}\\n")))
            .unwrap_or_else(|| panic!("no node {function}:\n{dot}"));
        assert!(label.contains(&format!("\\n{calls}×\"")), "{label}");
    }
    assert!(
        dot.contains("\\n200×\""),
        "an edge with main's 200 calls:\n{dot}"
    );
}

#[test]
fn gmon_export_makes_the_folder_it_is_given_but_never_its_parents() {
    let Some(ws) = profiled_demo() else { return };
    let output = mslprof(
        ws.path(),
        &["export", "--format", "gmon", "-o", "missing/deeper"],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        !ws.join("missing").exists(),
        "a parent folder was made: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    mslprof_ok(ws.path(), &["export", "--format", "gmon", "-o", "made"]);
    assert!(ws.join("made").is_dir());
}

/// Instruction starts of the ELF file at `path` as objdump decodes it, and those of `call` instructions.
fn instructions(path: &str) -> (HashSet<u64>, HashSet<u64>) {
    let out = run(Command::new("objdump").args(["-d", "--no-show-raw-insn", path]));
    assert_success(&out, "objdump -d");
    let (mut all, mut calls) = (HashSet::new(), HashSet::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((addr, rest)) = line.trim_start().split_once(":\t") else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        all.insert(addr);
        if rest.trim_start().starts_with("call") {
            calls.insert(addr);
        }
    }
    (all, calls)
}

/// A callgrind file's cost lines: `(object path, address, line, the call count when it is the cost of a call)`.
fn callgrind_costs(text: &str) -> Vec<(String, u64, u32, Option<u64>)> {
    let mut names: HashMap<String, String> = HashMap::new();
    let mut object = String::new();
    let mut after_calls = None;
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(ob) = line.strip_prefix("ob=").or(line.strip_prefix("cob=")) {
            // `(id) name` the first time, `(id)` later.
            let (id, name) = ob.split_once(' ').unwrap_or((ob, ""));
            if !name.is_empty() {
                names.insert(id.to_string(), name.to_string());
            }
            if line.starts_with("ob=") {
                object = names[id].clone();
            }
        } else if let Some(calls) = line.strip_prefix("calls=") {
            let count = calls.split(' ').next().and_then(|c| c.parse().ok());
            after_calls = Some(count.expect("calls=COUNT ..."));
        } else if let Some(rest) = line.strip_prefix("0x") {
            let f: Vec<&str> = rest.split(' ').collect();
            assert_eq!(f.len(), 3, "address, line, cost: {line}");
            out.push((
                object.clone(),
                u64::from_str_radix(f[0], 16).unwrap(),
                f[1].parse().unwrap(),
                after_calls,
            ));
            after_calls = None;
        }
    }
    out
}

#[test]
fn callgrind_costs_sit_on_whole_instructions_and_calls_on_their_call_instructions() {
    let Some(ws) = profiled_demo_for("objdump", "objdump") else {
        return;
    };
    mslprof_ok(
        ws.path(),
        &["export", "--format", "callgrind", "-o", "cg.out"],
    );
    let text = std::fs::read_to_string(ws.join("cg.out")).unwrap();
    let costs = callgrind_costs(&text);
    let mut decoded: HashMap<String, (HashSet<u64>, HashSet<u64>)> = HashMap::new();
    let (mut checked, mut calls, mut with_lines) = (0, 0, 0);
    for (object, addr, line, is_call) in &costs {
        // The demo's own modules: built here with -g, decoded by objdump (KCachegrind's "does not match
        // the profile" check is objdump's instruction list).
        if !["demo", "libtext.so", "libshapes.so"]
            .iter()
            .any(|m| object.ends_with(&format!("/{m}")))
        {
            continue;
        }
        let (all, call_sites) = decoded
            .entry(object.clone())
            .or_insert_with(|| instructions(object));
        assert!(
            all.contains(addr),
            "{object}: cost at {addr:#x}, not an instruction boundary"
        );
        if let Some(count) = is_call {
            // Counted calls are made from the demo's own code, built with -g (a sample, and so a call site
            // seen only on the sampled stacks, with count 0, may also be in code without lines: the PLT,
            // crt's start-up code).
            assert!(
                *line > 0 || *count == 0,
                "{object}: call at {addr:#x} has no source line"
            );
            assert!(
                call_sites.contains(addr),
                "{object}: call cost at {addr:#x}, not a call instruction"
            );
            calls += 1;
        } else if *line > 0 {
            with_lines += 1;
        }
        checked += 1;
    }
    // main's calls into both libraries and its own, text_count_words' callback, ...
    assert!(calls >= 6 && checked > calls, "{calls} calls of {checked}");
    assert!(with_lines > 0, "no sampled cost has a source line");
}

#[test]
fn callgrind_annotate_puts_calls_on_their_source_lines_without_a_warning() {
    // callgrind_annotate warns about a source file none of whose lines has a cost of its own ("Use of
    // uninitialized value $line_nums[0]"): at the default 100 Hz the demo's run has about 30 samples and
    // libtext.so's functions none in about one run in fifteen, so this run is sampled at 1 kHz.
    let Some(ws) = profiled_demo_for_at("callgrind_annotate", "valgrind", Some(1000)) else {
        return;
    };
    mslprof_ok(
        ws.path(),
        &["export", "--format", "callgrind", "-o", "cg.out"],
    );
    let out = run(Command::new("callgrind_annotate")
        .current_dir(ws.path())
        .args(["--auto=yes", "--threshold=100", "--context=40", "cg.out"]));
    assert_success(&out, "callgrind_annotate --auto=yes");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("-- Auto-annotated source: ") && text.contains("/demo.c"),
        "{text}"
    );
    // Each call of main is annotated under its own source line, with its exact count (the context shows
    // main whole: callgrind_annotate prints only lines near those with self costs).
    let lines: Vec<&str> = text.lines().collect();
    for (source, callee) in [
        (
            "area += shapes_total_area(60000);",
            "shapes.c:shapes_total_area (200x)",
        ),
        (
            "words += text_count_words(12);",
            "text.c:text_count_words (200x)",
        ),
    ] {
        let at = lines
            .iter()
            .position(|l| l.ends_with(source))
            .unwrap_or_else(|| panic!("no line {source}:\n{text}"));
        assert!(
            lines[at + 1].contains("=> ") && lines[at + 1].ends_with(callee),
            "after {source}: {}\n{text}",
            lines[at + 1]
        );
    }
}

fn have_go_pprof() -> bool {
    let ok = Command::new("go")
        .args(["tool", "pprof", "-h"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty() || !o.stderr.is_empty());
    if !ok {
        eprintln!("SKIPPED: no `go tool pprof` (apt-get install golang-go)");
    }
    ok
}

#[test]
fn go_tool_pprof_lists_source_lines_and_totals_in_time() {
    let Some(ws) = profiled_demo() else { return };
    if !have_go_pprof() {
        return;
    }
    mslprof_ok(ws.path(), &["export", "--format", "pprof"]);
    let pprof = |args: &[&str]| go_pprof(&ws, args, Path::new("profile.pb.gz"));
    let top = pprof(&["-top"]);
    let total = top
        .lines()
        .find_map(|l| l.split_once("Total samples = "))
        .map(|(_, t)| t.split_whitespace().next().unwrap().to_string())
        .unwrap_or_else(|| panic!("{top}"));
    assert!(
        ["ms", "s", "us", "mins"].iter().any(|u| total
            .strip_suffix(u)
            .is_some_and(|n| n.parse::<f64>().is_ok())),
        "a total in time: {total}\n{top}"
    );
    // The calls, listed at main's source lines.
    let list = pprof(&["-sample_index=calls", "-list", "^main$"]);
    for source in [
        "area += shapes_total_area(60000);",
        "words += text_count_words(12);",
    ] {
        let line = list
            .lines()
            .find(|l| l.ends_with(source))
            .unwrap_or_else(|| panic!("no line {source}:\n{list}"));
        let cum: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cum[1], "200", "{line}\n{list}");
    }
}

#[test]
fn json_export_tells_not_counted_from_zero_and_gives_sources_and_cpu_time() {
    let Some(ws) = profiled_demo() else { return };
    let doc = validate_json(ws.path());
    let functions = doc["functions"].as_array().unwrap();
    let function = |name: &str| {
        functions
            .iter()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // libc's caller of main is not built with -pg: its calls were not counted.
    let start = function("__libc_start_call_main");
    assert!(start["calls"].is_null(), "{start}");
    let words = function("text_count_words");
    assert_eq!(words["calls"], 200);
    assert_eq!(words["calls_at_plt_only"], false);
    assert!(
        words["file"]
            .as_str()
            .unwrap()
            .ends_with("analyzer/demo/text.c"),
        "{words}"
    );
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../analyzer/demo/text.c"),
    )
    .unwrap();
    let line = words["line"].as_u64().unwrap() as usize;
    assert!(
        source
            .lines()
            .nth(line - 1)
            .unwrap()
            .contains("text_count_words("),
        "line {line}"
    );
    let profile = ws.profile("gmon.out");
    let cpu = profile
        .header
        .cpu_time
        .expect("the runtime records CPU time");
    assert_eq!(doc["header"]["user_time_ns"], cpu.user_ns);
    assert_eq!(doc["header"]["system_time_ns"], cpu.system_ns);
    let runtime = doc["modules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "libmslprof.so")
        .expect("libmslprof.so");
    assert_eq!(runtime["profiling_overhead"], true);
}

#[test]
fn dot_label_gives_seconds_and_no_count_where_none_was_counted() {
    let Some(ws) = profiled_demo() else { return };
    let out = mslprof_ok(
        ws.path(),
        &["export", "--format", "dot", "--node-threshold", "0"],
    );
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(dot.contains(" s of CPU time ("), "{dot}");
    let node = dot
        .lines()
        .find(|l| l.contains("label=\"__libc_start_call_main\\n"))
        .unwrap_or_else(|| panic!("{dot}"));
    assert!(!node.contains('×'), "{node}");
    let few = mslprof_ok(
        ws.path(),
        &[
            "export",
            "--format",
            "dot",
            "--node-threshold",
            "0",
            "--max-nodes",
            "3",
        ],
    );
    let few = String::from_utf8_lossy(&few.stdout);
    let nodes = few.lines().filter(|l| l.starts_with("    f")).count();
    assert_eq!(nodes, 3, "{few}");
    assert!(
        few.contains("3 of ") && few.contains("the largest 3"),
        "{few}"
    );
}

#[test]
fn gmon_export_writes_only_files_gprof_reads() {
    let Some(ws) = profiled_demo_for("gprof", "gprof") else {
        return;
    };
    let out = mslprof_ok(ws.path(), &["export", "--format", "gmon", "-o", "gnu"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut files = 0;
    for line in stdout.lines() {
        let args: Vec<&str> = line.split(' ').collect();
        assert_eq!(args[0], "gprof", "{line}");
        let gprof = run(Command::new("gprof")
            .current_dir(ws.path())
            .arg("-b")
            .args(&args[1..]));
        assert_success(&gprof, line);
        files += 1;
    }
    assert_eq!(files, 3, "demo, libtext.so, libshapes.so:\n{stdout}");
    assert!(!ws.join("gnu/gmon.libmslprof.so.out").exists());
    // Asked for, the profiler's own module is written too.
    let out = mslprof_ok(
        ws.path(),
        &[
            "export",
            "--format",
            "gmon",
            "--profiler-modules",
            "-o",
            "all",
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("libmslprof.so"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for format in ["gmon", "png"] {
        let out = mslprof(ws.path(), &["export", "--format", format, "-o", "-"]);
        assert_eq!(out.status.code(), Some(1), "{format}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot be written to standard output"),
            "{err}"
        );
        assert!(!ws.join("-").exists(), "{format}: a file or folder named -");
    }
}

/// The GNU gprof manual's counter-example ("Estimating children Times"): `a` calls `foo(0)`, which returns
/// at once, 1000 times; `b` calls `foo(1)`, which loops, 20 times.
const COUNTER_EXAMPLE: &str = r#"
static volatile double sink;
__attribute__((noinline)) void foo(int n) { if (!n) return; for (long i = 0; i < 20000; i++) sink += i; }
__attribute__((noinline)) void a(void) { for (int i = 0; i < 1000; i++) foo(0); }
__attribute__((noinline)) void b(void) { for (int i = 0; i < 20; i++) foo(1); }
int main(void) { a(); b(); return 0; }
"#;

/// The counter-example built with -pg and run under the runtime, its profile summed as the exports sum it,
/// with sampled stacks put in: its real call counts and return addresses, and stacks whose counts the test
/// chooses (the histograms emptied, so every time the exports write comes from these stacks).
///
/// | samples | stack (root first) |
/// |---|---|
/// | 26 | main → b → foo |
/// | 3 | main → a → foo |
/// | 4 | main → a |
/// | 2 | main |
/// | 1 | [no module] → main → a |
/// | 1 | b → foo, truncated (the walk stopped under b) |
fn counter_example_with_stacks() -> Option<(Workspace, mslprof_analyzer::export::Prepared)> {
    use mslprof_format::LinkAddress;
    use mslprof_format::model::{
        Buckets, StackFrame, StackRecord, Stacks, UNKNOWN_KEY, stack_flags,
    };
    use object::{Object, ObjectSymbol};
    if !have("cc") {
        eprintln!("SKIPPED: no `cc`");
        return None;
    }
    let ws = Workspace::new();
    let source = ws.join("counter.c");
    std::fs::write(&source, COUNTER_EXAMPLE).unwrap();
    let program = ws.program("counter", &[source], &["-pg"]);
    // The profile on disk has no stacks (the runtime records none at depth 0); this helper adds its own.
    assert_success(
        &run(ws
            .command_with_runtime(&program)
            .env("MSLPROF_STACK_DEPTH", "0")),
        "counter",
    );
    let path = ws.join("gmon.out");
    let input = mslprof_analyzer::input::Input {
        profile: ws.profile("gmon.out"),
        path,
        records: None,
    };
    let mut merged = mslprof_analyzer::merge::merge(&[input], false).expect("merge");
    let main_index = merged
        .profile
        .modules
        .iter()
        .position(|m| m.is_main_program())
        .expect("the main program");
    let key = main_index as u32 + 1;
    // Function ranges of the program, to name the recorded arcs' ends.
    let elf = std::fs::read(&program).unwrap();
    let file = object::File::parse(&*elf).unwrap();
    let range = |name: &str| {
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("no symbol {name}"));
        (sym.address(), sym.address() + sym.size())
    };
    let inside = |name: &str, address: u64| {
        let (start, end) = range(name);
        (start..end).contains(&address)
    };
    let module = &mut merged.profile.modules[main_index];
    let return_address = |caller: &str, callee: &str| {
        module
            .arcs
            .iter()
            .find(|arc| {
                arc.caller_key == key
                    && inside(caller, arc.caller_address.0 - 1)
                    && inside(callee, arc.callee_address.0)
            })
            .unwrap_or_else(|| panic!("no recorded call {caller} -> {callee}"))
            .caller_address
            .0
    };
    let (main_a, main_b) = (return_address("main", "a"), return_address("main", "b"));
    let (a_foo, b_foo) = (return_address("a", "foo"), return_address("b", "foo"));
    for h in module.histogram.iter_mut() {
        for r in &mut h.ranges {
            r.buckets = Buckets::Sparse {
                len: r.buckets.len(),
                entries: Vec::new(),
            };
        }
    }
    let frame = |address: u64| StackFrame {
        key,
        address: LinkAddress(address),
    };
    let unknown = StackFrame {
        key: UNKNOWN_KEY,
        address: LinkAddress(0),
    };
    let (in_foo, in_a, in_main) = (range("foo").0, range("a").0, range("main").0);
    let record = |count: u64, flags: u32, frames: Vec<StackFrame>| StackRecord {
        count,
        flags,
        frames,
    };
    merged.profile.stacks = Some(Stacks {
        max_depth: 128,
        dropped: 0,
        records: vec![
            record(26, 0, vec![frame(in_foo), frame(b_foo), frame(main_b)]),
            record(3, 0, vec![frame(in_foo), frame(a_foo), frame(main_a)]),
            record(4, 0, vec![frame(in_a), frame(main_a)]),
            record(2, 0, vec![frame(in_main)]),
            record(1, 0, vec![frame(in_a), frame(main_a), unknown]),
            record(
                1,
                stack_flags::TRUNCATED_UNWIND,
                vec![frame(in_foo), frame(b_foo)],
            ),
        ],
    });
    let prepared = mslprof_analyzer::export::Prepared::new(merged);
    Some((ws, prepared))
}

/// [`counter_example_with_stacks`] exported by `write` into the file `name` of its workspace.
fn counter_example_exported(
    name: &str,
    write: fn(&mslprof_analyzer::export::Prepared, &mut dyn std::io::Write) -> std::io::Result<()>,
) -> Option<(
    Workspace,
    mslprof_analyzer::export::Prepared,
    std::path::PathBuf,
)> {
    let (ws, p) = counter_example_with_stacks()?;
    let mut bytes = Vec::new();
    write(&p, &mut bytes).expect("export");
    let path = ws.join(name);
    std::fs::write(&path, bytes).unwrap();
    Some((ws, p, path))
}

#[test]
fn folded_stacks_are_one_sorted_line_per_stack() {
    let Some((_ws, p)) = counter_example_with_stacks() else {
        return;
    };
    let lines = mslprof_analyzer::export::folded::lines(&p).expect("stacks");
    assert_eq!(
        lines,
        [
            "[truncated];b;foo 1",
            "[unknown];main;a 1",
            "main 2",
            "main;a 4",
            "main;a;foo 3",
            "main;b;foo 26",
        ]
    );
}

#[test]
fn folded_and_flamegraph_need_stacks_and_say_so() {
    let Some((ws, _)) = counter_example_with_stacks() else {
        return;
    };
    for format in ["folded", "flamegraph"] {
        let out = mslprof(ws.path(), &["export", "--format", format, "gmon.out"]);
        assert_eq!(out.status.code(), Some(1), "{format}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("gmon.out: no sampled call stacks"),
            "{format}: {stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn flamegraph_is_an_svg_naming_every_function_with_its_samples() {
    let Some((_ws, p)) = counter_example_with_stacks() else {
        return;
    };
    let mut svg = Vec::new();
    mslprof_analyzer::export::flamegraph::write(&p, &mut svg).expect("flame graph");
    let mut reader = quick_xml::Reader::from_reader(svg.as_slice());
    let mut buf = Vec::new();
    let (mut in_title, mut titles, mut root) = (false, Vec::new(), None);
    loop {
        match reader.read_event_into(&mut buf).expect("well-formed XML") {
            quick_xml::events::Event::Start(e) => {
                let name = String::from_utf8_lossy(e.name().as_ref()).into_owned();
                root.get_or_insert(name.clone());
                in_title = name == "title";
            }
            quick_xml::events::Event::Text(t) if in_title => {
                titles.push(String::from_utf8_lossy(&t).into_owned());
            }
            quick_xml::events::Event::End(_) => in_title = false,
            quick_xml::events::Event::Eof => break,
            _ => {}
        }
        buf.clear();
    }
    assert_eq!(root.as_deref(), Some("svg"));
    // Each frame's tooltip: `NAME (N samples, P%)`, the frames of one name merged per parent.
    for want in [
        "all (37 samples, 100%)",
        "main (35 samples, 94.59%)",
        "b (26 samples, 70.27%)",
        "foo (26 samples, 70.27%)",
        "a (7 samples, 18.92%)",
        "foo (3 samples, 8.11%)",
        "[truncated] (1 samples, 2.70%)",
        "[unknown] (1 samples, 2.70%)",
    ] {
        assert!(titles.iter().any(|t| t == want), "no {want}: {titles:?}");
    }
}

/// `go tool pprof ARGS FILE` in `ws`, its standard output.
fn go_pprof(ws: &Workspace, args: &[&str], file: &Path) -> String {
    let out = run(Command::new("go")
        .current_dir(ws.path())
        .env("HOME", ws.path())
        .env("PPROF_TMPDIR", ws.path())
        .env("GOCACHE", ws.join("gocache"))
        .args(["tool", "pprof"])
        .args(args)
        .arg(file));
    assert_success(&out, &format!("go tool pprof {args:?}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pprof_with_stacks_shows_callers_and_cumulative_time_in_go_tool_pprof() {
    let Some((ws, p, file)) =
        counter_example_exported("stacks.pb.gz", mslprof_analyzer::export::pprof::write)
    else {
        return;
    };
    // The stacks as samples, leaf first; the exact call counts as before.
    let decoded = decode_pprof(&file);
    let calls = pprof_calls(&decoded);
    assert_eq!(calls.get(&("foo".into(), "a".into())), Some(&1000));
    assert_eq!(calls.get(&("foo".into(), "b".into())), Some(&20));
    let time: Vec<_> = decoded.sample.iter().filter(|s| s.value[0] > 0).collect();
    assert_eq!(time.len(), 6);
    let period = p.period_ns() as i64;
    assert!(time.iter().all(|s| s.value[1] == s.value[0] * period));
    if !have_go_pprof() {
        return;
    }
    // -top in samples: `flat flat% sum% cum cum% name`.
    let top = go_pprof(&ws, &["-top", "-sample_index=samples"], &file);
    let row = |name: &str| -> (String, String) {
        let cols: Vec<&str> = top
            .lines()
            .map(str::split_whitespace)
            .map(Iterator::collect::<Vec<_>>)
            .find(|c| c.len() == 6 && c[5] == name)
            .unwrap_or_else(|| panic!("no row {name}:\n{top}"));
        (cols[0].to_string(), cols[3].to_string())
    };
    assert_eq!(row("main"), ("2".into(), "36".into()), "{top}");
    assert_eq!(row("b"), ("0".into(), "27".into()), "{top}");
    assert_eq!(row("a"), ("5".into(), "8".into()), "{top}");
    assert_eq!(row("foo"), ("30".into(), "30".into()), "{top}");
    // -peek: foo's callers above it, with the samples under each.
    let peek = go_pprof(&ws, &["-peek", "^foo$", "-sample_index=samples"], &file);
    let callers: Vec<(String, String)> = peek
        .lines()
        .take_while(|l| !l.trim_end().ends_with("| foo"))
        .filter_map(|l| {
            let (left, name) = l.rsplit_once("| ")?;
            Some((
                name.trim().to_string(),
                left.split_whitespace().next()?.to_string(),
            ))
        })
        .filter(|(name, _)| ["a", "b"].contains(&name.as_str()))
        .collect();
    assert_eq!(
        callers,
        [
            ("b".to_string(), "27".to_string()),
            ("a".to_string(), "3".to_string())
        ],
        "{peek}"
    );
    // -tree: main's callees with their cumulative samples.
    let tree = go_pprof(&ws, &["-tree", "-sample_index=samples"], &file);
    assert!(
        tree.lines().any(|l| l.trim_end().ends_with("| b")),
        "{tree}"
    );
}

#[test]
fn callgrind_with_stacks_gives_measured_inclusive_costs_to_callgrind_annotate() {
    if !have("callgrind_annotate") {
        eprintln!("SKIPPED: no `callgrind_annotate` (valgrind)");
        return;
    }
    let Some((_ws, _, file)) = counter_example_exported(
        "callgrind.out.1",
        mslprof_analyzer::export::callgrind::write,
    ) else {
        return;
    };
    // The recorded counts as before.
    let calls = callgrind_callers(&file);
    for (caller, count) in [("b", 20), ("a", 1000)] {
        let arc = (format!("{caller} [counter]"), "foo [counter]".to_string());
        assert_eq!(calls.get(&arc), Some(&count), "{caller}");
    }
    // callgrind_annotate's inclusive cost of a function is its self cost (none here: the histogram is
    // empty) and the costs of the calls into it, which are the samples measured under each call site:
    // foo 3 under a and 27 under b (26 below main, 1 in the truncated stack), b 26 and a 8 under main.
    let out = run(Command::new("callgrind_annotate")
        .current_dir("/")
        .args(["--inclusive=yes", "--threshold=100", "--auto=no"])
        .arg(&file));
    assert_success(&out, "callgrind_annotate --inclusive=yes");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let inclusive = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.contains(&format!(":{name} [")))
            .and_then(|l| l.split_whitespace().next())
            .map(|n| n.replace(',', "").parse().unwrap())
            .unwrap_or_else(|| panic!("no line for {name}:\n{text}"))
    };
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(inclusive("foo"), 30, "{text}\n{written}");
    assert_eq!(inclusive("b"), 26, "{text}\n{written}");
    assert_eq!(inclusive("a"), 8, "{text}\n{written}");
    // The cost lines themselves: the measured samples at each call instruction.
    for (caller, cost) in [("a", 3), ("b", 27)] {
        let block = written
            .split("\n\n")
            .find(|b| b.contains(&format!(") {caller}\n")))
            .unwrap_or_else(|| panic!("no block for {caller}:\n{written}"));
        let last = block.lines().last().unwrap();
        assert!(
            last.ends_with(&format!(" {cost}")),
            "{caller}: {last}\n{written}"
        );
    }
}

#[test]
fn json_with_stacks_gives_measured_totals_beside_the_estimates() {
    let Some((_ws, p)) = counter_example_with_stacks() else {
        return;
    };
    let doc = mslprof_analyzer::export::json::document(&p);
    assert_follows_schema(&doc);
    let functions = doc["functions"].as_array().unwrap();
    let index = |name: &str| {
        functions
            .iter()
            .position(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    // Seconds of n samples as every export states them: n × period in ns / 1e9 (dividing the period first
    // rounds differently for a period such as a real run's).
    let seconds = |samples: u64| samples as f64 * p.period_ns() as f64 / 1e9;
    for (name, total, own) in [("main", 36, 2), ("a", 8, 5), ("b", 27, 0), ("foo", 30, 30)] {
        let f = &functions[index(name)];
        assert_eq!(f["measured_total_samples"], total, "{name}");
        assert_eq!(f["measured_self_samples"], own, "{name}");
        assert_eq!(f["measured_total_seconds"], seconds(total), "{name}");
        assert_eq!(f["total_samples_estimated"], true);
    }
    let arc = |caller: &str, callee: &str| {
        let (from, to) = (index(caller), index(callee));
        doc["arcs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["caller"] == from && a["callee"] == to)
            .unwrap_or_else(|| panic!("no arc {caller} -> {callee}"))
            .clone()
    };
    assert_eq!(arc("b", "foo")["measured_samples"], 27);
    assert_eq!(arc("b", "foo")["measured_callee_self_samples"], 27);
    assert_eq!(arc("a", "foo")["measured_samples"], 3);
    assert_eq!(arc("a", "foo")["count"], 1000);
    assert_eq!(arc("main", "b")["measured_samples"], 26);
    assert_eq!(doc["stacks"]["samples"], 37);
    assert_eq!(doc["stacks"]["truncated_samples"], 1);
    assert_eq!(doc["stacks"]["distinct"], 6);
}
