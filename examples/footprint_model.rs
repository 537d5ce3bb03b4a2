//! The footprint the in-kernel benchmark's placement cannot go under, no
//! GPU needed: `cuheap bench device`'s mixed sizes (16..4096 B, its own
//! `thread_size`), warps dealt round robin over the SMs, and each SM
//! filling pages of each class one after another, with no page shared
//! between SMs. Printed as live pages over requested bytes, beside the
//! two parts of it: rounding to size classes, and whole pages per class
//! with nothing left partly used.
//!
//!     cargo run --release --example footprint_model -- 132
//!
//! The argument is the SM count (132 on an H100 80 GB).

use cuheap::bench::workload::thread_size;
use cuheap::core::size_class::{
    blocks_per_page, class_of, page_units, CLASS_COUNT, CLASS_SIZES, PAGE_SIZE,
};

fn main() {
    let sms: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 132,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: footprint_model [SMS] (a positive SM count; 132 by default)");
            std::process::exit(2);
        }
    };
    println!("mixed sizes (16..4096 B), {sms} SMs, warps of 32 threads dealt round robin");
    println!("| threads | class rounding | whole pages per class | pages filled in turn per SM and class |");
    println!("|---|---|---|---|");
    for n in [1u32 << 16, 1 << 20, 1 << 22] {
        let mut requested = 0u64;
        let mut rounded = 0u64;
        let mut per_class = [0u64; CLASS_COUNT];
        let mut per_sm = vec![[0u64; CLASS_COUNT]; sms];
        for t in 0..n {
            let size = thread_size(t, 0);
            let c = class_of(size).expect("mixed sizes are class sizes") as usize;
            requested += size as u64;
            rounded += CLASS_SIZES[c] as u64;
            per_class[c] += 1;
            per_sm[(t as usize / 32) % sms][c] += 1;
        }
        let page_bytes = |c: usize| page_units(c as u32) as f64 * PAGE_SIZE as f64;
        let whole: f64 = (0..CLASS_COUNT)
            .map(|c| per_class[c] as f64 / blocks_per_page(c as u32) as f64 * page_bytes(c))
            .sum();
        let filled: f64 = (per_sm.iter())
            .flat_map(|sm| (0..CLASS_COUNT).map(move |c| (c, sm[c])))
            .map(|(c, k)| k.div_ceil(blocks_per_page(c as u32) as u64) as f64 * page_bytes(c))
            .sum();
        let r = |x: f64| x / requested as f64;
        println!(
            "| {}K | {:.3} | {:.3} | {:.3} |",
            n >> 10,
            r(rounded as f64),
            r(whole),
            r(filled)
        );
    }
}
