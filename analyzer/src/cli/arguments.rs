//! Parsing a command line with clap the way every `mslprof` command reports problems: `--help` and
//! `--version` print and succeed; an error prints its first line as `mslprof: ...` and fails with status 1.

use std::process::ExitCode;

use clap::Parser;

/// Parse `args` (without the program name) for the command `name`; `prefix` starts error lines
/// (`"mslprof: "`, `"mslprof: export: "`). `Err` carries the exit status to return at once.
pub fn parse<T: Parser>(
    name: &str,
    args: impl IntoIterator<Item = String>,
    prefix: &str,
) -> Result<T, ExitCode> {
    match T::try_parse_from(std::iter::once(name.to_string()).chain(args)) {
        Ok(c) => Ok(c),
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("{prefix}{}", first.trim_start_matches("error: "));
            Err(ExitCode::from(1))
        }
    }
}
