#!/usr/bin/env python3
"""A transformer training loop and an allocation-heavy loop under each of
PyTorch's allocators and cuheap's pool, same seed, one process each:

    python3 examples/pytorch/train.py [--steps 200] [--out FILE.md] [--floor-lib libfloor.so]

- native: PyTorch's caching allocator;
- cudaMallocAsync: PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync;
- expandable_segments: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
- cuheap: cuheap's pool (python/cuheap.py, libcuheap.so).

Training: a 6-layer, d_model 512 torch.nn.TransformerEncoder with a
linear head, AdamW, random inputs and labels with a sequence length
that changes every step (64..512, batch 32). Reported per allocator: the
median step time (host clock around a synchronised step), peak device
memory by the driver's reading (cudaMemGetInfo after each forward pass and
each step, less the reading before the model existed), and every step's
loss, compared with the native allocator's. "native again" is a second
run of the native allocator: whether the loop itself is deterministic.

Allocation-heavy: each iteration makes 64 tensors of 1..65,536 floats,
shapes drawn anew, computes on them and drops them; the median iteration.
One process's figure varies more than the allocators differ, so the loop
runs again in fresh processes (--heavy-rounds, 5 by default), the
allocators taking turns, and the report gives the median of the rounds.
cuheap's processes run with CUHEAP_HOOK_TIMES set and report the host
time spent inside cuheap's hooks per iteration. With --floor-lib (a build
of pluggable_floor.cpp beside this script: a pluggable allocator that
costs next to nothing), the rounds also run PyTorch's pluggable-allocator
path with that floor behind it: what the path costs apart from cuheap.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [
    ("native", {}),
    ("cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("cuheap", {"CUHEAP_HOOK_TIMES": "1"}),
    ("native again", {}),
]
FLOOR = "pluggable floor"
# cuheap without its capture check (a driver call per allocation and free),
# in the alloc-heavy rounds only: what the check costs there.
UNCHECKED = ("cuheap, no capture check",
             {"CUHEAP_HOOK_TIMES": "1", "CUHEAP_POOL_CHECK_CAPTURE": "0"})


def child(mode, steps, heavy_iters, heavy_only=False, floor_lib=None):
    hooks = None
    if mode.startswith("cuheap"):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        import cuheap

        cuheap.use_in_torch()
        hooks = cuheap.hook_times
    if mode == FLOOR:
        import torch

        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(floor_lib, "floor_alloc", "floor_free")
        )
    import torch
    import torch.nn as nn

    dev = torch.device("cuda")
    free0, total = torch.cuda.mem_get_info()
    base = total - free0
    peak = 0

    def sample():
        nonlocal peak
        free, total = torch.cuda.mem_get_info()
        peak = max(peak, total - free - base)

    if heavy_only:
        heavy_ms, check, hook = heavy_loop(torch, dev, heavy_iters, hooks)
        print("RESULT " + json.dumps({"mode": mode, "heavy_ms": heavy_ms, "heavy_check": check,
                                      "heavy_hooks": hook}),
              flush=True)
        return

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        d_model=512, nhead=8, dim_feedforward=2048, dropout=0.1, batch_first=True
    )
    encoder = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    head = nn.Linear(512, 1000)
    model = nn.ModuleDict({"encoder": encoder, "head": head}).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = torch.Generator().manual_seed(1)
    data = torch.Generator(device=dev).manual_seed(2)
    losses, times = [], []
    for step in range(steps):
        seq = 64 + 32 * int(torch.randint(0, 15, (1,), generator=lengths))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.randn(32, seq, 512, device=dev, generator=data)
        y = torch.randint(0, 1000, (32, seq), device=dev, generator=data)
        out = model["head"](model["encoder"](x))
        loss = nn.functional.cross_entropy(out.reshape(-1, 1000), y.reshape(-1))
        sample()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        sample()
    train_peak = peak

    # Allocation-heavy: many small tensors of changing shapes.
    del model, opt, out, loss, x, y
    heavy_ms, heavy_check, heavy_hooks = heavy_loop(torch, dev, heavy_iters, hooks)
    sample()
    result = {
        "mode": mode,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "step_ms": 1e3 * statistics.median(times[20:] if len(times) > 40 else times),
        "peak_mib": train_peak / 2**20,
        "peak_all_mib": peak / 2**20,
        "losses": losses,
        "heavy_ms": heavy_ms,
        "heavy_check": heavy_check,
        "heavy_hooks": heavy_hooks,
    }
    if mode.startswith("cuheap"):
        import cuheap

        result["pool"] = cuheap.stats(0)
    print("RESULT " + json.dumps(result), flush=True)


def heavy_loop(torch, dev, iters, hooks=None):
    """The allocation-heavy loop: (median ms per iteration after the
    first 10, a checksum of its results, a dict: the median host CPU ms
    per iteration of this thread, and with `hooks` (a reading of cuheap's
    hook times) the median ms per iteration spent inside the hooks, the
    calls per iteration and the longest call in us)."""
    shapes = torch.Generator().manual_seed(3)
    heavy, checks, inside, calls, cpu = [], [], [], [], []
    for it in range(iters):
        h0 = hooks() if hooks else None
        sizes = torch.randint(1, 1 << 16, (64,), generator=shapes).tolist()
        torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.thread_time()
        ts = [torch.full((n,), float(k), device=dev) * 2 + 1 for k, n in enumerate(sizes)]
        parts = torch.cat([t[:8] for t in ts])
        total_sum = sum(t.sum() for t in ts[::8])
        checks.append(float(parts.sum() + total_sum))
        del ts, parts, total_sum
        torch.cuda.synchronize()
        heavy.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if hooks:
            h1 = hooks()
            calls.append(h1[0] - h0[0])
            inside.append((h1[1] - h0[1]) / 1e6)
    skip = 10 if len(heavy) > 20 else 0
    hook = None
    if hooks:
        hook = {"ms_per_iter": statistics.median(inside[skip:]),
                "calls_per_iter": statistics.median(calls[skip:]),
                "longest_us": hooks()[2] / 1e3}
    hook = dict(hook or {}, cpu_ms_per_iter=1e3 * statistics.median(cpu[skip:]))
    return 1e3 * statistics.median(heavy[skip:]), sum(checks), hook


def run_child(mode, env, args):
    """Runs one child process; its result, or a failure record."""
    e = dict(os.environ)
    e.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    e.update(env)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode] + args
    p = subprocess.run(cmd, env=e, capture_output=True, text=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"{mode}: FAILED (exit {p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        return {"mode": mode, "failed": True}
    return json.loads(line[0][len("RESULT "):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--heavy-iters", type=int, default=300)
    ap.add_argument("--heavy-rounds", type=int, default=5,
                    help="processes per allocator for the alloc-heavy loop (the first inside the "
                         "training process)")
    ap.add_argument("--heavy-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help="also write the report (markdown) here, and .json beside it")
    ap.add_argument("--floor-lib", help="a build of pluggable_floor.cpp: also run the alloc-heavy "
                                        "rounds with it behind PyTorch's pluggable path")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.steps, a.heavy_iters, a.heavy_only, a.floor_lib)
        return
    results = []
    for mode, env in MODES:
        results.append(run_child(mode, env, ["--steps", str(a.steps),
                                             "--heavy-iters", str(a.heavy_iters)]))
        print(f"{mode}: done", file=sys.stderr)
    # The alloc-heavy loop again, in fresh processes, the allocators taking
    # turns: one process's figure varies more than the allocators differ.
    rounds = []
    turns = MODES[:4] + [UNCHECKED] + ([(FLOOR, {})] if a.floor_lib else [])
    floor = ["--floor-lib", os.path.abspath(a.floor_lib)] if a.floor_lib else []
    for r in range(max(0, a.heavy_rounds - 1)):
        for mode, env in turns:
            res = run_child(mode, env, ["--heavy-only", "--heavy-iters", str(a.heavy_iters)] + floor)
            rounds.append(dict(res, round=r + 2))
        print(f"alloc-heavy round {r + 2}: done", file=sys.stderr)
    results += rounds
    report = render(results, a.steps)
    print(report)
    if a.out:
        with open(a.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
            json.dump(results, f, indent=1)
    if any(r.get("failed") for r in results):
        sys.exit(1)


def render(all_results, steps):
    results = [r for r in all_results if "round" not in r]
    rounds = [r for r in all_results if "round" in r]
    ok = [r for r in results if not r.get("failed")]
    native = next((r for r in ok if r["mode"] == "native"), None)
    dev = ok[0]["device"] if ok else "?"
    out = [f"# PyTorch allocators, one process each: {dev}, torch {ok[0]['torch'] if ok else '?'}", ""]
    out.append(f"Training: 6-layer d_model 512 TransformerEncoder, batch 32, sequence 64..512 changing "
               f"every step, {steps} steps; median step time of steps 21..{steps}; peak = driver reading "
               f"(cudaMemGetInfo) after each forward pass and step, less the reading before the model.")
    out.append("Allocation-heavy: 64 tensors of 1..65,536 floats per iteration, new shapes each time; "
               "median iteration.")
    out.append("")
    out.append("| allocator | step ms | vs native | peak MiB (training) | losses vs native | "
               f"loss at step {min(120, steps)} | alloc-heavy ms/iter | vs native |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in results:
        if r.get("failed"):
            out.append(f"| {r['mode']} | FAILED | | | | | | |")
            continue
        if native:
            diffs = [abs(x - y) for x, y in zip(r["losses"], native["losses"])]
            same = "identical" if max(diffs) == 0 else f"max diff {max(diffs):.3g}"
            vs = f"{r['step_ms'] / native['step_ms']:.3f}x"
            hv = f"{r['heavy_ms'] / native['heavy_ms']:.3f}x"
        else:
            same = vs = hv = "-"
        k = min(120, steps) - 1
        out.append(f"| {r['mode']} | {r['step_ms']:.2f} | {vs} | {r['peak_mib']:.0f} | {same} | "
                   f"{r['losses'][k]:.6f} | {r['heavy_ms']:.3f} | {hv} |")
    pool = next((r.get("pool") for r in ok if r["mode"] == "cuheap"), None)
    if pool:
        out.append("")
        out.append("cuheap pool at the end: " + ", ".join(f"{k} {v}" for k, v in pool.items()))
    if rounds:
        out += [""] + heavy_rounds(ok, rounds)
    checks = {r["mode"]: r["heavy_check"] for r in ok + rounds if not r.get("failed")}
    out.append("")
    out.append("alloc-heavy results equal under every allocator: "
               + ("yes" if len(set(checks.values())) <= 1 else f"NO: {checks}"))
    return "\n".join(out) + "\n"



def heavy_rounds(first, rounds):
    """The alloc-heavy table over rounds: each allocator's figure per
    process (the training processes' first: both of native's), their
    median, and that median against native's.
    A failed process shows as FAILED and leaves the median out."""
    per = {}
    for r in first:
        per.setdefault(r["mode"].replace(" again", ""), []).append(r["heavy_ms"])
    failed = set()
    for r in rounds:
        if r.get("failed"):
            failed.add(r["mode"])
        else:
            per.setdefault(r["mode"], []).append(r["heavy_ms"])
    med = {m: statistics.median(v) for m, v in per.items() if v and m not in failed}
    n = max(len(v) for v in per.values())
    out = ["Allocation-heavy loop, one process per figure, the allocators taking turns "
           "(ms per iteration; the first figure, and native's second, come from the training "
           "runs above; cuheap without its capture check and the pluggable floor run in these "
           "rounds only):", "",
           "| allocator | " + " | ".join(f"run {i + 1}" for i in range(n))
           + " | median | vs native |",
           "|---|" + "---|" * (n + 2)]
    for m, v in per.items():
        cells = [f"{x:.3f}" for x in v] + [""] * (n - len(v))
        if m in failed:
            out.append(f"| {m} | " + " | ".join(cells) + " | FAILED | |")
            continue
        vs = f"{med[m] / med['native']:.3f}x" if "native" in med else "-"
        out.append(f"| {m} | " + " | ".join(cells) + f" | {med[m]:.3f} | {vs} |")
    cpu = {}
    for r in first + rounds:
        h = r.get("heavy_hooks") or {}
        if not r.get("failed") and "cpu_ms_per_iter" in h:
            cpu.setdefault(r["mode"].replace(" again", ""), []).append(h["cpu_ms_per_iter"])
    if cpu:
        out += ["", "Host CPU time of the loop's thread per iteration (time.thread_time), median of "
                "each process's median, ms: "
                + "; ".join(f"{m} {statistics.median(v):.3f}" for m, v in cpu.items())]
    hooks = [r["heavy_hooks"] for r in first + rounds
             if not r.get("failed") and r.get("heavy_hooks", {}).get("ms_per_iter") is not None]
    if hooks:
        out += ["", "Inside cuheap's hooks (CUHEAP_HOOK_TIMES), per cuheap process above "
                "(median ms per iteration, calls per iteration, longest call in us):"]
        for r in first + rounds:
            h = r.get("heavy_hooks")
            if h and h.get("ms_per_iter") is not None and not r.get("failed"):
                out.append(f"- {r['mode']}: {h['ms_per_iter']:.4f} ms, {h['calls_per_iter']:.0f} calls, "
                           f"{h['longest_us']:.1f} us")
    return out


if __name__ == "__main__":
    main()
