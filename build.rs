//! Builds `kernels/` (and `cuheap-core` with it) into PTX with the nightly
//! toolchain's `nvptx64-nvidia-cuda` target, twice, and embeds both:
//!
//! - `$OUT_DIR/cuheap.ptx` (`cuheap::PTX`): the kernels crate with its
//!   `c-abi` feature, the heap, its C ABI and a growable heap's two
//!   upkeep kernels, what a program links;
//! - `$OUT_DIR/cuheap_bench.ptx` (`cuheap::BENCH_PTX`): with its `bench`
//!   feature, the benchmark and test kernels. Some use Rust's `alloc`
//!   crate on the device heap, so this build compiles `alloc` for nvptx64
//!   too (`-Zbuild-std=core,alloc`); the heap's own PTX needs only `core`.
//!
//! Each build has its own target directory: both write a
//! `cuheap_kernels.s`, and one shared directory would keep whichever ran last.
//!
//! Settings (environment): `CUHEAP_PTX_ARCH` (default `sm_80`, which the
//! driver JIT-compiles for A100, H100 and newer), `CUHEAP_NIGHTLY` (the
//! toolchain name, default from `rust-nightly`), `CUHEAP_ATOMIC_SCOPE` (`gpu`, the
//! default, or `sys`: which atomics `cuheap-core` uses on the GPU; `sys` is for
//! comparison only, see `cuheap_core::sync`).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Variables of the outer (stable) build that must not leak into the
/// nested nightly build.
const SCRUB: &[&str] = &[
    "RUSTC",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "RUSTUP_TOOLCHAIN",
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS", // set again below, for the GPU
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO",
    "CARGO_MAKEFLAGS",
    "MAKEFLAGS",
    "MFLAGS",
];

fn main() {
    let root =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for dir in [
        "kernels/src",
        "kernels/Cargo.toml",
        "core/src",
        "core/Cargo.toml",
        "src/bench/workload.rs",
        "src/spgemm/problem.rs",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=CUHEAP_PTX_ARCH");
    println!("cargo:rerun-if-env-changed=CUHEAP_NIGHTLY");
    println!("cargo:rerun-if-env-changed=CUHEAP_ATOMIC_SCOPE");

    let arch = env::var("CUHEAP_PTX_ARCH").unwrap_or_else(|_| "sm_80".into());
    // Pinned in `rust-nightly` (CI installs the same): plain `nightly` moved
    // from 1.97 to 1.101 between two fresh machines.
    let toolchain =
        env::var("CUHEAP_NIGHTLY").unwrap_or_else(|_| include_str!("rust-nightly").trim().into());
    let scope = match env::var("CUHEAP_ATOMIC_SCOPE").as_deref() {
        Ok("gpu") | Err(_) => "",
        Ok("sys") => "\x1f--cfg\x1fcuheap_sys_atomics",
        Ok(other) => fail(&format!(
            "CUHEAP_ATOMIC_SCOPE={other}: use gpu (default) or sys"
        )),
    };
    if !arch.starts_with("sm_") || arch[3..].parse::<u32>().map_or(true, |v| v < 70) {
        fail(&format!(
            "CUHEAP_PTX_ARCH={arch} is not a supported target: use sm_70 or newer (default sm_80)"
        ));
    }
    let rustflags = format!("-Ctarget-cpu={arch}{scope}");
    for (feature, std_crates, file) in [
        ("c-abi", "core", "cuheap.ptx"),
        ("bench", "core,alloc", "cuheap_bench.ptx"),
    ] {
        let target_dir = out.join(format!("kernels-{feature}"));
        build_ptx(
            &root,
            &toolchain,
            &rustflags,
            feature,
            std_crates,
            &target_dir,
        );
        // Where cargo puts `--emit=asm` output differs between versions
        // (`release/deps/` before its build-dir layout, `build/<pkg>/<hash>/out/`
        // after): take the newest `cuheap_kernels*.s` under the target dir.
        let mut found = Vec::new();
        find_asm(&target_dir.join("nvptx64-nvidia-cuda/release"), &mut found);
        found.sort_by_key(|(t, _)| *t);
        match found.pop() {
            Some((_, ptx)) => copy(&ptx, &out.join(file)),
            None => fail(&format!(
                "no cuheap_kernels*.s under {}",
                target_dir.display()
            )),
        }
    }
    println!("cargo:rustc-env=CUHEAP_PTX_ARCH={arch}");
}

/// Runs the nested nightly build of the kernels crate with `feature`,
/// building the standard library crates `std_crates` from source.
fn build_ptx(
    root: &Path,
    toolchain: &str,
    rustflags: &str,
    feature: &str,
    std_crates: &str,
    target_dir: &Path,
) {
    let mut cmd = Command::new("cargo");
    for v in SCRUB {
        cmd.env_remove(v);
    }
    cmd.arg(format!("+{toolchain}"))
        .args([
            "rustc",
            "--release",
            "--target",
            "nvptx64-nvidia-cuda",
            &format!("-Zbuild-std={std_crates}"),
            "--features",
            feature,
        ])
        .arg("--manifest-path")
        .arg(root.join("kernels/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--", "--emit=asm", "-C", "linker=true"])
        // Every crate of the nested build (core included) for the same GPU:
        // newer nightlies refuse to mix target-cpu across crates.
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    let output = match cmd.output() {
        Ok(o) => o,
        Err(e) => fail(&format!("could not run cargo for the PTX build: {e}")),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("toolchain") && stderr.contains("not installed") {
            format!(
                "the `{toolchain}` toolchain is missing: `rustup toolchain install {toolchain}`"
            )
        } else if stderr.contains("rust-src") || stderr.contains("library/Cargo.lock") {
            format!("the standard library source is missing: `rustup component add rust-src --toolchain {toolchain}`")
        } else {
            format!("the kernels crate (feature `{feature}`) failed to compile for nvptx64 (errors above)")
        };
        eprintln!("{stderr}");
        fail(&hint);
    }
}

fn find_asm(dir: &Path, found: &mut Vec<(std::time::SystemTime, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            find_asm(&path, found);
        } else if path.extension().is_some_and(|x| x == "s")
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("cuheap_kernels"))
        {
            if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                found.push((t, path));
            }
        }
    }
}

fn copy(from: &Path, to: &Path) {
    if let Err(e) = std::fs::copy(from, to) {
        fail(&format!("PTX not found at {}: {e}", from.display()));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("\ncuheap build: {msg}\n");
    println!("cargo:warning=cuheap build: {msg}");
    std::process::exit(1);
}
