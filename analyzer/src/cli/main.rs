//! mslprof: gprof-compatible reports over multi-module profiles.
//!
//! `mslprof [gprof options] [executable [profile-files...]]` reports like GNU gprof;
//! `mslprof run`, `mslprof demo` and `mslprof export` are the subcommands. This folder is the binary: the
//! command line over the `mslprof_analyzer` library.

use std::process::ExitCode;

mod arguments;
mod commands;
mod embedded;
mod export_cli;
mod report_cli;
mod runcmd;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => runcmd::run(&args[1..]),
        Some("demo") => commands::demo(&args[1..]),
        Some("export") => export_cli::export(&args[1..]),
        _ => report_cli::report_main(&args),
    }
}
