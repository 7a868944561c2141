//! Folded stacks (`--format folded`), the input every flame-graph tool takes (flamegraph.pl, inferno,
//! speedscope): one `root;...;leaf COUNT` line per distinct stack of names, sorted. Frames are named as the
//! report names functions ([`Frame::name`]); a stack the runtime could not walk to its root starts with a
//! `[truncated]` frame, so it is not drawn as a root of its own.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::Prepared;
use crate::stages::stacks::Frame;

/// The root frame put above a stack whose walk stopped before its root.
pub const TRUNCATED: &str = "[truncated]";

/// The folded lines of `p`'s stacks (`None` when the profile has no stacks), without line ends. Stacks
/// that name the same functions in the same order are one line with their counts added.
pub fn lines(p: &Prepared) -> Option<Vec<String>> {
    let g = &p.analysis.graph;
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &p.stacks()?.stacks {
        let mut names: Vec<String> = Vec::with_capacity(stack.frames.len() + 1);
        if stack.is_truncated() {
            names.push(TRUNCATED.into());
        }
        names.extend(stack.frames.iter().rev().map(|f: &Frame| {
            // `;` separates frames and the last space the count: a name keeps its spaces, not its `;`.
            f.name(g).replace(';', ":")
        }));
        let n = folded.entry(names.join(";")).or_insert(0);
        *n = n.saturating_add(stack.count);
    }
    Some(
        folded
            .into_iter()
            .map(|(frames, count)| format!("{frames} {count}"))
            .collect(),
    )
}

/// Write `p`'s folded stacks; an error naming what is missing when the profile has none.
pub fn write(p: &Prepared, out: &mut dyn Write) -> io::Result<()> {
    for line in lines(p).ok_or_else(no_stacks)? {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The error of an export that needs stacks over a profile without them.
pub fn no_stacks() -> io::Error {
    io::Error::other(
        "the profile has no sampled call stacks (a STACKS section); a runtime that records them \
         writes one (MSLPROF_STACK_DEPTH)",
    )
}
