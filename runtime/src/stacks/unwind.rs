//! The walk of one interrupted call stack, inside the SIGPROF handler: from the interrupted registers, one
//! return address at a time, by the module's call-frame information (`.eh_frame_hdr` + `.eh_frame`, read
//! with gimli into a context on the stack) or, where there is none, by the frame-pointer chain, each address's
//! rule kept in a cache ([`super::rule_cache`]); through kernel signal frames (glibc's `__restore_rt`). Every
//! read of the stack is checked against the bounds of the stack it is on ([`Window`]); unwind tables are read
//! from copies made when the module was added, so the walk never reads a module's memory (see
//! [`crate::unwind_tables::ModuleUnwind`]).

use gimli::{CfaRule, RegisterRule, UnwindContext, UnwindTableRow, X86_64};
use mslprof_format::RuntimeAddress;
use mslprof_format::model::UNKNOWN_KEY;

use super::rule_cache::RuleCache;
use crate::modules;
use crate::unwind_tables::StoreOnStack;

/// The registers of one frame that a walk follows.
#[derive(Clone, Copy, Debug)]
pub struct Registers {
    pub pc: usize,
    pub sp: usize,
    pub fp: usize,
}

/// What one step found.
enum Step {
    /// The caller's registers (its pc a return address).
    Caller(Registers),
    /// The call-frame information marks the outermost frame (return address undefined).
    End,
    /// Information that cannot be followed here, or stack memory out of bounds.
    Failed,
}

/// Where a frame's CFA (its caller's stack pointer) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cfa {
    /// rsp + offset.
    SpPlus(i64),
    /// rbp + offset.
    FpPlus(i64),
    /// rsp + 8: a PLT entry. Only PLT entries use an expression here (glibc's and binutils' CFI for them):
    /// everywhere in an entry but the lazy-binding path's push, the return address is at rsp, the return
    /// address rule reading [CFA - 8].
    PltEntry,
}

/// Where the caller's rbp is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedFp {
    /// Saved at CFA + offset.
    At(i64),
    /// Is CFA + offset.
    Is(i64),
    /// Any other rule: the caller's rbp is taken to be this frame's.
    Unchanged,
}

/// What one step applies at one address: a row of call-frame information reduced to the registers the walk
/// follows, or the frame-pointer rule. The same for every visit of a (load instance, address), so the handler
/// caches it ([`super::rule_cache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// No call-frame information for the address: the frame-pointer rule (`push rbp; mov rbp, rsp`).
    FramePointer,
    /// A row whose CFA is from a register other than rsp and rbp, or whose return address is neither
    /// undefined nor saved at an offset: the walk cannot go on.
    Unfollowable,
    /// A row; its return address saved at CFA + offset, or `None`: undefined (the outermost frame).
    Row {
        cfa: Cfa,
        return_address: Option<i64>,
        fp: SavedFp,
    },
}

impl Rule {
    /// The rule for `row` (`None`: no row for the address).
    pub fn for_row(row: Option<&UnwindTableRow<usize, StoreOnStack>>) -> Rule {
        let Some(row) = row else {
            return Rule::FramePointer;
        };
        let cfa = match *row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
                Cfa::SpPlus(offset)
            }
            CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
                Cfa::FpPlus(offset)
            }
            CfaRule::RegisterAndOffset { .. } => return Rule::Unfollowable,
            CfaRule::Expression(_) => Cfa::PltEntry,
        };
        let return_address = match row.register(X86_64::RA) {
            RegisterRule::Undefined => None,
            RegisterRule::Offset(offset) => Some(offset),
            _ => return Rule::Unfollowable,
        };
        let fp = match row.register(X86_64::RBP) {
            RegisterRule::Offset(offset) => SavedFp::At(offset),
            RegisterRule::ValOffset(offset) => SavedFp::Is(offset),
            _ => SavedFp::Unchanged,
        };
        Rule::Row {
            cfa,
            return_address,
            fp,
        }
    }

    /// One step from `registers` by this rule.
    fn apply(self, registers: Registers, stack: &Window<'_>) -> Step {
        let (cfa, return_address, fp) = match self {
            Rule::FramePointer => return frame_pointer_step(registers, stack),
            Rule::Unfollowable => return Step::Failed,
            Rule::Row {
                cfa,
                return_address,
                fp,
            } => (cfa, return_address, fp),
        };
        let cfa = match cfa {
            Cfa::SpPlus(offset) => (registers.sp as i64).wrapping_add(offset) as usize,
            Cfa::FpPlus(offset) => (registers.fp as i64).wrapping_add(offset) as usize,
            Cfa::PltEntry => registers.sp.wrapping_add(8),
        };
        let at = |offset: i64| (cfa as i64).wrapping_add(offset) as usize;
        let Some(return_address) = return_address else {
            return Step::End;
        };
        let Some(pc) = stack.read(at(return_address)) else {
            return Step::Failed;
        };
        let fp = match fp {
            SavedFp::At(offset) => match stack.read(at(offset)) {
                Some(fp) => fp,
                None => return Step::Failed,
            },
            SavedFp::Is(offset) => at(offset),
            SavedFp::Unchanged => registers.fp,
        };
        Step::Caller(Registers { pc, sp: cfa, fp })
    }
}

/// One step by the frame-pointer rule (`push rbp; mov rbp, rsp`): when rbp looks like a frame (8-aligned, at
/// or above rsp, its two words on this stack).
fn frame_pointer_step(registers: Registers, stack: &Window<'_>) -> Step {
    let fp = registers.fp;
    if !fp.is_multiple_of(8) || fp < registers.sp {
        return Step::Failed;
    }
    match (stack.read(fp), stack.read(fp.wrapping_add(8))) {
        (Some(caller_fp), Some(pc)) => Step::Caller(Registers {
            pc,
            sp: fp + 16,
            fp: caller_fp,
        }),
        _ => Step::Failed,
    }
}

/// The part of one stack a walk may read: `[low, high)`, in place or through a copy of it.
pub struct Window<'a> {
    low: usize,
    high: usize,
    copy: Option<&'a [u8]>,
}

impl Window<'_> {
    /// The word at `address`, if it lies inside the window.
    fn read(&self, address: usize) -> Option<usize> {
        let end = address.checked_add(8)?;
        if address < self.low || end > self.high {
            return None;
        }
        match self.copy {
            Some(bytes) => {
                let at = address - self.low;
                let word = bytes.get(at..at + 8)?;
                Some(usize::from_ne_bytes(word.try_into().ok()?))
            }
            // SAFETY: `[low, high)` is part of a stack that is mapped as long as its thread runs (the walking
            // thread itself, or a stack it is running a signal handler on), and only memory at or above the
            // interrupted stack pointer is in the window.
            None => Some(unsafe { (address as *const usize).read_unaligned() }),
        }
    }
}

/// Where the stacks a walk may read are: the thread's own stack, its alternate signal stack, or else a copy.
pub trait StackBounds {
    /// The thread's stack `[low, high)` as recorded when it started, if known.
    fn thread_stack(&self) -> Option<(usize, usize)>;
    /// The thread's alternate signal stack, if it has one.
    fn alternate_stack(&self) -> Option<(usize, usize)>;
    /// Copies memory from `address` into `buffer` without faulting; the bytes copied.
    fn copy(&self, address: usize, buffer: &mut [u8]) -> usize;
}

/// The window for a stack whose pointer is `sp`: from `sp` to the top of the known stack holding it, or a copy
/// of up to `scratch.len()` bytes above `sp` when no known stack holds it (coroutine stacks, threads the
/// runtime did not see start).
fn window_for<'a>(
    sp: usize,
    bounds: &impl StackBounds,
    scratch: &'a mut [u8],
) -> Option<Window<'a>> {
    // The alternate stack is asked for (a system call) only when the thread's own stack does not hold `sp`.
    let holds_sp = |&(low, high): &(usize, usize)| low <= sp && sp < high;
    let known = bounds
        .thread_stack()
        .filter(holds_sp)
        .or_else(|| bounds.alternate_stack().filter(holds_sp));
    if let Some((_, high)) = known {
        return Some(Window {
            low: sp,
            high,
            copy: None,
        });
    }
    let copied = bounds.copy(sp, scratch);
    (copied >= 8).then(|| Window {
        low: sp,
        high: sp + copied,
        copy: scratch.get(..copied),
    })
}

/// One frame: load instance key and link-time address (`UNKNOWN_KEY`, 0 outside every module).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub key: u32,
    pub address: u64,
}

/// The walk stopped at the depth limit with frames left.
pub const TRUNCATED_DEPTH: u32 = mslprof_format::model::stack_flags::TRUNCATED_DEPTH;
/// The walk stopped before the outermost frame.
pub const TRUNCATED_UNWIND: u32 = mslprof_format::model::stack_flags::TRUNCATED_UNWIND;

/// Bytes above a signal frame's rsp that the walk reads its `ucontext` from (the saved rip, rsp and rbp lie
/// within them).
const UCONTEXT_READ_BYTES: usize = 256;

/// Length of glibc's `__restore_rt` (`mov $15, %rax; syscall`): a sample can land on either instruction.
const RESTORER_BYTES: usize = 9;

/// Walks the stack from `start` into `frames` (leaf first); returns the frame count, the flags and the walk's
/// reach: the bytes above `start.sp` it needed (up to the last frame's CFA; `usize::MAX` when a signal frame led
/// below `start.sp`, to another stack).
/// `restorer` is the signal trampoline's address (0: unknown, signal frames end the walk). The rule for each
/// frame's address comes from `cache` when it holds it, else from the module's call-frame information (then
/// `cache` keeps it). Async-signal-safe: no allocation, no lock, no read outside the windows, no panic (checked
/// indexing).
pub fn walk(
    start: Registers,
    frames: &mut [Frame],
    bounds: &impl StackBounds,
    scratch: &mut [u8],
    cache: &mut RuleCache,
    restorer: usize,
) -> (usize, u32, usize) {
    let mut context = UnwindContext::<usize, StoreOnStack>::new_in();
    let mut registers = start;
    let mut highest = start.sp;
    // The pc is the interrupted instruction (frame 0, or a frame a signal interrupted), not a return address.
    let mut exact = true;
    let mut depth = 0;
    let mut flags = 0;
    let (rip_at, rsp_at, rbp_at) = crate::sys::ucontext_register_offsets();
    let mut window = window_for(registers.sp, bounds, scratch);
    loop {
        let pc = registers.pc;
        // A return address is one past its call: look up the call instruction itself.
        let lookup = if exact { pc } else { pc.wrapping_sub(1) };
        let module = modules::find_address(RuntimeAddress::from_usize(lookup));
        let Some(slot) = frames.get_mut(depth) else {
            flags |= TRUNCATED_DEPTH;
            break;
        };
        *slot = match module {
            Some(module) => Frame {
                key: module.key,
                // A frame that a signal interrupted is recorded as if it were a return address (one past),
                // so that readers, which look up `address - 1` for every frame but the first, find it.
                address: module
                    .link_address(RuntimeAddress::from_usize(pc))
                    .0
                    .wrapping_add(u64::from(exact && depth > 0)),
            },
            None => Frame {
                key: UNKNOWN_KEY,
                address: 0,
            },
        };
        depth += 1;
        let Some(stack) = window.as_ref() else {
            flags |= TRUNCATED_UNWIND;
            break;
        };
        let at_restorer = restorer != 0
            && (pc == restorer || (exact && pc > restorer && pc < restorer + RESTORER_BYTES));
        if at_restorer {
            // The handler returned into the trampoline: the `ucontext` of the rt_sigframe is at rsp (the
            // frame's `pretcode` was popped by the handler's `ret`), holding the interrupted registers.
            let sp = registers.sp;
            let saved = (
                stack.read(sp.wrapping_add(rip_at)),
                stack.read(sp.wrapping_add(rsp_at)),
                stack.read(sp.wrapping_add(rbp_at)),
            );
            let (Some(pc), Some(sp), Some(fp)) = saved else {
                flags |= TRUNCATED_UNWIND;
                break;
            };
            highest = highest.max(registers.sp.saturating_add(UCONTEXT_READ_BYTES));
            highest = if sp < start.sp {
                usize::MAX
            } else {
                highest.max(sp)
            };
            registers = Registers { pc, sp, fp };
            exact = true;
            window = window_for(sp, bounds, scratch);
            continue;
        }
        let rule = match module {
            Some(module) => {
                let address = module.link_address(RuntimeAddress::from_usize(lookup)).0;
                cache.get(module.key, address).unwrap_or_else(|| {
                    let row = module
                        .unwind
                        .as_ref()
                        .and_then(|unwind| unwind.row(address, &mut context));
                    let rule = Rule::for_row(row);
                    cache.put(module.key, address, rule);
                    rule
                })
            }
            None => Rule::FramePointer,
        };
        let step = rule.apply(registers, stack);
        match step {
            Step::Caller(caller) if caller.pc != 0 && caller.sp > registers.sp => {
                highest = highest.max(caller.sp);
                registers = caller;
                exact = false;
            }
            Step::End => break,
            _ => {
                flags |= TRUNCATED_UNWIND;
                break;
            }
        }
    }
    (depth, flags, highest.saturating_sub(start.sp))
}
