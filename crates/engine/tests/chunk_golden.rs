//! Golden vectors: the exact chunk boundaries of fixed inputs, so that they never drift.
//!
//! Chunk boundaries are part of every stored repository and every peer's chunk cache: if
//! they move, deduplication against old data silently stops. Each case pins the number of
//! chunks, an FNV-1a hash of the list of cut offsets and the first ten offsets. If a change
//! is intended, regenerate with `GOLDEN_PRINT=1 cargo test -p dedupwire-engine --test
//! chunk_golden -- --nocapture` and say so loudly in the change.

use dedupwire_engine::chunk::{chunks, Chunker, ChunkerSpec, FastCdc, Fixed, StreamChunker};

/// 1 MiB of xorshift64 output (seed fixed here, little-endian words).
fn random_input() -> Vec<u8> {
    let mut x: u64 = 0x0123_4567_89ab_cdef;
    let mut v = Vec::with_capacity(1 << 20);
    while v.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

/// 1 MiB of low-entropy text: words from a small vocabulary picked by the same generator,
/// with a run of zero bytes every 64 KiB (pathological for CDC: no cut inside a run).
fn low_entropy_input() -> Vec<u8> {
    const WORDS: [&[u8]; 16] = [
        b"the ",
        b"of ",
        b"and ",
        b"chunk ",
        b"dedup ",
        b"{\"id\": ",
        b"1, ",
        b"\"body\": ",
        b"lorem ",
        b"ipsum ",
        b"\n",
        b"    ",
        b"fn ",
        b"return ",
        b"}",
        b"data ",
    ];
    let mut x: u64 = 0xfeed_beef_dead_c0de;
    let mut v = Vec::with_capacity((1 << 20) + 16);
    while v.len() < 1 << 20 {
        if v.len() % (64 << 10) < 8 && v.len() >= 8 {
            v.resize(v.len() + 5000, 0);
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(WORDS[(x >> 60) as usize]);
    }
    v.truncate(1 << 20);
    v
}

/// Cut offsets: the end of every chunk.
fn cut_offsets(chunker: &dyn Chunker, data: &[u8]) -> Vec<usize> {
    let mut end = 0;
    chunks(chunker, data)
        .map(|c| {
            end += c.len();
            end
        })
        .collect()
}

/// FNV-1a over the offsets as little-endian u64s.
fn fnv1a(offsets: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &o in offsets {
        for b in (o as u64).to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

struct Golden {
    name: &'static str,
    spec: ChunkerSpec,
    random: (usize, u64, [usize; 10]),
    low: (usize, u64, [usize; 10]),
}

fn cdc(min: usize, avg: usize, max: usize) -> ChunkerSpec {
    ChunkerSpec::Cdc { min, avg, max }
}

fn goldens() -> Vec<Golden> {
    vec![
        Golden {
            name: "cdc-64B",
            spec: cdc(16, 64, 256),
            random: (
                14579,
                0x1da3_fe53_fbdc_d2d8,
                [74, 155, 177, 244, 317, 400, 485, 553, 649, 737],
            ),
            low: (
                13603,
                0x5fa3_b0e1_a6f2_3290,
                [81, 164, 183, 269, 337, 401, 456, 541, 631, 723],
            ),
        },
        Golden {
            name: "cdc-256B",
            spec: cdc(64, 256, 1024),
            random: (
                3594,
                0xf7bf_b9ff_7aa2_7821,
                [290, 386, 677, 1128, 1344, 1627, 1904, 2198, 2528, 2910],
            ),
            low: (
                3394,
                0x074e_cbc1_4aef_49d4,
                [269, 422, 763, 1053, 1131, 1445, 1881, 2268, 2602, 2875],
            ),
        },
        Golden {
            name: "cdc-1KiB",
            spec: cdc(256, 1024, 4096),
            random: (
                895,
                0xcd73_d689_9fb4_4db5,
                [1620, 2990, 3695, 4775, 5996, 7317, 8531, 9632, 11282, 12841],
            ),
            low: (
                871,
                0x51db_8a14_454c_8b3a,
                [1206, 2241, 3364, 4487, 5798, 7089, 7600, 8855, 10489, 11538],
            ),
        },
        Golden {
            name: "cdc-8KiB",
            spec: cdc(2048, 8192, 65536),
            random: (
                112,
                0xad5c_4b3a_8158_568c,
                [
                    11437, 20418, 33721, 42215, 54001, 65685, 69645, 74125, 79708, 83506,
                ],
            ),
            low: (
                108,
                0x1066_959e_44a1_f403,
                [
                    11998, 20576, 28851, 40324, 45682, 54157, 64427, 75465, 83699, 87337,
                ],
            ),
        },
        Golden {
            name: "cdc-64KiB",
            spec: cdc(16384, 65536, 262_144),
            random: (
                15,
                0xc42a_ea5a_3626_0730,
                [
                    83292, 121110, 190783, 279043, 344968, 384637, 450353, 533996, 604593, 663637,
                ],
            ),
            low: (
                14,
                0xbab0_5031_85a7_e55e,
                [
                    90904, 182482, 278414, 350644, 425254, 542929, 578819, 667731, 733968, 813657,
                ],
            ),
        },
        Golden {
            name: "cdc-4KiB-min1",
            spec: cdc(1, 4096, 16384),
            random: (
                232,
                0xd32f_d582_3597_9e4b,
                [
                    4727, 10575, 14708, 22805, 28255, 33967, 38471, 44491, 45355, 49243,
                ],
            ),
            low: (
                219,
                0x4a26_b127_ef3e_5b0a,
                [
                    5371, 7178, 12162, 16385, 17528, 19707, 23970, 29503, 33893, 38222,
                ],
            ),
        },
        Golden {
            name: "fixed-4KiB",
            spec: ChunkerSpec::Fixed { size: 4096 },
            random: (
                256,
                0xcd54_e1da_ee6a_efb5,
                [
                    4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768, 36864, 40960,
                ],
            ),
            low: (
                256,
                0xcd54_e1da_ee6a_efb5,
                [
                    4096, 8192, 12288, 16384, 20480, 24576, 28672, 32768, 36864, 40960,
                ],
            ),
        },
    ]
}

fn check(
    name: &str,
    which: &str,
    spec: &ChunkerSpec,
    data: &[u8],
    want: (usize, u64, [usize; 10]),
) {
    let chunker = spec.build().unwrap();
    let offsets = cut_offsets(chunker.as_ref(), data);
    let first: Vec<usize> = offsets.iter().copied().take(10).collect();
    let got = (offsets.len(), fnv1a(&offsets), first.clone());
    if std::env::var_os("GOLDEN_PRINT").is_some() {
        println!("{name} {which}: ({}, {:#018x}, {:?})", got.0, got.1, got.2);
        return;
    }
    assert_eq!(
        (got.0, got.1, &got.2[..]),
        (want.0, want.1, &want.2[..]),
        "{name} on {which} input: boundaries drifted"
    );
}

#[test]
fn golden_boundaries() {
    let random = random_input();
    let low = low_entropy_input();
    for g in goldens() {
        check(g.name, "random", &g.spec, &random, g.random);
        check(g.name, "low-entropy", &g.spec, &low, g.low);
    }
}

/// The definition in `chunk::fastcdc`'s documentation, written out independently and
/// byte at a time: the goldens must be what the documented rule gives.
fn definition_offsets(c: &FastCdc, max: usize, data: &[u8]) -> Vec<usize> {
    let gear = FastCdc::gear_table();
    let (min, avg) = (c.min_len(), c.avg_len());
    let mut offsets = Vec::new();
    let mut start = 0;
    while start < data.len() {
        let rest = &data[start..];
        let n = rest.len().min(max);
        let mut len = n;
        if n > min {
            let mut h: u64 = 0;
            for (i, &byte) in rest.iter().enumerate().take(n - 1).skip(min - 1) {
                h = (h << 1).wrapping_add(gear[byte as usize]);
                let mask = if i + 1 < avg { c.mask_s() } else { c.mask_l() };
                if h & mask == 0 {
                    len = i + 1;
                    break;
                }
            }
        }
        start += len;
        offsets.push(start);
    }
    offsets
}

#[test]
fn goldens_follow_the_documented_definition() {
    let random = random_input();
    let low = low_entropy_input();
    for g in goldens() {
        if let ChunkerSpec::Cdc { min, avg, max } = g.spec {
            let c = FastCdc::new(min, avg, max).unwrap();
            for data in [&random, &low] {
                assert_eq!(
                    cut_offsets(&c, data),
                    definition_offsets(&c, max, data),
                    "{}",
                    g.name
                );
            }
        }
    }
    // The mask layout the definition names: log2(avg) +/- 2 bits spread over bits 17..=60.
    let c = FastCdc::new(2048, 8192, 65536).unwrap();
    assert_eq!(
        (c.mask_s(), c.mask_l()),
        (0x1492_4949_2490_0000, 0x1222_2222_2220_0000)
    );
    assert_eq!(FastCdc::gear_table()[0], 0x1624_6a84_82e6_44f4);
    assert_eq!(FastCdc::gear_table()[255], 0x439b_1864_b1a1_1e91);
}

#[test]
fn stream_chunker_matches_goldens() {
    // The same boundaries through a reader (here a slice reader with its own block sizes).
    let random = random_input();
    for g in goldens() {
        let chunker = g.spec.build().unwrap();
        let want = cut_offsets(chunker.as_ref(), &random);
        let mut s = StreamChunker::new(chunker.as_ref(), std::io::Cursor::new(&random));
        let mut got = Vec::new();
        let mut end = 0;
        while let Some(c) = s.next_chunk().unwrap() {
            end += c.len();
            got.push(end);
        }
        assert_eq!(got, want, "{}", g.name);
    }
}

#[test]
fn sizes_on_random_data_are_near_the_average_and_within_bounds() {
    let random = random_input();
    let mut big = random.clone();
    // More data for the large averages, so the mean is meaningful (16 MiB, 256+ chunks).
    let mut x: u64 = 7;
    while big.len() < 16 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big.extend_from_slice(&x.to_le_bytes());
    }
    for (min, avg, max) in [
        (16, 64, 256),
        (64, 256, 1024),
        (256, 1024, 4096),
        (2048, 8192, 65536),
        (16384, 65536, 262_144),
        (1, 4096, 1 << 20),
    ] {
        let c = FastCdc::new(min, avg, max).unwrap();
        let data = if avg >= 8192 { &big[..] } else { &random[..] };
        let lens: Vec<usize> = chunks(&c, data).map(<[u8]>::len).collect();
        assert_eq!(lens.iter().sum::<usize>(), data.len());
        let (last, body) = lens.split_last().unwrap();
        assert!(
            body.iter().all(|&l| l >= min && l <= max),
            "({min}, {avg}, {max}): a chunk outside [min, max]"
        );
        assert!(*last >= 1 && *last <= max);
        let mean = data.len() as f64 / lens.len() as f64;
        assert!(
            (0.75 * avg as f64..=1.25 * avg as f64).contains(&mean),
            "({min}, {avg}, {max}): mean chunk {mean:.0} not within 25% of {avg}"
        );
    }
}

#[test]
fn fixed_and_whole_cases() {
    let random = random_input();
    let f = Fixed::new(4096).unwrap();
    let offsets = cut_offsets(&f, &random[..1_000_000]);
    assert_eq!(offsets.len(), 245);
    assert!(offsets
        .windows(2)
        .all(|w| w[1] - w[0] == 4096 || w[1] == 1_000_000));
    assert_eq!(offsets.last(), Some(&1_000_000));
    let whole = ChunkerSpec::Whole.build().unwrap();
    assert_eq!(cut_offsets(whole.as_ref(), &random), [random.len()]);
}
