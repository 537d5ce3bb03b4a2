//! The memory behind an in-kernel heap: zeroed metadata and a
//! page-aligned data region from the driver, the handle kernels take, and
//! statistics read back from the device.

use crate::driver::{DeviceMemory, Gpu};
use crate::error::{Error, Result};
use cuheap_core::page::PageDesc;
use cuheap_core::{Counters, HeapHandle, Layout, Stats, PAGE_SIZE};

/// A device heap of `page_count` pages, `slots` current-page slots (one
/// per SM).
pub struct DeviceHeap {
    meta: DeviceMemory,
    // Keeps the data region alive; the handle points into it.
    _data: DeviceMemory,
    handle: HeapHandle,
    layout: Layout,
}

impl DeviceHeap {
    /// A heap with `bytes` of block memory (rounded up to whole 64 KiB
    /// pages) for `gpu`, one slot per SM.
    pub fn new(gpu: &Gpu, bytes: usize) -> Result<DeviceHeap> {
        let pages = bytes.div_ceil(PAGE_SIZE);
        if pages == 0 || pages > u32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(format!("heap of {bytes} bytes")));
        }
        let slots = gpu.info().sms.max(1);
        let layout = Layout::new(pages as u32, slots);
        let meta = gpu.alloc_zeroed(layout.meta_bytes)?;
        let data = gpu.alloc_zeroed(layout.data_bytes() + PAGE_SIZE)?;
        let base = data.ptr().div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        let handle = HeapHandle {
            meta: meta.ptr(),
            data: base,
            page_count: pages as u32,
            slots,
        };
        Ok(DeviceHeap {
            meta,
            _data: data,
            handle,
            layout,
        })
    }

    pub fn handle(&self) -> HeapHandle {
        self.handle
    }

    /// Bytes of block memory.
    pub fn capacity(&self) -> usize {
        self.layout.data_bytes()
    }

    /// Bytes of metadata on the device.
    pub fn meta_bytes(&self) -> usize {
        self.layout.meta_bytes
    }

    /// Empties the heap (no kernel may be using it).
    pub fn reset(&self) -> Result<()> {
        self.meta.zero()
    }

    /// Reads the heap's statistics after a launch (synchronous copy).
    pub fn stats(&self) -> Result<Stats> {
        let n = self.handle.page_count as usize;
        let mut descs: Vec<PageDesc> = (0..n).map(|_| PageDesc::new()).collect();
        let mut counters = [Counters::new()];
        // PageDesc and Counters are #[repr(C)] atomics: the device's bytes
        // are valid values of them.
        self.meta
            .read(self.layout.descs, as_bytes_mut(&mut descs))?;
        self.meta
            .read(self.layout.counters, as_bytes_mut(&mut counters))?;
        Ok(Stats::collect(&descs, &counters[0]))
    }
}

/// The bytes of a slice of plain `#[repr(C)]` atomics, to copy into.
fn as_bytes_mut<T>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: only used with PageDesc and Counters, which are #[repr(C)]
    // structs of integer atomics: every byte pattern is a valid value.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}
