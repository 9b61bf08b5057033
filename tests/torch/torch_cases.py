"""Checks of one rank of the PyTorch suite: every collective that torch.distributed maps to the NCCL backend, with
inputs every rank can regenerate from a seed and references computed independently in float64 on the CPU.

Used by torch_rank.py; each check raises CaseError (or any exception) when a result is wrong.
"""
import zlib

import torch
import torch.distributed as dist

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64, torch.uint8)
FP8 = tuple(t for t in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if t is not None)
# Unit roundoff of each float type, for the error bound of a sum of n terms.
EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float64: 2.0**-53}
for _t in FP8:
    EPS[_t] = 2.0**-3 if _t == torch.float8_e4m3fn else 2.0**-2


# PyTorch up to 2.11 hands NCCL a float32 PreMulSum factor for bfloat16 reductions, of which NCCL (and Braid,
# which reads the same two bytes) sees the low half (pytorch/pytorch#190745): such cases test PyTorch, not the
# library, and are left out there.
TORCH_BF16_PREMUL_BUG = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) <= (2, 11)


class CaseError(AssertionError):
    pass


def name_of(dtype):
    return str(dtype).replace("torch.", "")


def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


def make(parts, n, dtype, kind="any"):
    """n values of dtype that every rank derives alike from parts. kind: 'any', 'prod' (small magnitudes, so that
    products of up to 8 ranks stay exact for integers and well-conditioned for floats)."""
    g = torch.Generator().manual_seed(seed_of(*parts))
    if dtype in INTS:
        if dtype == torch.uint8:
            lo, hi = (0, 3) if kind == "prod" else (0, 32)
        else:
            lo, hi = (-2, 3) if kind == "prod" else (-1000, 1001)
        return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)
    if kind == "prod":
        x = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    else:
        x = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
    return x.to(dtype)


def poison(t):
    """Fills an output with a value no correct result has here: NaN for floats, the type's extreme for integers."""
    if t.dtype.is_floating_point and t.dtype not in FP8:
        t.fill_(float("nan"))
    elif t.dtype in FP8:
        t.view(torch.uint8).fill_(0x7F)  # NaN in e4m3fn, and NaN in e5m2
    else:
        t.fill_(torch.iinfo(t.dtype).max)
    return t


def compare(what, out, ref, dtype, terms=1, scale=None):
    """out (any device) against ref (float64 or int64 on the CPU). Integers must be equal; floats within the error
    of `terms` roundings of the type relative to scale (the sum of the operands' magnitudes), NaN never."""
    o = out.detach().to("cpu")
    if dtype in INTS:
        o = o.to(torch.int64)
        bad = o != ref.to(torch.int64)
    else:
        o = o.to(torch.float64)
        s = ref.abs() if scale is None else scale
        bound = (terms + 1) * EPS[dtype] * s + 1e-30
        # the reference is rounded to the type once more before the comparison
        bad = ~((o - ref).abs() <= bound + EPS[dtype] * ref.abs())
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise CaseError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements wrong, first at {i}: got {o[i].item()!r}, "
            f"expected {ref[i].item()!r}")


def reduce_ref(xs, op, dtype, factor=None):
    """The reduction of the ranks' inputs xs (a list, in rank order) in float64/int64, and the scale of its error."""
    if dtype in INTS:
        v = [x.to(torch.int64) for x in xs]
    else:
        v = [x.to(torch.float64) for x in xs]
    scale = sum(x.abs() for x in v) if dtype not in INTS else None
    if op == "sum":
        r = sum(v)
    elif op == "prod":
        r = v[0].clone()
        for x in v[1:]:
            r = r * x
        scale = r.abs() * len(v)
    elif op == "min":
        r = torch.stack(v).min(0).values
    elif op == "max":
        r = torch.stack(v).max(0).values
    elif op == "avg":
        r = sum(v)
        r = torch.div(r, len(v), rounding_mode="trunc") if dtype in INTS else r / len(v)
        if scale is not None:
            scale = scale / len(v)
    elif op == "premul":
        r = sum(x * factor for x in v)
        scale = sum((x * factor).abs() for x in v)
    else:
        raise ValueError(op)
    if op in ("min", "max"):
        scale = r.abs() if dtype not in INTS else None
    if dtype in INTS:
        r = r.to(dtype).to(torch.int64)  # integer arithmetic wraps around in the library as in the type
    return r, scale


def torch_op(op, factor=None):
    return {
        "sum": dist.ReduceOp.SUM,
        "prod": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "avg": dist.ReduceOp.AVG,
    }.get(op) or dist._make_nccl_premul_sum(factor)


def inputs(tag, world, n, dtype, kind="any"):
    return [make((tag, r, n, name_of(dtype)), n, dtype, kind) for r in range(world)]


def all_reduce(ctx, dtype, op, n):
    xs = inputs("ar", ctx.world, n, dtype, "prod" if op == "prod" else "any")
    factor = 0.75 if op == "premul" else None
    t = xs[ctx.rank].to(ctx.dev, copy=True)
    dist.all_reduce(t, op=torch_op(op, factor), group=ctx.group)
    ref, scale = reduce_ref(xs, op, dtype, factor)
    compare(f"all_reduce {op} {name_of(dtype)} n={n}", t, ref, dtype, terms=ctx.world, scale=scale)


def broadcast(ctx, dtype, n, root):
    x = make(("bc", root, n, name_of(dtype)), n, dtype)
    t = x.to(ctx.dev) if ctx.rank == root else poison(torch.empty(n, dtype=dtype, device=ctx.dev))
    dist.broadcast(t, src=root, group=ctx.group)
    exact(f"broadcast root {root} {name_of(dtype)} n={n}", t, x)


def exact(what, out, ref):
    """Byte-for-byte comparison, for collectives that only move data."""
    o = out.detach().to("cpu").contiguous().view(torch.uint8)
    r = ref.contiguous().view(torch.uint8)
    if o.shape != r.shape or not torch.equal(o, r):
        bad = (o != r).nonzero() if o.shape == r.shape else None
        where = f", first wrong byte {int(bad[0])} of {r.numel()}" if bad is not None and len(bad) else ""
        raise CaseError(f"{what}: output differs from the expected bytes{where}")


def reduce(ctx, dtype, op, n, root):
    xs = inputs("rd", ctx.world, n, dtype, "prod" if op == "prod" else "any")
    t = xs[ctx.rank].to(ctx.dev, copy=True)
    dist.reduce(t, dst=root, op=torch_op(op), group=ctx.group)
    if ctx.rank == root:
        ref, scale = reduce_ref(xs, op, dtype)
        compare(f"reduce {op} root {root} {name_of(dtype)} n={n}", t, ref, dtype, terms=ctx.world, scale=scale)


def all_gather(ctx, dtype, n, in_place=False):
    xs = inputs("ag", ctx.world, n, dtype)
    out = poison(torch.empty(n * ctx.world, dtype=dtype, device=ctx.dev))
    if in_place:
        out[ctx.rank * n:(ctx.rank + 1) * n].copy_(xs[ctx.rank].to(ctx.dev))
        src = out[ctx.rank * n:(ctx.rank + 1) * n]
    else:
        src = xs[ctx.rank].to(ctx.dev)
    dist.all_gather_into_tensor(out, src, group=ctx.group)
    exact(f"all_gather_into_tensor {'in place ' if in_place else ''}{name_of(dtype)} n={n}", out, torch.cat(xs))


def reduce_scatter(ctx, dtype, op, n):
    xs = inputs("rs", ctx.world, n * ctx.world, dtype, "prod" if op == "prod" else "any")
    out = poison(torch.empty(n, dtype=dtype, device=ctx.dev))
    dist.reduce_scatter_tensor(out, xs[ctx.rank].to(ctx.dev), op=torch_op(op), group=ctx.group)
    ref, scale = reduce_ref(xs, op, dtype)
    part = slice(ctx.rank * n, (ctx.rank + 1) * n)
    compare(f"reduce_scatter_tensor {op} {name_of(dtype)} n={n}", out, ref[part], dtype, terms=ctx.world,
            scale=None if scale is None else scale[part])


def split_sizes(tag, world, src, n):
    """How many elements rank src sends to each rank: uneven, some empty."""
    g = torch.Generator().manual_seed(seed_of(tag, src, n))
    return [int(v) for v in torch.randint(0, n + 1, (world,), generator=g)]


def all_to_all(ctx, dtype, n, uneven):
    w, r = ctx.world, ctx.rank
    if uneven:
        sizes = [split_sizes("a2a", w, s, n) for s in range(w)]  # sizes[s][d]: from s to d
    else:
        sizes = [[n] * w for _ in range(w)]
    xs = [make(("a2a", s, n, uneven, name_of(dtype)), sum(sizes[s]), dtype) for s in range(w)]
    recv = [sizes[s][r] for s in range(w)]
    out = poison(torch.empty(sum(recv), dtype=dtype, device=ctx.dev))
    dist.all_to_all_single(out, xs[r].to(ctx.dev), output_split_sizes=recv if uneven else None,
                           input_split_sizes=sizes[r] if uneven else None, group=ctx.group)
    ref = torch.cat([xs[s][sum(sizes[s][:r]):sum(sizes[s][:r + 1])] for s in range(w)])
    exact(f"all_to_all_single {'uneven' if uneven else 'even'} {name_of(dtype)} n={n}", out, ref)


def gather(ctx, dtype, n, root):
    xs = inputs("ga", ctx.world, n, dtype)
    outs = [poison(torch.empty(n, dtype=dtype, device=ctx.dev)) for _ in range(ctx.world)] if ctx.rank == root else None
    dist.gather(xs[ctx.rank].to(ctx.dev), gather_list=outs, dst=root, group=ctx.group)
    if ctx.rank == root:
        exact(f"gather root {root} {name_of(dtype)} n={n}", torch.cat(outs), torch.cat(xs))


def scatter(ctx, dtype, n, root):
    xs = inputs("sc", ctx.world, n, dtype)
    out = poison(torch.empty(n, dtype=dtype, device=ctx.dev))
    dist.scatter(out, scatter_list=[x.to(ctx.dev) for x in xs] if ctx.rank == root else None, src=root,
                 group=ctx.group)
    exact(f"scatter root {root} {name_of(dtype)} n={n}", out, xs[ctx.rank])


def send_recv_ring(ctx, dtype, sizes):
    """batch_isend_irecv: every rank sends len(sizes) messages to the next rank and receives as many from the previous
    one, in one batch (a group of sends and receives)."""
    w, r = ctx.world, ctx.rank
    nxt, prv = (r + 1) % w, (r - 1) % w
    mine = [make(("p2p", r, i, n, name_of(dtype)), n, dtype) for i, n in enumerate(sizes)]
    theirs = [make(("p2p", prv, i, n, name_of(dtype)), n, dtype) for i, n in enumerate(sizes)]
    outs = [poison(torch.empty(n, dtype=dtype, device=ctx.dev)) for n in sizes]
    ops = [dist.P2POp(dist.isend, x.to(ctx.dev), ctx.peer(nxt), group=ctx.group) for x in mine]
    ops += [dist.P2POp(dist.irecv, o, ctx.peer(prv), group=ctx.group) for o in outs]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for i, (o, x) in enumerate(zip(outs, theirs)):
        exact(f"batch_isend_irecv message {i} of {len(sizes)} from rank {prv} n={sizes[i]} {name_of(dtype)}", o, x)
