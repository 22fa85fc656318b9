//! The report as one self-contained HTML file: inline CSS, charts as inline SVG drawn with plotters.
//!
//! Nothing is loaded from elsewhere (no scripts, fonts, style sheets or images), so the file can
//! be mailed or attached to a ticket. Every text taken from the report is escaped; charts skip
//! values that are not finite and say so when a family has nothing to show.

use std::error::Error;
use std::fmt::Write as _;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::recommend::human_link;
use crate::report::{human_bytes, smaller_window_ratios, MethodReport, Report};

const FONT: &str = "sans-serif";
const CHART_W: u32 = 1040;
const GRID: RGBColor = RGBColor(232, 232, 232);
const AXIS_TEXT: RGBColor = RGBColor(60, 60, 60);
const LOCAL_COLOR: RGBColor = RGBColor(170, 170, 170);
const GLOBAL_COLOR: RGBColor = RGBColor(31, 119, 180);

const CSS: &str = "
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'Helvetica Neue',Arial,sans-serif;margin:0;background:#f6f7f9;color:#1d2330;line-height:1.45}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px}
h1{font-size:1.7em;margin:0 0 4px}
h2{font-size:1.25em;margin:32px 0 10px;border-bottom:1px solid #d8dce3;padding-bottom:4px}
.sub{color:#5b6475;margin:0 0 18px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0 18px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:10px 16px;min-width:150px}
.card .k{font-size:.8em;color:#5b6475;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:1.35em;font-weight:600}
table{border-collapse:collapse;background:#fff;border:1px solid #dde1e8;font-size:.9em;width:100%}
th,td{padding:5px 10px;border-bottom:1px solid #eceef2;text-align:left;white-space:nowrap}
th{background:#eef1f5;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.path{white-space:normal;word-break:break-all}
tr.rec td{background:#eaf5ea;font-weight:600}
.rec-box{background:#fff;border:1px solid #dde1e8;border-left:6px solid #2ca02c;border-radius:8px;padding:14px 18px}
.rec-box .main{font-size:1.15em;margin:0 0 8px}
.rec-box ul{margin:6px 0 0;padding-left:20px}
figure{margin:0 0 8px;background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:10px}
figure svg{display:block;max-width:100%;height:auto;margin:0 auto}
figcaption{color:#5b6475;font-size:.9em;margin:6px 4px 0}
code{background:#eef1f5;padding:1px 4px;border-radius:3px}
.notes li{margin:3px 0}
.warning{background:#fff4e5;border:1px solid #f0b429;border-radius:8px;padding:10px 16px}
";

/// Renders the report as one HTML file.
pub fn render(r: &Report) -> String {
    let mut h = String::with_capacity(64 * 1024);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    h.push_str("<title>dedupwire analyze report</title>\n<style>");
    h.push_str(CSS);
    h.push_str("</style>\n</head>\n<body>\n<main>\n");
    header(&mut h, r);
    for w in &r.warnings {
        let _ = writeln!(h, "<p class=\"warning\">Warning: {}</p>", esc(w));
    }
    recommendation(&mut h, r);

    h.push_str("<h2 id=\"chunk-size\">Reduction ratio vs chunk size</h2>\n");
    figure(
        &mut h,
        "chart-chunk-size",
        "Reduction ratio vs chunk size per family",
        &chart_or_note(ratio_vs_chunk_size(r)),
        "Global scope (all images pooled). Lines: exact dedup per chunker family at each chunk size \
         (the average size for CDC). Dashed: methods without a chunk size, for reference.",
    );
    h.push_str("<h2 id=\"local-global\">Local vs global</h2>\n");
    figure(
        &mut h,
        "chart-local-global",
        "Reduction ratio per method, local vs global scope",
        &chart_or_note(local_vs_global(r)),
        "Local: each image deduplicated alone. Global: all images pooled, so data shared between \
         images is sent or stored once.",
    );
    h.push_str("<h2 id=\"cost-saving\">Cost vs saving</h2>\n");
    figure(
        &mut h,
        "chart-cost-saving",
        "CPU cost vs reduction ratio per method",
        &chart_or_note(cost_vs_saving(r)),
        "Global scope. CPU seconds of one core per GB of input (log scale) against the reduction \
         ratio. Labelled where room allows: methods no other beats on both axes, the recommended \
         one, compression alone, and the best of each family.",
    );

    methods_table(&mut h, r);
    smaller_windows_table(&mut h, r);
    if !r.notes.is_empty() {
        h.push_str("<h2 id=\"notes\">Notes</h2>\n<ul class=\"notes\">\n");
        for n in &r.notes {
            let _ = writeln!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("</main>\n</body>\n</html>\n");
    h
}

/// Escapes text for HTML element content and quoted attribute values.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn fmt_ratio(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e4 {
        format!("{v:.1e}×")
    } else if v.is_nan() {
        "n/a".into()
    } else if v.is_infinite() {
        if v > 0.0 { "∞" } else { "-∞" }.into()
    } else if v >= 100.0 {
        format!("{v:.0}×")
    } else {
        format!("{v:.2}×")
    }
}

fn fmt_secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "n/a".into();
    }
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        let t = s.round() as u64;
        format!("{} min {:02} s", t / 60, t % 60)
    } else if s < 3.6e9 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1e} h", s / 3600.0)
    }
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if v != 0.0 && (v.abs() >= 1e7 || v.abs() < 1e-3) {
        format!("{v:.2e}")
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn fmt_link(bits: f64) -> String {
    if bits.is_finite() && bits > 0.0 {
        human_link(bits)
    } else {
        "n/a".into()
    }
}

/// A ratio axis label: `2.5×`, or `1e6×` for absurd ratios.
fn axis_ratio(v: f64) -> String {
    if v.abs() >= 1e4 {
        format!("{v:.0e}×")
    } else {
        format!("{v:.1}×")
    }
}

/// Largest ratio drawn; beyond it points sit at the top edge (the table has the number).
const RATIO_CAP: f64 = 1e9;

/// A ratio as drawn: within `0..=RATIO_CAP`.
fn plot_ratio(v: f64) -> f64 {
    v.clamp(0.0, RATIO_CAP)
}

/// An axis tick: `20`, `1.5`, `0.02`.
fn fmt_tick(v: f64) -> String {
    if v >= 1e6 || (v > 0.0 && v < 1e-3) {
        format!("{v:.0e}")
    } else if v >= 1.0 && (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// Chunk-size label like `256 B`, `4 KiB`, `1 MiB`.
fn size_label(bytes: f64) -> String {
    let b = bytes.round();
    if b >= 1048576.0 && b % 1048576.0 == 0.0 {
        format!("{} MiB", b / 1048576.0)
    } else if b >= 1024.0 && b % 1024.0 == 0.0 {
        format!("{} KiB", b / 1024.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn header(h: &mut String, r: &Report) {
    h.push_str("<h1>dedupwire analyze</h1>\n");
    h.push_str(
        "<p class=\"sub\">How much each dedup method would save on this data, and what it costs.</p>\n",
    );
    h.push_str("<div class=\"cards\">\n");
    let card = |h: &mut String, k: &str, v: &str, title: &str| {
        let _ = writeln!(
            h,
            "<div class=\"card\" title=\"{}\"><div class=\"k\">{}</div><div class=\"v\">{}</div></div>",
            esc(title),
            esc(k),
            esc(v)
        );
    };
    card(
        h,
        "Input",
        &human_bytes(r.input_bytes),
        &format!("{} bytes", r.input_bytes),
    );
    card(
        h,
        "Items",
        &r.items.to_string(),
        "files, or document writes",
    );
    card(
        h,
        "Images",
        &r.images.len().to_string(),
        "inputs given on the command line",
    );
    card(
        h,
        "Analysis time",
        &fmt_secs(r.elapsed_s),
        "wall time of the analysis",
    );
    if let (Some(pace), Some(text)) = (r.pace(), r.pace_text()) {
        card(h, "Pace", pace.label(), &text);
    }
    h.push_str("</div>\n");
    h.push_str("<table class=\"images\">\n<thead><tr><th>Image</th><th>Kind</th><th class=\"num\">Files</th><th class=\"num\">Bytes</th><th class=\"num\">Items</th></tr></thead>\n<tbody>\n");
    if r.images.is_empty() {
        h.push_str("<tr><td colspan=\"5\">no images</td></tr>\n");
    }
    for i in &r.images {
        let _ = writeln!(
            h,
            "<tr><td class=\"path\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\" title=\"{} bytes\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&i.path),
            esc(&i.kind),
            i.files,
            i.input_bytes,
            esc(&human_bytes(i.input_bytes)),
            i.items
        );
    }
    h.push_str("</tbody>\n</table>\n");
}

fn recommendation(h: &mut String, r: &Report) {
    let rec = &r.recommendation;
    h.push_str("<h2 id=\"recommendation\">Recommendation</h2>\n<div class=\"rec-box\">\n");
    let speedup = if rec.seconds > 0.0 && rec.plain_seconds.is_finite() {
        rec.plain_seconds / rec.seconds
    } else {
        f64::NAN
    };
    let faster = if speedup.is_finite() && speedup > 1.005 {
        format!(", {speedup:.1}× faster")
    } else {
        String::new()
    };
    let _ = writeln!(
        h,
        "<p class=\"main\">For a <b>{}</b> link, use <b class=\"method\">{}</b>: about {} to move the input, vs {} sending it plain{}.</p>",
        esc(&fmt_link(rec.link_bits_per_s)),
        esc(&rec.method),
        esc(&fmt_secs(rec.seconds)),
        esc(&fmt_secs(rec.plain_seconds)),
        esc(&faster)
    );
    h.push_str("<ul>\n");
    match &rec.best_compression {
        Some((m, t)) => {
            let _ = writeln!(
                h,
                "<li>Best compression only: <b>{}</b> ({}).</li>",
                esc(m),
                esc(&fmt_secs(*t))
            );
        }
        None => h.push_str("<li>No compression-only method was measured.</li>\n"),
    }
    match &rec.best_dedup {
        Some(d) => {
            let _ = writeln!(
                h,
                "<li>Dedup method with the highest ratio: <b>{}</b>.</li>",
                esc(d)
            );
            match rec.dedup_beats_compression_below_bits_per_s {
                Some(l) => {
                    let _ = writeln!(
                        h,
                        "<li>Break-even: {} saves time over compression alone on links below <b>{}</b>.</li>",
                        esc(d),
                        esc(&fmt_link(l))
                    );
                }
                None => {
                    let _ = writeln!(
                        h,
                        "<li>Break-even: {} never beats compression alone on this data.</li>",
                        esc(d)
                    );
                }
            }
            match rec.dedup_beats_plain_below_bits_per_s {
                Some(l) => {
                    let _ = writeln!(
                        h,
                        "<li>It saves time over sending plain bytes on links below <b>{}</b>.</li>",
                        esc(&fmt_link(l))
                    );
                }
                None => h.push_str("<li>It never beats sending plain bytes on this data.</li>\n"),
            }
        }
        None => h.push_str("<li>No dedup method was measured.</li>\n"),
    }
    h.push_str("</ul>\n<p class=\"sub\" style=\"margin:8px 0 0\">Time is max(CPU time, transfer time): compute and transfer overlap in a pipelined sender.</p>\n</div>\n");
}

fn figure(h: &mut String, id: &str, title: &str, svg: &str, caption: &str) {
    let svg = svg.replacen(
        "<svg ",
        &format!("<svg role=\"img\" aria-label=\"{}\" ", esc(title)),
        1,
    );
    let _ = writeln!(
        h,
        "<figure id=\"{id}\">\n{svg}\n<figcaption>{}</figcaption>\n</figure>",
        esc(caption)
    );
}

/// Keeps the SVG, or shows why the chart could not be drawn (still as an SVG, so the layout holds).
fn chart_or_note(res: Result<String, Box<dyn Error>>) -> String {
    match res {
        Ok(s) => s,
        Err(e) => format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{CHART_W}\" height=\"60\" viewBox=\"0 0 {CHART_W} 60\"><text x=\"20\" y=\"35\" font-family=\"{FONT}\" font-size=\"14\">chart could not be drawn: {}</text></svg>",
            esc(&e.to_string())
        ),
    }
}

fn methods_table(h: &mut String, r: &Report) {
    h.push_str("<h2 id=\"methods\">All methods</h2>\n<table class=\"methods\">\n<thead><tr><th>Method</th><th>Family</th><th>Scope</th><th class=\"num\">Output</th><th class=\"num\">Ratio</th><th class=\"num\">Index memory</th><th class=\"num\">MB/s</th><th class=\"num\">CPU s/GB</th></tr></thead>\n<tbody>\n");
    if r.methods.is_empty() {
        h.push_str("<tr><td colspan=\"8\">no methods were measured</td></tr>\n");
    }
    let ordered = r
        .methods
        .iter()
        .filter(|m| m.scope == "global")
        .chain(r.methods.iter().filter(|m| m.scope != "global"));
    for m in ordered {
        let rec = m.scope == "global" && m.name == r.recommendation.method;
        let err = match m.error_label() {
            e if e.is_empty() => e,
            e => format!(" {}", esc(&e)),
        };
        let _ = writeln!(
            h,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td class=\"num\" title=\"{} bytes\">{}</td><td class=\"num\">{}{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            if rec { " class=\"rec\"" } else { "" },
            esc(&m.name),
            esc(&m.family),
            esc(&m.scope),
            m.output_bytes,
            esc(&human_bytes(m.output_bytes)),
            esc(&fmt_ratio(m.ratio)),
            esc(&err),
            esc(&human_bytes(m.index_bytes)),
            esc(&fmt_num(m.mb_per_s)),
            esc(&fmt_num(m.cpu_s_per_gb)),
        );
    }
    h.push_str("</tbody>\n</table>\n");
}

/// The similarity lines' ratio at their window and, estimated, at smaller ones (a lower bound,
/// about: see `dedupwire_engine::pipeline::SmallerWindows`); nothing without those estimates.
fn smaller_windows_table(h: &mut String, r: &Report) {
    let lines: Vec<(&MethodReport, Vec<(u64, f64)>)> = ["local", "global"]
        .iter()
        .filter_map(|scope| {
            r.methods
                .iter()
                .find(|m| m.name == "similarity" && m.scope == *scope)
        })
        .map(|m| (m, smaller_window_ratios(m, r.input_bytes)))
        .filter(|(_, rows)| !rows.is_empty())
        .collect();
    let Some(window) = lines
        .first()
        .and_then(|(m, _)| m.params.get("window_bytes")?.as_u64())
    else {
        return;
    };
    h.push_str("<h2 id=\"windows\">Similarity window</h2>\n<p>The receiver keeps this much recent data as delta sources. Smaller windows are estimated from the same run: at least about these ratios.</p>\n<table class=\"methods\">\n<thead><tr><th>Window</th>");
    for (m, _) in &lines {
        let _ = write!(h, "<th class=\"num\">{} ratio</th>", esc(&m.scope));
    }
    h.push_str("</tr></thead>\n<tbody>\n");
    let _ = write!(h, "<tr><td>{} (measured)</td>", esc(&human_bytes(window)));
    for (m, _) in &lines {
        let _ = write!(h, "<td class=\"num\">{}</td>", esc(&fmt_ratio(m.ratio)));
    }
    h.push_str("</tr>\n");
    for &(w, _) in &lines[0].1 {
        let _ = write!(h, "<tr><td>{}</td>", esc(&human_bytes(w)));
        for (_, rows) in &lines {
            let cell = rows
                .iter()
                .find(|&&(rw, _)| rw == w)
                .map_or("–".to_string(), |&(_, v)| format!("≥ {}", fmt_ratio(v)));
            let _ = write!(h, "<td class=\"num\">{}</td>", esc(&cell));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody>\n</table>\n");
}

// ---------------------------------------------------------------- charts

/// A colour per family, the same in every chart; `+compression` variants are the darker shade.
fn family_color(family: &str) -> RGBColor {
    let on_top = family.contains('+');
    let base = family.split('+').next().unwrap_or("");
    match (base, on_top) {
        ("compress", _) => RGBColor(44, 160, 44),
        ("exact-whole", false) => RGBColor(188, 128, 189),
        ("exact-whole", true) => RGBColor(106, 61, 154),
        ("exact-fixed", false) => RGBColor(107, 174, 214),
        ("exact-fixed", true) => RGBColor(8, 81, 156),
        ("exact-cdc", false) => RGBColor(253, 141, 60),
        ("exact-cdc", true) => RGBColor(166, 54, 3),
        ("similarity", false) => RGBColor(240, 120, 170),
        ("similarity", true) => RGBColor(190, 20, 100),
        _ => RGBColor(120, 120, 120),
    }
}

/// Colours for the reference lines of compression-only methods, so two of them can be told apart.
const COMPRESS_SHADES: [RGBColor; 4] = [
    RGBColor(44, 160, 44),
    RGBColor(120, 120, 120),
    RGBColor(0, 110, 80),
    RGBColor(150, 150, 60),
];

/// The chunk size a method's parameters name: `size` for fixed chunks, `avg` for CDC.
fn chunk_size(m: &MethodReport) -> Option<f64> {
    let c = m.params.get("chunker")?;
    let size = match c.get("kind")?.as_str()? {
        "fixed" => c.get("size")?.as_f64()?,
        "cdc" => c.get("avg")?.as_f64()?,
        _ => return None,
    };
    (size.is_finite() && size > 0.0).then_some(size)
}

fn global(r: &Report) -> impl Iterator<Item = &MethodReport> {
    r.methods.iter().filter(|m| m.scope == "global")
}

/// Families in first-seen order.
fn families<'a>(ms: impl Iterator<Item = &'a MethodReport>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for m in ms {
        if !out.contains(&m.family.as_str()) {
            out.push(&m.family);
        }
    }
    out
}

/// Upper end of a ratio axis that shows every finite value and leaves some headroom.
fn ratio_axis_max(values: impl Iterator<Item = f64>, headroom: f64) -> f64 {
    let max = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(1.0f64, f64::max);
    (max.min(RATIO_CAP) * headroom).max(1.1)
}

fn text_style(px: u32, color: &RGBColor) -> TextStyle<'static> {
    // The SVG backend writes font-size = size / 1.24; `px` is the size wanted on the page.
    (FONT, f64::from(px) * 1.24).into_font().color(color)
}

/// Moves label centres (pixels, sorted by the caller's wish) apart by `gap`, within `lo..=hi`.
fn spread(ys: &mut [f64], gap: f64, lo: f64, hi: f64) {
    let n = ys.len();
    if n == 0 {
        return;
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| ys[a].total_cmp(&ys[b]));
    let mut sorted: Vec<f64> = order.iter().map(|&i| ys[i]).collect();
    for i in 0..n {
        let min = if i == 0 { lo } else { sorted[i - 1] + gap };
        if sorted[i] < min {
            sorted[i] = min;
        }
    }
    for i in (0..n).rev() {
        let max = if i + 1 == n { hi } else { sorted[i + 1] - gap };
        if sorted[i] > max {
            sorted[i] = max;
        }
    }
    for (k, &i) in order.iter().enumerate() {
        ys[i] = sorted[k];
    }
}

/// A line per chunker family: reduction ratio against chunk size (log2 axis), with the methods
/// that have no chunk size as dashed reference lines, all labelled at the right edge.
fn ratio_vs_chunk_size(r: &Report) -> Result<String, Box<dyn Error>> {
    struct Line {
        label: String,
        color: RGBColor,
        points: Vec<(f64, f64)>,
    }
    let g: Vec<&MethodReport> = global(r).collect();
    let mut lines: Vec<Line> = Vec::new();
    let chunked: Vec<&MethodReport> = g
        .iter()
        .copied()
        .filter(|m| chunk_size(m).is_some())
        .collect();
    for fam in families(chunked.iter().copied()) {
        let mut points: Vec<(f64, f64)> = chunked
            .iter()
            .filter(|m| m.family == fam && m.ratio.is_finite())
            .filter_map(|m| Some((chunk_size(m)?.log2(), plot_ratio(m.ratio))))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !points.is_empty() {
            lines.push(Line {
                label: fam.to_string(),
                color: family_color(fam),
                points,
            });
        }
    }
    // Reference lines; compression-only ones last, so they are drawn on top where ratios tie.
    let mut refs: Vec<Line> = Vec::new();
    let mut compress_refs: Vec<Line> = Vec::new();
    for m in &g {
        let compress = m.family == "compress";
        let is_ref =
            compress || m.family.starts_with("similarity") || m.family.starts_with("exact-whole");
        if !is_ref || !m.ratio.is_finite() || chunk_size(m).is_some() {
            continue;
        }
        let line = Line {
            label: m.name.clone(),
            color: if compress {
                COMPRESS_SHADES[compress_refs.len() % COMPRESS_SHADES.len()]
            } else {
                family_color(&m.family)
            },
            points: vec![(m.ratio, plot_ratio(m.ratio))],
        };
        if compress {
            compress_refs.push(line);
        } else {
            refs.push(line);
        }
    }
    refs.extend(compress_refs);

    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (xmin, xmax) = xs.fold((8.0f64, 17.0f64), |(lo, hi), x| {
        (lo.min(x.floor()), hi.max(x.ceil()))
    });
    let ymax = ratio_axis_max(
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .chain(refs.iter().map(|l| l.points[0].1)),
        1.12,
    );

    let (w, hgt) = (CHART_W, 560u32);
    let label_w = 230;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, hgt)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(20)
            .margin_left(10)
            .margin_bottom(10)
            .margin_right(label_w)
            .x_label_area_size(52)
            .y_label_area_size(72)
            .build_cartesian_2d(xmin..xmax, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_labels(((xmax - xmin) as usize + 1).min(16))
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 {
                    size_label(2f64.powf(v.round()))
                } else {
                    String::new()
                }
            })
            .y_labels(10)
            .y_label_formatter(&|v| axis_ratio(*v))
            .x_desc("chunk size (average for CDC), log scale")
            .y_desc("reduction ratio (input / output)")
            .label_style(text_style(14, &AXIS_TEXT))
            .axis_desc_style(text_style(15, &AXIS_TEXT))
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .draw()?;

        let mut labels: Vec<(f64, f64, String, RGBColor)> = Vec::new();
        for l in &refs {
            let y = l.points[0].1;
            chart.draw_series(DashedLineSeries::new(
                vec![(xmin, y), (xmax, y)],
                8,
                5,
                l.color.stroke_width(2),
            ))?;
            let (px, py) = chart.backend_coord(&(xmax, y));
            labels.push((
                px as f64,
                py as f64,
                format!("{} {}", l.label, fmt_ratio(y)),
                l.color,
            ));
        }
        for l in &lines {
            chart.draw_series(LineSeries::new(
                l.points.iter().copied(),
                l.color.stroke_width(3),
            ))?;
            chart.draw_series(
                l.points
                    .iter()
                    .map(|p| Circle::new(*p, 4, l.color.filled())),
            )?;
            if let Some(last) = l.points.last() {
                let (px, py) = chart.backend_coord(last);
                labels.push((px as f64, py as f64, l.label.clone(), l.color));
            }
        }
        if lines.is_empty() && refs.is_empty() {
            let (cx, cy) = chart.backend_coord(&((xmin + xmax) / 2.0, ymax / 2.0));
            root.draw(&Text::new(
                "no global-scope methods in this report",
                (cx, cy),
                text_style(16, &AXIS_TEXT).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        } else if lines.is_empty() {
            let (cx, cy) = chart.backend_coord(&((xmin + xmax) / 2.0, ymax * 0.06));
            root.draw(&Text::new(
                "no fixed-size or CDC methods were measured",
                (cx, cy),
                text_style(15, &AXIS_TEXT).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        }

        // Labels in the right margin, moved apart where lines end close together.
        let (_, plot_bottom) = chart.backend_coord(&(xmax, 0.0));
        let (plot_right, plot_top) = chart.backend_coord(&(xmax, ymax));
        let mut ys: Vec<f64> = labels.iter().map(|l| l.1).collect();
        spread(
            &mut ys,
            16.0,
            plot_top as f64 - 10.0,
            plot_bottom as f64 + 10.0,
        );
        let lx = plot_right + 34;
        for (l, y) in labels.iter().zip(ys) {
            let y = y.round() as i32;
            root.draw(&PathElement::new(
                vec![(l.0 as i32 + 4, l.1 as i32), (lx - 4, y)],
                l.3.mix(0.6).stroke_width(1),
            ))?;
            root.draw(&Text::new(
                l.2.clone(),
                (lx, y),
                text_style(13, &l.3).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        root.present()?;
    }
    Ok(buf)
}

/// The methods worth comparing side by side, global scope: compression alone, whole-item
/// dedup, CDC at each size and similarity, preferring the variants with compression on top.
fn bar_subset(r: &Report) -> Vec<&MethodReport> {
    let g: Vec<&MethodReport> = global(r).collect();
    let has_cdc = g.iter().any(|m| m.family.starts_with("exact-cdc"));
    let chunked = if has_cdc { "exact-cdc" } else { "exact-fixed" };
    let groups = ["exact-whole", chunked, "similarity"];
    let mut out: Vec<&MethodReport> = g
        .iter()
        .copied()
        .filter(|m| m.family == "compress")
        .collect();
    for grp in groups {
        let members: Vec<&MethodReport> = g
            .iter()
            .copied()
            .filter(|m| m.family == grp || m.family.starts_with(&format!("{grp}+")))
            .collect();
        let with_top = members.iter().any(|m| m.family.contains('+'));
        let mut pick: Vec<&MethodReport> = members
            .into_iter()
            .filter(|m| m.family.contains('+') == with_top)
            .collect();
        pick.sort_by(|a, b| {
            chunk_size(a)
                .unwrap_or(0.0)
                .total_cmp(&chunk_size(b).unwrap_or(0.0))
        });
        out.extend(pick);
    }
    out.truncate(30);
    out
}

/// Horizontal grouped bars: each method's ratio in local and in global scope.
fn local_vs_global(r: &Report) -> Result<String, Box<dyn Error>> {
    let rows: Vec<(&str, Option<f64>, Option<f64>)> = bar_subset(r)
        .into_iter()
        .map(|g| {
            let local = r
                .methods
                .iter()
                .find(|l| l.scope == "local" && l.name == g.name)
                .map(|l| l.ratio)
                .filter(|v| v.is_finite());
            (
                g.name.as_str(),
                local,
                Some(g.ratio).filter(|v| v.is_finite()),
            )
        })
        .collect();
    let n = rows.len();
    let xmax = ratio_axis_max(rows.iter().flat_map(|r| [r.1, r.2]).flatten(), 1.15);
    let row_h = 34u32;
    let hgt = 130 + row_h * n.max(2) as u32;
    let w = CHART_W;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, hgt)).into_drawing_area();
        root.fill(&WHITE)?;
        let ymax = n.max(1) as f64 - 0.5;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(44)
            .margin_left(10)
            .margin_right(30)
            .margin_bottom(10)
            .x_label_area_size(50)
            .y_label_area_size(200)
            .build_cartesian_2d(0f64..xmax, -0.5f64..ymax)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_labels(10)
            .x_label_formatter(&|v| axis_ratio(*v))
            .x_desc("reduction ratio (input / output)")
            .label_style(text_style(14, &AXIS_TEXT))
            .axis_desc_style(text_style(15, &AXIS_TEXT))
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .draw()?;
        let bar = 0.36;
        let (plot_right, _) = chart.backend_coord(&(xmax, 0.0));
        for (i, (name, local, glob)) in rows.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            for (v, color, top) in [(local, LOCAL_COLOR, y + bar), (glob, GLOBAL_COLOR, y)] {
                let Some(v) = *v else { continue };
                let drawn = plot_ratio(v).min(xmax);
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(0.0, top - bar), (drawn, top)],
                    color.filled(),
                )))?;
                // The value after the bar, or inside its end when there is no room after it.
                let (px, py) = chart.backend_coord(&(drawn, top - bar / 2.0));
                let label = fmt_ratio(v);
                let room = plot_right - px > 9 * label.chars().count() as i32;
                let (x, anchor, ink) = if room {
                    (px + 5, HPos::Left, AXIS_TEXT)
                } else {
                    (px - 5, HPos::Right, WHITE)
                };
                root.draw(&Text::new(
                    label,
                    (x, py),
                    text_style(12, &ink).pos(Pos::new(anchor, VPos::Center)),
                ))?;
            }
            let (px, py) = chart.backend_coord(&(0.0, y));
            root.draw(&Text::new(
                name.to_string(),
                (px - 10, py),
                text_style(14, &BLACK).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
        }
        if n == 0 {
            let (cx, cy) = chart.backend_coord(&(xmax / 2.0, 0.0));
            root.draw(&Text::new(
                "no global-scope methods in this report",
                (cx, cy),
                text_style(16, &AXIS_TEXT).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        }
        // Legend in the top margin.
        let (lx, _) = chart.backend_coord(&(0.0, 0.0));
        let mut x = lx;
        for (label, color) in [
            ("local (each image alone)", LOCAL_COLOR),
            ("global (all images pooled)", GLOBAL_COLOR),
        ] {
            root.draw(&Rectangle::new([(x, 14), (x + 16, 28)], color.filled()))?;
            root.draw(&Text::new(
                label,
                (x + 22, 21),
                text_style(14, &BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
            x += 40 + (label.len() as i32) * 8;
        }
        root.present()?;
    }
    Ok(buf)
}

/// Nice tick values for a log axis spanning `lo..hi` (both > 0): 1-2-5 per decade, or every
/// integer mantissa when the span is narrow.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = (lo.log10().floor() as i32)..=(hi.log10().ceil() as i32);
    let pick = |mantissas: &[f64]| -> Vec<f64> {
        decades
            .clone()
            .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo * 0.999 && *v <= hi * 1.001)
            .collect()
    };
    let coarse = pick(&[1.0]);
    if coarse.len() > 10 {
        let step = coarse.len().div_ceil(8);
        return coarse.into_iter().step_by(step).collect();
    }
    if coarse.len() >= 3 {
        return coarse;
    }
    let mid = pick(&[1.0, 2.0, 5.0]);
    if mid.len() >= 4 {
        return mid;
    }
    pick(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
}

/// Scatter of CPU cost against reduction ratio (global scope), log x axis, the Pareto front labelled.
fn cost_vs_saving(r: &Report) -> Result<String, Box<dyn Error>> {
    let pts: Vec<&MethodReport> = global(r)
        .filter(|m| m.ratio.is_finite() && m.cpu_s_per_gb.is_finite() && m.cpu_s_per_gb > 0.0)
        .collect();
    let (cmin, cmax) = pts.iter().fold((f64::MAX, f64::MIN), |(lo, hi), m| {
        (lo.min(m.cpu_s_per_gb), hi.max(m.cpu_s_per_gb))
    });
    let (cmin, cmax) = if pts.is_empty() {
        (1.0, 100.0)
    } else {
        (cmin, cmax)
    };
    // Pad by a factor on both sides; at least a factor 10 overall so ticks are meaningful.
    let mut lo = (cmin / 1.3).log10();
    let mut hi = (cmax * 1.3).log10();
    if hi - lo < 1.0 {
        let mid = (lo + hi) / 2.0;
        lo = mid - 0.5;
        hi = mid + 0.5;
    }
    let ymax = ratio_axis_max(pts.iter().map(|m| m.ratio), 1.15);
    let fams = families(pts.iter().copied());

    let mut by_cost: Vec<&MethodReport> = pts.clone();
    by_cost.sort_by(|a, b| {
        a.cpu_s_per_gb
            .total_cmp(&b.cpu_s_per_gb)
            .then(b.ratio.total_cmp(&a.ratio))
    });
    // Labels in priority order: the Pareto front (no other method both cheaper and with a higher
    // ratio), the recommended method, the best compression-only one, then each family's best.
    let mut labelled: Vec<&str> = Vec::new();
    let mut best = f64::MIN;
    for m in &by_cost {
        if m.ratio > best {
            best = m.ratio;
            labelled.push(&m.name);
        }
    }
    labelled.reverse();
    labelled.push(&r.recommendation.method);
    if let Some((c, _)) = &r.recommendation.best_compression {
        labelled.push(c);
    }
    labelled.extend(
        pts.iter()
            .filter(|m| m.family == "compress")
            .map(|m| m.name.as_str()),
    );
    for fam in &fams {
        let top = pts
            .iter()
            .filter(|m| m.family == *fam)
            .max_by(|a, b| a.ratio.total_cmp(&b.ratio));
        if let Some(m) = top {
            labelled.push(&m.name);
        }
    }

    let legend_rows = fams.len().div_ceil(5).max(1) as u32;
    let top = 16 + 22 * legend_rows;
    let (w, hgt) = (CHART_W, 560 + 22 * legend_rows);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (w, hgt)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin_top(top)
            .margin_left(10)
            .margin_right(30)
            .margin_bottom(10)
            .x_label_area_size(52)
            .y_label_area_size(72)
            .build_cartesian_2d(lo..hi, 0f64..ymax)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_labels(10)
            .y_label_formatter(&|v| axis_ratio(*v))
            .x_desc("CPU seconds per GB of input (one core), log scale")
            .y_desc("reduction ratio (input / output)")
            .label_style(text_style(14, &AXIS_TEXT))
            .axis_desc_style(text_style(15, &AXIS_TEXT))
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .draw()?;
        for t in log_ticks(10f64.powf(lo), 10f64.powf(hi)) {
            let x = t.log10();
            chart.draw_series(LineSeries::new([(x, 0.0), (x, ymax)], GRID.stroke_width(1)))?;
            let (px, py) = chart.backend_coord(&(x, 0.0));
            root.draw(&PathElement::new(
                vec![(px, py), (px, py + 5)],
                AXIS_TEXT.stroke_width(1),
            ))?;
            root.draw(&Text::new(
                fmt_tick(t),
                (px, py + 8),
                text_style(14, &AXIS_TEXT).pos(Pos::new(HPos::Center, VPos::Top)),
            ))?;
        }
        // Compression-only points last, so the reference methods are never hidden.
        let order = pts
            .iter()
            .filter(|m| m.family != "compress")
            .chain(pts.iter().filter(|m| m.family == "compress"));
        for m in order {
            let c = family_color(&m.family);
            let p = (m.cpu_s_per_gb.log10(), plot_ratio(m.ratio));
            chart.draw_series(std::iter::once(Circle::new(p, 6, c.filled())))?;
            chart.draw_series(std::iter::once(Circle::new(p, 6, WHITE.stroke_width(1))))?;
        }
        // Labels: try right, left, above, below each point; skip one that would overlap another.
        let (plot_left, plot_top) = chart.backend_coord(&(lo, ymax));
        let (plot_right, plot_bottom) = chart.backend_coord(&(hi, 0.0));
        let mut placed: Vec<(i32, i32, i32, i32)> = pts
            .iter()
            .map(|m| {
                let (x, y) = chart.backend_coord(&(m.cpu_s_per_gb.log10(), plot_ratio(m.ratio)));
                (x - 6, y - 6, x + 6, y + 6)
            })
            .collect();
        let overlaps = |a: &(i32, i32, i32, i32), b: &(i32, i32, i32, i32)| {
            a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3
        };
        let mut done: Vec<&str> = Vec::new();
        for name in labelled {
            let Some(m) = pts.iter().find(|m| m.name == name) else {
                continue;
            };
            if done.contains(&name) {
                continue;
            }
            done.push(name);
            let (x, y) = chart.backend_coord(&(m.cpu_s_per_gb.log10(), plot_ratio(m.ratio)));
            let tw = (m.name.chars().count() as f64 * 7.4).ceil() as i32;
            let th = 16;
            // (box left, box top, leader line needed)
            let candidates = [
                (x + 10, y - th / 2, false),
                (x - 10 - tw, y - th / 2, false),
                (x - tw / 2, y - 9 - th, false),
                (x - tw / 2, y + 9, false),
                (x + 12, y - 14 - th, true),
                (x + 12, y + 14, true),
                (x - 12 - tw, y - 14 - th, true),
                (x - 12 - tw, y + 14, true),
                (x + 30, y - th / 2, true),
                (x - 30 - tw, y - th / 2, true),
            ];
            for (bx, by, leader) in candidates {
                let rect = (bx, by, bx + tw, by + th);
                let inside = rect.0 >= plot_left
                    && rect.2 <= plot_right + 25
                    && rect.1 >= plot_top - 10
                    && rect.3 <= plot_bottom;
                if !inside || placed.iter().any(|p| overlaps(p, &rect)) {
                    continue;
                }
                placed.push(rect);
                if leader {
                    let lx = if bx > x { bx - 2 } else { bx + tw + 2 };
                    let ly = (by + th / 2).clamp(y - 40, y + 40);
                    let (dx, dy) = (f64::from(lx - x), f64::from(ly - y));
                    let len = dx.hypot(dy).max(1.0);
                    let start = (x + (dx * 7.0 / len) as i32, y + (dy * 7.0 / len) as i32);
                    root.draw(&PathElement::new(
                        vec![start, (lx, ly)],
                        RGBColor(120, 120, 120).stroke_width(1),
                    ))?;
                }
                root.draw(&Text::new(
                    m.name.clone(),
                    (bx, by + th / 2),
                    text_style(13, &BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
                ))?;
                break;
            }
        }
        if pts.is_empty() {
            root.draw(&Text::new(
                "no global-scope methods with a measured cost in this report",
                ((plot_left + plot_right) / 2, (plot_top + plot_bottom) / 2),
                text_style(16, &AXIS_TEXT).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
        }
        // Legend: one swatch per family, five to a row, in the top margin.
        for (i, fam) in fams.iter().enumerate() {
            let (row, col) = ((i / 5) as i32, (i % 5) as i32);
            let x = plot_left + col * 185;
            let y = 14 + row * 22;
            root.draw(&Circle::new((x + 7, y + 7), 6, family_color(fam).filled()))?;
            root.draw(&Text::new(
                fam.to_string(),
                (x + 19, y + 7),
                text_style(14, &BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        root.present()?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(esc("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
    }

    #[test]
    fn spreads_labels_apart_within_bounds() {
        let mut ys = vec![100.0, 101.0, 102.0, 300.0];
        spread(&mut ys, 16.0, 0.0, 400.0);
        assert!(ys[1] - ys[0] >= 16.0 && ys[2] - ys[1] >= 16.0);
        assert_eq!(ys[3], 300.0);
        let mut crowded = vec![395.0, 396.0, 397.0];
        spread(&mut crowded, 16.0, 0.0, 400.0);
        assert!(crowded.iter().all(|y| *y <= 400.0) && crowded[2] - crowded[1] >= 16.0);
    }

    #[test]
    fn log_ticks_are_nice() {
        assert_eq!(log_ticks(1.0, 1000.0), vec![1.0, 10.0, 100.0, 1000.0]);
        assert_eq!(
            log_ticks(15.0, 1500.0),
            vec![20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        );
        assert_eq!(log_ticks(15.0, 150.0).len(), 9);
        assert!(log_ticks(1e-300, 1.0).len() <= 10);
        assert!(log_ticks(30.0, 70.0).len() >= 4);
    }

    #[test]
    fn numbers_stay_short() {
        assert_eq!(fmt_secs(179.7), "3 min 00 s");
        assert_eq!(fmt_secs(1.234), "1.23 s");
        assert_eq!(fmt_secs(f64::NAN), "n/a");
        assert!(fmt_secs(1e300).len() < 12);
        assert!(fmt_num(1e303).len() < 12);
        assert_eq!(fmt_num(44.44), "44.4");
        assert_eq!(fmt_ratio(2.236), "2.24×");
        assert_eq!(fmt_ratio(f64::INFINITY), "∞");
        assert!(fmt_ratio(1e300).len() < 12);
        assert_eq!(fmt_tick(20.0), "20");
        assert_eq!(fmt_tick(0.5), "0.5");
    }

    #[test]
    fn sizes_are_labelled() {
        assert_eq!(size_label(256.0), "256 B");
        assert_eq!(size_label(4096.0), "4 KiB");
        assert_eq!(size_label(131072.0), "128 KiB");
        assert_eq!(size_label(1048576.0), "1 MiB");
    }
}
