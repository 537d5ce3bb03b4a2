//! Seeded matrix generators.
//!
//! Every generator is a pure function of its arguments: the same seed gives
//! the same matrix (same [`Csr::checksum`]) on every machine, because the
//! random numbers come from [`Rng`], written here (SplitMix64 seeding
//! xoshiro256**), not from a crate whose streams may change between versions.
//!
//! Random values lie in [`VALUES`]; stencils carry the Laplacian's values
//! (positive centre, -1 off the diagonal), so their products cancel.

use super::csr::{Csr, MAX_DIM};
use super::Error;
use std::ops::Range;

/// The range of every randomly drawn value.
pub const VALUES: Range<f64> = 0.5..1.5;

/// A small, fast, seedable PRNG: xoshiro256** (Blackman and Vigna), its
/// state filled from the seed by SplitMix64 as the authors recommend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose stream depends only on `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            splitmix64(x)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// A generator with this exact state (not all zero, or it yields only
    /// zeros).
    pub fn from_state(s: [u64; 4]) -> Self {
        Self { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` without bias (Lemire's multiply and reject).
    /// Returns 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform in [0, 1), with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [`VALUES`].
    pub fn value(&mut self) -> f64 {
        VALUES.start + (VALUES.end - VALUES.start) * self.unit()
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The quadrant probabilities of an R-MAT generator; `d = 1 - a - b - c`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmatParams {
    /// Top left (row bit 0, column bit 0).
    pub a: f64,
    /// Top right (row bit 0, column bit 1).
    pub b: f64,
    /// Bottom left (row bit 1, column bit 0).
    pub c: f64,
}

/// Graph500's parameters: a = 0.57, b = c = 0.19, d = 0.05.
pub const GRAPH500: RmatParams = RmatParams {
    a: 0.57,
    b: 0.19,
    c: 0.19,
};

/// An R-MAT (Kronecker) matrix with [`GRAPH500`]'s parameters: `2^scale`
/// rows and columns, `edges_per_row * 2^scale` edges drawn, duplicates
/// merged (so nnz is somewhat less), values in [`VALUES`]. Vertices are not
/// permuted: row 0 is the heaviest.
///
/// # Time Complexity
/// O(edges x scale) draws, then a sort of the edges.
pub fn rmat(scale: u32, edges_per_row: u32, seed: u64) -> Result<Csr, Error> {
    rmat_with(GRAPH500, scale, edges_per_row, seed)
}

/// [`rmat`] with other quadrant probabilities.
pub fn rmat_with(p: RmatParams, scale: u32, edges_per_row: u32, seed: u64) -> Result<Csr, Error> {
    let d = 1.0 - p.a - p.b - p.c;
    if ![p.a, p.b, p.c, d].iter().all(|x| (0.0..=1.0).contains(x)) {
        return Err(Error::Parameter(format!(
            "R-MAT probabilities {p:?} (d = {d}) must each lie in [0, 1]"
        )));
    }
    if scale > 31 {
        return Err(Error::Parameter(format!(
            "R-MAT scale {scale}: at most 31 (2^31 rows)"
        )));
    }
    let n = 1usize << scale;
    let edges = (edges_per_row as usize).checked_mul(n).ok_or_else(|| {
        Error::Parameter(format!("R-MAT: {edges_per_row} x 2^{scale} edges overflow"))
    })?;
    // Integer thresholds on 53-bit draws: identical on every machine.
    const ONE: f64 = (1u64 << 53) as f64;
    let ta = (p.a * ONE) as u64;
    let tab = ((p.a + p.b) * ONE) as u64;
    let tabc = ((p.a + p.b + p.c) * ONE) as u64;
    let mut rng = Rng::new(seed);
    let mut keys: Vec<u64> = Vec::with_capacity(edges);
    for _ in 0..edges {
        let (mut row, mut col) = (0u64, 0u64);
        for _ in 0..scale {
            let r = rng.next_u64() >> 11;
            let (rb, cb) = if r < ta {
                (0, 0)
            } else if r < tab {
                (0, 1)
            } else if r < tabc {
                (1, 0)
            } else {
                (1, 1)
            };
            row = row << 1 | rb;
            col = col << 1 | cb;
        }
        keys.push(row << 32 | col);
    }
    keys.sort_unstable();
    keys.dedup();
    from_sorted_keys(n, n, &keys, &mut rng)
}

/// A matrix whose entries are at the sorted, distinct `row << 32 | col`
/// keys, values drawn in key order.
fn from_sorted_keys(rows: usize, cols: usize, keys: &[u64], rng: &mut Rng) -> Result<Csr, Error> {
    let mut offsets = vec![0usize; rows + 1];
    for &k in keys {
        offsets[(k >> 32) as usize + 1] += 1;
    }
    for i in 0..rows {
        offsets[i + 1] += offsets[i];
    }
    let columns = keys.iter().map(|&k| k as u32).collect();
    let values = keys.iter().map(|_| rng.value()).collect();
    Ok(Csr::new(rows, cols, offsets, columns, values)?)
}

/// `n^dims` as a row count, or an error when it exceeds [`MAX_DIM`].
fn grid_rows(what: &str, n: usize, dims: u32) -> Result<usize, Error> {
    n.checked_pow(dims)
        .filter(|&r| r <= MAX_DIM)
        .ok_or_else(|| Error::Parameter(format!("{what}: {n}^{dims} rows exceed {MAX_DIM}")))
}

/// Builds a matrix row by row, columns pushed in increasing order.
struct Rows {
    offsets: Vec<usize>,
    cols: Vec<u32>,
    vals: Vec<f64>,
}

impl Rows {
    fn with_capacity(rows: usize, nnz: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            offsets,
            cols: Vec::with_capacity(nnz),
            vals: Vec::with_capacity(nnz),
        }
    }

    fn push(&mut self, col: usize, val: f64) {
        self.cols.push(col as u32);
        self.vals.push(val);
    }

    fn end_row(&mut self) {
        self.offsets.push(self.cols.len());
    }

    fn finish(self, rows: usize, cols: usize) -> Result<Csr, Error> {
        Ok(Csr::new(rows, cols, self.offsets, self.cols, self.vals)?)
    }
}

/// The 5-point Laplacian on an `n` x `n` grid: `n^2` rows, row `y * n + x`,
/// 4 on the diagonal and -1 for each neighbour; `5n^2 - 4n` nonzeros.
pub fn stencil_2d_5pt(n: usize) -> Result<Csr, Error> {
    let rows = grid_rows("2D stencil", n, 2)?;
    let mut m = Rows::with_capacity(rows, 5 * rows);
    for y in 0..n {
        for x in 0..n {
            let i = y * n + x;
            // In increasing column order.
            let neighbours = [
                (y > 0, i.wrapping_sub(n), -1.0),
                (x > 0, i.wrapping_sub(1), -1.0),
                (true, i, 4.0),
                (x + 1 < n, i + 1, -1.0),
                (y + 1 < n, i + n, -1.0),
            ];
            for (inside, j, v) in neighbours {
                if inside {
                    m.push(j, v);
                }
            }
            m.end_row();
        }
    }
    m.finish(rows, rows)
}

/// The 27-point stencil on an `n` x `n` x `n` grid: `n^3` rows, row
/// `(z * n + y) * n + x`, 26 on the diagonal and -1 for each of the up to 26
/// neighbours; `(3n - 2)^3` nonzeros.
pub fn stencil_3d_27pt(n: usize) -> Result<Csr, Error> {
    let rows = grid_rows("3D stencil", n, 3)?;
    let mut m = Rows::with_capacity(rows, 27 * rows);
    let n = n as isize;
    let inside = |v: isize| (0..n).contains(&v);
    for z in 0..n {
        for y in 0..n {
            for x in 0..n {
                // z outermost, so the columns increase.
                for dz in -1..=1 {
                    for dy in -1..=1 {
                        for dx in -1..=1 {
                            let (zz, yy, xx) = (z + dz, y + dy, x + dx);
                            if inside(zz) && inside(yy) && inside(xx) {
                                let centre = dz == 0 && dy == 0 && dx == 0;
                                let v = if centre { 26.0 } else { -1.0 };
                                m.push(((zz * n + yy) * n + xx) as usize, v);
                            }
                        }
                    }
                }
                m.end_row();
            }
        }
    }
    m.finish(rows, rows)
}

/// An `n` x `n` banded matrix: every entry with `|i - j| <= half_width`,
/// values in [`VALUES`]; `n(2w + 1) - w(w + 1)` nonzeros for `w < n`.
pub fn banded(n: usize, half_width: usize, seed: u64) -> Result<Csr, Error> {
    grid_rows("banded", n, 1)?;
    let mut rng = Rng::new(seed);
    let width = half_width.saturating_mul(2).saturating_add(1).min(n);
    let mut m = Rows::with_capacity(n, n * width);
    for i in 0..n {
        let lo = i.saturating_sub(half_width);
        let hi = i.saturating_add(half_width).min(n - 1);
        for j in lo..=hi {
            m.push(j, rng.value());
        }
        m.end_row();
    }
    m.finish(n, n)
}

/// An `n` x `n` matrix with exactly `k` distinct columns per row, chosen
/// uniformly (Floyd's sampling), values in [`VALUES`]; `n * k` nonzeros.
pub fn uniform(n: usize, k: usize, seed: u64) -> Result<Csr, Error> {
    grid_rows("uniform", n, 1)?;
    if k > n {
        return Err(Error::Parameter(format!(
            "uniform: {k} distinct columns per row do not fit in {n} columns"
        )));
    }
    let mut rng = Rng::new(seed);
    let mut m = Rows::with_capacity(n, n * k);
    let mut row: Vec<u32> = Vec::with_capacity(k);
    for _ in 0..n {
        row.clear();
        // Floyd: for j in n-k..n, take t in 0..=j, or j if t is taken; kept
        // sorted so the membership test is a binary search.
        for j in (n - k)..n {
            let t = rng.below(j as u64 + 1) as u32;
            let pick = match row.binary_search(&t) {
                Ok(_) => j as u32,
                Err(_) => t,
            };
            let at = row.binary_search(&pick).unwrap_err();
            row.insert(at, pick);
        }
        for &j in &row {
            m.push(j as usize, rng.value());
        }
        m.end_row();
    }
    m.finish(n, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_matches_the_published_algorithms() {
        // xoshiro256** from the reference implementation's state {1, 2, 3, 4}.
        let mut r = Rng::from_state([1, 2, 3, 4]);
        let first: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(first, [11520, 0, 1509978240, 1215971899390074240]);
        // SplitMix64's first output from state 0.
        assert_eq!(splitmix64(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn rng_ranges() {
        let mut r = Rng::new(7);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            assert!(VALUES.contains(&r.value()));
        }
        // Every residue of a small modulus shows up about equally.
        let mut hist = [0u32; 6];
        for _ in 0..60_000 {
            hist[r.below(6) as usize] += 1;
        }
        assert!(
            hist.iter().all(|&h| (9_000..11_000).contains(&h)),
            "{hist:?}"
        );
    }

    /// Fixed seeds give fixed matrices: if one of these changes, every
    /// published figure made with that seed changes too.
    #[test]
    fn seeds_give_fixed_matrices() {
        let got = [
            rmat(10, 8, 1).unwrap().checksum(),
            banded(100, 3, 2).unwrap().checksum(),
            uniform(200, 7, 3).unwrap().checksum(),
            stencil_2d_5pt(9).unwrap().checksum(),
            stencil_3d_27pt(5).unwrap().checksum(),
        ];
        assert_eq!(got, EXPECTED_CHECKSUMS, "{got:#x?}");
        assert_eq!(rmat(10, 8, 1).unwrap(), rmat(10, 8, 1).unwrap());
        assert_ne!(rmat(10, 8, 1).unwrap(), rmat(10, 8, 2).unwrap());
        assert_ne!(uniform(200, 7, 3).unwrap(), uniform(200, 7, 4).unwrap());
    }

    const EXPECTED_CHECKSUMS: [u64; 5] = [
        0x5dda_5222_6e64_5770,
        0xdfe4_91eb_7733_27d1,
        0xc2c9_4d3c_0529_57bb,
        0x80f7_a5db_a161_6924,
        0xb5e6_69db_ec39_aa80,
    ];

    #[test]
    fn rmat_rows_are_skewed() {
        let m = rmat(14, 16, 42).unwrap();
        assert_eq!((m.rows(), m.cols()), (1 << 14, 1 << 14));
        m.check_invariants().unwrap();
        // Duplicates merged: fewer entries than edges drawn, but most kept.
        assert!(m.nnz() < 16 << 14 && m.nnz() > 8 << 14, "nnz {}", m.nnz());
        let mean = m.nnz() as f64 / m.rows() as f64;
        assert!(
            m.max_row_len() as f64 > 50.0 * mean,
            "max {} mean {mean}",
            m.max_row_len()
        );
        // Power law: many rows are empty, unlike a uniform matrix.
        let empty = m.row_lengths().filter(|&l| l == 0).count();
        assert!(empty > m.rows() / 10, "{empty} empty rows");
        // Row 0 collects a + b = 76% of each level's draws: it is the longest.
        assert_eq!(m.row_len(0), m.max_row_len());
        assert!(m.values().iter().all(|v| VALUES.contains(v)));
    }

    #[test]
    fn rmat_edges() {
        let m = rmat(0, 5, 1).unwrap();
        assert_eq!((m.rows(), m.nnz()), (1, 1));
        assert_eq!(rmat(6, 0, 1).unwrap().nnz(), 0);
        assert!(rmat(32, 1, 1).is_err());
        let bad = RmatParams {
            a: 0.9,
            b: 0.1,
            c: 0.1,
        };
        assert!(rmat_with(bad, 4, 4, 1).is_err());
    }

    #[test]
    fn stencil_nnz_formulas() {
        for n in 0..12usize {
            let m = stencil_2d_5pt(n).unwrap();
            assert_eq!(m.rows(), n * n);
            assert_eq!(m.nnz(), 5 * n * n - 4 * n);
            let m = stencil_3d_27pt(n).unwrap();
            assert_eq!(m.rows(), n * n * n);
            let side = (3 * n).saturating_sub(2);
            assert_eq!(m.nnz(), side * side * side);
        }
        assert_eq!(stencil_3d_27pt(30).unwrap().nnz(), 88 * 88 * 88);
        assert!(stencil_2d_5pt(1 << 16).is_err());
        assert!(stencil_3d_27pt(1 << 11).is_err());
    }

    #[test]
    fn stencils_are_symmetric_laplacians() {
        for m in [stencil_2d_5pt(6).unwrap(), stencil_3d_27pt(4).unwrap()] {
            assert_eq!(m.transpose(), m);
            // Interior rows sum to zero; every row's sum is >= 0.
            for i in 0..m.rows() {
                let s: f64 = m.row(i).1.iter().sum();
                assert!(s >= 0.0);
            }
        }
        let m = stencil_3d_27pt(3).unwrap();
        assert_eq!(m.row_len(13), 27);
        assert_eq!(m.row(13).1.iter().sum::<f64>(), 0.0);
        assert_eq!(m.row_len(0), 8);
    }

    #[test]
    fn banded_nnz_and_shape() {
        for (n, w) in [
            (0, 2),
            (1, 0),
            (10, 0),
            (10, 3),
            (10, 9),
            (10, 50),
            (7, usize::MAX),
        ] {
            let m = banded(n, w, 5).unwrap();
            let ww = w.min(n.saturating_sub(1));
            assert_eq!(m.nnz(), n * (2 * ww + 1) - ww * (ww + 1), "n {n} w {w}");
            for i in 0..n {
                for &j in m.row(i).0 {
                    assert!((i as i64 - j as i64).unsigned_abs() as usize <= w);
                }
            }
        }
    }

    #[test]
    fn uniform_rows_have_exactly_k() {
        let m = uniform(1000, 9, 11).unwrap();
        assert!(m.row_lengths().all(|l| l == 9));
        assert_eq!(uniform(5, 5, 1).unwrap().nnz(), 25);
        assert_eq!(uniform(0, 0, 1).unwrap().nnz(), 0);
        assert!(uniform(4, 5, 1).is_err());
        // Columns cover the range roughly evenly.
        let t = m.transpose();
        let mean = m.nnz() as f64 / 1000.0;
        assert!((t.max_row_len() as f64) < 4.0 * mean);
    }
}
