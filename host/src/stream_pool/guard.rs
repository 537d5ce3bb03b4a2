//! Guards: what a stream's cache sheds goes straight back to the heap, so
//! that the same stream reuses the memory at once, in any size (stream
//! order already puts its new work after the old), while another stream
//! that gets that memory from the heap first waits, on the device, for the
//! work of the streams that shed it.
//!
//! Protocol:
//! - a stream `S` that sheds records its guard event on `S` (covering all
//!   of `S`'s work so far, every use of the shed blocks among it), takes
//!   the next generation for it ([`Guards::publish`]), stamps the pages of
//!   the shed blocks with that generation ([`Guards::stamp`]), then frees
//!   the blocks to the heap;
//! - a stream `T` that got a block from the heap calls [`Guards::order`]
//!   with the block's pages: if a page carries a generation past what `T`
//!   has seen, `T` waits (a device-side wait, no host wait) on every other
//!   stream's guard published since, unless its work is already done.
//!   The heap hands `T` a block only after `S` freed it, which is after
//!   `S` stamped it (a release fence before the free, an acquire fence
//!   after the allocation), so `T` sees the stamp. A block whose pages
//!   carry no new stamp came from memory no stream shed since `T` looked:
//!   no wait, so streams are not tied to each other's work for nothing.
//! - Most allocations read no stamp: the newest generation published is
//!   also kept apart ([`Guards::order`] compares it with what `T` has
//!   seen first), and a stream that publishes while no other stream's
//!   guard is newer than what it has seen sees its own generation at once
//!   (it never waits for itself; a forgotten stream's guard, an orphan,
//!   counts as another stream's). A stream alone, or the only one
//!   shedding, thus reads no stamp (one cache miss per allocation over a
//!   large heap: 42% of the last-level read misses of the pool's
//!   mixed-size case, by a cache simulation).
//! - Guards are keyed by the cache's serial, never reused (a stream
//!   handle can be). A cache the pool forgets leaves its guard as an
//!   orphan, which every stream still orders after until its work is done.
//! - [`Guards::synchronize_all`] waits on the host for every guard: trim
//!   calls it before it unmaps memory that shed blocks may have been in.

use crate::backend::Backend;
use crate::error::Result;
use crate::reclaim::EventPool;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;

struct Entry<E> {
    /// The cache's serial; `None` once the pool forgot the cache.
    cache: Option<u64>,
    /// Generation of the last record.
    gen: u64,
    event: E,
}

struct State<E> {
    gen: u64,
    entries: Vec<Entry<E>>,
}

/// The guards of one pool.
pub(super) struct Guards<B: Backend> {
    state: Mutex<State<B::Event>>,
    /// Per page of the heap: the generation of the last guarded shed of a
    /// block on it.
    stamps: Vec<AtomicU64>,
    /// The newest generation published (`State::gen`, stored under the
    /// lock before the stamps of its shed).
    newest: AtomicU64,
}

impl<B: Backend> Guards<B> {
    /// Guards for a heap of `pages` pages.
    pub(super) fn new(pages: usize) -> Guards<B> {
        Guards {
            state: Mutex::new(State {
                gen: 0,
                entries: Vec::new(),
            }),
            stamps: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            newest: AtomicU64::new(0),
        }
    }

    /// Records the work enqueued on `stream` (the stream of cache
    /// `serial`, which has seen generation `seen`) so far as its guard;
    /// returns its generation, for [`Guards::stamp`]. Call it before
    /// freeing to the heap the blocks that work used; on an error nothing
    /// is published and the blocks must not be freed. When no other
    /// stream's guard is newer than `seen`, `seen` rises to the new
    /// generation: the stream is ordered after every guard but its own.
    pub(super) fn publish(
        &self,
        backend: &B,
        events: &EventPool<B>,
        serial: u64,
        stream: &B::Stream,
        seen: &AtomicU64,
    ) -> Result<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Orphans whose work is done guard nothing any more.
        let mut i = 0;
        while i < st.entries.len() {
            let e = &st.entries[i];
            if e.cache.is_none() && backend.query(&e.event).unwrap_or(false) {
                events.put(st.entries.swap_remove(i).event);
            } else {
                i += 1;
            }
        }
        let at = match st.entries.iter().position(|e| e.cache == Some(serial)) {
            Some(at) => at,
            None => {
                let event = events.get(backend)?;
                st.entries.push(Entry {
                    cache: Some(serial),
                    gen: 0,
                    event,
                });
                st.entries.len() - 1
            }
        };
        backend.record(&st.entries[at].event, stream)?;
        st.gen += 1;
        let gen = st.gen;
        st.entries[at].gen = gen;
        // Before the stamps (the caller's release fence then orders both
        // before the frees that a taker's acquire fence pairs with); a
        // maximum, so it never goes back whoever stores it.
        self.newest.fetch_max(gen, Ordering::Relaxed);
        // Raised under the lock, as `order` raises it: no guard published
        // meanwhile is missed.
        let others = st
            .entries
            .iter()
            .filter(|e| e.cache != Some(serial))
            .map(|e| e.gen)
            .max()
            .unwrap_or(0);
        if others <= seen.load(Ordering::Acquire) {
            seen.fetch_max(gen, Ordering::AcqRel);
        }
        Ok(gen)
    }

    /// Stamps pages `from..to` with generation `gen`; after the stamps of
    /// a shed, a release fence, then the frees. `whole`: the block owns
    /// its pages (a span), so they are stamped with a plain store.
    ///
    /// Blocks of a class page share it, and caches shed them at once, with
    /// generations in any order: a `fetch_max`. A span's pages have one
    /// writer at a time, and their stamps come in the order of their
    /// generations: every earlier stamp of such a page was made before
    /// the blocks on it went back to the heap, so before the heap handed
    /// the span out, and so before the `publish` of the span's own shed,
    /// whose generation is therefore higher (generations are taken under
    /// one lock). The locked read-modify-write waited for each page's
    /// cache line: 90% of the shed's time in the mixed-size case of
    /// `pool_paths`, by `perf`; a store does not wait.
    pub(super) fn stamp(&self, from: usize, to: usize, gen: u64, whole: bool) {
        for s in &self.stamps[from..to.min(self.stamps.len())] {
            if whole {
                debug_assert!(s.load(Ordering::Relaxed) < gen, "stamps out of order");
                s.store(gen, Ordering::Relaxed);
            } else {
                s.fetch_max(gen, Ordering::Relaxed);
            }
        }
    }

    /// The fence between a shed's stamps and its frees.
    pub(super) fn before_frees(&self) {
        fence(Ordering::Release);
    }

    /// Orders `stream` (of cache `serial`) after the guards of the streams
    /// that shed the memory of pages `from..to` since `seen`, and raises
    /// `seen`. Call it after taking a block from the heap and before
    /// handing it out.
    pub(super) fn order(
        &self,
        backend: &B,
        serial: u64,
        stream: &B::Stream,
        seen: &AtomicU64,
        from: usize,
        to: usize,
    ) -> Result<()> {
        // Pairs with the release fence before the frees, through the
        // heap's atomics on the block just taken.
        fence(Ordering::Acquire);
        let since = seen.load(Ordering::Acquire);
        // Every stamp is at most the newest generation, which the fence
        // shows at least as new as the stamps of the block's last shed.
        if self.newest.load(Ordering::Relaxed) <= since {
            return Ok(());
        }
        let newest = self.stamps[from..to.min(self.stamps.len())]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        if newest <= since {
            return Ok(());
        }
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for e in &st.entries {
            // Work already done needs no wait (a wait would also tie the
            // stream to later work of the other one for nothing).
            if e.gen > since && e.cache != Some(serial) && !backend.query(&e.event).unwrap_or(false)
            {
                backend.wait(stream, &e.event)?;
            }
        }
        seen.fetch_max(st.gen, Ordering::AcqRel);
        Ok(())
    }

    /// Waits on the host until the work of every guard is done.
    pub(super) fn synchronize_all(&self, backend: &B) -> Result<()> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for e in &st.entries {
            backend.synchronize(&e.event)?;
        }
        Ok(())
    }

    /// The pool forgets cache `serial`: its guard stays, as an orphan,
    /// until its work is done.
    pub(super) fn orphan(&self, serial: u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for e in st.entries.iter_mut().filter(|e| e.cache == Some(serial)) {
            e.cache = None;
        }
    }
}
