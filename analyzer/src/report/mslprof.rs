//! The mslprof adapter: multi-module profiles summed into one, each load instance read from its own ELF
//! file, and the report with warnings and unprofiled modules at the top, a module-index column in the flat
//! profile and the module table at the end.

use std::cell::Cell;
use std::path::Path;

use mslprof_format::model::{IncompleteCause, Profile, header_flags};

use crate::gprof::graph::Graph;
use crate::gprof::histogram::SampleTotals;
use crate::gprof::style::Style;
use crate::gprof::symspec::Filters;
use crate::input::{Error, Input, Refusal};
use crate::options::Options;
use crate::output::Out;
use crate::stages::render::Found;
use crate::stages::{arcs, graph, render, samples, stacks, symbols};

use crate::report::outcome::Outcome;

/// The analysis of a merged mslprof profile that the report and the exports share: every profiled
/// module's symbols, the arcs tallied between them and the samples credited to them (time is not yet
/// propagated: [`crate::gprof::callgraph::assemble`] does that).
pub struct Analysis {
    pub graph: Graph,
    pub filters: Filters,
    pub totals: SampleTotals,
    pub have_hist: bool,
    pub have_arcs: bool,
    /// Bytes covered by one histogram bucket (of the first histogram).
    pub granularity: i64,
    /// Samples per second.
    pub hz: f64,
    /// The sampled call stacks resolved to the graph's symbols, when the profile has them.
    pub stacks: Option<stacks::Stacks>,
}

/// Stages 1 to 4 over `profile` (`exe` replaces the main program's recorded path): load the modules'
/// symbols, build the graph, tally the arcs and credit the samples. Problems that do not stop the
/// analysis are added to `warnings`.
pub fn analyse(
    opts: &Options,
    exe: Option<&Path>,
    profile: &Profile,
    warnings: &mut Vec<String>,
) -> Analysis {
    let modules = symbols::mslprof(opts, exe, profile, warnings);
    let (mut g, filters) = graph::build(modules, opts, true);
    let have_arcs = arcs::mslprof(&mut g, profile, &filters);
    if opts.static_calls && have_arcs {
        arcs::static_mslprof(&mut g, opts, warnings);
    }
    let credited = samples::assign_mslprof(&mut g, profile, &filters);
    let stacks = stacks::resolve(&g, profile);
    Analysis {
        graph: g,
        filters,
        totals: credited.totals,
        have_hist: credited.have_hist,
        have_arcs,
        granularity: credited.granularity,
        hz: samples::mslprof_hz(profile),
        stacks,
    }
}

/// Analyse mslprof (multi-module) inputs. `exe` replaces the main program's recorded path.
pub fn run(
    opts: &Options,
    exe: Option<&Path>,
    inputs: &[Input],
    out: &mut Out,
) -> Result<Outcome, Error> {
    let mut warnings: Vec<String> = inputs.iter().filter_map(incomplete).collect();
    if opts.file_info {
        out.push_str(&crate::gprof::fileinfo::mslprof(inputs));
        return Ok(Outcome {
            warnings,
            summary: None,
        });
    }
    if let Some(map) = &opts.file_order {
        return Err(Error::refused(map, Refusal::FileOrderForMslprof));
    }
    let merged = crate::merge::merge(inputs, opts.separate_instances)?;
    if opts.sum {
        let mut bytes = Vec::new();
        mslprof_format::write(&merged.profile, &mut bytes).map_err(|e| Error::io("gmon.sum", e))?;
        return Ok(Outcome {
            warnings,
            summary: Some(bytes),
        });
    }
    let profile = &merged.profile;
    let header = &profile.header;
    if header.dropped_arcs != 0 {
        warnings.push(format!(
            "{} arcs were dropped because an arc table was full; call counts are too low",
            header.dropped_arcs
        ));
    }

    let Analysis {
        graph: mut g,
        filters,
        mut totals,
        have_hist,
        have_arcs,
        granularity,
        hz,
        stacks,
    } = analyse(opts, exe, profile, &mut warnings);
    // The call graph's times are measured from the stacks unless `--estimate` asks for gprof's.
    let measured = stacks.filter(|s| !opts.estimate && !s.stacks.is_empty());
    let mut share_note = share_note(opts, profile, &mut totals, hz);
    let top_samples = g.syms.iter().map(|s| s.hist_time).fold(0.0, f64::max);
    if let Some(rate) = super::rate::rate_line(header, top_samples) {
        share_note = format!("{rate}\n{share_note}");
    }
    let style = Style {
        share_note: Some(share_note),
        bsd: opts.bsd,
        descriptions: !opts.brief,
        ignore_zeros: opts.ignore_zeros,
        output_width: opts.width,
        hz,
        granularity,
        dimension: "seconds".into(),
        dimension_abbrev: 's',
        print_path: opts.print_path,
        inline_file_names: opts.inline_file_names,
        line_granularity: opts.line,
        multi_module: true,
        first_output: Cell::new(true),
        index_width: Cell::new(crate::gprof::callgraph::INDEX_WIDTH),
        measured: measured.as_ref().map(stacks::Stacks::note),
    };
    let rates = sampling_rates(profile, merged.rescaled);
    out.push_str(&rates);
    if render::unprofiled_modules(out, profile, opts) || !rates.is_empty() {
        style.first_output.set(false);
    }
    let found = Found {
        have_hist,
        have_arcs,
        measured: measured.as_ref(),
    };
    warnings.extend(render::tables(
        out, &mut g, &filters, &style, totals, found, opts,
    ));
    render::module_table(out, &g, profile, &merged.instances, opts);
    Ok(Outcome {
        warnings,
        summary: None,
    })
}

/// The lines that open the report when the sampling rate is not the one asked for (the runtime may
/// sample less often than `MSLPROF_HZ` says) or when the files summed were sampled at different periods.
fn sampling_rates(profile: &Profile, rescaled: Option<(u64, u64)>) -> String {
    let requested = profile.header.hz;
    let per_second = |period_ns: u64| 1e9 / period_ns.max(1) as f64;
    let ms = |period_ns: u64| period_ns as f64 / 1e6;
    let mut text = String::new();
    let (fastest, slowest) = rescaled.unwrap_or_else(|| {
        let p = crate::merge::period_ns(&profile.header);
        (p, p)
    });
    let off = |period_ns: u64| {
        requested > 0 && (per_second(period_ns) / f64::from(requested) - 1.0).abs() > 0.1
    };
    // A file that says what sampled it opens with the fuller rate line instead (`rate::rate_line`).
    let said_by_rate_line = super::rate::applies(&profile.header);
    if !said_by_rate_line && (off(fastest) || off(slowest)) {
        let rate = if fastest == slowest {
            format!("{:.0}", per_second(fastest))
        } else {
            format!("{:.0} to {:.0}", per_second(slowest), per_second(fastest))
        };
        text.push_str(&format!(
            "Sampled at {rate} samples per CPU-second (measured), where {requested} were requested.\n"
        ));
    }
    if let Some((shortest, longest)) = rescaled {
        text.push_str(&format!(
            "The profiles summed were sampled at different periods ({:.3} to {:.3} ms): each one's samples are\n\
             rescaled to the shortest period, so that the seconds of the sum are those of its parts.\n",
            ms(shortest),
            ms(longest)
        ));
    }
    if !text.is_empty() {
        text.push('\n');
    }
    text
}

/// The warning for a profile its process could not finish writing normally.
fn incomplete(input: &Input) -> Option<String> {
    let h = &input.profile.header;
    if h.flags & header_flags::INCOMPLETE == 0 {
        return None;
    }
    let cause = match h.incomplete_cause {
        IncompleteCause::Signal => format!("killed by signal {}", h.incomplete_signal),
        IncompleteCause::UnderscoreExit => "_exit was called".into(),
        IncompleteCause::ExitFromThread => "exit from a thread while others ran".into(),
        IncompleteCause::Exec => "the program called execve".into(),
        IncompleteCause::InternalFault => "the runtime stopped profiling after a fault".into(),
        other => format!("cause {}", other.code()),
    };
    Some(format!(
        "{}: profile is incomplete ({cause})",
        input.path.display()
    ))
}

/// The line above the flat profile that says what 100 % is (with `--share-of=process`, `totals` becomes
/// all samples of the process), followed by the CPU time when recorded.
fn share_note(opts: &Options, profile: &Profile, totals: &mut SampleTotals, hz: f64) -> String {
    let header = &profile.header;
    let selected = totals.total_time;
    let process = header.total_samples as f64;
    let note = if opts.share_of_process {
        totals.total_time = process;
        format!(
            "Percentages are of all {} samples of the process ({:.2} s); the selected modules had {} ({:.2} s).",
            process,
            process / hz,
            selected.round(),
            selected / hz
        )
    } else {
        format!(
            "Percentages are of the {} samples in the selected modules ({:.2} s); the whole process had {} ({:.2} s; --share-of=process).",
            selected.round(),
            selected / hz,
            process,
            process / hz
        )
    };
    match header.cpu_time {
        Some(cpu) => format!(
            "{note}\n{}",
            crate::cputime::report_line(cpu, header.sampling_sources)
        ),
        None => note,
    }
}
