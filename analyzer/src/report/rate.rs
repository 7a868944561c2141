//! The line of an mslprof report that says how densely the run was sampled: the rate achieved against the one
//! asked for, what sent the samples, how far the top row of the flat profile can be off by chance, and
//! whether threads went unsampled because they blocked SIGPROF.

use mslprof_format::model::{Header, header_flags, sampling_sources};

/// Whether the profile gets a rate line: its runtime recorded what sampled it, and the period.
pub fn applies(header: &Header) -> bool {
    header.sampling_sources != 0 && header.sample_period_ns != 0
}

/// The rate line, for a profile whose runtime recorded its sampling source (format 1.3 and later); `None`
/// for older files and GNU input, whose reports keep their old first lines. `top_samples` is the sample count of
/// the flat profile's first row: by the gprof manual's "Statistical Sampling Error", its expected error is
/// about √n samples.
pub fn rate_line(header: &Header, top_samples: f64) -> Option<String> {
    if !applies(header) {
        return None;
    }
    let achieved = 1e9 / header.sample_period_ns as f64;
    let source = match header.sampling_sources {
        sampling_sources::TASK_CLOCK => "per-thread task clocks",
        sampling_sources::CPU_TIMER => "per-thread CPU-time timers, checked on the kernel tick",
        _ => "task clocks and CPU-time timers",
    };
    let mut line = format!(
        "Sampled at {achieved:.0} samples per CPU-second ({} asked for; {source}).",
        header.hz
    );
    let top = top_samples.round();
    if top >= 1.0 {
        let error = top.sqrt();
        line.push_str(&format!(
            " The top row's {top:.0} samples are good to about ±{error:.0} (±{:.1} %).",
            100.0 / error
        ));
    }
    if header.flags & header_flags::SIGPROF_BLOCKED != 0 {
        line.push_str(
            "\nThe program blocked SIGPROF in threads sampled by signals: they were not sampled while they \
             did (without stacks, MSLPROF_STACK_DEPTH=0, samples above 200 per second are taken anyway).",
        );
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(sources: u32, hz: u32, period: u64) -> Header {
        Header {
            sampling_sources: sources,
            hz,
            sample_period_ns: period,
            ..Header::default()
        }
    }

    #[test]
    fn says_the_rate_achieved_the_source_and_the_top_rows_error() {
        assert_eq!(
            rate_line(
                &header(sampling_sources::TASK_CLOCK, 1000, 1_010_000),
                400.0
            )
            .unwrap(),
            "Sampled at 990 samples per CPU-second (1000 asked for; per-thread task clocks). \
             The top row's 400 samples are good to about ±20 (±5.0 %)."
        );
        assert_eq!(
            rate_line(&header(sampling_sources::CPU_TIMER, 1000, 4_000_000), 0.0).unwrap(),
            "Sampled at 250 samples per CPU-second (1000 asked for; per-thread CPU-time timers, checked on \
             the kernel tick)."
        );
    }

    #[test]
    fn threads_that_blocked_sigprof_are_said_to_be_unsampled() {
        let mut blocked = header(sampling_sources::CPU_TIMER, 100, 300_000_000);
        blocked.flags = header_flags::SIGPROF_BLOCKED;
        assert_eq!(
            rate_line(&blocked, 1.0).unwrap(),
            "Sampled at 3 samples per CPU-second (100 asked for; per-thread CPU-time timers, checked on the \
             kernel tick). The top row's 1 samples are good to about ±1 (±100.0 %).\n\
             The program blocked SIGPROF in threads sampled by signals: they were not sampled while they did \
             (without stacks, MSLPROF_STACK_DEPTH=0, samples above 200 per second are taken anyway)."
        );
    }

    #[test]
    fn files_that_do_not_say_their_source_get_no_line() {
        assert_eq!(rate_line(&header(0, 100, 10_000_000), 5.0), None);
    }
}
