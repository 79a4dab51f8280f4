"""Horovod's alltoall, reducescatter, grouped allgather, sparse allreduce, the gradients of the
differentiable collectives, and the optimizer's sparse and state handling, on real gloo processes.

One launch per world size runs the whole table (each launch costs seconds): the script writes what
every case gave, and the test computes what each rank should have got by hand, from the same
inputs (`INPUTS`, run by both). Gradients are compared with a single-process autograd reference
scaled by Horovod's conventions for each op.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tests.integration.test_horovod import launch, write

# Inputs both the script and the test build: each is a function of the rank and world size only.
INPUTS = """
import torch

INT_DTYPES = ["uint8", "int8", "int16", "int32", "int64"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
GATHER_DTYPES = INT_DTYPES + FLOAT_DTYPES + ["bool"]
REDUCE_DTYPES = ["int16", "int32", "int64"] + FLOAT_DTYPES


def rows(r, k):
    # Rows rank r sends rank k in alltoall: uneven, zero for some pairs.
    return (r + 2 * k) % 3


def alltoall_input(r, n, dtype):
    # To each k in turn: rows(r, k) rows of [10r + k, 10r + k + 50] (bool: parity); rank 0 adds a
    # row past the splits, which is not sent.
    parts = [[10 * r + k, 10 * r + k + 50] for k in range(n) for _ in range(rows(r, k))]
    if r == 0:
        parts.append([99, 99])
    t = torch.tensor(parts, dtype=torch.int64).reshape(-1, 2)
    return (t % 2 == 1) if dtype == "bool" else t.to(getattr(torch, dtype))


def even_input(r, n, dtype):
    # Two rows for every rank: row j holds 10r + j.
    t = torch.tensor([10 * r + j for j in range(2 * n)], dtype=torch.int64)
    return (t % 2 == 1) if dtype == "bool" else t.to(getattr(torch, dtype))


def reduce_input(r, n, dtype, length):
    # 2 (r + 1) (i + c + 1): the sum over ranks divides by n, so Average is exact in every dtype.
    i = torch.arange(length).reshape(-1, 1)
    c = torch.arange(2).reshape(1, -1)
    return (2 * (r + 1) * (i + c + 1)).to(getattr(torch, dtype))


def grad_input(r, op, n):
    # Float64 inputs for the gradient cases.
    shapes = {
        "allgather": (r + 1, 2),
        "broadcast": (3,),
        "allreduce_sum": (2, 2),
        "allreduce_average": (2, 2),
        "reducescatter_sum": (2 * n + 1, 2),
        "reducescatter_average": (2 * n + 1, 2),
        "alltoall": (sum(rows(r, k) for k in range(n)), 2),
    }
    numel = 1
    for s in shapes[op]:
        numel *= s
    return (torch.arange(numel, dtype=torch.float64).reshape(shapes[op]) + 1) * (r + 2) / 3


def bn_rows(n):
    # SyncBatchNorm: rank r normalizes r + 2 rows of one batch (uneven, so counts matter).
    starts = [sum(k + 2 for k in range(r)) for r in range(n)]
    return [slice(s, s + r + 2) for r, s in enumerate(starts)]


def bn_input(n, tail):
    g = torch.Generator().manual_seed(3)
    return torch.randn(sum(r + 2 for r in range(n)), 3, *tail, generator=g, dtype=torch.float64)


def bn_module(bn):
    # Weight and bias away from 1 and 0, so that their gradients and effect show.
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return bn.double()


def view_base(r, dtype):
    # The tensor whose views the in-place collectives work on: 3 x 3, (r + 1) x its index.
    return (torch.arange(9).reshape(3, 3) * (r + 1)).to(getattr(torch, dtype))


def set_input(r):
    return torch.arange(6, dtype=torch.float32).reshape(3, 2) + 10 * r


def weight(r, shape):
    numel = 1
    for s in shape:
        numel *= s
    return ((torch.arange(numel) % 5 + 1 + r).reshape(shape)).to(torch.float64)


OPTIMIZER_CASES = ["closure-sgd", "closure-lbfgs", "unfreeze", "add-group", "freeze-adamw", "listed-twice"]


def optimizer_case(kind, wrap, r, n, world):
    # Three steps of `kind` on rank r's rows (r::n) of one float64 batch of 4 rows per process of
    # `world`; `wrap` makes the DistributedOptimizer (None: the whole batch in one process, r=0,
    # n=1). Returns the weights after each step and the losses the closures returned.
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(4 * world, 4, generator=g).double(), torch.randn(4 * world, 1, generator=g).double()
    x, y = x[r::n], y[r::n]
    torch.manual_seed(6)
    first, last = torch.nn.Linear(4, 3).double(), torch.nn.Linear(3, 1).double()
    model = torch.nn.Sequential(first, torch.nn.Tanh(), last)
    params = list(model.parameters())
    if kind == "closure-lbfgs":
        opt = torch.optim.LBFGS(params, lr=0.5, max_iter=4, history_size=3)
    elif kind == "freeze-adamw":
        opt = torch.optim.AdamW(params, lr=0.05, weight_decay=0.5)
    elif kind == "unfreeze":
        first.requires_grad_(False)
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    elif kind == "add-group":
        opt = torch.optim.SGD(last.parameters(), lr=0.1, momentum=0.9)
    elif kind == "listed-twice":
        import warnings

        warnings.simplefilter("ignore")  # torch's own warning of the duplicate
        opt = torch.optim.SGD(params + [first.weight], lr=0.1)
    else:
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if wrap is not None:
        opt = wrap(opt)
    weights, losses = [], []

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for step in range(3):
        if step == 1 and kind == "unfreeze":
            first.requires_grad_(True)
        if step == 1 and kind == "add-group":
            opt.add_param_group({"params": first.parameters()})
        if step == 1 and kind == "freeze-adamw":
            first.requires_grad_(False)
        if kind == "closure-lbfgs":  # the loss LBFGS decides on: averaged over the processes
            losses.append(float(opt.step(closure).detach()))
        elif kind.startswith("closure"):
            opt.step(closure)
        else:
            closure()
            opt.step()
        weights.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist())
    return {"weights": weights, "losses": losses}
"""

SCRIPT = """
import json, sys, traceback
import torch
import horovod.torch as hvd
from inputs import *

hvd.init()
r, n = hvd.rank(), hvd.size()
out = {}


def record(key, fn):
    try:
        out[key] = fn()
    except Exception as e:
        out[key] = {"error": type(e).__name__, "message": str(e)}


def lst(t):
    return t.to(torch.float64).tolist() if t.dtype != torch.bool else t.tolist()


splits = [rows(r, k) for k in range(n)]
for dtype in GATHER_DTYPES:
    x = alltoall_input(r, n, dtype)
    def a2a(x=x):
        got, received = hvd.alltoall(x, splits=splits)
        return [lst(got), received.tolist(), str(received.dtype), str(got.dtype)]
    record(f"alltoall-{dtype}", a2a)
    record(
        f"alltoall-tensor-splits-{dtype}",
        lambda x=x: [lst(t) for t in hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int32))],
    )
    record(f"alltoall-even-{dtype}", lambda dtype=dtype: lst(hvd.alltoall(even_input(r, n, dtype))))
    record(
        f"alltoall-async-{dtype}",
        lambda dtype=dtype: [lst(t) for t in hvd.synchronize(hvd.alltoall_async(even_input(r, n, dtype)))],
    )
    record(
        f"grouped_allgather-{dtype}",
        lambda x=x, dtype=dtype: [lst(t) for t in hvd.grouped_allgather([x, even_input(r, n, dtype)])],
    )
    record(
        f"grouped_allgather_async-{dtype}",
        lambda x=x: [lst(t) for t in hvd.synchronize(hvd.grouped_allgather_async([x, x[:1]]))],
    )

for dtype in REDUCE_DTYPES:
    for length in (2 * n, 2 * n + 1):
        x = reduce_input(r, n, dtype, length)
        record(f"reducescatter-sum-{dtype}-{length}", lambda x=x: lst(hvd.reducescatter(x, op=hvd.Sum)))
        record(f"reducescatter-average-{dtype}-{length}", lambda x=x: lst(hvd.reducescatter(x)))
        record(
            f"reducescatter-async-{dtype}-{length}",
            lambda x=x: lst(hvd.synchronize(hvd.reducescatter_async(x, op=hvd.Sum))),
        )
    y = reduce_input(r, n, dtype, 3 * n + 2)
    record(
        f"grouped_reducescatter-{dtype}",
        lambda x=x, y=y: [lst(t) for t in hvd.grouped_reducescatter([x, y], op=hvd.Sum)],
    )
    record(
        f"grouped_reducescatter_async-{dtype}",
        lambda x=x, y=y: [lst(t) for t in hvd.synchronize(hvd.grouped_reducescatter_async([x, y]))],
    )

x = reduce_input(r, n, "float32", 2 * n + 1)
record("reducescatter-scaled", lambda: lst(hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2, postscale_factor=0.25)))


def fp16():
    got = hvd.reducescatter(x, compression=hvd.Compression.fp16)
    return [lst(got), str(got.dtype)]


record("reducescatter-fp16", fp16)
record(
    "grouped_allreduce_async",
    lambda: [lst(t) for t in hvd.synchronize(hvd.grouped_allreduce_async([x, 2 * x], op=hvd.Sum))],
)
z = [x.clone(), 3 * x.clone()]


def in_place():
    results = hvd.synchronize(hvd.grouped_allreduce_async_(z, op=hvd.Sum))
    return [results[1] is z[1], lst(z[0]), lst(z[1])]


record("grouped_allreduce_async_", in_place)


# In place on views with gaps (a column, every other element): only the view's elements change.
def on_views(dtype):
    views = {"column": lambda b: b[:, 1], "strided": lambda b: b.view(-1)[::2]}
    calls = {
        "allreduce_": lambda v: hvd.allreduce_(v, op=hvd.Sum),
        "allreduce_async_": lambda v: hvd.synchronize(hvd.allreduce_async_(v, op=hvd.Sum)),
        "grouped_allreduce_": lambda v: hvd.grouped_allreduce_([v], op=hvd.Sum),
        "broadcast_": lambda v: hvd.broadcast_(v, root_rank=n - 1),
        "broadcast_async_": lambda v: hvd.synchronize(hvd.broadcast_async_(v, root_rank=n - 1)),
    }
    got = {}
    for view, pick in views.items():
        for call, fn in calls.items():
            base = view_base(r, dtype)
            fn(pick(base))
            got[f"{call}-{view}"] = lst(base)
    return got


for dtype in ("int16", "float32"):
    record(f"in-place-views-{dtype}", lambda dtype=dtype: on_views(dtype))

# Sparse: rank r holds rows r and r + 1 of a 5 x 2 tensor; Average divides by n.
dense = torch.zeros(5, 2)
dense[r] = torch.tensor([1.0, 2.0]) * (r + 1)
dense[r + 1] = torch.tensor([10.0, 20.0])
for op in ("Sum", "Average"):
    def sparse(op=op):
        got = hvd.sparse_allreduce_async(dense.to_sparse(1), f"sp{op}", getattr(hvd, op))()
        return [lst(got.to_dense()), got.is_sparse]
    record(f"sparse-{op}", sparse)

# Every rank raises, and the job goes on (nothing was sent).
errors = {
    "alltoall-uneven": lambda: hvd.alltoall(torch.zeros(n + 1)),
    "alltoall-splits-sum": lambda: hvd.alltoall(torch.zeros(1), splits=[1] * n),
    "alltoall-splits-count": lambda: hvd.alltoall(torch.zeros(4 * n), splits=[1] * (n + 1)),
    "alltoall-splits-dtype": lambda: hvd.alltoall(torch.zeros(n), splits=torch.ones(n)),
    "alltoall-splits-2d": lambda: hvd.alltoall(torch.zeros(n), splits=torch.ones(n, 1, dtype=torch.int32)),
    "alltoall-scalar": lambda: hvd.alltoall(torch.tensor(1.0)),
    "reducescatter-max": lambda: hvd.reducescatter(torch.ones(n), op=hvd.Max),
    "reducescatter-scalar": lambda: hvd.reducescatter(torch.tensor(1.0)),
    "sparse-dense": lambda: hvd.sparse_allreduce_async(torch.ones(2), "d", hvd.Sum),
    # The ranks disagree: every rank raises, none hangs.
    "mismatch-reducescatter-shape": lambda: hvd.reducescatter(torch.ones(2 * n + r)),
    "mismatch-reducescatter-dtype": lambda: hvd.reducescatter(torch.ones(n, dtype=[torch.float32, torch.int32][r % 2])),
    "mismatch-reducescatter-op": lambda: hvd.reducescatter(torch.ones(n), op=hvd.Sum if r else hvd.Average),
    "mismatch-reducescatter-scale": lambda: hvd.reducescatter(torch.ones(n), prescale_factor=1.0 + r),
    "mismatch-alltoall-shape": lambda: hvd.alltoall(torch.ones(n, 1 + r)),
    "mismatch-alltoall-dtype": lambda: hvd.alltoall(torch.ones(n, dtype=torch.int64 if r else torch.float32)),
    "mismatch-alltoall-vs-allgather": lambda: hvd.alltoall(torch.ones(n)) if r else hvd.allgather(torch.ones(n)),
}
for key, fn in errors.items():
    record("error-" + key, fn)
record("after-errors", lambda: lst(hvd.allreduce(torch.ones(1), op=hvd.Sum)))

# Gradients: the loss is (output * weight(r)).sum() on every rank.
def grad_case(op):
    x = grad_input(r, op, n).requires_grad_()
    if op == "allgather":
        y = hvd.allgather(x)
    elif op == "broadcast":
        y = hvd.broadcast(x, root_rank=n - 1)
    elif op.startswith("allreduce"):
        y = hvd.allreduce(x, op=hvd.Sum if op.endswith("sum") else hvd.Average)
    elif op.startswith("reducescatter"):
        reduce_op = hvd.Sum if op.endswith("sum") else hvd.Average
        y = hvd.reducescatter(x, op=reduce_op, prescale_factor=2.0, postscale_factor=0.5)
    else:
        y, _ = hvd.alltoall(x, splits=splits)
    (y * weight(r, y.shape)).sum().backward()
    return [lst(y.detach()), lst(x.grad)]

GRAD_OPS = ["allgather", "broadcast", "allreduce_sum", "allreduce_average"]
for op in GRAD_OPS + ["reducescatter_sum", "reducescatter_average", "alltoall"]:
    record(f"grad-{op}", lambda op=op: grad_case(op))

# grouped_allgather's gradient flows to each input.
def grouped_grad():
    a = grad_input(r, "allgather", n).requires_grad_()
    b = (2 * grad_input(r, "allgather", n)).detach().requires_grad_()
    ga, gb = hvd.grouped_allgather([a, b])
    ((ga * weight(r, ga.shape)).sum() + 3 * (gb * weight(r, gb.shape)).sum()).backward()
    return [lst(a.grad), lst(b.grad)]
record("grad-grouped_allgather", grouped_grad)


# grouped_reducescatter's too (no scale factors: the single-op case's 2 * 0.5 is the same).
def grouped_rs_grad():
    a = grad_input(r, "reducescatter_sum", n).requires_grad_()
    b = (3 * grad_input(r, "reducescatter_sum", n)).detach().requires_grad_()
    ya, yb = hvd.grouped_reducescatter([a, b], op=hvd.Sum)
    ((ya * weight(r, ya.shape)).sum() + 2 * (yb * weight(r, yb.shape)).sum()).backward()
    return [lst(a.grad), lst(b.grad)]


record("grad-grouped_reducescatter", grouped_rs_grad)

# SyncBatchNorm over every rank's rows, (N, C) and (N, C, H, W).
def sync_bn(tail):
    x = bn_input(n, tail)[bn_rows(n)[r]].clone().requires_grad_()
    bn = bn_module(hvd.SyncBatchNorm(3, momentum=0.3))
    y = bn(x)
    (y * weight(r, y.shape)).sum().backward()
    grads = [hvd.allreduce(g, op=hvd.Sum) for g in (bn.weight.grad, bn.bias.grad)]
    stats = [bn.running_mean, bn.running_var]
    return [lst(t) for t in [y.detach(), x.grad, *grads, *stats]] + [int(bn.num_batches_tracked)]


# The new collectives on a process set of the first and last rank (the others sit it out).
members = [0, n - 1]
# (With two ranks that is everyone: Horovod refuses a duplicate of the global set.)
ps = hvd.add_process_set(members) if n > 2 else hvd.global_process_set
if r in members:
    m = members.index(r)
    x = set_input(r)
    got, received = hvd.alltoall(x, splits=[1, 2] if m == 0 else [2, 1], process_set=ps)
    parts = [got, received, hvd.reducescatter(x, op=hvd.Sum, process_set=ps)]
    parts += hvd.grouped_allgather([x[: m + 1]], process_set=ps)
    parts.append(hvd.sparse_allreduce_async(x.to_sparse(1), "ps", hvd.Average, process_set=ps)().to_dense())
    out["set"] = [lst(t) for t in parts]
hvd.barrier()

# A timeline of a few collectives: rank 0 writes it, the others write nothing.
hvd.start_timeline(f"{sys.argv[1]}/timeline-rank{r}.json", mark_cycles=True)
hvd.allreduce(torch.ones(2))
hvd.broadcast(torch.ones(2), root_rank=0)
hvd.stop_timeline()
hvd.stop_timeline()  # nothing is recording: nothing happens

record("syncbn-2d", lambda: sync_bn(()))


def sync_bn_half():
    # float16 input, float32 module (as under autocast): float16 out, float32 statistics.
    x = bn_input(n, ())[bn_rows(n)[r]].half()
    bn = bn_module(hvd.SyncBatchNorm(3, momentum=0.3)).float()
    y = bn(x)
    return [str(y.dtype), lst(y), lst(bn.running_mean)]


record("syncbn-half", sync_bn_half)
record("syncbn-4d", lambda: sync_bn((2, 2)))


# Parameter names without named_parameters, as Horovod makes them.
p = [torch.nn.Parameter(torch.ones(1)) for _ in range(3)]
opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": p[:2]}, {"params": p[2:]}], lr=0.1))
out["names"] = [opt._parameter_names[q] for q in p]

# broadcast_optimizer_state on optimizers whose state is still empty: a zero-gradient step fills it.
def filled(make_opt, model):
    opt = make_opt(model)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    state = opt.state_dict()["state"]
    steps = [float(v["step"]) for v in state.values() if "step" in v]
    return {str(k): sorted(v) for k, v in state.items()} | {"step": steps}

torch.manual_seed(0)
lin = torch.nn.Linear(2, 2)
emb = torch.nn.Embedding(4, 2, sparse=True)
record("fill-adam", lambda: filled(lambda m: hvd.DistributedOptimizer(torch.optim.Adam(m.parameters())), lin))
record("fill-sparseadam", lambda: filled(lambda m: torch.optim.SparseAdam(list(m.parameters()), lr=0.1), emb))
record("fill-sgd-sparse", lambda: filled(lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), emb))


# Horovod's resume order with weight decay: root alone loaded its optimizer's state (it took a
# step here), the others fill theirs; the replicas stay equal.
def resumed_with_decay(make_opt):
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    opt = make_opt(model.parameters())
    if r == 0:
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    return lst(hvd.allgather(flat.reshape(1, -1)))


record("resume-adamw", lambda: resumed_with_decay(lambda ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.5)))
record("resume-sgd", lambda: resumed_with_decay(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.5)))

# A sparse-embedding model trained with SparseAdam: every rank's slice of the batch.
def sparse_train(sparse_as_dense):
    torch.manual_seed(1)
    model = torch.nn.Embedding(12, 3, sparse=True)
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.05)
    opt = hvd.DistributedOptimizer(opt, sparse_as_dense=sparse_as_dense)
    g = torch.Generator().manual_seed(2)
    for step in range(5):
        idx = torch.randint(0, 12, (4 * n, 3), generator=g)
        target = torch.randn(4 * n, 3, generator=g)
        mine = slice(4 * r, 4 * r + 4)
        loss = ((model(idx[mine]).sum(1) - target[mine]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert model.weight.grad.is_sparse
    return model.weight.detach().tolist()

record("sparse-train-dense", lambda: sparse_train(True))
for kind in OPTIMIZER_CASES:
    record(kind, lambda: optimizer_case(kind, hvd.DistributedOptimizer, r, n, n))


# A closure that calls no backward of its own, its gradients reduced before the step (by step()
# or by hand, then inside skip_synchronize): reduced once, under Sum as under Average.
def closure_without_backward(by_hand):
    w = torch.nn.Parameter(torch.zeros(1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), op=hvd.Sum)
    loss = ((r + 1) * w).sum()
    loss.backward()
    if by_hand:
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step(lambda: loss)
    else:
        opt.step(lambda: loss)
    return w.item()


record("closure-no-backward", lambda: [closure_without_backward(False), closure_without_backward(True)])
record("sparse-train-sparse", lambda: sparse_train(False))

json.dump(out, open(f"{sys.argv[1]}/rank{r}.json", "w"))
"""


# --- what each rank should get, by hand ------------------------------------------------------


def _inputs() -> dict:
    scope: dict = {}
    exec(INPUTS, scope)  # noqa: S102 - the inputs module the script imports, run here too
    return scope


def _f(values) -> list:
    return torch.tensor(values, dtype=torch.float64).tolist()


def expected_alltoall(k: int, n: int, rows, dtype: str) -> tuple[list, list]:
    got = []
    for r in range(n):
        v = [10 * r + k, 10 * r + k + 50]
        got += [[(x % 2 == 1) for x in v] if dtype == "bool" else [float(x) for x in v]] * rows(r, k)
    return got, [rows(r, k) for r in range(n)]


def expected_even(k: int, n: int, dtype: str) -> list:
    vals = [10 * r + j for r in range(n) for j in (2 * k, 2 * k + 1)]
    return [(v % 2 == 1) for v in vals] if dtype == "bool" else [float(v) for v in vals]


def block(k: int, n: int, length: int) -> range:
    sizes = [length // n + (1 if r < length % n else 0) for r in range(n)]
    start = sum(sizes[:k])
    return range(start, start + sizes[k])


def expected_reducescatter(k: int, n: int, length: int, average: bool, scale: float = 1.0) -> list:
    # sum over ranks of 2 (r + 1)(i + c + 1) = n (n + 1)(i + c + 1)
    return [[n * (n + 1) * (i + c + 1) * scale / (n if average else 1) for c in range(2)] for i in block(k, n, length)]


def reference_outputs(op: str, xs: list[torch.Tensor], n: int, rows) -> list[torch.Tensor]:
    """Each rank's output of `op`, computed in one process from every rank's input."""
    if op == "allgather":
        return [torch.cat(xs)] * n
    if op == "broadcast":
        return [xs[n - 1]] * n
    if op.startswith("allreduce"):
        total = sum(xs)
        return [total / n if op.endswith("average") else total] * n
    if op.startswith("reducescatter"):
        total = sum(xs) * 2.0
        scale = 0.5 / (n if op.endswith("average") else 1)
        return [total[list(block(k, n, total.shape[0]))] * scale for k in range(n)]
    pieces = []
    for r in range(n):
        starts = [sum(rows(r, j) for j in range(k)) for k in range(n)]
        pieces.append([xs[r][starts[k] : starts[k] + rows(r, k)] for k in range(n)])
    return [torch.cat([pieces[r][k] for r in range(n)]) for k in range(n)]


# Horovod's backward functions relative to the gradient of the sum of every rank's loss:
# allgather and broadcast average where that sum adds (1/n); reducescatter scales by n.
HOROVOD_GRAD_SCALE = {
    "allgather": lambda n: 1 / n,
    "broadcast": lambda n: 1 / n,
    "allreduce_sum": lambda n: 1,
    "allreduce_average": lambda n: 1,
    "reducescatter_sum": lambda n: n,
    "reducescatter_average": lambda n: n,
    "alltoall": lambda n: 1,
}


def sparse_reference(n: int) -> list:
    """SparseAdam on the whole batch in one process: what the ranks together must train to."""
    torch.manual_seed(1)
    model = torch.nn.Embedding(12, 3, sparse=True)
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=0.05)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        idx = torch.randint(0, 12, (4 * n, 3), generator=g)
        target = torch.randn(4 * n, 3, generator=g)
        # Each rank's loss is a mean over its 4 rows; their average is the mean over all rows.
        loss = ((model(idx).sum(1) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.weight.detach().tolist()


def close(got, want, rel: float = 1e-12) -> None:
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), rtol=rel, atol=rel
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [2, 3])
def test_collectives_gradients_and_sparse_training_on_gloo(tmp_path, world):
    write(tmp_path / "inputs.py", INPUTS)
    script = write(tmp_path / "ops.py", SCRIPT)
    launch([sys.executable, "-m", "trainer.horovod.run", str(script), str(tmp_path)], world, tmp_path, timeout=200)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    scope = _inputs()
    rows, n = scope["rows"], world
    reference = sparse_reference(n)
    optimizer_reference = {kind: scope["optimizer_case"](kind, None, 0, 1, n) for kind in scope["OPTIMIZER_CASES"]}
    moved = optimizer_reference["freeze-adamw"]["weights"]
    # Frozen before the second step: the first layer (15 numbers) stays put, the last one moves on.
    assert moved[0][:15] == moved[1][:15] == moved[2][:15] and moved[1][15:] != moved[2][15:]

    # Gradient references: every rank's input in one autograd graph, the sum of every rank's loss.
    grads = {}
    for op, scale in HOROVOD_GRAD_SCALE.items():
        xs = [scope["grad_input"](r, op, n).requires_grad_() for r in range(n)]
        outs = reference_outputs(op, xs, n, rows)
        sum((o * scope["weight"](r, o.shape)).sum() for r, o in enumerate(outs)).backward()
        grads[op] = (
            [o.detach().tolist() for o in outs],
            [(torch.zeros_like(x) if x.grad is None else x.grad) * scale(n) for x in xs],
        )

    for k, got in enumerate(ranks):
        for dtype in scope["GATHER_DTYPES"]:
            data, received = expected_alltoall(k, n, rows, dtype)
            want_shape = [sum(received), 2]
            assert got[f"alltoall-{dtype}"] == [data, received, "torch.int32", f"torch.{dtype}"], (k, dtype)
            assert torch.tensor(got[f"alltoall-{dtype}"][0]).reshape(want_shape).shape == torch.Size(want_shape)
            assert got[f"alltoall-tensor-splits-{dtype}"] == [data, received]
            assert got[f"alltoall-even-{dtype}"] == expected_even(k, n, dtype)
            assert got[f"alltoall-async-{dtype}"] == [expected_even(k, n, dtype), [2] * n]
            # Every rank's tensor, concatenated in rank order (the same on every rank).
            gathered = [row for r in range(n) for row in expected_alltoall_rows(r, n, rows, dtype)]
            evens = [v for r in range(n) for v in expected_even_rows(r, n, dtype)]
            assert got[f"grouped_allgather-{dtype}"] == [gathered, evens], dtype
            firsts = [expected_alltoall_rows(r, n, rows, dtype)[:1] for r in range(n)]
            assert got[f"grouped_allgather_async-{dtype}"] == [gathered, [row for f in firsts for row in f]]
        for dtype in scope["REDUCE_DTYPES"]:
            rel = {"float16": 1e-3, "bfloat16": 1e-2}.get(dtype, 0.0)
            for length in (2 * n, 2 * n + 1):
                close(got[f"reducescatter-sum-{dtype}-{length}"], expected_reducescatter(k, n, length, False), rel)
                close(got[f"reducescatter-average-{dtype}-{length}"], expected_reducescatter(k, n, length, True), rel)
                close(got[f"reducescatter-async-{dtype}-{length}"], expected_reducescatter(k, n, length, False), rel)
            grouped = [expected_reducescatter(k, n, 2 * n + 1, False), expected_reducescatter(k, n, 3 * n + 2, False)]
            close(got[f"grouped_reducescatter-{dtype}"][0], grouped[0], rel)
            close(got[f"grouped_reducescatter-{dtype}"][1], grouped[1], rel)
            grouped_avg = [expected_reducescatter(k, n, 2 * n + 1, True), expected_reducescatter(k, n, 3 * n + 2, True)]
            close(got[f"grouped_reducescatter_async-{dtype}"][0], grouped_avg[0], rel)
            close(got[f"grouped_reducescatter_async-{dtype}"][1], grouped_avg[1], rel)
        close(got["reducescatter-scaled"], expected_reducescatter(k, n, 2 * n + 1, False, scale=0.5))
        close(got["reducescatter-fp16"][0], expected_reducescatter(k, n, 2 * n + 1, True), 1e-3)
        assert got["reducescatter-fp16"][1] == "torch.float32"
        total = [[n * (n + 1) * (i + c + 1) for c in range(2)] for i in range(2 * n + 1)]
        close(got["grouped_allreduce_async"], [total, [[2 * v for v in row] for row in total]])
        assert got["grouped_allreduce_async_"][0] is True
        close(got["grouped_allreduce_async_"][1:], [total, [[3 * v for v in row] for row in total]])

        for dtype in ("int16", "float32"):
            got_views = got[f"in-place-views-{dtype}"]
            for view, index in (("column", (slice(None), 1)), ("strided", slice(None, None, 2))):
                for call in ("allreduce_", "allreduce_async_", "grouped_allreduce_", "broadcast_", "broadcast_async_"):
                    want = scope["view_base"](k, "float64")
                    flat = want if view == "column" else want.view(-1)
                    ranks_bases = [scope["view_base"](r, "float64") for r in range(n)]
                    if call.startswith("broadcast"):
                        source = ranks_bases[n - 1] if view == "column" else ranks_bases[n - 1].view(-1)
                        flat[index] = source[index]
                    else:
                        flat[index] = sum(b[index] if view == "column" else b.view(-1)[index] for b in ranks_bases)
                    assert got_views[f"{call}-{view}"] == want.tolist(), (k, dtype, call, view)

        dense_sum = torch.zeros(5, 2, dtype=torch.float64)
        for r in range(n):
            dense_sum[r] += torch.tensor([1.0, 2.0]) * (r + 1)
            dense_sum[r + 1] += torch.tensor([10.0, 20.0])
        close(got["sparse-Sum"][0], dense_sum.tolist())
        close(got["sparse-Average"][0], (dense_sum / n).tolist(), 1e-6)  # float32 values divided by n
        assert got["sparse-Sum"][1] is True

        expect_errors = {
            "alltoall-uneven": ("ValueError", "not an even multiple"),
            "alltoall-splits-sum": ("ValueError", "Sum of splits entries"),
            "alltoall-splits-count": ("ValueError", "does not equal number of workers"),
            "alltoall-splits-dtype": ("ValueError", "32-bit integer"),
            "alltoall-splits-2d": ("ValueError", "1D splits"),
            "alltoall-scalar": ("HorovodInternalError", "rank-zero"),
            "reducescatter-max": ("HorovodInternalError", "only supports AVERAGE and SUM"),
            "reducescatter-scalar": ("HorovodInternalError", "rank-zero"),
            "sparse-dense": ("ValueError", "sparse COO"),
        } | {
            key: ("HorovodInternalError", key.split("-")[1])
            for key in [
                "mismatch-reducescatter-shape",
                "mismatch-reducescatter-dtype",
                "mismatch-reducescatter-op",
                "mismatch-reducescatter-scale",
                "mismatch-alltoall-shape",
                "mismatch-alltoall-dtype",
                "mismatch-alltoall-vs-allgather",
            ]
        }
        for key, (kind, text) in expect_errors.items():
            err = got["error-" + key]
            assert err["error"] == kind and text in err["message"], (key, err)
        assert got["after-errors"] == [float(n)]

        for op, (outs, want_grads) in grads.items():
            close(got[f"grad-{op}"][0], outs[k], 1e-12)
            close(got[f"grad-{op}"][1], want_grads[k].tolist(), 1e-12)
        # grouped_allgather: the two outputs' losses weigh 1 and 3 (and b = 2a, so the same rows).
        close(got["grad-grouped_allgather"][0], want_grads_of(grads, "allgather", k))
        close(got["grad-grouped_allgather"][1], [[3 * v for v in row] for row in want_grads_of(grads, "allgather", k)])

        for key, tail in (("syncbn-2d", ()), ("syncbn-4d", (2, 2))):
            for g, w in zip(got[key][:-1], syncbn_reference(scope, n, tail, k), strict=True):
                close(g, w, 1e-10)
            assert got[key][-1] == 1
        want_bn = syncbn_reference(scope, n, (), k)
        assert got["syncbn-half"][0] == "torch.float16"
        close(got["syncbn-half"][1], want_bn[0], 1e-2)
        close(got["syncbn-half"][2], want_bn[4], 1e-3)

        if k in (0, n - 1):
            a, b = scope["set_input"](0), scope["set_input"](n - 1)
            me = 0 if k == 0 else 1
            received = [[a[0], b[0], b[1]], [a[1], a[2], b[2]]][me]
            total = a + b
            want = [torch.stack(received), torch.tensor([[1, 2], [2, 1]][me]), [total[:2], total[2:]][me]]
            want += [torch.cat([a[:1], b[:2]]), total / 2]
            assert len(got["set"]) == len(want)
            for g, w in zip(got["set"], want, strict=True):
                close(g, w.tolist())
        else:
            assert "set" not in got

        rs_grad = want_grads_of(grads, "reducescatter_sum", k)
        close(got["grad-grouped_reducescatter"], [rs_grad, [[2 * v for v in row] for row in rs_grad]])

        assert got["names"] == ["allreduce.noname.0.0", "allreduce.noname.0.1", "allreduce.noname.1.0"]
        # Adam: step, exp_avg, exp_avg_sq for weight and bias after one step (step 1).
        adam = got["fill-adam"]
        assert adam["0"] == adam["1"] == ["exp_avg", "exp_avg_sq", "step"] and adam["step"] == [1.0, 1.0]
        assert got["fill-sparseadam"]["0"] == ["exp_avg", "exp_avg_sq", "step"]
        for key in ("resume-adamw", "resume-sgd"):  # every rank's parameters, gathered: all equal
            assert all(row == got[key][0] for row in got[key]), (key, got[key])
        assert got["fill-sgd-sparse"]["0"] == ["momentum_buffer"]

        close(got["sparse-train-dense"], reference, 1e-5)
        close(got["sparse-train-sparse"], reference, 1e-5)
        # A closure's gradients reduced before the optimizer uses them, its loss the mean over the
        # processes; parameters unfrozen, added or frozen after the optimizer was made, or listed
        # twice: every rank as one process on the whole batch (were: the ranks drifting apart, a
        # frozen layer moved, LBFGS refused, a parameter listed twice refused).
        assert got["closure-no-backward"] == [-n * (n + 1) / 2] * 2  # was: reduced twice, n times as far
        for kind in scope["OPTIMIZER_CASES"]:
            assert got[kind] == ranks[0][kind], (kind, k)
            close(got[kind]["weights"], optimizer_reference[kind]["weights"], 1e-9)
            close(got[kind]["losses"], optimizer_reference[kind]["losses"], 1e-9)
    trace = json.loads((tmp_path / "timeline-rank0.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert {"gloo:all_reduce", "gloo:broadcast"} <= names, sorted(names)[:50]
    assert not any((tmp_path / f"timeline-rank{r}.json").exists() for r in range(1, world))
    assert ranks[0]["sparse-train-dense"] != sparse_initial(), "training did not move the weights"


def syncbn_reference(scope: dict, n: int, tail: tuple, k: int) -> list:
    """BatchNorm on the whole batch in one process, the loss summed over every rank's rows: rank k's
    output and input gradient, the weight and bias gradients, and the running statistics."""
    full = scope["bn_input"](n, tail).requires_grad_()
    bn = scope["bn_module"](torch.nn.BatchNorm2d(3, momentum=0.3) if tail else torch.nn.BatchNorm1d(3, momentum=0.3))
    y = bn(full)
    rows = scope["bn_rows"](n)
    sum((y[rows[r]] * scope["weight"](r, y[rows[r]].shape)).sum() for r in range(n)).backward()
    parts = [y.detach()[rows[k]], full.grad[rows[k]], bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var]
    return [p.tolist() for p in parts]


def expected_alltoall_rows(r: int, n: int, rows, dtype: str) -> list:
    """Rank r's alltoall input as a list of rows (the trailing row on rank 0 too)."""
    out = []
    for k in range(n):
        v = [10 * r + k, 10 * r + k + 50]
        out += [[(x % 2 == 1) for x in v] if dtype == "bool" else [float(x) for x in v]] * rows(r, k)
    if r == 0:
        out.append([True, True] if dtype == "bool" else [99.0, 99.0])
    return out


def expected_even_rows(r: int, n: int, dtype: str) -> list:
    vals = [10 * r + j for j in range(2 * n)]
    return [(v % 2 == 1) for v in vals] if dtype == "bool" else [float(v) for v in vals]


def want_grads_of(grads: dict, op: str, k: int) -> list:
    return grads[op][1][k].tolist()


def sparse_initial() -> list:
    torch.manual_seed(1)
    return torch.nn.Embedding(12, 3, sparse=True).weight.detach().tolist()
