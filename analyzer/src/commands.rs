//! The subcommands `run`, `demo` and `export`.

use std::path::Path;
use std::process::ExitCode;

use object::Object;

use mslprof_analyzer::input::Target;

/// Byte order and address width of an ELF file (for GNU gmon.out decoding).
pub fn elf_target(path: &Path) -> Option<Target> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    Some(Target {
        big_endian: !file.is_little_endian(),
        address_size: if file.is_64() { 8 } else { 4 },
    })
}

pub fn run(_args: &[String]) -> ExitCode {
    eprintln!("mslprof: run: the runtime (libmslprof.so) is not available in this build yet");
    ExitCode::from(1)
}

pub fn demo(_args: &[String]) -> ExitCode {
    eprintln!("mslprof: demo: the runtime (libmslprof.so) is not available in this build yet");
    ExitCode::from(1)
}

pub fn export(_args: &[String]) -> ExitCode {
    eprintln!("mslprof: export: needs the format-spec reader, not merged yet");
    ExitCode::from(1)
}
