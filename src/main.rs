//! The `cuheap` command line: device information, benchmarks, demos.

use clap::{Parser, Subcommand};
use cuheap::bench::{cpu, device, growth, host, report};
use std::path::PathBuf;
use std::process::ExitCode;

const MIB: f64 = (1u64 << 20) as f64;

#[derive(Parser)]
#[command(
    name = "cuheap",
    version,
    about = "A GPU memory allocator: in-kernel heap and host pool"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The GPU, driver, CUDA version and the embedded PTX's functions and kernels.
    Info,
    /// Writes cuheap's device functions as PTX for the CUDA toolkit that
    /// will link them into a CUDA C++ program (see include/cuheap.h and
    /// examples/cuda-cpp/).
    DeviceLib {
        /// The GPU architecture, sm_80 or newer.
        #[arg(long, default_value = "sm_90")]
        arch: String,
        /// The PTX ISA of the linking toolkit (e.g. 9.0 for CUDA 13.0).
        #[arg(long, conflicts_with = "cuda")]
        ptx_isa: Option<String>,
        /// The linking toolkit's release (e.g. 12.8, or 13.0.48), for its
        /// PTX ISA.
        #[arg(long, default_value = "13.0")]
        cuda: String,
        /// Output file.
        #[arg(short, long, default_value = "cuheap_device.ptx")]
        output: PathBuf,
    },
    /// Demonstrations on real workloads.
    #[command(subcommand)]
    Demo(Demo),
    /// Replays an alloc/free trace in RAPIDS RMM's CSV format
    /// (`Thread,Time,Action,Pointer,Size,Stream`) against the cuheap pool
    /// and cudaMallocAsync.
    Replay {
        trace: PathBuf,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Draws a pool's memory as an HTML page: the address range page by
    /// page, coloured by what holds each page, and, for a replayed trace,
    /// memory over the calls. Reads a snapshot (JSON of
    /// `Pool::snapshot().to_json()`, or of this command's `--json`), or
    /// replays a trace in RAPIDS RMM's CSV format and draws the pool at
    /// the trace's peak.
    Snapshot {
        /// A snapshot or picture in JSON.
        #[arg(required_unless_present = "replay", conflicts_with = "replay")]
        input: Option<PathBuf>,
        /// Replay this trace instead, on a model of the pool in host
        /// memory (the same placement code; no GPU needed), or on the GPU
        /// with `--gpu`.
        #[arg(long)]
        replay: Option<PathBuf>,
        /// Replay on the cuheap pool on the GPU.
        #[arg(long, requires = "replay")]
        gpu: bool,
        /// Points of the timeline.
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// The HTML page.
        #[arg(short, long, default_value = "snapshot.html")]
        output: PathBuf,
        /// Also write the picture (snapshot and timeline) as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also write the page grid alone as SVG here.
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Benchmarks: `cpu` (any machine), `device` (in-kernel allocation and
    /// the heap's growth), `growth` (only the growth cases of `device`),
    /// `host` (the host pool against CUDA's allocators), or all.
    Bench {
        #[arg(value_enum, default_value = "all")]
        which: Which,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write a chart (SVG) of the device results here; the host results
        /// go beside it as `<name>-host.svg`.
        #[arg(long)]
        chart: Option<PathBuf>,
        /// Timed runs per case (the median is reported).
        #[arg(long, default_value_t = 7)]
        reps: usize,
        /// Only the given thread counts (e.g. --threads 1048576).
        #[arg(long, value_delimiter = ',')]
        threads: Option<Vec<u32>>,
        /// Only the given sizes in bytes, 0 for mixed (e.g. --sizes 16,64).
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<u32>>,
        /// Skip CUDA's device malloc (it takes most of the run time).
        #[arg(long)]
        no_cuda: bool,
        /// Benchmark the kernels of this PTX file instead of the embedded
        /// `BENCH_PTX` (e.g. `cuheap_bench.ptx` of a build with other settings).
        /// Its `free_cuheap` gets this build's register cap (40) unless its
        /// header has a `.maxnreg` or `CUHEAP_MAX_REGISTERS` is set.
        #[arg(long)]
        ptx: Option<PathBuf>,
        /// The device benchmark's heap looks at far SMs' lists before it
        /// takes a fresh page (`DeviceHeap::set_far_lists`).
        #[arg(long)]
        far_lists: bool,
    },
}

#[derive(Subcommand)]
enum Demo {
    /// Sparse matrix products C = A x B whose rows are allocated in the
    /// kernel, against cuSPARSE, a two-pass kernel and CUDA's device malloc;
    /// every result checked against the CPU reference.
    Spgemm {
        /// Inputs: rmat:SCALE:EDGES, stencil2d:N, stencil3d:N,
        /// banded:N:HALF, uniform:N:K, mtx:PATH; `:t` after one for A x A^T.
        #[arg(long, value_delimiter = ',')]
        inputs: Option<Vec<String>>,
        /// Timed runs per method (the median is reported).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Write the results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write the time chart (SVG) here, and the memory chart beside it
        /// as `<name>-memory.svg`.
        #[arg(long)]
        chart: Option<PathBuf>,
        /// Skip CUDA's device malloc.
        #[arg(long)]
        no_malloc: bool,
        /// Run CUDA's device malloc only on inputs with at most this many
        /// rows (it takes minutes on millions of rows).
        #[arg(long, default_value_t = 1 << 18)]
        malloc_max_rows: usize,
        /// Skip cuSPARSE.
        #[arg(long)]
        no_cusparse: bool,
        /// Chunk sizes in KiB of the one-pass method in chunks (1 to
        /// 65536), each run as a method of its own.
        #[arg(long, value_delimiter = ',',
              default_values_t = [cuheap::spgemm::gpu::Method::DEFAULT_CHUNK >> 10])]
        chunks: Vec<u32>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum, PartialEq, Eq)]
enum Which {
    All,
    Cpu,
    Device,
    /// Only the growth cases of `device`.
    Growth,
    Host,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cuheap: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Info => info(),
        Command::DeviceLib {
            arch,
            ptx_isa,
            cuda,
            output,
        } => {
            let isa = match ptx_isa {
                Some(isa) => isa,
                None => {
                    // MAJOR.MINOR, or a full version such as CMake's 13.0.48.
                    let mut parts = cuda.split('.').map(str::parse::<u32>);
                    let (a, b) = match (parts.next(), parts.next()) {
                        (Some(Ok(a)), Some(Ok(b))) => (a, b),
                        _ => {
                            return Err(format!("--cuda {cuda}: use MAJOR.MINOR, e.g. 13.0").into())
                        }
                    };
                    cuheap::ptx_isa_of_cuda(a, b)
                        .ok_or_else(|| {
                            format!("CUDA {cuda}: its PTX ISA is not known here; pass --ptx-isa")
                        })?
                        .to_string()
                }
            };
            std::fs::write(&output, cuheap::device_ptx(&arch, &isa)?)?;
            println!(
                "{}: cuheap's device functions, PTX ISA {isa}, {arch}",
                output.display()
            );
            Ok(())
        }
        Command::Demo(Demo::Spgemm {
            inputs,
            reps,
            json,
            chart,
            no_malloc,
            malloc_max_rows,
            no_cusparse,
            chunks,
        }) => {
            use cuheap::bench::spgemm as demo;
            if let Some(bad) = chunks.iter().find(|&&k| !(1..=65536).contains(&k)) {
                return Err(format!("--chunks {bad}: use 1 to 65536 KiB").into());
            }
            // Each size once: the table and the charts name methods by it.
            let mut chunks = chunks;
            let mut seen = std::collections::HashSet::new();
            chunks.retain(|k| seen.insert(*k));
            let mut cfg = demo::Config {
                reps: reps.max(1),
                cusparse: !no_cusparse,
                malloc: !no_malloc,
                malloc_max_rows,
                chunks: chunks.iter().map(|k| k << 10).collect(),
                ..demo::Config::default()
            };
            if let Some(list) = inputs {
                cfg.inputs = list
                    .iter()
                    .map(|s| demo::Input::parse(s))
                    .collect::<Result<_, _>>()?;
            }
            let gpu = cuheap::spgemm::gpu::open_gpu()?;
            let bar = indicatif::ProgressBar::new(cfg.rows_planned() as u64).with_style(
                indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} rows {msg}")?,
            );
            bar.enable_steady_tick(std::time::Duration::from_millis(200));
            let t0 = std::time::Instant::now();
            let r = demo::run(&gpu, &cfg, |step, rows| {
                // The log (stderr) keeps every step, with the time so far,
                // above the bar (which draws on stderr only on a terminal).
                bar.suspend(|| eprintln!("[{:7.1} s] {step}", t0.elapsed().as_secs_f64()));
                bar.set_position(rows as u64);
                bar.set_message(step.to_string())
            })?;
            bar.finish_and_clear();
            println!("## Sparse matrix products (SpGEMM)\n");
            println!("{}", demo::table(&r));
            if let Some(path) = json {
                std::fs::write(path, serde_json::to_string_pretty(&r)?)?;
            }
            if let Some(path) = chart {
                let (time, memory) = demo::svgs(&r);
                let mem_path = path.with_file_name(format!(
                    "{}-memory.svg",
                    path.file_stem().and_then(|s| s.to_str()).unwrap_or("chart")
                ));
                std::fs::write(&path, time)?;
                std::fs::write(mem_path, memory)?;
            }
            let failures = r.failures();
            if !failures.is_empty() {
                return Err(format!("cuheap methods failed:\n  {}", failures.join("\n  ")).into());
            }
            Ok(())
        }
        Command::Replay { trace, json } => {
            let text = std::fs::read_to_string(&trace)?;
            let events = cuheap::host::read_trace(&text)?;
            let gpu = cuheap::open_gpu()?;
            let rows = cuheap::bench::replay::run(&gpu, &events)?;
            println!("{} events from {}\n", events.len(), trace.display());
            println!("{}", cuheap::bench::replay::table(&rows));
            if let Some(path) = json {
                std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
            }
            Ok(())
        }
        Command::Snapshot {
            input,
            replay,
            gpu,
            samples,
            output,
            json,
            svg,
        } => {
            let picture = match (input, replay) {
                (Some(path), _) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                    cuheap::host::Picture::from_json(&text)
                        .map_err(|e| format!("{}: {e}", path.display()))?
                }
                (None, Some(trace)) => cuheap::bench::snapshot::replay(&trace, gpu, samples)?,
                (None, None) => unreachable!("clap requires one"),
            };
            let s = &picture.snapshot;
            let (live, held, free) = s.page_bytes();
            println!(
                "{}: blocks in use {:.1} MiB, {:.1} MiB mapped in {} mappings; pages holding live blocks {:.1} MiB, only cached or returning {:.1} MiB, free {:.1} MiB",
                picture.title,
                s.in_use as f64 / MIB,
                s.mapped as f64 / MIB,
                s.mappings.len(),
                live as f64 / MIB,
                held as f64 / MIB,
                free as f64 / MIB
            );
            std::fs::write(&output, picture.html())?;
            println!("wrote {}", output.display());
            if let Some(path) = json {
                std::fs::write(path, picture.to_json())?;
            }
            if let Some(path) = svg {
                std::fs::write(path, s.svg())?;
            }
            Ok(())
        }
        Command::Bench {
            which,
            json,
            chart,
            reps,
            threads,
            sizes,
            ptx,
            no_cuda,
            far_lists,
        } => {
            let mut out = serde_json::Map::new();
            // Rows with failed allocations, frees or errors: shown in the
            // tables and the JSON, then reported as the command's failure.
            let mut failures: Vec<String> = Vec::new();
            if which == Which::All || which == Which::Cpu {
                println!("## Host threads on cuheap-core\n");
                let rows = cpu::run(2_000_000);
                println!("{}", cpu::table(&rows));
                let n = cpu::failures(&rows);
                if n > 0 {
                    failures.push(format!("cpu: {n} allocations or frees failed"));
                }
                out.insert("cpu".into(), serde_json::to_value(&rows)?);
            }
            if matches!(which, Which::All | Which::Device | Which::Growth) {
                let opened = match &ptx {
                    Some(path) => cuheap::open_ptx(&std::fs::read_to_string(path)?),
                    None => cuheap::open_bench_gpu(),
                };
                match opened {
                    Ok(gpu) => {
                        let mut cfg = device::Config {
                            reps: reps.max(1),
                            ..device::Config::default()
                        };
                        if let Some(t) = threads {
                            cfg.threads = t;
                        }
                        if let Some(s) = sizes {
                            cfg.sizes = s;
                        }
                        cfg.cuda = !no_cuda;
                        cfg.far_lists = far_lists;
                        if let Some(path) = &ptx {
                            println!("kernels from {}", path.display());
                        }
                        println!(
                            "registers per thread: pair_cuheap {}, alloc_cuheap {}, free_cuheap {}",
                            gpu.registers("pair_cuheap")?,
                            gpu.registers("alloc_cuheap")?,
                            gpu.registers("free_cuheap")?
                        );
                        let bar = indicatif::ProgressBar::new_spinner();
                        bar.enable_steady_tick(std::time::Duration::from_millis(200));
                        if which != Which::Growth {
                            let r =
                                device::run(&gpu, &cfg, |step| bar.set_message(step.to_string()))?;
                            bar.suspend(|| {
                                println!("## In-kernel allocation\n");
                                println!("{}", report::device_table(&r));
                            });
                            failures.extend(r.failures());
                            if let Some(path) = &chart {
                                std::fs::write(path, report::device_svg(&r))?;
                            }
                            out.insert("device".into(), serde_json::to_value(&r)?);
                        }
                        let g = growth::run(&gpu, cfg.reps, |step| {
                            if bar.is_hidden() {
                                eprintln!("{step}");
                            }
                            bar.set_message(step.to_string())
                        })?;
                        bar.finish_and_clear();
                        println!("## Growth of the device heap\n");
                        println!("device: {}; median of runs; CUDA events around one launch (host wall time for growth between launches)\n", gpu.info().name);
                        println!("{}", g.table());
                        failures.extend(g.failures());
                        out.insert("growth".into(), serde_json::to_value(&g)?);
                    }
                    Err(e @ (cuheap::Error::NoDriver | cuheap::Error::NoDevice(_)))
                        if which == Which::All =>
                    {
                        println!("GPU benchmarks skipped: {e}");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if which == Which::All || which == Which::Host {
                match cuheap::open_bench_gpu() {
                    Ok(gpu) => {
                        let bar = indicatif::ProgressBar::new_spinner();
                        bar.enable_steady_tick(std::time::Duration::from_millis(200));
                        let r = host::run(&gpu, |step| bar.set_message(step.to_string()))?;
                        bar.finish_and_clear();
                        println!("## Host pool\n");
                        println!("{}", host::table(&r));
                        let n = host::failures(&r);
                        if n > 0 {
                            failures.push(format!("host: {n} allocations or frees failed"));
                        }
                        if let Some(path) = &chart {
                            let host_chart = path.with_file_name(format!(
                                "{}-host.svg",
                                path.file_stem().and_then(|s| s.to_str()).unwrap_or("chart")
                            ));
                            std::fs::write(host_chart, host::svg(&r))?;
                        }
                        out.insert("host".into(), serde_json::to_value(&r)?);
                    }
                    Err(e @ (cuheap::Error::NoDriver | cuheap::Error::NoDevice(_)))
                        if which == Which::All =>
                    {
                        println!("host-pool benchmarks skipped: {e}");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if let Some(path) = json {
                std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
            }
            if !failures.is_empty() {
                return Err(format!(
                    "{} benchmark parts had failures (the figures count only completed work):\n  {}",
                    failures.len(),
                    failures.join("\n  ")
                )
                .into());
            }
            Ok(())
        }
    }
}

fn info() -> Result<(), Box<dyn std::error::Error>> {
    println!("cuheap {}", env!("CARGO_PKG_VERSION"));
    println!("embedded PTX: target {}", cuheap::PTX_ARCH);
    println!(
        "device functions for CUDA C/C++ (cuheap::PTX): {}",
        cuheap::exported_functions().join(", ")
    );
    println!(
        "benchmark and test kernels (cuheap::BENCH_PTX), {}: {}",
        cuheap::kernel_names().len(),
        cuheap::kernel_names().join(", ")
    );
    match cuheap::open_gpu() {
        Ok(gpu) => {
            let i = gpu.info();
            let (free, total) = gpu.mem_info()?;
            println!(
                "GPU 0: {} (compute capability {}.{}, {} SMs)",
                i.name, i.compute_capability.0, i.compute_capability.1, i.sms
            );
            println!(
                "memory: {:.1} GiB total, {:.1} GiB free",
                total as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64
            );
            println!(
                "driver supports CUDA {}.{}",
                i.driver_cuda_version / 1000,
                i.driver_cuda_version % 1000 / 10
            );
            Ok(())
        }
        Err(e @ (cuheap::Error::NoDriver | cuheap::Error::NoDevice(_))) => {
            println!("{e}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}
