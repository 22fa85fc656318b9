//! The analysis report: the stable JSON shape, and a plain-text table for terminals.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::methods::Measured;
use crate::recommend::{self, Recommendation};
use crate::Options;

/// One input image as read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageStats {
    /// The path as given.
    pub path: String,
    /// `files` or `documents`.
    pub kind: String,
    /// Files read.
    pub files: u64,
    /// Bytes read (decompressed for `.zst` document streams, without line ends).
    pub input_bytes: u64,
    /// Items (files, or document writes).
    pub items: u64,
}

/// One method in one scope. The field names are a stable interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MethodReport {
    /// Method name, e.g. `exact-cdc-4KiB+zstd`.
    pub name: String,
    /// Family, e.g. `exact-cdc+zstd`.
    pub family: String,
    /// `local` (each image alone) or `global` (all images pooled).
    pub scope: String,
    /// Parameters.
    pub params: serde_json::Value,
    /// Bytes the method would send or store.
    pub output_bytes: u64,
    /// Input bytes / output bytes.
    pub ratio: f64,
    /// RAM its index needs (a real BLAKE3-keyed index for exact dedup).
    pub index_bytes: u64,
    /// Input MB (10^6 bytes) processed per CPU second on this machine.
    pub mb_per_s: f64,
    /// CPU seconds per GB (10^9 bytes) of input.
    pub cpu_s_per_gb: f64,
    /// Relative standard error of `output_bytes` where compression was sampled (0 if exact).
    pub rel_error: f64,
}

impl MethodReport {
    /// How the line's error reads in a table: its standard error if sampled, and whether
    /// `output_bytes` is only an upper bound (chunk-sampled `+zstd` lines).
    pub fn error_label(&self) -> String {
        let mut parts = Vec::new();
        if self.rel_error > 0.0 && self.rel_error.is_finite() {
            parts.push(format!("±{:.1}%", self.rel_error * 100.0));
        }
        if self.params.get("upper_bound") == Some(&serde_json::Value::Bool(true)) {
            parts.push("upper bound".to_string());
        }
        parts.join(", ")
    }
}

/// The whole report. The field names are a stable interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Bytes read from all images.
    pub input_bytes: u64,
    /// Items read from all images.
    pub items: u64,
    /// The images.
    pub images: Vec<ImageStats>,
    /// Every method in both scopes.
    pub methods: Vec<MethodReport>,
    /// What to use for the given link, and the break-even link speeds.
    pub recommendation: Recommendation,
    /// How the numbers were obtained.
    pub notes: Vec<String>,
    /// What the user should know the numbers do not cover, such as files that changed while
    /// they were read (absent when there is none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Wall seconds the analysis took.
    pub elapsed_s: f64,
    /// CPU seconds the analysis took, all threads together.
    #[serde(default)]
    pub cpu_s: f64,
    /// Cores the analysis could use.
    #[serde(default)]
    pub cores: u64,
    /// The share of the whole machine's CPU time that was busy meanwhile, with this analysis
    /// or other work (absent where the system does not tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_busy: Option<f64>,
    /// Seconds the methods had no input to work on: reading (the disk, a pipe) had not
    /// delivered the next batch.
    #[serde(default)]
    pub waited_on_input_s: f64,
    /// Seconds reading waited for the methods: a method's queue was full, then the methods
    /// finished the last batches.
    #[serde(default)]
    pub waited_on_methods_s: f64,
}

/// How long reading and the methods waited for each other (see [`Report::pace`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Waits {
    pub input: f64,
    pub methods: f64,
}

/// The share of its cores' time at which an analysis counts as CPU-bound whatever the waits:
/// the default analysis of the benchmark's images and trees keeps two cores 90–94% busy.
const BUSY: f64 = 0.85;

/// Seconds an analysis must run for its pace to be told: a shorter one is mostly starting
/// threads and measuring this machine's hashing, and a 27-byte file was called CPU-bound
/// ("more cores would analyze faster") when the machine was busy with other work.
const PACE_MIN_S: f64 = 1.0;

/// What set an analysis' pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The methods kept up with reading: the analysis ran at the speed of its input.
    Input,
    /// The cores were kept busy: more cores, or fewer methods, would be faster.
    Cpu,
    /// Reading waited for the methods with cores to spare: one method's thread was the limit.
    SlowestMethod,
}

impl Pace {
    /// The pace in a few words.
    pub fn label(self) -> &'static str {
        match self {
            Pace::Input => "input-bound",
            Pace::Cpu => "CPU-bound",
            Pace::SlowestMethod => "bound by the slowest method",
        }
    }

    /// What would make an analysis of this pace faster, if anything.
    fn advice(self) -> &'static str {
        match self {
            Pace::Input => "the analysis kept up with reading",
            Pace::Cpu => "more cores, or fewer methods (--methods), would analyze faster",
            Pace::SlowestMethod => "its thread was the limit, so more cores would not help",
        }
    }
}

pub(crate) fn build(
    images: Vec<ImageStats>,
    measured: Vec<Measured>,
    opts: &Options,
    compress_every: u64,
    chunk_sample: u64,
    quick_sweep: bool,
    elapsed_s: f64,
) -> Report {
    let input_bytes: u64 = images.iter().map(|i| i.input_bytes).sum();
    let items = images.iter().map(|i| i.items).sum();
    let methods: Vec<MethodReport> = measured
        .into_iter()
        .map(|m| {
            let cpu = m.cpu_seconds.max(1e-9);
            MethodReport {
                ratio: input_bytes as f64 / m.output_bytes.max(1) as f64,
                mb_per_s: input_bytes as f64 / 1e6 / cpu,
                cpu_s_per_gb: cpu / (input_bytes.max(1) as f64 / 1e9),
                name: m.name,
                family: m.family,
                scope: m.scope.to_string(),
                params: m.params,
                output_bytes: m.output_bytes,
                index_bytes: m.index_bytes,
                rel_error: m.rel_error,
            }
        })
        .collect();
    let recommendation = recommend::recommend(input_bytes, &methods, opts.link_bits_per_s);
    let mut notes = vec![
        format!("output bytes count a {}-byte reference per chunk; exact-dedup index memory is {} bytes per unique chunk (BLAKE3 key, location, table slack)", crate::methods::REF_BYTES, crate::methods::INDEX_ENTRY_BYTES),
        "exact dedup counts duplicates with xxh3-64 and adds BLAKE3's measured cost at the same chunk size to the CPU time".into(),
        "speed is input MB per CPU second of one core on this machine; local scope deduplicates each image alone, global pools all images".into(),
        format!("similarity + delta uses a window of {} MiB of recent data as delta sources", opts.window_bytes >> 20),
    ];
    notes.extend(window_notes(&methods, input_bytes));
    if quick_sweep {
        notes.push(format!(
            "the input is over {} GiB, so exact dedup was measured at five chunk sizes (1, 4, 16, 64, 128 KiB); --methods all measures all eight",
            crate::FULL_SWEEP_UP_TO >> 30
        ));
    }
    if chunk_sample > 1 {
        notes.push(format!(
            "exact dedup indexed 1 chunk in {chunk_sample}, chosen by content (every copy of a sampled chunk is sampled), and scaled up; rel_error includes this sampling error; +zstd lines compress the sampled chunks without their neighbours and overstate the output (whole documents of rfcs.jsonl by 72% at 1 in 4): read them as upper bounds; whole files are never sampled, whole documents are"
        ));
    }
    if compress_every > 1 {
        notes.push(format!(
            "compression (alone and on top of dedup): each method compresses what it emits for every 4 MiB batch of input; what it emitted for 1 input batch in {compress_every} (the same batches for every method) was compressed, and the rest extrapolated with a proxy ratio estimator; rel_error is the relative standard error of that estimate"
        ));
    }
    Report {
        input_bytes,
        items,
        images,
        methods,
        recommendation,
        notes,
        warnings: Vec::new(),
        elapsed_s,
        cpu_s: 0.0,
        cores: 0,
        machine_busy: None,
        waited_on_input_s: 0.0,
        waited_on_methods_s: 0.0,
    }
}

/// What the numbers do not cover: files that `changed` while they were read, and an input
/// of no bytes at all (`input_bytes` in `items`).
pub(crate) fn warnings(
    changed: &[crate::input::Changed],
    input_bytes: u64,
    items: u64,
) -> Vec<String> {
    let mut warnings: Vec<String> = changed.iter().map(changed_warning).collect();
    if input_bytes == 0 {
        warnings.push(match items {
            0 => "the input holds no files or documents: there is nothing to measure".into(),
            n => format!("the input's {n} items are all empty: there is nothing to measure"),
        });
    }
    warnings
}

/// The warning for a file that changed while it was read, or could not be read.
fn changed_warning(c: &crate::input::Changed) -> String {
    use crate::input::Change;
    let (path, listed) = (c.path.display(), c.listed);
    match &c.what {
        Change::Read(read) => format!(
            "{path} changed while it was read ({listed} bytes when listed, {read} read): the report covers the bytes read"
        ),
        Change::Removed => format!(
            "{path} was removed before it was read ({listed} bytes when listed): the report leaves it out"
        ),
        Change::Unreadable(why) => format!(
            "{path} could not be read ({why}): the report leaves out its {listed} bytes"
        ),
        Change::Unlisted(why) => format!(
            "{path} could not be listed ({why}): the report leaves out what it holds"
        ),
    }
}

/// A note for each similarity scope whose window was too small for more than 1% of the
/// input: bytes that copied data older than the window, which a larger one would reference.
fn window_notes(methods: &[MethodReport], input_bytes: u64) -> Vec<String> {
    methods
        .iter()
        .filter(|m| m.name == "similarity")
        .filter_map(|m| {
            let beyond = m.params.get("beyond_window_bytes")?.as_u64()?;
            let window = m.params.get("window_bytes")?.as_u64()?;
            (beyond * 100 > input_bytes).then(|| {
                format!(
                    "similarity ({} scope): {} ({:.0}% of the input) copied data older than its {} MiB window, so it could not reference them; a larger --window (more memory) would",
                    m.scope,
                    human_bytes(beyond),
                    100.0 * beyond as f64 / input_bytes.max(1) as f64,
                    window >> 20
                )
            })
        })
        .chain(methods.iter().filter_map(|m| smaller_window_note(m, input_bytes)))
        .collect()
}

/// For a similarity scope whose ratio a window half as large would cut by more than 1%: about
/// the least ratio each smaller window would keep (an estimate that errs low, see
/// `dedupwire_engine::pipeline::SmallerWindows`), so a user can size the receiver's memory.
fn smaller_window_note(m: &MethodReport, input_bytes: u64) -> Option<String> {
    if m.name != "similarity" {
        return None;
    }
    let window = m.params.get("window_bytes")?.as_u64()?;
    let rows = smaller_window_ratios(m, input_bytes);
    let &(_, half) = rows.first()?;
    (half < 0.99 * m.ratio).then(|| {
        let keeps: Vec<String> = rows
            .iter()
            .map(|&(w, r)| format!("{} {r:.2}x", human_bytes(w)))
            .collect();
        format!(
            "similarity ({} scope) with a smaller --window would keep at least about: {} (against {:.2}x at {})",
            m.scope,
            keeps.join(", "),
            m.ratio,
            human_bytes(window)
        )
    })
}

/// A similarity line's smaller windows (`params.smaller_windows`) with the least ratio each
/// would keep, about: (window bytes, ratio); none when the line has no such estimate.
pub fn smaller_window_ratios(m: &MethodReport, input_bytes: u64) -> Vec<(u64, f64)> {
    m.params
        .get("smaller_windows")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let bytes = w.get("window_bytes")?.as_u64()?;
            let out = w.get("output_bytes_at_most")?.as_u64()?.max(1);
            Some((bytes, input_bytes as f64 / out as f64))
        })
        .collect()
}

/// Formats `n` bytes with a binary unit.
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

impl Report {
    /// Records the CPU the analysis took on `cores` cores, how busy the whole machine was
    /// meanwhile, and how long reading and the methods waited for each other.
    pub(crate) fn set_pace(
        &mut self,
        cpu_s: f64,
        cores: usize,
        machine_busy: Option<f64>,
        waits: Waits,
    ) {
        self.cpu_s = cpu_s;
        self.cores = cores as u64;
        self.machine_busy = machine_busy;
        self.waited_on_input_s = waits.input;
        self.waited_on_methods_s = waits.methods;
    }

    /// The share of its cores' time the analysis kept busy (`None` if not recorded).
    pub fn busy(&self) -> Option<f64> {
        (self.cores > 0 && self.elapsed_s > 0.0)
            .then(|| self.cpu_s / (self.elapsed_s * self.cores as f64))
    }

    /// What set the pace (`None` without input, for a run under [`PACE_MIN_S`], or for a
    /// report that did not record it):
    /// the CPU when the analysis kept the cores busy; else, when reading waited longer for
    /// the methods than they for input, the CPU if other work took the rest of the cores and
    /// the slowest method if not; else the input. (Waits alone mislead on busy cores: reading
    /// then also waits for a core.)
    pub fn pace(&self) -> Option<Pace> {
        let (input, methods) = (self.waited_on_input_s, self.waited_on_methods_s);
        let recorded = input + methods > 0.0;
        if self.input_bytes == 0 || !recorded || self.elapsed_s < PACE_MIN_S {
            return None;
        }
        let busy = |share: Option<f64>| share.is_some_and(|b| b >= BUSY);
        let waited_for_methods = methods > input;
        Some(
            if busy(self.busy()) || (waited_for_methods && busy(self.machine_busy)) {
                Pace::Cpu
            } else if waited_for_methods {
                Pace::SlowestMethod
            } else {
                Pace::Input
            },
        )
    }

    /// [`Report::pace`] for people: what set it, the numbers that tell, and what would help.
    pub fn pace_text(&self) -> Option<String> {
        let pace = self.pace()?;
        let mut cores = match self.busy() {
            Some(b) => format!("{:.0}% of {} cores busy", 100.0 * b, self.cores),
            None => "cores not recorded".into(),
        };
        if let Some(m) = self.machine_busy {
            let _ = write!(
                cores,
                " with the analysis, {:.0}% counting other work",
                100.0 * m
            );
        }
        Some(format!(
            "{} ({cores}, {:.1} CPU-s; the methods waited {:.1} s for input, reading {:.1} s for the methods): {}",
            pace.label(),
            self.cpu_s,
            self.waited_on_input_s,
            self.waited_on_methods_s,
            pace.advice()
        ))
    }

    /// A plain-text table of the global scope (and local where it differs), then the recommendation.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} in {} items from {} image(s), analyzed in {:.1} s",
            human_bytes(self.input_bytes),
            self.items,
            self.images.len(),
            self.elapsed_s
        );
        if let Some(pace) = self.pace_text() {
            let _ = writeln!(s, "{pace}");
        }
        let _ = writeln!(
            s,
            "{:<28} {:>11} {:>8} {:>8} {:>11} {:>9}",
            "method", "output", "global", "local", "index", "MB/s"
        );
        for m in self.methods.iter().filter(|m| m.scope == "global") {
            let local = self
                .methods
                .iter()
                .find(|l| l.scope == "local" && l.name == m.name)
                .map_or(m.ratio, |l| l.ratio);
            let err = match m.error_label() {
                e if e.is_empty() => e,
                e => format!(" {e}"),
            };
            let _ = writeln!(
                s,
                "{:<28} {:>11} {:>7.2}x {:>7.2}x {:>11} {:>9.0}{err}",
                m.name,
                human_bytes(m.output_bytes),
                m.ratio,
                local,
                human_bytes(m.index_bytes),
                m.mb_per_s
            );
        }
        s.push('\n');
        s.push_str(&self.recommendation.to_text());
        for note in window_notes(&self.methods, self.input_bytes) {
            let _ = writeln!(s, "note: {note}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of 2 s on 2 cores that took `cpu` CPU-seconds and waited so.
    fn measured(cpu: f64, input: f64, methods: f64) -> Report {
        let mut r = build(
            Vec::new(),
            Vec::new(),
            &Options::default(),
            1,
            1,
            false,
            2.0,
        );
        r.input_bytes = 1 << 30;
        r.set_pace(cpu, 2, None, Waits { input, methods });
        r
    }

    #[test]
    fn busy_cores_or_waiting_methods_make_it_cpu_bound_else_input_bound() {
        let slow_disk = measured(1.0, 1.5, 0.1);
        assert_eq!(slow_disk.pace(), Some(Pace::Input));
        let text = slow_disk.pace_text().unwrap();
        assert!(
            text.starts_with("input-bound (25% of 2 cores busy, 1.0 CPU-s"),
            "{text}"
        );
        assert!(text.contains("waited 1.5 s for input"), "{text}");
        // Busy cores make reading wait for a core too: CPU-bound whatever the waits.
        let busy = measured(3.6, 1.5, 0.4);
        assert_eq!(busy.pace(), Some(Pace::Cpu));
        assert!(busy
            .pace_text()
            .unwrap()
            .starts_with("CPU-bound (90% of 2 cores"));
        assert!(busy
            .to_text()
            .lines()
            .nth(1)
            .unwrap()
            .starts_with("CPU-bound"));
        let mut one_method = measured(1.2, 0.1, 1.5);
        assert_eq!(one_method.pace(), Some(Pace::SlowestMethod));
        // Other work took the cores the analysis left: CPU-bound all the same.
        one_method.machine_busy = Some(0.97);
        assert_eq!(one_method.pace(), Some(Pace::Cpu));
        let text = one_method.pace_text().unwrap();
        assert!(
            text.starts_with(
                "CPU-bound (30% of 2 cores busy with the analysis, 97% counting other work"
            ),
            "{text}"
        );
        one_method.machine_busy = Some(0.5);
        let text = one_method.pace_text().unwrap();
        assert!(text.starts_with("bound by the slowest method"), "{text}");
        // Methods that waited for input were not slowed by other work, however busy.
        let mut slow_disk = measured(0.3, 1.5, 0.1);
        slow_disk.machine_busy = Some(1.0);
        assert_eq!(slow_disk.pace(), Some(Pace::Input));
    }

    #[test]
    fn no_pace_without_input_for_a_short_run_or_from_a_report_that_did_not_record_it() {
        let mut none = measured(1.0, 1.0, 0.0);
        none.input_bytes = 0;
        assert_eq!(none.pace(), None);
        let mut short = measured(0.3, 0.0, 0.1);
        short.machine_busy = Some(1.0);
        assert_eq!(short.pace(), Some(Pace::Cpu));
        short.elapsed_s = 0.2;
        assert_eq!(short.pace(), None);
        assert_eq!(
            short
                .to_text()
                .lines()
                .nth(1)
                .map(|l| l.starts_with("method")),
            Some(true)
        );
        let old: Report = serde_json::from_str(
            &serde_json::to_string(&measured(1.0, 1.0, 0.0))
                .unwrap()
                .replace("\"waited_on_input_s\"", "\"x\"")
                .replace("\"waited_on_methods_s\"", "\"y\""),
        )
        .unwrap();
        assert_eq!(old.pace(), None);
        assert!(old.pace_text().is_none());
    }

    #[test]
    fn a_changed_file_gets_a_warning_and_none_leaves_json_as_it_was() {
        let changed = crate::input::Changed {
            path: "/data/live.log".into(),
            listed: 100,
            what: crate::input::Change::Read(160),
        };
        assert_eq!(
            changed_warning(&changed),
            "/data/live.log changed while it was read (100 bytes when listed, 160 read): the report covers the bytes read"
        );
        let gone = crate::input::Changed {
            what: crate::input::Change::Removed,
            ..changed.clone()
        };
        assert_eq!(
            changed_warning(&gone),
            "/data/live.log was removed before it was read (100 bytes when listed): the report leaves it out"
        );
        let refused = crate::input::Changed {
            what: crate::input::Change::Unreadable("Permission denied (os error 13)".into()),
            ..changed.clone()
        };
        assert_eq!(
            changed_warning(&refused),
            "/data/live.log could not be read (Permission denied (os error 13)): the report leaves out its 100 bytes"
        );
        let closed = crate::input::Changed {
            path: "/data/private".into(),
            listed: 0,
            what: crate::input::Change::Unlisted("Permission denied (os error 13)".into()),
        };
        assert_eq!(
            changed_warning(&closed),
            "/data/private could not be listed (Permission denied (os error 13)): the report leaves out what it holds"
        );
        assert_eq!(warnings(&[gone], 5, 1).len(), 1);
        assert_eq!(
            warnings(&[], 0, 0),
            ["the input holds no files or documents: there is nothing to measure"]
        );
        let quiet = build(vec![], vec![], &Options::default(), 1, 1, false, 0.0);
        let json = serde_json::to_value(&quiet).unwrap();
        assert!(json.get("warnings").is_none(), "{json}");
    }

    fn line(name: &str, scope: &str, params: serde_json::Value) -> MethodReport {
        MethodReport {
            name: name.into(),
            family: name.into(),
            scope: scope.into(),
            params,
            output_bytes: 0,
            ratio: 1.0,
            index_bytes: 0,
            mb_per_s: 1.0,
            cpu_s_per_gb: 1.0,
            rel_error: 0.0,
        }
    }

    #[test]
    fn a_line_reads_its_error_and_whether_it_is_an_upper_bound() {
        let mut m = line("exact-cdc-4KiB+zstd", "global", serde_json::json!({}));
        assert_eq!(m.error_label(), "");
        m.rel_error = 0.0234;
        assert_eq!(m.error_label(), "±2.3%");
        m.params = serde_json::json!({ "upper_bound": true });
        assert_eq!(m.error_label(), "±2.3%, upper bound");
        m.rel_error = f64::NAN;
        assert_eq!(m.error_label(), "upper bound");
    }

    #[test]
    fn a_window_too_small_for_over_one_percent_of_the_input_gets_a_note() {
        let beyond =
            |b: u64| serde_json::json!({ "beyond_window_bytes": b, "window_bytes": 1u64 << 30 });
        let methods = [
            line("similarity", "local", beyond(5 << 20)),
            line("similarity", "global", beyond(300 << 20)),
            line("similarity+zstd", "global", beyond(300 << 20)),
            line("exact-cdc-4KiB", "global", serde_json::json!({})),
        ];
        let notes = window_notes(&methods, 1 << 30);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("similarity (global scope): 300.0 MiB (29% of the input)"),
            "{}",
            notes[0]
        );
        assert!(notes[0].contains("1024 MiB window"));
        let unknown = [line("similarity", "global", serde_json::json!({}))];
        assert!(window_notes(&unknown, 1 << 30).is_empty());
    }

    #[test]
    fn a_scope_that_a_smaller_window_would_cost_gets_the_ratios_it_would_keep() {
        let gib = 1u64 << 30;
        let params = |half: u64| {
            serde_json::json!({
                "window_bytes": gib,
                "beyond_window_bytes": 0,
                "smaller_windows": [
                    { "window_bytes": gib / 2, "output_bytes_at_most": half },
                    { "window_bytes": gib / 4, "output_bytes_at_most": gib },
                ],
            })
        };
        let with_ratio = |mut m: MethodReport| {
            m.ratio = 2.0;
            m
        };
        let methods = [
            with_ratio(line("similarity", "local", params(gib / 2 + 1))),
            with_ratio(line("similarity", "global", params(gib * 2 / 3))),
            with_ratio(line("similarity+zstd", "global", params(gib))),
        ];
        let notes = window_notes(&methods, gib);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert_eq!(
            notes[0],
            "similarity (global scope) with a smaller --window would keep at least about: 512.0 MiB 1.50x, 256.0 MiB 1.00x (against 2.00x at 1.0 GiB)"
        );
    }
}
