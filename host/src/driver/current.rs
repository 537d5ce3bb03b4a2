//! The caller's current context, kept: [`KeepContext`] puts back the
//! context a thread had when cuheap's code changed it, and costs no driver
//! call when nothing did.
//!
//! Every place in this crate that may make another context current (a
//! bind, or a cudarc call or drop that binds) calls [`before_bind`] first
//! (once per function is enough: after the first read the guard keeps
//! what it read).
//! The first such call inside a [`KeepContext`] reads the thread's current
//! context; the guard's drop restores it. A call that binds nothing (the
//! pool's cached paths) reads nothing and restores nothing.

use cudarc::driver::sys;
use std::cell::Cell;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keep {
    /// No guard on this thread.
    Off,
    /// A guard, and nothing has bound since it began.
    Armed,
    /// A guard, and the context that was current before the first bind.
    Saved(sys::CUcontext),
}

thread_local! {
    static KEEP: Cell<Keep> = const { Cell::new(Keep::Off) };
}

/// Call before anything that may change this thread's current context:
/// inside a [`KeepContext`], the first call reads the context to put back.
pub fn before_bind() {
    let _ = KEEP.try_with(|keep| {
        if keep.get() == Keep::Armed {
            let mut now: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-parameter. Before `cuInit` it fails and no
            // context can be current: nothing to put back then.
            if unsafe { sys::cuCtxGetCurrent(&mut now) } == sys::CUresult::CUDA_SUCCESS {
                keep.set(Keep::Saved(now));
            }
        }
    });
}

/// While it lives, the context current on this thread when cuheap first
/// binds one is remembered; on drop (a panic's too) it is current again.
/// Guards nest. Only the driver must be loaded before any
/// [`before_bind`] runs under one ([`driver_present`](super::driver_present)).
#[must_use = "the context is restored when the guard drops"]
pub struct KeepContext {
    outer: Keep,
}

impl KeepContext {
    pub fn new() -> KeepContext {
        let outer = KEEP
            .try_with(|k| k.replace(Keep::Armed))
            .unwrap_or(Keep::Off);
        KeepContext { outer }
    }
}

impl Default for KeepContext {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        let Ok(ours) = KEEP.try_with(|k| k.replace(self.outer)) else {
            return;
        };
        if let Keep::Saved(before) = ours {
            let mut now: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-parameter; the driver was initialised when
            // `before` was read.
            let read = unsafe { sys::cuCtxGetCurrent(&mut now) };
            if read != sys::CUresult::CUDA_SUCCESS || now != before {
                // SAFETY: `before` was current on this thread when it was
                // read (null: none was); putting it back is what the caller
                // expects. A failure leaves the thread as the call left it.
                let _ = unsafe { sys::cuCtxSetCurrent(before) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Keep {
        KEEP.with(|k| k.get())
    }

    /// Nesting: each guard restores its outer state, armed or off.
    #[test]
    fn guards_nest_and_unwind() {
        assert_eq!(state(), Keep::Off);
        {
            let _outer = KeepContext::new();
            assert_eq!(state(), Keep::Armed);
            {
                let _inner = KeepContext::new();
                assert_eq!(state(), Keep::Armed);
            }
            assert_eq!(state(), Keep::Armed);
        }
        assert_eq!(state(), Keep::Off);
        let r = std::panic::catch_unwind(|| {
            let _g = KeepContext::new();
            panic!("under a guard");
        });
        assert!(r.is_err());
        assert_eq!(state(), Keep::Off, "a panic leaves the thread unguarded");
    }
}
