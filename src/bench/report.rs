//! Tables, JSON and an SVG chart for benchmark reports.

use super::device::{size_name, Report, Row};
use std::fmt::Write;

fn find<'a>(r: &'a Report, alloc: &str, shape: &str, t: u32, s: u32) -> Option<&'a Row> {
    r.rows
        .iter()
        .find(|x| x.allocator == alloc && x.shape == shape && x.threads == t && x.size == s)
}

fn ms(r: Option<&Row>) -> String {
    r.map_or("-".into(), |r| format!("{:.3}", r.median_ms))
}

pub fn threads_name(t: u32) -> String {
    if t >= 1 << 20 && t.is_multiple_of(1 << 20) {
        format!("{}M", t >> 20)
    } else if t >= 1024 && t.is_multiple_of(1024) {
        format!("{}K", t >> 10)
    } else {
        t.to_string()
    }
}

/// The device report as a Markdown table: one line per (threads, size).
pub fn device_table(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "device: {}; cuheap heap {} GiB; median of runs, CUDA events, ms",
        r.device,
        r.heap_bytes >> 30
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| T x size | cuheap pair | pairs/s | CUDA malloc pair | speedup | cuheap alloc | cuheap free | bump alloc | alloc / bump | live pages / requested | footprint / requested | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut keys: Vec<(u32, u32)> = r.rows.iter().map(|x| (x.threads, x.size)).collect();
    keys.dedup();
    keys.sort_by_key(|&(t, s)| (t, if s == 0 { u32::MAX / 2 } else { s }));
    keys.dedup();
    for (t, s) in keys {
        let pair = find(r, "cuheap", "pair", t, s);
        let cuda = find(r, "CUDA malloc", "pair", t, s);
        let alloc = find(r, "cuheap", "alloc", t, s);
        let free = find(r, "cuheap", "free", t, s);
        let bump = find(r, "bump (ceiling)", "alloc", t, s);
        let speedup = match (pair, cuda) {
            (Some(p), Some(c)) => format!("{:.0}x", c.median_ms / p.median_ms),
            _ => "-".into(),
        };
        let vs_bump = match (alloc, bump) {
            (Some(a), Some(b)) => format!("{:.2}", a.median_ms / b.median_ms),
            _ => "-".into(),
        };
        let errors: u32 = [pair, alloc, cuda, bump]
            .iter()
            .flatten()
            .map(|x| x.errors)
            .sum();
        let cuda_cell = match cuda {
            Some(_) => ms(cuda),
            None => r
                .skipped
                .iter()
                .find(|k| k.allocator == "CUDA malloc" && k.threads == t && k.size == s)
                .map_or("-".into(), |k| format!("skipped ({})", k.reason)),
        };
        let _ = writeln!(
            out,
            "| {} x {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            threads_name(t),
            size_name(s),
            ms(pair),
            pair.map_or("-".into(), |p| format!("{:.2} G", p.allocs_per_s / 1e9)),
            cuda_cell,
            speedup,
            ms(alloc),
            ms(free),
            ms(bump),
            vs_bump,
            alloc
                .and_then(|a| a.memory_ratio)
                .map_or("-".into(), |x| format!("{x:.2}")),
            alloc
                .and_then(|a| a.footprint_ratio)
                .map_or("-".into(), |x| format!("{x:.2}")),
            errors,
        );
    }
    for k in r.skipped.iter().filter(|k| k.allocator == "all") {
        let _ = writeln!(
            out,
            "\nskipped {} x {}: {}",
            threads_name(k.threads),
            size_name(k.size),
            k.reason
        );
    }
    out
}

/// A grouped bar chart (log scale) of pair-kernel times, as SVG.
pub fn device_svg(r: &Report) -> String {
    let series = [
        ("cuheap", "pair", "#1f77b4"),
        ("CUDA malloc", "pair", "#d62728"),
        ("bump (ceiling)", "alloc", "#7f7f7f"),
    ];
    let mut keys: Vec<(u32, u32)> = r
        .rows
        .iter()
        .filter(|x| x.allocator == "cuheap" && x.shape == "pair")
        .map(|x| (x.threads, x.size))
        .collect();
    keys.sort_by_key(|&(t, s)| (t, if s == 0 { u32::MAX / 2 } else { s }));
    let (w, h, left, bottom) = (60.0 * keys.len() as f64 + 120.0, 420.0, 70.0, 90.0);
    let plot_h = h - bottom - 40.0;
    let (lo, hi) = (-3.0f64, 3.0f64); // log10(ms) from 1 us to 1 s
    let y =
        |ms: f64| 40.0 + plot_h * (1.0 - ((ms.max(1e-3).log10() - lo) / (hi - lo)).clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="20" font-size="14">One alloc + free per thread (pair kernel), ms, log scale: {}</text>"#,
        r.device
    );
    for e in -3..=3 {
        let yy = y(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            w - 20.0,
            left - 5.0,
            yy + 4.0,
            10f64.powi(e)
        );
    }
    for (i, &(t, sz)) in keys.iter().enumerate() {
        let x0 = left + 10.0 + 60.0 * i as f64;
        for (j, (alloc, shape, color)) in series.iter().enumerate() {
            if let Some(row) = find(r, alloc, shape, t, sz) {
                let top = y(row.median_ms);
                let _ = writeln!(
                    s,
                    r#"<rect x="{}" y="{top}" width="16" height="{}" fill="{color}"><title>{alloc} {shape}: {:.4} ms</title></rect>"#,
                    x0 + 17.0 * j as f64,
                    40.0 + plot_h - top,
                    row.median_ms
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text transform="translate({},{}) rotate(-45)" text-anchor="end">{} x {}</text>"#,
            x0 + 25.0,
            h - bottom + 15.0,
            threads_name(t),
            size_name(sz)
        );
    }
    for (j, (alloc, shape, color)) in series.iter().enumerate() {
        let x = left + 10.0 + 170.0 * j as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{}">{alloc} ({shape})</text>"#,
            h - 22.0,
            x + 16.0,
            h - 12.0
        );
    }
    s.push_str("</svg>\n");
    s
}
