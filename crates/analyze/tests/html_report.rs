//! The HTML report: structure, escaping, degenerate reports, and a real render in headless Chromium.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dedupwire_analyze::recommend::{self, Recommendation};
use dedupwire_analyze::report::{ImageStats, MethodReport};
use dedupwire_analyze::{html, Report};

/// A report from a real run (compression, whole and fixed chunks measured on two versions of a
/// file tree and a document stream), with CDC and similarity rows added in the same shape.
fn fixture() -> Report {
    let mut r: Report =
        serde_json::from_str(include_str!("fixtures/report.json")).expect("fixture parses");
    r.recommendation = recommend::recommend(r.input_bytes, &r.methods, 20e6);
    r
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

fn method(
    name: &str,
    family: &str,
    scope: &str,
    params: serde_json::Value,
    ratio: f64,
    cpu_s_per_gb: f64,
) -> MethodReport {
    MethodReport {
        name: name.into(),
        family: family.into(),
        scope: scope.into(),
        params,
        output_bytes: if ratio.is_finite() && ratio > 0.0 {
            (1e6 / ratio) as u64
        } else {
            0
        },
        ratio,
        index_bytes: 0,
        mb_per_s: 1000.0 / cpu_s_per_gb,
        cpu_s_per_gb,
        rel_error: 0.0,
    }
}

fn empty_recommendation() -> Recommendation {
    Recommendation {
        link_bits_per_s: 100e6,
        method: "plain (no dedup, no compression)".into(),
        seconds: 0.0,
        plain_seconds: 0.0,
        best_compression: None,
        best_dedup: None,
        dedup_beats_compression_below_bits_per_s: None,
        dedup_beats_plain_below_bits_per_s: None,
    }
}

fn empty_report() -> Report {
    Report {
        input_bytes: 0,
        items: 0,
        images: vec![],
        methods: vec![],
        recommendation: empty_recommendation(),
        notes: vec![],
        warnings: vec![],
        elapsed_s: 0.0,
        cpu_s: 0.0,
        cores: 0,
        machine_busy: None,
        waited_on_input_s: 0.0,
        waited_on_methods_s: 0.0,
    }
}

/// With `DEDUPWIRE_KEEP_HTML=DIR`, keeps a rendered page there to look at.
fn keep(name: &str, h: &str) {
    if let Some(dir) = std::env::var_os("DEDUPWIRE_KEEP_HTML") {
        let dir = PathBuf::from(dir);
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join(name), h);
    }
}

/// The checks every rendered report must pass, degenerate or not.
fn assert_well_formed(h: &str) {
    assert!(h.starts_with("<!DOCTYPE html>"), "doctype");
    assert!(h.trim_end().ends_with("</html>"), "closes");
    assert_eq!(count(h, "<svg"), 3, "three charts");
    assert_eq!(count(h, "</svg>"), 3, "three charts closed");
    for id in [
        "chart-chunk-size",
        "chart-local-global",
        "chart-cost-saving",
    ] {
        assert!(h.contains(&format!("id=\"{id}\"")), "{id}");
    }
    assert!(
        !h.contains("chart could not be drawn"),
        "a chart failed to draw"
    );
    // Self-contained: nothing is fetched. The only URL is the SVG namespace.
    for bad in ["<script", "<link", "<img", "src=", "url(", "@import"] {
        assert!(!h.contains(bad), "{bad} in a self-contained report");
    }
    assert_eq!(
        count(h, "http"),
        count(h, "http://www.w3.org/2000/svg"),
        "no URL but the SVG namespace"
    );
    let longest_number = h
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(
        longest_number <= 20,
        "a number {longest_number} digits long"
    );
    for raw in ["NaN", ">inf", " inf", "-inf"] {
        assert!(!h.contains(raw), "raw non-finite number {raw:?}");
    }
}

#[test]
fn realistic_report_has_charts_recommendation_and_escaped_paths() {
    let r = fixture();
    let h = html::render(&r);
    assert_well_formed(&h);

    // Header.
    assert!(h.contains("20.0 MiB"), "input size");
    assert!(h.contains(">3080<"), "items");
    // Paths are escaped, never raw.
    assert!(
        h.contains("backups/v2 &lt;new&gt; &amp; &quot;old&quot;"),
        "escaped path"
    );
    assert!(h.contains("docs/it&#39;s.jsonl"), "escaped quote");
    // What set the pace, with the numbers behind it.
    assert!(
        h.contains("<div class=\"k\">Pace</div><div class=\"v\">CPU-bound</div>"),
        "pace card"
    );
    assert!(h.contains("93% of 2 cores busy, 54.2 CPU-s"), "pace detail");
    assert!(
        !h.contains("<new>") && !h.contains("& \"old\""),
        "raw path leaked"
    );

    // Recommendation, formatted with human_link.
    let rec = &r.recommendation;
    assert!(h.contains("20.0 Mbit/s"), "link speed");
    assert!(
        h.contains(&format!("<b class=\"method\">{}</b>", rec.method)),
        "recommended method"
    );
    let (comp, _) = rec
        .best_compression
        .as_ref()
        .expect("fixture has compression");
    assert!(h.contains(&format!("Best compression only: <b>{comp}</b>")));
    let dedup = rec.best_dedup.as_deref().expect("fixture has dedup");
    assert_eq!(dedup, "similarity+zstd");
    assert!(h.contains("Break-even"));
    if let Some(l) = rec.dedup_beats_compression_below_bits_per_s {
        assert!(h.contains(&recommend::human_link(l)));
    }

    // Chart 1: a line label per chunked family, reference lines, size ticks.
    let chart1 = section(&h, "chart-chunk-size");
    for fam in [
        "exact-fixed",
        "exact-cdc",
        "exact-fixed+zstd",
        "exact-cdc+zstd",
    ] {
        assert!(
            chart1.contains(&format!(">\n{fam}\n<")) || chart1.contains(&format!(">{fam}<")),
            "label {fam}"
        );
    }
    for reference in [
        "zstd-3 ",
        "lz4 ",
        "exact-whole ",
        "similarity ",
        "similarity+zstd ",
    ] {
        assert!(chart1.contains(reference), "reference {reference}");
    }
    assert!(
        chart1.contains("stroke-dasharray")
            || count(chart1, "<line") + count(chart1, "<polyline") > 20
    );
    for tick in ["256 B", "1 KiB", "4 KiB", "128 KiB"] {
        assert!(chart1.contains(tick), "tick {tick}");
    }
    // Chart 2: local and global bars for compression, CDC+zstd and similarity+zstd.
    let chart2 = section(&h, "chart-local-global");
    for name in [
        "zstd-3",
        "exact-cdc-4KiB+zstd",
        "exact-cdc-128KiB+zstd",
        "similarity+zstd",
        "local (each image alone)",
    ] {
        assert!(chart2.contains(name), "bar {name}");
    }
    assert!(count(chart2, "<rect") > 20, "bars");
    // Chart 3: points for every global method and a legend.
    let chart3 = section(&h, "chart-cost-saving");
    let globals = r.methods.iter().filter(|m| m.scope == "global").count();
    assert!(count(chart3, "<circle") >= 2 * globals, "points");
    assert!(chart3.contains("CPU seconds per GB"));

    // Table: every method in both scopes, sampled ones with their error.
    assert_eq!(
        count(&h, "<tr") - count(&h, "<tr><th"),
        r.methods.len() + r.images.len()
    );
    assert!(h.contains("±1.2%"));
    assert!(h.contains("class=\"rec\""), "recommended row is marked");
    // Notes.
    for n in &r.notes {
        assert!(h.contains(&n.replace('\'', "&#39;")), "note {n}");
    }
}

/// The text of the `<figure id=...>` element.
fn section<'a>(h: &'a str, id: &str) -> &'a str {
    let start = h.find(&format!("<figure id=\"{id}\"")).expect("figure");
    let end = start + h[start..].find("</figure>").expect("figure closes");
    &h[start..end]
}

#[test]
fn empty_report_renders() {
    let h = html::render(&empty_report());
    keep("empty.html", &h);
    assert_well_formed(&h);
    assert!(h.contains("no images"));
    assert!(h.contains("no methods were measured"));
    assert!(h.contains("no global-scope methods"));
    assert!(!h.contains("Warning:"), "a warning box without warnings");
}

#[test]
fn warnings_are_shown_escaped() {
    let mut r = empty_report();
    r.warnings = vec!["a <file> changed while it was read".into()];
    let h = html::render(&r);
    assert_well_formed(&h);
    assert!(h.contains("Warning: a &lt;file&gt; changed while it was read"));
}

#[test]
fn single_image_and_compression_only() {
    let mut r = empty_report();
    r.input_bytes = 1_000_000;
    r.items = 1;
    r.images = vec![ImageStats {
        path: "<script>alert(1)</script>".into(),
        kind: "files".into(),
        files: 1,
        input_bytes: 1_000_000,
        items: 1,
    }];
    let p = serde_json::json!({ "compression": "zstd-3" });
    r.methods = vec![
        method("zstd-3", "compress", "local", p.clone(), 2.0, 5.0),
        method("zstd-3", "compress", "global", p, 2.0, 5.0),
    ];
    r.recommendation = recommend::recommend(r.input_bytes, &r.methods, 100e6);
    let h = html::render(&r);
    keep("compress-only.html", &h);
    assert_well_formed(&h);
    assert!(h.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(h.contains("no fixed-size or CDC methods were measured"));
    assert!(h.contains("No dedup method was measured."));
}

#[test]
fn non_finite_and_zero_values_do_not_panic() {
    let mut r = empty_report();
    r.input_bytes = 0;
    r.images = vec![
        ImageStats {
            path: "a".into(),
            kind: "files".into(),
            files: 0,
            input_bytes: 0,
            items: 0,
        },
        ImageStats {
            path: "b & c".into(),
            kind: "documents".into(),
            files: 1,
            input_bytes: 0,
            items: 0,
        },
    ];
    let fixed = |s: u64| serde_json::json!({ "chunker": { "kind": "fixed", "size": s } });
    let cdc = |s: u64| serde_json::json!({ "chunker": { "kind": "cdc", "min": s / 4, "avg": s, "max": s * 4 } });
    for scope in ["local", "global"] {
        r.methods.extend([
            method(
                "zstd-3",
                "compress",
                scope,
                serde_json::json!({}),
                f64::NAN,
                0.0,
            ),
            method(
                "lz4",
                "compress",
                scope,
                serde_json::json!(null),
                f64::INFINITY,
                f64::INFINITY,
            ),
            method(
                "exact-fixed-4KiB",
                "exact-fixed",
                scope,
                fixed(4096),
                f64::INFINITY,
                1.0,
            ),
            method(
                "exact-fixed-1MiB",
                "exact-fixed",
                scope,
                fixed(1 << 20),
                0.0,
                2.0,
            ),
            method("exact-cdc-64B", "exact-cdc", scope, cdc(64), 1e300, 1e-300),
            method("exact-cdc-0B", "exact-cdc", scope, cdc(0), 1.5, f64::NAN),
            method(
                "exact-whole",
                "exact-whole",
                scope,
                serde_json::json!({"chunker": {"kind": "whole"}}),
                f64::NEG_INFINITY,
                -1.0,
            ),
            method(
                "similarity+zstd",
                "similarity+zstd",
                scope,
                serde_json::json!("odd params"),
                3.0,
                40.0,
            ),
        ]);
    }
    r.methods[0].rel_error = f64::NAN;
    r.elapsed_s = f64::NAN;
    r.recommendation.seconds = f64::INFINITY;
    r.recommendation.plain_seconds = f64::NAN;
    r.recommendation.link_bits_per_s = f64::NAN;
    r.recommendation.best_compression = Some(("zstd-3".into(), f64::NAN));
    r.recommendation.best_dedup = Some("similarity+zstd".into());
    r.recommendation.dedup_beats_compression_below_bits_per_s = Some(f64::INFINITY);
    let h = html::render(&r);
    keep("non-finite.html", &h);
    assert_well_formed(&h);
    assert!(h.contains("n/a"));
    assert!(h.contains("∞"));
    assert!(h.contains("b &amp; c"));
}

#[test]
fn only_local_scope_and_many_images() {
    let mut r = fixture();
    r.methods.retain(|m| m.scope == "local");
    r.images = (0..40)
        .map(|i| ImageStats {
            path: format!("/data/image-{i}"),
            kind: "files".into(),
            files: i,
            input_bytes: i * 1000,
            items: i,
        })
        .collect();
    let h = html::render(&r);
    keep("local-only.html", &h);
    assert_well_formed(&h);
    assert!(h.contains("/data/image-39"));
}

#[test]
fn similarity_with_smaller_window_estimates_gets_a_window_table() {
    let mut r = fixture();
    assert!(
        !html::render(&r).contains("id=\"windows\""),
        "no estimates, no table"
    );
    r.input_bytes = 1 << 30;
    let params = |at_most: [u64; 2]| {
        serde_json::json!({
            "window_bytes": 1u64 << 30,
            "smaller_windows": [
                { "window_bytes": 1u64 << 29, "output_bytes_at_most": at_most[0] },
                { "window_bytes": 1u64 << 28, "output_bytes_at_most": at_most[1] },
            ],
        })
    };
    r.methods.retain(|m| m.name != "similarity");
    for (scope, at_most, ratio) in [
        ("local", [1 << 30, 1 << 30], 1.0),
        ("global", [1 << 29, 1 << 30], 2.5),
    ] {
        let line = method(
            "similarity",
            "similarity",
            scope,
            params(at_most),
            ratio,
            2.0,
        );
        r.methods.push(line);
    }
    let h = html::render(&r);
    keep("windows.html", &h);
    assert_well_formed(&h);
    let start = h.find("id=\"windows\"").expect("the window table");
    let table = &h[start..start + h[start..].find("</table>").unwrap()];
    assert!(table.contains("<th class=\"num\">local ratio</th><th class=\"num\">global ratio</th>"));
    assert!(
        table.contains(
            "<td>1.0 GiB (measured)</td><td class=\"num\">1.00×</td><td class=\"num\">2.50×</td>"
        ),
        "{table}"
    );
    assert!(
        table.contains(
            "<td>512.0 MiB</td><td class=\"num\">≥ 1.00×</td><td class=\"num\">≥ 2.00×</td>"
        ),
        "{table}"
    );
    assert!(
        table.contains(
            "<td>256.0 MiB</td><td class=\"num\">≥ 1.00×</td><td class=\"num\">≥ 1.00×</td>"
        ),
        "{table}"
    );
}

// ---------------------------------------------------------------- headless Chromium

fn find_chromium() -> Option<PathBuf> {
    let names = [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ];
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for n in names {
            let p = dir.join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let p = std::env::temp_dir().join(format!(
            "dedupwire-html-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `cmd`, killing it after `limit`; returns (finished in time, stdout, stderr).
fn run_with_timeout(cmd: &mut Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let start = Instant::now();
    let finished = loop {
        match child.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    (
        finished,
        t_out.join().unwrap_or_default(),
        t_err.join().unwrap_or_default(),
    )
}

fn chromium_cmd(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// PNG width and height from the IHDR chunk.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" || &png[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(png[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(png[20..24].try_into().ok()?);
    Some((w, h))
}

#[test]
fn renders_in_headless_chromium() {
    let Some(bin) = find_chromium() else {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
        if ci {
            panic!("chromium is not installed: install it (apt-get install -y chromium) so the HTML report can be rendered");
        }
        eprintln!(
            "SKIP renders_in_headless_chromium: chromium not found (apt-get install -y chromium)"
        );
        return;
    };
    let dir = TempDir::new("page");
    let page = dir.0.join("report.html");
    let r = fixture();
    std::fs::write(&page, html::render(&r)).expect("write page");
    let url = format!("file://{}", page.display());
    let limit = Duration::from_secs(60);

    // Screenshot.
    let shot = dir.0.join("shot.png");
    let profile = TempDir::new("profile");
    let (finished, _, stderr) = run_with_timeout(
        chromium_cmd(&bin, &profile.0)
            .arg(format!("--screenshot={}", shot.display()))
            .arg("--window-size=1200,3000")
            .arg(&url),
        limit,
    );
    let png = std::fs::read(&shot).unwrap_or_default();
    assert!(
        !png.is_empty(),
        "no screenshot (chromium {}): {stderr}",
        if finished {
            "exited"
        } else {
            "was killed after 60 s"
        }
    );
    assert_eq!(
        png_size(&png),
        Some((1200, 3000)),
        "screenshot is a 1200x3000 PNG"
    );
    // A blank white page of this size compresses to a few KiB; text, tables and charts do not.
    assert!(
        png.len() > 60 * 1024,
        "screenshot looks blank: {} bytes",
        png.len()
    );
    if let Some(keep) = std::env::var_os("DEDUPWIRE_KEEP_HTML") {
        let keep = PathBuf::from(keep);
        let _ = std::fs::create_dir_all(&keep);
        let _ = std::fs::copy(&page, keep.join("report.html"));
        let _ = std::fs::copy(&shot, keep.join("shot.png"));
    }

    // The DOM after load still has the three charts and the recommendation.
    let profile = TempDir::new("profile");
    let (finished, dom, stderr) = run_with_timeout(
        chromium_cmd(&bin, &profile.0).arg("--dump-dom").arg(&url),
        limit,
    );
    assert!(
        finished || !dom.is_empty(),
        "chromium --dump-dom was killed after 60 s: {stderr}"
    );
    assert_eq!(
        count(&dom, "<svg"),
        3,
        "three svg elements in the DOM: {stderr}"
    );
    assert!(
        dom.contains(&r.recommendation.method),
        "recommendation in the DOM"
    );
    assert!(
        dom.contains("backups/v2 &lt;new&gt; &amp; \"old\""),
        "path in the DOM as text"
    );
}
