"""Model-level checks of the PyTorch suite: DDP and FSDP2 against a single-process reference, and CUDA graphs that
captured a collective replayed among many eager ones (the work-queue leak that hung NCCL jobs)."""
import torch
import torch.distributed as dist
import torch.nn as nn

import torch_cases as tc

STEPS, BATCH, DIN, DHID, DOUT = 3, 8, 32, 64, 8


def net():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(DIN, DHID), nn.ReLU(), nn.Linear(DHID, DHID), nn.ReLU(), nn.Linear(DHID, DOUT))


def batch(step, r, dev):
    g = torch.Generator().manual_seed(tc.seed_of("batch", step, r))
    return torch.randn(BATCH, DIN, generator=g).to(dev), torch.randn(BATCH, DOUT, generator=g).to(dev)


def reference(ctx):
    """The same model trained in this process alone on every rank's batches at once: with equal batches the mean
    loss over all of them has the gradient that data parallelism averages."""
    model = net().to(ctx.dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        xs, ys = zip(*(batch(step, r, ctx.dev) for r in range(ctx.world)))
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def compare_params(what, got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        err = (g.double() - w.double()).abs().max().item()
        if not err <= 1e-5 + 1e-4 * w.abs().max().item():
            raise tc.CaseError(f"{what}: parameter {i} differs from the single-process reference by {err:g}")


def train(model, ctx):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step, ctx.rank, ctx.dev)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def ddp_check(ctx):
    ids = [ctx.dev.index] if ctx.dev.type == "cuda" else None
    model = nn.parallel.DistributedDataParallel(net().to(ctx.dev), device_ids=ids)
    train(model, ctx)
    compare_params("DDP", [p.detach() for p in model.module.parameters()], reference(ctx))


def fsdp_check(ctx):
    from torch.distributed.fsdp import fully_shard

    model = net().to(ctx.dev)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    train(model, ctx)
    compare_params("FSDP2", [p.full_tensor().detach() for p in model.parameters()], reference(ctx))


def graph_mix(ctx, eager, holder):
    """Captures an all-reduce into a CUDA graph, then runs `eager` eager all-reduces with a replay after every 100,
    and checks every replay's and every 100th eager call's result at the end (nothing waits in between)."""
    w, r = ctx.world, ctx.rank
    g = torch.zeros(1024, device=ctx.dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dist.all_reduce(g)  # warm-up on the capturing stream, as torch's graph docs ask
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(g)
    holder.append(graph)
    e = torch.empty(8, device=ctx.dev)
    nrep = eager // 100
    replays = torch.empty(nrep, 1024, device=ctx.dev)
    eagers = torch.empty(nrep, 8, device=ctx.dev)
    for i in range(eager):
        e.fill_(float(i % 7 + r))
        dist.all_reduce(e)
        if i % 100 == 99:
            j = i // 100
            eagers[j].copy_(e)
            g.fill_(float(j % 5 + 2 * r))
            graph.replay()
            replays[j].copy_(g)
    torch.cuda.synchronize()
    for j in range(nrep):
        want_e = float(w * ((100 * j + 99) % 7) + sum(range(w)))
        want_g = float(w * (j % 5) + 2 * sum(range(w)))
        if not torch.all(eagers[j] == want_e):
            raise tc.CaseError(f"eager all_reduce {100 * j + 99}: got {eagers[j][0].item()}, expected {want_e}")
        if not torch.all(replays[j] == want_g):
            raise tc.CaseError(f"graph replay {j}: got {replays[j][0].item()}, expected {want_g}")
