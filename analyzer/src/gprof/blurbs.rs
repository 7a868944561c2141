//! Explanations printed after (or, in BSD style, before) each table unless `-b` is given. Written for
//! mslprof; they sit where gprof puts its own.

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
