//! Summing mslprof profiles: load instances of one module file (same path and build-id) from any
//! number of runs become one module whose histograms and arcs are added up. Addresses are
//! module-relative, so runs with different ASLR layouts add up directly. Files sampled at different
//! periods are added up in time: each file's counts are rescaled to the shortest period among them.
//! Sampled stacks add up the same way, their frames' keys remapped as the arcs' caller keys are; the sum
//! has stacks only when every input has them.

use mslprof_format::LinkAddress;
use std::collections::{BTreeMap, HashMap};

use mslprof_format::model::{
    Arc, Buckets, CpuTime, Header, HistRange, Histogram, Module, Profile, SourceFormat, StackFrame,
    StackRecord, Stacks, UNKNOWN_KEY, header_flags, module_flags,
};

use crate::input::{Error, Input, Mismatch};

/// A merged profile and, per module, how many load instances went into it.
pub struct Merged {
    pub profile: Profile,
    pub instances: Vec<u32>,
    /// When the files were sampled at different periods: the shortest and the longest, in nanoseconds
    /// (every count was rescaled to the shortest, which is the merged profile's period).
    pub rescaled: Option<(u64, u64)>,
}

/// The CPU time one sample of a file stands for, in nanoseconds (from the rate when no period is recorded).
pub fn period_ns(header: &Header) -> u64 {
    if header.sample_period_ns > 0 {
        header.sample_period_ns
    } else {
        1_000_000_000 / u64::from(header.hz.max(1))
    }
}

/// Counts of one file turned into counts of the common period, rounded so that what one bucket loses
/// to rounding is carried into the next: a module's total stays within one sample of its exact time.
struct Rescale {
    factor: f64,
    carry: f64,
}

impl Rescale {
    fn new(factor: f64) -> Rescale {
        Rescale { factor, carry: 0.0 }
    }

    fn count(&mut self, n: u64) -> u64 {
        if self.factor == 1.0 {
            return n;
        }
        let exact = n as f64 * self.factor + self.carry;
        let rounded = exact.round().max(0.0);
        self.carry = exact - rounded;
        rounded as u64
    }
}

/// The shortest and longest period among the files that have samples, when they differ.
fn periods(inputs: &[Input]) -> Option<(u64, u64)> {
    let mut sampled = inputs
        .iter()
        .map(|i| &i.profile.header)
        .filter(|h| h.total_samples > 0)
        .map(period_ns);
    let first = sampled.next()?;
    let (min, max) = sampled.fold((first, first), |(lo, hi), p| (lo.min(p), hi.max(p)));
    (min != max).then_some((min, max))
}

type RangeSums = Vec<(LinkAddress, LinkAddress, u64, BTreeMap<u64, u64>)>;

/// Merge `inputs` (all mslprof). With `separate_instances`, load instances stay apart.
pub fn merge(inputs: &[Input], separate_instances: bool) -> Result<Merged, Error> {
    let mut header = Header::default();
    let mut modules: Vec<Module> = Vec::new();
    let mut sums: Vec<(u8, u32, RangeSums)> = Vec::new();
    let mut instances: Vec<u32> = Vec::new();
    let mut arcs: Vec<HashMap<(u32, LinkAddress, LinkAddress), u64>> = Vec::new();
    let mut identity: HashMap<(Vec<u8>, Vec<u8>, u32, usize), usize> = HashMap::new();
    let rescaled = periods(inputs);
    let mut stacks = inputs
        .iter()
        .all(|i| i.profile.stacks.is_some())
        .then(Stacks::default);
    for (n, input) in inputs.iter().enumerate() {
        let p = &input.profile;
        let h = &p.header;
        let factor = match rescaled {
            Some((shortest, _)) => period_ns(h) as f64 / shortest as f64,
            None => 1.0,
        };
        let scaled = |count: u64| Rescale::new(factor).count(count);
        if n == 0 {
            header = h.clone();
            header.total_samples = scaled(h.total_samples);
            header.unknown_samples = scaled(h.unknown_samples);
            header.dropped_samples = scaled(h.dropped_samples);
            if let Some((shortest, _)) = rescaled {
                header.sample_period_ns = shortest;
            }
        } else {
            header.flags |= h.flags & (header_flags::INCOMPLETE | header_flags::SIGPROF_BLOCKED);
            header.total_samples += scaled(h.total_samples);
            header.unknown_samples += scaled(h.unknown_samples);
            header.dropped_arcs += h.dropped_arcs;
            header.dropped_samples += scaled(h.dropped_samples);
            header.sampling_sources |= h.sampling_sources;
            header.end_time_ns = header.end_time_ns.max(h.end_time_ns);
            // Known only when every input says.
            header.cpu_time = match (header.cpu_time, h.cpu_time) {
                (Some(a), Some(b)) => Some(CpuTime {
                    user_ns: a.user_ns.saturating_add(b.user_ns),
                    system_ns: a.system_ns.saturating_add(b.system_ns),
                }),
                _ => None,
            };
        }
        let mut keymap: HashMap<u32, u32> = HashMap::new();
        for m in &p.modules {
            let instance = if separate_instances { m.key } else { 0 };
            let file_index = if separate_instances { n } else { 0 };
            let key = (m.path.clone(), m.build_id.clone(), instance, file_index);
            let id = *identity.entry(key).or_insert_with(|| {
                let mut nm = m.clone();
                nm.key = modules.len() as u32 + 1;
                nm.histogram = None;
                nm.arcs = Vec::new();
                nm.samples = 0;
                nm.saturated_buckets = 0;
                nm.dropped_arcs = 0;
                nm.flags &= !module_flags::UNLOADED;
                modules.push(nm);
                sums.push((0, 0, Vec::new()));
                instances.push(0);
                arcs.push(HashMap::new());
                modules.len() - 1
            });
            keymap.insert(m.key, id as u32 + 1);
            let mm = &mut modules[id];
            instances[id] += 1;
            mm.flags |= m.flags
                & (module_flags::PROFILED | module_flags::MAIN_PROGRAM | module_flags::CALLEE_ARCS);
            if mm.flags & module_flags::PROFILED != 0 {
                // PLT-counted arcs merged into a profiled instance are the profiled module's arcs.
                mm.flags &= !module_flags::CALLEE_ARCS;
            }
            mm.samples += scaled(m.samples);
            mm.saturated_buckets += m.saturated_buckets;
            mm.dropped_arcs += m.dropped_arcs;
            if m.flags & module_flags::UNLOADED != 0 && m.unload_order != 0 {
                mm.unload_order = mm.unload_order.max(m.unload_order);
            }
            if let Some(hist) = &m.histogram {
                let mut rescale = Rescale::new(factor);
                let s = &mut sums[id];
                s.0 = s.0.max(hist.bucket_bits);
                for r in &hist.ranges {
                    let len = r.buckets.len();
                    let slot = match s.2.iter().position(|x| x.0 == r.start && x.1 == r.end) {
                        Some(i) if s.2[i].2 == len => i,
                        Some(_) => {
                            return Err(Error::Mismatch {
                                path: input.path.clone(),
                                mismatch: Mismatch::ModuleRangeSizes {
                                    module: String::from_utf8_lossy(&m.name).into_owned(),
                                },
                            });
                        }
                        None => {
                            s.2.push((r.start, r.end, len, BTreeMap::new()));
                            s.2.len() - 1
                        }
                    };
                    for (i, c) in r.buckets.nonzero() {
                        let c = rescale.count(u64::from(c));
                        if c != 0 {
                            *s.2[slot].3.entry(i).or_insert(0) += c;
                        }
                    }
                }
            }
        }
        // A key of this file as a key of the sum, with its address (unknown: address 0).
        let remap = |key: u32, address: LinkAddress| match keymap.get(&key) {
            Some(&merged) if key != UNKNOWN_KEY => (merged, address),
            _ => (UNKNOWN_KEY, LinkAddress(0)),
        };
        for m in &p.modules {
            let id = keymap[&m.key] as usize - 1;
            for a in &m.arcs {
                let (caller, addr) = remap(a.caller_key, a.caller_address);
                *arcs[id]
                    .entry((caller, addr, a.callee_address))
                    .or_insert(0) += a.count;
            }
        }
        if let (Some(sum), Some(these)) = (stacks.as_mut(), &p.stacks) {
            let mut rescale = Rescale::new(factor);
            sum.max_depth = sum.max_depth.max(these.max_depth);
            sum.dropped = sum.dropped.saturating_add(scaled(these.dropped));
            for r in &these.records {
                let count = rescale.count(r.count);
                if count == 0 {
                    continue;
                }
                let frames = r
                    .frames
                    .iter()
                    .map(|f| {
                        let (key, address) = remap(f.key, f.address);
                        StackFrame { key, address }
                    })
                    .collect();
                sum.records.push(StackRecord {
                    count,
                    flags: r.flags,
                    frames,
                });
            }
        }
    }
    if let Some(sum) = stacks.as_mut() {
        // Identical stacks (same flags, same remapped frames) become one record.
        sum.normalize();
    }
    for (id, m) in modules.iter_mut().enumerate() {
        let (bits, _, ranges) = &sums[id];
        if !ranges.is_empty() {
            let max = ranges
                .iter()
                .flat_map(|r| r.3.values().copied())
                .max()
                .unwrap_or(0);
            let bits = if max > 65535 { 32 } else { (*bits).max(16) };
            m.histogram = Some(Histogram {
                bucket_bits: bits,
                ranges: ranges
                    .iter()
                    .map(|(start, end, len, map)| HistRange {
                        start: *start,
                        end: *end,
                        buckets: Buckets::Sparse {
                            len: *len,
                            entries: map
                                .iter()
                                .map(|(&i, &c)| (i, c.min(u64::from(u32::MAX)) as u32))
                                .collect(),
                        },
                    })
                    .collect(),
            });
        }
        let mut list: Vec<Arc> = arcs[id]
            .iter()
            .map(
                |(&(caller_key, caller_address, callee_address), &count)| Arc {
                    caller_key,
                    caller_address,
                    callee_address,
                    count,
                },
            )
            .collect();
        list.sort_unstable();
        m.arcs = list;
    }
    if inputs.len() > 1 {
        header.flags |= header_flags::MERGED;
    }
    let format = inputs
        .first()
        .map(|i| i.profile.format)
        .unwrap_or(SourceFormat::Mslprof { major: 1, minor: 3 });
    Ok(Merged {
        profile: Profile {
            format,
            header,
            modules,
            stacks,
        },
        instances,
        rescaled,
    })
}
