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
        "device: {}; cuheap heap {} GiB{}; median of runs, CUDA events, ms",
        r.device,
        r.heap_bytes >> 30,
        if r.far_lists { ", far lists" } else { "" }
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| T x size | cuheap pair | pairs/s | CUDA malloc pair | speedup | cuheap alloc | cuheap free | bump alloc | alloc / bump | live pages / requested | footprint / requested | nulls | errors |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
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
        // The free rows repeat their alloc row's counts.
        let measured = [
            pair,
            alloc,
            cuda,
            bump,
            find(r, "CUDA malloc", "alloc", t, s),
        ];
        let nulls: u32 = measured.iter().flatten().map(|x| x.nulls).sum();
        let errors: u32 = measured.iter().flatten().map(|x| x.errors).sum();
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
            "| {} x {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
            failed(nulls),
            failed(errors),
        );
    }
    if !r.churn.is_empty() {
        let _ = writeln!(
            out,
            "\nChurn: {} threads each hold a block of 16..4096 B; each round about half of them, chosen by hash, check and free theirs and allocate another\n",
            threads_name(r.churn[0].threads)
        );
        let _ = writeln!(
            out,
            "| round | ms | live MiB | footprint MiB | footprint / live | live pages / live | peak MiB | nulls | errors |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        let mib = |b: u64| format!("{:.1}", b as f64 / (1u64 << 20) as f64);
        for c in &r.churn {
            let _ = writeln!(
                out,
                "| {} | {:.3} | {} | {} | {:.3} | {:.3} | {} | {} | {} |",
                c.round,
                c.ms,
                mib(c.live_bytes),
                mib(c.footprint_bytes),
                c.footprint_ratio,
                c.live_pages_ratio,
                mib(c.peak_bytes),
                failed(c.nulls),
                failed(c.errors),
            );
        }
    }
    let failures = r.failures();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFAILED: {}", failures.join("; "));
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

/// A failure count for a table cell, marked when it is not 0.
fn failed(n: u32) -> String {
    if n == 0 {
        "0".into()
    } else {
        format!("**{n} FAILED**")
    }
}

/// A grouped bar chart on a log scale, as SVG: one group per label, one
/// bar per series (colours in order), values in `unit`.
pub fn bar_chart(
    title: &str,
    unit: &str,
    series: &[&str],
    groups: &[(String, Vec<Option<f64>>)],
) -> String {
    const COLORS: [&str; 6] = [
        "#1f77b4", "#d62728", "#7f7f7f", "#2ca02c", "#ff7f0e", "#9467bd",
    ];
    let values = groups.iter().flat_map(|g| g.1.iter().flatten().copied());
    let (min, max) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if min > max {
        (0.0, 1.0)
    } else {
        (
            min.max(1e-9).log10().floor(),
            max.log10().ceil().max(min.log10().floor() + 1.0),
        )
    };
    let group_w = 18.0 * series.len() as f64 + 24.0;
    let (left, bottom, top) = (70.0, 130.0, 40.0);
    let w = left + group_w * groups.len() as f64 + 40.0;
    let h = 460.0;
    let plot_h = h - bottom - top;
    let y =
        |v: f64| top + plot_h * (1.0 - ((v.max(1e-12).log10() - lo) / (hi - lo)).clamp(0.0, 1.0));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="14">{title} ({unit}, log scale)</text>"#
    );
    let mut e = lo as i32;
    while e <= hi as i32 {
        let yy = y(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{:.0}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            w - 20.0,
            left - 5.0,
            yy + 4.0,
            10f64.powi(e)
        );
        e += 1;
    }
    for (i, (label, vals)) in groups.iter().enumerate() {
        let x0 = left + 10.0 + group_w * i as f64;
        for (j, v) in vals.iter().enumerate() {
            if let Some(v) = v {
                let top_y = y(*v);
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{top_y:.1}" width="16" height="{:.1}" fill="{}"><title>{}: {v:.4} {unit}</title></rect>"#,
                    x0 + 18.0 * j as f64,
                    top + plot_h - top_y,
                    COLORS[j % COLORS.len()],
                    series[j]
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text transform="translate({:.1},{:.1}) rotate(-40)" text-anchor="end">{label}</text>"#,
            x0 + 20.0,
            h - bottom + 15.0
        );
    }
    for (j, name) in series.iter().enumerate() {
        let x = left + 10.0 + 170.0 * j as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{name}</text>"#,
            h - 22.0,
            COLORS[j % COLORS.len()],
            x + 16.0,
            h - 12.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The device report's chart: pair-kernel times per case.
pub fn device_svg(r: &Report) -> String {
    let series = [
        ("cuheap", "pair"),
        ("CUDA malloc", "pair"),
        ("bump (ceiling)", "alloc"),
    ];
    let mut keys: Vec<(u32, u32)> = r
        .rows
        .iter()
        .filter(|x| x.allocator == "cuheap" && x.shape == "pair")
        .map(|x| (x.threads, x.size))
        .collect();
    keys.sort_by_key(|&(t, s)| (t, if s == 0 { u32::MAX / 2 } else { s }));
    let groups: Vec<(String, Vec<Option<f64>>)> = keys
        .iter()
        .map(|&(t, sz)| {
            let vals = series
                .iter()
                .map(|(a, sh)| find(r, a, sh, t, sz).map(|x| x.median_ms))
                .collect();
            (format!("{} x {}", threads_name(t), size_name(sz)), vals)
        })
        .collect();
    let title = format!("One alloc + free per thread: {}", r.device);
    bar_chart(
        &title,
        "ms",
        &[
            "cuheap (pair)",
            "CUDA malloc (pair)",
            "bump ceiling (alloc)",
        ],
        &groups,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(allocator: &'static str, shape: &'static str, nulls: u32, errors: u32) -> Row {
        Row {
            allocator,
            shape,
            threads: 1024,
            size: 64,
            median_ms: 1.0,
            runs: 1,
            allocs_per_s: 1e6,
            nulls,
            errors,
            memory_ratio: None,
            footprint_ratio: None,
        }
    }

    #[test]
    fn nulls_and_errors_show_in_the_table_and_fail_the_report() {
        let mut r = Report::default();
        r.rows.push(row("cuheap", "pair", 0, 0));
        assert!(r.failures().is_empty());
        assert!(!device_table(&r).contains("FAILED"));
        r.rows.push(row("cuheap", "alloc", 3, 0));
        r.rows.push(row("bump (ceiling)", "alloc", 0, 2));
        assert_eq!(r.failures().len(), 2);
        let table = device_table(&r);
        let line = table
            .lines()
            .find(|l| l.starts_with("| 1K x 64 B"))
            .unwrap();
        assert!(line.ends_with("| **3 FAILED** | **2 FAILED** |"), "{line}");
        assert!(table.contains("FAILED: cuheap alloc 1024 x 64 B: 3 nulls, 0 errors"));
    }

    #[test]
    fn bar_chart_draws_one_bar_per_value() {
        let groups = vec![
            ("a".to_string(), vec![Some(0.5), None]),
            ("b".to_string(), vec![Some(20.0), Some(3.0)]),
        ];
        let svg = bar_chart("t", "ms", &["x", "y"], &groups);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<title>").count(), 3);
        assert!(!svg.contains("NaN"));
    }
}
