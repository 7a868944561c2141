//! Generated call-heavy programs for the large-working-set benchmark: N distinct call sites (N distinct arcs)
//! over M small functions, swept again and again in address order. Each driver function holds 1 000 direct
//! calls; the callee of each site is either in address order (site i calls function i mod M) or scrambled
//! (a fixed pseudo-random permutation per driver), so the callee side of the lookups is local or not while
//! the call sites, as in any real program, are executed in address order.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::analysis::Xorshift;
use crate::fixtures::{Builds, cc};

/// Calls per generated driver function.
pub const CALLS_PER_DRIVER: usize = 1000;

/// The order in which each driver's call sites name their callees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalleeOrder {
    Address,
    Scrambled,
}

impl CalleeOrder {
    pub fn label(self) -> &'static str {
        match self {
            CalleeOrder::Address => "address order",
            CalleeOrder::Scrambled => "scrambled callees",
        }
    }
}

/// One generated program: its sizes and its two builds.
pub struct Program {
    pub sites: usize,
    pub functions: usize,
    pub drivers: usize,
    pub builds: Builds,
}

impl Program {
    /// Calls one sweep makes: every site once, plus the calls of the drivers themselves.
    pub fn calls_per_sweep(&self) -> u64 {
        (self.sites + self.drivers) as u64
    }
}

/// The C source of a program with `sites` call sites over `functions` callees. `main(sweeps)` runs every
/// driver `sweeps` times and prints a checksum.
pub fn source(sites: usize, functions: usize, order: CalleeOrder) -> String {
    let drivers = sites.div_ceil(CALLS_PER_DRIVER);
    let mut c = String::with_capacity(sites * 12 + functions * 64);
    c.push_str("#include <stdio.h>\n#include <stdlib.h>\nvolatile long sink;\n");
    for f in 0..functions {
        let _ = writeln!(c, "__attribute__((noinline)) void f{f}(void) {{ sink++; }}");
    }
    let mut shuffle = Xorshift(0x9E37_79B9_7F4A_7C15);
    let mut site = 0;
    for d in 0..drivers {
        let count = CALLS_PER_DRIVER.min(sites - site);
        let mut callees: Vec<usize> = (site..site + count).map(|s| s % functions).collect();
        if order == CalleeOrder::Scrambled {
            shuffle.permute(&mut callees);
        }
        let _ = writeln!(c, "__attribute__((noinline)) void d{d}(void) {{");
        for f in callees {
            let _ = writeln!(c, " f{f}();");
        }
        c.push_str("}\n");
        site += count;
    }
    c.push_str("static void (*const drivers[])(void) = {");
    for d in 0..drivers {
        let _ = write!(c, "d{d},");
    }
    c.push_str("};\n");
    c.push_str(
        "int main(int argc, char **argv) {\n long sweeps = argc > 1 ? atol(argv[1]) : 1;\n \
         for (long s = 0; s < sweeps; s++)\n  for (unsigned i = 0; i < sizeof drivers / sizeof *drivers; i++)\n   drivers[i]();\n \
         printf(\"%ld\\n\", sink);\n return 0;\n}\n",
    );
    c
}

/// Writes and builds (plain and `-pg`, both -O1: the drivers are straight-line calls) one program in `dir`.
pub fn build(dir: &Path, sites: usize, order: CalleeOrder) -> Result<Program, String> {
    let functions = sites.min(2000);
    let stem = format!(
        "ws_{sites}_{}",
        if order == CalleeOrder::Address {
            "a"
        } else {
            "s"
        }
    );
    let src: PathBuf = dir.join(format!("{stem}.c"));
    std::fs::write(&src, source(sites, functions, order))
        .map_err(|e| format!("{}: {e}", src.display()))?;
    let src = src.to_string_lossy();
    let plain = format!("{stem}_plain");
    let pg = format!("{stem}_pg");
    cc(dir, &["-O1", "-o", &plain, &src])?;
    cc(dir, &["-O1", "-pg", "-o", &pg, &src])?;
    Ok(Program {
        sites,
        functions,
        drivers: sites.div_ceil(CALLS_PER_DRIVER),
        builds: Builds {
            plain: dir.join(plain),
            pg: dir.join(pg),
        },
    })
}
