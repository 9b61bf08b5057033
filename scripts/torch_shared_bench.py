#!/usr/bin/env python3
"""Benchmark (not a test): a small all-reduce between ranks that share one GPU, through torch.distributed on Braid
(NCCL refuses ranks on one GPU). Each rank runs --iters all-reduces of an 8-byte tensor, synchronising after each,
after a warm-up; prints the median and the 90th percentile of the time per call, per world size, and the median
time rank 0 spends in the call itself (the rest is the wait for the GPU).

  scripts/torch_shared_bench.py --braid build/lib/libnccl.so.2 [--ranks 2,4] [--iters 200]
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}


def child(iters):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    t = torch.ones(2, device=dev)
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    times, calls = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
        calls.append((t1 - t0) * 1e6)
    if rank == 0:
        times.sort()
        print(f"@@ {statistics.median(times):.1f} {times[int(0.9 * len(times))]:.1f} {statistics.median(calls):.1f}",
              flush=True)
    dist.destroy_process_group()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--braid")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.iters)
    for n in [int(x) for x in args.ranks.split(",")]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, **SAFE_ENV, "LD_PRELOAD": os.path.abspath(args.braid), "WORLD_SIZE": str(n),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs = [subprocess.Popen([sys.executable, __file__, "--child", "--iters", str(args.iters)],
                                  env={**env, "RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for r in range(n)]
        out = ""
        for p in procs:
            try:
                out += p.communicate(timeout=120)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out += "timed out\n"
        got = [ln for ln in out.splitlines() if ln.startswith("@@ ")]
        if got:
            med, p90, call = got[0][3:].split()
            print(f"{n} ranks on one GPU: 8-byte all_reduce {med} us median, {p90} us 90th percentile "
                  f"(of which the call itself, on rank 0: {call} us median)")
        else:
            print(f"{n} ranks on one GPU: failed: {out[-800:]}")


if __name__ == "__main__":
    main()
