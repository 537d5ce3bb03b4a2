//! The one place atomics come from, with their scope:
//!
//! - host (x86_64): `core::sync::atomic`;
//! - GPU (nvptx64): [`gpu`]'s atomics, the same API and layout, in inline
//!   PTX with **`.gpu` scope**. `core`'s atomics lower to `.sys` scope on
//!   nvptx64 (coherent with the CPU and peer GPUs), which is slower and
//!   more than a device heap needs: its memory is touched by one GPU;
//!   (`CUHEAP_ATOMIC_SCOPE=sys` at build time selects `core`'s atomics on
//!   the GPU too, to compare; with LLVM 22 their read-modify-writes other
//!   than compare-exchange lose their orderings, plain `atom` with no
//!   fence, so that build is unsound and only shows what the orderings
//!   cost);
//! - under `cfg(loom)`: loom's atomics, so the lock-free structures are
//!   model-checked.
//!
//! Call sites always spell the ordering out; the protocol comments on each
//! structure say why that ordering is enough.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(all(not(loom), any(not(target_arch = "nvptx64"), cuheap_sys_atomics)))]
pub use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(all(not(loom), target_arch = "nvptx64", not(cuheap_sys_atomics)))]
pub use gpu::{AtomicU32, AtomicU64, Ordering};

/// Adds `v` to a counter whose old value nobody needs (relaxed): on the
/// GPU a `red` (the warp does not wait for the answer), elsewhere a
/// `fetch_add`.
#[inline(always)]
pub fn add_relaxed(c: &AtomicU64, v: u64) {
    #[cfg(all(not(loom), target_arch = "nvptx64", not(cuheap_sys_atomics)))]
    c.reduce_add(v);
    #[cfg(not(all(not(loom), target_arch = "nvptx64", not(cuheap_sys_atomics))))]
    c.fetch_add(v, Ordering::Relaxed);
}

/// An acquire fence: the relaxed loads before it synchronise with the
/// release writes they read (on the GPU `fence.acq_rel.gpu`, which PTX
/// offers for acquire; under loom, loom's fence).
#[inline(always)]
pub fn acquire_fence() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::Acquire);
    #[cfg(all(not(loom), target_arch = "nvptx64", not(cuheap_sys_atomics)))]
    // SAFETY: a fence reads and writes no memory of its own.
    unsafe {
        core::arch::asm!("fence.acq_rel.gpu;")
    };
    #[cfg(all(not(loom), any(not(target_arch = "nvptx64"), cuheap_sys_atomics)))]
    core::sync::atomic::fence(Ordering::Acquire);
}

/// Spin-loop hint for retry loops (a no-op on the GPU; yields under loom).
#[inline(always)]
pub fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// GPU-scoped atomics (`ld`/`st`/`atom` with `.gpu` scope and PTX memory
/// orderings, sm_70 and newer). `#[repr(transparent)]` over the integer,
/// like `core`'s atomics, so host and device agree on every layout.
#[cfg(all(not(loom), target_arch = "nvptx64", not(cuheap_sys_atomics)))]
pub mod gpu {
    use core::arch::asm;
    use core::cell::UnsafeCell;
    pub use core::sync::atomic::Ordering;

    /// One read-modify-write with the PTX semantics for `$o`.
    macro_rules! rmw {
        ($o:expr, $op:literal, $ty:literal, $reg:ident, $p:expr, $v:expr) => {{
            let out;
            // SAFETY: `$p` points to a live, aligned atomic cell; `atom`
            // has no other effect than its read-modify-write.
            unsafe {
                match $o {
                    Ordering::Relaxed => asm!(concat!("atom.relaxed.gpu.", $op, ".", $ty, " {d}, [{p}], {v};"), d = out($reg) out, p = in(reg64) $p, v = in($reg) $v),
                    Ordering::Acquire => asm!(concat!("atom.acquire.gpu.", $op, ".", $ty, " {d}, [{p}], {v};"), d = out($reg) out, p = in(reg64) $p, v = in($reg) $v),
                    Ordering::Release => asm!(concat!("atom.release.gpu.", $op, ".", $ty, " {d}, [{p}], {v};"), d = out($reg) out, p = in(reg64) $p, v = in($reg) $v),
                    Ordering::AcqRel => asm!(concat!("atom.acq_rel.gpu.", $op, ".", $ty, " {d}, [{p}], {v};"), d = out($reg) out, p = in(reg64) $p, v = in($reg) $v),
                    _ => asm!(concat!("fence.sc.gpu;\n\tatom.acq_rel.gpu.", $op, ".", $ty, " {d}, [{p}], {v};"), d = out($reg) out, p = in(reg64) $p, v = in($reg) $v),
                }
            }
            out
        }};
    }

    macro_rules! gpu_atomic {
        ($name:ident, $t:ty, $reg:ident, $u:literal, $b:literal) => {
            #[repr(transparent)]
            pub struct $name(UnsafeCell<$t>);

            // SAFETY: every access goes through an atomic PTX instruction.
            unsafe impl Sync for $name {}

            impl $name {
                pub const fn new(v: $t) -> Self {
                    Self(UnsafeCell::new(v))
                }

                #[inline(always)]
                pub fn load(&self, o: Ordering) -> $t {
                    let p = self.0.get();
                    let v;
                    // SAFETY: `p` is this cell; a load has no other effect.
                    unsafe {
                        match o {
                            Ordering::Relaxed => asm!(concat!("ld.relaxed.gpu.", $u, " {v}, [{p}];"), v = out($reg) v, p = in(reg64) p),
                            Ordering::SeqCst => asm!(concat!("fence.sc.gpu;\n\tld.acquire.gpu.", $u, " {v}, [{p}];"), v = out($reg) v, p = in(reg64) p),
                            _ => asm!(concat!("ld.acquire.gpu.", $u, " {v}, [{p}];"), v = out($reg) v, p = in(reg64) p),
                        }
                    }
                    v
                }

                #[inline(always)]
                pub fn store(&self, v: $t, o: Ordering) {
                    let p = self.0.get();
                    // SAFETY: `p` is this cell; a store has no other effect.
                    unsafe {
                        match o {
                            Ordering::Relaxed => asm!(concat!("st.relaxed.gpu.", $u, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p),
                            Ordering::SeqCst => asm!(concat!("fence.sc.gpu;\n\tst.release.gpu.", $u, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p),
                            _ => asm!(concat!("st.release.gpu.", $u, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p),
                        }
                    }
                }

                #[inline(always)]
                pub fn fetch_add(&self, v: $t, o: Ordering) -> $t {
                    rmw!(o, "add", $u, $reg, self.0.get(), v)
                }

                /// A relaxed add whose old value is not returned (`red`).
                #[inline(always)]
                pub fn reduce_add(&self, v: $t) {
                    let p = self.0.get();
                    // SAFETY: `p` is this cell; `red` only adds to it.
                    unsafe { asm!(concat!("red.relaxed.gpu.add.", $u, " [{p}], {v};"), v = in($reg) v, p = in(reg64) p) }
                }

                #[inline(always)]
                pub fn fetch_sub(&self, v: $t, o: Ordering) -> $t {
                    rmw!(o, "add", $u, $reg, self.0.get(), v.wrapping_neg())
                }

                #[inline(always)]
                pub fn fetch_and(&self, v: $t, o: Ordering) -> $t {
                    rmw!(o, "and", $b, $reg, self.0.get(), v)
                }

                #[inline(always)]
                pub fn fetch_or(&self, v: $t, o: Ordering) -> $t {
                    rmw!(o, "or", $b, $reg, self.0.get(), v)
                }

                #[inline(always)]
                pub fn fetch_max(&self, v: $t, o: Ordering) -> $t {
                    rmw!(o, "max", $u, $reg, self.0.get(), v)
                }

                /// CAS; the success ordering applies (PTX has one per instruction).
                #[inline(always)]
                pub fn compare_exchange(&self, cur: $t, new: $t, o: Ordering, _fail: Ordering) -> Result<$t, $t> {
                    let p = self.0.get();
                    let old: $t;
                    // SAFETY: `p` is this cell; `atom.cas` only swaps it.
                    unsafe {
                        match o {
                            Ordering::Relaxed => asm!(concat!("atom.relaxed.gpu.cas.", $b, " {d}, [{p}], {c}, {n};"), d = out($reg) old, p = in(reg64) p, c = in($reg) cur, n = in($reg) new),
                            Ordering::Acquire => asm!(concat!("atom.acquire.gpu.cas.", $b, " {d}, [{p}], {c}, {n};"), d = out($reg) old, p = in(reg64) p, c = in($reg) cur, n = in($reg) new),
                            Ordering::Release => asm!(concat!("atom.release.gpu.cas.", $b, " {d}, [{p}], {c}, {n};"), d = out($reg) old, p = in(reg64) p, c = in($reg) cur, n = in($reg) new),
                            Ordering::AcqRel => asm!(concat!("atom.acq_rel.gpu.cas.", $b, " {d}, [{p}], {c}, {n};"), d = out($reg) old, p = in(reg64) p, c = in($reg) cur, n = in($reg) new),
                            _ => asm!(concat!("fence.sc.gpu;\n\tatom.acq_rel.gpu.cas.", $b, " {d}, [{p}], {c}, {n};"), d = out($reg) old, p = in(reg64) p, c = in($reg) cur, n = in($reg) new),
                        }
                    }
                    if old == cur {
                        Ok(old)
                    } else {
                        Err(old)
                    }
                }

                #[inline(always)]
                pub fn compare_exchange_weak(&self, cur: $t, new: $t, o: Ordering, f: Ordering) -> Result<$t, $t> {
                    self.compare_exchange(cur, new, o, f)
                }
            }
        };
    }

    gpu_atomic!(AtomicU32, u32, reg32, "u32", "b32");
    gpu_atomic!(AtomicU64, u64, reg64, "u64", "b64");
}
