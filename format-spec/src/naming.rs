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
        if *self == OutputRule::Default && !pid_named {
            return Some(b"gmon.out".to_vec());
        }
        let (before, after) = self.pid_named_parts(program_name)?;
        Some(
            [
                before.as_slice(),
                pid.to_string().as_bytes(),
                after.as_slice(),
            ]
            .concat(),
        )
    }

    /// A pid-named file's name as the parts before and after the pid (`path(pid, program_name, true)` is
    /// `before`, the pid in decimal, `after`); `None` for no file. A forked child names its file from them
    /// without the heap.
    pub fn pid_named_parts(&self, program_name: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        match self {
            OutputRule::Nothing => None,
            OutputRule::Directory(dir) => {
                let mut before = dir.clone();
                if !before.ends_with(b"/") {
                    before.push(b'/');
                }
                Some((before, [&b"."[..], program_name].concat()))
            }
            OutputRule::Prefix(prefix) => Some(([prefix.as_slice(), b"."].concat(), Vec::new())),
            OutputRule::Default => Some((b"gmon.out.".to_vec(), Vec::new())),
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
        assert_eq!(
            output_rule(Some(b"d"), None).pid_named_parts(b"app"),
            Some((b"d/".to_vec(), b".app".to_vec()))
        );
        assert_eq!(
            OutputRule::Prefix(b"p".to_vec()).pid_named_parts(b"app"),
            Some((b"p.".to_vec(), Vec::new()))
        );
        assert_eq!(OutputRule::Nothing.pid_named_parts(b"app"), None);
    }
}
