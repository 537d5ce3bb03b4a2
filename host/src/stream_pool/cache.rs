//! Per-stream caches: the blocks freed on one stream, by size, and that
//! stream's counters, found from a thread-local hint on repeated calls.

use super::local::Local;
use super::ALIGN;
use crate::backend::Backend;
use cuheap_core::size_class::{class_of, class_size, MAX_CLASS_SIZE, PAGE_SIZE};
use cuheap_core::BlockInfo;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Where a block's size comes from: a class, or a span of pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Key {
    Class(u32),
    Span(u32),
}

impl Key {
    /// The key serving `size` bytes, rounded to [`ALIGN`]; `None` when the
    /// rounding overflows (no pool could serve it).
    #[inline]
    pub(super) fn of(size: usize) -> Option<Key> {
        if (1..=MAX_CLASS_SIZE).contains(&size) {
            return Some(Key::Class(CLASS_BY_GRANULES[(size - 1) / ALIGN] as u32));
        }
        let size = size.checked_next_multiple_of(ALIGN)?;
        Some(match class_of(size) {
            Some(c) => Key::Class(c),
            None => Key::Span(u32::try_from(size.div_ceil(PAGE_SIZE)).ok()?),
        })
    }

    /// The key under which a block the heap found is cached: the key of
    /// its size, so that a one-page span the heap served for a request of
    /// a page or less (when no class page fitted) is found again by the
    /// next 64 KiB request.
    #[inline]
    pub(super) fn of_block(b: &BlockInfo) -> Key {
        match b.class {
            // The pool's classes are multiples of `ALIGN`: a class block's
            // key is its class (`a_key_is_the_class_of_its_size_rounded`).
            Some(c) => {
                debug_assert_eq!(Key::of(b.size), Some(Key::Class(c)));
                Key::Class(c)
            }
            None => Key::of(b.size).unwrap_or(Key::Span((b.size / PAGE_SIZE) as u32)),
        }
    }

    #[inline]
    pub(super) fn bytes(self) -> usize {
        match self {
            Key::Class(c) => class_size(c) as usize,
            Key::Span(p) => p as usize * PAGE_SIZE,
        }
    }
}

/// The class of each size a class serves, by its [`ALIGN`] granules:
/// entry `i` is the class of `(i + 1) * ALIGN` bytes ([`Key::of`] with no
/// arithmetic on the size but a shift).
const CLASS_BY_GRANULES: [u8; MAX_CLASS_SIZE / ALIGN] = {
    let mut t = [0u8; MAX_CLASS_SIZE / ALIGN];
    let mut i = 0;
    while i < t.len() {
        t[i] = match class_of((i + 1) * ALIGN) {
            Some(c) => c as u8,
            None => panic!("every size up to MAX_CLASS_SIZE has a class"),
        };
        i += 1;
    }
    t
};

/// Per-stream call counters (`Cache::counts`).
pub(super) const ALLOCS: usize = 0;
pub(super) const FREES: usize = 1;
pub(super) const SAME: usize = 2;
pub(super) const CROSS: usize = 3;

/// Spans of up to this many pages have a list of their own in
/// [`Cache::lists`] (found by index); larger ones sit in a map.
pub(super) const SMALL_SPAN_PAGES: u32 = 16;

/// Lists of [`Cache::lists`]: one per class, then one per small span.
const LISTS: usize = cuheap_core::CLASS_COUNT + SMALL_SPAN_PAGES as usize;
/// The bit of [`Cache::mask`] that stands for every span in
/// [`Cache::spans`].
const SPANS_BIT: u64 = 1 << LISTS;
const _: () = assert!(LISTS < 64);

/// Blocks freed on one stream, by size, and that stream's counters (kept
/// here, under the lock the call holds anyway, so that threads with their
/// own streams share no counter). A thread's cache of one stream (see
/// [`super::local`]) is one too, with no event.
pub(super) struct Cache<E> {
    /// Blocks of each class, then of each span of up to
    /// [`SMALL_SPAN_PAGES`] pages (made on first use).
    lists: Vec<Vec<u64>>,
    spans: HashMap<u32, Vec<u64>>,
    /// Blocks in `spans` (whose emptied lists stay until a shed).
    in_spans: usize,
    /// Bit `i`: list `i` holds blocks ([`SPANS_BIT`]: `spans` does),
    /// clear where it holds none. A stream's cache publishes it when its
    /// lock is let go ([`StreamCache::may_hold`]).
    mask: u64,
    /// Bytes of the blocks held. Invariant: the sum of `key.bytes()` over
    /// every listed block.
    pub(super) bytes: usize,
    /// Blocks were freed since `event` was last recorded.
    pub(super) dirty: bool,
    pub(super) event: Option<E>,
    /// Bytes allocated minus bytes freed through this stream.
    pub(super) net: i64,
    /// `bytes` as last added to the pool's count of cached bytes.
    pub(super) reported: usize,
    pub(super) counts: [u64; 4],
    /// A call reached this cache since the pool last looked at it for
    /// idleness ([`super::Pool::visit_others`]).
    pub(super) touched: bool,
    /// A thread's cache: all caches together were past their bound at
    /// its last check, so its free (the one that checked, or the next)
    /// sends half of it to its stream's cache.
    pub(super) over: bool,
    /// A stream's cache: how many times it looked at the others
    /// ([`super::Pool::visit_others`]).
    pub(super) looks: u64,
}

impl<E> Default for Cache<E> {
    fn default() -> Self {
        Cache {
            lists: Vec::new(),
            spans: HashMap::new(),
            in_spans: 0,
            mask: 0,
            bytes: 0,
            dirty: false,
            event: None,
            net: 0,
            reported: 0,
            counts: [0; 4],
            touched: false,
            over: false,
            looks: 0,
        }
    }
}

/// Where a [`Cache`] keeps the blocks of a key.
#[derive(Clone, Copy)]
enum Place {
    /// [`Cache::lists`]`[i]`.
    List(usize),
    /// [`Cache::spans`]`[pages]`.
    Map(u32),
}

impl Place {
    #[inline(always)]
    fn of(key: Key) -> Place {
        match key {
            Key::Class(c) => Place::List(c as usize),
            Key::Span(p) if (1..=SMALL_SPAN_PAGES).contains(&p) => {
                Place::List(cuheap_core::CLASS_COUNT + p as usize - 1)
            }
            Key::Span(p) => Place::Map(p),
        }
    }

    /// Its bit of [`Cache::mask`].
    #[inline(always)]
    fn bit(self) -> u64 {
        match self {
            Place::List(i) => 1 << i,
            Place::Map(_) => SPANS_BIT,
        }
    }
}

/// The bit of [`Cache::mask`] for `key`'s list.
#[inline(always)]
fn bit_of(key: Key) -> u64 {
    Place::of(key).bit()
}

impl<E> Cache<E> {
    /// `key`'s list, made if it is not there.
    #[inline(always)]
    fn list(&mut self, key: Key) -> &mut Vec<u64> {
        match Place::of(key) {
            Place::List(i) => {
                if self.lists.is_empty() {
                    self.lists = (0..LISTS).map(|_| Vec::new()).collect();
                }
                &mut self.lists[i]
            }
            Place::Map(p) => self.spans.entry(p).or_default(),
        }
    }

    /// `key`'s list if there is one.
    #[inline(always)]
    fn list_if_any(&mut self, key: Key) -> Option<&mut Vec<u64>> {
        match Place::of(key) {
            Place::List(i) => self.lists.get_mut(i),
            Place::Map(p) => self.spans.get_mut(&p),
        }
    }

    /// Counts `n` blocks of `key` added to its list.
    #[inline(always)]
    fn added(&mut self, key: Key, n: usize) {
        let place = Place::of(key);
        if let Place::Map(_) = place {
            self.in_spans += n;
        }
        self.mask |= place.bit();
        self.bytes += n * key.bytes();
    }

    /// Counts `n` blocks of `key` taken from its list: a list left empty
    /// clears its bit of the mask (the spans' with the map's last block).
    #[inline(always)]
    fn taken(&mut self, key: Key, n: usize) {
        let place = Place::of(key);
        let empty = match place {
            Place::List(i) => self.lists.get(i).is_none_or(|l| l.is_empty()),
            Place::Map(_) => {
                self.in_spans -= n;
                self.in_spans == 0
            }
        };
        if empty {
            self.mask &= !place.bit();
        }
        self.bytes -= n * key.bytes();
    }

    /// Counts every block taken (the lists and the map emptied).
    fn emptied(&mut self) {
        self.bytes = 0;
        self.in_spans = 0;
        self.mask = 0;
    }

    /// The key of list `i` of `lists`.
    fn key_of_list(i: usize) -> Key {
        match i.checked_sub(cuheap_core::CLASS_COUNT) {
            None => Key::Class(i as u32),
            Some(s) => Key::Span(s as u32 + 1),
        }
    }

    /// Adds a block of `key`; returns how many blocks of `key` are held.
    #[inline]
    pub(super) fn push(&mut self, key: Key, ptr: u64) -> usize {
        let list = self.list(key);
        list.push(ptr);
        let held = list.len();
        self.added(key, 1);
        held
    }

    #[inline]
    pub(super) fn pop(&mut self, key: Key) -> Option<u64> {
        let p = self.list_if_any(key)?.pop()?;
        self.taken(key, 1);
        Some(p)
    }

    /// Blocks of `key` held.
    pub(super) fn len(&mut self, key: Key) -> usize {
        self.list_if_any(key).map_or(0, |l| l.len())
    }

    /// Takes up to `n` blocks of `key` (the last pushed), handing each
    /// to `f`.
    pub(super) fn take_each(&mut self, key: Key, n: usize, mut f: impl FnMut(Key, u64)) {
        let Some(list) = self.list_if_any(key) else {
            return;
        };
        let start = list.len() - n.min(list.len());
        let taken = list.len() - start;
        list.drain(start..).for_each(|p| f(key, p));
        self.taken(key, taken);
    }

    /// Takes up to `n` blocks of `key`.
    pub(super) fn take(&mut self, key: Key, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        self.take_each(key, n, |_, p| out.push(p));
        out
    }

    pub(super) fn extend(&mut self, key: Key, blocks: Vec<u64>) {
        if blocks.is_empty() {
            return;
        }
        let n = blocks.len();
        self.list(key).extend(blocks);
        self.added(key, n);
    }

    /// Takes blocks, the largest first, until at most `keep` bytes stay,
    /// handing each to `f`.
    pub(super) fn shed_each(&mut self, keep: usize, mut f: impl FnMut(Key, u64)) {
        if self.bytes <= keep {
            return;
        }
        if !self.spans.is_empty() {
            let mut spans: Vec<u32> = self.spans.keys().copied().collect();
            spans.sort_unstable_by(|a, b| b.cmp(a));
            for p in spans {
                if self.bytes <= keep {
                    break;
                }
                let key = Key::Span(p);
                self.take_each(key, (self.bytes - keep).div_ceil(key.bytes()), &mut f);
            }
            self.spans.retain(|_, v| !v.is_empty());
        }
        // Lists run from the smallest class to the largest small span.
        for i in (0..self.lists.len()).rev() {
            if self.bytes <= keep {
                break;
            }
            if self.lists[i].is_empty() {
                continue;
            }
            let key = Self::key_of_list(i);
            self.take_each(key, (self.bytes - keep).div_ceil(key.bytes()), &mut f);
        }
    }

    /// Takes blocks, the largest first, until at most `keep` bytes stay.
    pub(super) fn shed(&mut self, keep: usize) -> Vec<u64> {
        let mut out = Vec::new();
        self.shed_each(keep, |_, p| out.push(p));
        out
    }

    /// Every block held, in no order.
    pub(super) fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.lists
            .iter()
            .chain(self.spans.values())
            .flatten()
            .copied()
    }

    /// Takes every block.
    pub(super) fn drain(&mut self) -> Vec<u64> {
        let mut all: Vec<u64> = self.lists.iter_mut().flat_map(std::mem::take).collect();
        all.extend(self.spans.drain().flat_map(|(_, v)| v));
        self.emptied();
        all
    }

    /// Moves every block, the counters and the bytes in use into `to`
    /// (a thread's cache into its stream's); whether any block moved.
    pub(super) fn move_to<F>(&mut self, to: &mut Cache<F>) -> bool {
        let moved = self.bytes > 0;
        for (i, list) in self.lists.iter_mut().enumerate() {
            if !list.is_empty() {
                to.extend(Self::key_of_list(i), std::mem::take(list));
            }
        }
        for (p, list) in self.spans.drain() {
            to.extend(Key::Span(p), list);
        }
        self.emptied();
        // What the pool's count of cached bytes holds for these blocks
        // moves with them: `to`'s next report settles the difference.
        to.reported += std::mem::take(&mut self.reported);
        to.net += std::mem::take(&mut self.net);
        for (t, v) in to.counts.iter_mut().zip(std::mem::take(&mut self.counts)) {
            *t += v;
        }
        moved
    }
}

static SERIALS: AtomicU64 = AtomicU64::new(1);

/// A stream's cache, locked; publishes its mask when let go.
pub(super) struct Locked<'a, E> {
    cache: MutexGuard<'a, Cache<E>>,
    nonempty: &'a AtomicU64,
}

impl<E> std::ops::Deref for Locked<'_, E> {
    type Target = Cache<E>;
    #[inline(always)]
    fn deref(&self) -> &Cache<E> {
        &self.cache
    }
}

impl<E> std::ops::DerefMut for Locked<'_, E> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Cache<E> {
        &mut self.cache
    }
}

impl<E> Drop for Locked<'_, E> {
    #[inline]
    fn drop(&mut self) {
        // Still under the lock: the next holder's store comes after. A
        // mask that did not change is not written (threads that check it
        // keep their copy of the line).
        let mask = self.cache.mask;
        if self.nonempty.load(Ordering::Relaxed) != mask {
            self.nonempty.store(mask, Ordering::Release);
        }
    }
}

/// One stream's cache, shared by the threads that use the stream.
pub(super) struct StreamCache<B: Backend> {
    /// Held so the stream outlives the blocks cached for it: an event is
    /// recorded on it whenever another stream takes them.
    pub(super) stream: B::Stream,
    pub(super) id: usize,
    /// Unique for the pool's life (a stream handle can be reused).
    pub(super) serial: u64,
    cache: Mutex<Cache<B::Event>>,
    /// The cache's [`Cache::mask`] as its lock was last let go.
    nonempty: AtomicU64,
    /// Set by `release_stream`: threads holding this cache must look again.
    pub(super) released: AtomicBool,
    /// The guard generation this stream is ordered after (see `guard`).
    pub(super) seen: AtomicU64,
    /// The threads' caches of this stream ([`super::local`]).
    pub(super) locals: Mutex<Vec<Weak<Local<B>>>>,
    /// Bumped (under the cache's lock) whenever blocks or counters move in
    /// from a thread's cache, so that `stats` can tell it read them twice.
    pub(super) moves: AtomicU64,
    /// The pool's count of the bytes its threads' caches reported (a part
    /// of its count of cached bytes): [`StreamCache::take_in`] moves a
    /// thread's share out of it.
    pub(super) local_cached: Arc<AtomicUsize>,
}

impl<B: Backend> StreamCache<B> {
    pub(super) fn new(stream: &B::Stream, local_cached: Arc<AtomicUsize>) -> StreamCache<B> {
        StreamCache {
            stream: stream.clone(),
            id: B::stream_id(stream),
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            cache: Mutex::new(Cache::default()),
            nonempty: AtomicU64::new(0),
            released: AtomicBool::new(false),
            seen: AtomicU64::new(0),
            locals: Mutex::new(Vec::new()),
            moves: AtomicU64::new(0),
            local_cached,
        }
    }

    /// Moves a thread's cache of this stream into `c` (its lock), with
    /// what the thread's cache reported: true if any block moved.
    pub(super) fn take_in(&self, m: &mut Cache<()>, c: &mut Cache<B::Event>) -> bool {
        self.local_cached.fetch_sub(m.reported, Ordering::Relaxed);
        m.move_to(c)
    }

    pub(super) fn lock(&self) -> Locked<'_, B::Event> {
        Locked {
            cache: self.cache.lock().unwrap_or_else(|p| p.into_inner()),
            nonempty: &self.nonempty,
        }
    }

    /// The cache, unless another thread holds its lock now.
    pub(super) fn try_lock(&self) -> Option<Locked<'_, B::Event>> {
        let cache = match self.cache.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(Locked {
            cache,
            nonempty: &self.nonempty,
        })
    }

    /// Whether the cache may hold a block of `key`, as of the last time
    /// its lock was let go: false means it held none then, so an
    /// allocation can go to the heap without taking the lock. A hint: a
    /// block freed meanwhile stays cached for a later call.
    #[inline]
    pub(super) fn may_hold(&self, key: Key) -> bool {
        self.nonempty.load(Ordering::Acquire) & bit_of(key) != 0
    }

    /// Runs `f` on each live thread cache of this stream, with its blocks
    /// (held meanwhile: its thread goes around it). Never call it holding
    /// a stream cache's lock: `f` may take one, and a thread leaving its
    /// cache takes its stream's.
    pub(super) fn each_local(&self, mut f: impl FnMut(&Local<B>, &mut Cache<()>)) {
        let locals: Vec<Arc<Local<B>>> = {
            let mut l = self.locals.lock().unwrap_or_else(|p| p.into_inner());
            l.retain(|w| w.strong_count() > 0);
            l.iter().filter_map(Weak::upgrade).collect()
        };
        super::local::with_all_held(&locals, |l, m| {
            if !l.is_dead() {
                f(l, m)
            }
        });
    }
}

/// The last (pool, stream) a thread used and its cache (a
/// `StreamCache<B>` of that pool's backend).
type Hint = Option<(u64, usize, Arc<dyn Any + Send + Sync>)>;

thread_local! {
    /// Reached with `try_with` only: a block freed by another
    /// thread-local's destructor may come after this one's (the pool
    /// then goes without a hint).
    static LAST: std::cell::RefCell<Hint> = const { std::cell::RefCell::new(None) };
}

/// This thread's cache for `stream` of pool `pool`, if it used it last.
pub(super) fn hinted<B: Backend>(pool: u64, stream: usize) -> Option<Arc<StreamCache<B>>> {
    LAST.try_with(|l| match &*l.borrow() {
        Some((p, s, c)) if *p == pool && *s == stream => c
            .clone()
            .downcast::<StreamCache<B>>()
            .ok()
            .filter(|c| !c.released.load(Ordering::Acquire)),
        _ => None,
    })
    .ok()
    .flatten()
}

/// Runs `f` on this thread's cache for `stream` of pool `pool` if it
/// used it last, lent from the hint: no reference count changes hands.
/// `f` may call [`remember`], which then leaves the hint as it is.
#[inline]
pub(super) fn with_hinted<B: Backend, R>(
    pool: u64,
    stream: usize,
    f: impl FnOnce(&StreamCache<B>) -> R,
) -> Option<R> {
    LAST.try_with(|l| {
        let hint = l.borrow();
        match &*hint {
            Some((p, s, c)) if *p == pool && *s == stream => {
                let c = c.downcast_ref::<StreamCache<B>>()?;
                if c.released.load(Ordering::Acquire) {
                    return None;
                }
                Some(f(c))
            }
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// Remembers `cache` as this thread's last one (`None` forgets); leaves
/// the hint as it is while [`with_hinted`] lends it (a hint only: a
/// released cache is never lent, and a stream not hinted is looked up).
pub(super) fn remember<B: Backend>(pool: u64, cache: Option<&Arc<StreamCache<B>>>) {
    let _ = LAST.try_with(|l| {
        if let Ok(mut hint) = l.try_borrow_mut() {
            *hint = cache.map(|c| {
                let any: Arc<dyn Any + Send + Sync> = c.clone();
                (pool, c.id, any)
            })
        }
    });
}

/// The next thread's slot number (see [`thread_slot`]).
static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread's slot in the backing heap, handed out in turn when
    /// the thread first reaches a pool: threads that reach it one after
    /// another get different slots (the heap takes the number modulo its
    /// slots), so their class pages and current pages are their own. A
    /// hash of the thread's id put two of eight threads on one slot in
    /// about a third of runs (a birthday collision among 64 slots).
    static SLOT: u32 = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
}

pub(super) fn thread_slot() -> u32 {
    SLOT.with(|s| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Key::of`'s table gives the class of the size rounded to `ALIGN`
    /// for every size a class serves (spans above), and each such class
    /// is a multiple of `ALIGN` whose own size keys it (so a class
    /// block's key is its class, and its live bit its own).
    #[test]
    fn a_key_is_the_class_of_its_size_rounded() {
        for size in 1..=MAX_CLASS_SIZE + 3 * PAGE_SIZE {
            let rounded = size.next_multiple_of(ALIGN);
            let want = match class_of(rounded) {
                Some(c) => Key::Class(c),
                None => Key::Span(rounded.div_ceil(PAGE_SIZE) as u32),
            };
            assert_eq!(Key::of(size), Some(want), "{size} bytes");
            if let Key::Class(c) = want {
                assert!((class_size(c) as usize).is_multiple_of(ALIGN), "class {c}");
                assert_eq!(Key::of(class_size(c) as usize), Some(want), "class {c}");
            }
        }
        assert_eq!(Key::of(usize::MAX), None);
    }

    /// Threads that reach the pool one after another take slots in turn:
    /// eight at once sit on eight of the heap's slots.
    #[test]
    fn threads_take_slots_in_turn() {
        let slots: Vec<u32> = (0..8)
            .map(|_| std::thread::spawn(thread_slot).join().unwrap())
            .collect();
        for w in slots.windows(2) {
            assert!(w[1] > w[0], "slots {slots:?}");
        }
        let distinct: std::collections::HashSet<u32> =
            slots.iter().map(|s| s % super::super::SLOTS).collect();
        assert!(distinct.len() >= 7, "slots {slots:?}");
    }

    #[test]
    fn keys_round_to_256_and_cover_the_request() {
        for size in [
            1usize,
            16,
            255,
            256,
            257,
            1000,
            4096,
            65_536,
            65_537,
            1 << 20,
            (64 << 20) + 1,
        ] {
            let k = Key::of(size).unwrap();
            assert!(k.bytes() >= size, "{size}");
            assert_eq!(
                k.bytes() % ALIGN,
                0,
                "{size} -> {k:?} is not a multiple of 256"
            );
        }
        assert_eq!(Key::of(64 << 20), Some(Key::Span(1024)));
        // A one-page span and a 64 KiB class block share a key.
        let span = BlockInfo {
            page: 3,
            class: None,
            index: 0,
            size: PAGE_SIZE,
        };
        assert_eq!(Key::of_block(&span), Key::of(PAGE_SIZE).unwrap());
        assert_eq!(Key::of_block(&span).bytes(), PAGE_SIZE);
        assert_eq!(Key::of(usize::MAX), None);
    }

    #[test]
    fn cache_bytes_follow_its_blocks() {
        let mut c = Cache::<()>::default();
        let (a, b) = (Key::of(256).unwrap(), Key::of(1 << 20).unwrap());
        c.push(a, 1);
        c.push(a, 2);
        c.push(b, 3);
        assert_eq!(c.bytes, 2 * a.bytes() + b.bytes());
        assert_eq!(c.take(a, 5), vec![1, 2]);
        assert_eq!(c.pop(b), Some(3));
        assert_eq!((c.bytes, c.pop(a)), (0, None));
        c.extend(a, vec![4, 5]);
        assert_eq!(c.drain().len(), 2);
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn shedding_takes_the_largest_blocks_first_down_to_what_is_kept() {
        let mut c = Cache::<()>::default();
        let (small, mid, span) = (
            Key::of(256).unwrap(),
            Key::of(4096).unwrap(),
            Key::of(1 << 20).unwrap(),
        );
        for i in 0..8 {
            c.push(small, i);
            c.push(mid, 100 + i);
        }
        c.push(span, 1000);
        c.push(span, 1001);
        let total = c.bytes;
        // Keeping all but one span's worth: one span goes.
        assert_eq!(c.shed(total - span.bytes()), vec![1001]);
        // Keeping 5 small blocks' worth: the other span, every 4 KiB
        // block, then 3 small ones.
        let out = c.shed(5 * small.bytes());
        assert_eq!(out.len(), 1 + 8 + 3);
        assert_eq!(c.bytes, 5 * small.bytes());
        assert!(out.contains(&1000) && (100..108).all(|p| out.contains(&p)));
        assert!(c.shed(usize::MAX).is_empty());
        assert_eq!(c.shed(0).len(), 5);
        assert_eq!(c.bytes, 0);
    }

    /// A list's bit is set exactly when it holds a block (the spans'
    /// exactly when one of them does), after any sequence of the cache's
    /// operations.
    fn assert_mask_covers(c: &mut Cache<()>, keys: &[Key]) {
        for &k in keys {
            if let Place::List(_) = Place::of(k) {
                assert_eq!(
                    c.len(k) > 0,
                    c.mask & bit_of(k) != 0,
                    "{k:?}: mask {:#x}",
                    c.mask
                );
            }
        }
        let in_spans: usize = c.spans.values().map(Vec::len).sum();
        assert_eq!(c.in_spans, in_spans);
        assert_eq!(
            in_spans > 0,
            c.mask & SPANS_BIT != 0,
            "spans: mask {:#x}",
            c.mask
        );
    }

    #[test]
    fn the_mask_marks_every_list_that_holds_blocks() {
        // Classes, small spans and spans past the lists (the map).
        let keys: Vec<Key> = [256usize, 4096, 65_536, 1 << 20, (1 << 20) + 1, 8 << 20]
            .iter()
            .map(|&s| Key::of(s).unwrap())
            .collect();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut c = Cache::<()>::default();
        let mut other = Cache::<()>::default();
        let mut emptied = 0;
        for step in 0..20_000u64 {
            let k = keys[next() as usize % keys.len()];
            match next() % 9 {
                0..=2 => {
                    c.push(k, step);
                }
                3 | 4 => {
                    c.pop(k);
                }
                5 => {
                    c.take(k, (next() % 4) as usize);
                }
                6 => c.extend(k, vec![step; (next() % 3) as usize]),
                7 => {
                    let keep = c.bytes / 2;
                    c.shed(keep);
                }
                _ => match next() % 8 {
                    0 => {
                        c.drain();
                    }
                    1 => {
                        c.move_to(&mut other);
                        assert_mask_covers(&mut other, &keys);
                        other.drain();
                    }
                    _ => {}
                },
            }
            assert_mask_covers(&mut c, &keys);
            if c.bytes == 0 {
                assert_eq!(c.mask, 0, "empty cache, mask {:#x}", c.mask);
                assert_eq!(c.in_spans, 0);
                emptied += 1;
            }
        }
        assert!(emptied > 100, "the cache was empty only {emptied} times");
    }
}
