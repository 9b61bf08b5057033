#!/usr/bin/env python3
"""Benchmark (not a test): the host cost of one eager collective under torch.distributed, Braid against another
libnccl.so.2 (PyTorch's own NCCL by default), one rank, in the same run.

  scripts/torch_bench.py --braid build/lib/libnccl.so.2 [--ref PATH] [--probe nccl_calls.so] [--rounds 2]
                         [--iters 5000] [--runs 7] [--out DIR]

Each library runs in a child process of its own (the libraries take turns, --rounds times), which times loops of
--iters eager calls on an 8-byte tensor without synchronising inside the loop: "host" is the loop's time per call,
"total" the time per call until the GPU has finished too; the figure is the median of --runs loops after a
warm-up. The loop of torch's own in-place add is the floor of the loop itself. With --probe (the preload library of
tools/probes/nccl_calls.c), the child also records which NCCL functions torch called per iteration and the time
spent inside each.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}
# variant -> (environment, the libraries it runs on)
VARIANTS = {
    "default": ({}, ("braid", "nccl")),
    # torch's watchdog and heartbeat threads quiet: what they cost the calling thread
    "no-watchdog": ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0"},
                    ("braid", "nccl")),
    # Braid's launches without programmatic dependent launch: what the attribute costs the calls after them
    "no-pdl": ({"BRAID_LAUNCH_PDL": "0"}, ("braid",)),
}


def child(args):
    import ctypes

    import torch
    import torch.distributed as dist

    probe = None
    try:
        probe = ctypes.CDLL(None).nccl_calls_dump and ctypes.CDLL(None)
    except AttributeError:
        pass
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    t = torch.ones(2, device=dev)
    out = torch.empty(2, device=dev)
    loops = {
        "all_reduce 8 B in place": lambda: dist.all_reduce(t),
        "all_gather 8 B": lambda: dist.all_gather_into_tensor(out, t),
        "torch add_ (floor)": lambda: t.add_(1),
    }
    res = {}
    for name, fn in loops.items():
        for _ in range(1000):
            fn()
        torch.cuda.synchronize()
        host, total = [], []
        if probe:
            probe.nccl_calls_reset()
        for _ in range(args.runs):
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / args.iters * 1e6)
            total.append((t2 - t0) / args.iters * 1e6)
        if probe and args.calls_out:
            probe.nccl_calls_dump(args.calls_out.encode(), f"{name}/{args.runs * args.iters}".encode())
        res[name] = {"host": statistics.median(host), "total": statistics.median(total)}
    dist.destroy_process_group()
    print("@@ " + json.dumps(res), flush=True)
    os._exit(0)


def parent(args):
    os.makedirs(args.out, exist_ok=True)
    ref = args.ref
    if ref is None:
        import importlib.util

        spec = importlib.util.find_spec("nvidia.nccl")
        ref = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libnccl.so.2")
    libs = {"braid": os.path.abspath(args.braid), "nccl": ref}
    rows = []
    for rnd in range(args.rounds):
        for variant, (venv, vlibs) in VARIANTS.items():
            for lib, path in libs.items():
                if lib not in vlibs:
                    continue
                calls = os.path.join(args.out, f"calls-{lib}-{variant}-{rnd}.tsv")
                pre = ([os.path.abspath(args.probe)] if args.probe else []) + [path]
                if os.path.exists(calls):
                    os.remove(calls)
                env = {**os.environ, **SAFE_ENV, **venv, "LD_PRELOAD": " ".join(pre), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(29500 + rnd * 10 + len(rows) % 10)}
                cmd = [sys.executable, __file__, "--child", "--iters", str(args.iters), "--runs", str(args.runs)]
                if args.probe:
                    cmd += ["--calls-out", calls]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                got = [ln for ln in p.stdout.splitlines() if ln.startswith("@@ ")]
                if p.returncode != 0 or not got:
                    print(f"{lib} {variant}: failed (exit {p.returncode}): {p.stderr[-1500:]}")
                    continue
                for name, v in json.loads(got[-1][3:]).items():
                    rows.append((rnd, variant, lib, name, v["host"], v["total"]))
    print(f"{'variant':12s} {'loop':26s} {'braid host':>10s} {'nccl host':>10s} {'braid tot':>10s} {'nccl tot':>10s}"
          "   (µs per call, median of the rounds' medians)")
    summary = {}
    for variant in VARIANTS:
        for name in sorted({r[3] for r in rows}):
            cell = {}
            for lib in libs:
                sel = [r for r in rows if r[1] == variant and r[2] == lib and r[3] == name]
                cell[lib] = (statistics.median(r[4] for r in sel), statistics.median(r[5] for r in sel)) if sel else (
                    float("nan"), float("nan"))
            summary[f"{variant}/{name}"] = cell
            print(f"{variant:12s} {name:26s} {cell['braid'][0]:10.2f} {cell['nccl'][0]:10.2f} "
                  f"{cell['braid'][1]:10.2f} {cell['nccl'][1]:10.2f}")
    with open(os.path.join(args.out, "torch-bench.json"), "w") as f:
        json.dump({"rows": rows, "summary": summary}, f, indent=1)
    if args.probe:
        print_calls(args)


def print_calls(args):
    """Per loop and library, the calls torch made per iteration and the microseconds they took (round 0)."""
    for variant, (_, vlibs) in VARIANTS.items():
        for lib in vlibs:
            path = os.path.join(args.out, f"calls-{lib}-{variant}-0.tsv")
            if not os.path.exists(path):
                continue
            print(f"\n{lib} {variant}: calls per iteration, microseconds per call and per iteration")
            with open(path) as f:
                for line in f:
                    label, fn, thread, calls, us = line.rstrip("\n").split("\t")
                    loop, iters = label.rsplit("/", 1)
                    per = int(calls) / int(iters)
                    if per >= 0.01:
                        print(f"  {loop:26s} {fn:26s} {thread:5s} {per:8.2f} {float(us):8.3f} {per * float(us):8.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--braid")
    ap.add_argument("--ref")
    ap.add_argument("--probe")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default="torch-bench-out")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--calls-out")
    args = ap.parse_args()
    if args.child:
        child(args)
    else:
        parent(args)


if __name__ == "__main__":
    main()
