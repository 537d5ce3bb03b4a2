#!/usr/bin/env python3
"""An array workload under CuPy's default memory pool and under cuheap's
pool, same seed, one process each:

    python3 examples/cupy/arrays.py [--iters 400] [--out FILE.md]

Each iteration draws a size (1 K..4 M floats, log-uniform), makes arrays
of it, runs elementwise work, a sort, a reduction, a small matrix product
and a concatenation, and drops them. Reported per allocator: the median
iteration (host clock, synchronised), peak device memory by the driver's
reading (after each iteration, less the reading before the first array),
and a checksum of every iteration's results, which must be equal.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ["cupy default pool", "cuheap"]


def child(mode, iters):
    import cupy as cp
    import numpy as np

    if mode == "cuheap":
        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        import cuheap

        cuheap.use_in_cupy()
    dev = cp.cuda.Device(0)
    dev.use()
    cp.cuda.runtime.free(cp.cuda.runtime.malloc(1))  # the context, before the baseline
    free0, total = cp.cuda.runtime.memGetInfo()
    base = total - free0
    peak = 0
    rng = np.random.default_rng(7)
    sums, times = [], []
    for it in range(iters):
        n = int(np.exp(rng.uniform(np.log(1 << 10), np.log(4 << 20))))
        seed = int(rng.integers(1 << 30))
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        g = cp.random.RandomState(seed)
        a = g.random_sample(n, dtype=cp.float64)
        b = cp.sqrt(a) * 2.0 + cp.sin(a)
        s = cp.sort(b)
        m = min(256, int(n**0.5))
        c = a[: m * m].reshape(m, m)
        d = c @ c.T
        e = cp.concatenate([s[:: max(1, n // 1000)], d.ravel()[:1000]])
        r = float(e.sum() + b.max() - s[0])
        del a, b, s, c, d, e, g
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
        sums.append(r)
        free, _ = cp.cuda.runtime.memGetInfo()
        peak = max(peak, total - free - base)
    result = {
        "mode": mode,
        "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__,
        "iter_ms": 1e3 * statistics.median(times[20:] if len(times) > 40 else times),
        "peak_mib": peak / 2**20,
        "checksum": sums,
    }
    if mode == "cuheap":
        import cuheap

        result["pool"] = cuheap.stats(0)
    print("RESULT " + json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--out", help="also write the report (markdown) here, and .json beside it")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.iters)
        return
    results = []
    for mode in MODES:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--iters", str(a.iters)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            print(f"{mode}: FAILED (exit {p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
            results.append({"mode": mode, "failed": True})
            continue
        results.append(json.loads(line[0][len("RESULT "):]))
    ok = [r for r in results if not r.get("failed")]
    out = [f"# CuPy allocators, one process each: {ok[0]['device'] if ok else '?'}, "
           f"CuPy {ok[0]['cupy'] if ok else '?'}", "",
           f"{a.iters} iterations of arrays of 1 K..4 M doubles (log-uniform sizes): elementwise, sort, "
           "reduction, matrix product, concatenation; median of iterations 21.., host clock, synchronised; "
           "peak = driver reading (cudaMemGetInfo) after each iteration, less the reading before.", "",
           "| allocator | ms per iteration | vs CuPy's pool | peak MiB | results |", "|---|---|---|---|---|"]
    ref = next((r for r in ok if r["mode"] == MODES[0]), None)
    for r in results:
        if r.get("failed"):
            out.append(f"| {r['mode']} | FAILED | | | |")
            continue
        vs = f"{r['iter_ms'] / ref['iter_ms']:.3f}x" if ref else "-"
        same = "-" if not ref else ("equal" if r["checksum"] == ref["checksum"] else "DIFFERENT")
        out.append(f"| {r['mode']} | {r['iter_ms']:.3f} | {vs} | {r['peak_mib']:.0f} | {same} |")
    pool = next((r.get("pool") for r in ok if r["mode"] == "cuheap"), None)
    if pool:
        out += ["", "cuheap pool at the end: " + ", ".join(f"{k} {v}" for k, v in pool.items())]
    report = "\n".join(out) + "\n"
    print(report)
    if a.out:
        with open(a.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
            json.dump(results, f, indent=1)
    bad = any(r.get("failed") for r in results) or (ref and any(
        r["checksum"] != ref["checksum"] for r in ok))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
