//! The output-file naming rule of the runtime's profiles (README.md, "Where the profile goes"): `GPROFDIR`,
//! then `GMON_OUT_PREFIX`, then `gmon.out`. Pure functions of the variables' values, the process id, the
//! program name and whether the process writes a pid-named file, so the runtime and the tools agree.

/// Where a process's profile goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputRule {
    /// `GPROFDIR` set to the empty string: no output.
    Nothing,
    /// `GPROFDIR=dir`: `dir/PID.progname`.
    Directory(Vec<u8>),
    /// `GMON_OUT_PREFIX=p`: `p.PID`.
    Prefix(Vec<u8>),
    /// `gmon.out` in the working directory at exit (`gmon.out.PID` for a pid-named file).
    Default,
}

/// The rule the values of `GPROFDIR` and `GMON_OUT_PREFIX` (`None`: unset) select: `GPROFDIR` (even empty)
/// wins over a non-empty `GMON_OUT_PREFIX`, which wins over `gmon.out`.
pub fn output_rule(gprofdir: Option<&[u8]>, prefix: Option<&[u8]>) -> OutputRule {
    match (gprofdir, prefix) {
        (Some([]), _) => OutputRule::Nothing,
        (Some(dir), _) => OutputRule::Directory(dir.to_vec()),
        (None, Some(prefix)) if !prefix.is_empty() => OutputRule::Prefix(prefix.to_vec()),
        _ => OutputRule::Default,
    }
}

impl OutputRule {
    /// The file process `pid` of `program_name` (argv\[0\] without directories) writes; `None` for no file.
    /// `pid_named` (a forked child, a descendant of the profiled process) selects `gmon.out.PID` under the
    /// default rule; the other rules always name the pid.
    pub fn path(&self, pid: u32, program_name: &[u8], pid_named: bool) -> Option<Vec<u8>> {
        let pid = pid.to_string();
        match self {
            OutputRule::Nothing => None,
            OutputRule::Directory(dir) => {
                let mut path = dir.clone();
                if !path.ends_with(b"/") {
                    path.push(b'/');
                }
                path.extend_from_slice(pid.as_bytes());
                path.push(b'.');
                path.extend_from_slice(program_name);
                Some(path)
            }
            OutputRule::Prefix(prefix) => Some([prefix.as_slice(), b".", pid.as_bytes()].concat()),
            OutputRule::Default if pid_named => Some([&b"gmon.out."[..], pid.as_bytes()].concat()),
            OutputRule::Default => Some(b"gmon.out".to_vec()),
        }
    }
}

/// [`output_rule`] and [`OutputRule::path`] in one step.
pub fn output_path(
    gprofdir: Option<&[u8]>,
    prefix: Option<&[u8]>,
    pid: u32,
    program_name: &[u8],
    pid_named: bool,
) -> Option<Vec<u8>> {
    output_rule(gprofdir, prefix).path(pid, program_name, pid_named)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_naming_rules() {
        assert_eq!(output_rule(Some(b""), Some(b"p")), OutputRule::Nothing);
        assert_eq!(output_path(Some(b""), None, 7, b"app", true), None);
        assert_eq!(
            output_path(Some(b"/tmp/d"), Some(b"p"), 42, b"app", false).unwrap(),
            b"/tmp/d/42.app"
        );
        assert_eq!(
            output_path(Some(b"d/"), None, 42, b"app", true).unwrap(),
            b"d/42.app"
        );
        assert_eq!(
            output_path(None, Some(b"out/prof"), 7, b"app", false).unwrap(),
            b"out/prof.7"
        );
        assert_eq!(
            output_path(None, Some(b"out/prof"), 7, b"app", true).unwrap(),
            b"out/prof.7"
        );
        assert_eq!(
            output_path(None, Some(b""), 7, b"app", false).unwrap(),
            b"gmon.out"
        );
        assert_eq!(
            output_path(None, None, 7, b"app", false).unwrap(),
            b"gmon.out"
        );
        assert_eq!(
            output_path(None, None, 7, b"app", true).unwrap(),
            b"gmon.out.7"
        );
        assert_eq!(OutputRule::Nothing.path(7, b"app", false), None);
    }
}
