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

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace in a file of its own under the system's temporary folder
    /// (removed at the end).
    struct TraceFile(std::path::PathBuf);

    impl TraceFile {
        fn new(name: &str, rows: &str) -> TraceFile {
            let path =
                std::env::temp_dir().join(format!("cuheap-{}-{name}.csv", std::process::id()));
            std::fs::write(
                &path,
                format!("Thread,Time,Action,Pointer,Size,Stream\n{rows}"),
            )
            .unwrap();
            TraceFile(path)
        }
    }

    impl Drop for TraceFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// What `cuheap snapshot --replay` draws, on the host model: the
    /// pool at the trace's peak (the blocks live then, on their
    /// streams), a timeline whose highest sample is that peak, and a
    /// page, an SVG and JSON that reads back as the same picture.
    #[test]
    fn a_replayed_trace_is_drawn_at_its_peak() {
        const MIB: usize = 1 << 20;
        let mut rows = String::new();
        // Stream 1: 24 blocks of 1 MiB live at once; stream 2: a 4 KiB
        // block after each, freed at once; then all of stream 1 freed
        // and a last small block.
        for i in 0..24u64 {
            rows += &format!(
                "1,t,allocate,{:#x},{},0x1\n",
                0x1000_0000 + i * 0x10_0000,
                MIB
            );
            rows += &format!("2,t,allocate,{:#x},4096,0x2\n", 0x9000_0000u64 + i * 0x1000);
            rows += &format!("2,t,free,{:#x},4096,0x2\n", 0x9000_0000u64 + i * 0x1000);
        }
        for i in 0..24u64 {
            rows += &format!("1,t,free,{:#x},{},0x1\n", 0x1000_0000 + i * 0x10_0000, MIB);
        }
        rows += "1,t,allocate,0x5000,256,0x1\n";
        let trace = TraceFile::new("peak", &rows);
        let picture = replay(&trace.0, false, 16).unwrap();
        let calls = 24 * 3 + 24 + 1;
        assert!(
            picture.title.contains(&format!("{calls} calls")),
            "{}",
            picture.title
        );
        let s = &picture.snapshot;
        // The peak: stream 1's 24 MiB and stream 2's last 4 KiB block.
        assert_eq!(s.in_use, 24 * MIB + 4096);
        assert!(s.mapped >= 24 * MIB);
        let timeline = picture.timeline.as_ref().unwrap();
        assert!(!timeline.samples.is_empty() && timeline.samples.len() <= 17);
        let top = timeline.samples.iter().map(|x| x.requested).max().unwrap();
        assert_eq!(top, 24 * MIB + 4096, "the most asked for at once");
        assert_eq!(timeline.samples.last().unwrap().call, calls);
        let html = picture.html();
        assert!(
            html.contains("<html") && html.contains("<svg"),
            "a page with its grid"
        );
        assert!(s.svg().starts_with("<svg"));
        let back = Picture::from_json(&picture.to_json()).unwrap();
        assert_eq!(back, picture);
    }

    /// A trace that cannot be replayed is an error that says why, not a
    /// panic: no file, a malformed row, a size no pool serves.
    #[test]
    fn a_bad_trace_is_an_error() {
        let missing = std::env::temp_dir().join("cuheap-no-such-trace.csv");
        let e = replay(&missing, false, 16).unwrap_err();
        assert!(e.to_string().contains("cuheap-no-such-trace.csv"), "{e}");
        let bad = TraceFile::new("bad", "1,t,grab,0x1,1,0\n");
        let e = replay(&bad.0, false, 16).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let huge = TraceFile::new(
            "huge",
            "1,t,allocate,0x1000,18446744073709551615,0\n1,t,allocate,0x2000,18446744073709551615,0\n",
        );
        let e = replay(&huge.0, false, 16).unwrap_err();
        assert!(e.to_string().contains("out of memory"), "{e}");
    }
}
