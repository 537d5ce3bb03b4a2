//! Thread caches: the blocks one thread freed on one stream, which its
//! next allocations of those sizes on that stream take back with no lock
//! and no atomic shared with other threads but the block's live bit.
//!
//! - Each thread keeps, per (pool, stream) it uses (at most
//!   [`LOCAL_STREAMS`]; a new one pushes the least recently made out), a
//!   [`Local`]: a [`Cache`] of blocks of up to [`LOCAL_MAX_BLOCK`] bytes,
//!   with its own call counters and bytes in use. Reuse on the stream
//!   that freed a block needs no wait (stream order puts the new work
//!   after the old), so a thread's frees serve its allocations at once.
//! - The blocks sit behind one pointer, which their thread swaps out for
//!   the length of a call and stores back after: one exchange on a cache
//!   line of its own (no other thread writes it in the common case). The pool reaches
//!   them the same way ([`Local::with_held`]), waiting while the thread
//!   holds them (a few instructions with no wait inside); a thread that
//!   finds its pointer taken goes the locked way, through its stream's
//!   cache.
//! - Bounded: past [`LOCAL_BYTES`] bytes, or [`LOCAL_PER_KEY`] blocks of
//!   one size, blocks spill into the stream's cache (whose bounds then
//!   apply). Everything goes into the stream's cache when the thread
//!   exits, when the pool runs short of memory, trims or flushes, and when
//!   it lets go of the stream (which also ends the thread's cache: its
//!   thread makes a new one on its next call).
//! - Counters and bytes in use stay in the thread's cache; the pool adds
//!   them up for its statistics and folds the bytes into its peak every
//!   64 calls, as a stream cache does, and when the thread's cache spills
//!   blocks to its stream's.
//! - Lock order: a thread's blocks, then a stream cache's lock. No one
//!   waits for a thread's blocks while holding a stream cache's lock.

use super::cache::{Cache, StreamCache};
use crate::backend::Backend;
use std::any::Any;
use std::cell::RefCell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Weak};

/// The largest block a thread cache holds.
pub(super) const LOCAL_MAX_BLOCK: usize = 1 << 20;
/// Bytes one thread's cache of one stream holds at most: past it, the
/// largest blocks spill to the stream's cache until half stays.
pub(super) const LOCAL_BYTES: usize = 2 << 20;
/// Blocks of one size a thread's cache holds at most: past it, half of
/// them spill.
pub(super) const LOCAL_PER_KEY: usize = 64;
/// Thread caches one thread keeps (one per pool and stream).
const LOCAL_STREAMS: usize = 8;

/// One thread's cache of one stream of one pool, on cache lines of its
/// own.
#[repr(align(128))]
pub(super) struct Local<B: Backend> {
    sc: Weak<StreamCache<B>>,
    /// The blocks (a leaked `Box`); null while someone holds them.
    held: AtomicPtr<Cache<()>>,
    /// Set (while held) when the pool ended this cache: its blocks went
    /// to the stream's cache and no more go here.
    dead: AtomicBool,
}

/// Stores the blocks back when a holder is done, even one that panics.
struct Hold<'a>(&'a AtomicPtr<Cache<()>>, *mut Cache<()>);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

impl<B: Backend> Local<B> {
    fn new(sc: &Arc<StreamCache<B>>) -> Local<B> {
        Local {
            sc: Arc::downgrade(sc),
            held: AtomicPtr::new(Box::into_raw(Box::default())),
            dead: AtomicBool::new(false),
        }
    }

    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Ends this cache; call it from [`Local::with_held`], with its blocks
    /// moved out.
    pub(super) fn kill(&self) {
        self.dead.store(true, Ordering::Relaxed);
    }

    /// Runs `f` on the blocks, waiting while another holds them.
    pub(super) fn with_held<R>(&self, f: impl FnOnce(&mut Cache<()>) -> R) -> R {
        let mut spins = 0u32;
        let m = loop {
            let m = self.held.swap(null_mut(), Ordering::Acquire);
            if !m.is_null() {
                break m;
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        let _back = Hold(&self.held, m);
        // SAFETY: `m` came from `Box::into_raw` and was swapped out of
        // `held`, so no one else reaches it until `_back` stores it back.
        f(unsafe { &mut *m })
    }

    /// Runs `f` on the blocks unless someone holds them or the cache is
    /// dead.
    #[inline]
    fn try_held<R>(&self, f: impl FnOnce(&mut Cache<()>) -> R) -> Option<R> {
        let m = self.held.swap(null_mut(), Ordering::Acquire);
        if m.is_null() {
            return None;
        }
        let _back = Hold(&self.held, m);
        if self.is_dead() {
            return None;
        }
        // SAFETY: as in `with_held`.
        Some(f(unsafe { &mut *m }))
    }
}

impl<B: Backend> Drop for Local<B> {
    fn drop(&mut self) {
        let m = *self.held.get_mut();
        if !m.is_null() {
            // SAFETY: from `Box::into_raw`, and no one else holds it (we
            // are the last owner).
            drop(unsafe { Box::from_raw(m) });
        }
    }
}

/// A [`Local`] of any backend, as a thread keeps it.
trait Leave: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// Moves the blocks to the stream's cache and ends the cache.
    fn leave(&self);
    fn is_dead(&self) -> bool;
}

impl<B: Backend> Leave for Local<B> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn leave(&self) {
        self.with_held(|m| {
            if self.is_dead() {
                return;
            }
            // A stream cache the pool forgot ended its threads' caches
            // first (and `install` attaches none to a released one), so
            // this one still has its stream's.
            if let Some(sc) = self.sc.upgrade() {
                let mut c = sc.lock();
                sc.moves.fetch_add(1, Ordering::Release);
                if m.move_to(&mut c) {
                    c.dirty = true;
                }
            }
            self.kill();
        })
    }

    fn is_dead(&self) -> bool {
        Local::is_dead(self)
    }
}

/// A thread's cache of `stream` of pool `pool`; leaves when dropped (at
/// thread exit or when pushed out).
struct Slot {
    pool: u64,
    stream: usize,
    local: Arc<dyn Leave>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.local.leave();
    }
}

thread_local! {
    static LOCALS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
}

/// What [`with_local`] found.
pub(super) enum Reach<R> {
    /// The thread's cache, and what `f` returned.
    Done(R),
    /// Held by the pool (or the thread is exiting): go the locked way.
    Busy,
    /// No live cache of this stream: [`install`] one.
    Absent,
}

/// Runs `f` on this thread's cache of `stream` of pool `pool`.
#[inline]
pub(super) fn with_local<B: Backend, R>(
    pool: u64,
    stream: usize,
    f: impl FnOnce(&mut Cache<()>) -> R,
) -> Reach<R> {
    LOCALS
        .try_with(|v| {
            let Ok(v) = v.try_borrow() else {
                return Reach::Busy;
            };
            let found = v.iter().find(|s| s.pool == pool && s.stream == stream);
            match found.and_then(|s| s.local.as_any().downcast_ref::<Local<B>>()) {
                None => Reach::Absent,
                Some(l) if l.is_dead() => Reach::Absent,
                Some(l) => l.try_held(f).map_or(Reach::Busy, Reach::Done),
            }
        })
        .unwrap_or(Reach::Busy)
}

/// Gives this thread a cache of `sc`'s stream in pool `pool`, in place
/// of a dead one. Call it holding no stream cache's lock: a cache pushed
/// out leaves into its stream's.
pub(super) fn install<B: Backend>(pool: u64, sc: &Arc<StreamCache<B>>) {
    let local = Arc::new(Local::new(sc));
    {
        let mut l = sc.locals.lock().unwrap_or_else(|p| p.into_inner());
        // Released (`release_stream`, a sweep) and gathered with `end`, or
        // about to be (`released` is set before the gather takes `locals`):
        // a cache installed now would never be reached again.
        if sc.released.load(Ordering::Acquire) {
            return;
        }
        l.retain(|w| w.strong_count() > 0);
        l.push(Arc::downgrade(&local));
    }
    let _ = LOCALS.try_with(|v| {
        let Ok(mut v) = v.try_borrow_mut() else {
            return;
        };
        let stale = |s: &Slot| s.local.is_dead() || (s.pool == pool && s.stream == sc.id);
        v.retain(|s| !stale(s));
        if v.len() >= LOCAL_STREAMS {
            v.pop();
        }
        v.insert(
            0,
            Slot {
                pool,
                stream: sc.id,
                local,
            },
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host_memory::HostStream;
    use crate::HostBackend;
    use std::collections::HashSet;

    /// The owner's calls and the pool's gathering hand the blocks back and
    /// forth: every block ends up in exactly one place. (Also run under
    /// Miri, which checks the pointer handling.)
    #[test]
    fn owner_and_gatherer_never_hold_the_blocks_at_once() {
        let sc = Arc::new(StreamCache::<HostBackend>::new(&HostStream::new()));
        let local = Local::new(&sc);
        let key = super::super::cache::Key::Class(20);
        let n: u64 = if cfg!(miri) { 60 } else { 20_000 };
        let gathered = std::thread::scope(|s| {
            let gatherer = s.spawn(|| {
                let mut got = Vec::new();
                while got.len() < n as usize {
                    local.with_held(|m| got.extend(m.drain()));
                    std::thread::yield_now();
                }
                got
            });
            let mut busy = 0;
            for ptr in 1..=n {
                let mut placed = false;
                while !placed {
                    match local.try_held(|m| m.push(key, ptr)) {
                        Some(()) => placed = true,
                        None => busy += 1,
                    }
                }
            }
            let _ = busy;
            gatherer.join().unwrap()
        });
        let distinct: HashSet<u64> = gathered.iter().copied().collect();
        assert_eq!(distinct.len(), gathered.len(), "a block twice");
        assert_eq!(distinct, (1..=n).collect());
        // Ended: the owner is refused, the gatherer still reaches it.
        local.with_held(|_| local.kill());
        assert!(local.try_held(|_| ()).is_none());
        assert_eq!(local.with_held(|m| m.bytes), 0);
    }

    /// A thread's caches leave into their streams when it exits.
    #[test]
    fn a_thread_leaves_its_caches_when_it_exits() {
        let sc = Arc::new(StreamCache::<HostBackend>::new(&HostStream::new()));
        let key = super::super::cache::Key::Class(3);
        std::thread::scope(|s| {
            s.spawn(|| {
                install(u64::MAX, &sc);
                let pushed = with_local::<HostBackend, _>(u64::MAX, sc.id, |m| {
                    m.push(key, 7);
                    m.counts[1] += 1;
                });
                assert!(matches!(pushed, Reach::Done(())));
            })
            // A join waits for the thread's exit (the scope alone waits
            // only for the closure, not for the thread's locals to go).
            .join()
            .unwrap();
        });
        let mut c = sc.lock();
        assert_eq!((c.pop(key), c.counts[1], c.dirty), (Some(7), 1, true));
        drop(c);
        sc.each_local(|_, _| panic!("no live cache left"));
    }
}
