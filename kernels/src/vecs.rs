//! Rust's `alloc` collections in a kernel, on the module heap
//! ([`crate::module_heap::ModuleHeap`], the `#[global_allocator]`): every
//! thread builds a `Vec` of its own length, growing it push by push
//! (through `realloc`: in place while the block allows, else moved),
//! shrinks it into a `Box<[u64]>`, and spells its checksum in a `String`.
//! Parameters and contracts are in `signatures.rs` ([`crate::entry`]).

use crate::arch::global_thread;
use crate::bench::count;
use crate::bench::workload::{checksum_step, vec_len, vec_value};
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

/// The hexadecimal digit of `d` (`d < 16`).
fn hex(d: u64) -> char {
    char::from_digit((d & 15) as u32, 16).unwrap_or('?')
}

/// # Safety
///
/// The contract of its line in `signatures.rs`.
#[inline(always)]
pub unsafe fn vec_build(n: u32, seed: u32, out: *mut u64, errors: *mut u32) {
    let tid = global_thread();
    if tid >= n {
        return;
    }
    // SAFETY: 2 * tid + 1 < 2 * n entries.
    let (len_out, sum_out) = unsafe { (out.add(2 * tid as usize), out.add(2 * tid as usize + 1)) };
    let mut v: Vec<u64> = Vec::new();
    for k in 0..vec_len(tid, seed) {
        // Fallible growth: exhaustion is reported, not a trap.
        if v.try_reserve(1).is_err() {
            // SAFETY: forwarded from the caller; this thread's entries.
            unsafe {
                count(errors, 0);
                len_out.write(u64::MAX);
                sum_out.write(0);
            }
            return;
        }
        v.push(vec_value(tid, k));
    }
    // Gives back the spare capacity: a shrinking realloc, which never fails.
    let values: Box<[u64]> = v.into_boxed_slice();
    let sum = values.iter().fold(0, |s, &x| checksum_step(s, x));
    let mut text = String::new();
    let mut spelled = true;
    for i in (0..16).rev() {
        spelled &= text.try_reserve(1).is_ok();
        if spelled {
            text.push(hex(sum >> (4 * i)));
        }
    }
    if !spelled {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 0) };
    } else if text.len() != 16 || u64::from_str_radix(&text, 16) != Ok(sum) {
        // SAFETY: forwarded from the caller.
        unsafe { count(errors, 1) };
    }
    // SAFETY: this thread's entries.
    unsafe {
        len_out.write(values.len() as u64);
        sum_out.write(sum);
    }
}
