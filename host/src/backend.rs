//! What the pool needs from a device, as one small trait: address space,
//! physical memory mapped into it, and stream ordering with events.
//!
//! [`crate::driver::CudaBackend`] implements it on the CUDA driver (the
//! only code that touches the raw bindings); [`HostBackend`] implements
//! it in host memory, with unmapped ranges poisoned, so the pool's logic
//! (caches, cross-stream hand-off, growth, trim, out of memory,
//! statistics) is tested on machines without a GPU.

use crate::error::Result;

pub mod host_memory;

pub use host_memory::{HostBackend, HostStream};

/// The device operations behind a [`Pool`](crate::Pool).
///
/// Requirements on implementations:
/// - addresses are `u64` device addresses; the pool never dereferences
///   them on the host;
/// - [`Backend::map`] makes `bytes` at `at` usable by work enqueued after
///   it returns, and [`Backend::unmap`] makes them unusable;
/// - an event recorded on a stream completes when the work enqueued on
///   that stream before the record completes; a stream that waits on it
///   runs nothing enqueued after the wait before that.
pub trait Backend: Send + Sync + 'static {
    /// A stream handle; a clone keeps the stream alive.
    type Stream: Clone + Send + Sync + 'static;
    /// A reusable event (recording again does not disturb earlier waits).
    type Event: Send + Sync + 'static;
    /// Physical memory behind one mapped chunk; released on drop.
    type Memory: Send + Sync + 'static;
    /// What another process needs to import one piece of memory (on the
    /// CUDA driver, a POSIX file descriptor).
    type Shared: Send + Sync + 'static;

    /// A number that identifies `stream` while it lives.
    fn stream_id(stream: &Self::Stream) -> usize;

    /// True when `stream` is the last handle to its stream: no one else
    /// can enqueue work on it any more, so a cache kept for it can go.
    fn is_last_handle(stream: &Self::Stream) -> bool;

    /// The mapping granularity: chunk sizes and reservations are
    /// multiples of it.
    fn granularity(&self) -> Result<usize>;

    /// Reserves `bytes` of address space aligned to `align`; maps nothing.
    fn reserve(&self, bytes: usize, align: usize) -> Result<u64>;

    /// Returns a reservation.
    ///
    /// # Safety
    ///
    /// `base..base + bytes` came from [`Backend::reserve`] and nothing is
    /// mapped in it any more.
    unsafe fn unreserve(&self, base: u64, bytes: usize);

    /// Creates `bytes` of physical memory. Out of device memory is
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory).
    fn create(&self, bytes: usize) -> Result<Self::Memory>;

    /// Maps `memory` (exactly `bytes` long) at `at`.
    ///
    /// # Safety
    ///
    /// `at..at + bytes` lies inside one reservation and is not mapped.
    unsafe fn map(&self, at: u64, bytes: usize, memory: &Self::Memory) -> Result<()>;

    /// The device whose memory this backend creates (a CUDA ordinal).
    fn device(&self) -> i32;

    /// Ok when kernels on device `peer` can be granted access to this
    /// backend's memory; otherwise an
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) that says
    /// why (no such device, or no peer path between the two).
    fn check_peer(&self, peer: i32) -> Result<()>;

    /// Grants read and write access to a mapped range to the backend's
    /// own device and to each device of `peers` (each checked by
    /// [`Backend::check_peer`]), in one call.
    ///
    /// # Safety
    ///
    /// `at..at + bytes` is whole mappings ([`Backend::map`] calls), one
    /// after another with no gap.
    unsafe fn set_access(&self, at: u64, bytes: usize, peers: &[i32]) -> Result<()>;

    /// Takes device `peer`'s access to a mapped range away (the own
    /// device keeps its access).
    ///
    /// # Safety
    ///
    /// `at..at + bytes` was mapped by one [`Backend::map`] call, and no
    /// work on `peer`, queued or running, uses it.
    unsafe fn revoke_access(&self, at: u64, bytes: usize, peer: i32) -> Result<()>;

    /// Unmaps a range (its memory is released when dropped).
    ///
    /// # Safety
    ///
    /// `at..at + bytes` was mapped by one [`Backend::map`] call and no work,
    /// queued or running, uses it.
    unsafe fn unmap(&self, at: u64, bytes: usize) -> Result<()>;

    /// Copies `src` to device address `dst` after the work enqueued on
    /// `stream` so far; returns when the copy is done, so `src` may be
    /// reused (pinned or not).
    ///
    /// # Safety
    ///
    /// `dst..dst + src.len()` is mapped memory that nothing else writes or
    /// reads concurrently, in stream order.
    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: &Self::Stream) -> Result<()>;

    /// Copies device address `src` to `dst` once the work enqueued on
    /// `stream` so far is done; returns when the bytes are in `dst`.
    ///
    /// # Safety
    ///
    /// `src..src + dst.len()` is mapped memory that nothing writes
    /// concurrently, in stream order.
    unsafe fn copy_from_device(
        &self,
        dst: &mut [u8],
        src: u64,
        stream: &Self::Stream,
    ) -> Result<()>;

    /// Whether [`Backend::create`] makes memory that
    /// [`Backend::share`] can hand to another process.
    fn shares(&self) -> bool;

    /// A handle to `memory` that another process can import
    /// ([`Backend::import`]); it keeps the memory alive while it lives.
    /// Memory of a backend that does not share is an error that says so.
    fn share(&self, memory: &Self::Memory) -> Result<Self::Shared>;

    /// Memory that another process shared: `bytes` long, as it was
    /// created there. Map it as memory of one's own.
    fn import(&self, shared: &Self::Shared, bytes: usize) -> Result<Self::Memory>;

    /// Whether `stream` is being captured into a graph now (work
    /// enqueued on it is recorded, not run).
    fn is_capturing(&self, stream: &Self::Stream) -> Result<bool>;

    /// The capture `stream` is in now, if any: an id no other capture
    /// of the process has (so a new capture on the same stream has
    /// another).
    fn capture_id(&self, stream: &Self::Stream) -> Result<Option<u64>>;

    /// Bytes of device memory free now (for error messages).
    fn free_memory(&self) -> usize;

    fn new_event(&self) -> Result<Self::Event>;

    /// Records the work enqueued on `stream` so far into `event`.
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;

    /// Makes `stream` wait, on the device, for the work `event` recorded.
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;

    /// Blocks the host until the work `event` recorded is done.
    fn synchronize(&self, event: &Self::Event) -> Result<()>;

    /// Whether the work `event` recorded is done, without waiting (an
    /// event never recorded is done).
    fn query(&self, event: &Self::Event) -> Result<bool>;

    /// Blocks the host until all work on the device is done.
    fn synchronize_device(&self) -> Result<()>;
}
