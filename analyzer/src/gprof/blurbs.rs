//! Explanations printed after (or, in BSD style, before) each table unless `-b` is given. Written for
//! mslprof; they sit where gprof puts its own. A call graph whose times are measured from sampled stacks
//! has its own variant, which says so.

/// Follows the flat profile.
pub const FLAT: &str = "
 How to read the flat profile

 Each line is one function; the list runs from the most to the least time
 spent in the function's own code.

 % time       share of the sampled time spent in this function's own code;
              100 % is said above the table (the selected modules' samples,
              or the whole process's with --share-of=process).
 cumulative   running total of the self seconds column, top to bottom.
 self         seconds spent in this function's own code, without callees.
 calls        how many times the function was entered; blank when the
              function was not compiled for call counting. Marked (PLT):
              only the calls from other modules, counted at the PLT.
 self/call    average time per call in the function's own code.
 total/call   average time per call including everything it called.
 module index (multi-module profiles) the module the function belongs to,
              see the module table at the end of the report.
 name         the function; the list is sorted by self time, then by
              calls, then alphabetically.

 Times come from periodic samples: a figure close to the sampling period is
 noise, and a function that never showed up in a sample has no time.

\u{c}
 mslprof: multi-module profiling for Linux, gprof-compatible output.

";

/// Follows the call graph (GNU style).
pub const CALL_GRAPH: &str = "
 How to read the call graph

 The table has one block per function, separated by dashed lines. In each
 block the line starting with [N] is the function itself; the lines above
 it are its callers, the lines below it the functions it called.

 On the function's own line:
 index     its number in this table, used in every cross-reference.
 % time    share of the total time spent in it and its callees.
 self      seconds in its own code.
 children  seconds in its callees, estimated from the call counts.
 called    calls from other functions, and after `+' the recursive calls.
 name      the function, its cycle if it is part of one, and its index.

 On a caller's line, self and children are the share of the function's
 time estimated to come from that caller, and called reads
 `calls from this caller/all non-recursive calls'.
 On a callee's line, self and children are the share of the callee's time
 charged to this function, and called reads
 `calls from this function/all non-recursive calls of the callee'.

 <spontaneous> means no caller was recorded (a signal handler, a callback
 from code without call counting, or the program's entry point).
 Functions that call each other in a loop form a cycle; the cycle has a
 block of its own that lists its members.

\u{c}
 mslprof: multi-module profiling for Linux, gprof-compatible output.

";

/// Precedes the call graph in BSD style (`-T`).
pub const BSD_CALL_GRAPH: &str = "

call graph profile:
 One block per function: callers above the function's own line, callees
 below. self is time in the function's own code, descendants the time in
 its callees; called/total counts calls from one caller against all
 non-recursive calls, called+self adds the recursive ones.

";

/// The sampled stacks a measured call graph comes from, as its blurb reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StacksNote {
    /// Samples with a stored stack.
    pub samples: u64,
    /// Of those, the samples whose stack stopped before its root (depth limit or unwinding).
    pub truncated: u64,
    /// Samples whose stack the runtime could not store.
    pub dropped: u64,
}

/// The lines of [`CALL_GRAPH`] that say children times are estimated, and what the measured blurb says
/// instead.
const ESTIMATED_COLUMNS: &str = " children  seconds in its callees, estimated from the call counts.
 called    calls from other functions, and after `+' the recursive calls.
";
const MEASURED_COLUMNS: &str =
    " children  seconds in its callees, measured from the sampled stacks.
 called    calls from other functions, and after `+' the recursive calls;
           blank when its calls were not counted.
";

/// The paragraph of [`CALL_GRAPH`] on caller and callee lines, and the measured blurb's.
const ESTIMATED_LINES: &str =
    " On a caller's line, self and children are the share of the function's
 time estimated to come from that caller, and called reads
 `calls from this caller/all non-recursive calls'.
 On a callee's line, self and children are the share of the callee's time
 charged to this function, and called reads
 `calls from this function/all non-recursive calls of the callee'.
";
const MEASURED_LINES: &str =
    " On a caller's line, self and children are the function's time measured
 under that caller (self: the samples that stopped in the function itself),
 and called reads `calls from this caller/all non-recursive calls', 0
 for a caller known from the stacks only (those calls were not counted).
 On a callee's line, self and children are the callee's time measured
 under this function, and called reads
 `calls from this function/all non-recursive calls of the callee'.
";

/// The call-graph blurb (GNU style) when the times are measured from sampled stacks.
pub fn call_graph_measured(stacks: &StacksNote) -> String {
    let lines = format!("{MEASURED_LINES}\n{}", measured_note(stacks));
    CALL_GRAPH
        .replacen(ESTIMATED_COLUMNS, MEASURED_COLUMNS, 1)
        .replacen(ESTIMATED_LINES, &lines, 1)
}

/// The BSD-style (`-T`) call-graph blurb when the times are measured from sampled stacks.
pub fn bsd_call_graph_measured(stacks: &StacksNote) -> String {
    format!("{}\n{}\n", BSD_CALL_GRAPH.trim_end(), measured_note(stacks))
}

/// Where a measured call graph's times come from and how they are counted.
fn measured_note(stacks: &StacksNote) -> String {
    let mut note = format!(
        " Times are measured from {} sampled call stacks, not estimated from the
 call counts: a function's time is that of the samples with it anywhere on
 the stack, counted once per sample however deep its recursion; a caller's
 or callee's line, that of the samples with that call on the stack; a
 cycle's, that of the samples with any of its members on the stack.
",
        stacks.samples
    );
    if stacks.truncated != 0 {
        note.push_str(&format!(
            " {:.1} % of the stacks stopped short of the program's entry (depth limit,
 or a frame that could not be unwound): their outer callers are missing.
",
            100.0 * stacks.truncated as f64 / stacks.samples.max(1) as f64
        ));
    }
    if stacks.dropped != 0 {
        note.push_str(&format!(
            " {} more samples had no stored stack (the runtime's table was full).
",
            stacks.dropped
        ));
    }
    note.push_str(" --estimate prints gprof's estimate from the call counts instead.\n");
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_measured_blurb_replaces_what_the_estimate_says() {
        let note = StacksNote {
            samples: 200,
            truncated: 3,
            dropped: 7,
        };
        let text = call_graph_measured(&note);
        assert!(CALL_GRAPH.contains(ESTIMATED_COLUMNS) && CALL_GRAPH.contains(ESTIMATED_LINES));
        assert!(!text.contains("estimated from the call counts."));
        assert!(text.contains(MEASURED_COLUMNS));
        assert!(text.contains(" Times are measured from 200 sampled call stacks"));
        assert!(text.contains(" 1.5 % of the stacks stopped short"));
        assert!(text.contains(" 7 more samples had no stored stack"));
        let bsd = bsd_call_graph_measured(&StacksNote { samples: 5, ..note });
        assert!(bsd.starts_with(BSD_CALL_GRAPH.trim_end()));
        assert!(bsd.ends_with("instead.\n\n"));
    }
}
