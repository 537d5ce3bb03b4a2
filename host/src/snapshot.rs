//! A picture of a pool's memory: [`Snapshot`] (from
//! [`Pool::snapshot`](crate::Pool::snapshot)) lists the pool's mappings,
//! every mapped page and what each stream caches; [`Timeline`] samples
//! memory over a run of calls (`cuheap snapshot --replay` records one
//! from a trace). Both read and write JSON, and [`Snapshot::html`] draws
//! them: the address range as a grid of pages, coloured by what holds
//! them, and the timeline as curves.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::trace::{Action, TraceEvent};
use crate::Pool;
#[cfg(feature = "json")]
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write;

/// A pool's memory at one moment.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct Snapshot {
    /// The device (a CUDA ordinal).
    pub device: i32,
    /// The pool's first address; offsets below count from it.
    pub base: u64,
    pub page_size: usize,
    /// Address space reserved.
    pub reserved: usize,
    /// Bytes of physical memory the pool holds.
    pub mapped: usize,
    /// Each mapping (physical memory mapped in one piece).
    pub mappings: Vec<Extent>,
    /// Address ranges below the end whose memory moved to the end
    /// (unmapped, never handed out): no page run covers them.
    #[cfg_attr(feature = "json", serde(default))]
    pub holes: Vec<Extent>,
    /// The mapped pages, in address order, covering `0..end()` but the
    /// holes.
    pub pages: Vec<PageRun>,
    /// What each stream caches.
    pub streams: Vec<StreamHold>,
    /// Bytes of blocks handed out and not freed.
    pub in_use: usize,
    /// Bytes of blocks freed into the streams' caches.
    pub cached: usize,
    /// Bytes of freed blocks waiting for their streams' work.
    pub retired: usize,
    pub peak_in_use: usize,
}

/// Bytes `offset..offset + len` from the pool's base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct Extent {
    pub offset: usize,
    pub len: usize,
}

/// Pages in a row that hold the same thing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "json", serde(tag = "kind", rename_all = "snake_case"))]
pub enum PageRun {
    /// Mapped pages no block uses.
    Free { offset: usize, pages: u32 },
    /// One page of a size class (`pages` units long): `capacity` blocks
    /// of `block` bytes, `used` of them taken from the heap, of which
    /// `live` are handed out and `cached` sit in streams' caches (the
    /// rest wait for their streams' work).
    Class {
        offset: usize,
        pages: u32,
        block: usize,
        capacity: u32,
        used: u32,
        live: u32,
        cached: u32,
    },
    /// One block of whole pages.
    Span {
        offset: usize,
        pages: u32,
        holder: Holder,
    },
}

/// Who holds a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
#[cfg_attr(feature = "json", serde(tag = "by", rename_all = "snake_case"))]
pub enum Holder {
    /// Handed out.
    Live,
    /// In this stream's cache.
    Cached { stream: u64 },
    /// Freed, waiting for its streams' work before it goes back.
    Returning,
}

/// One stream's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct StreamHold {
    /// The stream's id (its handle as an integer).
    pub stream: u64,
    pub blocks: usize,
    pub bytes: usize,
}

/// Memory over a run of calls: one sample every few calls, each the most
/// seen since the sample before (so no peak falls between samples).
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct Timeline {
    pub samples: Vec<Sample>,
}

/// The most memory over the calls after the previous sample, up to and
/// with call `call` (counting from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct Sample {
    pub call: usize,
    /// Bytes the program asked for and had not freed.
    pub requested: usize,
    /// Bytes of the blocks handed out (sizes rounded to the pool's).
    pub in_use: usize,
    /// Bytes the pool had mapped.
    pub mapped: usize,
}

/// What `cuheap snapshot` reads and writes: a snapshot and, for a
/// replayed trace, its timeline.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "json", derive(Serialize, Deserialize))]
pub struct Picture {
    pub title: String,
    pub snapshot: Snapshot,
    #[cfg_attr(feature = "json", serde(default))]
    pub timeline: Option<Timeline>,
}

impl PageRun {
    pub fn offset(&self) -> usize {
        match *self {
            PageRun::Free { offset, .. }
            | PageRun::Class { offset, .. }
            | PageRun::Span { offset, .. } => offset,
        }
    }

    pub fn pages(&self) -> u32 {
        match *self {
            PageRun::Free { pages, .. }
            | PageRun::Class { pages, .. }
            | PageRun::Span { pages, .. } => pages,
        }
    }

    /// Its colour in [`Snapshot::html`] (see [`LEGEND`]).
    fn colour(&self) -> &'static str {
        match *self {
            PageRun::Free { .. } => FREE,
            PageRun::Class { used: 0, .. } => EMPTY_CLASS,
            PageRun::Class {
                live: 0, cached: 0, ..
            } => RETURNING,
            PageRun::Class { live, cached, .. } if cached > live => CACHED,
            PageRun::Class { live, capacity, .. } => {
                let quarter = (4 * live as u64)
                    .div_ceil(capacity.max(1) as u64)
                    .clamp(1, 4);
                LIVE_CLASS[quarter as usize - 1]
            }
            PageRun::Span { holder, .. } => match holder {
                Holder::Live => LIVE_SPAN,
                Holder::Cached { .. } => CACHED,
                Holder::Returning => RETURNING,
            },
        }
    }

    fn describe(&self) -> String {
        let at = format!("{:.2} MiB", mib(self.offset()));
        match *self {
            PageRun::Free { pages, .. } => format!("{at}: {pages} free pages"),
            PageRun::Class {
                block,
                capacity,
                used,
                live,
                cached,
                ..
            } => format!(
                "{at}: page of {block} B blocks, {live} live, {cached} cached, {} returning, {} free of {capacity}",
                used.saturating_sub(live.saturating_add(cached)),
                capacity.saturating_sub(used)
            ),
            PageRun::Span { pages, holder, .. } => {
                let by = match holder {
                    Holder::Live => "live".to_string(),
                    Holder::Cached { stream } => format!("cached by stream {stream:#x}"),
                    Holder::Returning => "returning".to_string(),
                };
                format!("{at}: span of {pages} pages, {by}")
            }
        }
    }
}

/// The most mapped pages [`Snapshot::check`] accepts (1 TiB of 64 KiB
/// pages): what a drawing of reasonable size can hold.
pub const MAX_PAGES: usize = 1 << 24;

const FREE: &str = "#e4e4e4";
const EMPTY_CLASS: &str = "#c6dbef";
const LIVE_CLASS: [&str; 4] = ["#9ecae1", "#6baed6", "#3182bd", "#08519c"];
const LIVE_SPAN: &str = "#31a354";
const CACHED: &str = "#fd8d3c";
const RETURNING: &str = "#9e9ac8";

/// The colours of [`Snapshot::html`] and what they mean.
pub const LEGEND: [(&str, &str); 8] = [
    (FREE, "mapped, free"),
    (EMPTY_CLASS, "size-class page, no block taken"),
    ("#9ecae1", "size-class page, up to 1/4 live"),
    (
        "#08519c",
        "size-class page, 3/4 to all live (darker: fuller)",
    ),
    (LIVE_SPAN, "span, live"),
    (
        CACHED,
        "cached by a stream (span, or a page with more cached than live)",
    ),
    (
        RETURNING,
        "freed, waiting for its streams' work (a span, or a page of only such blocks)",
    ),
    ("#000000", "start of a mapping (left edge)"),
];

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Escapes text for HTML and SVG.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Snapshot {
    #[cfg(feature = "json")]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a snapshot is plain data")
    }

    #[cfg(feature = "json")]
    pub fn from_json(text: &str) -> Result<Snapshot> {
        serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("not a pool snapshot: {e}")))
    }

    /// Checks what a snapshot read from elsewhere must hold before it is
    /// drawn: a page size of at least 4 KiB (a power of two), at most
    /// [`MAX_PAGES`] mapped pages, page runs that cover `0..end()` in
    /// order (a gap only where a hole is listed), class pages whose counts
    /// add up (`live + cached <= used <= capacity`), and mappings and
    /// holes inside the reserved range.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::InvalidArgument(format!("snapshot: {what}")));
        let ps = self.page_size;
        if ps < 4096 || !ps.is_power_of_two() {
            return bad(format!("page size {ps}"));
        }
        let end = self.end();
        if end / ps > MAX_PAGES {
            return bad(format!("{end} bytes mapped: more than {MAX_PAGES} pages"));
        }
        let mut at = 0usize;
        for r in &self.pages {
            // A gap is allowed only where holes are listed.
            while r.offset() > at {
                match self.holes.iter().find(|h| h.offset == at && h.len > 0) {
                    Some(h) => at += h.len,
                    None => break,
                }
            }
            if r.offset() != at || r.pages() == 0 {
                return bad(format!(
                    "a page run at {} where {at} was expected",
                    r.offset()
                ));
            }
            if let PageRun::Class {
                capacity,
                used,
                live,
                cached,
                ..
            } = *r
            {
                if used > capacity || live as u64 + cached as u64 > used as u64 {
                    return bad(format!(
                        "a class page at {at} with {live} live and {cached} cached of {used} used, capacity {capacity}"
                    ));
                }
            }
            match (r.pages() as usize)
                .checked_mul(ps)
                .and_then(|n| at.checked_add(n))
            {
                Some(next) if next <= end => at = next,
                _ => return bad(format!("a page run at {at} past the {end} bytes mapped")),
            }
        }
        while let Some(h) = self.holes.iter().find(|h| h.offset == at && h.len > 0) {
            at += h.len;
        }
        if at != end {
            return bad(format!("page runs cover {at} bytes of {end} mapped"));
        }
        for m in self.mappings.iter().chain(&self.holes) {
            let room = self.reserved.max(self.mapped);
            if m.offset.checked_add(m.len).is_none_or(|e| e > room) {
                return bad(format!(
                    "a mapping or hole of {} bytes at {} past the reserved range",
                    m.len, m.offset
                ));
            }
        }
        Ok(())
    }

    /// The end of the mapped range from `base`: the pool's memory and its
    /// holes.
    pub fn end(&self) -> usize {
        (self.mappings.iter().chain(&self.holes))
            .map(|e| e.offset.saturating_add(e.len))
            .max()
            .unwrap_or(0)
            .max(self.mapped)
    }

    /// The mapped range as a grid of pages, one row per `cols` pages,
    /// coloured as [`LEGEND`] says; each run has a tooltip.
    pub fn svg(&self) -> String {
        const WIDTH: usize = 1024;
        const LEFT: usize = 80;
        let ps = self.page_size.max(1);
        let pages = (self.end() / ps).clamp(1, MAX_PAGES);
        let cols = pages.div_ceil(512).next_power_of_two().clamp(128, WIDTH);
        let w = (WIDTH / cols).max(1);
        let h = if cols >= 512 { 3 } else { 6 };
        let rows = pages.div_ceil(cols);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="10">"#,
            LEFT + cols * w + 10,
            rows * h + 20
        );
        let label_every = (40 / h).max(1).next_power_of_two();
        for row in (0..rows).step_by(label_every) {
            let _ = writeln!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end">{:.0} MiB</text>"#,
                LEFT - 6,
                row * h + h + 3,
                mib(row * cols * ps)
            );
        }
        for r in &self.pages {
            let first = r.offset() / ps;
            let title = escape(&r.describe());
            let colour = r.colour();
            // One rectangle per row the run crosses.
            let mut p = first;
            let end = (first + r.pages() as usize).min(pages);
            while p < end {
                let row = p / cols;
                let n = (end - p).min(cols - p % cols);
                let _ = writeln!(
                    out,
                    r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{colour}"><title>{title}</title></rect>"#,
                    LEFT + (p % cols) * w,
                    row * h,
                    n * w,
                    h
                );
                p += n;
            }
        }
        for m in &self.mappings {
            let p = m.offset / ps;
            if p >= pages {
                continue;
            }
            let _ = writeln!(
                out,
                r#"<rect x="{}" y="{}" width="1" height="{h}" fill="black"><title>mapping of {:.0} MiB at {:.0} MiB</title></rect>"#,
                LEFT + (p % cols) * w,
                (p / cols) * h,
                mib(m.len),
                mib(m.offset)
            );
        }
        out.push_str("</svg>\n");
        out
    }

    /// A page with the figures, the streams' caches, the legend, the
    /// timeline (if any) and [`Snapshot::svg`].
    pub fn html(&self, title: &str, timeline: Option<&Timeline>) -> String {
        let mut out = String::new();
        let t = escape(title);
        let _ = writeln!(
            out,
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
             <style>body{{font-family:sans-serif;margin:20px}} td,th{{padding:2px 10px;text-align:right}}\
             .sw{{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:middle}}</style>\
             </head><body>\n<h1>{t}</h1>"
        );
        let (live, cached_pages, free) = self.page_bytes();
        let _ = writeln!(
            out,
            "<p>Device {}, base {:#x}: {:.1} MiB mapped in {} mappings of {:.0} MiB reserved. \
             Blocks in use {:.1} MiB (peak {:.1}), cached {:.1} MiB, returning {:.1} MiB. \
             Pages: {:.1} MiB holding live blocks, {:.1} MiB holding only cached or returning ones, {:.1} MiB free.</p>",
            self.device,
            self.base,
            mib(self.mapped),
            self.mappings.len(),
            mib(self.reserved),
            mib(self.in_use),
            mib(self.peak_in_use),
            mib(self.cached),
            mib(self.retired),
            mib(live),
            mib(cached_pages),
            mib(free)
        );
        if !self.streams.is_empty() {
            out.push_str(
                "<table><tr><th>stream</th><th>cached blocks</th><th>cached MiB</th></tr>\n",
            );
            for s in &self.streams {
                let _ = writeln!(
                    out,
                    "<tr><td>{:#x}</td><td>{}</td><td>{:.2}</td></tr>",
                    s.stream,
                    s.blocks,
                    mib(s.bytes)
                );
            }
            out.push_str("</table>\n");
        }
        if let Some(tl) = timeline {
            out.push_str("<h2>Memory over the calls</h2>\n");
            out.push_str(&tl.svg());
        }
        out.push_str("<h2>The address range, page by page</h2>\n<p>");
        for (colour, what) in LEGEND {
            let _ = write!(
                out,
                "<span class=\"sw\" style=\"background:{colour}\"></span>{}&nbsp;&nbsp; ",
                escape(what)
            );
        }
        out.push_str("</p>\n");
        out.push_str(&self.svg());
        out.push_str("</body></html>\n");
        out
    }

    /// Bytes of pages holding live blocks, pages holding only cached or
    /// returning ones, and free pages (empty class pages count as free).
    pub fn page_bytes(&self) -> (usize, usize, usize) {
        let (mut live, mut held, mut free) = (0, 0, 0);
        for r in &self.pages {
            let bytes = (r.pages() as usize).saturating_mul(self.page_size);
            match *r {
                PageRun::Free { .. } | PageRun::Class { used: 0, .. } => free += bytes,
                PageRun::Class { live: 0, .. }
                | PageRun::Span {
                    holder: Holder::Cached { .. } | Holder::Returning,
                    ..
                } => held += bytes,
                _ => live += bytes,
            }
        }
        (live, held, free)
    }
}

impl Timeline {
    /// Requested, in use and mapped bytes against the call count.
    pub fn svg(&self) -> String {
        const W: f64 = 1000.0;
        const H: f64 = 260.0;
        const LEFT: f64 = 70.0;
        let last = self.samples.last().map_or(1, |s| s.call).max(1) as f64;
        let top = self
            .samples
            .iter()
            .map(|s| s.mapped.max(s.in_use).max(s.requested))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let x = |call: usize| LEFT + call as f64 / last * W;
        let y = |bytes: usize| 10.0 + H - bytes as f64 / top * H;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="10">"#,
            LEFT + W + 10.0,
            H + 40.0
        );
        for k in 0..=4 {
            let b = (top * k as f64 / 4.0) as usize;
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0} MiB</text>"##,
                LEFT + W,
                LEFT - 6.0,
                y(b) + 3.0,
                mib(b),
                y = y(b)
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">call {}</text>"#,
            LEFT + W,
            H + 30.0,
            last as usize
        );
        // Wide first, so a curve that lies on another still shows.
        type Curve = (&'static str, &'static str, f64, fn(&Sample) -> usize);
        let series: [Curve; 3] = [
            ("requested", "#2ca02c", 4.0, |s| s.requested),
            ("blocks in use", "#1f77b4", 1.5, |s| s.in_use),
            ("mapped by the pool", "#d62728", 1.5, |s| s.mapped),
        ];
        for (i, (name, colour, width, value)) in series.iter().enumerate() {
            let points: Vec<String> = self
                .samples
                .iter()
                .map(|s| format!("{:.1},{:.1}", x(s.call), y(value(s))))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="{width}" points="{}"/><text x="{}" y="{}" fill="{colour}">{name}</text>"#,
                points.join(" "),
                LEFT + 10.0 + 150.0 * i as f64,
                H + 30.0
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

impl Picture {
    #[cfg(feature = "json")]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a picture is plain data")
    }

    /// A picture, or a bare [`Snapshot`] (titled "pool snapshot"), from
    /// JSON; checked. Anything else is an error that says what is wrong.
    #[cfg(feature = "json")]
    pub fn from_json(text: &str) -> Result<Picture> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::InvalidArgument(format!("not JSON: {e}")))?;
        let picture = if value.get("snapshot").is_some() {
            serde_json::from_value::<Picture>(value)
                .map_err(|e| Error::InvalidArgument(format!("not a pool picture: {e}")))?
        } else {
            Picture {
                title: "pool snapshot".into(),
                snapshot: serde_json::from_value(value)
                    .map_err(|e| Error::InvalidArgument(format!("not a pool snapshot: {e}")))?,
                timeline: None,
            }
        };
        picture.snapshot.check()?;
        Ok(picture)
    }

    pub fn html(&self) -> String {
        self.snapshot.html(&self.title, self.timeline.as_ref())
    }
}

/// Replays `events` (a trace, as [`crate::read_trace`] reads it) on
/// `pool`, in order, one stream per stream of the trace (`new_stream`
/// makes them), with the trace's sizes. Returns the memory over the calls
/// (`samples` points, evenly spaced, the last at the last call, each the
/// most since the one before) and a snapshot of
/// the pool just after the call at which the trace's requested bytes
/// peak. Rows of failed allocations and frees of pointers the trace never
/// allocated are skipped; any error of the pool fails the replay. Blocks
/// still live at the end are freed.
pub fn replay<B: Backend>(
    pool: &Pool<B>,
    mut new_stream: impl FnMut() -> Result<B::Stream>,
    events: &[TraceEvent],
    samples: usize,
) -> Result<(Timeline, Snapshot)> {
    // The call after which the trace asks for the most.
    let (mut requested, mut peak, mut at_peak) = (0usize, 0usize, 0usize);
    let mut sizes: HashMap<u64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            // Saturating: a trace's sizes are anyone's (the replay below
            // fails on a size the pool cannot serve, with its error).
            Action::Allocate => {
                if let Some(old) = sizes.insert(e.ptr, e.size) {
                    requested = requested.saturating_sub(old);
                }
                requested = requested.saturating_add(e.size);
                if requested > peak {
                    (peak, at_peak) = (requested, i);
                }
            }
            Action::Free => requested = requested.saturating_sub(sizes.remove(&e.ptr).unwrap_or(0)),
            Action::AllocateFailure => {}
        }
    }
    let every = events.len().div_ceil(samples.max(1)).max(1);
    let mut streams: HashMap<u64, B::Stream> = HashMap::new();
    // The trace's pointer -> ours, its stream and the trace's size.
    let mut live: HashMap<u64, (u64, u64, usize)> = HashMap::new();
    let mut timeline = Timeline::default();
    let mut snapshot = None;
    requested = 0;
    let mut in_use = 0usize; // our blocks' sizes, as the pool counts them
    let mut most = Sample {
        call: 0,
        requested: 0,
        in_use: 0,
        mapped: 0,
    };
    for (i, e) in events.iter().enumerate() {
        if let std::collections::hash_map::Entry::Vacant(v) = streams.entry(e.stream) {
            v.insert(new_stream()?);
        }
        let s = &streams[&e.stream];
        match e.action {
            Action::Allocate => {
                let p = pool.alloc(e.size.max(1), s)?;
                requested += e.size;
                in_use += pool.size_of(p)?;
                if let Some((old, sid, size)) = live.insert(e.ptr, (p, e.stream, e.size)) {
                    // The trace reused a pointer it never freed: free ours.
                    requested -= size;
                    in_use -= pool.size_of(old)?;
                    pool.free(old, &streams[&sid])?;
                }
            }
            Action::Free => {
                if let Some((p, _, size)) = live.remove(&e.ptr) {
                    requested -= size;
                    in_use -= pool.size_of(p)?;
                    pool.free(p, s)?;
                }
            }
            Action::AllocateFailure => {}
        }
        most.requested = most.requested.max(requested);
        most.in_use = most.in_use.max(in_use);
        most.mapped = most.mapped.max(pool.mapped());
        if (i + 1) % every == 0 || i + 1 == events.len() {
            most.call = i + 1;
            timeline.samples.push(most);
            most = Sample {
                call: 0,
                requested: 0,
                in_use: 0,
                mapped: 0,
            };
        }
        if i == at_peak {
            snapshot = Some(pool.snapshot());
        }
    }
    for (p, sid, _) in live.into_values() {
        pool.free(p, &streams[&sid])?;
    }
    let snapshot = snapshot.unwrap_or_else(|| pool.snapshot());
    Ok((timeline, snapshot))
}
