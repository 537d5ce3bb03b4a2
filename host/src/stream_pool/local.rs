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
//! - The blocks are reached by their thread with no locked instruction:
//!   it marks itself busy (a plain store), then reads whether the pool
//!   claimed them (a plain load); the pool claims them, then waits until
//!   the thread is not busy ([`Local::with_held`]; a few instructions with
//!   no wait inside). The two sides form a Dekker pair whose store-load
//!   order the pool pays for alone, with a process-wide barrier
//!   (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` on Linux, see
//!   [`barrier`]; one for all the caches the pool claims at once,
//!   [`with_all_held`]); where it is not there (other systems, a kernel
//!   or a sandbox without it, Miri) or with `CUHEAP_POOL_MEMBARRIER=0`,
//!   both sides use a full fence. A thread
//!   that finds its blocks claimed goes the locked way, through its
//!   stream's cache.
//! - Bounded: past [`LOCAL_BYTES`] bytes, or [`LOCAL_PER_KEY`] blocks of
//!   one size, blocks spill into the stream's cache (whose bounds then
//!   apply). Everything goes into the stream's cache when the thread
//!   exits, when the pool runs short of memory, trims or flushes, and when
//!   it lets go of the stream (which also ends the thread's cache: its
//!   thread makes a new one on its next call). Every 64 calls the thread
//!   reports its cached bytes to the pool's count (when they moved 64 KiB
//!   or more) and checks the bound on all caches: past it, its next free
//!   sends half of its blocks to the stream's cache.
//! - Counters and bytes in use stay in the thread's cache; the pool adds
//!   them up for its statistics and folds the bytes into its peak every
//!   64 calls, as a stream cache does, and when the thread's cache spills
//!   blocks to its stream's.
//! - Lock order: a thread's blocks, then a stream cache's lock. No one
//!   waits for a thread's blocks while holding a stream cache's lock.

use super::cache::{Cache, StreamCache};
use crate::backend::Backend;
use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// The blocks: the owning thread reaches them while `busy` and not
    /// `claimed`, the pool while `claimed` and not `busy` (see
    /// [`Local::try_held`] and [`Local::with_held`]).
    blocks: UnsafeCell<Cache<()>>,
    /// Written by the owning thread alone: it is in a call on the blocks.
    busy: AtomicBool,
    /// The pool holds the blocks (one holder at a time).
    claimed: AtomicBool,
    /// Set (while claimed) when the pool ended this cache: its blocks went
    /// to the stream's cache and no more go here.
    dead: AtomicBool,
}

// SAFETY: `blocks` is reached only by the side that holds it (the owner
// while busy and unclaimed, one claimer while the owner is not busy);
// `barrier` orders the two sides' flags (see `try_held`).
unsafe impl<B: Backend> Sync for Local<B> {}

/// Clears a flag when its holder is done, even one that panics.
struct Release<'a>(&'a AtomicBool);

impl Drop for Release<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<B: Backend> Local<B> {
    fn new(sc: &Arc<StreamCache<B>>) -> Local<B> {
        // Before any side of this cache can run: both read one mode.
        barrier::init();
        Local {
            sc: Arc::downgrade(sc),
            blocks: UnsafeCell::new(Cache::default()),
            busy: AtomicBool::new(false),
            claimed: AtomicBool::new(false),
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

    /// Runs `f` on the blocks, waiting while another claimer holds them
    /// and while their thread is in a call on them.
    pub(super) fn with_held<R>(&self, f: impl FnOnce(&mut Cache<()>) -> R) -> R {
        let _back = self.claim();
        // The claim's store before the owner's flag's load (the owner pays
        // nothing for its side of the order when this is a membarrier).
        barrier::heavy();
        self.wait_idle();
        // SAFETY: claimed, and its thread is not in a call on the blocks:
        // it saw the claim or will (`barrier`), and leaves them alone.
        f(unsafe { &mut *self.blocks.get() })
    }

    /// Claims the blocks (waiting while another claimer holds them);
    /// the claim ends when the returned guard drops. The owner is not
    /// kept out until a [`barrier::heavy`] after the claim.
    fn claim(&self) -> Release<'_> {
        let mut spins = 0u32;
        while self.claimed.swap(true, Ordering::Acquire) {
            pause(&mut spins);
        }
        Release(&self.claimed)
    }

    /// Waits until the owning thread is not in a call on the blocks.
    fn wait_idle(&self) {
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            pause(&mut spins);
        }
    }

    /// The owning thread's way in: runs `f` on the blocks unless the pool
    /// holds them, the cache is dead, or the thread is already in a call
    /// on them (re-entered). No locked instruction: a store of `busy`, a
    /// compiler fence, a load of `claimed` (with the membarrier; else a
    /// full fence between them).
    ///
    /// Only the thread that owns this cache may call it (its `LOCALS`).
    #[inline]
    fn try_held<R>(&self, f: impl FnOnce(&mut Cache<()>) -> R) -> Option<R> {
        if self.busy.load(Ordering::Relaxed) {
            return None; // re-entered: the outer call holds the blocks
        }
        self.busy.store(true, Ordering::Relaxed);
        let _done = Release(&self.busy);
        barrier::light();
        if self.claimed.load(Ordering::Acquire) || self.is_dead() {
            return None;
        }
        // SAFETY: busy, and no claimer saw it idle since it set `busy`:
        // a claim made before the barrier pair is seen above; one made
        // after it waits for `busy` to clear.
        Some(f(unsafe { &mut *self.blocks.get() }))
    }
}

/// A short wait in a spin: a pause, then yielding the CPU.
fn pause(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// Runs `f` on the blocks of each of `locals`, as [`Local::with_held`]
/// does for one, with one heavy barrier for all: claims each in order,
/// then takes each once its thread is not in a call on it, and lets go
/// of each after its `f`. Claimers take caches in their stream's list
/// order, so two of them never wait for each other in a cycle.
pub(super) fn with_all_held<B: Backend>(
    locals: &[Arc<Local<B>>],
    mut f: impl FnMut(&Local<B>, &mut Cache<()>),
) {
    let claims: Vec<Release<'_>> = locals.iter().map(|l| l.claim()).collect();
    barrier::heavy();
    for (l, claim) in locals.iter().zip(claims) {
        l.wait_idle();
        // SAFETY: as in `with_held`.
        f(l, unsafe { &mut *l.blocks.get() });
        drop(claim);
    }
}

/// The two sides of the thread caches' Dekker pair (see the module
/// documentation): `light` on the owning thread's every call, `heavy` on
/// the pool's rare claims. With `membarrier`'s private expedited command
/// (registered once, before the first thread cache is made), `light` is
/// a compiler fence and `heavy` makes every running thread of the
/// process pass a full barrier; without it both are full fences.
pub(super) mod barrier {
    use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

    /// 0: not decided (full fences), 1: full fences, 2: membarrier.
    static MODE: AtomicU8 = AtomicU8::new(0);

    /// Decides the mode; every thread cache calls it as it is made
    /// ([`super::Local::new`]), before either of its sides can run, so
    /// both read the same mode.
    pub(in super::super) fn init() {
        if MODE.load(Ordering::Acquire) == 0 {
            let m = if membarrier_on() { 2 } else { 1 };
            // The first decision stands (a racing one may differ, say
            // if the registration failed for it): every reader sees it.
            let _ = MODE.compare_exchange(0, m, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Whether the membarrier is used.
    #[cfg(test)]
    pub(in super::super) fn membarrier_used() -> bool {
        MODE.load(Ordering::Acquire) == 2
    }

    #[cfg(all(target_os = "linux", not(miri)))]
    fn membarrier_on() -> bool {
        use rustix::thread::{membarrier, MembarrierCommand};
        if std::env::var_os("CUHEAP_POOL_MEMBARRIER").is_some_and(|v| v == "0") {
            return false;
        }
        membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok()
    }

    #[cfg(not(all(target_os = "linux", not(miri))))]
    fn membarrier_on() -> bool {
        false
    }

    #[inline(always)]
    pub(super) fn light() {
        if MODE.load(Ordering::Relaxed) == 2 {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    pub(super) fn heavy() {
        if MODE.load(Ordering::Relaxed) != 2 {
            fence(Ordering::SeqCst);
            return;
        }
        #[cfg(all(target_os = "linux", not(miri)))]
        {
            use rustix::thread::{membarrier, MembarrierCommand};
            // Registered, so it fails only for want of kernel memory (or
            // a rule that refuses it later): try again, then the global
            // command (no registration, slower). The owners' compiler
            // fences order nothing without one of them: stop if both
            // fail.
            let mut last = None;
            for _ in 0..3 {
                match membarrier(MembarrierCommand::PrivateExpedited) {
                    Ok(()) => return,
                    Err(e) => last = Some(e),
                }
            }
            if let Err(e) = membarrier(MembarrierCommand::Global) {
                panic!("cuheap: membarrier failed after it was registered ({last:?}), and globally ({e})");
            }
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
                if sc.take_in(m, &mut c) {
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
        // Whichever slot goes, the hint may be the one that points into
        // it: it goes too.
        HOT.set(Hot::NONE);
        self.local.leave();
    }
}

/// The thread cache this thread reached last: its pool, stream and type,
/// and a pointer to it, valid while the [`Slot`] that holds it is in
/// `LOCALS` (every slot's drop clears the hint). A call on the same pool
/// and stream as the last reaches its cache with three compares, with no
/// borrow of `LOCALS` and no search or dynamic cast.
#[derive(Clone, Copy)]
struct Hot {
    pool: u64,
    stream: usize,
    ty: TypeId,
    local: *const (),
}

impl Hot {
    const NONE: Hot = Hot {
        pool: 0,
        stream: 0,
        ty: TypeId::of::<()>(),
        local: std::ptr::null(),
    };
}

thread_local! {
    static LOCALS: RefCell<Vec<Slot>> = const { RefCell::new(Vec::new()) };
    // No destructor: readable while `LOCALS` itself is dropped.
    static HOT: Cell<Hot> = const { Cell::new(Hot::NONE) };
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
    let hot = HOT.get();
    let local = if hot.pool == pool && hot.stream == stream && hot.ty == TypeId::of::<Local<B>>() {
        hot.local
    } else {
        match find_local::<B>(pool, stream) {
            Reach::Done(local) => local,
            Reach::Busy => return Reach::Busy,
            Reach::Absent => return Reach::Absent,
        }
    };
    // SAFETY: the pointer is the hint's, or the one `find_local` just made
    // the hint from the slot it found: a `Local<B>` (its type checked)
    // that a slot of `LOCALS` holds; a slot's drop clears the hint, so
    // the slot, and the `Arc` it holds, are still there, and stay while
    // `f` runs: no `f` installs a cache or drops a slot (the pool's are
    // counts and list moves on the blocks).
    let l = unsafe { &*(local as *const Local<B>) };
    if l.is_dead() {
        HOT.set(Hot::NONE);
        return Reach::Absent;
    }
    l.try_held(f).map_or(Reach::Busy, Reach::Done)
}

/// This thread's cache of `stream` of pool `pool`, found in `LOCALS`
/// and made the hint ([`HOT`]); the caller checks whether it is dead.
#[inline(never)]
fn find_local<B: Backend>(pool: u64, stream: usize) -> Reach<*const ()> {
    LOCALS
        .try_with(|v| {
            let Ok(v) = v.try_borrow() else {
                return Reach::Busy;
            };
            let found = v.iter().find(|s| s.pool == pool && s.stream == stream);
            let Some(l) = found.and_then(|s| s.local.as_any().downcast_ref::<Local<B>>()) else {
                return Reach::Absent;
            };
            let hint = Hot {
                pool,
                stream,
                ty: TypeId::of::<Local<B>>(),
                local: l as *const Local<B> as *const (),
            };
            HOT.set(hint);
            Reach::Done(hint.local)
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
    /// Miri, in the full-fence mode: Miri has no membarrier.)
    #[test]
    fn owner_and_gatherer_never_hold_the_blocks_at_once() {
        barrier::init();
        println!("membarrier used: {}", barrier::membarrier_used());
        let sc = Arc::new(StreamCache::<HostBackend>::new(
            &HostStream::new(),
            Default::default(),
        ));
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
                        Some(_) => placed = true,
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

    /// A pass over several caches at once (one barrier for all) while
    /// their owners keep pushing: every block ends up in exactly one place.
    #[test]
    fn a_pass_over_several_caches_takes_every_block_once() {
        let sc = Arc::new(StreamCache::<HostBackend>::new(
            &HostStream::new(),
            Default::default(),
        ));
        let locals: Vec<Arc<Local<HostBackend>>> =
            (0..3).map(|_| Arc::new(Local::new(&sc))).collect();
        let key = super::super::cache::Key::Class(20);
        let n: u64 = if cfg!(miri) { 40 } else { 10_000 };
        let gathered = std::thread::scope(|s| {
            for (t, l) in locals.iter().enumerate() {
                s.spawn(move || {
                    for i in 1..=n {
                        let ptr = (t as u64) << 32 | i;
                        while l.try_held(|m| m.push(key, ptr)).is_none() {}
                    }
                });
            }
            let mut got = Vec::new();
            while got.len() < 3 * n as usize {
                with_all_held(&locals, |_, m| got.extend(m.drain()));
                std::thread::yield_now();
            }
            got
        });
        let distinct: HashSet<u64> = gathered.iter().copied().collect();
        assert_eq!(distinct.len(), gathered.len(), "a block twice");
        assert_eq!(distinct.len(), 3 * n as usize);
    }

    /// A thread's caches leave into their streams when it exits.
    #[test]
    fn a_thread_leaves_its_caches_when_it_exits() {
        let sc = Arc::new(StreamCache::<HostBackend>::new(
            &HostStream::new(),
            Default::default(),
        ));
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

    /// The hint to the cache a thread reached last goes with that cache:
    /// one pushed out (more streams than a thread keeps) or ended by the
    /// pool is not reached through it. (Under Miri, a read of a cache
    /// freed behind the hint fails the test.)
    #[test]
    fn the_hint_goes_with_the_cache_it_points_to() {
        let scs: Vec<Arc<StreamCache<HostBackend>>> = (0..=LOCAL_STREAMS)
            .map(|_| Arc::new(StreamCache::new(&HostStream::new(), Default::default())))
            .collect();
        let key = super::super::cache::Key::Class(3);
        let pool = u64::MAX - 1;
        let reach = |sc: &StreamCache<HostBackend>, ptr: u64| {
            with_local::<HostBackend, _>(pool, sc.id, |m| m.push(key, ptr))
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                install(pool, &scs[0]);
                // The first call finds the cache in the thread's list, the
                // second through the hint.
                for ptr in [1, 2] {
                    assert!(matches!(reach(&scs[0], ptr), Reach::Done(_)));
                }
                // Eight more streams: the first one's cache is pushed out
                // (its blocks go to its stream), and the hint with it.
                for sc in &scs[1..] {
                    install(pool, sc);
                }
                assert!(matches!(reach(&scs[0], 3), Reach::Absent));
                assert_eq!(scs[0].lock().len(key), 2);
                // Reached (the hint now points at it), then ended by the
                // pool: absent at once, and the thread makes a new one.
                let last = &scs[LOCAL_STREAMS];
                assert!(matches!(reach(last, 4), Reach::Done(_)));
                last.each_local(|l, m| {
                    last.lock().extend(key, m.take(key, usize::MAX));
                    l.kill();
                });
                assert!(matches!(reach(last, 5), Reach::Absent));
                install(pool, last);
                assert!(matches!(reach(last, 6), Reach::Done(_)));
            })
            .join()
            .unwrap();
        });
        // Block 4 (taken by the pool) and block 6 (left at the thread's
        // exit), each once.
        let mut got = scs[LOCAL_STREAMS].lock().take(key, usize::MAX);
        got.sort();
        assert_eq!(got, vec![4, 6]);
    }
}
