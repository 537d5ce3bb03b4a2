//! Where each piece of a heap's metadata lives. The metadata is one
//! zero-initialised region (zeroed memory is an empty heap); the blocks live
//! in a separate, [`PAGE_SIZE`]-aligned data region. Both host and device
//! compute the same offsets from `(page_count, slots)`.

use crate::page::PageDesc;
use crate::page_map::PageMap;
use crate::run_index::RunIndex;
use crate::size_class::{BITMAP_BYTES_PER_PAGE, CLASS_COUNT, PAGE_SIZE};
use crate::stats::{Counters, Tallies};

const ALIGN: usize = 128;

const fn up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Byte offsets of the metadata arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub page_count: u32,
    pub slots: u32,
    pub counters: usize,
    /// [`Tallies::words`] words: the slots' counts of blocks allocated and
    /// freed, right after the counters ([`Layout::TALLIES`]).
    pub tallies: usize,
    /// `slots * CLASS_COUNT` list heads (`u64`): partly free pages, per slot.
    pub lists: usize,
    /// `slots * CLASS_COUNT` current pages (`u32`, page + 1).
    pub cache: usize,
    /// `page_count` descriptors.
    pub descs: usize,
    /// The page map, [`PageMap::words`] words, then its summary,
    /// [`PageMap::summary_words`] words.
    pub page_map: usize,
    /// `page_count` bitmaps of [`BITMAP_BYTES_PER_PAGE`] bytes.
    pub bitmaps: usize,
    /// Total metadata bytes.
    pub meta_bytes: usize,
}

impl Layout {
    /// The most slots a heap may have: every array of the metadata then
    /// starts within 2^32 of its 128-byte units, whatever the page count
    /// (a heap's view keeps those offsets in `u32`s).
    pub const MAX_SLOTS: u32 = 1 << 16;

    /// Where the tallies start: a constant, so a heap's view finds them
    /// from the metadata's start.
    pub const TALLIES: usize = up(core::mem::size_of::<Counters>());

    /// The layout for `page_count` pages and `slots` slots (both >= 1).
    pub const fn new(page_count: u32, slots: u32) -> Layout {
        let counters = 0;
        let tallies = Self::TALLIES;
        let lists = up(tallies + Tallies::words(slots) * 8);
        let cache = up(lists + slots as usize * CLASS_COUNT * 8);
        let descs = up(cache + slots as usize * CLASS_COUNT * 4);
        let page_map = up(descs + page_count as usize * core::mem::size_of::<PageDesc>());
        let map_words = PageMap::words(page_count) + PageMap::summary_words(page_count);
        let bitmaps = up(page_map + map_words * 4);
        let meta_bytes = up(bitmaps + page_count as usize * BITMAP_BYTES_PER_PAGE);
        Layout {
            page_count,
            slots,
            counters,
            tallies,
            lists,
            cache,
            descs,
            page_map,
            bitmaps,
            meta_bytes,
        }
    }

    /// Bytes of a host heap's index of free runs ([`RunIndex`]), after
    /// the metadata: a heap that keeps one ([`Heap::index_runs`](crate::Heap::index_runs))
    /// has [`Layout::meta_bytes`] plus these.
    pub const fn run_index_bytes(&self) -> usize {
        up(RunIndex::words(self.page_count) * 4)
    }

    /// Bytes of the data region.
    pub const fn data_bytes(&self) -> usize {
        self.page_count as usize * PAGE_SIZE
    }
}
