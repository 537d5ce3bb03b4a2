//! Events for cross-stream reuse, pooled: created once, recorded again and
//! again (a wait enqueued with `cuStreamWaitEvent` keeps the record it saw,
//! so re-recording an event never disturbs earlier waits).

use crate::error::{Context, Result};
use cudarc::driver::sys;
use std::sync::Mutex;

/// One CUDA event (no timing), destroyed on drop.
pub struct Event(sys::CUevent);

// SAFETY: a CUevent may be used from any thread of its context.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    fn new() -> Result<Event> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: out-parameter.
        unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }
            .result()
            .during("cuEventCreate")?;
        Ok(Event(e))
    }

    /// Records the work enqueued on `stream` so far.
    pub(crate) fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: both handles are live.
        unsafe { sys::cuEventRecord(self.0, stream) }
            .result()
            .during("cuEventRecord")
    }

    /// Makes `stream` wait (on the GPU) for the recorded work.
    pub(crate) fn wait_on(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: both handles are live.
        unsafe { sys::cuStreamWaitEvent(stream, self.0, 0) }
            .result()
            .during("cuStreamWaitEvent")
    }

    /// Blocks the host until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live.
        unsafe { sys::cuEventSynchronize(self.0) }
            .result()
            .during("cuEventSynchronize")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}

/// Reusable events.
#[derive(Default)]
pub struct EventPool {
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    pub fn get(&self) -> Result<Event> {
        match self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(e) => Ok(e),
            None => Event::new(),
        }
    }

    pub fn put(&self, e: Event) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
}
