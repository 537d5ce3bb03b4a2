#!/usr/bin/env bash
# Everything a GPU machine runs in one go: device info, every test (GPU
# tests included), the device benchmark, and compute-sanitizer (memcheck and
# racecheck) over the pipeline tests and the bad-free test. Results go to
# $OUT; the run fails if any step failed.
#
#   scripts/gpu-run.sh [cargo|bundle]
#
# cargo:  a GPU machine with Rust (and rustup). Builds here; the tests are
#         the README's command with the GPU tests included,
#           cargo test --workspace -- --include-ignored
#         and the sanitizer runs the same test executables, e.g.
#           compute-sanitizer --tool memcheck target/debug/deps/gpu_pipeline-<hash> \
#             --include-ignored --test-threads=1
#         The kernels need the pinned nightly with rust-src (see rust-nightly):
#         installed here if rustup can reach the network, else install it first.
# bundle: a GPU machine without Rust. Build the executables elsewhere with
#         ../shared/tools/gpu-bundle, copy the repository with .gpu/ in it.
# Without an argument: bundle if .gpu/run exists, else cargo.
#
# Settings: OUT (default .gpu/out), BENCH=0 skips the benchmark, SANITIZE=0
# skips compute-sanitizer.
set -u
cd "$(dirname "$0")/.."
export OUT=${OUT:-$PWD/.gpu/out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin

mode=${1:-}
if [ -z "$mode" ]; then
  if [ -f .gpu/run ]; then mode=bundle; else mode=cargo; fi
fi

failed=()
# check NAME STATUS: records a failed step.
check() {
  echo "$1 exit $2"
  [ "$2" = 0 ] || failed+=("$1")
}

case $mode in
  cargo)
    command -v cargo >/dev/null || { echo "cargo not found: install Rust, or use the bundle route"; exit 1; }
    nightly=$(tr -d '[:space:]' < rust-nightly)
    if ! rustup component list --toolchain "$nightly" --installed 2>/dev/null | grep -q '^rust-src'; then
      rustup toolchain install "$nightly" --profile minimal --component rust-src || exit 1
    fi
    cargo build --release --bin cuheap || exit 1
    cuheap=("${CARGO_TARGET_DIR:-target}/release/cuheap")
    # --no-fail-fast: every test executable runs even when one fails.
    run_tests() { cargo test --workspace --no-fail-fast -- --include-ignored; }
    # test_exe NAME: the path of integration test NAME's executable.
    test_exe() {
      cargo test --test "$1" --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1
    }
    ;;
  bundle)
    [ -f .gpu/run ] || { echo "no .gpu/run: build it with ../shared/tools/gpu-bundle"; exit 1; }
    cuheap=(bash .gpu/run bin cuheap)
    run_tests() { bash .gpu/run tests; }
    test_exe() { ls -d .gpu/tests/*--"$1" | head -1; }
    ;;
  *)
    echo "usage: scripts/gpu-run.sh [cargo|bundle]"
    exit 2
    ;;
esac
echo "route: $mode; results in $OUT"

"${cuheap[@]}" info 2>&1 | tee "$OUT/info.txt"
check info "${PIPESTATUS[0]}"

echo "=== tests"
run_tests > "$OUT/tests.txt" 2>&1
check tests $?
grep -E "^test |test result|===|panicked|assert|gpu tests" "$OUT/tests.txt" | grep -v " ignored$" | tail -60

if [ "${BENCH:-1}" = 1 ]; then
  echo "=== bench"
  timeout 400 "${cuheap[@]}" bench device --json "$OUT/device.json" --chart "$OUT/device.svg" > "$OUT/bench.txt" 2>&1
  check bench $?
  cat "$OUT/bench.txt"
fi

if [ "${SANITIZE:-1}" = 1 ] && ! command -v compute-sanitizer >/dev/null; then
  echo "compute-sanitizer not found (it comes with the CUDA toolkit); SANITIZE=0 skips it"
  failed+=(compute-sanitizer)
elif [ "${SANITIZE:-1}" = 1 ]; then
  echo "=== compute-sanitizer"
  pipeline=$(test_exe gpu_pipeline)
  heap=$(test_exe gpu_device_heap)
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --print-limit 10 --error-exitcode 1 "$pipeline" \
      --include-ignored --test-threads=1 > "$OUT/san-$tool-pipeline.txt" 2>&1
    check "$tool pipeline" $?
    tail -3 "$OUT/san-$tool-pipeline.txt"
    timeout 200 compute-sanitizer --tool $tool --print-limit 10 --error-exitcode 1 "$heap" \
      --include-ignored --test-threads=1 double_interior > "$OUT/san-$tool-heap.txt" 2>&1
    check "$tool heap" $?
    tail -3 "$OUT/san-$tool-heap.txt"
  done
fi

if [ ${#failed[@]} -gt 0 ]; then
  printf 'gpu-run: failed: %s\n' "${failed[*]}"
  exit 1
fi
echo "gpu-run: all passed"
