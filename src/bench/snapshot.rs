//! `cuheap snapshot --replay TRACE`: a trace replayed on a pool, drawn at
//! its peak with memory over the calls.

use crate::host::{read_trace, HostBackend, HostStream, Picture, Pool, PoolConfig};
use crate::{Error, Result};
use std::path::Path;

/// Address space for a replay: the most a replayed pool can map.
const RESERVE: usize = 128 << 30;
/// The driver's mapping granularity on current GPUs, for the host model.
const GRANULE: usize = 2 << 20;

/// Replays the trace at `path` on a fresh pool (the host model, or the
/// GPU's when `gpu`) and returns its picture: the pool at the trace's
/// peak and `samples` points of memory over the calls.
pub fn replay(path: &Path, gpu: bool, samples: usize) -> Result<Picture> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
    let events = read_trace(&text)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let (timeline, snapshot, on) = if gpu {
        let g = crate::open_gpu()?;
        let reserve = g.info().memory_bytes / 2;
        let pool = Pool::new(g.context(), PoolConfig::new(reserve))?;
        let new_stream = || {
            g.context().new_stream().map_err(|source| Error::Driver {
                what: "cuStreamCreate",
                source,
            })
        };
        let (t, s) = crate::host::snapshot::replay(&pool, new_stream, &events, samples)?;
        (t, s, format!("the pool on {}", g.info().name))
    } else {
        let backend = HostBackend::new(GRANULE, usize::MAX).without_contents();
        let pool = Pool::with_backend(backend, PoolConfig::new(RESERVE))?;
        let (t, s) =
            crate::host::snapshot::replay(&pool, || Ok(HostStream::new()), &events, samples)?;
        (t, s, "the pool's host model".to_string())
    };
    Ok(Picture {
        title: format!(
            "{name}: {} calls replayed on {on}, at the peak",
            events.len()
        ),
        snapshot,
        timeline: Some(timeline),
    })
}
