"""Horovod's alltoall and reducescatter (each with its grouped and asynchronous forms), on
torch.distributed.

Part of the `horovod.torch` surface: trainer.horovod.api re-exports every public name here.
Shapes, defaults, errors and gradients follow Horovod's torch API (horovod/torch/mpi_ops.py):

- alltoall splits dimension 0 by `splits` (equal parts when omitted; then dimension 0 must divide
  by the set's size); rows past the sum of `splits` are not sent. With `splits` the received
  splits come back too (int32, like the splits Horovod takes).
- reducescatter gives set rank r the r-th block of dimension 0 of the reduced tensor; when the
  size does not divide it, the first `dim0 % size` ranks get one row more (Horovod's rule).
  Only Sum and Average reduce here, as in Horovod.
- gradients follow Horovod's backward functions exactly, including their scale: allgather's
  is the averaged gradient's own slice, broadcast's is the averaged gradient on the root and zero
  elsewhere, reducescatter's is the allgathered gradient (times the set size for Sum, times the
  scale factors), alltoall's is the gradient sent back along the received splits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from trainer.horovod import api

__all__ = [
    "alltoall",
    "alltoall_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "reducescatter",
    "reducescatter_async",
    "reducescatter_sizes",
]

# gloo's alltoall has no bool either: on CPU it travels widened too (exactly) and comes back in its own dtype.
_WIDER_ON_CPU = {**api._WIDER, torch.bool: torch.uint8}

# torch renamed these (the old names warn on recent versions); both take the same arguments.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    return api._widen(tensor, api._WIDER if tensor.is_cuda else _WIDER_ON_CPU)


# --- alltoall ------------------------------------------------------------------------------


def _alltoall_splits(tensor: torch.Tensor, splits: Any, n: int) -> list[int]:
    """The rows `tensor` sends to each of the `n` ranks, checked as Horovod checks them."""
    if tensor.dim() == 0:
        raise api.HorovodInternalError("alltoall: cannot alltoall a rank-zero tensor (a scalar): give it a dimension")
    first = tensor.shape[0]
    if splits is None:
        if first % n:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even multiple of the number of "
                f"workers ({first} rows, {n} workers): pass splits=[rows for each rank]"
            )
        return [first // n] * n
    if torch.is_tensor(splits):
        if splits.dim() > 1:
            raise ValueError("alltoall expects a 1D splits tensor")
        if splits.dtype != torch.int32:
            raise ValueError(f"alltoall expects splits to contain 32-bit integer elements, got {splits.dtype}")
        values = [int(v) for v in splits.tolist()]
    else:
        values = [int(v) for v in splits]
    if len(values) != n:
        raise ValueError(f"Number of entries in splits ({len(values)}) does not equal number of workers ({n}).")
    if any(v < 0 for v in values):
        raise ValueError(f"alltoall splits must not be negative, got {values}")
    if sum(values) > first:
        raise ValueError(
            f"Sum of splits entries ({sum(values)}) is greater than the first dimension of tensor ({first})."
        )
    return values


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = api.global_process_set
) -> Any:
    """Start sending `splits[r]` rows of `tensor` (dimension 0, in order) to each rank r of the set
    and receiving theirs; `synchronize` gives `(received tensor, received splits)`."""
    # Checked before the agreement (whose set validation comes first), so that bad splits raise
    # here instead of leaving the other processes in a collective this one never joins.
    send = _alltoall_splits(tensor, splits, len(api._set_state(process_set).ranks))
    # Dimension 0 may differ across ranks (the splits say how); the rest must agree.
    spec = api.TensorSpec((-1, *tensor.shape[1:]), tensor.dtype, tensor.is_cuda)
    agreement = api._collective_group("alltoall", [spec], name=name, process_set=process_set)
    group = agreement.group
    # Every rank learns how many rows each other rank sends it before the data moves.
    recv_t = torch.empty(len(send), dtype=torch.int64)
    dist.all_to_all_single(recv_t, torch.tensor(send, dtype=torch.int64), group=group)
    recv = [int(v) for v in recv_t.tolist()]
    rows = _wire(tensor.detach()[: sum(send)].contiguous())
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    work = dist.all_to_all_single(out, rows, recv, send, group=group, async_op=True)
    if torch.is_tensor(splits):
        received = torch.tensor(recv, dtype=splits.dtype, device=splits.device)
    else:
        received = torch.tensor(recv, dtype=torch.int32)
    return api._Handle([work], lambda: (out.to(tensor.dtype), received))


class _AlltoallFunction(torch.autograd.Function):
    """alltoall as an autograd op: the gradient goes back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = api.synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output.contiguous(), splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = api.global_process_set
) -> Any:
    """Send `splits[r]` rows of `tensor` to each rank r and concatenate what every rank sent here, in
    rank order (differentiable). Without `splits` dimension 0 is split evenly and only the tensor
    comes back; with them, `(tensor, received_splits)`."""
    return _AlltoallFunction.apply(tensor, splits, name, process_set)


# --- reducescatter -------------------------------------------------------------------------


def reducescatter_sizes(first_dim: int, n: int) -> list[int]:
    """Rows of dimension 0 each of `n` ranks gets from reducescatter: equal blocks, the first
    `first_dim % n` ranks one row more (Horovod's rule)."""
    return [first_dim // n + (1 if r < first_dim % n else 0) for r in range(n)]


def _check_reducescatter(tensors: Sequence[torch.Tensor], op: Any) -> api._Op:
    if op not in (api.Sum, api.Average):
        raise api.HorovodInternalError(
            f"Reducescatter currently only supports AVERAGE and SUM, got op={api._Op(op).name}: reduce with "
            "op=hvd.Sum or op=hvd.Average, or use allreduce for other ops"
        )
    for t in tensors:
        if t.dim() == 0:
            raise api.HorovodInternalError(
                "reducescatter: cannot reducescatter a rank-zero tensor (a scalar): give it a dimension"
            )
    return api._Op(op)


def _reducescatter_start(
    tensors: Sequence[torch.Tensor], name: str | None, op: Any, process_set: Any, pre: float, post: float, kind: str
) -> Any:
    op = _check_reducescatter(tensors, op)
    detail = api._allreduce_detail(op, pre, post)
    agreement = api._collective_group(kind, list(tensors), name=name, process_set=process_set, detail=detail)
    n, me = agreement.size, agreement.rank
    if op == api.Average:
        post = post / n
    works, finishes = [], []
    for tensor in tensors:
        sizes = reducescatter_sizes(tensor.shape[0], n)
        block = sizes[0]
        src = _wire(tensor.detach())
        # Every rank's block padded to the largest, so that the reduction has equal parts.
        buf = src.new_zeros((n * block, *src.shape[1:]))
        start = 0
        for r, rows in enumerate(sizes):
            buf[r * block : r * block + rows] = src[start : start + rows]
            start += rows
        api._scale_(buf, pre)
        out = buf.new_empty((block, *src.shape[1:]))
        works.append(_reduce_scatter(out, buf, op=dist.ReduceOp.SUM, group=agreement.group, async_op=True))

        def finish(out=out, rows=sizes[me], dtype=tensor.dtype):
            result = out[:rows]
            api._scale_(result, post)
            return result.to(dtype)

        finishes.append(finish)
    return api._Handle(works, lambda: [f() for f in finishes])


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: Any = api.Average,
    process_set: Any = api.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Start reducing `tensor` over the set and keeping this rank's block of dimension 0."""
    handle = _reducescatter_start([tensor], name, op, process_set, prescale_factor, postscale_factor, "reducescatter")
    return api._combined([handle], lambda results: results[0][0])


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: Any = api.Average,
    process_set: Any = api.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """`reducescatter_async` of each tensor of a list, as one operation."""
    return _reducescatter_start(
        list(tensors), name, op, process_set, prescale_factor, postscale_factor, "grouped_reducescatter"
    )


def _reducescatter_grad(ctx, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    scale = (ctx.process_set.size() if ctx.op == api.Sum else 1) * ctx.pre * ctx.post
    return api.grouped_allgather([g * scale if scale != 1 else g for g in grads], process_set=ctx.process_set)


class _ReducescatterFunction(torch.autograd.Function):
    """reducescatter as an autograd op (Horovod's backward: the scaled gradient allgathered)."""

    @staticmethod
    def forward(ctx, name, op, process_set, pre, post, *tensors):
        ctx.op, ctx.process_set, ctx.pre, ctx.post = op, process_set, pre, post
        kind = "reducescatter" if len(tensors) == 1 else "grouped_reducescatter"
        return tuple(api.synchronize(_reducescatter_start(tensors, name, op, process_set, pre, post, kind)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None, *_reducescatter_grad(ctx, grads))


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = None,
    op: Any = api.Average,
    process_set: Any = api.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """`tensor` reduced over the set (Average unless `op=Sum`), this rank's block of dimension 0
    (differentiable)."""
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor)[0]


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = None,
    op: Any = api.Average,
    process_set: Any = api.global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """`reducescatter` of each tensor of a list, as one operation."""
    compression = compression or api.Compression.none
    packed = [compression.compress(t) for t in tensors]
    outs = _ReducescatterFunction.apply(
        name, op, process_set, prescale_factor, postscale_factor, *[t for t, _ in packed]
    )
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, packed, strict=True)]
