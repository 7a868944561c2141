//! Loader events for the runtime: start-up scan, dlopen/dlclose, fork, exec and termination.
