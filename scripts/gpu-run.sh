#!/bin/bash
# Everything the GPU machine runs in one go (built executables in .gpu/):
# device info, every test (GPU tests included), the device benchmark, and
# compute-sanitizer over a subset of the GPU tests. Results go to $OUT.
set -u
export OUT=${OUT:-$PWD/.gpu/out}; mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
g=.gpu
bash $g/run bin cuheap info 2>&1 | tee "$OUT/info.txt"
echo "=== tests"
bash $g/run tests > "$OUT/tests.txt" 2>&1; echo "tests exit $?" | tee -a "$OUT/tests.txt"
grep -E "^test |test result|===|panicked|assert|gpu tests" "$OUT/tests.txt" | grep -v " ignored$" | tail -60
echo "=== bench"
timeout 400 bash $g/run bin cuheap bench device --json "$OUT/device.json" --chart "$OUT/device.svg" > "$OUT/bench.txt" 2>&1; echo "bench exit $?" >> "$OUT/bench.txt"
cat "$OUT/bench.txt"
if [ "${SANITIZE:-1}" = 1 ]; then
  echo "=== compute-sanitizer"
  t=$(ls $g/tests/ | grep -- '--gpu_device_heap' | head -1)
  p=$(ls $g/tests/ | grep -- '--gpu_pipeline' | head -1)
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --print-limit 10 $g/tests/$p --include-ignored --test-threads=1 > "$OUT/san-$tool-pipeline.txt" 2>&1; echo "$tool pipeline exit $?"; tail -3 "$OUT/san-$tool-pipeline.txt"
    timeout 200 compute-sanitizer --tool $tool --print-limit 10 $g/tests/$t --include-ignored --test-threads=1 double_interior > "$OUT/san-$tool-heap.txt" 2>&1; echo "$tool heap exit $?"; tail -3 "$OUT/san-$tool-heap.txt"
  done
fi
