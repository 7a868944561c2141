//! Writer and reader of the mslprof profile format (see SPEC.md), and of GNU/BSD gmon.out.

pub mod model;

pub use model::*;
