//! Events for cross-stream reuse, pooled: created once, recorded again and
//! again (a wait enqueued on a stream keeps the record it saw, so
//! re-recording an event never disturbs earlier waits).

use crate::backend::Backend;
use crate::error::Result;
use std::sync::Mutex;

/// Reusable events of one backend.
pub struct EventPool<B: Backend> {
    free: Mutex<Vec<B::Event>>,
}

impl<B: Backend> Default for EventPool<B> {
    fn default() -> Self {
        EventPool {
            free: Mutex::new(Vec::new()),
        }
    }
}

impl<B: Backend> EventPool<B> {
    /// A pooled event, or a new one.
    pub fn get(&self, backend: &B) -> Result<B::Event> {
        match self.free.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(e) => Ok(e),
            None => backend.new_event(),
        }
    }

    pub fn put(&self, e: B::Event) {
        self.free.lock().unwrap_or_else(|p| p.into_inner()).push(e);
    }
}
