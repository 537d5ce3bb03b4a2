//! C = A x B with cuSPARSE's generic SpGEMM: the vendor baseline that the
//! allocator-backed GPU methods are measured against.
//!
//! The product is every call a cuSPARSE user makes for one SpGEMM
//! (`CUSPARSE_SPGEMM_DEFAULT`, f64 values, 32-bit indices), in the order of
//! NVIDIA's `spgemm_example.c`: allocate C's row offsets, create the
//! descriptors, `cusparseSpGEMM_workEstimation` (size query, allocate
//! buffer 1, second call), `cusparseSpGEMM_compute` (size query, allocate
//! buffer 2, second call), `cusparseSpMatGetSize`, allocate C's columns and
//! values, `cusparseCsrSetPointers`, `cusparseSpGEMM_copy`. Buffers and C
//! come from plain `cuMemAlloc`, uninitialised, as a user would get them
//! ([`Cusparse::new`]), or from a cache of the blocks earlier products
//! freed, as a program on a caching pool (CuPy's, PyTorch's) gets them
//! once it is warm ([`Cusparse::cached`]).
//!
//! cuSPARSE wants `i32` row offsets where [`DeviceCsr`] has `u64` ones, so
//! [`Cusparse::prepare`] makes an `i32` copy of an input's offsets (untimed)
//! and uses its `u32` columns as `i32` as they are: valid because they are
//! below `cols`, which must fit in an `i32`.
//!
//! # Time
//!
//! [`CusparseProduct::ms`] runs from a CUDA event recorded on the GPU's
//! stream before C's offsets are allocated to one recorded after
//! `cusparseSpGEMM_copy`: the allocations and the host work between the
//! calls count, as they do for a user. Destroying the descriptors, freeing
//! the buffers and converting C to a [`DeviceCsr`] come after and are not
//! timed.
//!
//! # Memory accounting
//!
//! Both buffers are alive when C is allocated and copied, so the most
//! device memory the product holds at once is
//! [`peak_bytes`](CusparseProduct::peak_bytes) = buffer 1 + buffer 2 + C in
//! cuSPARSE's form (`(rows + 1) x 4 + nnz x (4 + 8)` bytes). The inputs are
//! not counted (every method holds them), nor the `i32` offsets that
//! [`Cusparse::prepare`] adds, nor the [`DeviceCsr`] that C is converted to
//! after the timed part (cuSPARSE's arrays are freed once it is filled).
//!
//! # Known failure
//!
//! Past 2^31 intermediate products (32-bit indices), cuSPARSE through
//! CuPy returned an empty C with no error on an H100; called here on R-MAT
//! scale 18 with 16 edges per row, its work estimation fails with
//! `CUSPARSE_STATUS_INSUFFICIENT_RESOURCES`
//! (`docs/spgemm-large-c84d985-h100.txt`), which is reported as this
//! method's error. Whatever cuSPARSE returns is returned as it is: the
//! caller checks every result against the CPU reference.
//!
//! An input with no nonzeros gives an all-zero C without calling cuSPARSE
//! (see [`Cusparse::multiply`]).

use super::DeviceCsr;
use crate::{Error, Gpu, Result};
use cudarc::cusparse::sys;
use cudarc::driver::{result as driver, sys as cu, CudaStream, DriverError};
use cuheap_host::DeviceMemory;
use std::cell::RefCell;
use std::ffi::c_void;

/// The cuSPARSE entry points this module calls. cudarc panics on the first
/// call of a missing one, so [`Cusparse::new`] looks them all up first.
const SYMBOLS: [&str; 12] = [
    "cusparseCreate",
    "cusparseDestroy",
    "cusparseSetStream",
    "cusparseCreateCsr",
    "cusparseDestroySpMat",
    "cusparseSpMatGetSize",
    "cusparseCsrSetPointers",
    "cusparseSpGEMM_createDescr",
    "cusparseSpGEMM_destroyDescr",
    "cusparseSpGEMM_workEstimation",
    "cusparseSpGEMM_compute",
    "cusparseSpGEMM_copy",
];

const OP: sys::cusparseOperation_t = sys::cusparseOperation_t::CUSPARSE_OPERATION_NON_TRANSPOSE;
const ALG: sys::cusparseSpGEMMAlg_t = sys::cusparseSpGEMMAlg_t::CUSPARSE_SPGEMM_DEFAULT;
const F64: sys::cudaDataType = sys::cudaDataType::CUDA_R_64F;

/// A cuSPARSE handle whose work goes to the Gpu's stream.
pub struct Cusparse<'g> {
    gpu: &'g Gpu,
    handle: sys::cusparseHandle_t,
    /// With [`Cusparse::cached`]: the blocks of earlier products, reused
    /// by later ones.
    cache: Option<RefCell<Vec<DeviceMemory>>>,
}

/// A [`DeviceCsr`] in the form cuSPARSE takes: `i32` row offsets of its
/// own, the matrix's columns and values as they are.
pub struct CusparseInput<'m> {
    matrix: &'m DeviceCsr,
    /// `rows + 1` `i32`s.
    row_offsets: DeviceMemory,
}

/// The result of [`Cusparse::multiply`].
pub struct CusparseProduct {
    /// C, converted to the [`DeviceCsr`] form (`u64` offsets).
    pub c: DeviceCsr,
    /// Bytes of the buffer `cusparseSpGEMM_workEstimation` asked for.
    pub buffer1_bytes: usize,
    /// Bytes of the buffer `cusparseSpGEMM_compute` asked for.
    pub buffer2_bytes: usize,
    /// buffer1 + buffer2 + C's arrays in cuSPARSE's form (the most device
    /// memory the product holds at once: both buffers are alive when C is
    /// allocated and copied).
    pub peak_bytes: usize,
    /// Milliseconds from the start of the sequence (C's row offsets are
    /// allocated just before the first cuSPARSE call) to the end of
    /// `cusparseSpGEMM_copy`, measured with CUDA events recorded on the
    /// Gpu's stream around the whole sequence (includes the buffer
    /// allocations, which are part of what a user pays). 0 when an input
    /// has no nonzeros and cuSPARSE was not called.
    pub ms: f64,
}

impl<'g> Cusparse<'g> {
    /// A handle on `gpu`'s stream. Errors (never panics) when libcusparse
    /// cannot be loaded or lacks one of the functions this module calls.
    pub fn new(gpu: &'g Gpu) -> Result<Cusparse<'g>> {
        // SAFETY: only tries to open the library; no cuSPARSE call is made.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::InvalidArgument(
                "cuSPARSE: libcusparse cannot be loaded (is the CUDA toolkit's library directory \
                 on the loader's path?)"
                    .into(),
            ));
        }
        // SAFETY: the library is present (checked above), so `culib` loads
        // it without panicking.
        let lib = unsafe { sys::culib() };
        for name in SYMBOLS {
            // SAFETY: only looks the symbol up; it is never called through
            // this pointer type.
            if unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err() {
                return Err(Error::InvalidArgument(format!(
                    "cuSPARSE: libcusparse has no `{name}` (too old a CUDA toolkit?)"
                )));
            }
        }
        gpu.context()
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        let mut handle: sys::cusparseHandle_t = std::ptr::null_mut();
        // SAFETY: writes one handle; the GPU's context is current.
        let status = unsafe { sys::cusparseCreate(&mut handle) };
        check(status, "cusparseCreate")?;
        // Owned from here: dropped (destroyed) if setting the stream fails.
        let cusparse = Cusparse {
            gpu,
            handle,
            cache: None,
        };
        let stream = gpu.stream().cu_stream() as sys::cudaStream_t;
        // SAFETY: a live handle and the GPU's stream, which outlives it
        // (the Gpu is borrowed for the handle's lifetime).
        let status = unsafe { sys::cusparseSetStream(cusparse.handle, stream) };
        check(status, "cusparseSetStream")?;
        Ok(cusparse)
    }

    /// As [`new`](Self::new), but the product's buffers and C's arrays
    /// come from a cache: a block freed by one product serves a later
    /// request of at most its size (the smallest such block). A request
    /// that no block serves frees the whole cache first, then calls
    /// `cuMemAlloc`, so the cache never holds more than one product's
    /// blocks. Once warm, the same product allocates nothing: this is the
    /// cost a program pays on a caching pool, the best case for cuSPARSE.
    /// [`CusparseProduct::peak_bytes`] is the same in both modes.
    pub fn cached(gpu: &'g Gpu) -> Result<Cusparse<'g>> {
        let mut cusparse = Cusparse::new(gpu)?;
        cusparse.cache = Some(RefCell::new(Vec::new()));
        Ok(cusparse)
    }

    /// Frees the cached blocks (none without [`cached`](Self::cached)).
    pub fn trim(&self) {
        if let Some(cache) = &self.cache {
            cache.borrow_mut().clear();
        }
    }

    /// Converts `m` to cuSPARSE's input form: an `i32` copy of its row
    /// offsets (a host round trip: untimed preparation); its `u32` columns
    /// are used as `i32` as they are. Errors if rows, columns or nnz exceed
    /// `i32::MAX`, or if the offsets do not end at nnz.
    ///
    /// # Time Complexity
    /// O(rows), with two synchronous copies.
    pub fn prepare<'m>(&self, m: &'m DeviceCsr) -> Result<CusparseInput<'m>> {
        let too_large = |what: &str, n: usize| {
            Error::InvalidArgument(format!(
                "cuSPARSE with 32-bit indices: {what} = {n} exceeds i32::MAX"
            ))
        };
        for (what, n) in [("rows", m.rows), ("columns", m.cols), ("nnz", m.nnz)] {
            if i32::try_from(n).is_err() {
                return Err(too_large(what, n));
            }
        }
        if m.col_indices.bytes() < m.nnz * 4 || m.values.bytes() < m.nnz * 8 {
            return Err(Error::InvalidArgument(format!(
                "DeviceCsr: {} bytes of columns and {} of values cannot hold {} nonzeros",
                m.col_indices.bytes(),
                m.values.bytes(),
                m.nnz
            )));
        }
        let mut wide = vec![0u64; m.rows + 1];
        m.row_offsets.read(0, &mut wide)?;
        if wide[m.rows] != m.nnz as u64 {
            return Err(Error::InvalidArgument(format!(
                "DeviceCsr: the row offsets end at {}, nnz is {}",
                wide[m.rows], m.nnz
            )));
        }
        let narrow = wide
            .iter()
            .map(|&o| i32::try_from(o).map_err(|_| too_large("a row offset", o as usize)))
            .collect::<Result<Vec<i32>>>()?;
        let row_offsets = self.gpu.alloc_zeroed(narrow.len() * 4)?;
        row_offsets.write(0, &narrow)?;
        Ok(CusparseInput {
            matrix: m,
            row_offsets,
        })
    }

    /// C = A x B: every call a user makes for one SpGEMM (see the module
    /// documentation), timed; then C converted to a [`DeviceCsr`], untimed.
    ///
    /// If A or B has no nonzeros, C is all zeros and cuSPARSE is not called
    /// (it may reject such matrices): the result has no buffers, a peak of
    /// 0 and `ms` 0.
    ///
    /// An empty C from inputs whose product is not empty is cuSPARSE's
    /// known failure past 2^31 intermediate products, returned as it is.
    pub fn multiply(
        &self,
        a: &CusparseInput<'_>,
        b: &CusparseInput<'_>,
    ) -> Result<CusparseProduct> {
        let (am, bm) = (a.matrix, b.matrix);
        if am.cols != bm.rows {
            return Err(Error::InvalidArgument(format!(
                "cannot multiply a {}x{} matrix by a {}x{} matrix",
                am.rows, am.cols, bm.rows, bm.cols
            )));
        }
        let (rows, cols) = (am.rows, bm.cols);
        if am.nnz == 0 || bm.nnz == 0 {
            return Ok(CusparseProduct {
                c: DeviceCsr::uninit(self.gpu, rows, cols, 0)?,
                buffer1_bytes: 0,
                buffer2_bytes: 0,
                peak_bytes: 0,
                ms: 0.0,
            });
        }
        let ctx = self.gpu.context();
        let stream = self.gpu.stream();
        let flags = Some(cu::CUevent_flags::CU_EVENT_DEFAULT);
        let start = ctx
            .new_event(flags)
            .map_err(driver_error("cuEventCreate"))?;
        let stop = ctx
            .new_event(flags)
            .map_err(driver_error("cuEventCreate"))?;
        ctx.bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;

        // Declared before the descriptors, so dropped after them.
        let mut ws = Workspace::new(self.gpu, stream, self.cache.as_ref());

        start
            .record(stream)
            .map_err(driver_error("cuEventRecord"))?;
        let c_offsets = ws.alloc((rows + 1) * 4)?;
        // SAFETY: `prepare` made `rows + 1` i32 offsets and checked that
        // A's columns and values hold `nnz` entries, with rows, columns and
        // nnz within i32; A is borrowed for this call.
        let mat_a = unsafe { SpMat::csr(am, a.row_offsets.ptr()) }?;
        // SAFETY: as for A.
        let mat_b = unsafe { SpMat::csr(bm, b.row_offsets.ptr()) }?;
        // SAFETY: `rows + 1` i32 offsets owned by `ws`, which outlives the
        // descriptor; no columns or values until `cusparseCsrSetPointers`.
        let mat_c = unsafe { SpMat::new(rows, cols, 0, c_offsets, 0, 0) }?;
        let spgemm = SpGemm {
            handle: self.handle,
            a: &mat_a,
            b: &mat_b,
            c: &mat_c,
            descr: SpGemmDescr::new()?,
        };

        let mut buffer1_bytes = 0usize;
        // SAFETY: a size query (no buffer).
        unsafe { spgemm.step(Step::WorkEstimation, &mut buffer1_bytes, 0) }?;
        ws.buffer1 = ws.alloc(buffer1_bytes)?;
        // SAFETY: `buffer1_bytes` of device memory owned by `ws`, which
        // outlives `spgemm`.
        unsafe { spgemm.step(Step::WorkEstimation, &mut buffer1_bytes, ws.buffer1) }?;

        let mut buffer2_bytes = 0usize;
        // SAFETY: a size query (no buffer).
        unsafe { spgemm.step(Step::Compute, &mut buffer2_bytes, 0) }?;
        ws.buffer2 = ws.alloc(buffer2_bytes)?;
        // SAFETY: `buffer2_bytes` of device memory owned by `ws`, which
        // outlives `spgemm`.
        unsafe { spgemm.step(Step::Compute, &mut buffer2_bytes, ws.buffer2) }?;

        let (c_rows, c_cols, c_nnz) = mat_c.size()?;
        let nnz = usize::try_from(c_nnz)
            .map_err(|_| Error::InvalidArgument(format!("cuSPARSE: C has {c_nnz} nonzeros")))?;
        if (c_rows, c_cols) != (rows as i64, cols as i64) {
            return Err(Error::InvalidArgument(format!(
                "cuSPARSE: C is {c_rows}x{c_cols}, expected {rows}x{cols}"
            )));
        }
        ws.c_cols = ws.alloc(nnz * 4)?;
        ws.c_values = ws.alloc(nnz * 8)?;
        // SAFETY: `rows + 1` i32 offsets, `nnz` i32 columns and `nnz` f64
        // values, owned by `ws`, which outlives the descriptor.
        unsafe { mat_c.set_pointers(c_offsets, ws.c_cols, ws.c_values) }?;
        spgemm.copy()?;
        stop.record(stream).map_err(driver_error("cuEventRecord"))?;

        spgemm.descr.destroy()?;
        mat_c.destroy()?;
        mat_b.destroy()?;
        mat_a.destroy()?;
        // Waits for both events, so for the copy.
        let ms = start
            .elapsed_ms(&stop)
            .map_err(driver_error("cuEventElapsedTime"))? as f64;
        let peak_bytes = buffer1_bytes + buffer2_bytes + (rows + 1) * 4 + nnz * (4 + 8);
        ws.free_buffers();

        let c = self.to_device_csr(rows, cols, nnz, c_offsets, ws.c_cols, ws.c_values)?;
        Ok(CusparseProduct {
            c,
            buffer1_bytes,
            buffer2_bytes,
            peak_bytes,
            ms,
        })
    }

    /// C in cuSPARSE's form (`i32` offsets at `offsets`, columns at `cols`,
    /// values at `values`) copied to a new [`DeviceCsr`]. Negative offsets
    /// are an error; any other inconsistency is left for
    /// [`DeviceCsr::download`] to find.
    fn to_device_csr(
        &self,
        rows: usize,
        cols: usize,
        nnz: usize,
        offsets: u64,
        col_indices: u64,
        values: u64,
    ) -> Result<DeviceCsr> {
        let mut narrow = vec![0i32; rows + 1];
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(driver_error("cuCtxSetCurrent"))?;
        // SAFETY: `offsets` holds `rows + 1` i32s written by
        // `cusparseSpGEMM_copy`, which has completed (its stop event was
        // waited for); any bytes are a valid i32.
        unsafe { driver::memcpy_dtoh_sync(&mut narrow, offsets) }
            .map_err(driver_error("cuMemcpyDtoH"))?;
        let wide = narrow
            .iter()
            .enumerate()
            .map(|(i, &o)| {
                u64::try_from(o).map_err(|_| {
                    Error::InvalidArgument(format!("cuSPARSE: C's row offset {i} is {o}"))
                })
            })
            .collect::<Result<Vec<u64>>>()?;
        let c = DeviceCsr::uninit(self.gpu, rows, cols, nnz)?;
        c.row_offsets.write(0, &wide)?;
        if nnz > 0 {
            self.gpu
                .context()
                .bind_to_thread()
                .map_err(driver_error("cuCtxSetCurrent"))?;
            // SAFETY: both sides hold `nnz` u32s (cuSPARSE's i32 columns,
            // bit for bit); the copy is ordered after the completed product.
            unsafe { driver::memcpy_dtod_sync(c.col_indices.ptr(), col_indices, nnz * 4) }
                .map_err(driver_error("cuMemcpyDtoD"))?;
            // SAFETY: both sides hold `nnz` f64s.
            unsafe { driver::memcpy_dtod_sync(c.values.ptr(), values, nnz * 8) }
                .map_err(driver_error("cuMemcpyDtoD"))?;
        }
        Ok(c)
    }
}

impl Drop for Cusparse<'_> {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed destroy leaks.
        if self.gpu.context().bind_to_thread().is_ok() {
            // SAFETY: the handle came from cusparseCreate and is destroyed
            // once.
            let _ = unsafe { sys::cusparseDestroy(self.handle) };
        }
    }
}

impl CusparseInput<'_> {
    /// The matrix this input stands for.
    pub fn matrix(&self) -> &DeviceCsr {
        self.matrix
    }

    /// Device memory the conversion added: the `i32` row offsets.
    pub fn bytes(&self) -> usize {
        self.row_offsets.bytes()
    }
}

/// A cuSPARSE status as a result naming the call.
fn check(status: sys::cusparseStatus_t, call: &str) -> Result<()> {
    match status {
        sys::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS => Ok(()),
        status => Err(Error::InvalidArgument(format!(
            "cuSPARSE {call} failed: {status:?}"
        ))),
    }
}

/// Attaches the name of the failing call to a driver error.
fn driver_error(what: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |source| Error::Driver { what, source }
}

/// A device address as cuSPARSE takes it.
fn void(ptr: u64) -> *mut c_void {
    ptr as *mut c_void
}

/// The device memory of one product, from `cuMemAlloc` or the cache,
/// uninitialised. Dropping it waits for the stream first (on an error path
/// cuSPARSE may still have work queued that uses it), then frees every
/// allocation or returns it to the cache. An address of 0 is no
/// allocation.
struct Workspace<'a> {
    gpu: &'a Gpu,
    stream: &'a CudaStream,
    cache: Option<&'a RefCell<Vec<DeviceMemory>>>,
    /// Every allocation, freed on drop.
    owned: Vec<DeviceMemory>,
    buffer1: u64,
    buffer2: u64,
    c_cols: u64,
    c_values: u64,
}

impl<'a> Workspace<'a> {
    fn new(
        gpu: &'a Gpu,
        stream: &'a CudaStream,
        cache: Option<&'a RefCell<Vec<DeviceMemory>>>,
    ) -> Self {
        Workspace {
            gpu,
            stream,
            cache,
            owned: Vec::with_capacity(5),
            buffer1: 0,
            buffer2: 0,
            c_cols: 0,
            c_values: 0,
        }
    }

    /// `bytes` of device memory owned by the workspace.
    fn alloc(&mut self, bytes: usize) -> Result<u64> {
        let cached = self.cache.and_then(|cache| {
            let mut cache = cache.borrow_mut();
            let best = (0..cache.len())
                .filter(|&i| cache[i].bytes() >= bytes)
                .min_by_key(|&i| cache[i].bytes());
            match best {
                Some(i) => Some(cache.swap_remove(i)),
                None => {
                    cache.clear();
                    None
                }
            }
        });
        let mem = match cached {
            Some(mem) => mem,
            None => self.gpu.alloc(bytes)?,
        };
        let ptr = mem.ptr();
        self.owned.push(mem);
        Ok(ptr)
    }

    /// Frees cuSPARSE's two buffers now, or returns them to the cache (the
    /// product is done with them; called after the stream has finished).
    fn free_buffers(&mut self) {
        let (b1, b2) = (
            std::mem::take(&mut self.buffer1),
            std::mem::take(&mut self.buffer2),
        );
        let (done, kept) = std::mem::take(&mut self.owned)
            .into_iter()
            .partition(|m| m.ptr() == b1 || m.ptr() == b2);
        self.owned = kept;
        self.give_back(done);
    }

    /// Frees `blocks`, or returns them to the cache.
    fn give_back(&self, blocks: Vec<DeviceMemory>) {
        if let Some(cache) = self.cache {
            cache.borrow_mut().extend(blocks);
        }
    }
}

impl Drop for Workspace<'_> {
    fn drop(&mut self) {
        // Errors cannot be returned from drop: if the wait fails, cuSPARSE
        // may still use the memory, so it is leaked rather than freed.
        if self.stream.synchronize().is_err() {
            std::mem::forget(std::mem::take(&mut self.owned));
        }
        let owned = std::mem::take(&mut self.owned);
        self.give_back(owned);
    }
}

/// A cuSPARSE descriptor type that owns its handle: destroyed on drop, or
/// by `destroy`, which reports a failure.
macro_rules! descriptor {
    ($(#[$doc:meta])* $name:ident($raw:ty), $destroy:ident) => {
        $(#[$doc])*
        struct $name($raw);

        impl $name {
            /// Destroys the descriptor, reporting a failure.
            fn destroy(self) -> Result<()> {
                let descr = self.0;
                std::mem::forget(self);
                // SAFETY: the descriptor came from its create call and is
                // destroyed once (`self` is forgotten).
                let status = unsafe { sys::$destroy(descr) };
                check(status, stringify!($destroy))
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the descriptor came from its create call and is
                // destroyed once. A failure cannot be returned from drop.
                let _ = unsafe { sys::$destroy(self.0) };
            }
        }
    };
}

descriptor!(
    /// A CSR matrix descriptor (`cusparseSpMatDescr_t`).
    SpMat(sys::cusparseSpMatDescr_t),
    cusparseDestroySpMat
);
descriptor!(
    /// An SpGEMM descriptor (`cusparseSpGEMMDescr_t`).
    SpGemmDescr(sys::cusparseSpGEMMDescr_t),
    cusparseSpGEMM_destroyDescr
);

impl SpMat {
    /// The descriptor of `m`, with the `i32` offsets at `offsets`.
    ///
    /// # Safety
    ///
    /// As for [`SpMat::new`], with `m`'s columns and values.
    unsafe fn csr(m: &DeviceCsr, offsets: u64) -> Result<SpMat> {
        let (cols, values) = (m.col_indices.ptr(), m.values.ptr());
        // SAFETY: forwarded from the caller.
        unsafe { SpMat::new(m.rows, m.cols, m.nnz, offsets, cols, values) }
    }

    /// A `rows` x `cols` CSR descriptor with `nnz` nonzeros, 32-bit
    /// indices, f64 values, base 0.
    ///
    /// # Safety
    ///
    /// `offsets` holds `rows + 1` i32s, `col_indices` and `values` (0 when
    /// `nnz` is 0) `nnz` i32s below `cols` and `nnz` f64s, all device
    /// memory of the current context that stays allocated while the
    /// descriptor is used; `rows`, `cols` and `nnz` fit in an i32.
    unsafe fn new(
        rows: usize,
        cols: usize,
        nnz: usize,
        offsets: u64,
        col_indices: u64,
        values: u64,
    ) -> Result<SpMat> {
        let mut descr: sys::cusparseSpMatDescr_t = std::ptr::null_mut();
        let index = sys::cusparseIndexType_t::CUSPARSE_INDEX_32I;
        let base = sys::cusparseIndexBase_t::CUSPARSE_INDEX_BASE_ZERO;
        let (offsets, col_indices, values) = (void(offsets), void(col_indices), void(values));
        // SAFETY: forwarded from the caller; writes one descriptor.
        let status = unsafe {
            sys::cusparseCreateCsr(
                &mut descr,
                rows as i64,
                cols as i64,
                nnz as i64,
                offsets,
                col_indices,
                values,
                index,
                index,
                base,
                F64,
            )
        };
        check(status, "cusparseCreateCsr")?;
        Ok(SpMat(descr))
    }

    /// Rows, columns and nonzeros (`cusparseSpMatGetSize`).
    fn size(&self) -> Result<(i64, i64, i64)> {
        let (mut rows, mut cols, mut nnz) = (0i64, 0i64, 0i64);
        // SAFETY: a live descriptor; writes three integers.
        let status = unsafe { sys::cusparseSpMatGetSize(self.0, &mut rows, &mut cols, &mut nnz) };
        check(status, "cusparseSpMatGetSize")?;
        Ok((rows, cols, nnz))
    }

    /// Points the descriptor at new arrays (`cusparseCsrSetPointers`).
    ///
    /// # Safety
    ///
    /// As for [`SpMat::new`], with the descriptor's sizes.
    unsafe fn set_pointers(&self, offsets: u64, col_indices: u64, values: u64) -> Result<()> {
        let (offsets, col_indices, values) = (void(offsets), void(col_indices), void(values));
        // SAFETY: a live descriptor; the arrays are forwarded from the
        // caller.
        let status = unsafe { sys::cusparseCsrSetPointers(self.0, offsets, col_indices, values) };
        check(status, "cusparseCsrSetPointers")
    }
}

impl SpGemmDescr {
    fn new() -> Result<SpGemmDescr> {
        let mut descr: sys::cusparseSpGEMMDescr_t = std::ptr::null_mut();
        // SAFETY: writes one descriptor.
        let status = unsafe { sys::cusparseSpGEMM_createDescr(&mut descr) };
        check(status, "cusparseSpGEMM_createDescr")?;
        Ok(SpGemmDescr(descr))
    }
}

/// The operands of one C = 1 x A x B + 0 x C, as the three SpGEMM steps
/// take them: non-transposed, f64, `CUSPARSE_SPGEMM_DEFAULT`, scalars on
/// the host (the handle's default pointer mode).
struct SpGemm<'a> {
    handle: sys::cusparseHandle_t,
    a: &'a SpMat,
    b: &'a SpMat,
    c: &'a SpMat,
    descr: SpGemmDescr,
}

/// The two sized steps of an SpGEMM.
#[derive(Clone, Copy)]
enum Step {
    WorkEstimation,
    Compute,
}

/// `cusparseSpGEMM_workEstimation` and `cusparseSpGEMM_compute`, which
/// take the same parameters.
type StepFn = unsafe fn(
    sys::cusparseHandle_t,
    sys::cusparseOperation_t,
    sys::cusparseOperation_t,
    *const c_void,
    sys::cusparseConstSpMatDescr_t,
    sys::cusparseConstSpMatDescr_t,
    *const c_void,
    sys::cusparseSpMatDescr_t,
    sys::cudaDataType,
    sys::cusparseSpGEMMAlg_t,
    sys::cusparseSpGEMMDescr_t,
    *mut usize,
    *mut c_void,
) -> sys::cusparseStatus_t;

const ALPHA: f64 = 1.0;
const BETA: f64 = 0.0;

impl SpGemm<'_> {
    fn scalars() -> (*const c_void, *const c_void) {
        ((&ALPHA as *const f64).cast(), (&BETA as *const f64).cast())
    }

    /// One of the two sized steps, `cusparseSpGEMM_workEstimation` or
    /// `cusparseSpGEMM_compute` (the same parameters): with `buffer` 0,
    /// writes the size of its buffer to `bytes`; with the buffer, does the
    /// step (work estimation inspects A and B, compute forms the product
    /// inside the buffers, after the work estimation).
    ///
    /// # Safety
    ///
    /// `buffer` is 0 or `*bytes` of device memory of the current context
    /// that stays allocated until the SpGEMM descriptor is destroyed.
    unsafe fn step(&self, step: Step, bytes: &mut usize, buffer: u64) -> Result<()> {
        let (f, name): (StepFn, _) = match step {
            Step::WorkEstimation => (
                sys::cusparseSpGEMM_workEstimation,
                "cusparseSpGEMM_workEstimation",
            ),
            Step::Compute => (sys::cusparseSpGEMM_compute, "cusparseSpGEMM_compute"),
        };
        let (alpha, beta) = Self::scalars();
        // SAFETY: live handle and descriptors, host scalars; the buffer is
        // forwarded from the caller.
        let status = unsafe {
            f(
                self.handle,
                OP,
                OP,
                alpha,
                self.a.0,
                self.b.0,
                beta,
                self.c.0,
                F64,
                ALG,
                self.descr.0,
                bytes,
                void(buffer),
            )
        };
        check(status, name)
    }

    /// `cusparseSpGEMM_copy`: writes the product into C's arrays, which
    /// must be set (`SpMat::set_pointers`) after `compute` with buffer 2.
    fn copy(&self) -> Result<()> {
        let (alpha, beta) = Self::scalars();
        // SAFETY: live handle and descriptors, host scalars; C's arrays
        // were sized from the descriptor after the compute step and stay
        // allocated (the `SpMat` constructors' contracts).
        let status = unsafe {
            sys::cusparseSpGEMM_copy(
                self.handle,
                OP,
                OP,
                alpha,
                self.a.0,
                self.b.0,
                beta,
                self.c.0,
                F64,
                ALG,
                self.descr.0,
            )
        };
        check(status, "cusparseSpGEMM_copy")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spgemm::{compare, gen, multiply, Csr, Rng};

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn products_match_the_cpu_reference() -> std::result::Result<(), Box<dyn std::error::Error>> {
        let gpu = crate::open_bench_gpu()?;
        // Square, skewed rows.
        let a = gen::rmat(9, 8, 7)?;
        // Rectangular (512 x 200), so C's shape is A's rows by B's columns.
        let mut rng = Rng::new(11);
        let triplets: Vec<(u32, u32, f64)> = (0..3000)
            .map(|_| {
                let r = rng.below(512) as u32;
                let c = rng.below(200) as u32;
                (r, c, rng.value())
            })
            .collect();
        let b = Csr::from_triplets(512, 200, &triplets)?;
        let empty = Csr::zeros(512, 512)?;
        // Fresh buffers each time, then a cache: each product twice, so the
        // cached handle's second run reuses the first one's blocks (and the
        // next pair of inputs, of other sizes, frees and refills the cache).
        for cusparse in [Cusparse::new(&gpu)?, Cusparse::cached(&gpu)?] {
            for (x, y) in [(&a, &a), (&a, &b), (&empty, &b), (&a, &empty)] {
                let reference = multiply(x, y)?;
                let (dx, dy) = (DeviceCsr::upload(&gpu, x)?, DeviceCsr::upload(&gpu, y)?);
                let (px, py) = (cusparse.prepare(&dx)?, cusparse.prepare(&dy)?);
                for _ in 0..2 {
                    let product = cusparse.multiply(&px, &py)?;
                    compare(&product.c.download()?, &reference)?;
                    assert!(product.peak_bytes >= product.buffer1_bytes + product.buffer2_bytes);
                    assert!(product.ms >= 0.0);
                }
            }
            cusparse.trim();
        }
        Ok(())
    }
}
