//! The CPU reference: Gustavson's row-by-row product, and the rule a GPU
//! result must pass to count as correct.
//!
//! Row i of C = A x B is the sum over the entries a_ik of row i of A of a_ik
//! times row k of B. Each such multiply-add is an *intermediate product*;
//! their count (the sum over a_ik of nnz(B row k)) is what GFLOP/s figures
//! use: 2 x products / time.
//!
//! The pattern of C is symbolic: an entry exists wherever some a_ik b_kj
//! was formed, even if the products cancel to zero, as in cuSPARSE.
//!
//! A result is correct ([`compare`]) when it has the reference's pattern and
//! every value lies within [`TOLERANCE`] x (sum of |a_ik b_kj|) of the
//! reference's. The bound is relative to the absolute sum, not the value, so
//! that sums taken in another order, and sums that cancel, are judged fairly.

use super::csr::Csr;
use super::Error;

/// The relative tolerance of [`compare`], against the sum of the absolute
/// values of an entry's products.
pub const TOLERANCE: f64 = 1e-12;

/// Below this many intermediate products, one thread does the whole product.
const PARALLEL_THRESHOLD: u64 = 1 << 20;

/// A product C = A x B with what checking and reporting it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Product {
    /// The product, columns sorted in each row.
    pub c: Csr,
    /// For each entry of `c` (in the order of its values), the sum of the
    /// absolute values of the products that formed it.
    pub abs_sums: Vec<f64>,
    /// The number of intermediate products (multiply-adds).
    pub products: u64,
}

fn check_shape(a: &Csr, (b_rows, b_cols): (usize, usize)) -> Result<(), Error> {
    if a.cols() != b_rows {
        return Err(Error::Shape {
            a_rows: a.rows(),
            a_cols: a.cols(),
            b_rows,
            b_cols,
        });
    }
    Ok(())
}

/// The number of intermediate products of A x B, without forming it.
///
/// # Time Complexity
/// O(nnz(A)).
pub fn count_products(a: &Csr, b: &Csr) -> Result<u64, Error> {
    check_shape(a, (b.rows(), b.cols()))?;
    Ok(a.col_indices()
        .iter()
        .map(|&k| b.row_len(k as usize) as u64)
        .sum())
}

/// C = A x B, on as many threads as the machine has when the product is
/// large. The result does not depend on the number of threads.
///
/// # Time Complexity
/// O(products + nnz(C) log(longest row of C) + rows), with a dense
/// accumulator of `B.cols()` entries per thread.
pub fn multiply(a: &Csr, b: &Csr) -> Result<Product, Error> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    multiply_on(a, b, threads)
}

/// C = A x B^T (for B = A, the Gram matrix A A^T).
pub fn multiply_transpose(a: &Csr, b: &Csr) -> Result<Product, Error> {
    check_shape(a, (b.cols(), b.rows()))?;
    multiply(a, &b.transpose())
}

/// [`multiply`] on at most `threads` threads.
pub fn multiply_on(a: &Csr, b: &Csr, threads: usize) -> Result<Product, Error> {
    check_shape(a, (b.rows(), b.cols()))?;
    // Work per row, to split the rows into chunks of equal work.
    let work: Vec<u64> = (0..a.rows())
        .map(|i| {
            a.row(i)
                .0
                .iter()
                .map(|&k| b.row_len(k as usize) as u64)
                .sum()
        })
        .collect();
    let products: u64 = work.iter().sum();
    let threads = if products < PARALLEL_THRESHOLD {
        1
    } else {
        threads.clamp(1, a.rows().max(1))
    };
    let mut bounds = vec![0usize];
    let mut done = 0u64;
    for (i, &w) in work.iter().enumerate() {
        done += w;
        let next = bounds.len() as u64;
        if next < threads as u64 && done * threads as u64 >= next * products {
            bounds.push(i + 1);
        }
    }
    bounds.push(a.rows());
    bounds.dedup();

    let chunks: Vec<Chunk> = if bounds.len() <= 2 {
        vec![multiply_rows(a, b, 0..a.rows())]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = bounds
                .windows(2)
                .map(|w| {
                    let rows = w[0]..w[1];
                    s.spawn(move || multiply_rows(a, b, rows))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };

    let nnz: usize = chunks.iter().map(|c| c.cols.len()).sum();
    let mut offsets = Vec::with_capacity(a.rows() + 1);
    let mut cols = Vec::with_capacity(nnz);
    let mut vals = Vec::with_capacity(nnz);
    let mut abs_sums = Vec::with_capacity(nnz);
    offsets.push(0);
    for chunk in chunks {
        for len in chunk.row_lens {
            offsets.push(offsets.last().copied().unwrap_or(0) + len);
        }
        cols.extend_from_slice(&chunk.cols);
        vals.extend_from_slice(&chunk.vals);
        abs_sums.extend_from_slice(&chunk.abs);
    }
    let c = Csr::new(a.rows(), b.cols(), offsets, cols, vals)?;
    Ok(Product {
        c,
        abs_sums,
        products,
    })
}

/// The rows of C one thread computed.
struct Chunk {
    row_lens: Vec<usize>,
    cols: Vec<u32>,
    vals: Vec<f64>,
    abs: Vec<f64>,
}

/// Rows `rows` of A x B with a dense accumulator: `mark[j] == i + 1` iff
/// column j of row i has been touched, and then `value[j]` and `abs[j]` hold
/// its partial sums.
fn multiply_rows(a: &Csr, b: &Csr, rows: std::ops::Range<usize>) -> Chunk {
    let n = b.cols();
    let mut mark = vec![0u32; n];
    let mut value = vec![0.0f64; n];
    let mut abs = vec![0.0f64; n];
    let mut touched: Vec<u32> = Vec::new();
    let mut out = Chunk {
        row_lens: Vec::with_capacity(rows.len()),
        cols: Vec::new(),
        vals: Vec::new(),
        abs: Vec::new(),
    };
    for i in rows {
        // Rows are at most u32::MAX, so i + 1 fits a u32.
        let stamp = i as u32 + 1;
        touched.clear();
        let (a_cols, a_vals) = a.row(i);
        for (&k, &a_ik) in a_cols.iter().zip(a_vals) {
            let (b_cols, b_vals) = b.row(k as usize);
            for (&j, &b_kj) in b_cols.iter().zip(b_vals) {
                let p = a_ik * b_kj;
                let j_us = j as usize;
                if mark[j_us] == stamp {
                    value[j_us] += p;
                    abs[j_us] += p.abs();
                } else {
                    mark[j_us] = stamp;
                    value[j_us] = p;
                    abs[j_us] = p.abs();
                    touched.push(j);
                }
            }
        }
        touched.sort_unstable();
        out.row_lens.push(touched.len());
        for &j in &touched {
            out.cols.push(j);
            out.vals.push(value[j as usize]);
            out.abs.push(abs[j as usize]);
        }
    }
    out
}

/// The first way a result differs from the reference.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Mismatch {
    /// The matrices have different dimensions.
    #[error("shape: got {got_rows}x{got_cols}, reference {want_rows}x{want_cols}")]
    Shape {
        /// Rows of the result.
        got_rows: usize,
        /// Columns of the result.
        got_cols: usize,
        /// Rows of the reference.
        want_rows: usize,
        /// Columns of the reference.
        want_cols: usize,
    },
    /// The reference's `abs_sums` do not match its matrix (a bug in the
    /// caller, reported rather than a panic).
    #[error("the reference has {abs_sums} absolute sums for {nnz} entries")]
    Reference {
        /// Entries of the reference.
        nnz: usize,
        /// Its absolute sums.
        abs_sums: usize,
    },
    /// A row has a different number of entries.
    #[error("row {row}: got {got} entries, reference {want}")]
    RowLength {
        /// The row.
        row: usize,
        /// Entries in the result.
        got: usize,
        /// Entries in the reference.
        want: usize,
    },
    /// A row has the right length but a different column.
    #[error("row {row}, entry {position}: got column {got}, reference column {want}")]
    Column {
        /// The row.
        row: usize,
        /// The entry's position within the row.
        position: usize,
        /// The result's column.
        got: u32,
        /// The reference's column.
        want: u32,
    },
    /// A value is outside the tolerance.
    #[error(
        "row {row}, column {col}: got {got:e}, reference {want:e}; difference {:e} exceeds \
         {TOLERANCE:e} x {abs_sum:e} (the sum of |a_ik b_kj|)",
        (got - want).abs()
    )]
    Value {
        /// The row.
        row: usize,
        /// The column.
        col: u32,
        /// The result's value.
        got: f64,
        /// The reference's value.
        want: f64,
        /// The sum of the absolute values of the entry's products.
        abs_sum: f64,
    },
}

/// Checks a result against the reference: same shape, same pattern, and
/// each value within [`TOLERANCE`] x its absolute sum (NaN never passes).
/// Returns the first mismatch in row order.
///
/// # Time Complexity
/// O(rows + nnz).
pub fn compare(got: &Csr, reference: &Product) -> Result<(), Mismatch> {
    let want = &reference.c;
    if (got.rows(), got.cols()) != (want.rows(), want.cols()) {
        return Err(Mismatch::Shape {
            got_rows: got.rows(),
            got_cols: got.cols(),
            want_rows: want.rows(),
            want_cols: want.cols(),
        });
    }
    if reference.abs_sums.len() != want.nnz() {
        return Err(Mismatch::Reference {
            nnz: want.nnz(),
            abs_sums: reference.abs_sums.len(),
        });
    }
    for row in 0..want.rows() {
        let (g_cols, g_vals) = got.row(row);
        let (w_cols, w_vals) = want.row(row);
        if g_cols.len() != w_cols.len() {
            return Err(Mismatch::RowLength {
                row,
                got: g_cols.len(),
                want: w_cols.len(),
            });
        }
        if let Some(position) = g_cols.iter().zip(w_cols).position(|(g, w)| g != w) {
            return Err(Mismatch::Column {
                row,
                position,
                got: g_cols[position],
                want: w_cols[position],
            });
        }
        let start = want.row_offsets()[row];
        let abs = &reference.abs_sums[start..start + w_cols.len()];
        for (e, ((&g, &w), &abs_sum)) in g_vals.iter().zip(w_vals).zip(abs).enumerate() {
            let within = (g - w).abs() <= TOLERANCE * abs_sum;
            // NaN compares false, so it fails here.
            if !within {
                return Err(Mismatch::Value {
                    row,
                    col: w_cols[e],
                    got: g,
                    want: w,
                    abs_sum,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::gen::{self, Rng};
    use super::*;

    /// A `rows` x `cols` matrix with each entry present with probability
    /// `density`, values in [-1, 1).
    fn random(rows: usize, cols: usize, density: f64, rng: &mut Rng) -> Csr {
        let mut t = Vec::new();
        for i in 0..rows {
            for j in 0..cols {
                if rng.unit() < density {
                    t.push((i as u32, j as u32, 2.0 * rng.unit() - 1.0));
                }
            }
        }
        Csr::from_triplets(rows, cols, &t).unwrap()
    }

    type Dense<T> = Vec<Vec<T>>;

    /// The dense triple loop: values, absolute sums, symbolic pattern, and
    /// the product count.
    fn dense_product(a: &Csr, b: &Csr) -> (Dense<f64>, Dense<f64>, Dense<bool>, u64) {
        let (da, db) = (a.to_dense(), b.to_dense());
        let stored = |m: &Csr| {
            let mut s = vec![vec![false; m.cols()]; m.rows()];
            for (i, row) in s.iter_mut().enumerate() {
                m.row(i).0.iter().for_each(|&j| row[j as usize] = true);
            }
            s
        };
        let (sa, sb) = (stored(a), stored(b));
        let (n, m) = (a.rows(), b.cols());
        let mut v = vec![vec![0.0; m]; n];
        let mut abs = vec![vec![0.0; m]; n];
        let mut pattern = vec![vec![false; m]; n];
        let mut products = 0;
        for i in 0..n {
            for k in 0..a.cols() {
                for j in 0..m {
                    if sa[i][k] && sb[k][j] {
                        v[i][j] += da[i][k] * db[k][j];
                        abs[i][j] += (da[i][k] * db[k][j]).abs();
                        pattern[i][j] = true;
                        products += 1;
                    }
                }
            }
        }
        (v, abs, pattern, products)
    }

    fn check_against_dense(a: &Csr, b: &Csr, p: &Product) {
        let (v, abs, pattern, products) = dense_product(a, b);
        assert_eq!(p.products, products);
        assert_eq!(count_products(a, b).unwrap(), products);
        p.c.check_invariants().unwrap();
        assert_eq!(p.abs_sums.len(), p.c.nnz());
        for i in 0..a.rows() {
            let (cols, vals) = p.c.row(i);
            let expected: Vec<u32> = (0..b.cols() as u32)
                .filter(|&j| pattern[i][j as usize])
                .collect();
            assert_eq!(cols, expected, "row {i}");
            let start = p.c.row_offsets()[i];
            for (e, (&j, &x)) in cols.iter().zip(vals).enumerate() {
                let j = j as usize;
                assert!((x - v[i][j]).abs() <= 1e-14 * abs[i][j], "({i}, {j})");
                assert!((p.abs_sums[start + e] - abs[i][j]).abs() <= 1e-14 * abs[i][j]);
            }
        }
    }

    #[test]
    fn matches_the_dense_triple_loop() {
        let mut rng = Rng::new(2024);
        for round in 0..40 {
            let n = 1 + rng.below(12) as usize;
            let k = rng.below(12) as usize;
            let m = 1 + rng.below(12) as usize;
            let density = [0.05, 0.2, 0.5, 1.0][round % 4];
            let a = random(n, k, density, &mut rng);
            let b = random(k, m, density, &mut rng);
            check_against_dense(&a, &b, &multiply(&a, &b).unwrap());
            let p = multiply_transpose(&a, &a).unwrap();
            check_against_dense(&a, &a.transpose(), &p);
        }
    }

    #[test]
    fn a_times_a_transpose_is_exactly_symmetric() {
        let a = gen::rmat(9, 6, 3).unwrap();
        let p = multiply_transpose(&a, &a).unwrap();
        assert_eq!((p.c.rows(), p.c.cols()), (a.rows(), a.rows()));
        assert_eq!(p.c.transpose(), p.c);
        // The products of A A^T are the sum of squared row lengths.
        let expected: u64 = a.transpose().row_lengths().map(|l| (l * l) as u64).sum();
        assert_eq!(p.products, expected);
        let rect = gen::uniform(30, 4, 9).unwrap();
        let rect = Csr::from_triplets(
            30,
            45,
            &(0..30)
                .flat_map(|i| rect.row(i).0.iter().map(move |&j| (i as u32, j + 15, 1.0)))
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let p = multiply_transpose(&rect, &rect).unwrap();
        assert_eq!((p.c.rows(), p.c.cols()), (30, 30));
        check_against_dense(&rect, &rect.transpose(), &p);
    }

    #[test]
    fn threads_do_not_change_the_result() {
        let a = gen::rmat(12, 8, 5).unwrap();
        let one = multiply_on(&a, &a, 1).unwrap();
        assert!(one.products >= PARALLEL_THRESHOLD, "too small to split");
        for threads in [2, 3, 7] {
            assert_eq!(multiply_on(&a, &a, threads).unwrap(), one);
        }
        compare(&one.c, &one).unwrap();
    }

    #[test]
    fn empty_matrices_and_rows_without_output() {
        for (n, k, m) in [(0, 0, 0), (3, 0, 4), (0, 5, 2), (2, 3, 0)] {
            let a = Csr::zeros(n, k).unwrap();
            let b = Csr::zeros(k, m).unwrap();
            let p = multiply(&a, &b).unwrap();
            assert_eq!(
                (p.c.rows(), p.c.cols(), p.c.nnz(), p.products),
                (n, m, 0, 0)
            );
            compare(&p.c, &p).unwrap();
        }
        // Row 0 of A is empty; row 1 reaches only row 2 of B, which is empty;
        // row 2 has output.
        let a = Csr::from_triplets(3, 3, &[(1, 2, 1.0), (2, 0, 2.0)]).unwrap();
        let b = Csr::from_triplets(3, 2, &[(0, 1, 3.0), (1, 0, 1.0)]).unwrap();
        let p = multiply(&a, &b).unwrap();
        assert_eq!(p.c.row_lengths().collect::<Vec<_>>(), [0, 0, 1]);
        assert_eq!(p.c.row(2), (&[1u32][..], &[6.0][..]));
        assert_eq!(p.products, 1);
    }

    #[test]
    fn shapes_must_agree() {
        let a = Csr::zeros(2, 3).unwrap();
        assert!(matches!(multiply(&a, &a), Err(Error::Shape { .. })));
        assert!(matches!(count_products(&a, &a), Err(Error::Shape { .. })));
        let b = Csr::zeros(4, 3).unwrap();
        assert_eq!(multiply_transpose(&a, &b).unwrap().c.cols(), 4);
        assert!(multiply_transpose(&a, &Csr::zeros(3, 2).unwrap()).is_err());
    }

    #[test]
    fn stencil_squares_have_the_wider_stencil() {
        // 5-point squared: every (dx, dy) with |dx| + |dy| <= 2.
        let n = 7usize;
        let p = multiply(
            &gen::stencil_2d_5pt(n).unwrap(),
            &gen::stencil_2d_5pt(n).unwrap(),
        )
        .unwrap();
        let mut expected = 0;
        for dx in -2i64..=2 {
            for dy in -2i64..=2 {
                if dx.abs() + dy.abs() <= 2 {
                    expected += (n as i64 - dx.abs()) * (n as i64 - dy.abs());
                }
            }
        }
        assert_eq!(p.c.nnz() as i64, expected);
        // 27-point squared: the 125-point stencil, (5n - 6)^3 entries.
        let a = gen::stencil_3d_27pt(6).unwrap();
        let p = multiply(&a, &a).unwrap();
        assert_eq!(p.c.nnz(), 24 * 24 * 24);
        let row_sums: u64 = a.row_lengths().map(|l| (l * l) as u64).sum();
        assert_eq!(p.products, row_sums, "A is symmetric");
    }

    /// The values of A x B summed in the opposite order (k descending) on the
    /// reference's pattern.
    fn reversed_sums(a: &Csr, b: &Csr, reference: &Product) -> Csr {
        let (da, db) = (a.to_dense(), b.to_dense());
        let c = &reference.c;
        let mut vals = Vec::with_capacity(c.nnz());
        for (i, a_row) in da.iter().enumerate() {
            for &j in c.row(i).0 {
                vals.push(
                    (0..a.cols())
                        .rev()
                        .map(|k| a_row[k] * db[k][j as usize])
                        .sum(),
                );
            }
        }
        Csr::new(
            c.rows(),
            c.cols(),
            c.row_offsets().to_vec(),
            c.col_indices().to_vec(),
            vals,
        )
        .unwrap()
    }

    #[test]
    fn compare_accepts_reordered_sums_and_cancellation() {
        let mut rng = Rng::new(77);
        let a = random(40, 40, 0.3, &mut rng);
        let p = multiply(&a, &a).unwrap();
        let reordered = reversed_sums(&a, &a, &p);
        assert_ne!(
            reordered.values(),
            p.c.values(),
            "the test sums in the same order"
        );
        compare(&reordered, &p).unwrap();

        // 1 * 1 + 1 * (-1): the reference is exactly 0; a result off by a
        // rounding error passes, one off by more does not.
        let a = Csr::from_triplets(1, 2, &[(0, 0, 1.0), (0, 1, 1.0)]).unwrap();
        let b = Csr::from_triplets(2, 1, &[(0, 0, 1.0), (1, 0, -1.0)]).unwrap();
        let p = multiply(&a, &b).unwrap();
        assert_eq!((p.c.values(), &p.abs_sums[..]), (&[0.0][..], &[2.0][..]));
        let near = Csr::new(1, 1, vec![0, 1], vec![0], vec![1e-16]).unwrap();
        compare(&near, &p).unwrap();
        let far = Csr::new(1, 1, vec![0, 1], vec![0], vec![1e-11]).unwrap();
        assert!(matches!(
            compare(&far, &p),
            Err(Mismatch::Value { row: 0, col: 0, .. })
        ));
    }

    #[test]
    fn compare_rejects_wrong_patterns_and_values() {
        let a = gen::uniform(50, 5, 1).unwrap();
        let p = multiply(&a, &a).unwrap();
        let (offsets, cols, vals) = p.c.clone().into_parts();
        let rebuild = |o: Vec<usize>, c: Vec<u32>, v: Vec<f64>| Csr::new(50, 50, o, c, v).unwrap();

        // A value off by 10^-9 of its absolute sum, in row 3.
        let e = offsets[3] + 1;
        let mut v = vals.clone();
        v[e] += 1e-9 * p.abs_sums[e];
        let err = compare(&rebuild(offsets.clone(), cols.clone(), v), &p).unwrap_err();
        assert!(matches!(err, Mismatch::Value { row: 3, .. }), "{err}");
        assert!(err
            .to_string()
            .starts_with(&format!("row 3, column {}: got", cols[e])));

        // NaN never passes.
        let mut v = vals.clone();
        v[0] = f64::NAN;
        assert!(compare(&rebuild(offsets.clone(), cols.clone(), v), &p).is_err());

        // A column moved within row 2 (kept sorted, so it is a valid matrix).
        let row2 = offsets[2]..offsets[3];
        let mut c = cols.clone();
        let (last, free) = (
            row2.end - 1,
            (0..50)
                .rev()
                .find(|j| !cols[row2.clone()].contains(j))
                .unwrap(),
        );
        if free > c[last - 1] {
            c[last] = free;
            let err = compare(&rebuild(offsets.clone(), c, vals.clone()), &p).unwrap_err();
            assert!(matches!(err, Mismatch::Column { row: 2, .. }), "{err}");
        }

        // An entry dropped from row 4.
        let mut o = offsets.clone();
        let (mut c, mut v) = (cols.clone(), vals.clone());
        c.remove(offsets[4]);
        v.remove(offsets[4]);
        o[5..].iter_mut().for_each(|x| *x -= 1);
        let err = compare(&rebuild(o, c, v), &p).unwrap_err();
        assert_eq!(
            err,
            Mismatch::RowLength {
                row: 4,
                got: p.c.row_len(4) - 1,
                want: p.c.row_len(4)
            }
        );

        // Wrong shape, and an empty result where one was expected (the
        // failure cuSPARSE showed past 2^31 products).
        let err = compare(&Csr::zeros(50, 49).unwrap(), &p).unwrap_err();
        assert!(matches!(err, Mismatch::Shape { .. }));
        let err = compare(&Csr::zeros(50, 50).unwrap(), &p).unwrap_err();
        assert!(matches!(err, Mismatch::RowLength { row: 0, got: 0, .. }));

        let short = Product {
            abs_sums: vec![],
            ..p.clone()
        };
        assert!(matches!(
            compare(&p.c, &short),
            Err(Mismatch::Reference { .. })
        ));
    }
}
