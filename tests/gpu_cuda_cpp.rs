//! cuheap's device library in a CUDA C++ program built by nvcc (and by
//! CMake where it is installed), as a user builds it: `device_ptx`
//! relabelled for this toolkit, compiled as relocatable device code with a
//! register budget, archived, linked into `examples/cuda-cpp/main.cu`,
//! which runs 1M allocating threads, bad input, CUB and Thrust.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

// Carried by the test executable: it may run far from the source tree.
const MAIN_CU: &str = include_str!("../examples/cuda-cpp/main.cu");
const CMAKE: &str = include_str!("../examples/cuda-cpp/CMakeLists.txt");
const HEADER: &str = include_str!("../include/cuheap.h");

/// The toolkit's release, from `nvcc --version` ("release 13.0, ...").
fn cuda_release(nvcc: &Path) -> (u32, u32) {
    let out = Command::new(nvcc).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rel = text
        .split("release ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .expect("nvcc --version names its release");
    let (a, b) = rel.trim().split_once('.').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_device_library_links_into_a_cuda_cpp_program_with_cub_and_thrust() {
    let gpu = gpu();
    let (major, minor) = gpu.info().compute_capability;
    let arch = format!("sm_{major}{minor}");
    let nvcc = nvcc();
    let (cm, cn) = cuda_release(&nvcc);
    let isa = cuheap::ptx_isa_of_cuda(cm, cn).expect("a known CUDA release");
    let dir = std::env::temp_dir().join(format!("cuheap-cpp-{}", std::process::id()));
    let src = dir.join("examples/cuda-cpp");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(dir.join("include")).unwrap();
    std::fs::write(dir.join("include/cuheap.h"), HEADER).unwrap();
    std::fs::write(src.join("main.cu"), MAIN_CU).unwrap();
    std::fs::write(src.join("CMakeLists.txt"), CMAKE).unwrap();
    let ptx = dir.join("cuheap_device.ptx");
    std::fs::write(&ptx, cuheap::device_ptx(&arch, isa).unwrap()).unwrap();
    println!("CUDA {cm}.{cn} (PTX ISA {isa}), {arch}");

    // nvcc alone: the README's commands.
    let a = format!("-arch={arch}");
    run(
        Command::new(&nvcc).current_dir(&dir).args([
            &a,
            "-rdc=true",
            "-maxrregcount=64",
            "-c",
            "cuheap_device.ptx",
            "-o",
            "cuheap_device.o",
        ]),
        "nvcc -c cuheap_device.ptx",
    );
    run(
        Command::new(&nvcc).current_dir(&dir).args([
            &a,
            "-lib",
            "cuheap_device.o",
            "-o",
            "libcuheap_device.a",
        ]),
        "nvcc -lib",
    );
    run(
        Command::new(&nvcc).current_dir(&dir).args([
            &a,
            "-rdc=true",
            "-Iinclude",
            "examples/cuda-cpp/main.cu",
            "-L.",
            "-lcuheap_device",
            "-o",
            "cuheap_example",
        ]),
        "nvcc main.cu -lcuheap_device",
    );
    let out = run(
        &mut Command::new(dir.join("cuheap_example")),
        "cuheap_example (nvcc)",
    );
    print!("{out}");
    assert!(out.contains("cuheap example: OK"), "{out}");

    // CMake, where it is installed.
    if Command::new("cmake")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let build = dir.join("build");
        run(
            Command::new("cmake")
                .arg("-S")
                .arg(&src)
                .arg("-B")
                .arg(&build)
                .arg(format!("-DCUHEAP_PTX={}", ptx.display()))
                .arg(format!("-DCMAKE_CUDA_ARCHITECTURES={major}{minor}"))
                .arg(format!("-DCMAKE_CUDA_COMPILER={}", which(&nvcc))),
            "cmake configure",
        );
        run(
            Command::new("cmake").arg("--build").arg(&build),
            "cmake --build",
        );
        let out = run(
            &mut Command::new(build.join("cuheap_example")),
            "cuheap_example (CMake)",
        );
        assert!(out.contains("cuheap example: OK"), "{out}");
        println!("CMake build: OK");
    } else {
        println!("cmake not found: the CMake build was not tried");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `nvcc`'s full path (CMake wants one).
fn which(nvcc: &Path) -> String {
    if nvcc.is_absolute() {
        return nvcc.display().to_string();
    }
    let out = Command::new("sh")
        .args(["-c", "command -v nvcc"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
