//! Fuzz target: `read` never panics on any input and any target; what it accepts as mslprof writes and reads
//! back equal.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mslprof_format::{GnuTarget, SourceFormat, read, write};

fuzz_target!(|data: &[u8]| {
    for target in [
        GnuTarget::default(),
        GnuTarget {
            big_endian: true,
            address_size: 4,
        },
    ] {
        if let Ok(profile) = read(data, target)
            && matches!(profile.format, SourceFormat::Mslprof { .. })
        {
            let mut out = Vec::new();
            write(&profile, &mut out).expect("a profile that was read is writable");
            let mut back = read(&out, target).expect("and reads back");
            back.format = profile.format;
            assert_eq!(back, profile);
        }
    }
});
