#!/usr/bin/env python3
"""Names for a `cuheap bench host` profile (CUHEAP_BENCH_PROFILE=DIR):
the sampled addresses grouped by function, for the modules given as
unstripped builds of the same code that ran (their file names must match
the mapped files'; addresses in other modules are grouped by module).

    python3 scripts/symbolize.py DIR/profile-cuheap-pool-8.txt \\
        target/release/cuheap target/release/libcuheap.so [--top 40]

Needs `nm` and `readelf` (binutils).
"""
import argparse
import bisect
import os
import subprocess
import sys


def segments(path):
    """(file offset, virtual address, size) of each PT_LOAD segment."""
    out = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=True).stdout
    segs = []
    for line in out.splitlines():
        w = line.split()
        if w and w[0] == "LOAD":
            segs.append((int(w[1], 16), int(w[2], 16), int(w[4], 16)))
    return segs


def symbols(path):
    """Sorted (address, name) of the functions `nm` finds."""
    out = subprocess.run(["nm", "-C", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16), parts[2]))
    syms.sort()
    return syms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profile")
    ap.add_argument("builds", nargs="*", help="unstripped builds of the modules that ran")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    samples, maps, part = [], [], None
    with open(a.profile) as f:
        header = [next(f).rstrip(), next(f).rstrip()]
        for line in f:
            if line.startswith("## "):
                part = line[3:].strip()
                continue
            if part == "samples":
                addr, count = line.split()
                samples.append((int(addr, 16), int(count)))
            elif part == "maps":
                w = line.split()
                if len(w) >= 6 and "x" in w[1]:
                    lo, hi = (int(x, 16) for x in w[0].split("-"))
                    maps.append((lo, hi, int(w[2], 16), w[5]))
    builds = {os.path.basename(b): b for b in a.builds}
    info = {}
    for name, path in builds.items():
        syms = symbols(path)
        info[name] = (segments(path), [s[0] for s in syms], [s[1] for s in syms])
    total = sum(c for _, c in samples)
    by = {}
    for addr, count in samples:
        where = "[unmapped]"
        for lo, hi, off, path in maps:
            if lo <= addr < hi:
                base = os.path.basename(path)
                where = base
                if base in info:
                    segs, addrs, names = info[base]
                    foff = addr - lo + off
                    vaddr = next((foff - so + sv for so, sv, sz in segs if so <= foff < so + sz), None)
                    if vaddr is not None:
                        i = bisect.bisect_right(addrs, vaddr) - 1
                        where = f"{base}: {names[i] if i >= 0 else '?'}"
                break
        by[where] = by.get(where, 0) + count
    print("\n".join(header))
    print(f"{total} samples; by function (unstripped builds: {', '.join(builds) or 'none'})")
    for where, count in sorted(by.items(), key=lambda x: -x[1])[: a.top]:
        print(f"{100 * count / max(total, 1):6.2f}%  {count:8d}  {where}")


if __name__ == "__main__":
    sys.exit(main())
