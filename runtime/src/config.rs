//! Settings read once at start-up: sampling rate, bucket width, module selection and output naming.
//!
//! Invalid values are reported with one stderr line naming the value, and the default is used.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

pub use mslprof_format::naming::{OutputRule, output_rule};

use crate::histogram::BucketBits;
use crate::selection::Selection;
use crate::sys;

/// Default sampling rate (samples per second of CPU time): "each sample counts as 0.01 seconds".
pub const DEFAULT_HZ: u32 = 100;
/// Highest `MSLPROF_HZ`, whose period is the shortest a task clock samples at
/// ([`crate::task_clock::SHORTEST_PERIOD_NS`], which says why). A higher rate asked for gets one warning line and
/// this one. CPU-time timers (where perf events are refused) give at most the kernel tick's rate (README).
pub const MAX_HZ: u32 = (1_000_000_000 / crate::task_clock::SHORTEST_PERIOD_NS) as u32;
/// The symbol a program may define to choose its bucket width at link time (`int`, 16 or 32).
pub const BUCKET_SIZE_SYMBOL: &std::ffi::CStr = c"mslprof_profilebucketsize";

/// Set by `mslprof run` to the option that gave `MSLPROF_PROFILE` (`--profile`), for the warnings to name it;
/// the runtime's constructor takes it out of the program's environment.
pub const SELECTION_OPTION: &str = "MSLPROF_PROFILE_OPTION";

#[derive(Debug)]
pub struct Settings {
    pub hz: u32,
    pub bucket_bits: BucketBits,
    pub selection: Selection,
    /// What the user set to select modules, as warnings name it: `MSLPROF_PROFILE`, `LD_PROFILE`, or the
    /// option `mslprof run` names in [`SELECTION_OPTION`] (`--profile`).
    pub selection_source: Vec<u8>,
    pub output: OutputRule,
    /// argv[0] without its directories.
    pub program_name: Vec<u8>,
    /// `output`'s pid-named file name, before and after the pid (`None`: no file), for a forked child.
    pub pid_named_parts: Option<(Vec<u8>, Vec<u8>)>,
    /// `MSLPROF_NEAR_MCOUNT` is not `0`: a far main program calls a copy of `mcount` next to it
    /// (`mcount::near`).
    pub near_mcount: bool,
    /// `MSLPROF_SITE_STUBS`: when the profiled modules' `-pg` calls of `mcount` become jumps to per-function
    /// stubs (`mcount::sites`).
    pub site_stubs: SiteStubs,
    /// `MSLPROF_PLT_SITES` is not `0`: the hottest calls through the PLT that the audit module counts are
    /// rewritten to call stubs of their own (`mcount::plt_sites`).
    pub plt_sites: bool,
    /// `MSLPROF_STACK_DEPTH`: the most frames of a sample's call stack (0: no stacks).
    pub stack_depth: u32,
    /// `MSLPROF_STACK_TABLE_KB`: the memory of the table of distinct stacks.
    pub stack_table_kb: u32,
}

impl Settings {
    /// The file process `pid` writes (`pid_named`: a forked child or a descendant); `None` for no file.
    pub fn output_path(&self, pid: u32, pid_named: bool) -> Option<Vec<u8>> {
        self.output.path(pid, &self.program_name, pid_named)
    }
}

fn env(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

impl Settings {
    /// Reads the environment (and the program's link-time bucket-size symbol).
    pub fn from_environment() -> Settings {
        let argv0 = sys::argv0();
        let program_name = argv0
            .rsplit(|&b| b == b'/')
            .next()
            .unwrap_or_default()
            .to_vec();
        let output = output_rule(
            env("GPROFDIR").as_deref().map(|v| v.as_bytes()),
            env("GMON_OUT_PREFIX").as_deref().map(|v| v.as_bytes()),
        );
        // MSLPROF_PROFILE, when set, stands for LD_PROFILE: glibc's ld.so never reads it, so selecting
        // modules with it does not send every PLT call through ld.so's own profiling trampoline.
        // MSLPROF_LD_PROFILE is LD_PROFILE while the runtime's restart has it renamed (reexec.rs): only seen
        // when another library's constructor started the runtime before the runtime's own constructor ran.
        let (selection_variable, selection) = [
            ("MSLPROF_PROFILE", "MSLPROF_PROFILE"),
            ("LD_PROFILE", "LD_PROFILE"),
            ("MSLPROF_LD_PROFILE", "LD_PROFILE"),
        ]
        .into_iter()
        .find_map(|(variable, shown)| env(variable).map(|value| (shown, Some(value))))
        .unwrap_or(("LD_PROFILE", None));
        let hz = sampling_rate(env("MSLPROF_HZ").as_deref().map(|v| v.as_bytes()));
        Settings {
            hz,
            bucket_bits: bucket_bits(
                env("LD_PROFILEBUCKET_SIZE")
                    .as_deref()
                    .map(|v| v.as_bytes()),
                link_time_bucket_bits(),
            ),
            selection: Selection::parse(selection.as_deref().map(|v| v.as_bytes())),
            selection_source: match env(SELECTION_OPTION) {
                Some(option) => option.as_bytes().to_vec(),
                None => selection_variable.as_bytes().to_vec(),
            },
            pid_named_parts: output.pid_named_parts(&program_name),
            output,
            program_name,
            near_mcount: env("MSLPROF_NEAR_MCOUNT").is_none_or(|v| v != "0"),
            site_stubs: site_stubs(env("MSLPROF_SITE_STUBS").as_deref()),
            plt_sites: env("MSLPROF_PLT_SITES").is_none_or(|v| v != "0"),
            stack_depth: bounded_setting(
                "MSLPROF_STACK_DEPTH",
                env("MSLPROF_STACK_DEPTH").as_deref().map(|v| v.as_bytes()),
                0..=crate::stacks::MAX_DEPTH,
                crate::stacks::DEFAULT_DEPTH,
            ),
            stack_table_kb: bounded_setting(
                "MSLPROF_STACK_TABLE_KB",
                env("MSLPROF_STACK_TABLE_KB")
                    .as_deref()
                    .map(|v| v.as_bytes()),
                64..=1 << 20,
                crate::stacks::DEFAULT_TABLE_KB,
            ),
        }
    }
}

/// `MSLPROF_SITE_STUBS`: which `-pg` sites become jumps to per-function stubs, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteStubs {
    /// `0`: none; every call reaches `mcount`.
    Off,
    /// The default: those of the functions found hot while the program runs (`mcount::hot`).
    WhenHot,
    /// `1`: every eligible site, at start-up.
    AtStartUp,
}

/// `MSLPROF_SITE_STUBS`: `0`, `1`, or unset (or anything else) for the default.
pub fn site_stubs(value: Option<&std::ffi::OsStr>) -> SiteStubs {
    match value.map(|v| v.as_encoded_bytes()) {
        Some(b"0") => SiteStubs::Off,
        Some(b"1") => SiteStubs::AtStartUp,
        _ => SiteStubs::WhenHot,
    }
}

fn parse_integer(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// `MSLPROF_HZ`: 1 ..= [`MAX_HZ`], default [`DEFAULT_HZ`]; a higher rate gets [`MAX_HZ`], with a warning.
pub fn sampling_rate(value: Option<&[u8]>) -> u32 {
    let Some(value) = value else {
        return DEFAULT_HZ;
    };
    match parse_integer(value) {
        Some(hz) if (1..=i64::from(MAX_HZ)).contains(&hz) => hz as u32,
        Some(hz) if hz > i64::from(MAX_HZ) => {
            sys::stderr_line(&[
                b"mslprof: MSLPROF_HZ=",
                value,
                b" is above 10000, the highest rate (faster, a sample's cost nears its period and the program \
                  can almost stop); using 10000\n",
            ]);
            MAX_HZ
        }
        _ => {
            sys::stderr_line(&[
                b"mslprof: MSLPROF_HZ=",
                value,
                b" is not a rate between 1 and 10000; using 100\n",
            ]);
            DEFAULT_HZ
        }
    }
}

/// A whole-number setting `name` within `range`; `default` when unset, else one warning line and `default`.
pub fn bounded_setting(
    name: &str,
    value: Option<&[u8]>,
    range: std::ops::RangeInclusive<u32>,
    default: u32,
) -> u32 {
    let Some(value) = value else {
        return default;
    };
    match parse_integer(value) {
        Some(n) if (i64::from(*range.start())..=i64::from(*range.end())).contains(&n) => n as u32,
        _ => {
            // At start-up: allocating is fine.
            let bounds = format!(
                " is not a whole number from {} to {}; using {default}\n",
                range.start(),
                range.end()
            );
            sys::stderr_line(&[
                b"mslprof: ",
                name.as_bytes(),
                b"=",
                value,
                bounds.as_bytes(),
            ]);
            default
        }
    }
}

/// The program's own default from [`BUCKET_SIZE_SYMBOL`], if it defines a valid one.
fn link_time_bucket_bits() -> Option<BucketBits> {
    let address = sys::global_symbol(BUCKET_SIZE_SYMBOL)?;
    // SAFETY: the program documents this symbol as an `int` (runtime/README.md).
    let value = unsafe { sys::read_int(address) };
    let bits = BucketBits::from_bits(i64::from(value));
    if bits.is_none() {
        let text = value.to_string();
        sys::stderr_line(&[
            b"mslprof: mslprof_profilebucketsize=",
            text.as_bytes(),
            b" is not 16 or 32; using 16\n",
        ]);
    }
    bits
}

/// `LD_PROFILEBUCKET_SIZE` overrides the program's link-time default, which overrides 16.
pub fn bucket_bits(value: Option<&[u8]>, link_time: Option<BucketBits>) -> BucketBits {
    let default = link_time.unwrap_or(BucketBits::Sixteen);
    let Some(value) = value else { return default };
    match parse_integer(value).and_then(BucketBits::from_bits) {
        Some(bits) => bits,
        None => {
            let fallback: &[u8] = if default == BucketBits::Sixteen {
                b"16"
            } else {
                b"32"
            };
            sys::stderr_line(&[
                b"mslprof: LD_PROFILEBUCKET_SIZE=",
                value,
                b" is not 16 or 32; using ",
                fallback,
                b"\n",
            ]);
            default
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_bucket_widths_parse_with_defaults() {
        assert_eq!(sampling_rate(None), 100);
        assert_eq!(sampling_rate(Some(b"250")), 250);
        assert_eq!(sampling_rate(Some(b"0")), 100);
        assert_eq!(sampling_rate(Some(b"fast")), 100);
        assert_eq!(sampling_rate(Some(b"10000")), 10_000);
        assert_eq!(sampling_rate(Some(b"10001")), 10_000);
        assert_eq!(sampling_rate(Some(b"100000")), 10_000);
        assert_eq!(sampling_rate(Some(b"-5")), 100);
        assert_eq!(bucket_bits(None, None), BucketBits::Sixteen);
        assert_eq!(
            bucket_bits(None, Some(BucketBits::ThirtyTwo)),
            BucketBits::ThirtyTwo
        );
        assert_eq!(
            bucket_bits(Some(b"16"), Some(BucketBits::ThirtyTwo)),
            BucketBits::Sixteen
        );
        assert_eq!(bucket_bits(Some(b"32"), None), BucketBits::ThirtyTwo);
        assert_eq!(bucket_bits(Some(b"64"), None), BucketBits::Sixteen);
        assert_eq!(
            bucket_bits(Some(b"64"), Some(BucketBits::ThirtyTwo)),
            BucketBits::ThirtyTwo
        );
    }
}
