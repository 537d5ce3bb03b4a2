//! [`DeviceBuffer`]: typed, stream-ordered device memory from a pool.

use super::Pool;
use crate::backend::Backend;
use crate::driver::CudaBackend;
use crate::error::{Error, Result};
use std::sync::Arc;

/// `len` values of `T` from a [`Pool`], for use on one stream, freed on
/// that stream when dropped. Copies are ordered on the same stream. A
/// buffer also used on other streams records them
/// ([`record_stream`](Self::record_stream)); its memory is then reused
/// only after the work enqueued on all of them up to the drop.
pub struct DeviceBuffer<T, B: Backend = CudaBackend> {
    ptr: u64,
    len: usize,
    stream: B::Stream,
    /// Other streams the buffer was used on.
    uses: Vec<B::Stream>,
    pool: Arc<Pool<B>>,
    _t: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod, B: Backend> DeviceBuffer<T, B> {
    /// Room for `len` values of `T` on `stream` (contents undefined).
    pub fn new(pool: &Arc<Pool<B>>, len: usize, stream: &B::Stream) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        let ptr = pool.alloc(bytes.max(1), stream)?;
        Ok(DeviceBuffer {
            ptr,
            len,
            stream: stream.clone(),
            uses: Vec::new(),
            pool: pool.clone(),
            _t: std::marker::PhantomData,
        })
    }

    /// A buffer holding a copy of `data`, on `stream`.
    pub fn from_host(pool: &Arc<Pool<B>>, data: &[T], stream: &B::Stream) -> Result<Self> {
        let buf = Self::new(pool, data.len(), stream)?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// Copies `data` into the buffer, after the work enqueued on its
    /// stream so far; returns when the copy is done.
    pub fn copy_from_host(&self, data: &[T]) -> Result<()> {
        self.fits(data.len())?;
        // SAFETY: the buffer holds `len >= data.len()` values of `T` and
        // is alive; the copy is ordered on the buffer's stream.
        unsafe {
            self.pool
                .backend()
                .copy_to_device(self.ptr, bytemuck::cast_slice(data), &self.stream)
        }
    }

    /// Copies the buffer's first `out.len()` values to `out` once the
    /// work enqueued on its stream so far is done; returns when they are
    /// there.
    pub fn copy_to_host(&self, out: &mut [T]) -> Result<()> {
        self.fits(out.len())?;
        // SAFETY: as in `copy_from_host`; any bytes are a valid `T` (Pod).
        unsafe {
            self.pool.backend().copy_from_device(
                bytemuck::cast_slice_mut(out),
                self.ptr,
                &self.stream,
            )
        }
    }

    /// The buffer's contents, read as in [`DeviceBuffer::copy_to_host`].
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    fn fits(&self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(Error::InvalidArgument(format!(
                "copy of {n} values into a buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

impl<T, B: Backend> DeviceBuffer<T, B> {
    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn stream(&self) -> &B::Stream {
        &self.stream
    }

    /// Records that work on `stream` uses the buffer (as PyTorch's
    /// `Tensor.record_stream`): when the buffer is dropped, its memory
    /// goes back to the pool only once the device has finished the work
    /// enqueued by then on its own stream and on every recorded one. The
    /// host never waits for it. Where one of them is being captured into
    /// a graph at the drop, on a pool with
    /// [`PoolConfig::capture_check`](super::PoolConfig::capture_check),
    /// the free waits for the capture to end
    /// ([`Pool::free_after_capture`]). A graph's pool serves one stream:
    /// another is an [`Error::InvalidArgument`] (its free would record an
    /// event into the capture).
    pub fn record_stream(&mut self, stream: &B::Stream) -> Result<()> {
        let id = B::stream_id(stream);
        if id == B::stream_id(&self.stream) || self.uses.iter().any(|s| B::stream_id(s) == id) {
            return Ok(());
        }
        if self.pool.is_graph_pool() {
            return Err(Error::InvalidArgument(format!(
                "record_stream of stream {id:#x} on a buffer of a graph's pool, which serves one \
                 stream: order the other stream's work before the free in the graph instead"
            )));
        }
        self.uses.push(stream.clone());
        Ok(())
    }
}

impl<T, B: Backend> Drop for DeviceBuffer<T, B> {
    fn drop(&mut self) {
        // A buffer is freed once, by construction; an error cannot leave drop.
        if self.uses.is_empty() {
            let _ = self.pool.free(self.ptr, &self.stream);
        } else {
            let streams: Vec<&B::Stream> =
                std::iter::once(&self.stream).chain(&self.uses).collect();
            let _ = self.pool.free_after_capture(self.ptr, &streams);
        }
    }
}
