#!/usr/bin/env python3
"""What happens when a PyTorch program captures a CUDA graph while
cuheap's pool is its allocator, with the pool's capture check on (the
default) and off (CUHEAP_POOL_CHECK_CAPTURE=0), one process each:

    python3 examples/pytorch/graph_capture.py

PyTorch's pluggable allocator does not check the pointer its hook
returns, so cuheap cannot refuse an allocation by returning NULL (PyTorch
would record kernels that write to address 0 into the graph). With the
check on, an allocation on a capturing stream stops the process with
cuheap's reason. With it off, the capture's allocations are served like
any other: the graph replays correctly while nothing else reuses its
memory, but blocks the capture freed can be handed out again while the
graph still uses them (cuheap's hooks keep no pool per graph), so this
is for programs that know their graphs' memory is not reused.
"""

import os
import subprocess
import sys


def child():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import cuheap

    cuheap.use_in_torch()
    import torch

    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    before = cuheap.stats(0)["allocs"]
    with torch.cuda.graph(g):
        y = x * 2 + 1
    print(f"captured, {cuheap.stats(0)['allocs'] - before} allocations served", flush=True)
    ok = True
    for _ in range(3):
        x.add_(1)
        g.replay()
        torch.cuda.synchronize()
        ok &= bool(torch.equal(y, x * 2 + 1))
    print(f"3 replays {'correct' if ok else 'WRONG'}", flush=True)
    sys.exit(0 if ok else 1)


def main():
    if sys.argv[1:] == ["--child"]:
        return child()
    for check in ("1", "0"):
        env = dict(os.environ, CUHEAP_POOL_CHECK_CAPTURE=check)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                           capture_output=True, text=True)
        said = [l for l in (p.stdout + p.stderr).splitlines()
                if l.startswith(("captured", "3 replays", "cuheap:"))]
        print(f"capture check {'on' if check == '1' else 'off'}: exit {p.returncode}")
        for l in said:
            print(f"  {l}")


if __name__ == "__main__":
    main()
