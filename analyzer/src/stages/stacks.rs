//! Stage 5 (profiles with a STACKS section): each sampled call stack, its frames turned into the graph's
//! symbols, leaf first. The measured times of the report and the stacks of the exports start from here.

use mslprof_format::LinkAddress;
use mslprof_format::model::{Profile, StackFrame, UNKNOWN_KEY};

use crate::gprof::graph::Graph;

/// One frame of a resolved stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The frame's module in [`Graph::modules`], `None` for an address in no known module.
    pub module: Option<usize>,
    /// The link-time address looked up: the sampled PC for the leaf, `return address - 1` above it (an
    /// address inside the call instruction, so a call that ends its function still names that function).
    pub address: LinkAddress,
    /// The function in [`Graph::syms`] that holds `address`, `None` where no symbol covers it.
    pub sym: Option<usize>,
}

/// One distinct stack and how many samples had it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stack {
    pub count: u64,
    /// `mslprof_format::stack_flags`: whether the walk stopped before the stack's root, and why.
    pub flags: u32,
    /// Leaf first.
    pub frames: Vec<Frame>,
}

impl Stack {
    pub fn is_truncated(&self) -> bool {
        self.flags != 0
    }
}

/// The profile's stacks, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stacks {
    pub stacks: Vec<Stack>,
    /// The depth limit the runtime used.
    pub max_depth: u32,
    /// Samples whose stack the runtime could not store (its table was full).
    pub dropped: u64,
    /// Samples with a stored stack (the sum of the counts).
    pub samples: u64,
}

/// Resolve the stacks of a merged mslprof profile (module keys are 1-based module indices, as
/// [`crate::merge`] numbers them) against `g`. `None` when the profile has no stacks.
pub fn resolve(g: &Graph, profile: &Profile) -> Option<Stacks> {
    let recorded = profile.stacks.as_ref()?;
    let stacks: Vec<Stack> = recorded
        .records
        .iter()
        .filter(|r| r.count != 0 && !r.frames.is_empty())
        .map(|r| Stack {
            count: r.count,
            flags: r.flags,
            frames: r
                .frames
                .iter()
                .enumerate()
                .map(|(depth, f)| frame(g, f, depth))
                .collect(),
        })
        .collect();
    Some(Stacks {
        samples: recorded.sample_count(),
        max_depth: recorded.max_depth,
        dropped: recorded.dropped,
        stacks,
    })
}

fn frame(g: &Graph, f: &StackFrame, depth: usize) -> Frame {
    let module = if f.key == UNKNOWN_KEY {
        None
    } else {
        (f.key as usize)
            .checked_sub(1)
            .filter(|m| *m < g.modules.len())
    };
    let address = if depth == 0 {
        f.address
    } else {
        LinkAddress(f.address.0.saturating_sub(1))
    };
    let sym = module.and_then(|m| g.lookup(m, address));
    Frame {
        module,
        address,
        sym,
    }
}
