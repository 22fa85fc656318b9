//! Choosing a method for a link: the cost model of the big-data study, made concrete.
//!
//! Sending `I` input bytes with a method that outputs `O` bytes and needs `C` CPU seconds
//! takes `max(C, 8·O / L)` on a link of `L` bit/s when compute and transfer overlap (they do in
//! a pipelined sender). Dedup pays when its saving in transfer time outweighs its extra CPU.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::report::MethodReport;

/// The recommendation for one link speed, with break-even speeds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recommendation {
    /// The link speed assumed, bit/s.
    pub link_bits_per_s: f64,
    /// The fastest method end to end (global scope).
    pub method: String,
    /// Its estimated seconds to move the input.
    pub seconds: f64,
    /// Seconds to send the input uncompressed.
    pub plain_seconds: f64,
    /// The fastest compression-only method and its seconds.
    pub best_compression: Option<(String, f64)>,
    /// The dedup method (exact or similarity) with the highest ratio.
    pub best_dedup: Option<String>,
    /// Link speed (bit/s) below which `best_dedup` is faster than the best compression-only method.
    pub dedup_beats_compression_below_bits_per_s: Option<f64>,
    /// Link speed (bit/s) below which `best_dedup` is faster than sending plain bytes.
    pub dedup_beats_plain_below_bits_per_s: Option<f64>,
}

/// Parses `100Mbit`, `1Gbit`, `3mbps`, `56kbit` or a plain number of bit/s.
pub fn parse_link(s: &str) -> Option<f64> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let unit = unit
        .trim()
        .trim_end_matches("/s")
        .trim_end_matches("ps")
        .trim_end_matches("it")
        .trim_end_matches('b');
    let mult = match unit {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        _ => return None,
    };
    (n > 0.0).then_some(n * mult)
}

/// Formats bit/s with a decimal unit.
pub fn human_link(bits: f64) -> String {
    if bits >= 1e9 {
        format!("{:.1} Gbit/s", bits / 1e9)
    } else if bits >= 1e6 {
        format!("{:.1} Mbit/s", bits / 1e6)
    } else {
        format!("{:.0} kbit/s", bits / 1e3)
    }
}

fn seconds(m: &MethodReport, input: u64, link: f64) -> f64 {
    let cpu = input as f64 / 1e6 / m.mb_per_s.max(1e-9);
    cpu.max(m.output_bytes as f64 * 8.0 / link)
}

fn is_dedup(m: &MethodReport) -> bool {
    m.family != "compress"
}

/// Picks the fastest global-scope method for `link` bit/s and finds the break-even speeds.
pub fn recommend(input: u64, methods: &[MethodReport], link: f64) -> Recommendation {
    let global: Vec<&MethodReport> = methods.iter().filter(|m| m.scope == "global").collect();
    let plain = input as f64 * 8.0 / link;
    let fastest = |pred: &dyn Fn(&MethodReport) -> bool, l: f64| {
        global
            .iter()
            .filter(|m| pred(m))
            .map(|m| (*m, seconds(m, input, l)))
            .min_by(|a, b| {
                a.1.total_cmp(&b.1)
                    .then(a.0.output_bytes.cmp(&b.0.output_bytes))
            })
    };
    let best = fastest(&|_| true, link);
    let best_comp = fastest(&|m| !is_dedup(m), link);
    let best_dedup = global
        .iter()
        .filter(|m| is_dedup(m))
        .max_by(|a, b| {
            a.ratio
                .total_cmp(&b.ratio)
                .then(b.mb_per_s.total_cmp(&a.mb_per_s).reverse())
        })
        .copied();
    let grid: Vec<f64> = (0..=120)
        .map(|i| 1e5 * 10f64.powf(i as f64 / 20.0))
        .collect();
    let below = |beats: &dyn Fn(f64) -> bool| grid.iter().rev().find(|&&l| beats(l)).copied();
    let (vs_comp, vs_plain) = match best_dedup {
        Some(d) => (
            below(&|l| match fastest(&|m| !is_dedup(m), l) {
                Some((_, t)) => seconds(d, input, l) < t,
                None => true,
            }),
            below(&|l| seconds(d, input, l) < input as f64 * 8.0 / l),
        ),
        None => (None, None),
    };
    let (method, secs) = match best {
        Some((m, t)) if t < plain => (m.name.clone(), t),
        _ => ("plain (no dedup, no compression)".into(), plain),
    };
    Recommendation {
        link_bits_per_s: link,
        method,
        seconds: secs,
        plain_seconds: plain,
        best_compression: best_comp.map(|(m, t)| (m.name.clone(), t)),
        best_dedup: best_dedup.map(|m| m.name.clone()),
        dedup_beats_compression_below_bits_per_s: vs_comp,
        dedup_beats_plain_below_bits_per_s: vs_plain,
    }
}

impl Recommendation {
    /// Plain-text summary.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "recommended for {}: {} ({:.1} s, vs {:.1} s plain)",
            human_link(self.link_bits_per_s),
            self.method,
            self.seconds,
            self.plain_seconds
        );
        if let Some((m, t)) = &self.best_compression {
            let _ = writeln!(s, "best compression only: {m} ({t:.1} s)");
        }
        if let Some(d) = &self.best_dedup {
            match self.dedup_beats_compression_below_bits_per_s {
                Some(l) => {
                    let _ = writeln!(
                        s,
                        "break-even: {d} saves time over compression alone on links below {}",
                        human_link(l)
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "break-even: {d} never beats compression alone on this data"
                    );
                }
            }
            if let Some(l) = self.dedup_beats_plain_below_bits_per_s {
                let _ = writeln!(
                    s,
                    "            and over plain sending on links below {}",
                    human_link(l)
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_link_speeds() {
        assert_eq!(parse_link("100Mbit"), Some(100e6));
        assert_eq!(parse_link("1Gbit/s"), Some(1e9));
        assert_eq!(parse_link("3mbps"), Some(3e6));
        assert_eq!(parse_link("56kbit"), Some(56e3));
        assert_eq!(parse_link("fast"), None);
        assert_eq!(parse_link("0Mbit"), None);
    }

    fn m(name: &str, family: &str, out: u64, mbps: f64) -> MethodReport {
        MethodReport {
            name: name.into(),
            family: family.into(),
            scope: "global".into(),
            params: serde_json::Value::Null,
            output_bytes: out,
            ratio: 1e9 / out as f64,
            index_bytes: 0,
            mb_per_s: mbps,
            cpu_s_per_gb: 1000.0 / mbps,
            rel_error: 0.0,
        }
    }

    #[test]
    fn slow_links_favour_dedup_fast_links_favour_compression() {
        let ms = [
            m("zstd-3", "compress", 300_000_000, 400.0),
            m("exact-cdc-8KiB+zstd", "exact-cdc+zstd", 50_000_000, 200.0),
        ];
        let slow = recommend(1_000_000_000, &ms, 10e6);
        assert_eq!(slow.method, "exact-cdc-8KiB+zstd");
        let fast = recommend(1_000_000_000, &ms, 2e9);
        assert_eq!(fast.method, "zstd-3");
        let be = slow.dedup_beats_compression_below_bits_per_s.unwrap();
        // zstd: max(2.5 s, 2.4e9/L); dedup: max(5 s, 4e8/L); dedup wins while 2.4e9/L > 5 s, L < 480 Mbit/s.
        assert!(be > 400e6 && be < 480e6, "{be}");
    }
}
