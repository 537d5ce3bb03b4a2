//! Helpers shared by the GPU tests.
#![allow(dead_code)]

use cuheap::host::DeviceMemory;
use cuheap::{DeviceHeap, Gpu};

pub fn gpu() -> Gpu {
    cuheap::open_gpu().expect("these tests need an NVIDIA GPU")
}

pub struct Bufs {
    pub ptrs: DeviceMemory,
    pub errors: DeviceMemory,
}

impl Bufs {
    pub fn new(gpu: &Gpu, n: u32) -> Bufs {
        Bufs {
            ptrs: gpu.alloc_zeroed(n as usize * 8).unwrap(),
            errors: gpu.alloc_zeroed(8).unwrap(),
        }
    }

    /// `[nulls, damaged]`, then reset.
    pub fn take_errors(&self) -> [u32; 2] {
        let mut e = [0u32; 2];
        self.errors.read(0, &mut e).unwrap();
        self.errors.zero().unwrap();
        e
    }

    pub fn ptrs(&self, n: u32) -> Vec<u64> {
        let mut v = vec![0u64; n as usize];
        self.ptrs.read(0, &mut v).unwrap();
        v
    }
}

pub fn alloc(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32, sz: u32) {
    // SAFETY: matches alloc_cuheap(meta, data, pages, slots, n, sz, ptrs, errors).
    unsafe {
        gpu.launch("alloc_cuheap", n)
            .unwrap()
            .heap(&heap.handle())
            .u32(n)
            .u32(sz)
            .u64(b.ptrs.ptr())
            .u64(b.errors.ptr())
            .run()
            .unwrap()
    };
    gpu.sync().unwrap();
}

pub fn fill_check(gpu: &Gpu, b: &Bufs, n: u32, sz: u32) {
    cuheap::bench::device::fill_and_check(gpu, &b.ptrs, &b.errors, n, sz, true).unwrap();
    gpu.sync().unwrap();
}

pub fn free(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32) {
    // SAFETY: matches free_cuheap(meta, data, pages, slots, n, ptrs).
    unsafe {
        gpu.launch("free_cuheap", n)
            .unwrap()
            .heap(&heap.handle())
            .u32(n)
            .u64(b.ptrs.ptr())
            .run()
            .unwrap()
    };
    gpu.sync().unwrap();
}

pub fn pair(gpu: &Gpu, heap: &DeviceHeap, b: &Bufs, n: u32, sz: u32) {
    // SAFETY: matches pair_cuheap(meta, data, pages, slots, n, sz, errors).
    unsafe {
        gpu.launch("pair_cuheap", n)
            .unwrap()
            .heap(&heap.handle())
            .u32(n)
            .u32(sz)
            .u64(b.errors.ptr())
            .run()
            .unwrap()
    };
    gpu.sync().unwrap();
}
