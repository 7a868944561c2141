//! Stage 1, load symbols: each module's view (name, path, unit) and the function symbols read from its
//! ELF file (or from an nm-style table given with `-S`), with the warnings reading them gives. Nothing
//! here knows about arcs or samples.

use mslprof_format::LinkAddress;
use std::path::{Path, PathBuf};

use mslprof_format::model::{Module, Profile, module_flags};

use crate::elf::filemap::FileMap;
use crate::elf::symbols::SymbolError;
use crate::elf::symbols::{self, Demangle, FunctionSymbol, SelectOptions, SourcesWanted};
use crate::gprof::graph::ModuleView;
use crate::input::Error;
use crate::options::Options;

/// One module as the symbol stage leaves it: its view, and its symbols with how to print their names
/// (`None` when the module gets no functions of its own).
pub struct LoadedModule {
    pub view: ModuleView,
    pub symbols: Option<(Vec<FunctionSymbol>, Demangle)>,
}

pub use crate::elf::symtab::OVERHEAD_ROW;

/// The last component of `path`.
pub fn file_name(path: &str) -> String {
    path.rsplit('/').next().unwrap_or(path).to_string()
}

/// Whether `m` is the mslprof runtime itself.
pub fn is_runtime(m: &Module) -> bool {
    let path = String::from_utf8_lossy(&m.path);
    file_name(&path).starts_with("libmslprof.so")
}

/// GNU input: the executable's one module. Also returns the `-R` map, which selects the symbols and is
/// printed from at the end.
pub fn gnu(
    opts: &Options,
    exe: &Path,
    warnings: &mut Vec<String>,
) -> Result<(LoadedModule, Option<FileMap>), Error> {
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
        keep_split_parts: false,
        lines: opts.line,
        exact_bounds: false,
    };
    let mut source_files = Vec::new();
    let mut file_map = None;
    let syms = if let Some(ext) = &opts.external_symbols {
        symbols::finalize(external(ext)?, LinkAddress(0))
    } else {
        if let Some(p) = &opts.file_order {
            file_map = Some(FileMap::read(p).map_err(|problem| Error::MapFile {
                path: p.clone(),
                problem,
            })?);
        }
        let ms = symbols::load_mapped(exe, select, file_map.as_ref(), SourcesWanted::Every)
            .map_err(|source| Error::Symbols {
                path: exe.to_path_buf(),
                source,
            })?;
        if ms.dynamic_only {
            warnings.push(format!(
                "{}: symbol table is stripped; only exported functions are known",
                exe.display()
            ));
        }
        source_files = ms.source_files;
        ms.symbols
    };
    let view = ModuleView {
        name: file_name(&exe.to_string_lossy()),
        path: exe.display().to_string(),
        unit: 2,
        gnu_last_symbol: true,
        profiled: true,
        source_files,
        ..ModuleView::default()
    };
    let module = LoadedModule {
        view,
        symbols: Some((syms, opts.demangle)),
    };
    Ok((module, file_map))
}

/// `-S`: functions from an nm-style table (`ADDRESS t|T NAME` lines).
fn external(path: &Path) -> Result<Vec<FunctionSymbol>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(a), Some(t), Some(n)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if t != "t" && t != "T" {
            continue;
        }
        let Ok(addr) = u64::from_str_radix(a.trim_start_matches("0x"), 16) else {
            continue;
        };
        out.push(FunctionSymbol {
            name: n.to_string(),
            addr: LinkAddress(addr),
            end_addr: LinkAddress(0),
            is_func: true,
            is_static: t == "t",
            ..FunctionSymbol::default()
        });
    }
    if out.is_empty() {
        return Err(Error::Symbols {
            path: path.to_path_buf(),
            source: SymbolError::NoSymbols,
        });
    }
    Ok(out)
}

/// mslprof input: every load instance of `profile` (`exe` replaces the main program's recorded path).
/// Modules with neither samples nor calls, the vDSO and unprofiled modules that hold no caller are not
/// read; the runtime is one overhead row (unless `--no-overhead`).
pub fn mslprof(
    opts: &Options,
    exe: Option<&Path>,
    profile: &Profile,
    warnings: &mut Vec<String>,
) -> Vec<LoadedModule> {
    let select = SelectOptions {
        no_static: opts.no_static,
        ignore_non_functions: opts.ignore_non_functions,
        keep_split_parts: true,
        lines: opts.line,
        exact_bounds: true,
    };
    let holds_callers = |m: &Module| {
        profile
            .modules
            .iter()
            .any(|o| o.arcs.iter().any(|a| a.caller_key == m.key))
    };
    let mut loaded = Vec::with_capacity(profile.modules.len());
    let progress = crate::progress::Progress::start();
    let count = profile.modules.len();
    for (index, m) in profile.modules.iter().enumerate() {
        let name = if m.name.is_empty() {
            file_name(&String::from_utf8_lossy(&m.path))
        } else {
            String::from_utf8_lossy(&m.name).into_owned()
        };
        let file: PathBuf = match (m.is_main_program(), exe) {
            (true, Some(e)) => e.to_path_buf(),
            _ => crate::elf::binpath::locate(
                Path::new(&*String::from_utf8_lossy(&m.path)),
                &m.build_id,
                &opts.binary_path,
            ),
        };
        let mut module = LoadedModule {
            view: ModuleView {
                name: name.clone(),
                path: file.display().to_string(),
                unit: 1,
                gnu_last_symbol: false,
                samples: m.samples,
                profiled: m.is_profiled(),
                callee_arcs: !m.is_profiled() && !m.arcs.is_empty(),
                ..ModuleView::default()
            },
            symbols: None,
        };
        if m.saturated_buckets != 0 {
            warnings.push(format!(
                "{name}: {} histogram buckets saturated at 65535; its times are too low (use LD_PROFILEBUCKET_SIZE=32)",
                m.saturated_buckets
            ));
        }
        if m.dropped_arcs != 0 {
            warnings.push(format!(
                "{name}: {} arcs dropped (its arc table was full)",
                m.dropped_arcs
            ));
        }
        let is_vdso = m.flags & module_flags::VDSO != 0 || m.path.is_empty();
        // A module LD_PROFILE did not select is read only to name the callers it holds (calls it made into
        // profiled functions) and the functions that profiled modules called in it through the PLT (its own
        // arcs, CALLEE_ARCS): only those get entries.
        let callers_only = !m.is_profiled();
        // A module with neither samples nor calls adds nothing to the report: no need to read it (or to
        // warn about it).
        let has_data = || {
            m.histogram
                .as_ref()
                .is_some_and(|h| h.ranges.iter().any(|r| r.buckets.total() > 0))
                || !m.arcs.is_empty()
                || holds_callers(m)
        };
        if is_vdso || (callers_only && m.arcs.is_empty() && !holds_callers(m)) {
            // Nothing to read.
        } else if is_runtime(m) {
            // The profiler's own time is one row, as the paper's `mcount`/`profil` rows were: a measure
            // of the profiling overhead.
            if !opts.hide_overhead {
                let whole = FunctionSymbol {
                    name: OVERHEAD_ROW.into(),
                    end_addr: LinkAddress(u64::MAX - 1),
                    is_func: true,
                    ..FunctionSymbol::default()
                };
                module.symbols = Some((vec![whole], Demangle::None));
            }
        } else if has_data() {
            progress.now(format!(
                "reading the symbols of {name} ({} of {count})",
                index + 1
            ));
            let ranges = if needs_every_source(opts) {
                None
            } else {
                Some(used_ranges(m))
            };
            let sources = ranges
                .as_deref()
                .map_or(SourcesWanted::Every, SourcesWanted::StaticOverlapping);
            module.symbols = read_module(m, &file, select, sources, callers_only, warnings).map(
                |(syms, source_files, plt_counted)| {
                    module.view.source_files = source_files;
                    module.view.plt_counted = plt_counted;
                    (syms, opts.demangle)
                },
            );
        }
        loaded.push(module);
    }
    loaded
}

/// Whether the report reads the source file and line of functions it does not print, or of global ones:
/// annotated source (`-A`), execution counts (`-C`), line granularity (`-l`), file names inline, file
/// symspecs, the orderings (`-r`, `-R`), `-z`'s unused functions, `-c`'s calls never made, `-d`'s symbol
/// dump, and the exports.
fn needs_every_source(opts: &Options) -> bool {
    opts.every_source
        || opts.anno.is_some()
        || opts.static_calls
        || opts.debug != 0
        || opts.exec.is_some()
        || opts.line
        || opts.inline_file_names
        || opts.function_order
        || opts.file_order.is_some()
        || !opts.ignore_zeros
        || opts
            .specs
            .iter()
            .any(|(_, spec)| crate::gprof::symspec::parse(spec).file.is_some())
}

/// Where module `m`'s printable functions lie, as sorted, disjoint link-time ranges: its histogram buckets
/// with samples and the entries of the functions called in it. The index, which is where a static function's
/// file is printed, lists only functions with samples or calls; a function that only holds call sites or
/// stack frames is named in parent lines, which print no file.
fn used_ranges(m: &Module) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    if let Some(histogram) = &m.histogram {
        for range in &histogram.ranges {
            let count = range.buckets.len();
            if count == 0 {
                continue;
            }
            let span = range.span();
            for (index, _) in range.buckets.nonzero() {
                let start = range.start.0
                    + (u128::from(span) * u128::from(index) / u128::from(count)) as u64;
                let end = range.start.0
                    + (u128::from(span) * u128::from(index + 1) / u128::from(count)) as u64;
                ranges.push((start, end.max(start + 1)));
            }
        }
    }
    ranges.extend(m.arcs.iter().map(|arc| {
        let callee = arc.callee_address.0;
        (callee, callee.saturating_add(1))
    }));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Read one mslprof module's ELF file: its symbols, source files and whether its calls were counted at
/// the PLT. `None` (with a warning) when the file cannot be used.
fn read_module(
    m: &Module,
    file: &Path,
    select: SelectOptions,
    sources: SourcesWanted<'_>,
    callers_only: bool,
    warnings: &mut Vec<String>,
) -> Option<(Vec<FunctionSymbol>, Vec<String>, bool)> {
    match symbols::load_mapped(file, select, None, sources) {
        Ok(ms) => {
            if !m.build_id.is_empty()
                && ms
                    .build_id
                    .as_deref()
                    .is_some_and(|b| b != m.build_id.as_slice())
            {
                warnings.push(format!(
                    "{}: build-id differs from the profiled one (rebuilt since the run?); its functions may be wrong",
                    file.display()
                ));
            }
            if ms.dynamic_only && !callers_only {
                warnings.push(format!(
                    "{}: symbol table is stripped; functions it does not export are named by address (fn_ADDR from its unwind table, MODULE+0xADDR where even that is missing)",
                    file.display()
                ));
            }
            Some((ms.symbols, ms.source_files, !ms.counts_own_calls))
        }
        Err(e) => {
            warnings.push(format!(
                "{}: {}; its time is not attributed to functions",
                file.display(),
                e
            ));
            None
        }
    }
}
