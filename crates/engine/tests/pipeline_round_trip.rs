//! The pipeline gives back every item bit-exact, and rejects damaged streams with an error.

use dedupwire_engine::chunk::ChunkerSpec;
use dedupwire_engine::compress::Compression;
use dedupwire_engine::delta::DeltaSpec;
use dedupwire_engine::pipeline::{decode_all, encode_all, PipelineConfig, SharedBytes};
use proptest::prelude::*;

fn configs() -> Vec<PipelineConfig> {
    let small_files = PipelineConfig {
        chunker: ChunkerSpec::Cdc {
            min: 64,
            avg: 256,
            max: 1024,
        },
        ..PipelineConfig::files()
    };
    vec![
        PipelineConfig::documents(),
        PipelineConfig {
            delta: DeltaSpec::ZstdRef { level: 3 },
            ..PipelineConfig::documents()
        },
        small_files,
        PipelineConfig {
            compression: Compression::Lz4,
            window_bytes: 2048,
            ..small_files
        },
        PipelineConfig {
            compression: Compression::None,
            ..PipelineConfig::exact(ChunkerSpec::Fixed { size: 100 })
        },
    ]
}

/// Items that revise earlier items, as document streams and file versions do.
/// Calls `f` with each run of items in turn (runs of `split` modulo their count, plus one), as
/// one shared buffer and the items' slices of it.
fn in_shared_batches(items: &[Vec<u8>], split: usize, mut f: impl FnMut(&SharedBytes, &[&[u8]])) {
    for batch in items.chunks(split % items.len().max(1) + 1) {
        let owner: SharedBytes = std::sync::Arc::new(batch.concat());
        let mut at = 0;
        let slices: Vec<&[u8]> = batch
            .iter()
            .map(|item| {
                at += item.len();
                &(*owner).as_ref()[at - item.len()..at]
            })
            .collect();
        f(&owner, &slices);
    }
}

fn revisions() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let edit = (
        any::<u16>(),
        any::<u16>(),
        proptest::collection::vec(any::<u8>(), 0..40),
    );
    (
        proptest::collection::vec(any::<u8>(), 0..3000),
        proptest::collection::vec((any::<u8>(), edit, any::<bool>()), 0..12),
    )
        .prop_map(|(seed, steps)| {
            let mut items = vec![seed];
            for (pick, (at, cut, insert), fresh) in steps {
                if fresh {
                    items.push(insert.repeat(usize::from(pick % 50)));
                    continue;
                }
                let mut next = items[usize::from(pick) % items.len()].clone();
                let at = usize::from(at) % (next.len() + 1);
                let end = (at + usize::from(cut) % 64).min(next.len());
                next.splice(at..end, insert);
                items.push(next);
            }
            items
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(items in revisions(), frame in 1usize..8000) {
        for config in configs() {
            let stream = encode_all(config, items.iter().map(Vec::as_slice), frame).unwrap();
            let back = decode_all(&stream).unwrap();
            prop_assert_eq!(&back, &items, "{:?}", config);
        }
    }

    #[test]
    fn cuts_the_caller_chose_round_trip(items in revisions(), split in 0usize..12, seed in any::<u64>()) {
        use dedupwire_engine::pipeline::{Encoder, Prepared, PreparedUnits};
        // Unit lengths from a seeded generator, 1 to 700 bytes, cut short at each item's end.
        let cut = |i: usize, item: &[u8], lens: &mut Vec<u32>| {
            let mut state = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut left = item.len();
            while left > 0 {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let len = (1 + (state >> 33) as usize % 700).min(left);
                lens.push(len as u32);
                left -= len;
            }
        };
        for config in configs() {
            let batches: Vec<Vec<&[u8]>> = items
                .chunks(split % items.len().max(1) + 1)
                .map(|b| b.iter().map(Vec::as_slice).collect())
                .collect();
            let (mut one, mut two) = (Encoder::new(config).unwrap(), Encoder::new(config).unwrap());
            let (mut out_one, mut out_two) = (Vec::new(), Vec::new());
            one.write_header(&mut out_one);
            two.write_header(&mut out_two);
            let mut prepared = Prepared::default();
            for batch in &batches {
                one.prepare_fingerprints_with(batch, &mut prepared, cut);
                let mut want = Vec::new();
                batch.iter().enumerate().for_each(|(i, item)| cut(i, item, &mut want));
                let got: Vec<u32> = prepared.units(batch).iter().map(|u| u.len() as u32).collect();
                prop_assert_eq!(got, want);
                one.encode_prepared(batch, &prepared, &mut out_one);
                two.prepare_cuts_with(batch, &mut prepared, cut);
                let mut done = PreparedUnits::default();
                two.unit_prep().prepare(prepared.units(batch), &mut done);
                prepared.append_units(&done);
                two.encode_prepared(batch, &prepared, &mut out_two);
            }
            prop_assert_eq!(&decode_all(&out_one).unwrap(), &items, "{:?}", config);
            prop_assert_eq!(&decode_all(&out_two).unwrap(), &items, "{:?}", config);
            // Cuts that miss a byte of each item are redone, not trusted.
            let short = |i: usize, item: &[u8], lens: &mut Vec<u32>| {
                let before = lens.len();
                cut(i, item, lens);
                if lens.len() > before {
                    *lens.last_mut().unwrap() -= 1;
                }
            };
            let mut bad = Encoder::new(config).unwrap();
            let mut out_bad = Vec::new();
            bad.write_header(&mut out_bad);
            for batch in &batches {
                bad.prepare_fingerprints_with(batch, &mut prepared, short);
                bad.encode_prepared(batch, &prepared, &mut out_bad);
            }
            prop_assert_eq!(&decode_all(&out_bad).unwrap(), &items, "{:?}", config);
        }
    }

    #[test]
    fn prepared_work_shared_by_two_encoders_changes_nothing(items in revisions(), split in 0usize..12) {
        use dedupwire_engine::pipeline::{Encoder, Prepared};
        for config in configs() {
            let batches: Vec<Vec<&[u8]>> = items
                .chunks(split % items.len().max(1) + 1)
                .map(|b| b.iter().map(Vec::as_slice).collect())
                .collect();
            let (mut plain, mut a, mut b) = (
                Encoder::new(config).unwrap(),
                Encoder::new(config).unwrap(),
                Encoder::new(config).unwrap(),
            );
            let (mut out_plain, mut out_a, mut out_b) = (Vec::new(), Vec::new(), Vec::new());
            let mut prepared = Prepared::default();
            for batch in &batches {
                plain.encode_frame(batch, &mut out_plain);
                a.prepare(batch, &mut prepared);
                a.encode_prepared(batch, &prepared, &mut out_a);
                b.encode_prepared(batch, &prepared, &mut out_b);
            }
            prop_assert_eq!(&out_a, &out_plain);
            prop_assert_eq!(&out_b, &out_plain);
            if let Some(first) = batches.first() {
                // Work prepared for other items is not trusted: it is redone.
                let mut stale = Vec::new();
                b.encode_prepared(&first[..first.len().saturating_sub(1)], &prepared, &mut stale);
            }
        }
    }

    #[test]
    fn a_window_of_shared_batches_and_estimate_ids_write_the_same_stream(items in revisions(), split in 0usize..12) {
        use dedupwire_engine::fingerprint::Fingerprinter;
        use dedupwire_engine::pipeline::{Encoder, Prepared};
        for config in configs() {
            let mut plain = Encoder::new(config).unwrap();
            let mut shared = Encoder::new(config).unwrap().with_fingerprinter(Fingerprinter::estimate());
            let (mut out_plain, mut out_shared) = (Vec::new(), Vec::new());
            let mut prepared = Prepared::default();
            in_shared_batches(&items, split, |owner, slices| {
                plain.encode_frame(slices, &mut out_plain);
                shared.prepare(slices, &mut prepared);
                shared.encode_prepared_from(owner, slices, &prepared, &mut out_shared);
            });
            // zstd matches differently when a reference prefix lies right before the target in
            // memory (one batch holds both), so its deltas may differ in size (and so in being
            // chosen); the stream must still decode to the same items.
            if matches!(config.delta, DeltaSpec::ZstdRef { .. }) {
                prop_assert_eq!(shared.stats().units, plain.stats().units);
                let mut stream = Vec::new();
                shared.write_header(&mut stream);
                stream.extend_from_slice(&out_shared);
                prop_assert_eq!(&decode_all(&stream).unwrap(), &items, "{:?}", config);
            } else {
                prop_assert_eq!(&out_shared, &out_plain, "{:?}", config);
            }
        }
    }

    #[test]
    fn encoders_sharing_a_unit_store_write_the_streams_they_write_alone(items in revisions(), split in 0usize..12) {
        use dedupwire_engine::pipeline::{Encoder, Prepared, UnitStore};
        use std::sync::Arc;
        for config in configs() {
            // Two scopes over the same batches, the second with a smaller window and seeing
            // every other batch only, so that each holds units the other does not.
            let narrow = PipelineConfig { window_bytes: config.window_bytes / 3 + 1, ..config };
            let store = Arc::new(UnitStore::default());
            let mut alone = [Encoder::new(config).unwrap(), Encoder::new(narrow).unwrap()];
            let mut stored = [config, narrow]
                .map(|c| Encoder::new(c).unwrap().with_unit_store(Arc::clone(&store)));
            let mut outs: [Vec<u8>; 4] = Default::default();
            let mut prepared = Prepared::default();
            let mut n = 0;
            in_shared_batches(&items, split, |owner, slices| {
                let scopes = if n % 2 == 0 { 0..2 } else { 0..1 };
                n += 1;
                stored[0].prepare(slices, &mut prepared);
                for k in scopes {
                    alone[k].encode_frame(slices, &mut outs[k]);
                    stored[k].encode_prepared_from(owner, slices, &prepared, &mut outs[2 + k]);
                }
            });
            prop_assert_eq!(&outs[2], &outs[0], "{:?}", config);
            prop_assert_eq!(&outs[3], &outs[1], "{:?}", narrow);
            let mut stream = Vec::new();
            stored[0].write_header(&mut stream);
            stream.extend_from_slice(&outs[2]);
            prop_assert_eq!(&decode_all(&stream).unwrap(), &items);
        }
    }

    #[test]
    fn frames_handed_over_in_parts_are_the_frames(items in revisions(), split in 0usize..12) {
        use dedupwire_engine::pipeline::{Encoder, Prepared};
        let plain = configs().into_iter().map(|c| PipelineConfig {
            compression: Compression::None,
            ..c
        });
        for config in configs().into_iter().chain(plain) {
            let mut whole = Encoder::new(config).unwrap();
            let mut parts = Encoder::new(config).unwrap();
            let (mut out_whole, mut out_parts, mut head) = (Vec::new(), Vec::new(), Vec::new());
            let mut prepared = Prepared::default();
            in_shared_batches(&items, split, |owner, slices| {
                whole.prepare(slices, &mut prepared);
                whole.encode_prepared_from(owner, slices, &prepared, &mut out_whole);
                for part in parts.encode_prepared_parts(owner, slices, &prepared, &mut head) {
                    out_parts.extend_from_slice(part);
                }
            });
            prop_assert_eq!(&out_parts, &out_whole, "{:?}", config);
            prop_assert_eq!(format!("{:?}", parts.stats()), format!("{:?}", whole.stats()));
        }
    }

    #[test]
    fn a_smaller_window_writes_at_most_what_it_is_estimated_to_lose(items in revisions(), split in 0usize..12) {
        use dedupwire_engine::pipeline::Encoder;
        for config in configs() {
            let config = PipelineConfig { compression: Compression::None, window_bytes: 8192, ..config };
            let mut big = Encoder::new(config).unwrap().with_smaller_windows();
            let mut plain = Encoder::new(config).unwrap();
            prop_assert!(plain.smaller_windows().is_none());
            let (mut out, mut out_plain) = (Vec::new(), Vec::new());
            in_shared_batches(&items, split, |_, slices| {
                big.encode_frame(slices, &mut out);
                plain.encode_frame(slices, &mut out_plain);
            });
            prop_assert_eq!(&out, &out_plain, "following smaller windows changes nothing");
            let b = big.stats();
            for (window, lost) in big.smaller_windows().unwrap().lost() {
                prop_assert!(lost <= b.input_bytes + 2 * b.units);
                let mut small = Encoder::new(PipelineConfig { window_bytes: window, ..config }).unwrap();
                in_shared_batches(&items, split, |_, slices| small.encode_frame(slices, &mut out));
                // A frame's ops may grow by a varint byte or two when references become literals.
                let bound = b.raw_bytes + lost + 2 * b.frames;
                let s = small.stats();
                prop_assert!(s.raw_bytes <= bound, "{} > {} at {} {:?}", s.raw_bytes, bound, window, config);
            }
        }
    }

    #[test]
    fn damage_is_an_error_never_a_wrong_item(items in revisions(), at: usize, xor in 1u8..=255) {
        for config in configs() {
            let mut stream = encode_all(config, items.iter().map(Vec::as_slice), 2000).unwrap();
            let i = at % stream.len();
            stream[i] ^= xor;
            if let Ok(back) = decode_all(&stream) {
                prop_assert_eq!(&back, &items, "a damaged stream decoded to different items");
            }
            let cut = at % stream.len();
            stream[i] ^= xor;
            if cut > 0 && cut < stream.len() {
                if let Ok(back) = decode_all(&stream[..cut]) {
                    prop_assert!(back.len() < items.len() || items.is_empty() || back == items);
                    prop_assert!(items.starts_with(&back));
                }
            }
        }
    }
}

#[test]
fn revisions_become_deltas_and_duplicates_references() {
    let base: Vec<u8> = (0..20_000u32)
        .flat_map(|i| format!("line {i} of the document\n").into_bytes())
        .take(20_000)
        .collect();
    let mut edited = base.clone();
    edited.splice(5000..5010, *b"CHANGED!");
    let items = [base.as_slice(), edited.as_slice(), base.as_slice()];
    let config = PipelineConfig::documents();
    let mut enc = dedupwire_engine::pipeline::Encoder::new(config).unwrap();
    let mut out = Vec::new();
    enc.write_header(&mut out);
    enc.encode_frame(&items, &mut out);
    let s = enc.stats();
    assert_eq!((s.literals, s.deltas, s.refs), (1, 1, 1), "{s:?}");
    assert!(s.delta_bytes < 256, "{s:?}");
    assert_eq!(
        decode_all(&out).unwrap(),
        items.iter().map(|i| i.to_vec()).collect::<Vec<_>>()
    );
}

#[test]
fn rejects_foreign_and_future_streams() {
    let err = decode_all(b"PK\x03\x04 not ours").unwrap_err().to_string();
    assert!(err.contains("not a dedupwire pipeline stream"), "{err}");
    let mut stream = encode_all(PipelineConfig::documents(), [b"abc".as_slice()], 10).unwrap();
    stream[3] = 9;
    let err = decode_all(&stream).unwrap_err().to_string();
    assert!(err.contains("version 9 is not supported"), "{err}");
}

#[test]
fn a_stream_without_content_hashes_has_the_same_size_and_does_not_decode() {
    use dedupwire_engine::pipeline::Encoder;
    let items: Vec<Vec<u8>> = (0..40u32)
        .map(|i| format!("document {i}: {}", "text ".repeat(i as usize * 7)).into_bytes())
        .collect();
    let slices: Vec<&[u8]> = items.iter().map(Vec::as_slice).collect();
    let encode = |enc: Encoder| {
        let mut enc = enc;
        let mut out = Vec::new();
        enc.write_header(&mut out);
        for batch in slices.chunks(7) {
            enc.encode_frame(batch, &mut out);
        }
        (out, enc.stats())
    };
    let config = PipelineConfig::documents();
    let (real, real_stats) = encode(Encoder::new(config).unwrap());
    let (measured, measured_stats) = encode(Encoder::new(config).unwrap().without_content_hash());
    assert_eq!(measured.len(), real.len());
    assert_eq!(format!("{measured_stats:?}"), format!("{real_stats:?}"));
    assert_ne!(measured, real);
    assert_eq!(decode_all(&real).unwrap(), items);
    let err = decode_all(&measured).unwrap_err().to_string();
    assert!(err.contains("content hash mismatch"), "{err}");
}
