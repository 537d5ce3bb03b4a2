//! A graph's pool that lives as long as its graph: [`Pool::tie_to_graph`]
//! gives the graph a reference to the pool (a CUDA user object), so the
//! pool's memory goes back once the graph, the executable graphs
//! instantiated from it afterwards, and their launches are gone.
//!
//! The driver calls a user object's destructor where no CUDA call may be
//! made (on a thread of its own, or inside the call that destroyed the
//! graph); dropping a pool makes several (it waits for the device and
//! unmaps). The destructor therefore hands the pool to a thread of
//! cuheap's ([`reaper`]), which drops it. That thread's capture mode is
//! relaxed, so its calls do not disturb another thread's capture.

use super::Pool;
use crate::driver::CudaBackend;
use crate::error::{Context, Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

type Parcel = Box<dyn Send>;

/// The thread that drops what user objects' destructors hand it; `None`
/// if it could not be started.
fn reaper() -> Option<&'static Mutex<Sender<Parcel>>> {
    static REAPER: OnceLock<Option<Mutex<Sender<Parcel>>>> = OnceLock::new();
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Parcel>();
            std::thread::Builder::new()
                .name("cuheap-reaper".into())
                .spawn(move || {
                    // Relaxed: dropping a pool (a context synchronisation,
                    // unmapping) while another thread captures a graph in
                    // the default global mode would break that capture.
                    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
                    // SAFETY: an out-and-in parameter for this thread's mode.
                    let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
                    for parcel in rx {
                        // A drop that panics must not end the reaper.
                        let _ =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(parcel)));
                    }
                })
                .ok()
                .map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// Hands `parcel` to the reaper; leaks it if there is none (never drops
/// it here: the caller may be a driver callback).
fn reap(parcel: Parcel) {
    match reaper() {
        Some(r) => {
            if let Err(e) = r.lock().unwrap_or_else(|p| p.into_inner()).send(parcel) {
                std::mem::forget(e.0);
            }
        }
        None => std::mem::forget(parcel),
    }
}

/// The user object's destructor: the pool's reference goes to the reaper.
unsafe extern "C" fn release_pool(ptr: *mut c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the `Box<Arc<Pool>>` `tie_to_graph` leaked for this
        // object, whose destructor the driver calls once.
        let pool = unsafe { Box::from_raw(ptr as *mut Arc<Pool<CudaBackend>>) };
        reap(pool);
    });
}

impl Pool<CudaBackend> {
    /// Ties a graph's pool ([`PoolConfig::for_graph`]) to `graph`, after
    /// its capture: the pool is sealed ([`Pool::seal`]) and the graph
    /// holds a reference to it (a CUDA user object, moved into the
    /// graph), which every executable graph instantiated from it
    /// afterwards takes too. The pool and its memory stay while any of
    /// them or their launches remain, and go back once all are destroyed
    /// and done, on a thread of cuheap's (or on yours, if your handle is
    /// the last to go). Drop your own handles whenever you like. A pool
    /// that is not a graph's, or a null graph, is an
    /// [`Error::InvalidArgument`]; the driver refusing the user object is
    /// its [`Error::Driver`] (nothing is tied then).
    ///
    /// # Safety
    ///
    /// `graph` is a live graph (`CUgraph`) of the pool's context that no
    /// other thread uses during the call. Executable graphs instantiated
    /// from it *before* the call, or updated later from a graph not tied
    /// to this pool, hold no reference: they must not be launched once
    /// the pool is gone (tie before instantiating).
    ///
    /// [`PoolConfig::for_graph`]: super::PoolConfig::for_graph
    pub unsafe fn tie_to_graph(self: &Arc<Self>, graph: sys::CUgraph) -> Result<()> {
        if graph.is_null() {
            return Err(Error::InvalidArgument(
                "tie_to_graph of a null graph".into(),
            ));
        }
        // Refuses a pool that is not a graph's.
        self.seal()?;
        if reaper().is_none() {
            return Err(Error::InvalidArgument(
                "tie_to_graph: no thread could be started to release the pool".into(),
            ));
        }
        crate::driver::bind(self.context())?;
        let parcel = Box::into_raw(Box::new(Arc::clone(self)));
        let mut object: sys::CUuserObject = std::ptr::null_mut();
        // SAFETY: `parcel` stays valid until the destructor takes it back;
        // the destructor makes no CUDA call.
        let made = unsafe {
            sys::cuUserObjectCreate(
                &mut object,
                parcel as *mut c_void,
                Some(release_pool),
                1,
                sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
            )
        }
        .result()
        .during("cuUserObjectCreate");
        if let Err(e) = made {
            // SAFETY: not handed to the driver: still ours.
            drop(unsafe { Box::from_raw(parcel) });
            return Err(e);
        }
        // SAFETY: a live graph (the caller's promise) and the object just
        // made; the graph takes our one reference.
        let moved = unsafe {
            sys::cuGraphRetainUserObject(
                graph,
                object,
                1,
                sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32,
            )
        }
        .result()
        .during("cuGraphRetainUserObject");
        if let Err(e) = moved {
            // SAFETY: our reference, not moved: releasing it runs the
            // destructor, which hands the pool's reference to the reaper.
            let _ = unsafe { sys::cuUserObjectRelease(object, 1) };
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn the_reaper_drops_what_it_is_handed_on_its_own_thread() {
        let dropped = Arc::new(AtomicBool::new(false));
        reap(Box::new(Flag(dropped.clone())));
        let start = std::time::Instant::now();
        while !dropped.load(Ordering::Acquire) {
            assert!(start.elapsed().as_secs() < 10, "never dropped");
            std::thread::yield_now();
        }
    }
}
