//! Where a benchmark's host threads spend their time, without a profiler:
//! while a [`Sampler`] runs, the kernel's profiling timer (`ITIMER_PROF`,
//! which counts the CPU time of every thread of the process) interrupts
//! whichever thread is running, and the signal handler keeps the
//! interrupted instruction's address. [`Sampler::finish`] writes the
//! addresses by count, with the process's memory map, to a file; names
//! come later from the unstripped builds of the same code
//! (`scripts/symbolize.py`).
//!
//! Linux on x86-64 only (elsewhere [`Sampler::start`] says so).

use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Samples kept per run (8 MiB of addresses).
const CAPACITY: usize = 1 << 20;

static ADDRESSES: [AtomicU64; CAPACITY] = [const { AtomicU64::new(0) }; CAPACITY];
static TAKEN: AtomicUsize = AtomicUsize::new(0);
static RUNNING: AtomicBool = AtomicBool::new(false);

/// A running sampler (one per process at a time). Dropped without
/// [`Sampler::finish`] (a panic on the way), it stops the timer.
pub struct Sampler {
    hz: u32,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        let _ = set_timer(0);
        RUNNING.store(false, Ordering::Release);
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
extern "C" fn on_sample(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Async-signal-safe: two atomics and a read of the interrupted context.
    // SAFETY: the kernel passes the interrupted thread's ucontext_t.
    let ip =
        unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] };
    let i = TAKEN.fetch_add(1, Ordering::Relaxed);
    if i < CAPACITY {
        ADDRESSES[i].store(ip as u64, Ordering::Relaxed);
    }
}

/// Sets the profiling timer to `hz` interrupts per CPU second (0 stops it).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn set_timer(hz: u32) -> Result<()> {
    let usec = 1_000_000u32.checked_div(hz).map_or(0, |u| u.max(1)) as libc::suseconds_t;
    let t = libc::timeval {
        tv_sec: 0,
        tv_usec: usec,
    };
    let it = libc::itimerval {
        it_interval: t,
        it_value: t,
    };
    // SAFETY: a valid itimerval; the old value is not wanted.
    if unsafe { libc::setitimer(libc::ITIMER_PROF, &it, std::ptr::null_mut()) } != 0 {
        return Err(Error::InvalidArgument(format!(
            "setitimer: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

impl Sampler {
    /// Starts sampling at `hz` per CPU second.
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    pub fn start(hz: u32) -> Result<Sampler> {
        if RUNNING.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidArgument(
                "a sampler is already running".into(),
            ));
        }
        TAKEN.store(0, Ordering::Relaxed);
        // SAFETY: an all-zero sigaction is valid; the handler is
        // async-signal-safe and lives as long as the program.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            on_sample;
        act.sa_sigaction = handler as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // SAFETY: a valid sigaction for SIGPROF.
        if unsafe { libc::sigaction(libc::SIGPROF, &act, std::ptr::null_mut()) } != 0 {
            RUNNING.store(false, Ordering::Release);
            return Err(Error::InvalidArgument(format!(
                "sigaction: {}",
                std::io::Error::last_os_error()
            )));
        }
        if let Err(e) = set_timer(hz) {
            RUNNING.store(false, Ordering::Release);
            return Err(e);
        }
        Ok(Sampler { hz })
    }

    /// Elsewhere than Linux on x86-64: an error.
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    pub fn start(_hz: u32) -> Result<Sampler> {
        Err(Error::InvalidArgument(
            "the sampler needs Linux on x86-64".into(),
        ))
    }

    /// Stops sampling and writes `label`, the samples by address (most
    /// frequent first) and `/proc/self/maps` to `path`.
    /// The samples are read before another sampler may start (which
    /// dropping `self` at the end allows).
    pub fn finish(self, path: &Path, label: &str) -> Result<()> {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        set_timer(0)?;
        let n = TAKEN.load(Ordering::Relaxed).min(CAPACITY);
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for a in &ADDRESSES[..n] {
            *counts.entry(a.load(Ordering::Relaxed)).or_default() += 1;
        }
        let mut by_count: Vec<(u64, u64)> = counts.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut out = format!(
            "# {label}\n# {n} samples at {} per CPU second (ITIMER_PROF)\n## samples\n",
            self.hz
        );
        for (addr, count) in by_count {
            out += &format!("{addr:#x} {count}\n");
        }
        out += "## maps\n";
        out += &std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        std::fs::write(path, out)
            .map_err(|e| Error::InvalidArgument(format!("writing {}: {e}", path.display())))
    }
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// A busy loop is sampled, and the file holds the samples and the map.
    #[test]
    fn a_busy_thread_is_sampled() {
        let s = Sampler::start(1000).unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        // Until 20 samples came, or 20 s (then the assertion says so).
        while TAKEN.load(Ordering::Relaxed) < 20 && t.elapsed().as_secs() < 20 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let path = std::env::temp_dir().join(format!("cuheap-sampler-{}.txt", std::process::id()));
        s.finish(&path, "busy loop").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let n: usize = text
            .lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert!(n >= 20, "{n} samples of a busy loop");
        assert!(
            text.contains("## maps\n") && text.contains("r-xp"),
            "{text}"
        );
    }
}
