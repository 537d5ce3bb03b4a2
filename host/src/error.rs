//! The host crate's error type.

use cudarc::driver::DriverError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no NVIDIA GPU found: the CUDA driver library (libcuda.so) is not installed")]
    NoDriver,
    #[error("no NVIDIA GPU found: the CUDA driver sees no device ({0})")]
    NoDevice(String),
    #[error("CUDA driver error in {what}: {source}")]
    Driver {
        what: &'static str,
        #[source]
        source: DriverError,
    },
    #[error(
        "out of GPU memory: asked for {requested} bytes with {reserved} reserved and {free} free on the device; \
         free buffers or make the heap smaller"
    )]
    OutOfMemory {
        requested: usize,
        reserved: usize,
        free: usize,
    },
    #[error(
        "pool out of memory: asked for {requested} bytes; {reserved} bytes mapped of a {limit}-byte reservation, \
         {in_use} in use, {cached} cached, largest free run {largest_free} bytes; free buffers, call trim(), \
         or create the pool with a larger reservation"
    )]
    PoolExhausted {
        requested: usize,
        reserved: usize,
        in_use: usize,
        cached: usize,
        largest_free: usize,
        limit: usize,
    },
    #[error(
        "a kernel's device heap ran out: {failed} allocations failed ({bytes} bytes short); \
         grow the heap (DeviceHeap::growable, reserve) and run it again"
    )]
    DeviceHeapExhausted { failed: u64, bytes: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("kernel `{0}` is not in the loaded PTX")]
    MissingKernel(String),
}

/// Attaches the name of the failing call to a driver error.
pub trait Context<T> {
    fn during(self, what: &'static str) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, DriverError> {
    fn during(self, what: &'static str) -> Result<T> {
        self.map_err(|source| Error::Driver { what, source })
    }
}
