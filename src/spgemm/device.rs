//! A CSR matrix in device memory: what the GPU methods take and return.
//!
//! Layout, the same for inputs and results: `row_offsets` is `rows + 1`
//! `u64`s (so a result may hold more than 2^32 nonzeros), `col_indices`
//! `nnz` `u32`s, `values` `nnz` `f64`s, each row's columns sorted.

use super::Csr;
use crate::{DevicePtr, Gpu, Result};
use cuheap_host::DeviceMemory;

/// A CSR matrix in device memory (see the module documentation).
///
/// Its contents are valid CSR with sorted rows: it comes from a checked
/// [`Csr`] ([`DeviceCsr::upload`]) or from a product of this crate. The
/// fields are not public, because the kernels that read it rely on that
/// (a column out of range or an unsorted row would make them write out of
/// bounds): [`DeviceCsr::ptrs`] gives the arrays' addresses.
pub struct DeviceCsr {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) nnz: usize,
    /// `rows + 1` `u64` offsets.
    pub(crate) row_offsets: DeviceMemory,
    /// `nnz` `u32` column indices.
    pub(crate) col_indices: DeviceMemory,
    /// `nnz` `f64` values.
    pub(crate) values: DeviceMemory,
}

impl DeviceCsr {
    /// Copies `m` to the device (synchronous).
    pub fn upload(gpu: &Gpu, m: &Csr) -> Result<DeviceCsr> {
        let offsets: Vec<u64> = m.row_offsets().iter().map(|&o| o as u64).collect();
        let d = DeviceCsr::uninit(gpu, m.rows(), m.cols(), m.nnz())?;
        d.row_offsets.write(0, &offsets)?;
        d.col_indices.write(0, m.col_indices())?;
        d.values.write(0, m.values())?;
        Ok(d)
    }

    /// A `rows` x `cols` matrix with room for `nnz` nonzeros, zeroed (its
    /// offsets are all 0 until a kernel writes them).
    pub(crate) fn uninit(gpu: &Gpu, rows: usize, cols: usize, nnz: usize) -> Result<DeviceCsr> {
        Ok(DeviceCsr {
            rows,
            cols,
            nnz,
            row_offsets: gpu.alloc_zeroed((rows + 1) * 8)?,
            col_indices: gpu.alloc_zeroed(nnz * 4)?,
            values: gpu.alloc_zeroed(nnz * 8)?,
        })
    }

    /// Copies the matrix to the host (synchronous, legacy default stream)
    /// and checks every CSR invariant: a result that breaks one is an
    /// error, never a matrix.
    pub fn download(&self) -> Result<Csr> {
        let mut offsets = vec![0u64; self.rows + 1];
        let mut cols = vec![0u32; self.nnz];
        let mut vals = vec![0f64; self.nnz];
        self.row_offsets.read(0, &mut offsets)?;
        self.col_indices.read(0, &mut cols)?;
        self.values.read(0, &mut vals)?;
        let offsets = offsets.into_iter().map(|o| o as usize).collect();
        Csr::new(self.rows, self.cols, offsets, cols, vals)
            .map_err(|e| crate::Error::InvalidArgument(format!("the GPU's result: {e}")))
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Nonzeros.
    pub fn nnz(&self) -> usize {
        self.nnz
    }

    /// Bytes of device memory the three arrays take.
    pub fn bytes(&self) -> usize {
        self.row_offsets.bytes() + self.col_indices.bytes() + self.values.bytes()
    }

    /// The arrays as kernel parameters: offsets, columns, values.
    pub fn ptrs(&self) -> (DevicePtr<u64>, DevicePtr<u32>, DevicePtr<f64>) {
        (
            self.row_offsets.as_ptr(),
            self.col_indices.as_ptr(),
            self.values.as_ptr(),
        )
    }
}
