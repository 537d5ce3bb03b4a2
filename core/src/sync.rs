//! The one place atomics come from. Under `cfg(loom)` the lock-free
//! structures are model-checked with loom's atomics; everywhere else these
//! are `core`'s, which lower to `atom.global.*` (GPU scope) on nvptx64.
//!
//! Call sites always spell the ordering out; the protocol comments on each
//! structure say why that ordering is enough.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Spin-loop hint for retry loops (a no-op on the GPU; yields under loom).
#[inline(always)]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
