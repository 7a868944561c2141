//! Loader events for the runtime: start-up scan, dlopen/dlclose, fork, exec and termination.

pub mod scan;
mod sys;

pub use scan::{LinkRange, LoaderScan, ModuleInfo, scan, scan_loaded_modules};
