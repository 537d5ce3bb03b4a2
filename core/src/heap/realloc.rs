//! Resizing a block: in place where the block still fits the new size
//! (spans grow and shrink by whole pages), else allocate, copy, free.
//!
//! [`Heap::resize_in_place`] does the part that needs no new block and
//! says what is left to do ([`Resize`]); [`Heap::realloc`] finishes it on
//! one thread. The GPU's `dev_realloc` finishes it with the warp-wide
//! allocation and free paths instead: the decision is made here, once.

use super::{AllocError, BlockInfo, FreeError, Heap, ReallocError};
use crate::size_class::{class_of_aligned, class_size, span_pages, valid_align, PAGE_SIZE};
use crate::word::Word;
use core::mem::MaybeUninit;

/// What is left to do after [`Heap::resize_in_place`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resize {
    /// The block serves the new size where it is.
    InPlace,
    /// The block cannot hold the new size (or lacks the alignment): take a
    /// new block, copy the first `copy` bytes (the old block's, at most the
    /// new size), free the old one. If no new block can be had the realloc
    /// fails and the old block stays as it was.
    Move { copy: usize },
    /// The block still holds the new size, but a block at most half as
    /// large would too: take one if the heap has it, copy `copy` bytes and
    /// free the old block, else keep the old block (a shrink never fails,
    /// and a failed attempt is not counted as a failed allocation).
    Shrink { copy: usize },
}

/// Copies the first `bytes` bytes of a block to another, eight at a time
/// (a GPU has no `memcpy`; LLVM lowers one to a loop of single bytes).
/// Copies whole 8-byte words: `bytes` rounded up to a multiple of 8.
///
/// # Safety
///
/// `src` and `dst` are 8-byte aligned, do not overlap, and each holds at
/// least `bytes` rounded up to a multiple of 8 bytes; the caller owns
/// both (nobody else reads or writes them meanwhile). Heap blocks are
/// multiples of 16 bytes, so any `bytes` up to the smaller block's size
/// is within both.
///
/// # Time complexity
///
/// O(bytes).
#[inline(always)]
pub unsafe fn copy_block(dst: *mut u8, src: *const u8, bytes: usize) {
    // `MaybeUninit` words copy bytes exactly, pointers' provenance and
    // never-written bytes included.
    let (d, s) = (dst as *mut MaybeUninit<u64>, src as *const MaybeUninit<u64>);
    for i in 0..bytes.div_ceil(8) {
        // SAFETY: the caller's contract: word `i` is inside both blocks.
        unsafe { d.add(i).write(s.add(i).read()) };
    }
}

impl<W: Word> Heap<'_, W> {
    /// Resizes the block at `ptr` to `new_size` bytes at a multiple of
    /// `align` without moving it where it can: a class block whose size and
    /// address still fit stays; a span takes or gives back pages at its
    /// end. Returns what is left to do ([`Resize`]). Refuses, counted and
    /// changing nothing: a bad alignment, size 0 and sizes over the heap
    /// (as failed allocations), and a `ptr` that is not the start of a
    /// live block or span (as bad frees).
    ///
    /// The caller owns the block: a live block of someone else's is not
    /// told from one's own (as with [`Heap::free`]).
    ///
    /// # Time complexity
    ///
    /// O(1) for class blocks; O(pages added or given back) for spans.
    pub fn resize_in_place(
        &self,
        ptr: *mut u8,
        new_size: usize,
        align: usize,
    ) -> Result<Resize, ReallocError> {
        let refuse = |e| Err(ReallocError::Alloc(self.count_failure(e, new_size)));
        if !valid_align(align) {
            return refuse(AllocError::BadAlignment);
        }
        if new_size == 0 {
            return refuse(AllocError::ZeroSize);
        }
        let info = self
            .live_block_at(ptr as usize)
            .map_err(|e| ReallocError::Pointer(self.bad_free(e)))?;
        if new_size.div_ceil(PAGE_SIZE) > self.page_count as usize {
            return refuse(AllocError::TooLarge);
        }
        let mut have = info.size;
        if info.class.is_none() {
            // A span: same start, whole pages; its start is page-aligned.
            let (pages, want) = ((have / PAGE_SIZE) as u32, span_pages(new_size) as u32);
            if want < pages {
                self.shrink_span(info.page, pages, want);
            } else if want > pages && !self.grow_span(info.page, pages, want) {
                return Ok(Resize::Move { copy: have });
            }
            have = want as usize * PAGE_SIZE;
        } else if new_size > have || !(ptr as usize).is_multiple_of(align) {
            return Ok(Resize::Move {
                copy: have.min(new_size),
            });
        }
        // The block fits. The best block for the new size: its aligned
        // class, or (over the largest class) a span of its pages.
        let best = match class_of_aligned(new_size, align) {
            Some(c) => class_size(c) as usize,
            None => span_pages(new_size) * PAGE_SIZE,
        };
        if 2 * best <= have {
            return Ok(Resize::Shrink { copy: new_size });
        }
        Ok(Resize::InPlace)
    }

    /// Resizes the block at `ptr` to `new_size` bytes at a multiple of
    /// `align`, keeping its first `min(old, new)` bytes: the same block
    /// where it still fits (see [`Heap::resize_in_place`]), else a new one
    /// with the contents copied and the old one freed. A null `ptr` is
    /// [`Heap::alloc_aligned`]. On failure the old block is left as it
    /// was; failures are counted as for [`Heap::resize_in_place`] and
    /// [`Heap::alloc_aligned`]. Growing a class block always moves it;
    /// shrinking never fails.
    ///
    /// # Safety
    ///
    /// `ptr` is null, or a block of this heap that the caller owns (nobody
    /// else reads, writes or frees it during the call), or any address
    /// that is not the start of a live block (refused). Its bytes are read
    /// and copied: a live block of someone else's is not told from one's
    /// own.
    ///
    /// # Time complexity
    ///
    /// That of [`Heap::resize_in_place`], plus an allocation, a copy of
    /// the old contents and a free when the block moves.
    pub unsafe fn realloc(
        &self,
        ptr: *mut u8,
        new_size: usize,
        align: usize,
        slot: u32,
    ) -> Result<*mut u8, ReallocError> {
        if ptr.is_null() {
            return self
                .alloc_aligned(new_size, align, slot)
                .map_err(ReallocError::Alloc);
        }
        let (to, copy) = match self.resize_in_place(ptr, new_size, align)? {
            Resize::InPlace => return Ok(ptr),
            Resize::Move { copy } => (
                self.alloc_aligned(new_size, align, slot)
                    .map_err(ReallocError::Alloc)?,
                copy,
            ),
            Resize::Shrink { copy } => match self.try_alloc_aligned(new_size, align, slot) {
                Ok(to) => (to, copy),
                Err(_) => return Ok(ptr),
            },
        };
        // SAFETY: `ptr` is the caller's live block (checked above), `to` a
        // fresh block; both are 16-byte aligned, distinct, and hold at
        // least `copy` rounded up to 16 bytes (`copy` is at most the old
        // block's size and the new size, and blocks are multiples of 16).
        unsafe { copy_block(to, ptr, copy) };
        // It was checked live and is the caller's: this free succeeds.
        let _ = self.free(ptr, slot);
        Ok(to)
    }

    /// [`Heap::block_at`], and for a class block also that it is allocated
    /// (its bitmap bit is clear): a freed block is refused as
    /// [`FreeError::NotAllocated`]. Counts nothing.
    ///
    /// # Time complexity
    ///
    /// O(1).
    pub fn live_block_at(&self, addr: usize) -> Result<BlockInfo, FreeError> {
        let info = self.block_at(addr)?;
        if info.class.is_some() && self.bitmap(info.page).is_free(info.index) {
            return Err(FreeError::NotAllocated);
        }
        Ok(info)
    }
}
