//! `host_std`: built with `std` for a host (not a GPU, not under loom):
//! where the heap may use the OS's clock, threads and thread-locals.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(host_std)");
    println!("cargo::rerun-if-changed=build.rs");
    let std = std::env::var_os("CARGO_FEATURE_STD").is_some();
    let gpu = std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "nvptx64");
    let loom = std::env::var_os("CARGO_CFG_LOOM").is_some();
    if std && !gpu && !loom {
        println!("cargo::rustc-cfg=host_std");
    }
}
