//! Sparse matrix products on the GPU, every method against the CPU
//! reference: generated inputs (A x A and A x A^T), empty rows and
//! matrices, a row whose output alone is over 1 MiB, and a heap that runs
//! out in the middle of the product.

mod common;
use common::*;
use cuheap::spgemm::cusparse::Cusparse;
use cuheap::spgemm::gpu::{Method, Runner};
use cuheap::spgemm::{self, gen, Csr, DeviceCsr};
use cuheap::{DeviceHeap, Error, Gpu};

const METHODS: [Method; 5] = [
    Method::TwoPass,
    Method::Cuheap { chunk: 4096 },
    Method::CUHEAP,
    Method::Cuheap { chunk: 0 },
    Method::CudaMalloc,
];

// CUDA's device heap, set once per process (see `setup`). Run one at a
// time (`--test-threads 1`), R-MAT 13's CUDA-malloc product in
// `every_method_matches_the_reference_on_every_generator` gets nulls after
// the file's earlier tests, at 1 GiB and at 4 GiB alike (README,
// Limitations); with the default test threads every test passes.
const MALLOC_HEAP: usize = 1 << 30;

fn setup() -> (Gpu, cuheap::kernels::Bench, DeviceHeap) {
    let gpu = cuheap::spgemm::gpu::open_gpu().expect("these tests need an NVIDIA GPU");
    // CUDA refuses a new malloc heap size once a kernel of the context has
    // used malloc: set it once, in the first test to get here (a later
    // setup, after another test ran the malloc method, would fail).
    static MALLOC_LIMIT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    MALLOC_LIMIT.get_or_init(|| gpu.set_malloc_heap_size(MALLOC_HEAP).unwrap());
    let k = kernels(&gpu);
    let heap = DeviceHeap::new(&gpu, 2 << 30).unwrap();
    (gpu, k, heap)
}

/// C downloaded and compared with the reference: the same pattern, each
/// value within its bound; a panic names `what` otherwise.
fn assert_exact(what: &str, c: &DeviceCsr, reference: &spgemm::Product) {
    let c = c.download().unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Err(e) = spgemm::compare(&c, reference) {
        panic!("{what}: {e}");
    }
}

/// Multiplies with every method, cuSPARSE included, checks each against
/// the reference and that the heap got every block back. Returns the
/// nonzeros of C.
fn check_all(
    gpu: &Gpu,
    k: &cuheap::kernels::Bench,
    heap: &DeviceHeap,
    name: &str,
    a: &Csr,
    b: &Csr,
) -> usize {
    let reference = spgemm::multiply(a, b).unwrap();
    let (da, db) = (
        DeviceCsr::upload(gpu, a).unwrap(),
        DeviceCsr::upload(gpu, b).unwrap(),
    );
    for m in METHODS {
        // Each product starts from an empty heap: after a product of rows
        // of every size class, every SM holds an empty current page per
        // class, which other classes and spans cannot take yet.
        // SAFETY: nothing runs on the GPU (multiply synchronises).
        unsafe { heap.reset().unwrap() };
        let r = Runner {
            gpu,
            kernels: k,
            heap: Some(heap),
            malloc_heap: MALLOC_HEAP,
        };
        let p = r
            .multiply(m, &da, &db, true)
            .unwrap_or_else(|e| panic!("{name}, {}: {e}\nheap: {:?}", m.name(), heap.stats()));
        assert_eq!(
            p.products,
            reference.products,
            "{name}, {}: products",
            m.name()
        );
        assert_exact(&format!("{name}, {}", m.name()), &p.c, &reference);
        let s = heap.stats().unwrap();
        assert!(
            s.is_empty(),
            "{name}, {}: {} blocks and {} spans not returned",
            m.name(),
            s.blocks(),
            s.spans
        );
        assert_eq!(s.bad_frees, 0, "{name}, {}: bad frees", m.name());
    }
    // cuSPARSE, the baseline the demo times: with buffers allocated per
    // product, and kept from one product to the next (twice, so the
    // second reuses the first's).
    let fresh = Cusparse::new(gpu).unwrap_or_else(|e| panic!("{name}, cuSPARSE: {e}"));
    let cached = Cusparse::cached(gpu).unwrap_or_else(|e| panic!("{name}, cuSPARSE: {e}"));
    for (cs, mode, times) in [(&fresh, "cuSPARSE", 1), (&cached, "cuSPARSE, cached", 2)] {
        let (pa, pb) = (cs.prepare(&da).unwrap(), cs.prepare(&db).unwrap());
        for _ in 0..times {
            let p = cs
                .multiply(&pa, &pb)
                .unwrap_or_else(|e| panic!("{name}, {mode}: {e}"));
            assert_exact(&format!("{name}, {mode}"), &p.c, &reference);
        }
    }
    reference.c.nnz()
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_method_matches_the_reference_on_every_generator() {
    let (gpu, k, heap) = setup();
    let inputs: Vec<(&str, Csr)> = vec![
        ("R-MAT scale 10, 8/row", gen::rmat(10, 8, 1).unwrap()),
        ("R-MAT scale 13, 16/row", gen::rmat(13, 16, 2).unwrap()),
        ("2D 5-point 64^2", gen::stencil_2d_5pt(64).unwrap()),
        ("3D 27-point 12^3", gen::stencil_3d_27pt(12).unwrap()),
        (
            "banded 3000, half width 40",
            gen::banded(3000, 40, 3).unwrap(),
        ),
        ("uniform 5000, 12/row", gen::uniform(5000, 12, 4).unwrap()),
        // Rows of the warp bin (at most 128 nonzeros): B's rows of 8 or
        // 17 entries, and A's rows of 41 entries, more than a warp takes
        // in one batch.
        ("uniform 5000, 8/row", gen::uniform(5000, 8, 5).unwrap()),
        (
            "banded 3000, half width 8",
            gen::banded(3000, 8, 6).unwrap(),
        ),
        (
            "banded 3000, half width 20",
            gen::banded(3000, 20, 7).unwrap(),
        ),
    ];
    for (name, a) in &inputs {
        let at = a.transpose();
        let n1 = check_all(&gpu, &k, &heap, &format!("{name}: A x A"), a, a);
        let n2 = check_all(&gpu, &k, &heap, &format!("{name}: A x A^T"), a, &at);
        println!("{name}: A x A {n1} nonzeros, A x A^T {n2}: every method exact");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn empty_matrices_and_rows_without_output() {
    let (gpu, k, heap) = setup();
    let z = Csr::zeros(100, 100).unwrap();
    check_all(&gpu, &k, &heap, "empty x empty", &z, &z);
    let none = Csr::zeros(0, 0).unwrap();
    check_all(&gpu, &k, &heap, "0x0 x 0x0", &none, &none);
    // Rows 0, 3, 6, ... of A are empty, and columns 1, 4, ... of A hit
    // empty rows of B: rows with entries but no products too.
    let mut t = Vec::new();
    for r in 0..300u32 {
        if r % 3 != 0 {
            for c in [r % 300, (r * 7 + 1) % 300, (r * 13 + 2) % 300] {
                t.push((r, c, 1.0 + r as f64 / 7.0));
            }
        }
    }
    let a = Csr::from_triplets(300, 300, &t).unwrap();
    check_all(&gpu, &k, &heap, "empty rows", &a, &a);
    check_all(
        &gpu,
        &k,
        &heap,
        "no columns",
        &a,
        &Csr::zeros(300, 0).unwrap(),
    );
    let (da, dz) = (
        DeviceCsr::upload(&gpu, &a).unwrap(),
        DeviceCsr::upload(&gpu, &z).unwrap(),
    );
    for m in METHODS {
        let r = Runner {
            gpu: &gpu,
            kernels: &k,
            heap: Some(&heap),
            malloc_heap: MALLOC_HEAP,
        };
        let e = r.multiply(m, &da, &dz, false);
        assert!(
            matches!(e, Err(Error::InvalidArgument(_))),
            "300x300 times 100x100 must be refused"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_row_whose_output_is_over_one_mib() {
    let (gpu, k, heap) = setup();
    // Row 0 of A meets 128 rows of B with 1024 distinct columns each:
    // 131072 entries, 1.5 MiB of output in one row (a span).
    let n = 131_072u32;
    let a_t: Vec<(u32, u32, f64)> = (0..128).map(|c| (0, c, 1.0 + c as f64)).collect();
    let b_t: Vec<(u32, u32, f64)> = (0..128u32)
        .flat_map(|r| (0..1024).map(move |j| (r, r * 1024 + j, 0.5 + j as f64)))
        .collect();
    let a = Csr::from_triplets(n as usize, n as usize, &a_t).unwrap();
    let b = Csr::from_triplets(n as usize, n as usize, &b_t).unwrap();
    let nnz = check_all(&gpu, &k, &heap, "1.5 MiB row", &a, &b);
    assert_eq!(nnz, 131_072);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_heap_that_runs_out_is_an_error_not_a_wrong_result() {
    let (gpu, k, _) = setup();
    let small = DeviceHeap::new(&gpu, 1 << 20).unwrap();
    // R-MAT's rows fill every bin; the 2D stencil's, the thread bin, whose
    // warps carve their rounds from chunks they keep.
    let inputs = [
        gen::rmat(13, 16, 2).unwrap(),
        gen::stencil_2d_5pt(256).unwrap(),
    ];
    for (a, chunk) in inputs
        .iter()
        .flat_map(|a| [0, 4096, Method::DEFAULT_CHUNK].map(|c| (a, c)))
    {
        let da = DeviceCsr::upload(&gpu, a).unwrap();
        match (Runner {
            gpu: &gpu,
            kernels: &k,
            heap: Some(&small),
            malloc_heap: 0,
        })
        .multiply(Method::Cuheap { chunk }, &da, &da, false)
        {
            Err(Error::DeviceHeapExhausted { failed, bytes }) => {
                assert!(failed > 0 && bytes > 0, "{failed} rows, {bytes} bytes");
                println!("chunk {chunk}: {failed} rows failed, {bytes} bytes short: reported");
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(p) => panic!("a 1 MiB heap held {} nonzeros?", p.c.nnz()),
        }
        let s = small.stats().unwrap();
        assert!(s.is_empty(), "the rows that got blocks gave them back");
    }
}

/// The register caps `open_gpu` writes into the PTX hold on the GPU: each
/// SpGEMM kernel takes at most `register_cap` of its name registers a
/// thread (128 for the thread bin's row kernels, 64 for every other).
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_kernel_keeps_its_register_cap() {
    if std::env::var_os("CUHEAP_MAX_REGISTERS").is_some() {
        return; // the user's cap, for every kernel, decides
    }
    use cuheap::spgemm::gpu::{register_cap, THREAD_BIN_MAX_REGISTERS};
    let (gpu, _, _) = setup();
    let mut thread_bin = 0;
    for k in cuheap::kernel_names()
        .into_iter()
        .filter(|k| k.starts_with("spgemm_"))
    {
        let cap = register_cap(k);
        if cap == THREAD_BIN_MAX_REGISTERS {
            thread_bin += 1;
        }
        let r = gpu.registers(k).unwrap();
        println!("{k}: {r} registers (cap {cap})");
        assert!(r <= cap, "{k} takes {r} registers a thread (cap {cap})");
    }
    assert_eq!(thread_bin, 5);
}
