//! The C API's contract from Rust: codes, messages, NULLs, caught panics
//! (any machine), and the pool and heap on a GPU (ignored without one).

use super::*;
use crate::frameworks::*;
use crate::heap::*;
use crate::pool::*;
use std::ffi::{c_void, CStr};
use std::ptr::null_mut;

/// The GPU tests run one at a time: some measure the device's free
/// memory, which another test's pool would change meanwhile.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GPU.lock().unwrap_or_else(|p| p.into_inner())
}

fn last() -> String {
    // SAFETY: a NUL-terminated string owned by this thread.
    unsafe { CStr::from_ptr(cuheap_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_handles_and_out_pointers_are_refused_with_a_message() {
    let mut p: *mut c_void = std::ptr::dangling_mut::<c_void>();
    // SAFETY: NULL handles and valid out pointers.
    unsafe {
        assert_eq!(
            cuheap_pool_alloc(null_mut(), 64, null_mut(), &mut p),
            CUHEAP_ERROR_INVALID
        );
        assert!(p.is_null(), "out is NULL after a failed allocation");
        assert!(
            last().contains("cuheap_pool_alloc: invalid argument: the pool is NULL"),
            "{}",
            last()
        );
        assert_eq!(
            cuheap_pool_free(null_mut(), 16 as *mut c_void, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_release_stream(null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_trim(null_mut(), 0, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_grant_access(null_mut(), 1),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_pool_seal(null_mut()), CUHEAP_ERROR_INVALID);
        assert_eq!(
            cuheap_pool_tie_to_graph(null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_revoke_access(null_mut(), 1),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_snapshot(null_mut(), null_mut(), 0, null_mut(), std::ptr::null()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_export_block(null_mut(), 16 as *const c_void, 0),
            CUHEAP_ERROR_INVALID
        );
        let mut import: *mut CuheapImport = std::ptr::dangling_mut();
        assert_eq!(
            cuheap_import_receive(-1, &mut import, null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert!(import.is_null(), "out is NULL after a failed import");
        assert!(last().contains("socket -1"), "{}", last());
        assert_eq!(
            cuheap_import_receive(0, null_mut(), null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_import_close(null_mut()), CUHEAP_OK);
        let bad_flags = CuheapPoolConfig {
            flags: 12,
            ..Default::default()
        };
        let mut pool: *mut CuheapPool = std::ptr::dangling_mut();
        assert_eq!(
            cuheap_pool_create(&bad_flags, &mut pool),
            CUHEAP_ERROR_INVALID
        );
        assert!(
            pool.is_null() && last().contains("pool flags 0xc"),
            "{}",
            last()
        );
        let mut s = CuheapPoolStats::default();
        assert_eq!(
            cuheap_pool_get_stats(null_mut(), &mut s),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_create(std::ptr::null(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert!(last().contains("out is NULL"), "{}", last());
        assert_eq!(cuheap_pool_destroy(null_mut()), CUHEAP_OK);

        let mut st = CuheapStats::default();
        assert_eq!(
            cuheap_device_heap_get_stats(null_mut(), &mut st),
            CUHEAP_ERROR_INVALID
        );
        assert!(last().contains("the heap is NULL"), "{}", last());
        assert_eq!(
            cuheap_device_heap_grow(null_mut(), 1 << 20, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_trim(null_mut(), 0, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_serve(null_mut(), 0),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_stop_serving(null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_set_growth_piece(null_mut(), 8 << 20, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_trim_on(null_mut(), null_mut(), 0),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_finish_trims(null_mut(), 1, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_capacity(null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_device_heap_desc(null_mut(), null_mut()),
            CUHEAP_ERROR_INVALID
        );
        let mut h = null_mut();
        assert_eq!(
            cuheap_device_heap_create(0, 0, &mut h),
            CUHEAP_ERROR_INVALID
        );
        assert!(last().contains("a heap of 0 bytes"), "{}", last());
        assert_eq!(
            cuheap_device_heap_create(1 << 20, 0, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_device_heap_destroy(null_mut()), CUHEAP_OK);
    }
}

#[test]
fn a_panic_is_caught_and_reported_as_internal() {
    let rc = entry("cuheap_test", || panic!("the invariant broke"));
    assert_eq!(rc, CUHEAP_ERROR_INTERNAL);
    assert_eq!(last(), "cuheap_test: internal error: the invariant broke");
}

/// The hooks' time adds up each timed call, keeps the longest, and a
/// call that was not timed adds nothing; NULL outputs are skipped.
#[test]
fn hook_times_add_up_timed_calls_only() {
    let read = || {
        let (mut calls, mut ns, mut max) = (0u64, 0u64, 0u64);
        // SAFETY: three writable locals.
        let rc = unsafe { cuheap_hook_times(&mut calls, &mut ns, &mut max) };
        assert_eq!(rc, CUHEAP_OK);
        (calls, ns, max)
    };
    let before = read();
    let start = std::time::Instant::now() - std::time::Duration::from_millis(3);
    hook_done(Some(start));
    hook_done(None);
    let after = read();
    assert!(after.0 > before.0, "{before:?} -> {after:?}");
    assert!(after.1 >= before.1 + 3_000_000, "{before:?} -> {after:?}");
    assert!(after.2 >= 3_000_000, "{after:?}");
    // SAFETY: NULL outputs are allowed.
    let rc = unsafe { cuheap_hook_times(null_mut(), null_mut(), null_mut()) };
    assert_eq!(rc, CUHEAP_OK);
}

#[test]
fn messages_are_per_thread_and_kept_until_the_next_failure() {
    let rc = entry("first", || invalid("one"));
    assert_eq!(rc, CUHEAP_ERROR_INVALID);
    assert_eq!(entry("second", || Ok(())), CUHEAP_OK);
    assert_eq!(last(), "first: invalid argument: one");
    let other = std::thread::spawn(last).join().unwrap();
    assert_eq!(other, "");
}

#[test]
fn errors_map_to_their_codes() {
    assert_eq!(code_of(&Error::NoDriver), CUHEAP_ERROR_NO_DEVICE);
    assert_eq!(
        code_of(&Error::NoDevice("x".into())),
        CUHEAP_ERROR_NO_DEVICE
    );
    let oom = Error::OutOfMemory {
        requested: 1,
        reserved: 0,
        free: 0,
    };
    assert_eq!(code_of(&oom), CUHEAP_ERROR_OUT_OF_MEMORY);
    let short = Error::DeviceHeapExhausted {
        failed: 1,
        bytes: 16,
    };
    assert_eq!(code_of(&short), CUHEAP_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        code_of(&Error::InvalidArgument("x".into())),
        CUHEAP_ERROR_INVALID
    );
}

#[test]
fn the_framework_hooks_refuse_bad_sizes_and_devices_with_null() {
    // SAFETY: no stream is used for these.
    unsafe {
        assert!(cuheap_torch_alloc(0, 0, null_mut()).is_null());
        assert!(cuheap_torch_alloc(-5, 0, null_mut()).is_null());
        assert_eq!(last(), "cuheap_torch_alloc: invalid argument: size -5");
        assert!(cuheap_torch_alloc(64, -1, null_mut()).is_null());
        assert!(last().contains("device -1"), "{}", last());
        assert!(cuheap_torch_alloc(64, MAX_TEST_DEVICE, null_mut()).is_null());
        // Freeing NULL does nothing, whatever the device: no pool, no
        // message.
        let before = last();
        cuheap_torch_free(null_mut(), 0, 0, null_mut());
        cuheap_cupy_free(null_mut(), null_mut(), 7);
        assert_eq!(last(), before);
    }
    assert!(cuheap_cupy_malloc(null_mut(), 0, 0).is_null());
}

const MAX_TEST_DEVICE: c_int = 64;

#[test]
fn pool_settings_fill_zero_fields_with_defaults() {
    let d = CuheapPoolConfig::default().resolve(80 << 30);
    assert_eq!(d.reserve, 80 << 30);
    assert_eq!((d.initial, d.chunk), (64 << 20, 2 << 20));
    let c = CuheapPoolConfig {
        reserve: 32 << 20,
        initial: 1 << 30,
        chunk: 4 << 20,
        ..Default::default()
    };
    let r = c.resolve(80 << 30);
    assert_eq!(
        (r.reserve, r.initial, r.chunk),
        (32 << 20, 32 << 20, 4 << 20)
    );
}

#[test]
fn without_a_gpu_creation_says_so() {
    if driver_present() {
        return; // a GPU machine: the ignored tests below cover it
    }
    let mut p = null_mut();
    let mut h = null_mut();
    // SAFETY: valid out pointers.
    unsafe {
        assert_eq!(
            cuheap_pool_create(std::ptr::null(), &mut p),
            CUHEAP_ERROR_NO_DEVICE
        );
        assert!(last().contains("no NVIDIA GPU found"), "{}", last());
        assert!(p.is_null());
        assert_eq!(
            cuheap_device_heap_create(1 << 20, 0, &mut h),
            CUHEAP_ERROR_NO_DEVICE
        );
        assert!(cuheap_torch_alloc(64, 0, null_mut()).is_null());
        assert!(last().contains("no NVIDIA GPU found"), "{}", last());
    }
}

/// A pool on the runtime's context: blocks on two streams, reuse,
/// statistics, bad frees, trim.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_pool_through_the_c_api() {
    let _gpu = one_at_a_time();
    let ctx = device_context(0).unwrap();
    let s1 = ctx.new_stream().unwrap();
    let s2 = ctx.new_stream().unwrap();
    let mut pool = null_mut();
    // SAFETY: valid pointers; the streams live until released below.
    unsafe {
        assert_eq!(
            cuheap_pool_create(std::ptr::null(), &mut pool),
            CUHEAP_OK,
            "{}",
            last()
        );
        let mut a = null_mut();
        let mut b = null_mut();
        assert_eq!(
            cuheap_pool_alloc(pool, 1000, s1.cu_stream(), &mut a),
            CUHEAP_OK
        );
        assert_eq!(
            cuheap_pool_alloc(pool, 1000, s2.cu_stream(), &mut b),
            CUHEAP_OK
        );
        assert!(!a.is_null() && !b.is_null() && a != b);
        assert_eq!(a as usize % 256, 0);
        let mut pts = std::ptr::dangling_mut::<c_void>();
        assert_eq!(
            cuheap_pool_alloc(pool, 64, 2 as sys::CUstream, &mut pts),
            CUHEAP_ERROR_INVALID,
            "the per-thread stream is refused"
        );
        assert!(pts.is_null() && last().contains("per-thread"), "{}", last());
        let mut zero = std::ptr::dangling_mut::<c_void>();
        assert_eq!(
            cuheap_pool_alloc(pool, 0, s1.cu_stream(), &mut zero),
            CUHEAP_ERROR_INVALID
        );
        assert!(zero.is_null());
        let mut huge = null_mut();
        assert_eq!(
            cuheap_pool_alloc(pool, usize::MAX / 2, s1.cu_stream(), &mut huge),
            CUHEAP_ERROR_OUT_OF_MEMORY
        );
        assert_eq!(cuheap_pool_free(pool, a, s1.cu_stream()), CUHEAP_OK);
        // Reused at once on the stream that freed it.
        let mut again = null_mut();
        assert_eq!(
            cuheap_pool_alloc(pool, 1000, s1.cu_stream(), &mut again),
            CUHEAP_OK
        );
        assert_eq!(again, a);
        assert_eq!(cuheap_pool_free(pool, again, s1.cu_stream()), CUHEAP_OK);
        assert_eq!(
            cuheap_pool_free(pool, again, s1.cu_stream()),
            CUHEAP_ERROR_INVALID
        );
        assert!(last().contains("not a live block"), "{}", last());
        assert_eq!(
            cuheap_pool_free(pool, 0x1234 as *mut c_void, s1.cu_stream()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_free(pool, null_mut(), s1.cu_stream()),
            CUHEAP_OK
        );
        assert_eq!(cuheap_pool_free(pool, b, s2.cu_stream()), CUHEAP_OK);
        let mut st = CuheapPoolStats::default();
        assert_eq!(cuheap_pool_get_stats(pool, &mut st), CUHEAP_OK);
        assert_eq!((st.in_use, st.bad_frees, st.same_stream_reuse), (0, 2, 1));
        assert_eq!((st.allocs, st.frees), (3, 3));
        assert_eq!(cuheap_pool_release_stream(pool, s1.cu_stream()), CUHEAP_OK);
        assert_eq!(cuheap_pool_release_stream(pool, s2.cu_stream()), CUHEAP_OK);
        let mut mapped = 0usize;
        assert_eq!(cuheap_pool_trim(pool, 0, &mut mapped), CUHEAP_OK);
        assert!(mapped > 0);
        // Access: the own device is a no-op (grant) or refused (revoke);
        // a device that does not exist is refused by name.
        assert_eq!(cuheap_pool_grant_access(pool, 0), CUHEAP_OK);
        // The snapshot: asked for, refused into a short buffer, written
        // into one that fits (JSON that reads back), and drawn.
        let mut needed = 0usize;
        let none = std::ptr::null();
        assert_eq!(
            cuheap_pool_snapshot(pool, null_mut(), 0, &mut needed, none),
            CUHEAP_OK
        );
        let mut buf = vec![0u8; needed];
        assert_eq!(
            cuheap_pool_snapshot(pool, buf.as_mut_ptr().cast(), needed - 1, null_mut(), none),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(buf[0], 0, "nothing written to a short buffer");
        let html = std::env::temp_dir().join(format!("cuheap-capi-{}.html", std::process::id()));
        let path = std::ffi::CString::new(html.to_str().unwrap()).unwrap();
        assert_eq!(
            cuheap_pool_snapshot(
                pool,
                buf.as_mut_ptr().cast(),
                needed,
                null_mut(),
                path.as_ptr()
            ),
            CUHEAP_OK,
            "{}",
            last()
        );
        let text = std::ffi::CStr::from_bytes_with_nul(&buf)
            .unwrap()
            .to_str()
            .unwrap();
        let snap = cuheap_host::Snapshot::from_json(text).unwrap();
        snap.check().unwrap();
        assert_eq!(snap.mapped, mapped);
        assert!(std::fs::read_to_string(&html).unwrap().contains("<svg"));
        std::fs::remove_file(html).unwrap();
        assert_eq!(cuheap_pool_revoke_access(pool, 0), CUHEAP_ERROR_INVALID);
        assert!(last().contains("device 0 owns"), "{}", last());
        assert_eq!(cuheap_pool_grant_access(pool, 4096), CUHEAP_ERROR_INVALID);
        assert!(last().contains("device 4096 does not exist"), "{}", last());
        assert_eq!(cuheap_pool_destroy(pool), CUHEAP_OK);
    }
}

/// An entry point leaves the caller's current context as it found it,
/// here none.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_callers_context_is_restored() {
    let _gpu = one_at_a_time();
    let _ctx = device_context(0).unwrap();
    let mut pool = null_mut();
    // SAFETY: clearing this thread's current context; valid out pointers.
    unsafe {
        sys::cuCtxSetCurrent(null_mut()).result().unwrap();
        assert_eq!(
            cuheap_pool_create(std::ptr::null(), &mut pool),
            CUHEAP_OK,
            "{}",
            last()
        );
        let mut now: sys::CUcontext = std::ptr::dangling_mut();
        sys::cuCtxGetCurrent(&mut now).result().unwrap();
        assert!(now.is_null(), "the pool's context was left current");
        assert_eq!(cuheap_pool_destroy(pool), CUHEAP_OK);
    }
}

/// A growable heap: its description, growth, statistics, trim.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_device_heap_through_the_c_api() {
    let _gpu = one_at_a_time();
    let _ctx = device_context(0).unwrap();
    let mut h = null_mut();
    // SAFETY: valid pointers; no kernel uses the heap.
    unsafe {
        assert_eq!(
            cuheap_device_heap_create(64 << 20, 1 << 30, &mut h),
            CUHEAP_OK,
            "{}",
            last()
        );
        let mut d = std::mem::zeroed::<CuheapHeapDesc>();
        assert_eq!(cuheap_device_heap_desc(h, &mut d), CUHEAP_OK);
        assert_eq!(d.data_bytes, 1 << 30);
        assert_eq!(d.data as usize % (64 << 10), 0);
        assert!(d.meta_bytes > 0 && d.slots > 0);
        let mut cap = 0usize;
        assert_eq!(cuheap_device_heap_capacity(h, &mut cap), CUHEAP_OK);
        assert_eq!(cap, 64 << 20);
        assert_eq!(cuheap_device_heap_grow(h, 256 << 20, &mut cap), CUHEAP_OK);
        assert!(cap >= 256 << 20);
        assert_eq!(
            cuheap_device_heap_grow(h, 2 << 30, &mut cap),
            CUHEAP_ERROR_INVALID,
            "past max"
        );
        let mut st = CuheapStats::default();
        assert_eq!(cuheap_device_heap_get_stats(h, &mut st), CUHEAP_OK);
        assert_eq!(st, CuheapStats::default(), "an unused heap");
        assert_eq!(cuheap_device_heap_trim(h, 0, &mut cap), CUHEAP_OK);
        assert!(cap < 256 << 20);
        // The growth service: one at a time, fills of 0 to 99, stopped
        // again (twice is fine), and stopped by the destroy.
        assert_eq!(cuheap_device_heap_serve(h, 100), CUHEAP_ERROR_INVALID);
        assert_eq!(cuheap_device_heap_serve(h, 0), CUHEAP_OK, "{}", last());
        assert_eq!(cuheap_device_heap_serve(h, 0), CUHEAP_ERROR_INVALID);
        assert!(
            last().contains("already has a growth service"),
            "{}",
            last()
        );
        assert_eq!(cuheap_device_heap_stop_serving(h), CUHEAP_OK);
        assert_eq!(cuheap_device_heap_stop_serving(h), CUHEAP_OK);
        assert_eq!(cuheap_device_heap_serve(h, 75), CUHEAP_OK, "{}", last());
        assert_eq!(cuheap_device_heap_stop_serving(h), CUHEAP_OK);
        // Growth in pieces and trims on a stream load the upkeep kernels (the device library);
        // pieces round up to whole 2 MiB chunks.
        let mut piece = 0usize;
        assert_eq!(
            cuheap_device_heap_set_growth_piece(h, 5 << 20, &mut piece),
            CUHEAP_OK,
            "{}",
            last()
        );
        assert_eq!(piece, 6 << 20);
        assert_eq!(cuheap_device_heap_grow(h, 512 << 20, &mut cap), CUHEAP_OK);
        assert_eq!(
            cuheap_device_heap_trim_on(h, null_mut(), 64 << 20),
            CUHEAP_OK,
            "{}",
            last()
        );
        let mut freed = 0usize;
        assert_eq!(
            cuheap_device_heap_finish_trims(h, 1, &mut freed),
            CUHEAP_OK,
            "{}",
            last()
        );
        assert_eq!(cuheap_device_heap_capacity(h, &mut cap), CUHEAP_OK);
        assert!(
            freed > 0 && cap < 512 << 20,
            "gave back {freed}, {cap} left"
        );
        // One device library serves every heap of the device.
        let mut other = null_mut();
        assert_eq!(
            cuheap_device_heap_create(8 << 20, 64 << 20, &mut other),
            CUHEAP_OK
        );
        assert_eq!(
            cuheap_device_heap_trim_on(other, null_mut(), 0),
            CUHEAP_OK,
            "{}",
            last()
        );
        assert_eq!(UPKEEP.lock().unwrap().len(), 1);
        assert_eq!(cuheap_device_heap_destroy(other), CUHEAP_OK);
        assert_eq!(cuheap_device_heap_destroy(h), CUHEAP_OK);
        let mut fixed = null_mut();
        assert_eq!(cuheap_device_heap_create(8 << 20, 0, &mut fixed), CUHEAP_OK);
        assert_eq!(
            cuheap_device_heap_grow(fixed, 16 << 20, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_device_heap_serve(fixed, 0), CUHEAP_ERROR_INVALID);
        assert_eq!(
            cuheap_device_heap_set_growth_piece(fixed, 8 << 20, null_mut()),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_device_heap_trim_on(fixed, null_mut(), 0), CUHEAP_OK);
        assert_eq!(
            cuheap_device_heap_finish_trims(fixed, 0, null_mut()),
            CUHEAP_OK
        );
        assert_eq!(cuheap_device_heap_destroy(fixed), CUHEAP_OK);
    }
}

/// The hooks PyTorch and CuPy call: one pool per device, shared.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_framework_hooks_share_one_pool_per_device() {
    let _gpu = one_at_a_time();
    // SAFETY: the null stream lives as long as the process.
    unsafe {
        let a = cuheap_torch_alloc(4096, 0, null_mut());
        assert!(!a.is_null(), "{}", last());
        cuheap_torch_free(a, 4096, 0, null_mut());
        let b = cuheap_cupy_malloc(null_mut(), 4096, 0);
        assert_eq!(a, b, "the same pool and stream reuse the block");
        cuheap_cupy_free(null_mut(), b, 0);
        let mut st = CuheapPoolStats::default();
        assert_eq!(cuheap_device_pool_get_stats(0, &mut st), CUHEAP_OK);
        assert_eq!(st.in_use, 0);
        assert!(st.allocs >= 2);
        // The device pool's snapshot: asked for, then written; the block
        // freed above is cached on the null stream.
        let mut needed = 0usize;
        let none = std::ptr::null();
        assert_eq!(
            cuheap_device_pool_snapshot(0, null_mut(), 0, &mut needed, none),
            CUHEAP_OK
        );
        let mut buf = vec![0u8; needed + 4096];
        assert_eq!(
            cuheap_device_pool_snapshot(0, buf.as_mut_ptr().cast(), buf.len(), null_mut(), none),
            CUHEAP_OK,
            "{}",
            last()
        );
        let text = CStr::from_ptr(buf.as_ptr().cast()).to_str().unwrap();
        let snap = cuheap_host::Snapshot::from_json(text).unwrap();
        snap.check().unwrap();
        assert_eq!((snap.in_use, snap.cached), (0, 4096));
        assert_eq!(
            cuheap_device_pool_snapshot(-1, null_mut(), 0, &mut needed, none),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(cuheap_device_pool_trim(0, 0, null_mut()), CUHEAP_OK);
    }
}

/// A thread with no current context (as PyTorch's autograd thread can
/// reach the allocator before any runtime call) allocates and frees
/// through the framework hooks and a pool of its own; the block is usable
/// and the thread is left without a context, as it came.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_thread_without_a_context_allocates_through_the_hooks() {
    let _gpu = one_at_a_time();
    let ctx = device_context(0).unwrap();
    let mut pool = null_mut();
    // SAFETY: valid out pointer; the pool is destroyed below.
    let rc = unsafe { cuheap_pool_create(std::ptr::null(), &mut pool) };
    assert_eq!(rc, CUHEAP_OK, "{}", last());
    let pool = pool as usize;
    std::thread::spawn(move || {
        let current = || {
            let mut now: sys::CUcontext = std::ptr::dangling_mut();
            // SAFETY: out-parameter.
            unsafe { sys::cuCtxGetCurrent(&mut now) }.result().unwrap();
            now
        };
        assert!(current().is_null(), "a new thread has no context");
        const N: usize = 1 << 20;
        // SAFETY: the null stream lives as long as the process; the pool
        // outlives this thread.
        let (a, b) = unsafe {
            let a = cuheap_torch_alloc(N as isize, 0, null_mut());
            assert!(!a.is_null(), "{}", last());
            assert!(current().is_null(), "the hook left its context current");
            let mut b = null_mut();
            let rc = cuheap_pool_alloc(pool as *mut CuheapPool, N, null_mut(), &mut b);
            assert_eq!(rc, CUHEAP_OK, "{}", last());
            (a as u64, b as u64)
        };
        // Both blocks hold what is written to them.
        ctx.bind_to_thread().unwrap();
        for (p, byte) in [(a, 0x5a), (b, 0xa5)] {
            let mut back = vec![0u8; N];
            // SAFETY: live blocks of N bytes; synchronous copies.
            unsafe {
                cuheap_host::cudarc::driver::result::memset_d8_sync(p, byte, N).unwrap();
                cuheap_host::cudarc::driver::result::memcpy_dtoh_sync(&mut back, p).unwrap();
            }
            assert!(back.iter().all(|&x| x == byte));
        }
        // SAFETY: clearing this thread's context; blocks from above.
        unsafe {
            sys::cuCtxSetCurrent(null_mut()).result().unwrap();
            cuheap_torch_free(a as *mut c_void, N as isize, 0, null_mut());
            assert_eq!(
                cuheap_pool_free(pool as *mut CuheapPool, b as *mut c_void, null_mut()),
                CUHEAP_OK,
                "{}",
                last()
            );
        }
        assert!(current().is_null());
    })
    .join()
    .unwrap();
    // SAFETY: the pool from above, no block left.
    let rc = unsafe { cuheap_pool_destroy(pool as *mut CuheapPool) };
    assert_eq!(rc, CUHEAP_OK);
    // The device pool the hooks share keeps no block of this test cached
    // (the other hooks' test counts what is cached there).
    // SAFETY: no output pointer.
    let rc = unsafe { cuheap_device_pool_trim(0, 0, null_mut()) };
    assert_eq!(rc, CUHEAP_OK, "{}", last());
}

/// Another context current on the caller's thread (one of its own, not
/// the runtime's) stays current through every path of an allocation and
/// a free: the first allocation, which maps memory and binds the pool's
/// context; a free; a cached reuse, which binds nothing; the framework
/// hooks; and an eager entry point.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn another_current_context_stays_current() {
    let _gpu = one_at_a_time();
    let ctx = device_context(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut pool = null_mut();
    // SAFETY: valid out pointer; the pool is destroyed below.
    let rc = unsafe { cuheap_pool_create(std::ptr::null(), &mut pool) };
    assert_eq!(rc, CUHEAP_OK, "{}", last());
    let (pool, raw) = (pool as usize, stream.cu_stream() as usize);
    std::thread::spawn(move || {
        let other = cuheap_host::cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
        let current = || {
            let mut now: sys::CUcontext = null_mut();
            // SAFETY: out-parameter.
            unsafe { sys::cuCtxGetCurrent(&mut now) }.result().unwrap();
            now
        };
        let pool = pool as *mut CuheapPool;
        let stream = raw as sys::CUstream;
        assert_eq!(current(), other.cu_ctx());
        // SAFETY: a live pool and a live stream of its context; blocks
        // freed once.
        unsafe {
            for round in ["maps memory", "reuses the cached block"] {
                let mut p = null_mut();
                let rc = cuheap_pool_alloc(pool, 1 << 20, stream, &mut p);
                assert_eq!(rc, CUHEAP_OK, "{}", last());
                assert_eq!(current(), other.cu_ctx(), "alloc that {round}");
                let rc = cuheap_pool_free(pool, p, stream);
                assert_eq!(rc, CUHEAP_OK, "{}", last());
                assert_eq!(
                    current(),
                    other.cu_ctx(),
                    "free after the alloc that {round}"
                );
            }
            let a = cuheap_torch_alloc(4096, 0, stream);
            assert!(!a.is_null(), "{}", last());
            cuheap_torch_free(a, 4096, 0, stream);
            assert_eq!(current(), other.cu_ctx(), "the hooks");
            let mut stats = std::mem::zeroed::<CuheapPoolStats>();
            assert_eq!(cuheap_pool_get_stats(pool, &mut stats), CUHEAP_OK);
            assert_eq!(stats.allocs, 2);
            assert_eq!(current(), other.cu_ctx(), "statistics");
        }
    })
    .join()
    .unwrap();
    // SAFETY: the pool from above, no block left; the stream outlives it.
    unsafe {
        let pool = pool as *mut CuheapPool;
        assert_eq!(
            cuheap_pool_release_stream(pool, raw as sys::CUstream),
            CUHEAP_OK
        );
        assert_eq!(cuheap_pool_destroy(pool), CUHEAP_OK);
        let rc = cuheap_device_pool_trim(0, 0, null_mut());
        assert_eq!(rc, CUHEAP_OK, "{}", last());
    }
    drop(stream);
}

/// A shareable pool's block goes through a socket pair and is mapped a
/// second time (as another process would map it): the words written
/// through the pool's address read back through the import's.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_block_goes_through_a_socket_and_maps_again() {
    let _gpu = one_at_a_time();
    use std::os::fd::AsRawFd;
    let ctx = device_context(0).unwrap();
    let cfg = CuheapPoolConfig {
        flags: CUHEAP_POOL_SHAREABLE,
        ..Default::default()
    };
    let mut pool = null_mut();
    // SAFETY: valid config and out pointers; the context is current.
    unsafe {
        assert_eq!(cuheap_pool_create(&cfg, &mut pool), CUHEAP_OK, "{}", last());
        let mut p: *mut c_void = null_mut();
        assert_eq!(
            cuheap_pool_alloc(pool, 4 << 20, null_mut(), &mut p),
            CUHEAP_OK
        );
        ctx.bind_to_thread().unwrap();
        sys::cuMemsetD32_v2(p as u64, 0x5EED_0001, 1 << 20)
            .result()
            .unwrap();
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (pool_addr, p_addr) = (pool as usize, p as usize);
        let sender = std::thread::spawn(move || {
            let (pool, p) = (pool_addr as *const CuheapPool, p_addr as *const c_void);
            let rc = cuheap_pool_export_block(pool, p, a.as_raw_fd());
            (rc, last())
        });
        let (mut import, mut q, mut size) = (null_mut(), null_mut(), 0usize);
        let rc = cuheap_import_receive(b.as_raw_fd(), &mut import, &mut q, &mut size);
        let (sent, why) = sender.join().unwrap();
        assert_eq!((sent, rc), (CUHEAP_OK, CUHEAP_OK), "{why} / {}", last());
        assert_eq!(size, 4 << 20);
        assert_ne!(q, p, "a second mapping");
        let mut words = vec![0u32; 1 << 20];
        sys::cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), q as u64, 4 << 20)
            .result()
            .unwrap();
        assert!(words.iter().all(|&w| w == 0x5EED_0001));
        assert_eq!(cuheap_import_close(import), CUHEAP_OK);
        assert_eq!(cuheap_pool_free(pool, p, null_mut()), CUHEAP_OK);
        // A pool made without the flag refuses to export.
        let mut plain = null_mut();
        assert_eq!(cuheap_pool_create(std::ptr::null(), &mut plain), CUHEAP_OK);
        let mut r: *mut c_void = null_mut();
        assert_eq!(
            cuheap_pool_alloc(plain, 4096, null_mut(), &mut r),
            CUHEAP_OK
        );
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            cuheap_pool_export_block(plain, r, c.as_raw_fd()),
            CUHEAP_ERROR_INVALID
        );
        assert!(last().contains("shareable"), "{}", last());
        assert_eq!(cuheap_pool_free(plain, r, null_mut()), CUHEAP_OK);
        assert_eq!(cuheap_pool_destroy(plain), CUHEAP_OK);
        assert_eq!(cuheap_pool_destroy(pool), CUHEAP_OK);
    }
}

/// A graph's pool through the C API: created with `CUHEAP_POOL_GRAPH`, it
/// serves a capture; sealed, it refuses more; tied to the graph, it
/// outlives `cuheap_pool_destroy` while the graph's executable replays,
/// and its memory goes back once the graph and the executable are gone.
/// A pool that is not a graph's refuses to be sealed.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_graph_pool_through_the_c_api_goes_with_its_graph() {
    let _gpu = one_at_a_time();
    let ctx = device_context(0).unwrap();
    let s = ctx.new_stream().unwrap();
    let free_memory = || {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-parameters; the context is current on this thread.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
            .result()
            .unwrap();
        free
    };
    let cfg = CuheapPoolConfig {
        reserve: 1 << 30,
        initial: 256 << 20,
        flags: CUHEAP_POOL_GRAPH,
        ..CuheapPoolConfig::default()
    };
    let (mut pool, mut plain) = (null_mut(), null_mut());
    let mut graph: sys::CUgraph = null_mut();
    let mut exec: sys::CUgraphExec = null_mut();
    // SAFETY: valid pointers; the stream lives to the end; the graph and
    // its executable are destroyed once, after their last launch.
    unsafe {
        assert_eq!(cuheap_pool_create(std::ptr::null(), &mut plain), CUHEAP_OK);
        assert_eq!(cuheap_pool_seal(plain), CUHEAP_ERROR_INVALID);
        assert!(last().contains("not a graph's"), "{}", last());
        ctx.bind_to_thread().unwrap();
        let before = free_memory();
        assert_eq!(cuheap_pool_create(&cfg, &mut pool), CUHEAP_OK, "{}", last());
        assert!(before - free_memory() >= 256 << 20, "mapped up front");
        sys::cuStreamBeginCapture_v2(
            s.cu_stream(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
        .result()
        .unwrap();
        let (mut a, mut b) = (null_mut(), null_mut());
        assert_eq!(
            cuheap_pool_alloc(pool, 1 << 20, s.cu_stream(), &mut a),
            CUHEAP_OK
        );
        sys::cuMemsetD32Async(a as u64, 7, (1 << 20) / 4, s.cu_stream())
            .result()
            .unwrap();
        assert_eq!(cuheap_pool_free(pool, a, s.cu_stream()), CUHEAP_OK);
        assert_eq!(
            cuheap_pool_alloc(pool, 1 << 20, s.cu_stream(), &mut b),
            CUHEAP_OK
        );
        assert_eq!(a, b, "freed in the capture, reused in stream order");
        assert_eq!(cuheap_pool_free(pool, b, s.cu_stream()), CUHEAP_OK);
        sys::cuStreamEndCapture(s.cu_stream(), &mut graph)
            .result()
            .unwrap();
        assert_eq!(
            cuheap_pool_tie_to_graph(plain, graph.cast()),
            CUHEAP_ERROR_INVALID,
            "only a graph's pool is tied"
        );
        assert_eq!(cuheap_pool_destroy(plain), CUHEAP_OK);
        assert_eq!(cuheap_pool_seal(pool), CUHEAP_OK);
        let mut more = null_mut();
        assert_eq!(
            cuheap_pool_alloc(pool, 256, s.cu_stream(), &mut more),
            CUHEAP_ERROR_INVALID
        );
        assert_eq!(
            cuheap_pool_tie_to_graph(pool, graph.cast()),
            CUHEAP_OK,
            "{}",
            last()
        );
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        assert_eq!(cuheap_pool_destroy(pool), CUHEAP_OK);
        for _ in 0..100 {
            sys::cuGraphLaunch(exec, s.cu_stream()).result().unwrap();
        }
        s.synchronize().unwrap();
        let mut word = 0u32;
        sys::cuMemcpyDtoH_v2((&mut word as *mut u32).cast(), a as u64, 4)
            .result()
            .unwrap();
        assert_eq!(word, 7, "the replays wrote the graph's block");
        let held = free_memory();
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        let start = std::time::Instant::now();
        while free_memory() < held + (256 << 20) {
            assert!(
                start.elapsed().as_secs() < 20,
                "the pool did not go with its graph"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
