//! Fake load instances for the runtime's integration tests: modules that exist only in the module table,
//! whose code the tests "run" by handing mcount made-up addresses inside them.

use mslprof::histogram::BucketBits;
use mslprof::modules::ModulePolicy;
use mslprof::selection::Selection;
use mslprof_loader_hooks::{LinkRange, ModuleInfo};

/// The module policy of a process whose `LD_PROFILE` is `ld_profile` (`None`: unset, every module), with
/// 16-bit buckets.
pub fn policy(ld_profile: Option<&[u8]>) -> ModulePolicy<'static> {
    ModulePolicy {
        selection: Box::leak(Box::new(Selection::parse(ld_profile))),
        bucket_bits: BucketBits::Sixteen,
    }
}

/// A module `name` (path `/fake/<name>`) loaded at `bias`, with executable code at the link-time addresses
/// `[0x1000, text_end)`.
pub fn fake_module(name: &str, bias: usize, text_end: u64) -> ModuleInfo {
    ModuleInfo {
        bias,
        path: format!("/fake/{name}").into_bytes(),
        file_name: name.as_bytes().to_vec(),
        exec_ranges: vec![LinkRange {
            start: 0x1000,
            end: text_end,
        }],
        ..ModuleInfo::default()
    }
}
