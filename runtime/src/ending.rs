//! The end-of-process record: which process this is in the profiled tree (root, descendant, forked child)
//! and how its image ends, as the dump's file name and header state them. `lifecycle` records, `dump` reads.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use mslprof_format::model::{IncompleteCause, header_flags};

/// How this image ends and where it stands in the process tree. Atomics only: read from signal handlers.
#[derive(Debug)]
pub struct Ending {
    /// This process (image) was started by a profiled process: its file is pid-named.
    descendant: AtomicBool,
    /// A fork happened since start-up: this process is a forked child.
    forked_child: AtomicBool,
    /// `IncompleteCause` code (0 = normal end).
    cause: AtomicU32,
    /// The signal of an ending by signal.
    signal: AtomicU32,
    /// The image is about to be replaced by `exec`: its file is `<name>.pre-exec`.
    pre_exec: AtomicBool,
}

/// The one end-of-process record of this process.
pub static ENDING: Ending = Ending::new();

/// What the header of a dump says about the ending: flags to add, incomplete cause and signal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndingHeader {
    pub flags: u32,
    pub cause: IncompleteCause,
    pub signal: u32,
}

impl Ending {
    /// A root process that has not ended.
    pub const fn new() -> Ending {
        Ending {
            descendant: AtomicBool::new(false),
            forked_child: AtomicBool::new(false),
            cause: AtomicU32::new(0),
            signal: AtomicU32::new(0),
            pre_exec: AtomicBool::new(false),
        }
    }

    pub fn set_descendant(&self, descendant: bool) {
        self.descendant.store(descendant, Ordering::Relaxed);
    }

    /// Whether this process writes a pid-named file rather than `gmon.out` (a forked child, a descendant).
    pub fn writes_pid_named_file(&self) -> bool {
        self.forked_child.load(Ordering::Relaxed) || self.descendant.load(Ordering::Relaxed)
    }

    /// Whether the image is about to be replaced by `exec` (which may fail: the image then goes on).
    pub fn is_pre_exec(&self) -> bool {
        self.pre_exec.load(Ordering::Relaxed)
    }

    pub fn is_forked_child(&self) -> bool {
        self.forked_child.load(Ordering::Relaxed)
    }

    /// Records how the image ends (`pre_exec`: it is about to be replaced).
    pub fn record(&self, cause: IncompleteCause, signal: u32, pre_exec: bool) {
        if pre_exec {
            self.pre_exec.store(true, Ordering::Relaxed);
        }
        self.cause.store(cause.code(), Ordering::Relaxed);
        self.signal.store(signal, Ordering::Relaxed);
    }

    /// The image goes on after all (its exec failed): it ends normally later.
    pub fn clear(&self) {
        self.pre_exec.store(false, Ordering::Relaxed);
        self.cause.store(0, Ordering::Relaxed);
        self.signal.store(0, Ordering::Relaxed);
    }

    /// Whether an incomplete ending was recorded.
    pub fn is_incomplete(&self) -> bool {
        self.cause.load(Ordering::Relaxed) != 0
    }

    /// The output path for this dump: `path` as the output rule gives it, plus `.pre-exec` for an image about
    /// to be replaced.
    pub fn output_path(&self, mut path: Vec<u8>) -> Vec<u8> {
        if self.pre_exec.load(Ordering::Relaxed) {
            path.extend_from_slice(b".pre-exec");
        }
        path
    }

    /// Header flags and incomplete cause/signal for the dump being written.
    pub fn header(&self) -> EndingHeader {
        let mut header = EndingHeader::default();
        let code = self.cause.load(Ordering::Relaxed);
        if code != 0 {
            header.flags |= header_flags::INCOMPLETE;
            header.cause = IncompleteCause::from_code(code);
            header.signal = self.signal.load(Ordering::Relaxed);
        }
        if self.pre_exec.load(Ordering::Relaxed) {
            header.flags |= header_flags::PRE_EXEC;
        }
        if self.forked_child.load(Ordering::Relaxed) {
            header.flags |= header_flags::FORKED_CHILD;
        }
        header
    }

    /// In a forked child: a forked child whose ending is not known yet.
    pub fn reset_after_fork(&self) {
        self.forked_child.store(true, Ordering::Relaxed);
        self.clear();
    }
}

impl Default for Ending {
    fn default() -> Self {
        Ending::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_name_the_file_and_fill_the_header() {
        let ending = Ending::new();
        assert!(!ending.writes_pid_named_file());
        assert_eq!(ending.header(), EndingHeader::default());
        assert_eq!(ending.output_path(b"gmon.out".to_vec()), b"gmon.out");

        ending.record(IncompleteCause::Exec, 0, true);
        assert_eq!(
            ending.output_path(b"gmon.out".to_vec()),
            b"gmon.out.pre-exec"
        );
        assert_eq!(
            ending.header(),
            EndingHeader {
                flags: header_flags::INCOMPLETE | header_flags::PRE_EXEC,
                cause: IncompleteCause::Exec,
                signal: 0,
            }
        );
        // The exec failed: the image goes on and ends normally.
        ending.clear();
        assert_eq!(ending.header(), EndingHeader::default());
        assert!(!ending.is_incomplete());

        ending.record(IncompleteCause::Signal, 11, false);
        ending.reset_after_fork();
        assert!(ending.writes_pid_named_file() && ending.is_forked_child());
        assert_eq!(
            ending.header(),
            EndingHeader {
                flags: header_flags::FORKED_CHILD,
                ..EndingHeader::default()
            }
        );
        ending.record(IncompleteCause::Signal, 11, false);
        assert_eq!(ending.header().signal, 11);
        assert_eq!(ending.output_path(b"p".to_vec()), b"p");

        let descendant = Ending::new();
        descendant.set_descendant(true);
        assert!(descendant.writes_pid_named_file() && !descendant.is_forked_child());
    }
}
