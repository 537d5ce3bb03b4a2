//! Replays an allocation trace (RAPIDS RMM's CSV format, as `CUHEAP_TRACE`
//! or `cuheap_host::Logged` write it) on the pool over host memory and
//! prints the memory it mapped against the trace's own peak: the pool's
//! placement and caching, studied without a GPU. Work on the streams
//! completes at once here, so cross-stream waits cost nothing.
//!
//! `cargo run --release -p cuheap-host --example replay_model -- TRACE.csv`

use cuheap_host::trace::Action;
use cuheap_host::{read_trace, HostBackend, HostStream, Pool, PoolConfig};
use std::collections::HashMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: replay_model TRACE.csv")?;
    let events = read_trace(&std::fs::read_to_string(&path)?)?;
    let pool = Pool::with_backend(
        HostBackend::new(2 << 20, usize::MAX),
        PoolConfig::new(80 << 30),
    )?;
    let mut streams: HashMap<u64, HostStream> = HashMap::new();
    let mut live: HashMap<u64, (u64, u64, usize)> = HashMap::new();
    let (mut requested, mut peak) = (0usize, 0usize);
    let mut at_peak = pool.stats();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    for e in &events {
        let s = streams.entry(e.stream).or_default();
        match e.action {
            Action::Allocate => {
                let p = pool.alloc(e.size.max(1), s)?;
                if let Some((old, sid, sz)) = live.insert(e.ptr, (p, e.stream, e.size)) {
                    pool.free(old, &streams[&sid])?;
                    requested -= sz;
                }
                requested += e.size;
                if requested > peak {
                    peak = requested;
                    at_peak = pool.stats();
                }
            }
            Action::Free => {
                if let Some((p, _, sz)) = live.remove(&e.ptr) {
                    pool.free(p, s)?;
                    requested -= sz;
                }
            }
            Action::AllocateFailure => {}
        }
    }
    let st = pool.stats();
    println!(
        "{} events, {} streams: peak requested {:.0} MiB; at that peak mapped {:.0} MiB, \
         in use {:.0} MiB, cached {:.0} MiB, fragmentation {:.3}; \
         {:.0} MiB mapped at the end ({:.3}x the peak); {} grows ({} moving free chunks), {} retires, cross-stream reuse {}",
        events.len(),
        streams.len(),
        mib(peak),
        mib(at_peak.reserved),
        mib(at_peak.in_use),
        mib(at_peak.cached()),
        at_peak.fragmentation,
        mib(st.reserved),
        st.reserved as f64 / peak.max(1) as f64,
        st.grows,
        st.moves,
        st.retires,
        st.cross_stream_reuse
    );
    Ok(())
}
