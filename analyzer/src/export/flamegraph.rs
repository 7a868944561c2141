//! A flame graph (`--format flamegraph`): the folded stacks ([`super::folded`]) drawn as an interactive
//! SVG by the inferno crate (a Rust port of flamegraph.pl), with colours chosen from the names, so the
//! same profile gives the same picture.

use std::io::{self, Write};

use inferno::flamegraph::{self, Options};

use super::Prepared;
use super::folded;

/// Write `p`'s stacks as a flame graph SVG; an error when the profile has no stacks.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    let lines = folded::lines(p).ok_or_else(folded::no_stacks)?;
    let h = &p.profile.header;
    let program = String::from_utf8_lossy(if h.program_name.is_empty() {
        &h.program_path
    } else {
        &h.program_name
    })
    .into_owned();
    let samples: u64 = p.stacks().map_or(0, |s| s.samples);
    let mut options = Options::default();
    options.title = format!("mslprof: {program}");
    options.subtitle = Some(format!(
        "{samples} samples of {} ns ({:.2} s of CPU time) with their call stacks",
        p.period_ns(),
        p.seconds(samples)
    ));
    options.count_name = "samples".into();
    options.deterministic = true;
    flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}
