//! The dump's two ways to a file, the one at exit (names built on the heap) and the one of fatal signals and
//! `_exit` (the name prepared beforehand, no heap), write the same bytes for the same moment, and those bytes
//! are the profile: a big histogram written sparse, arcs counted in several stripes merged into one record,
//! every load instance present.

use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;

use mslprof::dump::build::{self, Moment, Program};
use mslprof::dump::{self, PreparedPath};
use mslprof::histogram::BucketBits;
use mslprof::modules::LiveModule;
use mslprof_format::model::{
    Arc, Buckets, CpuTime, IncompleteCause, header_flags, sampling_sources,
};
use mslprof_format::stream::IoSink;
use mslprof_format::{LinkAddress, LoadBias, RuntimeAddress};
use mslprof_loader_hooks::{LinkRange, ModuleInfo};

fn module(
    key: u32,
    name: &str,
    bias: usize,
    text: (u64, u64),
    profiled: bool,
) -> &'static LiveModule {
    let info = ModuleInfo {
        bias,
        path: format!("/opt/app/{name}").into_bytes(),
        file_name: name.as_bytes().to_vec(),
        exec_ranges: vec![LinkRange {
            start: text.0,
            end: text.1,
        }],
        is_main: key == 1,
        ..ModuleInfo::default()
    };
    Box::leak(Box::new(LiveModule::new(
        key,
        key,
        info,
        profiled,
        BucketBits::Sixteen,
    )))
}

fn sample(module: &LiveModule, link: u64, times: u32) {
    let pc = module.load_bias.runtime_address(LinkAddress(link));
    for _ in 0..times {
        module.record_sample(RuntimeAddress(pc.0));
    }
}

#[test]
fn exit_and_fatal_signal_paths_write_identical_files() {
    // 4 MiB of text in 16-bit buckets: 2 MiB of histogram, written from its non-zero buckets (sparse).
    let app = module(1, "app", 0x5555_0000_0000, (0x1000, 0x40_1000), true);
    let lib = module(2, "libwork.so", 0x7f00_0000_0000, (0x2000, 0x3000), true);
    let libc = module(3, "libc.so.6", 0x7f10_0000_0000, (0x1000, 0x9000), false);
    assert!(app.histogram.as_ref().unwrap().byte_len() >= 1 << 20);
    sample(app, 0x1004, 3);
    sample(app, 0x3f_0000, 2);
    sample(lib, 0x2ffc, 5);
    sample(libc, 0x1100, 1);
    // One arc counted in two stripes (two threads): one record of 7 calls.
    lib.arcs
        .record_in_stripe(0, app.key, LinkAddress(0x1010), LinkAddress(0x2000));
    for _ in 0..6 {
        lib.arcs
            .record_in_stripe(5, app.key, LinkAddress(0x1010), LinkAddress(0x2000));
    }
    app.arcs
        .record_in_stripe(1, 0xFFFF_FFFF, LinkAddress(0), LinkAddress(0x1000));
    let modules = [app, lib, libc];

    let moment = Moment {
        pid: 4242,
        ppid: 1,
        start_time_ns: 1_700_000_000_000_000_000,
        end_time_ns: 1_700_000_001_000_000_000,
        sample_period_ns: 10_000_000,
        sampling_sources: sampling_sources::CPU_TIMER,
        total_samples: 12,
        unknown_samples: 1,
        cpu_time: Some(CpuTime {
            user_ns: 900_000_000,
            system_ns: 100_000_000,
        }),
        flags: header_flags::INCOMPLETE,
        incomplete_cause: IncompleteCause::Signal,
        incomplete_signal: 11,
    };
    let program = Program {
        name: b"app",
        hz: 100,
    };

    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dump_paths.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let at_exit = scratch.join("exit.out");
    let at_signal = scratch.join("signal.out");

    // SAFETY: nothing samples into these modules (they are not in the module table).
    unsafe { dump::write_named(program, &moment, &modules, at_exit.as_os_str().as_bytes()) }
        .expect("the exit path writes");
    let prepared = Box::new(PreparedPath::new());
    prepared.prepare(Some(at_signal.as_os_str().as_bytes()), moment.pid);
    // SAFETY: as above.
    unsafe { dump::write_prepared(program, &moment, &modules, &prepared) }
        .expect("a path was prepared")
        .expect("the signal path writes");
    let mut in_memory = Vec::new();
    // SAFETY: as above.
    unsafe { build::encode(program, &moment, &modules, &mut IoSink(&mut in_memory)) }
        .expect("encodes");

    let exit_bytes = std::fs::read(&at_exit).unwrap();
    let signal_bytes = std::fs::read(&at_signal).unwrap();
    assert!(
        exit_bytes == signal_bytes,
        "the two paths wrote different files"
    );
    assert!(exit_bytes == in_memory, "a file differs from the encoding");
    let mut names: Vec<_> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["exit.out", "signal.out"], "no temporary file left");

    let profile = mslprof_format::read(&exit_bytes, Default::default()).unwrap();
    assert_eq!(profile.header.pid, 4242);
    assert_eq!(profile.header.incomplete_signal, 11);
    let keys: Vec<u32> = profile.modules.iter().map(|m| m.key).collect();
    assert_eq!(keys, [1, 2, 3]);
    let [app_out, lib_out, libc_out] = &profile.modules[..] else {
        unreachable!()
    };
    assert_eq!(
        (app_out.samples, lib_out.samples, libc_out.samples),
        (5, 5, 1)
    );
    assert!(libc_out.histogram.is_none() && libc_out.arcs.is_empty());
    assert_eq!(
        lib_out.arcs,
        [Arc {
            caller_key: 1,
            caller_address: LinkAddress(0x1010),
            callee_address: LinkAddress(0x2000),
            count: 7
        }]
    );
    assert_eq!(app_out.arcs.len(), 1);
    assert_eq!(app_out.load_bias, LoadBias(0x5555_0000_0000));
    // The sparse encoding: far fewer bytes than the 2 MiB dense histogram would take.
    assert!(exit_bytes.len() < 64 * 1024, "{} bytes", exit_bytes.len());
    let histogram = app_out.histogram.as_ref().unwrap();
    assert_eq!(histogram.ranges.len(), 1);
    assert_eq!(
        histogram.ranges[0].buckets,
        Buckets::Sparse {
            len: 0x40_0000 / 4,
            entries: vec![(1, 3), ((0x3f_0000 - 0x1000) / 4, 2)],
        }
    );
    assert_eq!(app.samples.load(Ordering::Relaxed), 5);
    std::fs::remove_dir_all(&scratch).unwrap();
}
