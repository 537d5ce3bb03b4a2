//! cuheap's device library in a CUDA C++ program built by nvcc (and by
//! CMake where it is installed), as a user builds it: `device_ptx`
//! relabelled for this toolkit, compiled as relocatable device code with a
//! register budget, archived, linked into `examples/cuda-cpp/main.cu`,
//! which runs 1M allocating threads, bad input, CUB and Thrust; and the
//! host C API (`libcuheap.so`) in `examples/cuda-cpp/host_api.cu`.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

// Carried by the test executable: it may run far from the source tree.
const MAIN_CU: &str = include_str!("../examples/cuda-cpp/main.cu");
const CMAKE: &str = include_str!("../examples/cuda-cpp/CMakeLists.txt");
const HOST_API_CU: &str = include_str!("../examples/cuda-cpp/host_api.cu");
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

/// A build directory with the header, the examples and cuheap's device
/// library for this GPU and toolkit (`libcuheap_device.a`, built by
/// nvcc as the README says).
struct Build {
    dir: PathBuf,
    nvcc: PathBuf,
    ptx: PathBuf,
    arch: String,
    cc: String,
}

impl Build {
    fn new(name: &str) -> Build {
        let gpu = gpu();
        let (major, minor) = gpu.info().compute_capability;
        let arch = format!("sm_{major}{minor}");
        let nvcc = nvcc();
        let (cm, cn) = cuda_release(&nvcc);
        let isa = cuheap::ptx_isa_of_cuda(cm, cn).expect("a known CUDA release");
        let dir = std::env::temp_dir().join(format!("cuheap-{name}-{}", std::process::id()));
        let src = dir.join("examples/cuda-cpp");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(dir.join("include")).unwrap();
        std::fs::write(dir.join("include/cuheap.h"), HEADER).unwrap();
        std::fs::write(src.join("main.cu"), MAIN_CU).unwrap();
        std::fs::write(src.join("host_api.cu"), HOST_API_CU).unwrap();
        std::fs::write(src.join("CMakeLists.txt"), CMAKE).unwrap();
        let ptx = dir.join("cuheap_device.ptx");
        std::fs::write(&ptx, cuheap::device_ptx(&arch, isa).unwrap()).unwrap();
        println!("CUDA {cm}.{cn} (PTX ISA {isa}), {arch}");
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
        Build {
            dir,
            nvcc,
            ptx,
            arch,
            cc: format!("{major}{minor}"),
        }
    }

    /// nvcc alone, the README's command: `source` linked with the device
    /// library and `extra` arguments, run; its output.
    fn nvcc_run(&self, source: &str, exe: &str, extra: &[&str]) -> String {
        let mut args = vec![
            format!("-arch={}", self.arch),
            "-rdc=true".into(),
            "-Iinclude".into(),
            format!("examples/cuda-cpp/{source}"),
            "-L.".into(),
            "-lcuheap_device".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(["-o".into(), exe.into()]);
        run(
            Command::new(&self.nvcc).current_dir(&self.dir).args(&args),
            &format!("nvcc {source}"),
        );
        run(
            &mut Command::new(self.dir.join(exe)),
            &format!("{exe} (nvcc)"),
        )
    }

    /// The CMake build of the examples, where CMake is installed; the
    /// build directory, or None.
    fn cmake(&self, extra: &[String]) -> Option<PathBuf> {
        if !Command::new("cmake")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            println!("cmake not found: the CMake build was not tried");
            return None;
        }
        let build = self.dir.join("build");
        run(
            Command::new("cmake")
                .arg("-S")
                .arg(self.dir.join("examples/cuda-cpp"))
                .arg("-B")
                .arg(&build)
                .arg(format!("-DCUHEAP_PTX={}", self.ptx.display()))
                .arg(format!("-DCMAKE_CUDA_ARCHITECTURES={}", self.cc))
                .arg(format!("-DCMAKE_CUDA_COMPILER={}", which(&self.nvcc)))
                .args(extra),
            "cmake configure",
        );
        run(
            Command::new("cmake").arg("--build").arg(&build),
            "cmake --build",
        );
        Some(build)
    }
}

impl Drop for Build {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_device_library_links_into_a_cuda_cpp_program_with_cub_and_thrust() {
    let b = Build::new("cpp");
    let out = b.nvcc_run("main.cu", "cuheap_example", &[]);
    print!("{out}");
    assert!(out.contains("cuheap example: OK"), "{out}");
    if let Some(build) = b.cmake(&[]) {
        let out = run(
            &mut Command::new(build.join("cuheap_example")),
            "cuheap_example (CMake)",
        );
        assert!(out.contains("cuheap example: OK"), "{out}");
        println!("CMake build: OK");
    }
}

/// The folder holding `libcuheap.so`: `CUHEAP_LIB_DIR`, else beside the
/// test executable's folder (`target/<profile>/deps/..`, where cargo
/// builds the `cuheap-capi` cdylib), else `../lib` (a copied bundle).
fn libcuheap_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CUHEAP_LIB_DIR") {
        return d.into();
    }
    let exe = std::env::current_exe().unwrap();
    let here = exe.parent().unwrap();
    for d in [here.join(".."), here.join("../lib")] {
        if d.join("libcuheap.so").exists() {
            return d.canonicalize().unwrap();
        }
    }
    panic!(
        "libcuheap.so not found beside {}: build it (cargo build --release -p cuheap-capi) \
         or set CUHEAP_LIB_DIR",
        here.display()
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_host_c_api_serves_a_cuda_cpp_program() {
    let lib = libcuheap_dir();
    let b = Build::new("host-api");
    let l = format!("-L{}", lib.display());
    let rpath = format!("-Xlinker=-rpath,{}", lib.display());
    let out = b.nvcc_run("host_api.cu", "cuheap_host_api", &[&l, "-lcuheap", &rpath]);
    print!("{out}");
    assert!(out.contains("cuheap host API example: OK"), "{out}");
    if let Some(build) = b.cmake(&[format!("-DCUHEAP_LIB_DIR={}", lib.display())]) {
        let out = run(
            &mut Command::new(build.join("cuheap_host_api")),
            "cuheap_host_api (CMake)",
        );
        assert!(out.contains("cuheap host API example: OK"), "{out}");
        println!("CMake build: OK");
    }
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
