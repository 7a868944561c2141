//! The BSD gmon.out writer against the BSD reader (both layouts, both byte orders, both address widths), and
//! the forced input layouts of `read_as` (gprof's `--file-format`).

use mslprof_format::*;
use proptest::prelude::*;

fn one_module(range: Option<HistRange>, arcs: Vec<Arc>, hz: u32) -> Profile {
    Profile {
        stacks: None,
        format: SourceFormat::Bsd,
        header: Header {
            hz,
            ..Header::default()
        },
        modules: vec![Module {
            histogram: range.map(|r| Histogram {
                bucket_bits: 16,
                ranges: vec![r],
            }),
            arcs,
            ..Module::default()
        }],
    }
}

fn bsd_bytes(p: &Profile, target: GnuTarget, layout: BsdLayout) -> Vec<u8> {
    let mut out = Vec::new();
    write_bsd(p, target, layout, &mut out).expect("one module, one range");
    out
}

proptest! {
    #[test]
    fn bsd_written_reads_back(
        start in 0u64..0x1_0000_0000,
        span in 0u64..0x10_0000,
        samples in prop::collection::vec(any::<u16>(), 2..40),
        arcs in prop::collection::vec((0u64..0x1_0000_0000, 0u64..0x1_0000_0000, 0u64..0x1_0000_0000), 0..10),
        hz in 1u32..100_000,
        big_endian in any::<bool>(),
        wide in any::<bool>(),
        bsd44 in any::<bool>(),
    ) {
        // The old header has no version word: samples that spell the 4.4BSD one would be read as it.
        let spells_version = matches!((samples[0], samples[1]), (0x1879, 0x0005) | (0x0005, 0x1879));
        prop_assume!(bsd44 || !spells_version);
        let target = GnuTarget { big_endian, address_size: if wide { 8 } else { 4 } };
        let layout = if bsd44 { BsdLayout::Bsd44 } else { BsdLayout::Old };
        let arcs: Vec<Arc> = arcs
            .into_iter()
            .map(|(from, to, count)| Arc { caller_key: 0, caller_address: LinkAddress(from), callee_address: LinkAddress(to), count })
            .collect();
        let range = HistRange { start: LinkAddress(start), end: LinkAddress(start + span), buckets: Buckets::Dense16(samples.clone()) };
        let p = one_module(Some(range.clone()), arcs.clone(), hz);
        if !wide && start + span > u64::from(u32::MAX) {
            // A 32-bit file cannot hold the range's end: the writer refuses instead of truncating it.
            let refused = write_bsd(&p, target, layout, &mut Vec::new());
            prop_assert_eq!(refused.map_err(|e| e.kind()), Err(std::io::ErrorKind::InvalidInput));
            return Ok(());
        }
        let bytes = bsd_bytes(&p, target, layout);
        let a = usize::from(target.address_size);
        let header = if bsd44 { 2 * a + 24 } else { 2 * a + 4 };
        prop_assert_eq!(bytes.len(), header + 2 * samples.len() + 3 * a * arcs.len());
        for forced in [InputFormat::Auto, InputFormat::Bsd] {
            let back = read_as(&bytes, target, forced, &mut |_| {}).expect("reads back");
            prop_assert_eq!(back.format, SourceFormat::Bsd);
            prop_assert_eq!(back.header.hz, if bsd44 { hz } else { 0 });
            let m = &back.modules[0];
            prop_assert_eq!(&m.histogram.as_ref().expect("histogram").ranges, &vec![range.clone()]);
            prop_assert_eq!(&m.arcs, &arcs);
        }
        let strict = read_as(&bytes, target, InputFormat::Bsd44, &mut |_| {});
        prop_assert_eq!(strict.is_ok(), bsd44);
        // Without the `gmon` magic: bad magic, or too short for a GNU header (gprof: "file too short").
        let want = if bytes.len() < 20 {
            ErrorKind::Truncated("GNU gmon.out header")
        } else {
            ErrorKind::BadMagic
        };
        prop_assert_eq!(
            read_as(&bytes, target, InputFormat::Magic, &mut |_| {}).map_err(|e| e.kind),
            Err(want)
        );
    }
}

#[test]
fn bsd_header_bytes_are_gprofs() {
    let range = HistRange {
        start: LinkAddress(0x1000),
        end: LinkAddress(0x1008),
        buckets: Buckets::Sparse {
            len: 2,
            entries: vec![(1, 70_000)],
        },
    };
    let arcs = vec![Arc {
        caller_key: 0,
        caller_address: LinkAddress(0x1002),
        callee_address: LinkAddress(0x1004),
        count: 7,
    }];
    let p = one_module(Some(range), arcs, 1000);
    let target = GnuTarget::default();
    let old = bsd_bytes(&p, target, BsdLayout::Old);
    let mut want = Vec::new();
    want.extend_from_slice(&0x1000u64.to_le_bytes());
    want.extend_from_slice(&0x1008u64.to_le_bytes());
    want.extend_from_slice(&24u32.to_le_bytes());
    // 70 000 keeps its low 16 bits, as gprof's bfd_put_16 does.
    want.extend_from_slice(&[0, 0, 0x70, 0x11]);
    for v in [0x1002u64, 0x1004, 7] {
        want.extend_from_slice(&v.to_le_bytes());
    }
    assert_eq!(old, want);
    let new = bsd_bytes(&p, target, BsdLayout::Bsd44);
    assert_eq!(&new[16..20], &44u32.to_le_bytes());
    assert_eq!(&new[20..24], &0x0005_1879u32.to_le_bytes());
    assert_eq!(&new[24..28], &1000u32.to_le_bytes());
    assert_eq!(&new[28..40], &[0u8; 12]);
    assert_eq!(&new[40..], &want[20..]);

    // No histogram: lowpc = highpc = 0, ncnt = header size.
    let none = bsd_bytes(&one_module(None, Vec::new(), 100), target, BsdLayout::Old);
    assert_eq!(none, [&[0u8; 16][..], &20u32.to_le_bytes()].concat());

    // What the BSD layout cannot hold is refused, not mangled.
    let mut two = p.clone();
    let r = two.modules[0].histogram.as_ref().unwrap().ranges[0].clone();
    two.modules[0].histogram.as_mut().unwrap().ranges.push(r);
    let err = write_bsd(&two, target, BsdLayout::Old, Vec::new()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let mut none_of = p.clone();
    none_of.modules.clear();
    assert!(write_bsd(&none_of, target, BsdLayout::Old, Vec::new()).is_err());
}

#[test]
fn forced_layouts_refuse_what_gprof_refuses() {
    let range = HistRange {
        start: LinkAddress(0x1000),
        end: LinkAddress(0x1010),
        buckets: Buckets::Dense16(vec![1, 2, 3, 4]),
    };
    let p = one_module(Some(range), Vec::new(), 100);
    let target = GnuTarget::default();
    let mut gnu = Vec::new();
    write_gnu(&p, target, &mut gnu).unwrap();
    let read = |bytes: &[u8], f| read_as(bytes, target, f, &mut |_| {}).map_err(|e| e.kind);
    assert_eq!(
        read(&gnu, InputFormat::Magic),
        read(&gnu, InputFormat::Auto)
    );
    assert!(read(&gnu, InputFormat::Magic).is_ok());
    // A GNU file read as BSD: "gmon\x01\0\0\0" as lowpc is above highpc (the spare bytes, 0).
    assert_eq!(read(&gnu, InputFormat::Bsd), Err(ErrorKind::BadMagic));
    assert_eq!(read(&gnu, InputFormat::Bsd44), Err(ErrorKind::BadMagic));
    let old = bsd_bytes(&p, target, BsdLayout::Old);
    assert!(read(&old, InputFormat::Bsd).is_ok());
    assert_eq!(read(&old, InputFormat::Bsd44), Err(ErrorKind::BadMagic));
    assert_eq!(read(&old, InputFormat::Magic), Err(ErrorKind::BadMagic));
    assert_eq!(
        record_counts_as(&old, target, InputFormat::Bsd)
            .unwrap()
            .map(|c| c.histogram_records),
        Some(1)
    );
    assert!(record_counts_as(&old, target, InputFormat::Magic).is_err());
}
