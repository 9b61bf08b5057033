#!/usr/bin/env python3
"""The PyTorch suite: torch.distributed's NCCL backend on Braid (or on another libnccl.so.2), with 1, 2 and 4 ranks
as processes; ranks share GPUs where there are fewer GPUs than ranks.

  run_torch_suite.py [--lib PATH] [--ranks 1,2,4] [--scenarios main,lazy,nonblocking,absent,stuck] [--out DIR]

--lib: the libnccl.so.2 to put under PyTorch with LD_PRELOAD (PyTorch finds its own NCCL through a DT_RPATH that
beats LD_LIBRARY_PATH); without it the suite runs on PyTorch's own NCCL, which refuses ranks that share a GPU, so
only worlds of at most one rank per GPU run. Writes DIR/torch-suite.tsv (scenario, ranks, case, verdict, seconds,
error) and a log per rank; prints a summary; exits 1 if a case failed or a rank did not finish.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# scenario -> (world sizes it runs at, seconds a rank may take, extra environment)
SCENARIOS = {
    "main": (None, 900, {}),
    "lazy": ([2], 120, {}),
    "nonblocking": ([2], 120, {"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"}),
    "absent": ([2], 120, {"BRAID_BOOTSTRAP_TIMEOUT_S": "15", "TORCH_SUITE_ERROR_WITHIN_S": "40"}),
    # torch's watchdog would end the process on the error it reads too: here the calls must report it
    "stuck": ([2], 120, {"BRAID_TIMEOUT_S": "10", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
                         "TORCH_SUITE_ERROR_WITHIN_S": "40", "TORCH_SUITE_STUCK_S": "60"}),
}
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_count():
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, env={**os.environ, **SAFE_ENV})
    return int(out.stdout.strip() or 0)


def run_world(scenario, world, args, ngpus):
    sizes, limit, extra = SCENARIOS[scenario]
    # a hang is logged with what the library waits for once BRAID_TIMEOUT_S passes: keep that under torch's
    # collective timeout (120 s, torch_rank.py), which would abort the ranks first
    env = {"BRAID_TIMEOUT_S": "60", "NCCL_DEBUG": "WARN", **os.environ, **SAFE_ENV, **extra,
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "SCENARIO": scenario, "PYTHONPATH": HERE}
    if world > ngpus:
        env["TORCH_SUITE_SMALL"] = "1"
    if args.lib:
        env["LD_PRELOAD"] = os.path.abspath(args.lib)
    procs, logs = [], []
    for r in range(world):
        log = open(os.path.join(args.out, f"{scenario}-{world}-rank{r}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "torch_rank.py")],
                                      env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=log,
                                      stderr=subprocess.STDOUT))
        logs.append(log)
    deadline = time.monotonic() + limit
    for p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    timed_out = [r for r, p in enumerate(procs) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for log in logs:
        log.close()
    return collect(scenario, world, args, [p.returncode for p in procs], timed_out)


def collect(scenario, world, args, codes, timed_out):
    rows, done = [], set()
    for r in range(world):
        with open(os.path.join(args.out, f"{scenario}-{world}-rank{r}.log")) as f:
            for line in f:
                if not line.startswith("@@ "):
                    continue
                rec = json.loads(line[3:])
                if rec.get("done"):
                    done.add(r)
                    continue
                rows.append((scenario, world, r, rec["case"], "pass" if rec["ok"] else "FAIL", rec["secs"],
                             rec["error"].replace("\t", " ").replace("\n", " | ")))
    # a rank that must finish and did not is a failure of its own (a hang or a crash)
    must = range(world) if scenario not in ("absent", "stuck") else [0]
    for r in must:
        if r not in done:
            why = "timed out" if r in timed_out else f"exit status {codes[r]}"
            rows.append((scenario, world, r, "rank finished", "FAIL", 0, f"rank {r} did not finish: {why}"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--out", default="torch-suite-out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    ngpus = gpu_count() if os.environ.get("TORCH_SUITE_BACKEND", "nccl") == "nccl" else 64
    if ngpus == 0:
        print("no GPU: the PyTorch suite needs one")
        return 77
    rows = []
    for scenario in args.scenarios.split(","):
        sizes = SCENARIOS[scenario][0] or [int(n) for n in args.ranks.split(",")]
        for world in sizes:
            if world > ngpus and not args.lib:
                print(f"{scenario} with {world} ranks: skipped (PyTorch's own NCCL refuses ranks sharing a GPU)")
                continue
            t0 = time.monotonic()
            got = run_world(scenario, world, args, ngpus)
            fails = [x for x in got if x[4] != "pass"]
            print(f"{scenario:12s} {world} ranks: {len(got) - len(fails)} passed, {len(fails)} failed "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            for x in fails[:10]:
                print(f"  FAIL rank {x[2]} {x[3]}: {x[6][:300]}")
            rows += got
    with open(os.path.join(args.out, "torch-suite.tsv"), "w") as f:
        f.write("scenario\tranks\trank\tcase\tverdict\tseconds\terror\n")
        for x in rows:
            f.write("\t".join(str(v) for v in x) + "\n")
    nfail = sum(1 for x in rows if x[4] != "pass")
    print(f"PyTorch suite: {len(rows) - nfail} passed, {nfail} failed")
    return 1 if nfail else 0


if __name__ == "__main__":
    sys.exit(main())
