//! Compressed sparse row matrices.
//!
//! A [`Csr`] always satisfies, checked by [`Csr::new`] and
//! [`Csr::check_invariants`]:
//!
//! - `row_offsets.len() == rows + 1`, `row_offsets[0] == 0`, the offsets never
//!   decrease, and `row_offsets[rows] == nnz == col_indices.len() == values.len()`;
//! - the columns of each row strictly increase (sorted, no duplicates) and are
//!   all `< cols`;
//! - `rows` and `cols` are at most `u32::MAX`, so every row and column index
//!   fits a `u32` (the type the GPU kernels use).
//!
//! Offsets are `usize`: products of the inputs the demo runs exceed 2^31
//! nonzeros in their intermediate form, and the output may exceed 2^32.

use super::Error;

/// The largest number of rows or columns a [`Csr`] may have.
pub const MAX_DIM: usize = u32::MAX as usize;

/// Why a set of arrays is not a valid [`Csr`] matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// A dimension exceeds [`MAX_DIM`].
    #[error("{rows}x{cols} is too large: rows and columns must be at most {MAX_DIM}")]
    TooLarge {
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
    },
    /// `row_offsets` does not have `rows + 1` entries.
    #[error("row_offsets has {len} entries; {rows} rows need {}", rows + 1)]
    OffsetsLength {
        /// Entries in `row_offsets`.
        len: usize,
        /// Rows of the matrix.
        rows: usize,
    },
    /// `row_offsets[0]` is not zero.
    #[error("row_offsets[0] is {0}, not 0")]
    OffsetsStart(usize),
    /// `row_offsets[row + 1] < row_offsets[row]`.
    #[error("row_offsets decrease at row {row}: {start} then {end}")]
    OffsetsDecrease {
        /// The row whose end is before its start.
        row: usize,
        /// `row_offsets[row]`.
        start: usize,
        /// `row_offsets[row + 1]`.
        end: usize,
    },
    /// The last offset, column count and value count differ.
    #[error(
        "row_offsets ends at {last}, but there are {columns} column indices and {values} values"
    )]
    Lengths {
        /// `row_offsets[rows]`.
        last: usize,
        /// `col_indices.len()`.
        columns: usize,
        /// `values.len()`.
        values: usize,
    },
    /// A column index is not below the column count.
    #[error("row {row} has column {col}, but the matrix has {cols} columns")]
    ColumnOutOfRange {
        /// The row holding the entry.
        row: usize,
        /// The column index found.
        col: u32,
        /// Columns of the matrix.
        cols: usize,
    },
    /// A row's columns are not strictly increasing.
    #[error("row {row} is not sorted: column {col} follows column {prev}")]
    Unsorted {
        /// The row.
        row: usize,
        /// The earlier column.
        prev: u32,
        /// The column that should be greater than `prev`.
        col: u32,
    },
}

/// A sparse matrix in compressed sparse row form with f64 values. See the
/// module documentation for the invariants every value of this type keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct Csr {
    rows: usize,
    cols: usize,
    row_offsets: Vec<usize>,
    col_indices: Vec<u32>,
    values: Vec<f64>,
}

impl Csr {
    /// A matrix from its three arrays, after checking every invariant.
    ///
    /// # Time Complexity
    /// O(rows + nnz).
    pub fn new(
        rows: usize,
        cols: usize,
        row_offsets: Vec<usize>,
        col_indices: Vec<u32>,
        values: Vec<f64>,
    ) -> Result<Self, CsrError> {
        let m = Self {
            rows,
            cols,
            row_offsets,
            col_indices,
            values,
        };
        m.check_invariants()?;
        Ok(m)
    }

    /// A `rows` x `cols` matrix with no nonzeros.
    pub fn zeros(rows: usize, cols: usize) -> Result<Self, CsrError> {
        Self::new(rows, cols, vec![0; rows + 1], Vec::new(), Vec::new())
    }

    /// A matrix from `(row, col, value)` triplets in any order; entries at
    /// the same position are summed.
    ///
    /// # Time Complexity
    /// O(rows + nnz log(longest row)).
    pub fn from_triplets(
        rows: usize,
        cols: usize,
        triplets: &[(u32, u32, f64)],
    ) -> Result<Self, Error> {
        if rows > MAX_DIM || cols > MAX_DIM {
            return Err(CsrError::TooLarge { rows, cols }.into());
        }
        let mut counts = vec![0usize; rows + 1];
        for (k, &(r, c, _)) in triplets.iter().enumerate() {
            if r as usize >= rows || c as usize >= cols {
                return Err(Error::Parameter(format!(
                    "triplet {k} is at ({r}, {c}), outside a {rows}x{cols} matrix"
                )));
            }
            counts[r as usize + 1] += 1;
        }
        for i in 0..rows {
            counts[i + 1] += counts[i];
        }
        // Bucket by row (stable), then sort and merge each row.
        let mut next = counts.clone();
        let mut bucket = vec![(0u32, 0.0f64); triplets.len()];
        for &(r, c, v) in triplets {
            bucket[next[r as usize]] = (c, v);
            next[r as usize] += 1;
        }
        let mut row_offsets = Vec::with_capacity(rows + 1);
        let mut col_indices = Vec::with_capacity(triplets.len());
        let mut values = Vec::with_capacity(triplets.len());
        row_offsets.push(0);
        for i in 0..rows {
            let row = &mut bucket[counts[i]..counts[i + 1]];
            row.sort_by_key(|&(c, _)| c);
            for &(c, v) in row.iter() {
                if col_indices.len() > row_offsets[i] && col_indices.last() == Some(&c) {
                    *values.last_mut().expect("a column has a value") += v;
                } else {
                    col_indices.push(c);
                    values.push(v);
                }
            }
            row_offsets.push(col_indices.len());
        }
        Ok(Self::new(rows, cols, row_offsets, col_indices, values)?)
    }

    /// Checks every invariant of the type (see the module documentation).
    ///
    /// # Time Complexity
    /// O(rows + nnz).
    pub fn check_invariants(&self) -> Result<(), CsrError> {
        let (rows, cols) = (self.rows, self.cols);
        if rows > MAX_DIM || cols > MAX_DIM {
            return Err(CsrError::TooLarge { rows, cols });
        }
        let offsets = &self.row_offsets;
        if offsets.len() != rows + 1 {
            return Err(CsrError::OffsetsLength {
                len: offsets.len(),
                rows,
            });
        }
        if offsets[0] != 0 {
            return Err(CsrError::OffsetsStart(offsets[0]));
        }
        for (row, w) in offsets.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(CsrError::OffsetsDecrease {
                    row,
                    start: w[0],
                    end: w[1],
                });
            }
        }
        let last = offsets[rows];
        if last != self.col_indices.len() || last != self.values.len() {
            return Err(CsrError::Lengths {
                last,
                columns: self.col_indices.len(),
                values: self.values.len(),
            });
        }
        for row in 0..rows {
            let columns = &self.col_indices[offsets[row]..offsets[row + 1]];
            for (k, &col) in columns.iter().enumerate() {
                if col as usize >= cols {
                    return Err(CsrError::ColumnOutOfRange { row, col, cols });
                }
                if k > 0 && columns[k - 1] >= col {
                    return Err(CsrError::Unsorted {
                        row,
                        prev: columns[k - 1],
                        col,
                    });
                }
            }
        }
        Ok(())
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Stored entries (explicit zeros included).
    pub fn nnz(&self) -> usize {
        self.col_indices.len()
    }

    /// `rows + 1` offsets: row `i` is `row_offsets[i]..row_offsets[i + 1]`.
    pub fn row_offsets(&self) -> &[usize] {
        &self.row_offsets
    }

    /// The column of each entry, row by row, increasing within a row.
    pub fn col_indices(&self) -> &[u32] {
        &self.col_indices
    }

    /// The value of each entry, in the order of [`Csr::col_indices`].
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The columns and values of row `i`.
    ///
    /// # Panics
    /// If `i >= rows` (an index error, like slice indexing).
    pub fn row(&self, i: usize) -> (&[u32], &[f64]) {
        let range = self.row_offsets[i]..self.row_offsets[i + 1];
        (&self.col_indices[range.clone()], &self.values[range])
    }

    /// The number of entries of row `i`.
    ///
    /// # Panics
    /// If `i >= rows`.
    pub fn row_len(&self, i: usize) -> usize {
        self.row_offsets[i + 1] - self.row_offsets[i]
    }

    /// The number of entries of every row.
    pub fn row_lengths(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.row_offsets.windows(2).map(|w| w[1] - w[0])
    }

    /// The longest row's length (0 for a matrix without rows).
    pub fn max_row_len(&self) -> usize {
        self.row_lengths().max().unwrap_or(0)
    }

    /// The three arrays, giving up the matrix.
    pub fn into_parts(self) -> (Vec<usize>, Vec<u32>, Vec<f64>) {
        (self.row_offsets, self.col_indices, self.values)
    }

    /// The transpose, rows sorted.
    ///
    /// # Time Complexity
    /// O(rows + cols + nnz).
    pub fn transpose(&self) -> Self {
        let mut offsets = vec![0usize; self.cols + 1];
        for &c in &self.col_indices {
            offsets[c as usize + 1] += 1;
        }
        for j in 0..self.cols {
            offsets[j + 1] += offsets[j];
        }
        let mut next = offsets.clone();
        let mut col_indices = vec![0u32; self.nnz()];
        let mut values = vec![0.0; self.nnz()];
        // Rows are visited in increasing order, so each output row is sorted.
        for i in 0..self.rows {
            let (cols, vals) = self.row(i);
            for (&c, &v) in cols.iter().zip(vals) {
                let slot = &mut next[c as usize];
                col_indices[*slot] = i as u32;
                values[*slot] = v;
                *slot += 1;
            }
        }
        let t = Self {
            rows: self.cols,
            cols: self.rows,
            row_offsets: offsets,
            col_indices,
            values,
        };
        debug_assert_eq!(t.check_invariants(), Ok(()));
        t
    }

    /// The dense form, row-major (for tests on small matrices).
    pub fn to_dense(&self) -> Vec<Vec<f64>> {
        let mut dense = vec![vec![0.0; self.cols]; self.rows];
        for (i, row) in dense.iter_mut().enumerate() {
            let (cols, vals) = self.row(i);
            for (&c, &v) in cols.iter().zip(vals) {
                row[c as usize] = v;
            }
        }
        dense
    }

    /// A 64-bit FNV-1a hash of the shape, offsets, columns and value bits:
    /// equal matrices give equal checksums on every machine.
    pub fn checksum(&self) -> u64 {
        let mut h = Fnv::new();
        h.word(self.rows as u64);
        h.word(self.cols as u64);
        self.row_offsets.iter().for_each(|&o| h.word(o as u64));
        self.col_indices.iter().for_each(|&c| h.word(c.into()));
        self.values.iter().for_each(|v| h.word(v.to_bits()));
        h.0
    }
}

/// FNV-1a over little-endian 64-bit words.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, w: u64) {
        for b in w.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Csr {
        // [1 0 2]
        // [0 0 0]
        // [0 3 4]
        Csr::new(
            3,
            3,
            vec![0, 2, 2, 4],
            vec![0, 2, 1, 2],
            vec![1., 2., 3., 4.],
        )
        .unwrap()
    }

    #[test]
    fn accessors() {
        let m = small();
        assert_eq!((m.rows(), m.cols(), m.nnz()), (3, 3, 4));
        assert_eq!(m.row_lengths().collect::<Vec<_>>(), [2, 0, 2]);
        assert_eq!(m.max_row_len(), 2);
        assert_eq!(m.row(2), (&[1u32, 2][..], &[3.0, 4.0][..]));
        assert_eq!(m.row_len(1), 0);
        assert_eq!(
            m.to_dense(),
            [[1., 0., 2.], [0., 0., 0.], [0., 3., 4.]].map(Vec::from)
        );
    }

    #[test]
    fn every_invalid_input_is_an_error() {
        let bad =
            |r, c, o: Vec<usize>, i: Vec<u32>, v: Vec<f64>| Csr::new(r, c, o, i, v).unwrap_err();
        assert_eq!(
            bad(2, 2, vec![0, 1], vec![0], vec![1.]),
            CsrError::OffsetsLength { len: 2, rows: 2 }
        );
        assert_eq!(
            bad(1, 2, vec![1, 1], vec![], vec![]),
            CsrError::OffsetsStart(1)
        );
        assert_eq!(
            bad(2, 2, vec![0, 2, 1], vec![0, 1], vec![1., 1.]),
            CsrError::OffsetsDecrease {
                row: 1,
                start: 2,
                end: 1
            }
        );
        assert_eq!(
            bad(1, 2, vec![0, 2], vec![0], vec![1., 1.]),
            CsrError::Lengths {
                last: 2,
                columns: 1,
                values: 2
            }
        );
        assert_eq!(
            bad(1, 2, vec![0, 1], vec![2], vec![1.]),
            CsrError::ColumnOutOfRange {
                row: 0,
                col: 2,
                cols: 2
            }
        );
        assert_eq!(
            bad(1, 3, vec![0, 2], vec![2, 1], vec![1., 1.]),
            CsrError::Unsorted {
                row: 0,
                prev: 2,
                col: 1
            }
        );
        assert_eq!(
            bad(1, 3, vec![0, 2], vec![1, 1], vec![1., 1.]),
            CsrError::Unsorted {
                row: 0,
                prev: 1,
                col: 1
            }
        );
        assert!(matches!(
            bad(MAX_DIM + 1, 1, vec![], vec![], vec![]),
            CsrError::TooLarge { .. }
        ));
        // An empty offsets array does not panic either.
        assert_eq!(
            bad(0, 0, vec![], vec![], vec![]),
            CsrError::OffsetsLength { len: 0, rows: 0 }
        );
    }

    #[test]
    fn triplets_are_sorted_and_duplicates_summed() {
        let m = Csr::from_triplets(
            3,
            3,
            &[(2, 2, 4.), (0, 2, 1.5), (2, 1, 3.), (0, 0, 1.), (0, 2, 0.5)],
        )
        .unwrap();
        assert_eq!(m, small());
        assert!(Csr::from_triplets(2, 2, &[(0, 2, 1.)]).is_err());
        assert!(Csr::from_triplets(2, 2, &[(2, 0, 1.)]).is_err());
    }

    #[test]
    fn transpose_is_an_involution_and_matches_dense() {
        let m = small();
        let t = m.transpose();
        t.check_invariants().unwrap();
        let d = m.to_dense();
        for (i, row) in t.to_dense().iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                assert_eq!(v, d[j][i]);
            }
        }
        assert_eq!(t.transpose(), m);
        let wide = Csr::from_triplets(2, 5, &[(0, 4, 1.), (1, 0, 2.)]).unwrap();
        assert_eq!((wide.transpose().rows(), wide.transpose().cols()), (5, 2));
        assert_eq!(wide.transpose().transpose(), wide);
    }

    #[test]
    fn empty_matrices() {
        for (r, c) in [(0, 0), (0, 3), (3, 0), (4, 4)] {
            let z = Csr::zeros(r, c).unwrap();
            assert_eq!(z.nnz(), 0);
            assert_eq!(z.max_row_len(), 0);
            let t = z.transpose();
            assert_eq!((t.rows(), t.cols(), t.nnz()), (c, r, 0));
        }
    }

    #[test]
    fn checksum_sees_values_and_structure() {
        let m = small();
        let mut other = m.clone().into_parts();
        other.2[0] = 1.0 + f64::EPSILON;
        let changed = Csr::new(3, 3, other.0, other.1, other.2).unwrap();
        assert_ne!(m.checksum(), changed.checksum());
        assert_ne!(
            Csr::zeros(2, 3).unwrap().checksum(),
            Csr::zeros(3, 2).unwrap().checksum()
        );
    }
}
