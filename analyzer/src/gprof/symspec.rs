//! Symbol specifications (gprof's "symspecs") and the include/exclude tables built from them.
//!
//! A symspec is, as in GNU gprof: `funcname`, `file.c` (contains a dot), `file.c:funcname`,
//! `file.c:123` (the function whose first line is 123), or `123`. File names compare by their last path
//! component. Names compare with the symbol-table (mangled) name. mslprof adds module qualifiers:
//! `funcname@libfoo.so` selects `funcname` in that module only, and `libfoo.so:` (a module name before
//! an empty function part) selects every function of the module. A module is named by its file name,
//! its file name without the version suffix after `.so`, or `a.out` for the main program.

use std::collections::HashSet;

use crate::gprof::graph::Graph;

/// Which table a symspec goes to (gprof's `INCL_FLAT` … `EXCL_ARCS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    InclFlat,
    ExclFlat,
    InclGraph,
    ExclGraph,
    InclTime,
    ExclTime,
    InclArcs,
    ExclArcs,
    InclExec,
    ExclExec,
    InclAnno,
    ExclAnno,
}

/// One parsed symspec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    pub file: Option<String>,
    pub line: u32,
    pub name: Option<String>,
    pub module: Option<String>,
}

/// Parse one symspec.
pub fn parse(spec: &str) -> Spec {
    let mut out = Spec::default();
    let (spec, module) = match spec.rsplit_once('@') {
        Some((s, m)) if !m.is_empty() && !s.is_empty() => (s, Some(m.to_string())),
        _ => (spec, None),
    };
    out.module = module;
    if let Some((file, rest)) = spec.rsplit_once(':') {
        if !file.is_empty() {
            out.file = Some(file.to_string());
        }
        if !rest.is_empty() {
            if rest.as_bytes()[0].is_ascii_digit() {
                out.line = leading_number(rest);
            } else {
                out.name = Some(rest.to_string());
            }
        }
    } else if !spec.is_empty() {
        if spec.contains('.') {
            out.file = Some(spec.to_string());
        } else if spec.as_bytes()[0].is_ascii_digit() {
            out.line = leading_number(spec);
        } else {
            out.name = Some(spec.to_string());
        }
    }
    out
}

fn leading_number(s: &str) -> u32 {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().unwrap_or(0)
}

/// Whether `module_name` is what `wanted` names (file name, file name without `.so` version, `a.out`).
pub fn module_matches(module_name: &str, is_main: bool, wanted: &str) -> bool {
    if wanted == module_name || (is_main && wanted == "a.out") {
        return true;
    }
    if let Some(pos) = module_name.find(".so.")
        && &module_name[..pos + 3] == wanted
    {
        return true;
    }
    false
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The symbols a spec selects.
pub fn matching(graph: &Graph, spec: &Spec) -> Vec<usize> {
    let mut file = spec.file.as_deref();
    let mut module = spec.module.as_deref();
    // `libfoo.so:` names a module, not a source file.
    if module.is_none()
        && let Some(f) = file
        && spec.name.is_none()
        && spec.line == 0
        && graph
            .modules
            .iter()
            .enumerate()
            .any(|(i, m)| module_matches(&m.name, i == 0, f))
        && !graph.syms[..graph.nsyms]
            .iter()
            .any(|s| s.symbol.file.as_deref().map(basename) == Some(f))
    {
        module = Some(f);
        file = None;
    }
    let mut out = Vec::new();
    for (id, s) in graph.syms[..graph.nsyms].iter().enumerate() {
        if let Some(m) = module {
            let mv = &graph.modules[s.module];
            if !module_matches(&mv.name, s.module == 0, m) {
                continue;
            }
        }
        if let Some(f) = file
            && s.symbol.file.as_deref().map(basename) != Some(f)
        {
            continue;
        }
        if spec.line != 0 && spec.line != s.symbol.line {
            continue;
        }
        if let Some(n) = &spec.name
            && n != &s.symbol.name
        {
            continue;
        }
        out.push(id);
    }
    out
}

/// The tables after matching every spec against the symbols.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    sets: std::collections::HashMap<Table, HashSet<usize>>,
    arcs: std::collections::HashMap<Table, HashSet<(usize, usize)>>,
}

impl Filters {
    /// Match every `(table, spec)` against the graph's symbols.
    pub fn build(graph: &Graph, specs: &[(Table, String)]) -> Filters {
        let mut f = Filters::default();
        for (table, text) in specs {
            match table {
                Table::InclArcs | Table::ExclArcs => {
                    let (from, to) = text.split_once('/').unwrap_or((text.as_str(), ""));
                    let left = matching(graph, &parse(from));
                    let right = matching(graph, &parse(to));
                    let set = f.arcs.entry(*table).or_default();
                    for &l in &left {
                        for &r in &right {
                            set.insert((l, r));
                        }
                    }
                }
                _ => {
                    let m = matching(graph, &parse(text));
                    f.sets.entry(*table).or_default().extend(m);
                }
            }
        }
        f
    }

    /// Whether `sym` is in `table`.
    pub fn has(&self, table: Table, sym: usize) -> bool {
        self.sets.get(&table).is_some_and(|s| s.contains(&sym))
    }

    /// Whether `table` selected no symbol at all.
    pub fn is_empty(&self, table: Table) -> bool {
        self.sets.get(&table).is_none_or(|s| s.is_empty())
    }

    /// gprof's rule: in the include table, or the include table is empty and not in the exclude table.
    pub fn selected(&self, incl: Table, excl: Table, sym: usize) -> bool {
        self.has(incl, sym) || (self.is_empty(incl) && !self.has(excl, sym))
    }

    /// Whether the arc parent→child is kept (`-k`, `-q from/to`, `-Q from/to`).
    pub fn arc_kept(&self, parent: usize, child: usize) -> bool {
        let incl = self.arcs.get(&Table::InclArcs);
        if incl.is_some_and(|s| s.contains(&(parent, child))) {
            return true;
        }
        incl.is_none_or(|s| s.is_empty())
            && !self
                .arcs
                .get(&Table::ExclArcs)
                .is_some_and(|s| s.contains(&(parent, child)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gprof_forms() {
        assert_eq!(parse("main").name.as_deref(), Some("main"));
        assert_eq!(parse("foo.c").file.as_deref(), Some("foo.c"));
        let s = parse("foo.c:bar");
        assert_eq!(
            (s.file.as_deref(), s.name.as_deref()),
            (Some("foo.c"), Some("bar"))
        );
        let s = parse("foo.c:12");
        assert_eq!((s.file.as_deref(), s.line), (Some("foo.c"), 12));
        let s = parse("work@libfoo.so");
        assert_eq!(
            (s.name.as_deref(), s.module.as_deref()),
            (Some("work"), Some("libfoo.so"))
        );
    }

    #[test]
    fn module_names() {
        assert!(module_matches("libfoo.so.1.2", false, "libfoo.so"));
        assert!(module_matches("libfoo.so.1.2", false, "libfoo.so.1.2"));
        assert!(module_matches("app", true, "a.out"));
        assert!(!module_matches("libfoobar.so", false, "libfoo.so"));
    }
}
