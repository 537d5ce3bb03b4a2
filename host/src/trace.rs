//! Allocation traces in RAPIDS RMM's CSV format, so traces move between
//! tools: [`Logged`] wraps any [`Resource`] and writes one row per call
//! (`Thread,Time,Action,Pointer,Size,Stream`, as RMM's
//! `logging_resource_adaptor` does), and [`read_trace`] reads such files,
//! RMM's own included, for `cuheap replay`.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::stream_pool::Pool;
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

/// Something that hands out stream-ordered device memory.
pub trait Resource: Send + Sync {
    type Stream;
    fn allocate(&self, size: usize, stream: &Self::Stream) -> Result<u64>;
    fn deallocate(&self, ptr: u64, stream: &Self::Stream) -> Result<()>;
    /// The number written in a trace's `Stream` column.
    fn stream_id(stream: &Self::Stream) -> usize
    where
        Self: Sized;
}

impl<B: Backend> Resource for Pool<B> {
    type Stream = B::Stream;
    fn allocate(&self, size: usize, stream: &B::Stream) -> Result<u64> {
        self.alloc(size, stream)
    }
    fn deallocate(&self, ptr: u64, stream: &B::Stream) -> Result<()> {
        self.free(ptr, stream)
    }
    fn stream_id(stream: &B::Stream) -> usize {
        B::stream_id(stream)
    }
}

impl<R: Resource> Resource for std::sync::Arc<R> {
    type Stream = R::Stream;
    fn allocate(&self, size: usize, stream: &R::Stream) -> Result<u64> {
        (**self).allocate(size, stream)
    }
    fn deallocate(&self, ptr: u64, stream: &R::Stream) -> Result<()> {
        (**self).deallocate(ptr, stream)
    }
    fn stream_id(stream: &R::Stream) -> usize {
        R::stream_id(stream)
    }
}

/// What a trace row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allocate,
    Free,
    /// An allocation that failed (RMM's `allocate failure`).
    AllocateFailure,
}

impl Action {
    fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => "allocate",
            Action::Free => "free",
            Action::AllocateFailure => "allocate failure",
        }
    }
}

/// One row of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// The calling thread, as the trace names it.
    pub thread: u64,
    /// The time column as written (RMM: `HH:MM:SS.microseconds`).
    pub time: String,
    pub action: Action,
    pub ptr: u64,
    pub size: usize,
    pub stream: u64,
}

/// The header every trace starts with.
pub const COLUMNS: [&str; 6] = ["Thread", "Time", "Action", "Pointer", "Size", "Stream"];

/// A [`Resource`] whose every call is written to a CSV trace.
pub struct Logged<R> {
    inner: R,
    log: TraceLog,
}

/// A CSV trace being written: one row per allocation, failed allocation
/// and free, in the order the calls took effect. [`Logged`] writes one
/// for any [`Resource`]; code with its own entry points (the C API's
/// framework pools) calls it directly.
pub struct TraceLog {
    log: Mutex<Log>,
}

struct Log {
    out: csv::Writer<Box<dyn Write + Send>>,
    /// Sizes of live allocations, for the rows of their frees.
    sizes: HashMap<u64, usize>,
}

thread_local! {
    /// A small number per thread, for the `Thread` column.
    static THREAD: u64 = {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    };
}

/// Wall-clock time of day as RMM's logging adaptor writes it
/// (`%H:%M:%S.%f`: `HH:MM:SS.microseconds`), UTC.
fn time_of_day() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = t.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        t.subsec_micros()
    )
}

impl TraceLog {
    /// A trace written to a new file at `path`.
    pub fn to_file(path: &std::path::Path) -> Result<TraceLog> {
        let file = std::fs::File::create(path)
            .map_err(|e| Error::InvalidArgument(format!("trace {}: {e}", path.display())))?;
        TraceLog::to_writer(Box::new(std::io::BufWriter::new(file)))
    }

    /// A trace written to `out`.
    pub fn to_writer(out: Box<dyn Write + Send>) -> Result<TraceLog> {
        let mut out = csv::Writer::from_writer(out);
        out.write_record(COLUMNS).map_err(trace_error)?;
        Ok(TraceLog {
            log: Mutex::new(Log {
                out,
                sizes: HashMap::new(),
            }),
        })
    }

    /// Makes an allocation of `size` bytes on stream `stream` and writes
    /// its row: the pointer, or a failure. The row is written before any
    /// free of the pointer can be.
    pub fn allocate(
        &self,
        size: usize,
        stream: usize,
        alloc: impl FnOnce() -> Result<u64>,
    ) -> Result<u64> {
        let r = alloc();
        let mut log = self.lock();
        match &r {
            Ok(p) => {
                log.sizes.insert(*p, size);
                log.row(Action::Allocate, *p, size, stream);
            }
            Err(_) => log.row(Action::AllocateFailure, 0, size, stream),
        }
        r
    }

    /// Frees `ptr` on stream `stream` through `free` and writes its row if
    /// the free succeeded. The row goes first: once freed, the pointer may
    /// be handed out again by another thread, whose row must come after.
    pub fn free(&self, ptr: u64, stream: usize, free: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut log = self.lock();
        let size = log.sizes.remove(&ptr);
        let r = free();
        match (&r, size) {
            (Ok(()), size) => log.row(Action::Free, ptr, size.unwrap_or(0), stream),
            (Err(_), Some(size)) => {
                log.sizes.insert(ptr, size);
            }
            (Err(_), None) => {}
        }
        r
    }

    /// Writes buffered rows out.
    pub fn flush(&self) -> Result<()> {
        self.lock()
            .out
            .flush()
            .map_err(|e| Error::InvalidArgument(format!("trace: {e}")))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Log {
    fn row(&mut self, action: Action, ptr: u64, size: usize, stream: usize) {
        let thread = THREAD.with(|t| *t);
        let ptr = if ptr == 0 {
            "(nil)".to_string()
        } else {
            format!("{ptr:#x}")
        };
        // The trace is advisory: a failed write must not fail the call.
        let _ = self.out.write_record([
            thread.to_string(),
            time_of_day(),
            action.as_str().to_string(),
            ptr,
            size.to_string(),
            format!("{stream:#x}"),
        ]);
    }
}

impl Drop for TraceLog {
    fn drop(&mut self) {
        let log = self.log.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = log.out.flush();
    }
}

impl<R: Resource> Logged<R> {
    /// Logs the calls on `inner` to a new file at `path`.
    pub fn to_file(inner: R, path: &std::path::Path) -> Result<Logged<R>> {
        Ok(Logged {
            inner,
            log: TraceLog::to_file(path)?,
        })
    }

    /// Logs the calls on `inner` to `out`.
    pub fn to_writer(inner: R, out: Box<dyn Write + Send>) -> Result<Logged<R>> {
        Ok(Logged {
            inner,
            log: TraceLog::to_writer(out)?,
        })
    }

    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Writes buffered rows out.
    pub fn flush(&self) -> Result<()> {
        self.log.flush()
    }
}

impl<R: Resource> Resource for Logged<R> {
    type Stream = R::Stream;

    fn allocate(&self, size: usize, stream: &R::Stream) -> Result<u64> {
        self.log.allocate(size, R::stream_id(stream), || {
            self.inner.allocate(size, stream)
        })
    }

    fn deallocate(&self, ptr: u64, stream: &R::Stream) -> Result<()> {
        self.log.free(ptr, R::stream_id(stream), || {
            self.inner.deallocate(ptr, stream)
        })
    }

    fn stream_id(stream: &R::Stream) -> usize {
        R::stream_id(stream)
    }
}

fn trace_error(e: csv::Error) -> Error {
    Error::InvalidArgument(format!("trace: {e}"))
}

/// Reads a trace in RMM's format (the columns of [`COLUMNS`], found by
/// name, in any order, extra columns ignored). Pointers are hex (`0x..`)
/// or `(nil)`; threads and streams decimal or hex. A malformed row is an
/// error naming its line and what was wrong.
pub fn read_trace(text: &str) -> Result<Vec<TraceEvent>> {
    let mut rdr = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rdr.headers().map_err(trace_error)?.clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h.eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::InvalidArgument(format!("trace: no `{name}` column")))
    };
    let [thread, time, action, pointer, size, stream] = [
        col(COLUMNS[0])?,
        col(COLUMNS[1])?,
        col(COLUMNS[2])?,
        col(COLUMNS[3])?,
        col(COLUMNS[4])?,
        col(COLUMNS[5])?,
    ];
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(trace_error)?;
        let line = rec.position().map_or(0, |p| p.line());
        let bad = |what: &str, v: &str| {
            Error::InvalidArgument(format!("trace line {line}: {what} `{v}`"))
        };
        let field = |i: usize| rec.get(i).unwrap_or("");
        let number =
            |i: usize, what: &str| parse_number(field(i)).ok_or_else(|| bad(what, field(i)));
        out.push(TraceEvent {
            thread: number(thread, "thread")?,
            time: field(time).to_string(),
            action: match field(action) {
                "allocate" => Action::Allocate,
                "free" => Action::Free,
                "allocate failure" => Action::AllocateFailure,
                v => return Err(bad("action (allocate, free or allocate failure)", v)),
            },
            ptr: match field(pointer) {
                "(nil)" => 0,
                v => u64::from_str_radix(v.trim_start_matches("0x"), 16)
                    .map_err(|_| bad("pointer", v))?,
            },
            size: number(size, "size")? as usize,
            stream: number(stream, "stream")?,
        });
    }
    Ok(out)
}

/// Decimal, or hex with `0x`.
fn parse_number(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rmm_rows_and_says_which_line_is_bad() {
        let t = "Thread,Time,Action,Pointer,Size,Stream\n\
                 140573312345856,10:22:33:123456,allocate,0x7f8a40000000,1024,0x0\n\
                 140573312345856,10:22:33:123460,free,0x7f8a40000000,1024,0\n\
                 7,10:22:33:123470,allocate failure,(nil),99,12\n";
        let e = read_trace(t).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(
            e[0],
            TraceEvent {
                thread: 140573312345856,
                time: "10:22:33:123456".into(),
                action: Action::Allocate,
                ptr: 0x7f8a40000000,
                size: 1024,
                stream: 0,
            }
        );
        assert_eq!(
            (e[1].action, e[2].action, e[2].ptr, e[2].stream),
            (Action::Free, Action::AllocateFailure, 0, 12)
        );
        let err =
            read_trace("Thread,Time,Action,Pointer,Size,Stream\n1,t,grab,0x1,1,0\n").unwrap_err();
        assert!(
            err.to_string().contains("line 2") && err.to_string().contains("grab"),
            "{err}"
        );
        let err =
            read_trace("Thread,Time,Action,Pointer,Size,Stream\n1,t,free,zz,1,0\n").unwrap_err();
        assert!(err.to_string().contains("pointer"), "{err}");
        assert!(read_trace("Thread,Action\n").is_err());
    }
}
