//! [`HostBackend`]: the pool's [`Backend`] in host memory, for tests.
//!
//! Addresses are numbers in a private range, never dereferenced: tests
//! reach the memory through [`HostBackend::write`] and
//! [`HostBackend::read`] (as the own device, 0) or
//! [`HostBackend::write_as`] and [`HostBackend::read_as`] (as a peer of
//! [`HostBackend::with_devices`]), which fail on any byte that is not
//! mapped with access granted to that device. New memory and unmapped
//! memory are filled with [`POISON`], so a block whose memory was
//! unmapped under its owner (or remapped fresh) reads back wrong; memory
//! shared by another backend (standing in for another process,
//! [`Backend::share`] and [`Backend::import`]) is the same bytes, and the
//! importer's unmap leaves them alone. Streams count the work enqueued on
//! them and remember every event they waited for, so tests can check
//! stream ordering. Work completes at once, unless a test holds a stream
//! ([`HostStream::hold`]): then the work enqueued after the hold is not
//! done (an event recorded after it queries as pending) until
//! [`HostStream::finish`], or until the host waits for such an event. Physical memory can be limited to test out-of-memory
//! paths. A call that breaks a `# Safety` contract of [`Backend`] (a map
//! over a mapping, an unmap of what is not mapped) panics: finding such
//! bugs is what this backend is for.

use super::Backend;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The byte new and unmapped memory is filled with.
pub const POISON: u8 = 0xDB;

/// First address handed out by [`Backend::reserve`].
const BASE: u64 = 0x7e00_0000_0000;

/// Device operations counted by a [`HostBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounts {
    pub maps: u64,
    pub unmaps: u64,
    pub records: u64,
    pub waits: u64,
    pub event_syncs: u64,
    pub queries: u64,
    pub device_syncs: u64,
}

/// Host memory standing in for a device.
pub struct HostBackend {
    granularity: usize,
    /// Devices `0..devices` exist; this backend's memory is device 0's,
    /// and every other device has a peer path to it.
    devices: i32,
    /// Whether memory can be shared with another backend.
    shares: bool,
    /// Whether memory keeps bytes (else reads and writes fail, and
    /// `create` allocates nothing on the host).
    contents: bool,
    /// Physical memory `create` may hand out in all.
    capacity: usize,
    state: Mutex<State>,
    /// Physical bytes alive (shared with [`HostMemory`] for its drop).
    physical: Arc<AtomicUsize>,
    counts: Mutex<HostCounts>,
    /// Mappings (by address) whose grants or revokes fail (see
    /// [`HostBackend::refuse_access_at`]).
    refused: Mutex<Vec<(u64, bool, bool)>>,
    /// Called at the start of every unmap (see [`HostBackend::on_unmap`]).
    unmap_hook: Mutex<Option<UnmapHook>>,
    /// Whether unmaps fail (see [`HostBackend::refuse_unmaps`]).
    refuse_unmaps: AtomicBool,
}

/// A test's callback at the start of an unmap: address and length.
type UnmapHook = Arc<dyn Fn(u64, usize) + Send + Sync>;

#[derive(Default)]
struct State {
    next: u64,
    reservations: BTreeMap<u64, usize>,
    /// Mapped ranges by start: length, memory, devices granted access.
    mapped: BTreeMap<u64, Mapping>,
}

struct Mapping {
    bytes: usize,
    memory: Arc<Mutex<Vec<u8>>>,
    /// Bit `d`: device `d` may read and write.
    access: u64,
    /// Imported from another backend: unmapping leaves its bytes alone
    /// (the owner still has them).
    imported: bool,
}

/// Physical memory of a [`HostBackend`].
pub struct HostMemory {
    bytes: Arc<Mutex<Vec<u8>>>,
    len: usize,
    physical: Arc<AtomicUsize>,
    imported: bool,
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        self.physical.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// Memory of a [`HostBackend`] made importable by another one (standing
/// in for another process): the same bytes.
pub struct HostShared {
    bytes: Arc<Mutex<Vec<u8>>>,
    len: usize,
}

/// A stream of a [`HostBackend`]: counts the work enqueued on it and
/// keeps the events it waited for.
#[derive(Clone)]
pub struct HostStream(Arc<StreamState>);

struct StreamState {
    id: usize,
    work: AtomicU64,
    /// While held, the count of work items done; `u64::MAX` when not held
    /// (everything enqueued is done). Shared with the events recorded on
    /// the stream: work still runs after its stream is dropped.
    done: Arc<AtomicU64>,
    waits: Mutex<Vec<Recorded>>,
    /// The capture's id between [`HostStream::begin_capture`] and
    /// [`HostStream::end_capture`]; 0 outside.
    capture: AtomicU64,
}

/// What an event recorded: `work` items of stream `stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub stream: usize,
    pub work: u64,
}

/// An event of a [`HostBackend`]: what it recorded, and how far its
/// stream's work has got (the stream itself is not kept alive, as a CUDA
/// event does not keep its stream; its work still completes only on
/// [`HostStream::finish`] or a host wait).
pub struct HostEvent(Mutex<Option<(Recorded, Arc<AtomicU64>)>>);

static STREAM_IDS: AtomicUsize = AtomicUsize::new(1);

impl HostStream {
    /// A new stream with no work.
    pub fn new() -> HostStream {
        HostStream(Arc::new(StreamState {
            id: STREAM_IDS.fetch_add(1, Ordering::Relaxed),
            work: AtomicU64::new(0),
            done: Arc::new(AtomicU64::new(u64::MAX)),
            waits: Mutex::new(Vec::new()),
            capture: AtomicU64::new(0),
        }))
    }

    /// From now on, work enqueued on this stream is not done until
    /// [`finish`](Self::finish) (what was enqueued before is done).
    pub fn hold(&self) {
        self.0.done.store(self.work(), Ordering::Release);
    }

    /// Completes all the stream's work and ends a [`hold`](Self::hold).
    pub fn finish(&self) {
        self.0.done.store(u64::MAX, Ordering::Release);
    }

    pub fn id(&self) -> usize {
        self.0.id
    }

    /// From now on the stream counts as captured into a graph
    /// ([`Backend::is_capturing`]), until [`HostStream::end_capture`].
    pub fn begin_capture(&self) {
        static CAPTURES: AtomicU64 = AtomicU64::new(1);
        let id = CAPTURES.fetch_add(1, Ordering::Relaxed);
        self.0.capture.store(id, Ordering::Relaxed);
    }

    pub fn end_capture(&self) {
        self.0.capture.store(0, Ordering::Relaxed);
    }

    /// Enqueues one item of work (a kernel, say); returns how many items
    /// the stream has had, this one included.
    pub fn enqueue(&self) -> u64 {
        self.0.work.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Items of work enqueued so far.
    pub fn work(&self) -> u64 {
        self.0.work.load(Ordering::Acquire)
    }

    /// Every event this stream waited for, in order.
    pub fn waits(&self) -> Vec<Recorded> {
        lock(&self.0.waits).clone()
    }
}

impl Default for HostStream {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostBackend {
    /// A backend with `granularity`-byte mapping units and `capacity`
    /// bytes of physical memory.
    pub fn new(granularity: usize, capacity: usize) -> HostBackend {
        HostBackend {
            granularity: granularity.max(1),
            devices: 1,
            shares: true,
            contents: true,
            capacity,
            state: Mutex::new(State {
                next: BASE,
                ..State::default()
            }),
            physical: Arc::new(AtomicUsize::new(0)),
            counts: Mutex::new(HostCounts::default()),
            refused: Mutex::new(Vec::new()),
            unmap_hook: Mutex::new(None),
            refuse_unmaps: AtomicBool::new(false),
        }
    }

    /// The same backend on a machine of `devices` devices (at most 64):
    /// devices `1..devices` are peers that can be granted access to its
    /// memory.
    pub fn with_devices(mut self, devices: i32) -> HostBackend {
        self.devices = devices.clamp(1, 64);
        self
    }

    /// The same backend with memory that cannot be shared (as the CUDA
    /// driver's, unless created with a shareable handle).
    pub fn without_sharing(mut self) -> HostBackend {
        self.shares = false;
        self
    }

    /// The same backend keeping no contents: `create` takes no host
    /// memory, and reads and writes fail. For models of large pools
    /// (`cuheap snapshot --replay` replays traces of many GiB on it).
    pub fn without_contents(mut self) -> HostBackend {
        self.contents = false;
        self
    }

    /// Makes grants (`grants`) and revokes (`revokes`) of access on the
    /// mapping at `at` fail, as a driver that refuses them, until called
    /// again with `false`.
    pub fn refuse_access_at(&self, at: u64, grants: bool, revokes: bool) {
        let mut r = lock(&self.refused);
        r.retain(|&(a, _, _)| a != at);
        if grants || revokes {
            r.push((at, grants, revokes));
        }
    }

    /// Runs `hook(at, bytes)` at the start of every unmap, before the range
    /// goes: a test's way to act between an owner's decision to unmap and
    /// the unmap itself.
    pub fn on_unmap(&self, hook: impl Fn(u64, usize) + Send + Sync + 'static) {
        *lock(&self.unmap_hook) = Some(Arc::new(hook));
    }

    /// Makes every unmap fail, leaving its mapping in place, as a driver
    /// that refuses them, until called again with `false`.
    pub fn refuse_unmaps(&self, refuse: bool) {
        self.refuse_unmaps.store(refuse, Ordering::Relaxed);
    }

    pub fn counts(&self) -> HostCounts {
        *lock(&self.counts)
    }

    /// Physical bytes created and not yet released.
    pub fn physical(&self) -> usize {
        self.physical.load(Ordering::Relaxed)
    }

    /// Bytes mapped now.
    pub fn mapped(&self) -> usize {
        lock(&self.state).mapped.values().map(|m| m.bytes).sum()
    }

    /// Copies `data` to device address `at`; fails if any byte of the
    /// range is not mapped with access.
    pub fn write(&self, at: u64, data: &[u8]) -> Result<()> {
        self.write_as(0, at, data)
    }

    /// Copies from device address `at` into `out`; fails like
    /// [`HostBackend::write`].
    pub fn read(&self, at: u64, out: &mut [u8]) -> Result<()> {
        self.read_as(0, at, out)
    }

    /// [`HostBackend::write`] by a kernel on `device`: fails if any byte
    /// of the range is not mapped with access granted to `device`.
    pub fn write_as(&self, device: i32, at: u64, data: &[u8]) -> Result<()> {
        self.each_piece(device, at, data.len(), |mem, off, range| {
            mem[off..off + range.len()].copy_from_slice(&data[range]);
        })
    }

    /// [`HostBackend::read`] by a kernel on `device`; fails like
    /// [`HostBackend::write_as`].
    pub fn read_as(&self, device: i32, at: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        self.each_piece(device, at, len, |mem, off, range| {
            let n = range.len();
            out[range].copy_from_slice(&mem[off..off + n]);
        })
    }

    /// Calls `f(memory, offset in it, range of the caller's buffer)` for
    /// each mapping `at..at + len` crosses; nothing if any byte is not
    /// accessible to `device`.
    fn each_piece(
        &self,
        device: i32,
        at: u64,
        len: usize,
        mut f: impl FnMut(&mut [u8], usize, std::ops::Range<usize>),
    ) -> Result<()> {
        let fault = |a: u64| {
            Error::InvalidArgument(format!(
                "device {device}: access to unmapped device address {a:#x}"
            ))
        };
        let bit = 1u64.checked_shl(device as u32).filter(|_| device >= 0);
        if !self.contents {
            return Err(Error::InvalidArgument(
                "this backend keeps no contents (HostBackend::without_contents)".into(),
            ));
        }
        let state = lock(&self.state);
        let mut pieces = Vec::new();
        let mut done = 0usize;
        if at.checked_add(len as u64).is_none() {
            return Err(fault(at));
        }
        while done < len {
            let a = at + done as u64;
            let (start, m) = state
                .mapped
                .range(..=a)
                .next_back()
                .ok_or_else(|| fault(a))?;
            let off = (a - start) as usize;
            if off >= m.bytes || bit.is_none_or(|b| m.access & b == 0) {
                return Err(fault(a));
            }
            let n = (m.bytes - off).min(len - done);
            pieces.push((m.memory.clone(), off, done..done + n));
            done += n;
        }
        drop(state);
        for (mem, off, range) in pieces {
            f(&mut lock(&mem), off, range);
        }
        Ok(())
    }

    /// Changes the access bits of the mapping at `at`, which must be
    /// exactly `bytes` long (an error if a test refuses it: `grant` says
    /// which kind of change this is).
    fn access(&self, at: u64, bytes: usize, grant: bool, change: impl Fn(&mut u64)) -> Result<()> {
        let refused = lock(&self.refused)
            .iter()
            .any(|&(a, g, r)| a == at && if grant { g } else { r });
        let mut state = lock(&self.state);
        // Whole mappings, one after another from `at`, that end at
        // `at + bytes` (as the driver requires).
        let mut next = at;
        let end = at + bytes as u64;
        for (&start, m) in state.mapped.range(at..end) {
            if start != next {
                break;
            }
            next = start + m.bytes as u64;
        }
        if next != end || bytes == 0 {
            panic!("access change on {bytes} bytes at {at:#x}, which are not whole mappings");
        }
        if refused {
            return Err(Error::InvalidArgument(format!(
                "access change at {at:#x} refused (HostBackend::refuse_access_at)"
            )));
        }
        for (_, m) in state.mapped.range_mut(at..end) {
            change(&mut m.access);
        }
        Ok(())
    }

    fn count(&self, f: impl FnOnce(&mut HostCounts)) {
        f(&mut lock(&self.counts));
    }
}

impl Backend for HostBackend {
    type Stream = HostStream;
    type Event = HostEvent;
    type Memory = HostMemory;
    type Shared = HostShared;

    fn stream_id(stream: &HostStream) -> usize {
        stream.id()
    }

    fn is_last_handle(stream: &HostStream) -> bool {
        Arc::strong_count(&stream.0) == 1
    }

    fn granularity(&self) -> Result<usize> {
        Ok(self.granularity)
    }

    fn reserve(&self, bytes: usize, align: usize) -> Result<u64> {
        let mut s = lock(&self.state);
        let align = align.max(1) as u64;
        let base = s.next.div_ceil(align) * align;
        s.next = base + bytes as u64 + self.granularity as u64; // a gap between reservations
        s.reservations.insert(base, bytes);
        Ok(base)
    }

    unsafe fn unreserve(&self, base: u64, bytes: usize) {
        let mut s = lock(&self.state);
        assert_eq!(
            s.reservations.remove(&base),
            Some(bytes),
            "unreserve of a range that was not reserved"
        );
        assert!(
            s.mapped.range(base..base + bytes as u64).next().is_none(),
            "unreserve of a range with memory still mapped"
        );
    }

    fn create(&self, bytes: usize) -> Result<HostMemory> {
        let now = self.physical.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if now > self.capacity {
            self.physical.fetch_sub(bytes, Ordering::Relaxed);
            return Err(Error::OutOfMemory {
                requested: bytes,
                reserved: now - bytes,
                free: self.capacity.saturating_sub(now - bytes),
            });
        }
        Ok(HostMemory {
            bytes: Arc::new(Mutex::new(if self.contents {
                vec![POISON; bytes]
            } else {
                Vec::new()
            })),
            len: bytes,
            physical: self.physical.clone(),
            imported: false,
        })
    }

    unsafe fn map(&self, at: u64, bytes: usize, memory: &HostMemory) -> Result<()> {
        let mut s = lock(&self.state);
        let inside = s
            .reservations
            .range(..=at)
            .next_back()
            .is_some_and(|(b, n)| at + bytes as u64 <= b + *n as u64);
        let overlaps = s.mapped.range(..at + bytes as u64).next_back().is_some_and(
            |(b, m)| b + m.bytes as u64 > at, // a mapping ending after `at`
        );
        assert!(
            inside && !overlaps && memory.len == bytes,
            "map of {bytes} bytes at {at:#x}: outside a reservation, over a mapping or of the wrong size"
        );
        s.mapped.insert(
            at,
            Mapping {
                bytes,
                memory: memory.bytes.clone(),
                access: 0,
                imported: memory.imported,
            },
        );
        drop(s);
        self.count(|c| c.maps += 1);
        Ok(())
    }

    fn device(&self) -> i32 {
        0
    }

    fn check_peer(&self, peer: i32) -> Result<()> {
        if (0..self.devices).contains(&peer) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "device {peer} does not exist (the driver sees {})",
                self.devices
            )))
        }
    }

    unsafe fn set_access(&self, at: u64, bytes: usize, peers: &[i32]) -> Result<()> {
        for &p in peers {
            assert!(self.check_peer(p).is_ok(), "set_access for device {p}");
        }
        let bits = peers.iter().fold(1u64, |a, &p| a | 1 << p);
        self.access(at, bytes, true, |a| *a |= bits)
    }

    unsafe fn revoke_access(&self, at: u64, bytes: usize, peer: i32) -> Result<()> {
        assert!(
            peer != 0 && self.check_peer(peer).is_ok(),
            "revoke_access for device {peer}"
        );
        self.access(at, bytes, false, |a| *a &= !(1u64 << peer))
    }

    unsafe fn unmap(&self, at: u64, bytes: usize) -> Result<()> {
        let hook = lock(&self.unmap_hook).clone();
        if let Some(hook) = hook {
            hook(at, bytes);
        }
        let mut state = lock(&self.state);
        let whole = state.mapped.get(&at).is_some_and(|m| m.bytes == bytes);
        if whole && self.refuse_unmaps.load(Ordering::Relaxed) {
            return Err(Error::InvalidArgument(format!(
                "unmap of {bytes} bytes at {at:#x} refused (HostBackend::refuse_unmaps)"
            )));
        }
        let m = state.mapped.remove(&at);
        drop(state);
        match m {
            Some(m) if m.bytes == bytes => {
                if !m.imported {
                    lock(&m.memory).fill(POISON);
                }
                self.count(|c| c.unmaps += 1);
                Ok(())
            }
            _ => panic!("unmap of {bytes} bytes at {at:#x}, which is not one mapping"),
        }
    }

    unsafe fn copy_to_device(&self, dst: u64, src: &[u8], stream: &HostStream) -> Result<()> {
        stream.enqueue();
        self.write(dst, src)
    }

    unsafe fn copy_from_device(&self, dst: &mut [u8], src: u64, stream: &HostStream) -> Result<()> {
        stream.enqueue();
        self.read(src, dst)
    }

    fn shares(&self) -> bool {
        self.shares
    }

    fn share(&self, memory: &HostMemory) -> Result<HostShared> {
        if !self.shares {
            return Err(Error::InvalidArgument(
                "this memory was created without a shareable handle".into(),
            ));
        }
        Ok(HostShared {
            bytes: memory.bytes.clone(),
            len: memory.len,
        })
    }

    fn import(&self, shared: &HostShared, bytes: usize) -> Result<HostMemory> {
        if bytes != shared.len {
            return Err(Error::InvalidArgument(format!(
                "import of {bytes} bytes from shared memory of {}",
                shared.len
            )));
        }
        self.physical.fetch_add(bytes, Ordering::Relaxed);
        Ok(HostMemory {
            bytes: shared.bytes.clone(),
            len: bytes,
            physical: self.physical.clone(),
            imported: true,
        })
    }

    fn is_capturing(&self, stream: &HostStream) -> Result<bool> {
        Ok(self.capture_id(stream)?.is_some())
    }

    fn capture_id(&self, stream: &HostStream) -> Result<Option<u64>> {
        Ok(Some(stream.0.capture.load(Ordering::Relaxed)).filter(|&id| id != 0))
    }

    fn free_memory(&self) -> usize {
        self.capacity.saturating_sub(self.physical())
    }

    fn new_event(&self) -> Result<HostEvent> {
        Ok(HostEvent(Mutex::new(None)))
    }

    fn record(&self, event: &HostEvent, stream: &HostStream) -> Result<()> {
        let recorded = Recorded {
            stream: stream.id(),
            work: stream.work(),
        };
        *lock(&event.0) = Some((recorded, stream.0.done.clone()));
        self.count(|c| c.records += 1);
        Ok(())
    }

    fn wait(&self, stream: &HostStream, event: &HostEvent) -> Result<()> {
        if let Some((r, _)) = &*lock(&event.0) {
            lock(&stream.0.waits).push(*r);
        }
        self.count(|c| c.waits += 1);
        Ok(())
    }

    fn synchronize(&self, event: &HostEvent) -> Result<()> {
        if let Some((r, done)) = &*lock(&event.0) {
            // The host waited: the recorded work is done.
            let _ = done.fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| Some(d.max(r.work)));
        }
        self.count(|c| c.event_syncs += 1);
        Ok(())
    }

    fn query(&self, event: &HostEvent) -> Result<bool> {
        self.count(|c| c.queries += 1);
        Ok(lock(&event.0)
            .as_ref()
            .is_none_or(|(r, done)| r.work <= done.load(Ordering::Acquire)))
    }

    fn synchronize_device(&self) -> Result<()> {
        self.count(|c| c.device_syncs += 1);
        Ok(())
    }
}
