//! Compression alone, per batch: the baseline every other method is compared with.

use std::sync::Arc;

use dedupwire_engine::compress::Compression;

use crate::input::{Batch, BATCH_BYTES};
use crate::memo::Memo;

use super::residual::Residual;
use super::{Measured, Runner};

/// Compression alone, per 4 MiB batch; on large inputs one batch in `every` after the first
/// few, extrapolated like a residual stream.
pub(super) struct CompressRunner {
    method: Compression,
    stream: Residual,
}

impl CompressRunner {
    /// Compression alone with `method`; the reference of the other streams if they compress
    /// with it too (`on_top`).
    pub(super) fn new(method: Compression, on_top: Compression, every: u64, memo: &Memo) -> Self {
        let stream = Residual::new(every, method, memo);
        CompressRunner {
            method,
            stream: match method == on_top {
                true => stream.publishing(),
                false => stream,
            },
        }
    }
}

impl Runner for CompressRunner {
    fn feed(&mut self, batch: &Arc<Batch>) {
        self.stream.push_input_batch(&batch.data, batch.seq);
        if self.stream.publishes {
            // Published now, not when the next batch comes: streams wait for it.
            self.stream.flush();
        }
    }

    fn finish(mut self: Box<Self>) -> Vec<Measured> {
        let (out, rel, cpu) = self.stream.estimate();
        ["local", "global"]
            .into_iter()
            .map(|scope| Measured {
                name: self.method.to_string(),
                family: "compress".into(),
                scope,
                params: serde_json::json!({ "compression": self.method.to_string(), "batch_bytes": BATCH_BYTES }),
                output_bytes: out,
                index_bytes: 0,
                cpu_seconds: cpu,
                rel_error: rel,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::tests::noise;

    #[test]
    fn sampled_compression_is_close_to_full_and_says_how_close() {
        // Batches alternate unpredictably between noise, text and zeros, as in a disk image.
        let mut data = Vec::new();
        for i in 0..96u64 {
            let kind = (i * 7 + i / 5) % 3;
            data.extend(match kind {
                0 => noise(BATCH_BYTES, i + 1),
                1 => format!("line {i} of some log text, fairly repetitive\n")
                    .into_bytes()
                    .repeat(BATCH_BYTES / 40 + 1)[..BATCH_BYTES]
                    .to_vec(),
                _ => vec![0; BATCH_BYTES],
            });
        }
        let estimate = |every| {
            let mut r = Residual::new(every, Compression::Zstd(3), &Memo::default());
            for seq in 0..(data.len() / BATCH_BYTES) as u64 {
                r.begin(seq * BATCH_BYTES as u64, seq);
            }
            for (i, piece) in data.chunks(1_000_003).enumerate() {
                r.push_at((i * 1_000_003) as u64, piece);
            }
            r.estimate()
        };
        let (full, full_err, _) = estimate(1);
        assert_eq!(full_err, 0.0);
        let (est, rel, _) = estimate(6);
        let dev = (est as f64 - full as f64).abs() / full as f64;
        assert!(rel > 0.0 && rel < 0.1, "stated error {rel}");
        assert!(dev < 3.0 * rel + 0.005, "off by {dev}, stated {rel}");
    }
}
