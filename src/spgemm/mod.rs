//! Sparse matrix products on the host: the inputs and the reference that the
//! GPU methods of `cuheap demo spgemm` are checked against.
//!
//! Layers, lowest first; each uses only those before it:
//!
//! 1. [`csr`]: the [`Csr`] matrix (f64 values, u32 columns, sorted rows),
//!    validated on construction; transpose, row lengths.
//! 2. [`gen`]: seeded generators (R-MAT, stencils, banded, uniform random)
//!    on a small PRNG of our own, so a seed gives the same matrix on every
//!    machine and every version of every dependency.
//! 3. [`mtx`]: a Matrix Market (`.mtx`) reader whose errors name the line.
//! 4. [`reference`]: Gustavson's row-by-row product, the count of
//!    intermediate products (the GFLOP/s numerator), and [`compare`], the
//!    rule a GPU result must pass.
//!
//! All of it is host code with no dependency beyond `std` and `thiserror`.

pub mod csr;
pub mod cusparse;
pub mod device;
pub mod gen;
pub mod gpu;
pub mod mtx;
pub mod problem;
pub mod reference;

pub use csr::{Csr, CsrError};
pub use device::DeviceCsr;
pub use gen::Rng;
pub use mtx::{read_mtx, read_mtx_str, MtxError, MtxErrorKind};
pub use reference::{compare, count_products, multiply, multiply_transpose, Mismatch, Product};

/// What can go wrong building, generating, reading or multiplying matrices.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The arrays do not describe a valid CSR matrix.
    #[error("invalid CSR matrix: {0}")]
    Csr(#[from] CsrError),
    /// A generator was asked for something it cannot build.
    #[error("invalid generator parameter: {0}")]
    Parameter(String),
    /// A Matrix Market file is malformed or unsupported.
    #[error("{0}")]
    Mtx(#[from] MtxError),
    /// A file could not be read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// What the operating system said.
        message: String,
    },
    /// The inner dimensions of a product differ.
    #[error("cannot multiply a {a_rows}x{a_cols} matrix by a {b_rows}x{b_cols} matrix")]
    Shape {
        /// Rows of the left operand.
        a_rows: usize,
        /// Columns of the left operand.
        a_cols: usize,
        /// Rows of the right operand.
        b_rows: usize,
        /// Columns of the right operand.
        b_cols: usize,
    },
}
