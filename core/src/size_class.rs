//! Size classes: 16 B to 64 KiB, four steps per doubling above 64 B, so a
//! block wastes at most 20% of its size for requests of 64 B and more
//! (request 65 B gets the 80 B class). Every class is a multiple of 16 B,
//! so blocks are 16-byte aligned, and power-of-two classes are naturally
//! aligned because pages are [`PAGE_SIZE`]-aligned.
//!
//! Alignment: block `i` of a class of size `s` starts `i * s` bytes into a
//! [`PAGE_SIZE`]-aligned page, so every block of the class is aligned to
//! the largest power of two dividing `s` ([`class_align`]): 16 B for 48 B,
//! 64 B for 320 B (5 x 64), 128 B for 384 B (3 x 128), 4 KiB for 4 KiB.
//! [`class_of_aligned`] picks the smallest class that fits a size *and*
//! an alignment, so an aligned request never needs padding: at worst it
//! takes the next power-of-two class. Spans are [`PAGE_SIZE`]-aligned,
//! which bounds the alignments the heap serves ([`MAX_ALIGN`]).

/// Bytes per page. Pages are the unit the heap hands to size classes.
pub const PAGE_SIZE: usize = 64 << 10;
/// log2 of [`PAGE_SIZE`].
pub const PAGE_SHIFT: u32 = 16;
/// Smallest block, and the alignment of every block.
pub const MIN_BLOCK: usize = 16;
/// Largest class; larger requests take spans of whole pages.
pub const MAX_CLASS_SIZE: usize = 64 << 10;
/// Blocks in a page of the smallest class: sizes every page's bitmap.
pub const MAX_BLOCKS_PER_PAGE: usize = PAGE_SIZE / MIN_BLOCK;
/// Bytes of bitmap per page (one bit per block of the smallest class).
pub const BITMAP_BYTES_PER_PAGE: usize = MAX_BLOCKS_PER_PAGE / 8;
/// Number of size classes.
pub const CLASS_COUNT: usize = 44;
/// The largest alignment the heap serves: that of pages and spans.
pub const MAX_ALIGN: usize = PAGE_SIZE;

/// Block size of every class, ascending.
pub const CLASS_SIZES: [u32; CLASS_COUNT] = build_table();

const fn build_table() -> [u32; CLASS_COUNT] {
    let mut t = [0u32; CLASS_COUNT];
    // 16, 32, 48, 64
    let mut i = 0;
    while i < 4 {
        t[i] = 16 * (i as u32 + 1);
        i += 1;
    }
    // then four steps in each doubling (2^p, 2^(p+1)], p = 6..=15
    let mut p = 6;
    while i < CLASS_COUNT {
        let base = 1u32 << p;
        let step = base / 4;
        let mut j = 1;
        while j <= 4 {
            t[i] = base + step * j;
            i += 1;
            j += 1;
        }
        p += 1;
    }
    t
}

// Compile-time checks on the table: ascending, 16-byte multiples, ends at
// MAX_CLASS_SIZE, waste bounded by 25% for requests of 64 B and more, and
// `class_of` picks the smallest class that fits at every class boundary.
const _: () = {
    assert!(CLASS_SIZES[0] as usize == MIN_BLOCK);
    assert!(CLASS_SIZES[CLASS_COUNT - 1] as usize == MAX_CLASS_SIZE);
    let mut i = 0;
    while i < CLASS_COUNT {
        let s = CLASS_SIZES[i];
        assert!(s.is_multiple_of(MIN_BLOCK as u32));
        if i > 0 {
            let prev = CLASS_SIZES[i - 1];
            assert!(s > prev);
            // worst request is prev + 1: waste (s - prev - 1) / s < 25%
            if prev >= 64 {
                assert!(4 * (s - prev - 1) < s);
            }
            match class_of(prev as usize + 1) {
                Some(c) => assert!(c as usize == i),
                None => panic!("class_of misses a class"),
            }
        }
        match class_of(s as usize) {
            Some(c) => assert!(c as usize == i),
            None => panic!("class_of misses a class"),
        }
        let mut g = 0;
        while g < 2 {
            let geo = [Geometry::STANDARD, Geometry::SMALL][g];
            assert!(geo.blocks_per_page(i as u32) >= 1);
            assert!(geo.blocks_per_page(i as u32) as usize <= MAX_BLOCKS_PER_PAGE);
            assert!(geo.page_units(i as u32) <= MAX_PAGE_UNITS);
            g += 1;
        }
        i += 1;
    }
    assert!(class_of(0).is_none());
    assert!(class_of(MAX_CLASS_SIZE + 1).is_none());
    // Aligned requests: at both ends of every class's range and at every
    // alignment, the pick fits, is aligned, and no smaller class is both.
    let mut c = 0;
    while c < CLASS_COUNT {
        let ends = [
            if c == 0 {
                1
            } else {
                CLASS_SIZES[c - 1] as usize + 1
            },
            CLASS_SIZES[c] as usize,
        ];
        let mut e = 0;
        while e < 2 {
            let size = ends[e];
            let mut a = 1;
            while a <= MAX_ALIGN {
                match class_of_aligned(size, a) {
                    Some(k) => {
                        assert!(class_size(k) as usize >= size && class_align(k) >= a);
                        let mut j = 0;
                        while j < k {
                            assert!((class_size(j) as usize) < size || class_align(j) < a);
                            j += 1;
                        }
                    }
                    None => panic!("class_of_aligned misses a class"),
                }
                a *= 2;
            }
            e += 1;
        }
        c += 1;
    }
    assert!(class_of_aligned(1, MAX_ALIGN * 2).is_none());
    assert!(class_of_aligned(1, 24).is_none());
    assert!(class_of_aligned(1, 0).is_none());
};

/// The smallest class whose blocks hold `size` bytes, in O(1) arithmetic;
/// `None` for 0 and for sizes over [`MAX_CLASS_SIZE`] (those take spans).
#[inline(always)]
pub const fn class_of(size: usize) -> Option<u32> {
    if size == 0 || size > MAX_CLASS_SIZE {
        return None;
    }
    if size <= 64 {
        return Some((size.div_ceil(16) - 1) as u32);
    }
    let s = size - 1;
    let p = usize::BITS - 1 - s.leading_zeros(); // 2^p <= s < 2^(p+1), p >= 6
    let step_shift = p - 2;
    let j = (size - (1 << p) + (1 << step_shift) - 1) >> step_shift; // 1..=4
    Some(4 + (p - 6) * 4 + j as u32 - 1)
}

/// Whether the heap serves alignment `align`: a power of two up to
/// [`MAX_ALIGN`].
#[inline(always)]
pub const fn valid_align(align: usize) -> bool {
    align.is_power_of_two() && align <= MAX_ALIGN
}

/// The alignment every block of `class` has: the largest power of two
/// dividing its size, at most [`MAX_ALIGN`] (0 for `class >= CLASS_COUNT`).
#[inline(always)]
pub const fn class_align(class: u32) -> usize {
    let s = class_size(class) as usize;
    if s == 0 {
        return 0;
    }
    let a = 1usize << s.trailing_zeros();
    if a > MAX_ALIGN {
        MAX_ALIGN
    } else {
        a
    }
}

/// The smallest class whose blocks hold `size` bytes and all start at a
/// multiple of `align`, in O(1) (at most four steps up from
/// [`class_of`], since the power-of-two class closing each doubling is
/// aligned to its size). `None` for size 0, for sizes over
/// [`MAX_CLASS_SIZE`] (those take spans, which are [`MAX_ALIGN`]-aligned),
/// and for alignments that are not powers of two or exceed [`MAX_ALIGN`].
#[inline(always)]
pub const fn class_of_aligned(size: usize, align: usize) -> Option<u32> {
    if size == 0 || !valid_align(align) {
        return None;
    }
    if align <= MIN_BLOCK {
        return class_of(size);
    }
    // A block aligned to `align` is at least `align` bytes.
    let Some(mut c) = class_of(if size < align { align } else { size }) else {
        return None;
    };
    while class_align(c) < align && (c as usize) < CLASS_COUNT - 1 {
        c += 1;
    }
    Some(c)
}

/// Block size of `class` (`class < CLASS_COUNT`, else 0).
#[inline(always)]
pub const fn class_size(class: u32) -> u32 {
    if (class as usize) < CLASS_COUNT {
        CLASS_SIZES[class as usize]
    } else {
        0
    }
}

/// Blocks a page aims to hold: pages of large classes are several
/// [`PAGE_SIZE`] units long, so a warp's worth of blocks rarely needs a new
/// page (a 64 KiB page holds only 16 blocks of 4 KiB).
pub const TARGET_BLOCKS_PER_PAGE: usize = 256;
/// Longest page of a class, in [`PAGE_SIZE`] units (1 MiB).
pub const MAX_PAGE_UNITS: u32 = 16;

/// [`PAGE_SIZE`] units in one page of `class` (1 for classes up to 256 B),
/// in the standard geometry (every heap a kernel uses).
#[inline(always)]
pub const fn page_units(class: u32) -> u32 {
    Geometry::STANDARD.page_units(class)
}

/// Blocks that fit in one page of `class`, in the standard geometry.
#[inline(always)]
pub const fn blocks_per_page(class: u32) -> u32 {
    Geometry::STANDARD.blocks_per_page(class)
}

/// How long the pages of each class are: [`Geometry::STANDARD`] (pages
/// of about 256 blocks, up to 1 MiB) or [`Geometry::SMALL`] (the fewest
/// 64 KiB units whose tail past the last block is at most an eighth of
/// the page: one unit for most classes, 4,096 blocks of 16 B down to one
/// of 64 KiB; two for the 24 KiB and 40 KiB classes, three for the
/// 48 KiB one). A heap has one for life (see
/// `Placement::SMALL_CLASS_PAGES`).
///
/// The small geometry is a host pool's, whose threads each keep a
/// current page per class: with pages of 16 blocks (1 MiB for the 64 KiB
/// class), eight threads handing blocks of 256 B to 4 MiB to each other
/// (`cuheap bench host`'s hand-off case, modelled over host memory) held
/// 1.39-1.50x their peak in use, mostly in partly used pages of the
/// large classes; with one unit a page, 1.29 (medians of 8 runs;
/// `docs/ab-pool-one-unit-class-pages-h200.txt`). One unit alone would
/// leave 24 KiB of every 40 KiB block's page unused (a heap of such
/// blocks 1.6x their size): hence the bound on the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    small: bool,
}

impl Geometry {
    pub const STANDARD: Geometry = Geometry { small: false };
    pub const SMALL: Geometry = Geometry { small: true };

    /// [`PAGE_SIZE`] units in one page of `class`.
    #[inline(always)]
    pub const fn page_units(self, class: u32) -> u32 {
        if (class as usize) < CLASS_COUNT {
            if self.small {
                SMALL_PAGE_UNITS[class as usize]
            } else {
                PAGE_UNITS[class as usize]
            }
        } else {
            1
        }
    }

    /// Blocks that fit in one page of `class`.
    #[inline(always)]
    pub const fn blocks_per_page(self, class: u32) -> u32 {
        if (class as usize) < CLASS_COUNT {
            if self.small {
                SMALL_BLOCKS_PER_PAGE[class as usize]
            } else {
                BLOCKS_PER_PAGE[class as usize]
            }
        } else {
            0
        }
    }
}

// Tables, so the hot paths look these up instead of dividing.
const PAGE_UNITS: [u32; CLASS_COUNT] = units_table(TARGET_BLOCKS_PER_PAGE);
const BLOCKS_PER_PAGE: [u32; CLASS_COUNT] = blocks_table(PAGE_UNITS);
const SMALL_PAGE_UNITS: [u32; CLASS_COUNT] = small_units_table();
const SMALL_BLOCKS_PER_PAGE: [u32; CLASS_COUNT] = blocks_table(SMALL_PAGE_UNITS);

const fn units_table(target: usize) -> [u32; CLASS_COUNT] {
    let mut t = [0u32; CLASS_COUNT];
    let mut c = 0;
    while c < CLASS_COUNT {
        t[c] = compute_page_units(c as u32, target);
        c += 1;
    }
    t
}

/// [`Geometry::SMALL`]'s units: for each class the fewest (from one)
/// whose tail past the last block is at most an eighth of the page.
const fn small_units_table() -> [u32; CLASS_COUNT] {
    let mut t = [1u32; CLASS_COUNT];
    let mut c = 0;
    while c < CLASS_COUNT {
        let size = CLASS_SIZES[c] as usize;
        let mut u = 1;
        while u < MAX_PAGE_UNITS {
            let bytes = u as usize * PAGE_SIZE;
            if (bytes % size) * 8 <= bytes {
                break;
            }
            u += 1;
        }
        t[c] = u;
        c += 1;
    }
    t
}

/// Blocks per page of each class, for pages of `units` units each.
const fn blocks_table(units: [u32; CLASS_COUNT]) -> [u32; CLASS_COUNT] {
    let mut t = [0u32; CLASS_COUNT];
    let mut c = 0;
    while c < CLASS_COUNT {
        t[c] = units[c] * PAGE_SIZE as u32 / CLASS_SIZES[c];
        c += 1;
    }
    t
}

const fn compute_page_units(class: u32, target: usize) -> u32 {
    let u = (target * class_size(class) as usize).div_ceil(PAGE_SIZE) as u32;
    if u == 0 {
        1
    } else if u > MAX_PAGE_UNITS {
        MAX_PAGE_UNITS
    } else {
        u
    }
}

/// Pages in a span serving `size` bytes (`size > MAX_CLASS_SIZE`).
#[inline(always)]
pub const fn span_pages(size: usize) -> usize {
    size.div_ceil(PAGE_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host pool's class pages are the fewest units that leave at most
    /// an eighth of the page past the last block: one unit for all but
    /// three classes; the standard geometry's grow with the class.
    #[test]
    fn small_class_pages_are_short_and_waste_at_most_an_eighth() {
        let mut longer = std::vec::Vec::new();
        for c in 0..CLASS_COUNT as u32 {
            let (u, size) = (
                Geometry::SMALL.page_units(c) as usize,
                class_size(c) as usize,
            );
            let bytes = u * PAGE_SIZE;
            let blocks = Geometry::SMALL.blocks_per_page(c) as usize;
            assert_eq!(blocks, bytes / size, "class {c}");
            assert!(
                (bytes - blocks * size) * 8 <= bytes,
                "class {c}: {size} B in {u} units"
            );
            if u > 1 {
                // Not one unit shorter.
                let shorter = (u - 1) * PAGE_SIZE;
                assert!((shorter % size) * 8 > shorter, "class {c}");
                longer.push((size >> 10, u));
            }
        }
        assert_eq!(longer, [(24, 2), (40, 2), (48, 3)]);
        let largest = CLASS_COUNT as u32 - 1;
        assert_eq!(Geometry::SMALL.blocks_per_page(largest), 1);
        assert_eq!(Geometry::STANDARD.page_units(largest), MAX_PAGE_UNITS);
    }

    /// The arithmetic agrees with a linear search of the table for every size
    /// (too slow for Miri; the compile-time checks cover the boundaries).
    #[test]
    #[cfg_attr(miri, ignore)]
    fn class_of_is_smallest_fitting_class() {
        for size in 1..=MAX_CLASS_SIZE {
            let c = class_of(size).unwrap();
            let want = CLASS_SIZES
                .iter()
                .position(|&s| s as usize >= size)
                .unwrap();
            assert_eq!(c as usize, want, "size {size}");
        }
    }

    /// Every size and alignment against a linear search of the table.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn class_of_aligned_is_smallest_aligned_fitting_class() {
        for size in 1..=MAX_CLASS_SIZE {
            let mut align = 1;
            while align <= MAX_ALIGN {
                let want = (0..CLASS_COUNT as u32)
                    .find(|&c| class_size(c) as usize >= size && class_align(c) >= align);
                assert_eq!(class_of_aligned(size, align), want, "{size} B at {align}");
                align *= 2;
            }
        }
    }

    #[test]
    fn class_alignments() {
        assert_eq!(class_align(0), 16);
        assert_eq!(class_align(class_of(48).unwrap()), 16);
        assert_eq!(class_align(class_of(320).unwrap()), 64);
        assert_eq!(class_align(class_of(384).unwrap()), 128);
        assert_eq!(class_align(class_of(4096).unwrap()), 4096);
        assert_eq!(class_align(class_of(MAX_CLASS_SIZE).unwrap()), MAX_ALIGN);
        assert_eq!(class_align(CLASS_COUNT as u32), 0);
        // 300 B at 64 takes the 320 B class, not the next power of two.
        assert_eq!(class_of_aligned(300, 64), class_of(320));
        assert_eq!(class_of_aligned(1, 4096), class_of(4096));
        assert_eq!(class_of_aligned(0, 64), None);
        assert_eq!(class_of_aligned(MAX_CLASS_SIZE + 1, 64), None);
        assert_eq!(class_of_aligned(64, 3), None);
        assert_eq!(class_of_aligned(64, 0), None);
        assert_eq!(class_of_aligned(64, 2 * MAX_ALIGN), None);
        assert!(valid_align(1) && valid_align(MAX_ALIGN) && !valid_align(48));
    }

    #[test]
    fn out_of_range() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(MAX_CLASS_SIZE + 1), None);
        assert_eq!(class_of(usize::MAX), None);
        assert_eq!(class_size(CLASS_COUNT as u32), 0);
        assert_eq!(blocks_per_page(u32::MAX), 0);
    }
}
