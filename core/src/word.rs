//! Bitmap words. The GPU prefers `u32` (one warp lane per bit, 32-bit
//! atomics are the fastest), the host may use `u64`; the algorithm is the
//! same for both.

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use core::ops::{BitAnd, BitOr, BitXor, Not};

/// A bitmap word and its atomic twin.
///
/// Requirements: `BITS` is a power of two dividing
/// [`MAX_BLOCKS_PER_PAGE`](crate::size_class::MAX_BLOCKS_PER_PAGE); the
/// atomic operations are single instructions on x86_64 and nvptx64.
pub trait Word:
    Copy
    + Eq
    + core::fmt::Debug
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + BitXor<Output = Self>
    + Not<Output = Self>
    + Send
    + Sync
    + 'static
{
    /// The atomic cell holding one word (same size and alignment as `Self`).
    type Atomic: Send + Sync;
    const BITS: u32;
    const ZERO: Self;
    const ONES: Self;

    fn load(a: &Self::Atomic, order: Ordering) -> Self;
    fn store(a: &Self::Atomic, v: Self, order: Ordering);
    fn fetch_and(a: &Self::Atomic, v: Self, order: Ordering) -> Self;
    fn fetch_or(a: &Self::Atomic, v: Self, order: Ordering) -> Self;
    fn count_ones(self) -> u32;
    fn trailing_zeros(self) -> u32;
    fn leading_zeros(self) -> u32;
    /// The word with only bit `i` set (`i < BITS`).
    fn bit(i: u32) -> Self;
    /// The lowest `n` bits set (`n <= BITS`).
    fn low_bits(n: u32) -> Self;
    /// `self` without its lowest set bit.
    fn clear_lowest(self) -> Self;
    /// Bits `from..from + n`, cut at the word's end (`from < BITS`).
    fn bits_from(from: u32, n: u32) -> Self;
    /// A new atomic cell (tests and loom models; the heap casts raw memory).
    fn new_atomic(v: Self) -> Self::Atomic;

    /// The `n` lowest set bits of `self` (all of them if it has fewer).
    #[inline(always)]
    fn lowest_set(self, n: u32) -> Self {
        if self.count_ones() <= n {
            return self;
        }
        let mut rest = self;
        for _ in 0..n {
            rest = rest.clear_lowest();
        }
        self ^ rest
    }

    /// Index of the `r`-th set bit (`r < count_ones()`), counting from 0.
    #[inline(always)]
    fn nth_set(self, r: u32) -> u32 {
        let mut w = self;
        for _ in 0..r {
            w = w.clear_lowest();
        }
        w.trailing_zeros()
    }
}

macro_rules! impl_word {
    ($t:ty, $a:ty) => {
        impl Word for $t {
            type Atomic = $a;
            const BITS: u32 = <$t>::BITS;
            const ZERO: Self = 0;
            const ONES: Self = <$t>::MAX;
            #[inline(always)]
            fn load(a: &$a, order: Ordering) -> Self {
                a.load(order)
            }
            #[inline(always)]
            fn store(a: &$a, v: Self, order: Ordering) {
                a.store(v, order)
            }
            #[inline(always)]
            fn fetch_and(a: &$a, v: Self, order: Ordering) -> Self {
                a.fetch_and(v, order)
            }
            #[inline(always)]
            fn fetch_or(a: &$a, v: Self, order: Ordering) -> Self {
                a.fetch_or(v, order)
            }
            #[inline(always)]
            fn count_ones(self) -> u32 {
                <$t>::count_ones(self)
            }
            #[inline(always)]
            fn trailing_zeros(self) -> u32 {
                <$t>::trailing_zeros(self)
            }
            #[inline(always)]
            fn leading_zeros(self) -> u32 {
                <$t>::leading_zeros(self)
            }
            #[inline(always)]
            fn bit(i: u32) -> Self {
                1 << i
            }
            #[inline(always)]
            fn low_bits(n: u32) -> Self {
                if n >= Self::BITS {
                    Self::MAX
                } else {
                    (1 << n) - 1
                }
            }
            #[inline(always)]
            fn bits_from(from: u32, n: u32) -> Self {
                Self::low_bits(n.min(Self::BITS - from)) << from
            }
            #[inline(always)]
            fn clear_lowest(self) -> Self {
                self & self.wrapping_sub(1)
            }
            fn new_atomic(v: Self) -> $a {
                <$a>::new(v)
            }
        }
    };
}

impl_word!(u32, AtomicU32);
impl_word!(u64, AtomicU64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_set_and_nth_set_agree() {
        for w in [0u32, 1, 0b1011_0100, u32::MAX, 0x8000_0001] {
            for n in 0..=33 {
                let m = w.lowest_set(n);
                assert_eq!(m & !w, 0);
                assert_eq!(m.count_ones(), n.min(w.count_ones()));
                for r in 0..m.count_ones() {
                    assert!(m & (1 << m.nth_set(r)) != 0);
                    assert_eq!(w.nth_set(r), m.nth_set(r));
                }
            }
        }
        assert_eq!(u64::low_bits(64), u64::MAX);
        assert_eq!(u32::low_bits(5), 0b11111);
    }
}
