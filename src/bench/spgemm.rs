//! `cuheap demo spgemm`: C = A x B on the GPU with cuSPARSE, our two-pass
//! kernels, one pass on CUDA's device `malloc`, and one pass on cuheap (a
//! block per row, and chunks per warp), every result checked against the
//! CPU reference. Times are CUDA events around every step of a product:
//! the median of `reps` runs after a warm-up.

use super::median;
use crate::spgemm::cusparse::Cusparse;
use crate::spgemm::gpu::{Method, Runner};
use crate::spgemm::{self, gen, Csr, DeviceCsr, Product};
use crate::{DeviceHeap, Error, Gpu, Result};
use serde::Serialize;

/// An input: a generated or read matrix A, multiplied by itself or by its
/// transpose.
#[derive(Clone, Debug)]
pub struct Input {
    pub kind: Kind,
    /// A x A^T instead of A x A.
    pub transpose: bool,
}

#[derive(Clone, Debug)]
pub enum Kind {
    /// R-MAT with Graph500's parameters: 2^scale rows, edges per row.
    Rmat { scale: u32, edges: u32 },
    /// 2D 5-point stencil on an n x n grid.
    Stencil2d(usize),
    /// 3D 27-point stencil on an n^3 grid.
    Stencil3d(usize),
    /// n rows, nonzeros within `half` of the diagonal.
    Banded { n: usize, half: usize },
    /// n rows of k uniformly random columns.
    Uniform { n: usize, k: usize },
    /// A Matrix Market file.
    Mtx(std::path::PathBuf),
}

const SEED: u64 = 20261123;

impl Input {
    /// Parses `rmat:SCALE:EDGES`, `stencil2d:N`, `stencil3d:N`,
    /// `banded:N:HALF`, `uniform:N:K` or `mtx:PATH`, each optionally
    /// followed by `:t` for A x A^T.
    pub fn parse(s: &str) -> std::result::Result<Input, String> {
        let (body, transpose) = match s.strip_suffix(":t") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let parts: Vec<&str> = body.split(':').collect();
        let num = |i: usize| -> std::result::Result<usize, String> {
            parts
                .get(i)
                .ok_or_else(|| format!("`{s}`: missing a number"))?
                .parse::<usize>()
                .map_err(|e| format!("`{s}`: {e}"))
        };
        let kind = match parts[0] {
            "rmat" => Kind::Rmat {
                scale: num(1)? as u32,
                edges: num(2)? as u32,
            },
            "stencil2d" => Kind::Stencil2d(num(1)?),
            "stencil3d" => Kind::Stencil3d(num(1)?),
            "banded" => Kind::Banded {
                n: num(1)?,
                half: num(2)?,
            },
            "uniform" => Kind::Uniform {
                n: num(1)?,
                k: num(2)?,
            },
            "mtx" if parts.len() >= 2 => Kind::Mtx(body[4..].into()),
            _ => {
                return Err(format!(
                    "`{s}`: use rmat:SCALE:EDGES, stencil2d:N, stencil3d:N, banded:N:HALF, \
                     uniform:N:K or mtx:PATH, with :t for A x A^T"
                ))
            }
        };
        Ok(Input { kind, transpose })
    }

    /// A readable name.
    pub fn name(&self) -> String {
        match &self.kind {
            Kind::Rmat { scale, edges } => format!("R-MAT scale {scale}, {edges}/row"),
            Kind::Stencil2d(n) => format!("2D 5-point {n}^2"),
            Kind::Stencil3d(n) => format!("3D 27-point {n}^3"),
            Kind::Banded { n, half } => format!("banded {n}, half width {half}"),
            Kind::Uniform { n, k } => format!("uniform {n}, {k}/row"),
            Kind::Mtx(p) => p.display().to_string(),
        }
    }

    /// A, generated (seeded) or read.
    pub fn matrix(&self) -> std::result::Result<Csr, spgemm::Error> {
        match &self.kind {
            Kind::Rmat { scale, edges } => gen::rmat(*scale, *edges, SEED),
            Kind::Stencil2d(n) => gen::stencil_2d_5pt(*n),
            Kind::Stencil3d(n) => gen::stencil_3d_27pt(*n),
            Kind::Banded { n, half } => gen::banded(*n, *half, SEED),
            Kind::Uniform { n, k } => gen::uniform(*n, *k, SEED),
            Kind::Mtx(p) => spgemm::mtx::read_mtx(p),
        }
    }
}

/// The inputs of `cuheap demo spgemm` when none are given.
pub fn default_inputs() -> Vec<Input> {
    [
        "rmat:16:16",
        "rmat:16:16:t",
        "rmat:18:8",
        "stencil2d:2048",
        "stencil3d:100",
        "banded:1000000:8",
        "uniform:1000000:8",
    ]
    .iter()
    .map(|s| Input::parse(s).expect("valid"))
    .collect()
}

/// Settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub inputs: Vec<Input>,
    pub reps: usize,
    /// CUDA's device heap size (its `malloc` method's memory).
    pub malloc_heap: usize,
    /// Run cuSPARSE and CUDA malloc.
    pub cusparse: bool,
    pub malloc: bool,
    /// Run CUDA malloc only on inputs with at most this many rows: it
    /// takes about a minute on the 2D stencil's 4.2 M rows and longer on
    /// the 3D one's 1 M rows of 125 entries.
    pub malloc_max_rows: usize,
    /// Chunk sizes (bytes) of the one-pass method in chunks, each run as
    /// a method of its own (a block per row always runs).
    pub chunks: Vec<u32>,
}

impl Config {
    /// Rows the report will have: per input, cuSPARSE twice (when run),
    /// the two-pass, a block per row, each chunk size, and CUDA malloc
    /// (when run, or marked skipped). [`run`]'s progress counts them.
    pub fn rows_planned(&self) -> usize {
        let per_input =
            if self.cusparse { 2 } else { 0 } + 2 + self.chunks.len() + usize::from(self.malloc);
        self.inputs.len() * per_input
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            inputs: default_inputs(),
            reps: 5,
            malloc_heap: 16 << 30,
            cusparse: true,
            malloc: true,
            malloc_max_rows: 1 << 18,
            chunks: vec![Method::DEFAULT_CHUNK],
        }
    }
}

/// One input and method.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub input: String,
    pub product: &'static str,
    pub rows: usize,
    pub nnz_a: usize,
    pub products: u64,
    pub nnz_c: usize,
    pub method: String,
    /// Median milliseconds (0 when the method failed).
    pub median_ms: f64,
    pub runs: usize,
    /// 2 x products / time.
    pub gflops: f64,
    /// Device memory the product held at its peak, besides A and B.
    pub peak_bytes: usize,
    /// cuSPARSE's two buffers; the cuheap heap's pages after the row kernels.
    pub detail_bytes: Vec<usize>,
    /// None when the result matched the reference; else what went wrong.
    pub failure: Option<String>,
    /// Why the method was not run, if it was not.
    pub skipped: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub device: String,
    pub rows: Vec<Row>,
}

impl Report {
    /// Lines for failed methods of ours (the command's failure). The
    /// baselines' failures (cuSPARSE, CUDA malloc) are reported in the
    /// table, not as the command's.
    pub fn failures(&self) -> Vec<String> {
        let baselines = [
            CUSPARSE.to_string(),
            CUSPARSE_CACHED.to_string(),
            Method::CudaMalloc.name(),
        ];
        self.rows
            .iter()
            .filter(|r| r.failure.is_some() && !baselines.contains(&r.method))
            .map(|r| {
                format!(
                    "{} {}, {}: {}",
                    r.input,
                    r.product,
                    r.method,
                    r.failure.as_deref().unwrap_or("")
                )
            })
            .collect()
    }
}

/// The baselines' names: cuSPARSE on `cudaMalloc`, and on a warm cache.
const CUSPARSE: &str = "cuSPARSE";
const CUSPARSE_CACHED: &str = "cuSPARSE, cached buffers";

/// What one method's runs gave.
struct Measured {
    times: Vec<f64>,
    peak: usize,
    detail: Vec<usize>,
    c: Option<DeviceCsr>,
}

/// Runs the demo; `progress` is told each step and how many of the
/// report's rows ([`Config::rows_planned`]) are done.
pub fn run(gpu: &Gpu, cfg: &Config, mut progress: impl FnMut(&str, usize)) -> Result<Report> {
    gpu.set_malloc_heap_size(cfg.malloc_heap)?;
    let kernels = crate::kernels::Bench::new(gpu)?;
    let (free, _) = gpu.mem_info()?;
    let heap = DeviceHeap::growable(gpu, 4 << 30, free / 10 * 6)?;
    // cuSPARSE as a user calls it with `cudaMalloc`, then on a warm caching
    // pool.
    let cusparse = if cfg.cusparse {
        vec![
            (CUSPARSE, Cusparse::new(gpu)?),
            (CUSPARSE_CACHED, Cusparse::cached(gpu)?),
        ]
    } else {
        Vec::new()
    };
    let info = gpu.info();
    let mut report = Report {
        device: format!(
            "{} ({} SMs, CUDA {}.{})",
            info.name,
            info.sms,
            info.driver_cuda_version / 1000,
            info.driver_cuda_version % 1000 / 10
        ),
        rows: Vec::new(),
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for input in &cfg.inputs {
        let name = input.name();
        progress(&format!("{name}: generating"), report.rows.len());
        let a = input
            .matrix()
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let b = if input.transpose {
            a.transpose()
        } else {
            a.clone()
        };
        let product = if input.transpose { "A x A^T" } else { "A x A" };
        progress(
            &format!("{name} {product}: CPU reference on {threads} threads"),
            report.rows.len(),
        );
        let reference = spgemm::reference::multiply_on(&a, &b, threads)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let (da, db) = (DeviceCsr::upload(gpu, &a)?, DeviceCsr::upload(gpu, &b)?);
        let mut methods: Vec<Result<Method, &(&str, Cusparse)>> =
            cusparse.iter().map(Err).collect();
        methods.push(Ok(Method::TwoPass));
        methods.push(Ok(Method::Cuheap { chunk: 0 }));
        methods.extend(cfg.chunks.iter().map(|&chunk| Ok(Method::Cuheap { chunk })));
        let malloc = cfg.malloc && a.rows() <= cfg.malloc_max_rows;
        if malloc {
            methods.push(Ok(Method::CudaMalloc));
        }
        for m in methods {
            let mname = match m {
                Ok(m) => m.name(),
                Err((name, _)) => name.to_string(),
            };
            progress(&format!("{name} {product}: {mname}"), report.rows.len());
            let measured = match m {
                Err((_, cs)) => {
                    let measured = measure_cusparse(cs, &da, &db, cfg.reps);
                    cs.trim();
                    measured
                }
                Ok(m) => {
                    let runner = Runner {
                        gpu,
                        kernels: &kernels,
                        heap: Some(&heap),
                        malloc_heap: cfg.malloc_heap,
                    };
                    measure_ours(&runner, &heap, m, &da, &db, cfg.reps)
                }
            };
            let r = row(&name, product, &a, &reference, mname, measured);
            let done = format!(
                "{name} {product}: {}: {:.3} ms ({} runs), peak {}, {}",
                r.method,
                r.median_ms,
                r.runs,
                gib(r.peak_bytes),
                r.failure.as_deref().unwrap_or("exact")
            );
            report.rows.push(r);
            progress(&done, report.rows.len());
        }
        if cfg.malloc && !malloc {
            let mut r = row(
                &name,
                product,
                &a,
                &reference,
                Method::CudaMalloc.name(),
                Err(Error::InvalidArgument(String::new())),
            );
            r.failure = None;
            r.skipped = Some(format!(
                "skipped: over {} rows (--malloc-max-rows)",
                cfg.malloc_max_rows
            ));
            let done = format!(
                "{name} {product}: {}: {}",
                r.method,
                r.skipped.as_deref().unwrap_or("")
            );
            report.rows.push(r);
            progress(&done, report.rows.len());
        }
    }
    // The progress bar's length.
    debug_assert_eq!(report.rows.len(), cfg.rows_planned());
    Ok(report)
}

fn row(
    input: &str,
    product: &'static str,
    a: &Csr,
    reference: &Product,
    method: String,
    measured: Result<Measured>,
) -> Row {
    let mut r = Row {
        input: input.into(),
        product,
        rows: a.rows(),
        nnz_a: a.nnz(),
        products: reference.products,
        nnz_c: reference.c.nnz(),
        method,
        median_ms: 0.0,
        runs: 0,
        gflops: 0.0,
        peak_bytes: 0,
        detail_bytes: Vec::new(),
        failure: None,
        skipped: None,
    };
    match measured {
        Err(e) => r.failure = Some(format!("error: {e}")),
        Ok(mut m) => {
            r.runs = m.times.len();
            r.median_ms = median(&mut m.times);
            r.gflops = 2.0 * reference.products as f64 / (r.median_ms * 1e6);
            r.peak_bytes = m.peak;
            r.detail_bytes = m.detail;
            let checked =
                m.c.as_ref()
                    .map(|c| c.download())
                    .transpose()
                    .map_err(|e| e.to_string())
                    .and_then(|c| match c {
                        Some(c) => spgemm::compare(&c, reference).map_err(|e| e.to_string()),
                        None => Err("no result".into()),
                    });
            if let Err(e) = checked {
                r.failure = Some(format!("wrong result: {e}"));
            }
        }
    }
    r
}

fn measure_cusparse(cs: &Cusparse, a: &DeviceCsr, b: &DeviceCsr, reps: usize) -> Result<Measured> {
    let (pa, pb) = (cs.prepare(a)?, cs.prepare(b)?);
    let first = cs.multiply(&pa, &pb)?;
    let (peak, detail) = (
        first.peak_bytes,
        vec![first.buffer1_bytes, first.buffer2_bytes],
    );
    drop(first);
    repeat(reps, peak, detail, || {
        let p = cs.multiply(&pa, &pb)?;
        Ok((p.ms, p.c))
    })
}

/// `reps` timed runs of `product`; the last result is kept for checking.
fn repeat(
    reps: usize,
    peak: usize,
    detail: Vec<usize>,
    mut product: impl FnMut() -> Result<(f64, DeviceCsr)>,
) -> Result<Measured> {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..reps {
        let (ms, c) = product()?;
        times.push(ms);
        last = Some(c);
    }
    Ok(Measured {
        times,
        peak,
        detail,
        c: last,
    })
}

/// A method whose warm-up takes longer than this (ms) is run once.
const SLOW_MS: f64 = 2000.0;

/// From an empty heap: a warm-up (growing the heap until the product
/// fits), a run that reads the heap's footprint after the row kernels,
/// then `reps` timed runs. The heap stays warm between runs, as in a
/// program that runs products one after another: each run frees every
/// block it allocated, and the next one takes the same pages again.
fn measure_ours(
    runner: &Runner<'_>,
    heap: &DeviceHeap,
    m: Method,
    a: &DeviceCsr,
    b: &DeviceCsr,
    reps: usize,
) -> Result<Measured> {
    let fresh = || -> Result<()> {
        // SAFETY: every product synchronises before it returns: nothing
        // that uses the heap is running or queued.
        unsafe { heap.reset() }
    };
    for attempt in 0.. {
        fresh()?;
        match runner.multiply(m, a, b, false) {
            // CUDA's malloc can take seconds on millions of rows: one run
            // is the figure then.
            Ok(p) if m == Method::CudaMalloc && p.ms > SLOW_MS => {
                return Ok(Measured {
                    times: vec![p.ms],
                    peak: p.peak_bytes,
                    detail: vec![],
                    c: Some(p.c),
                })
            }
            Ok(_) => break,
            Err(Error::DeviceHeapExhausted { .. })
                if matches!(m, Method::Cuheap { .. }) && attempt < 8 =>
            {
                let cap = heap.capacity();
                match heap.grow(cap.saturating_mul(2)) {
                    Ok(now) if now > cap => {}
                    // Short of the double, but grown: try again.
                    Err(Error::OutOfMemory { .. }) if heap.capacity() > cap => {}
                    Ok(_) | Err(Error::OutOfMemory { .. }) => {
                        return Err(Error::DeviceHeapExhausted {
                            failed: 0,
                            bytes: 0,
                        })
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    let measured = runner.multiply(m, a, b, true)?;
    let (peak, detail) = (measured.peak_bytes, vec![measured.heap_bytes]);
    drop(measured);
    repeat(reps, peak, detail, || {
        let p = runner.multiply(m, a, b, false)?;
        Ok((p.ms, p.c))
    })
}

fn gib(b: usize) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.0} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn count(n: u64) -> String {
    if n >= 1_000_000 {
        format!("{:.1} M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

/// The report as a Markdown table.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "{}\n\n| input | product | rows | nnz(A) | products | nnz(C) | method | time (ms) | GFLOP/s | peak memory | result |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.device
    );
    for x in &r.rows {
        let ok = x.failure.is_none();
        s += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            x.input,
            x.product,
            count(x.rows as u64),
            count(x.nnz_a as u64),
            count(x.products),
            count(x.nnz_c as u64),
            x.method,
            if x.runs > 0 {
                format!("{:.3}", x.median_ms)
            } else {
                "-".into()
            },
            if ok {
                format!("{:.1}", x.gflops)
            } else {
                "-".into()
            },
            if x.peak_bytes > 0 {
                gib(x.peak_bytes)
            } else {
                "-".into()
            },
            match (&x.failure, &x.skipped) {
                (_, Some(why)) => why.clone(),
                (None, None) => "exact".to_string(),
                (Some(f), None) => format!("**{f}**"),
            }
        );
    }
    s
}

/// Charts: time and peak memory per input and method (SVG, log scale).
pub fn svgs(r: &Report) -> (String, String) {
    let mut methods: Vec<String> = Vec::new();
    let mut inputs: Vec<String> = Vec::new();
    for x in &r.rows {
        if !methods.contains(&x.method) {
            methods.push(x.method.clone());
        }
        let key = format!("{} {}", x.input, x.product);
        if !inputs.contains(&key) {
            inputs.push(key);
        }
    }
    let series: Vec<&str> = methods.iter().map(|m| m.as_str()).collect();
    let groups = |f: &dyn Fn(&Row) -> f64| -> Vec<(String, Vec<Option<f64>>)> {
        inputs
            .iter()
            .map(|key| {
                let vals = methods
                    .iter()
                    .map(|m| {
                        r.rows
                            .iter()
                            .find(|x| {
                                &format!("{} {}", x.input, x.product) == key && &x.method == m
                            })
                            .filter(|x| x.failure.is_none() && x.skipped.is_none())
                            .map(f)
                    })
                    .collect();
                (key.clone(), vals)
            })
            .collect()
    };
    let time = super::report::bar_chart(
        &format!("SpGEMM time, every step: {}", r.device),
        "ms",
        &series,
        &groups(&|x| x.median_ms),
    );
    let mem = super::report::bar_chart(
        &format!("SpGEMM peak device memory besides A and B: {}", r.device),
        "GiB",
        &series,
        &groups(&|x| x.peak_bytes as f64 / (1u64 << 30) as f64),
    );
    (time, mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The progress bar's length: every row the report will have. This
    /// checks the count; `run` checks it against the rows it wrote (a
    /// debug assertion, on the GPU).
    #[test]
    fn rows_planned_counts_every_method_of_every_input() {
        let mut cfg = Config::default();
        let n = cfg.inputs.len();
        // cuSPARSE fresh and cached, two-pass, per row, 32 KiB chunks, malloc.
        assert_eq!(cfg.rows_planned(), n * 6);
        cfg.cusparse = false;
        cfg.malloc = false;
        cfg.chunks = vec![8 << 10, 32 << 10];
        assert_eq!(cfg.rows_planned(), n * 4);
        cfg.inputs.clear();
        assert_eq!(cfg.rows_planned(), 0);
    }

    #[test]
    fn inputs_parse_and_bad_ones_say_why() {
        let i = Input::parse("rmat:16:8:t").unwrap();
        assert!(i.transpose);
        assert!(matches!(
            i.kind,
            Kind::Rmat {
                scale: 16,
                edges: 8
            }
        ));
        assert!(matches!(
            Input::parse("banded:1000:4").unwrap().kind,
            Kind::Banded { n: 1000, half: 4 }
        ));
        match Input::parse("mtx:/data/my:matrix.mtx").unwrap().kind {
            Kind::Mtx(p) => assert_eq!(p, std::path::PathBuf::from("/data/my:matrix.mtx")),
            k => panic!("{k:?}"),
        }
        for bad in ["rmat:16", "stencil2d:x", "cube:4", "", "uniform:10"] {
            let e = Input::parse(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
        assert_eq!(default_inputs().len(), 7);
    }

    fn sample() -> Report {
        let base = Row {
            input: "R-MAT scale 10, 8/row".into(),
            product: "A x A",
            rows: 1024,
            nnz_a: 8000,
            products: 2_000_000,
            nnz_c: 1_500_000,
            method: "cuSPARSE".into(),
            median_ms: 1.5,
            runs: 5,
            gflops: 2.7,
            peak_bytes: 3 << 30,
            detail_bytes: vec![],
            failure: None,
            skipped: None,
        };
        Report {
            device: "a GPU".into(),
            rows: vec![
                Row {
                    failure: Some("wrong result: row 3".into()),
                    ..base.clone()
                },
                Row {
                    method: Method::CUHEAP.name(),
                    median_ms: 0.8,
                    peak_bytes: 1 << 30,
                    ..base.clone()
                },
                Row {
                    method: Method::Cuheap { chunk: 0 }.name(),
                    failure: Some("error: heap ran out".into()),
                    ..base.clone()
                },
                Row {
                    method: Method::CudaMalloc.name(),
                    runs: 0,
                    skipped: Some("skipped: over 262144 rows".into()),
                    ..base
                },
            ],
        }
    }

    #[test]
    fn failures_are_shown_and_only_ours_fail_the_command() {
        let r = sample();
        let t = table(&r);
        assert!(t.contains("**wrong result: row 3**"));
        assert!(t.contains("| exact |"));
        assert!(t.contains("skipped: over 262144 rows"));
        let f = r.failures();
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].contains("per row") && f[0].contains("heap ran out"));
    }

    #[test]
    fn charts_leave_out_failed_and_skipped_methods() {
        let (time, memory) = svgs(&sample());
        for svg in [&time, &memory] {
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert_eq!(
                svg.matches("<rect x=").count() - 4,
                1,
                "one bar: the one clean run"
            );
        }
        assert!(time.contains("0.8000 ms"));
        assert!(memory.contains("1.0000 GiB"));
    }
}
