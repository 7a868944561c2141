//! Annotated source listings (`-A`/`-J`, gprof's `print_annotated_source`): every source file of the
//! selected functions, each line preceded by the execution count of the function (or, with `-l`, line
//! symbol) that starts on it, then the file's most executed lines and an execution summary. With `-y`
//! each listing goes to `NAME-ann` in the working directory instead of standard output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::gprof::graph::Graph;
use crate::gprof::style::Style;
use crate::gprof::symspec::{Filters, Table};
use crate::output::Out;

/// Width of the count column.
const WIDTH: usize = 16;

/// What the command line says about the listing.
#[derive(Clone, Debug)]
pub struct AnnotateOptions {
    /// `-x`: carry the last count onto lines without one.
    pub all_lines: bool,
    /// `-y`: one `NAME-ann` file per source file.
    pub separate_files: bool,
    /// `-I` directories, then those of `GPROF_PATH`.
    pub search: Vec<String>,
    /// `-t`: length of the most-executed-lines table.
    pub table_length: usize,
    /// `-m`: counts below this print as `#####`.
    pub min_count: u64,
}

impl Default for AnnotateOptions {
    fn default() -> Self {
        AnnotateOptions {
            all_lines: false,
            separate_files: false,
            search: Vec::new(),
            table_length: 10,
            min_count: 1,
        }
    }
}

/// One line's statistics: the symbol starting there, or the sum of several (gprof's copied `Sym` with
/// address 0, which keeps the first one's line and kind).
#[derive(Clone, Copy, Debug)]
struct LineStat {
    line: u32,
    ncalls: u64,
    is_func: bool,
}

/// State carried from line to line and file to file (gprof's statics and counters).
struct Counter {
    last_count: u64,
    executable: u64,
    executed: u64,
}

/// gprof's `annotate_with_count` for one line.
fn annotation(stat: Option<&LineStat>, opts: &AnnotateOptions, c: &mut Counter) -> String {
    let Some(b) = stat else {
        return " ".repeat(WIDTH);
    };
    c.executable += 1;
    let mut text = String::new();
    let mut ncalls = None;
    if b.is_func {
        text = b.ncalls.to_string();
        c.last_count = b.ncalls;
        ncalls = Some(b.ncalls);
    }
    if opts.all_lines && text.is_empty() {
        text = c.last_count.to_string();
        ncalls = Some(c.last_count);
    }
    let Some(n) = ncalls else {
        return " ".repeat(WIDTH);
    };
    c.executed += 1;
    if n < opts.min_count {
        text = "#####".into();
    }
    text.push_str(" -> ");
    if text.len() >= WIDTH {
        text.truncate(WIDTH);
        text
    } else {
        format!("{}{}", " ".repeat(WIDTH - text.len()), text)
    }
}

/// gprof's `cmp_ncalls`: most calls first, then by line; empty slots last.
fn cmp_ncalls(l: &Option<LineStat>, r: &Option<LineStat>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (l, r) {
        (None, _) => Ordering::Greater,
        (_, None) => Ordering::Less,
        (Some(a), Some(b)) => b.ncalls.cmp(&a.ncalls).then(a.line.cmp(&b.line)),
    }
}

/// Open `name` as gprof's `annotate_source` does: as given, then in each search directory (the whole
/// relative name, or just the file name for an absolute or not-found path).
fn find_source(name: &str, search: &[String]) -> Option<PathBuf> {
    let direct = Path::new(name);
    if direct.is_file() {
        return Some(direct.to_path_buf());
    }
    let base = name.rsplit('/').next().unwrap_or(name);
    let relative = !direct.is_absolute();
    let candidates = search
        .iter()
        .filter(|_| relative)
        .map(|d| Path::new(d).join(name))
        .chain(search.iter().map(|d| Path::new(d).join(base)));
    candidates.into_iter().find(|p| p.is_file())
}

/// Print (or, with `-y`, write) the listings. Returns warnings: sources not found, files not written.
pub fn print(
    out: &mut Out,
    g: &Graph,
    filters: &Filters,
    style: &Style,
    opts: &AnnotateOptions,
) -> Vec<String> {
    let mut warnings = Vec::new();
    // Files in gprof's order: module by module, each in its own order, every file once.
    let mut files: Vec<&str> = Vec::new();
    for m in &g.modules {
        for f in &m.source_files {
            if !files.contains(&f.as_str()) {
                files.push(f);
            }
        }
    }
    let index_of = |f: &str| files.iter().position(|x| *x == f);
    let selected = |s: usize| filters.selected(Table::InclAnno, Table::ExclAnno, s);
    let mut num_lines = vec![0u32; files.len()];
    for s in 0..g.nsyms {
        let sym = &g.syms[s].symbol;
        if let Some(i) = sym.file.as_deref().and_then(index_of)
            && sym.line > num_lines[i]
            && selected(s)
        {
            num_lines[i] = sym.line;
        }
    }
    let mut slots: Vec<Vec<Option<LineStat>>> =
        num_lines.iter().map(|&n| vec![None; n as usize]).collect();
    let mut file_calls = vec![0u64; files.len()];
    for s in 0..g.nsyms {
        let sym = &g.syms[s];
        let Some(i) = sym.symbol.file.as_deref().and_then(index_of) else {
            continue;
        };
        if num_lines[i] == 0 || sym.symbol.line == 0 || !selected(s) {
            continue;
        }
        file_calls[i] += sym.ncalls;
        let slot = &mut slots[i][sym.symbol.line as usize - 1];
        match slot {
            None => {
                *slot = Some(LineStat {
                    line: sym.symbol.line,
                    ncalls: sym.ncalls,
                    is_func: sym.symbol.is_func,
                })
            }
            Some(st) => st.ncalls += sym.ncalls,
        }
    }
    let mut counter = Counter {
        last_count: 0,
        executable: 0,
        executed: 0,
    };
    let mut first_file = true;
    for (i, name) in files.iter().enumerate() {
        if num_lines[i] == 0 || (style.ignore_zeros && file_calls[i] == 0) {
            continue;
        }
        counter.executable = 0;
        counter.executed = 0;
        let Some(path) = find_source(name, &opts.search) else {
            warnings.push(format!("could not locate `{name}'"));
            continue;
        };
        let source = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                warnings.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let mut text = String::new();
        if !opts.separate_files {
            if first_file {
                first_file = false;
            } else {
                text.push('\n');
            }
            if style.first_output.get() {
                style.first_output.set(false);
            } else {
                text.push_str("\u{c}\n");
            }
            let _ = writeln!(text, "*** File {name}:");
        }
        let mut body: Vec<u8> = text.into_bytes();
        let mut line_num = 1usize;
        let mut new_line = true;
        for &b in &source {
            if new_line {
                let stat = slots[i].get(line_num - 1).and_then(Option::as_ref);
                body.extend_from_slice(annotation(stat, opts, &mut counter).as_bytes());
                line_num += 1;
            }
            new_line = b == b'\n';
            body.push(b);
        }
        let mut tail = String::new();
        if opts.table_length > 0 {
            let _ = write!(
                tail,
                "\n\nTop {} Lines:\n\n     Line      Count\n\n",
                opts.table_length
            );
            let mut lines = slots[i].clone();
            crate::qsort::msort(&mut lines, &mut cmp_ncalls);
            for st in lines.iter().take(opts.table_length) {
                match st {
                    Some(st) if st.ncalls != 0 => {
                        let _ = writeln!(tail, "{:>9} {:>10}", st.line, st.ncalls);
                    }
                    _ => break,
                }
            }
        }
        let exe = counter.executable;
        let _ = write!(
            tail,
            "\nExecution Summary:\n\n{:>9}   Executable lines in this file\n{:>9}   Lines executed\n{:>9.2}   Percent of the file executed\n\n{:>9}   Total number of line executions\n{:>9.2}   Average executions per line\n",
            exe,
            counter.executed,
            crate::gprof::cformat::CFloat(if exe > 0 {
                100.0 * counter.executed as f64 / exe as f64
            } else {
                100.0
            }),
            file_calls[i],
            crate::gprof::cformat::CFloat(if exe > 0 {
                file_calls[i] as f64 / exe as f64
            } else {
                0.0
            })
        );
        body.extend_from_slice(tail.as_bytes());
        if opts.separate_files {
            let target = format!("{}-ann", name.rsplit('/').next().unwrap_or(name));
            if let Err(e) = std::fs::write(&target, &body) {
                warnings.push(format!("{target}: {e}"));
            }
        } else {
            out.push_str(&String::from_utf8_lossy(&body));
        }
    }
    warnings
}
