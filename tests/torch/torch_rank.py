#!/usr/bin/env python3
"""One rank of the PyTorch suite, started by run_torch_suite.py with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
SCENARIO in its environment. Prints one line per check, '@@ ' and a JSON object: {"case", "ok", "secs", "error"}.

Scenarios:
  main         every collective, type and operation; new_group used beside the world; DDP; FSDP2; CUDA graphs
               mixed with eager calls; then destroy_process_group while a graph that captured a collective lives
  lazy         the communicator made at the first collective (no device_id), then a few collectives
  nonblocking  TORCH_NCCL_USE_COMM_NONBLOCKING=1: non-blocking init and calls
  absent       rank 1 never takes part (it exits after joining the store): rank 0's first collective must fail
               with an error that names rank 1, within the bootstrap timeout, and rank 0 end cleanly
  stuck        rank 1 makes the communicator, then never calls the collective: rank 0's call must fail with an
               error that names rank 1, within BRAID_TIMEOUT_S, and rank 0 end cleanly
"""
import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

import torch_cases as tc
import torch_models as tm

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
SCENARIO = os.environ.get("SCENARIO", "main")
SMALL = os.environ.get("TORCH_SUITE_SMALL", "0") == "1"  # fewer and smaller cases (ranks sharing a GPU)
# gloo on the CPU checks the suite's own references where no GPU is (cases gloo lacks fail there)
BACKEND = os.environ.get("TORCH_SUITE_BACKEND", "nccl")


def report(case, ok, secs, error=""):
    print("@@ " + json.dumps({"rank": RANK, "case": case, "ok": ok, "secs": round(secs, 3), "error": error[-2000:]}),
          flush=True)


def run(case, fn, *args):
    t0 = time.monotonic()
    try:
        fn(*args)
        sync()
        report(case, True, time.monotonic() - t0)
        return True
    except Exception as e:  # a wrong result or an error of the library: reported, then the next case
        report(case, False, time.monotonic() - t0, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}")
        return False


class Ctx:
    """The rank's view of one process group."""

    def __init__(self, dev, group=None, ranks=None):
        self.dev, self.group = dev, group
        self.ranks = ranks or list(range(WORLD))
        self.rank = self.ranks.index(RANK)
        self.world = len(self.ranks)

    def peer(self, r):
        """The global rank of the group's rank r (what torch's point-to-point calls take)."""
        return self.ranks[r]


def sync():
    if BACKEND == "nccl":
        torch.cuda.synchronize()


def loaded_nccl():
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libnccl.so" in line}
    return ",".join(sorted(paths)) or "none"


def init(dev, eager=True):
    dist.init_process_group(BACKEND, rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=120),
                            device_id=dev if eager and BACKEND == "nccl" else None)


def collectives(ctx, tag=""):
    """The collectives on ctx's group; every check is a case of its own."""
    counts = [1, 7, 1000, 65537] if not SMALL else [1, 7, 1000]
    ops = ["sum", "prod", "min", "max", "avg", "premul"]
    for dtype in tc.FLOATS + tc.INTS:
        for op in ops:
            if op == "premul" and (dtype in tc.INTS or (dtype == torch.bfloat16 and tc.TORCH_BF16_PREMUL_BUG)):
                continue
            for n in counts:
                run(f"{tag}all_reduce {op} {tc.name_of(dtype)} n={n}", tc.all_reduce, ctx, dtype, op, n)
    big = 1 << 20 if SMALL else 4 << 20
    run(f"{tag}all_reduce sum float32 n={big}", tc.all_reduce, ctx, torch.float32, "sum", big)
    run(f"{tag}all_reduce sum bfloat16 n={2 * big}", tc.all_reduce, ctx, torch.bfloat16, "sum", 2 * big)
    for dtype in tc.FLOATS + tc.INTS + tc.FP8:
        for n in ([1, 1001, 1 << 20] if not SMALL else [1, 1001]):
            root = ctx.world - 1
            run(f"{tag}broadcast {tc.name_of(dtype)} n={n}", tc.broadcast, ctx, dtype, n, root)
            run(f"{tag}all_gather {tc.name_of(dtype)} n={n}", tc.all_gather, ctx, dtype, n)
            run(f"{tag}all_to_all even {tc.name_of(dtype)} n={n}", tc.all_to_all, ctx, dtype, n, False)
    run(f"{tag}all_gather in place float32 n=333", tc.all_gather, ctx, torch.float32, 333, True)
    run(f"{tag}all_gather float32 n={big}", tc.all_gather, ctx, torch.float32, big // ctx.world)
    for n in [0, 1, 333, 100003]:
        run(f"{tag}all_to_all uneven int32 n={n}", tc.all_to_all, ctx, torch.int32, n, True)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        for op in ("sum", "max", "avg"):
            for n in ([1, 333, 100003] if not SMALL else [1, 333]):
                run(f"{tag}reduce_scatter {op} {tc.name_of(dtype)} n={n}", tc.reduce_scatter, ctx, dtype, op, n)
        for op in ("sum", "max"):
            run(f"{tag}reduce {op} {tc.name_of(dtype)} n=4099", tc.reduce, ctx, dtype, op, 4099, 0)
    for n in [1, 4099]:
        run(f"{tag}gather float16 n={n}", tc.gather, ctx, torch.float16, n, ctx.world - 1)
        run(f"{tag}scatter int64 n={n}", tc.scatter, ctx, torch.int64, n, 0)
    run(f"{tag}batch_isend_irecv ring", tc.send_recv_ring, ctx, torch.float32, [1, 1000, 65537])
    run(f"{tag}barrier", dist.barrier, ctx.group)


def concurrent_groups(world_ctx):
    """new_group (a split of the world), then the group and the world used at once from two streams."""
    evens = list(range(0, WORLD, 2))
    sub = dist.new_group(ranks=evens)
    a = torch.full((4097,), float(RANK + 1), device=world_ctx.dev)
    b = torch.full((65537,), float(RANK + 1), device=world_ctx.dev)
    works = []
    for _ in range(10):
        if RANK in evens:
            works.append(dist.all_reduce(a, group=sub, async_op=True))
        works.append(dist.all_reduce(b, async_op=True))
    for w in works:
        w.wait()
    sync()
    sub_sum = float(sum(r + 1 for r in evens))
    world_sum = float(sum(r + 1 for r in range(WORLD)))
    # each of the 10 in-place sums multiplies the group's common value by the group's size after the first
    if RANK in evens:
        expect = sub_sum * len(evens) ** 9
        if not torch.all(a == expect):
            raise tc.CaseError(f"group all_reduce: got {a[0].item()}, expected {expect}")
    expect = world_sum * WORLD ** 9
    if not torch.all(b == expect):
        raise tc.CaseError(f"world all_reduce beside the group: got {b[0].item()}, expected {expect}")
    sub_ctx = Ctx(world_ctx.dev, sub, evens) if RANK in evens else None
    if sub_ctx is not None:
        run("new_group: all_reduce sum float32 n=1000", tc.all_reduce, sub_ctx, torch.float32, "sum", 1000)
        run("new_group: batch_isend_irecv ring", tc.send_recv_ring, sub_ctx, torch.int32, [3, 70000])
    dist.barrier()


def main_scenario(dev):
    init(dev)
    report("loaded " + loaded_nccl(), True, 0.0)
    ctx = Ctx(dev)
    collectives(ctx)
    run("new_group beside the world", concurrent_groups, ctx)
    run("DDP 3 steps against one process", tm.ddp_check, ctx)
    run("FSDP2 fully_shard 3 steps against one process", tm.fsdp_check, ctx)
    eager = 100000 if WORLD == 1 else 2000
    graph_holder = []
    run(f"CUDA graph replays among {eager} eager all_reduces", tm.graph_mix, ctx, eager, graph_holder)
    # the graph that captured an all-reduce is still alive: shutting down must succeed as with NCCL
    run("destroy_process_group with a live CUDA graph", dist.destroy_process_group)
    graph_holder.clear()


def lazy_scenario(dev):
    init(dev, eager=False)
    ctx = Ctx(dev)
    run("lazy init: all_reduce sum float32 n=1000", tc.all_reduce, ctx, torch.float32, "sum", 1000)
    run("lazy init: all_gather int64 n=77", tc.all_gather, ctx, torch.int64, 77)
    run("lazy init: batch_isend_irecv ring", tc.send_recv_ring, ctx, torch.float16, [5, 5000])
    run("lazy init: destroy_process_group", dist.destroy_process_group)


def nonblocking_scenario(dev):
    init(dev)
    ctx = Ctx(dev)
    run("non-blocking: all_reduce sum float32 n=65537", tc.all_reduce, ctx, torch.float32, "sum", 65537)
    run("non-blocking: reduce_scatter avg bfloat16 n=333", tc.reduce_scatter, ctx, torch.bfloat16, "avg", 333)
    run("non-blocking: new_group beside the world", concurrent_groups, ctx)
    run("non-blocking: destroy_process_group", dist.destroy_process_group)


def missing_peer_scenario(dev, eager):
    """Rank 1 joins the store (and, if eager, makes the communicator) and then never calls a collective."""
    init(dev, eager=eager)
    if RANK != 0:
        if eager:
            time.sleep(float(os.environ.get("TORCH_SUITE_STUCK_S", "120")))
        os._exit(0)  # gone without a word: neither destroy nor abort
    case = "peer that never makes the communicator" if not eager else "peer that never calls the collective"
    limit = float(os.environ["TORCH_SUITE_ERROR_WITHIN_S"])
    t0 = time.monotonic()
    try:
        t = torch.ones(1000, device=dev)
        dist.all_reduce(t)
        sync()
        # a kernel that gave up on its peer (BRAID_TIMEOUT_S) ends; the communicator then fails every call
        dist.all_reduce(t)
        sync()
        report(case, False, time.monotonic() - t0, "the collectives returned without an error")
    except Exception as e:
        took = time.monotonic() - t0
        msg = str(e)
        ok = "rank 1" in msg and took <= limit
        report(case, ok, took, "" if ok else f"error after {took:.1f} s (limit {limit} s): {msg}")
    t0 = time.monotonic()
    try:
        dist.destroy_process_group()
    except Exception as e:  # the communicator failed; destroying it may say so, which is fine
        print(f"destroy_process_group after the failure: {type(e).__name__}: {e}", flush=True)
    took = time.monotonic() - t0
    report("destroy_process_group after the failure, within 10 s", took <= 10, took,
           "" if took <= 10 else f"took {took:.1f} s")


def main():
    if BACKEND == "nccl":
        dev = torch.device("cuda", RANK % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    scenarios = {
        "main": main_scenario,
        "lazy": lazy_scenario,
        "nonblocking": nonblocking_scenario,
        "absent": lambda d: missing_peer_scenario(d, eager=False),
        "stuck": lambda d: missing_peer_scenario(d, eager=True),
    }
    scenarios[SCENARIO](dev)
    print("@@ " + json.dumps({"rank": RANK, "done": True}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown, whose order of destructors is not what the suite checks


if __name__ == "__main__":
    main()
