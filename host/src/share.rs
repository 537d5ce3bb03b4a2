//! Pool memory in other processes.
//!
//! A pool made with [`PoolConfig::shareable`](crate::PoolConfig) creates
//! its memory with a shareable handle (on the CUDA driver, a POSIX file
//! descriptor from `cuMemExportToShareableHandle`).
//! [`Pool::export_block`](crate::Pool::export_block) and
//! [`Pool::export_mapped`](crate::Pool::export_mapped) give an
//! [`Exported`]: the handles of the mappings under a block, or under all
//! the pool has mapped, and where the shared bytes start in them.
//! [`Exported::send`] passes it to another process over a Unix socket
//! (the descriptors as `SCM_RIGHTS`), [`Exported::receive`] takes it
//! there, and [`Imported::map`] maps it into that process's address
//! space, where kernels read and write it as the exporter's kernels do.
//!
//! The driver maps shared memory only whole, so the importer can reach
//! the whole of each mapping under the block (a pool maps 2 MiB chunks
//! by default), as with `cudaIpcGetMemHandle`. The exporter keeps the
//! block allocated while the importer uses it: the pool does not know of
//! other processes, and a freed block is reused (so is trimmed memory of
//! a pool in a shared [`Reservation`](crate::Reservation), which banks it
//! for the next to grow). An import holds the memory itself, so the
//! exporter's exit or a trim that releases the memory does not pull it
//! from under the importer. Work in the two processes orders itself as
//! the program decides (e.g. by messages on the socket after
//! synchronising). Each mapping is one descriptor while exported: a
//! large pool in small chunks can reach the process's descriptor limit.

use crate::backend::Backend;
use crate::driver::CudaBackend;
use crate::error::{Error, Result};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Memory of a pool made ready for another process: the handles of whole
/// mappings, in address order, and the shared bytes' place in them.
pub struct Exported<B: Backend = CudaBackend> {
    /// Each mapping's length and handle.
    pieces: Vec<(usize, B::Shared)>,
    /// Where the shared bytes start, from the first mapping's start.
    offset: usize,
    len: usize,
}

impl<B: Backend> Exported<B> {
    /// `len` bytes at `offset` in mappings laid end to end, given as
    /// each one's length and handle: for programs that pass the handles
    /// their own way ([`Exported::handles`] gives them). A range not
    /// inside the mappings is an error.
    pub fn from_handles(
        pieces: Vec<(usize, B::Shared)>,
        offset: usize,
        len: usize,
    ) -> Result<Self> {
        let mapped = pieces
            .iter()
            .try_fold(0usize, |a, &(l, _)| a.checked_add(l));
        match (mapped, offset.checked_add(len)) {
            (Some(mapped), Some(end)) if len > 0 && end <= mapped => Ok(Exported {
                pieces,
                offset,
                len,
            }),
            _ => Err(Error::InvalidArgument(format!(
                "shared memory of {len} bytes at offset {offset} does not lie inside its {} mappings",
                pieces.len()
            ))),
        }
    }

    /// Bytes shared (the block's size, or what the pool had mapped).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the shared bytes start in the mappings laid end to end.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of the mappings: what an importer maps.
    pub fn mapped(&self) -> usize {
        self.pieces.iter().map(|&(l, _)| l).sum()
    }

    /// Mappings (one handle each).
    pub fn mappings(&self) -> usize {
        self.pieces.len()
    }

    /// Each mapping's length and handle, in address order.
    pub fn handles(&self) -> &[(usize, B::Shared)] {
        &self.pieces
    }

    /// The handles, to pass another way ([`Exported::from_handles`]
    /// takes them back).
    pub fn into_handles(self) -> Vec<(usize, B::Shared)> {
        self.pieces
    }
}

/// Shared memory mapped in this process: `ptr()..ptr() + len()` is what
/// the exporter shared. Unmapped on drop, after the device's work.
pub struct Imported<B: Backend = CudaBackend> {
    backend: B,
    base: u64,
    reserved: usize,
    /// Mapped pieces: address, length, memory.
    mapped: Vec<(u64, usize, B::Memory)>,
    ptr: u64,
    len: usize,
}

impl<B: Backend> Imported<B> {
    /// Reserves address space for `exported`'s mappings, imports and maps
    /// each, and grants this backend's device read and write access
    /// (memory of another device needs a peer path to this one, else the
    /// driver refuses). Nothing stays mapped on error.
    pub fn map(backend: B, exported: &Exported<B>) -> Result<Imported<B>> {
        let reserved = exported.mapped();
        let align = backend.granularity()?.max(1);
        if let Some(&(len, _)) = exported.pieces.iter().find(|p| !p.0.is_multiple_of(align)) {
            return Err(Error::InvalidArgument(format!(
                "a shared mapping of {len} bytes is not whole {align}-byte granules of this device"
            )));
        }
        let base = backend.reserve(reserved, align)?;
        let mut me = Imported {
            backend,
            base,
            reserved,
            mapped: Vec::with_capacity(exported.pieces.len()),
            ptr: base + exported.offset as u64,
            len: exported.len,
        };
        let mut at = base;
        for (len, shared) in &exported.pieces {
            let memory = me.backend.import(shared, *len)?;
            // SAFETY: `at..at + len` lies in the reservation, past every
            // piece mapped before.
            unsafe { me.backend.map(at, *len, &memory) }?;
            me.mapped.push((at, *len, memory));
            // SAFETY: just mapped.
            unsafe { me.backend.set_access(at, *len, &[]) }?;
            at += *len as u64;
        }
        Ok(me)
    }

    /// The first shared byte in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes shared from [`Imported::ptr`].
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> Imported<B> {
    /// Waits for the device's work, unmaps the memory and returns the
    /// backend. On error (a failed wait, which it reports after
    /// unmapping anyway, or a failed unmap: that memory stays mapped and
    /// its range reserved) the first error comes back and the backend is
    /// dropped. Dropping an import does the same and drops the errors.
    pub fn close(mut self) -> Result<B> {
        self.unmap()?;
        // SAFETY: `backend` is read out once; `self` is forgotten at once
        // so neither it nor its fields drop again (`mapped` is empty).
        let backend = unsafe { std::ptr::read(&self.backend) };
        let mapped = std::mem::take(&mut self.mapped);
        std::mem::forget(self);
        drop(mapped);
        Ok(backend)
    }

    fn unmap(&mut self) -> Result<()> {
        // Work still queued may use the memory: wait for the device.
        let mut first = self.backend.synchronize_device().err();
        let mut all = true;
        for (at, len, memory) in self.mapped.drain(..) {
            // SAFETY: mapped by `map`; nothing runs on the device any more.
            if let Err(e) = unsafe { self.backend.unmap(at, len) } {
                first.get_or_insert(e);
                all = false;
                std::mem::forget(memory); // still mapped: never released
            }
        }
        if all && self.reserved > 0 {
            // SAFETY: reserved by `map`, nothing mapped in it any more.
            unsafe { self.backend.unreserve(self.base, self.reserved) };
        }
        // Unreserved, or kept for ever around what is still mapped.
        self.reserved = 0;
        first.map_or(Ok(()), Err)
    }
}

impl<B: Backend> Drop for Imported<B> {
    fn drop(&mut self) {
        // Errors cannot leave drop.
        let _ = self.unmap();
    }
}

/// Starts what [`Exported::send`] writes.
const MAGIC: &[u8; 8] = b"cuheapX1";
/// Handles sent in one message, at most.
const BATCH: usize = 64;
/// A batch: a count and `BATCH` lengths, little-endian `u64`s.
const FRAME: usize = 8 * (1 + BATCH);
/// Mappings a received export may have, at most (a guard against a
/// corrupt header).
const MAX_MAPPINGS: u64 = 1 << 20;

fn io(what: &'static str) -> impl Fn(rustix::io::Errno) -> Error {
    move |e| {
        let why = match e {
            rustix::io::Errno::AGAIN => "timed out (or the socket is non-blocking)".to_string(),
            e => std::io::Error::from(e).to_string(),
        };
        Error::InvalidArgument(format!("{what}: {why}"))
    }
}

/// Repeats a socket call a signal interrupted.
fn retry<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    loop {
        match call() {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// Sends all of `bytes`; a peer that is gone is an error, not SIGPIPE.
fn send_all(socket: &UnixStream, mut bytes: &[u8]) -> Result<()> {
    while !bytes.is_empty() {
        let n = retry(|| rustix::net::send(socket, bytes, SendFlags::NOSIGNAL))
            .map_err(io("sending an export"))?;
        bytes = &bytes[n..];
    }
    Ok(())
}

/// Fills `buf` from the socket.
fn recv_all(socket: &UnixStream, buf: &mut [u8]) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let (n, _) = retry(|| rustix::net::recv(socket, &mut buf[done..], RecvFlags::empty()))
            .map_err(io("receiving an export"))?;
        if n == 0 {
            return Err(closed());
        }
        done += n;
    }
    Ok(())
}

fn closed() -> Error {
    Error::InvalidArgument("receiving an export: the sender closed the socket early".into())
}

impl<B: Backend<Shared = OwnedFd>> Exported<B> {
    /// Sends the export to the process at the other end of `socket`, a
    /// blocking Unix stream socket: a header, then the handles
    /// (`SCM_RIGHTS`, up to 64 a message) with their lengths. The
    /// descriptors stay open here too: dropping the export closes them.
    /// A peer that went away is an error (never `SIGPIPE`).
    pub fn send(&self, socket: &UnixStream) -> Result<()> {
        let mut header = Vec::with_capacity(32);
        header.extend_from_slice(MAGIC);
        for v in [self.pieces.len(), self.offset, self.len] {
            header.extend_from_slice(&(v as u64).to_le_bytes());
        }
        send_all(socket, &header)?;
        for batch in self.pieces.chunks(BATCH) {
            let mut frame = [0u8; FRAME];
            frame[..8].copy_from_slice(&(batch.len() as u64).to_le_bytes());
            for (i, (len, _)) in batch.iter().enumerate() {
                frame[8 * (i + 1)..8 * (i + 2)].copy_from_slice(&(*len as u64).to_le_bytes());
            }
            let fds: Vec<_> = batch.iter().map(|(_, fd)| fd.as_fd()).collect();
            let sent = retry(|| {
                let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(BATCH))];
                let mut control = SendAncillaryBuffer::new(&mut space);
                if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                    return Err(rustix::io::Errno::NOBUFS);
                }
                rustix::net::sendmsg(
                    socket,
                    &[IoSlice::new(&frame)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                )
            })
            .map_err(io("sending shared handles"))?;
            // The descriptors went with the first byte; the rest is data.
            send_all(socket, &frame[sent..])?;
        }
        Ok(())
    }

    /// Receives what [`Exported::send`] sent from the other end of
    /// `socket`, a blocking Unix stream socket (set a read timeout on it
    /// to bound the wait for a peer that stalls). A stream that ends
    /// early or is not an export, and handles that do not arrive (e.g.
    /// this process is at its descriptor limit), are errors that say so.
    pub fn receive(socket: &UnixStream) -> Result<Exported<B>> {
        let mut header = [0u8; 32];
        recv_all(socket, &mut header)?;
        if &header[..8] != MAGIC {
            return Err(Error::InvalidArgument(
                "receiving an export: the stream does not start with one".into(),
            ));
        }
        let word = |b: &[u8], i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
        let (count, offset, len) = (word(&header, 1), word(&header, 2), word(&header, 3));
        if count == 0 || count > MAX_MAPPINGS {
            return Err(Error::InvalidArgument(format!(
                "receiving an export: {count} mappings"
            )));
        }
        let mut pieces = Vec::with_capacity((count as usize).min(BATCH));
        while pieces.len() < count as usize {
            let mut frame = [0u8; FRAME];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(BATCH))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let got = retry(|| {
                rustix::net::recvmsg(
                    socket,
                    &mut [IoSliceMut::new(&mut frame)],
                    &mut control,
                    RecvFlags::CMSG_CLOEXEC,
                )
            })
            .map_err(io("receiving shared handles"))?;
            let mut fds = Vec::new();
            for message in control.drain() {
                if let RecvAncillaryMessage::ScmRights(r) = message {
                    fds.extend(r);
                }
            }
            if got.flags.contains(ReturnFlags::CTRUNC) {
                return Err(Error::InvalidArgument(
                    "receiving an export: handles were cut off (is this process at its \
                     descriptor limit?)"
                        .into(),
                ));
            }
            if got.bytes == 0 {
                return Err(closed());
            }
            recv_all(socket, &mut frame[got.bytes..])?;
            let n = word(&frame, 0) as usize;
            let left = count as usize - pieces.len();
            if n == 0 || n > BATCH || n > left || fds.len() != n {
                return Err(Error::InvalidArgument(format!(
                    "receiving an export: a batch of {n} lengths came with {} handles",
                    fds.len()
                )));
            }
            for (i, fd) in fds.into_iter().enumerate() {
                pieces.push((word(&frame, i + 1) as usize, fd));
            }
        }
        Exported::from_handles(pieces, offset as usize, len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    /// `n` files of 1..=n bytes as the handles of an export, sent over a
    /// socket pair: each arrives, in order, with its length.
    fn round_trip(n: usize) {
        let dir = std::env::temp_dir().join(format!("cuheap-share-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pieces: Vec<(usize, OwnedFd)> = (0..n)
            .map(|i| {
                let f = File::create(dir.join(i.to_string())).unwrap();
                f.set_len(i as u64 + 1).unwrap();
                ((i + 1) << 21, OwnedFd::from(f))
            })
            .collect();
        let total: usize = pieces.iter().map(|p| p.0).sum();
        let e = Exported::<CudaBackend>::from_handles(pieces, 4096, total - 8192).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let sender = std::thread::spawn(move || e.send(&a).map(|()| e.mappings()));
        let got = Exported::<CudaBackend>::receive(&b).unwrap();
        assert_eq!(sender.join().unwrap().unwrap(), n);
        assert_eq!(
            (got.offset(), got.len(), got.mappings()),
            (4096, total - 8192, n)
        );
        for (i, (len, fd)) in got.pieces.into_iter().enumerate() {
            assert_eq!(len, (i + 1) << 21);
            let f = File::from(fd);
            assert_eq!(f.metadata().unwrap().len(), i as u64 + 1, "handle {i}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn handles_cross_a_socket_in_order() {
        round_trip(1);
        round_trip(BATCH);
        round_trip(2 * BATCH + 22);
    }

    #[test]
    fn a_stream_that_is_not_an_export_is_refused() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&[7u8; 64]).unwrap();
        let e = Exported::<CudaBackend>::receive(&b).err().unwrap();
        assert!(e.to_string().contains("does not start"), "{e}");

        // A header, then the sender goes away.
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut header = MAGIC.to_vec();
        for v in [3u64, 0, 4096] {
            header.extend_from_slice(&v.to_le_bytes());
        }
        a.write_all(&header).unwrap();
        drop(a);
        let e = Exported::<CudaBackend>::receive(&b).err().unwrap();
        assert!(e.to_string().contains("closed the socket early"), "{e}");

        // A batch without its handles.
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut stream = header.clone();
        let mut frame = [0u8; FRAME];
        frame[..8].copy_from_slice(&3u64.to_le_bytes());
        stream.extend_from_slice(&frame);
        a.write_all(&stream).unwrap();
        let e = Exported::<CudaBackend>::receive(&b).err().unwrap();
        assert!(e.to_string().contains("came with 0 handles"), "{e}");

        // Lengths that do not hold the shared range.
        assert!(Exported::<CudaBackend>::from_handles(Vec::new(), 0, 1).is_err());
    }
}
