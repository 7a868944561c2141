//! Stage 4, assign samples: the histograms' buckets are credited to the graph's functions by address
//! overlap (gprof's `hist_assign_samples`), after the histograms of several GNU files are summed.

use mslprof_format::model::{Buckets, HistRange, Histogram, Profile, SourceFormat};

use crate::gprof::graph::Graph;
use crate::gprof::histogram::{self, SampleTotals};
use crate::gprof::symspec::Filters;
use crate::input::{Error, Input, Mismatch};

/// The samples credited to the graph, and what the report says about them.
pub struct Samples {
    pub totals: SampleTotals,
    /// Whether any histogram had a range.
    pub have_hist: bool,
    /// Bytes covered by one histogram bucket (of the first histogram).
    pub granularity: i64,
}

/// The histograms of GNU files summed, with the rate and unit of the first file that has one.
pub struct GnuHistogram {
    pub hist: Histogram,
    pub hz: u32,
    pub dimension: String,
    pub abbrev: char,
    pub have_hist: bool,
}

/// GNU input: sum the histogram records of every file (taken out of `inputs`) as gprof does.
pub fn sum_gnu(inputs: &mut [Input]) -> Result<GnuHistogram, Error> {
    let mut sum = GnuHistogram {
        hist: Histogram {
            bucket_bits: 16,
            ranges: Vec::new(),
        },
        hz: 0,
        dimension: String::from("seconds"),
        abbrev: 's',
        have_hist: false,
    };
    for input in inputs.iter_mut() {
        let Some(h) = input.profile.modules[0].histogram.take() else {
            continue;
        };
        if !sum.have_hist {
            let header = &input.profile.header;
            sum.hz = header.hz;
            if sum.hz == 0 && input.profile.format == SourceFormat::Bsd {
                // Old BSD files carry no rate; gprof then uses the system clock rate, 100 Hz on Linux.
                sum.hz = 100;
            }
            sum.dimension = String::from_utf8_lossy(&header.dimension).into_owned();
            sum.abbrev = char::from(header.dimension_abbrev);
        }
        sum.have_hist |= !h.ranges.is_empty();
        add_histogram(&mut sum.hist.ranges, h).map_err(|mismatch| Error::Mismatch {
            path: input.path.clone(),
            mismatch,
        })?;
    }
    Ok(sum)
}

/// Add histogram `h` into `ranges` as gprof does: records over the same range are summed, a record that
/// overlaps another one differently is an error. The first record of a range is kept as it is (no copy).
fn add_histogram(ranges: &mut Vec<HistRange>, h: Histogram) -> Result<(), Mismatch> {
    for r in h.ranges {
        let len = r.buckets.len();
        match ranges
            .iter()
            .position(|x| x.start == r.start && x.end == r.end)
        {
            Some(i) => {
                if ranges[i].buckets.len() != len {
                    return Err(Mismatch::RangeSizes);
                }
                let mut sum: Vec<u32> =
                    match std::mem::replace(&mut ranges[i].buckets, Buckets::Dense32(Vec::new())) {
                        Buckets::Dense32(v) => v,
                        other => {
                            let mut v = vec![0u32; len as usize];
                            for (k, c) in other.nonzero() {
                                v[k as usize] = c;
                            }
                            v
                        }
                    };
                for (k, c) in r.buckets.nonzero() {
                    sum[k as usize] = sum[k as usize].saturating_add(c);
                }
                ranges[i].buckets = Buckets::Dense32(sum);
            }
            None => {
                if ranges.iter().any(|x| r.start < x.end && x.start < r.end) {
                    return Err(Mismatch::Overlap);
                }
                ranges.push(r);
            }
        }
    }
    Ok(())
}

/// GNU input: credit the summed histogram to the executable's functions (addresses in gprof's 2-byte
/// units).
pub fn assign_gnu(g: &mut Graph, sum: &GnuHistogram, filters: &Filters) -> Samples {
    histogram::scale_entries(g);
    let mut totals = SampleTotals::default();
    if sum.have_hist {
        histogram::assign(g, 0, &sum.hist, filters, &mut totals);
    }
    let scale = sum
        .hist
        .ranges
        .first()
        .map(|r| histogram::hist_scale(r.start, r.end, r.buckets.len(), 2))
        .unwrap_or(0.0);
    Samples {
        totals,
        have_hist: sum.have_hist,
        granularity: (scale as i64).wrapping_mul(2),
    }
}

/// mslprof input: credit each module's histogram to its functions (modules without functions keep
/// their samples only in the module table).
pub fn assign_mslprof(g: &mut Graph, profile: &Profile, filters: &Filters) -> Samples {
    histogram::scale_entries(g);
    let mut totals = SampleTotals::default();
    let mut have_hist = false;
    let mut granularity = 0i64;
    for (i, m) in profile.modules.iter().enumerate() {
        let Some(h) = &m.histogram else { continue };
        if g.modules[i].syms.is_empty() {
            continue;
        }
        if !have_hist && let Some(r) = h.ranges.first() {
            granularity = ((r.end - r.start) / r.buckets.len().max(1)) as i64;
        }
        have_hist = true;
        histogram::assign(g, i, h, filters, &mut totals);
    }
    Samples {
        totals,
        have_hist,
        granularity,
    }
}

/// Samples per second of an mslprof profile: from the real sampling period when recorded.
pub fn mslprof_hz(profile: &Profile) -> f64 {
    let header = &profile.header;
    if header.sample_period_ns > 0 {
        1e9 / header.sample_period_ns as f64
    } else {
        f64::from(header.hz.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mslprof_format::LinkAddress;

    fn range(start: u64, end: u64, buckets: Vec<u16>) -> HistRange {
        HistRange {
            start: LinkAddress(start),
            end: LinkAddress(end),
            buckets: Buckets::Dense16(buckets),
        }
    }

    fn histogram(ranges: Vec<HistRange>) -> Histogram {
        Histogram {
            bucket_bits: 16,
            ranges,
        }
    }

    #[test]
    fn same_ranges_are_summed_and_others_kept() {
        let mut sum = Vec::new();
        add_histogram(
            &mut sum,
            histogram(vec![range(0x100, 0x108, vec![1, 0, 65535, 2])]),
        )
        .unwrap();
        add_histogram(
            &mut sum,
            histogram(vec![range(0x100, 0x108, vec![4, 0, 1, 0])]),
        )
        .unwrap();
        add_histogram(&mut sum, histogram(vec![range(0x200, 0x204, vec![7, 0])])).unwrap();
        assert_eq!(sum.len(), 2);
        // Sums beyond 16 bits are kept (gprof's gmon.sum then writes them in several records).
        assert_eq!(
            sum[0].buckets.nonzero().collect::<Vec<_>>(),
            vec![(0, 5), (2, 65536), (3, 2)]
        );
        assert_eq!(sum[1].buckets.nonzero().collect::<Vec<_>>(), vec![(0, 7)]);
    }

    #[test]
    fn overlapping_or_resized_ranges_are_refused() {
        let mut sum = Vec::new();
        add_histogram(&mut sum, histogram(vec![range(0x100, 0x108, vec![1; 4])])).unwrap();
        assert!(matches!(
            add_histogram(&mut sum, histogram(vec![range(0x104, 0x10c, vec![1; 4])])),
            Err(Mismatch::Overlap)
        ));
        assert!(matches!(
            add_histogram(&mut sum, histogram(vec![range(0x100, 0x108, vec![1; 2])])),
            Err(Mismatch::RangeSizes)
        ));
    }
}
