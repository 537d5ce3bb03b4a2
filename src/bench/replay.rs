//! `cuheap replay TRACE`: replays an alloc/free trace in RAPIDS RMM's CSV
//! format (written by [`crate::host::Logged`] or by RMM's logging
//! adaptor) against the cuheap pool and `cudaMallocAsync`, in order, one
//! stream per stream of the trace. Rows of failed allocations are skipped;
//! any error of the allocator under test fails the replay.

use super::host::{async_reserved_high, pct, us, warm_async_pool, Alloc, Async};
use crate::host::trace::Action;
use crate::host::{Pool, PoolConfig, TraceEvent};
use crate::{Error, Gpu, Result};
use cudarc::driver::CudaStream;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug, Serialize)]
pub struct ReplayRow {
    pub allocator: &'static str,
    pub allocs: usize,
    pub frees: usize,
    pub total_ms: f64,
    pub alloc_p50_us: f64,
    pub alloc_p99_us: f64,
    pub free_p50_us: f64,
    pub free_p99_us: f64,
    /// The trace's own peak: bytes requested and not yet freed.
    pub peak_requested_mib: f64,
    /// Device memory the allocator held at its peak.
    pub reserved_mib: f64,
}

fn replay_one(gpu: &Gpu, a: &dyn Alloc, events: &[TraceEvent]) -> Result<ReplayRow> {
    let mut streams: HashMap<u64, Arc<CudaStream>> = HashMap::new();
    // The trace's pointer -> ours, its stream and the trace's size.
    let mut live: HashMap<u64, (u64, u64, usize)> = HashMap::new();
    let (mut ta, mut tf) = (Vec::new(), Vec::new());
    let (mut requested, mut peak) = (0usize, 0usize);
    let start = Instant::now();
    for e in events {
        let s = match streams.get(&e.stream) {
            Some(s) => s.clone(),
            None => {
                let s = gpu.context().new_stream().map_err(|source| Error::Driver {
                    what: "cuStreamCreate",
                    source,
                })?;
                streams.insert(e.stream, s.clone());
                s
            }
        };
        match e.action {
            Action::Allocate => {
                let t = Instant::now();
                let p = a.allocate(e.size.max(1), &s)?;
                ta.push(us(t));
                requested += e.size;
                if let Some((old, sid, size)) = live.insert(e.ptr, (p, e.stream, e.size)) {
                    // The trace reused a pointer it never freed: free ours.
                    requested -= size;
                    a.deallocate(old, streams.get(&sid).unwrap_or(&s))?;
                }
                peak = peak.max(requested);
            }
            Action::Free => {
                if let Some((p, _, size)) = live.remove(&e.ptr) {
                    requested -= size;
                    let t = Instant::now();
                    a.deallocate(p, &s)?;
                    tf.push(us(t));
                }
            }
            Action::AllocateFailure => {}
        }
    }
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    for (_, (p, sid, _)) in live {
        if let Some(s) = streams.get(&sid) {
            a.deallocate(p, s)?;
        }
    }
    for s in streams.values() {
        s.synchronize().map_err(|source| Error::Driver {
            what: "cuStreamSynchronize",
            source,
        })?;
    }
    let q = |v: &mut Vec<f64>, x| if v.is_empty() { f64::NAN } else { pct(v, x) };
    Ok(ReplayRow {
        allocator: a.name(),
        allocs: ta.len(),
        frees: tf.len(),
        total_ms,
        alloc_p50_us: q(&mut ta, 0.5),
        alloc_p99_us: q(&mut ta, 0.99),
        free_p50_us: q(&mut tf, 0.5),
        free_p99_us: q(&mut tf, 0.99),
        peak_requested_mib: peak as f64 / MIB,
        reserved_mib: f64::NAN,
    })
}

const MIB: f64 = (1 << 20) as f64;

/// Replays `events` on a fresh pool and on cudaMallocAsync.
pub fn run(gpu: &Gpu, events: &[TraceEvent]) -> Result<Vec<ReplayRow>> {
    warm_async_pool(gpu)?;
    let pool = Pool::new(gpu.context(), PoolConfig::new(gpu.info().memory_bytes / 2))?;
    let mut ours = replay_one(gpu, &pool, events)?;
    // The pool maps more and never unmaps without a trim: its end is its peak.
    ours.reserved_mib = pool.stats().reserved as f64 / MIB;
    drop(pool);
    async_reserved_high(gpu, true)?;
    let mut theirs = replay_one(gpu, &Async, events)?;
    theirs.reserved_mib = async_reserved_high(gpu, false)? as f64 / MIB;
    Ok(vec![ours, theirs])
}

pub fn table(rows: &[ReplayRow]) -> String {
    let mut s = String::from("| allocator | allocs | frees | total ms | alloc p50 / p99 µs | free p50 / p99 µs | peak requested MiB | reserved MiB |\n|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.2} | {:.3} / {:.3} | {:.3} / {:.3} | {:.0} | {:.0} |\n",
            r.allocator,
            r.allocs,
            r.frees,
            r.total_ms,
            r.alloc_p50_us,
            r.alloc_p99_us,
            r.free_p50_us,
            r.free_p99_us,
            r.peak_requested_mib,
            r.reserved_mib
        );
    }
    s
}
