"""The `horovod.torch` API, implemented on torch.distributed (gloo on CPU, NCCL on GPUs).

Ranks come from the environment torchrun or the Training Operator sets (see
trainer/launch/spec.py): under torchrun `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
`GROUP_RANK`, `GROUP_WORLD_SIZE`; in a PyTorchJob pod started without torchrun (one process per
pod) the operator's `RANK`/`WORLD_SIZE` are process ranks and every pod is its own node. With no
such variables a script is rank 0 of 1.

Differences from Horovod that a script can notice, each deliberate:

- collectives are issued in program order, not negotiated by name: every rank must call the same
  collectives in the same order (as with torch.distributed). `name=` is accepted and ignored.
- DistributedOptimizer reduces gradients one tensor at a time in a fixed parameter order (started
  from the backward hooks as soon as that order allows), with no tensor fusion; `groups` and
  `num_groups` are accepted and ignored.
- `join()` is a barrier: every rank must have issued the same collectives before it (no zero
  tensors on behalf of ranks that ran out of data).
- Elastic training, Adasum, process sets and SyncBatchNorm raise NotImplementedError naming
  what to use instead.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import enum
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "Product",
    "ProcessSet",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]

ELASTIC_MESSAGE = (
    "hvd.elastic is not supported by kftrain's Horovod shim: run elastic training with torchrun's "
    "rendezvous instead (kftrain config `kubernetes.elastic`: min/max replicas, restarts) and resume "
    "from checkpoints (hvd.elastic's state commits have no equivalent here)"
)
ADASUM_MESSAGE = (
    "op=hvd.Adasum is not supported by kftrain's Horovod shim: use op=hvd.Average (the default), "
    "scaling the learning rate by hvd.size() as Horovod's docs advise for Average"
)
PROCESS_SET_MESSAGE = (
    "Horovod process sets are not supported by kftrain's Horovod shim: make a sub-group with "
    "torch.distributed.new_group(ranks) and call torch.distributed collectives with group=..."
)
_UNSUPPORTED = {
    "SyncBatchNorm": "use torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) with DistributedDataParallel",
    "start_timeline": "use torch.profiler for a trace of collectives",
    "stop_timeline": "use torch.profiler for a trace of collectives",
}


class HorovodInternalError(RuntimeError):
    """A collective failed (raised by `synchronize`), as Horovod names it."""


class _Op(enum.IntEnum):
    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average, Sum, Adasum, Min, Max, Product = _Op.AVERAGE, _Op.SUM, _Op.ADASUM, _Op.MIN, _Op.MAX, _Op.PRODUCT
_TORCH_OP = {
    _Op.AVERAGE: dist.ReduceOp.SUM,  # divided by the world size when the collective completes
    _Op.SUM: dist.ReduceOp.SUM,
    _Op.MIN: dist.ReduceOp.MIN,
    _Op.MAX: dist.ReduceOp.MAX,
    _Op.PRODUCT: dist.ReduceOp.PRODUCT,
}


class _Elastic:
    """`hvd.elastic`: any use says what to do instead."""

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(ELASTIC_MESSAGE)


elastic = _Elastic()


def _unsupported(name: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"hvd.{name} is not supported by kftrain's Horovod shim: {_UNSUPPORTED[name]}")

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Not supported: {_UNSUPPORTED[name]}."
    return fn


SyncBatchNorm = _unsupported("SyncBatchNorm")
start_timeline = _unsupported("start_timeline")
stop_timeline = _unsupported("stop_timeline")


class _GlobalProcessSet:
    """All processes: the only process set the shim has (the default of every `process_set=`)."""

    process_set_id = 0

    def included(self) -> bool:
        """Every process belongs to the global set."""
        return True

    def rank(self) -> int:
        """This process's rank in the set: its global rank."""
        return rank()

    def size(self) -> int:
        """Processes in the set: all of them."""
        return size()

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = _GlobalProcessSet()


def ProcessSet(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - Horovod's class name
    """Not supported: use torch.distributed.new_group(ranks)."""
    raise NotImplementedError(PROCESS_SET_MESSAGE)


def add_process_set(*args: Any, **kwargs: Any) -> Any:
    """Not supported: use torch.distributed.new_group(ranks)."""
    raise NotImplementedError(PROCESS_SET_MESSAGE)


def remove_process_set(*args: Any, **kwargs: Any) -> Any:
    """Not supported: use torch.distributed.new_group(ranks)."""
    raise NotImplementedError(PROCESS_SET_MESSAGE)


def _check_process_set(process_set: Any) -> None:
    if process_set is not global_process_set:
        raise NotImplementedError(PROCESS_SET_MESSAGE)


# --- topology and lifetime -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process sits: global, per-node (local) and across-node (cross) ranks."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1


def topology(environ: Mapping[str, str] = os.environ) -> Topology:
    """This process's ranks from the torchrun / PyTorchJob environment (rank 0 of 1 without one)."""
    world = int(environ.get("WORLD_SIZE", 1))
    rank_ = int(environ.get("RANK", 0))
    if "LOCAL_RANK" in environ:  # torchrun (or anything that follows its contract)
        local_size = int(environ.get("LOCAL_WORLD_SIZE", 1))
        return Topology(
            rank=rank_,
            size=world,
            local_rank=int(environ["LOCAL_RANK"]),
            local_size=local_size,
            cross_rank=int(environ.get("GROUP_RANK", rank_ // local_size)),
            cross_size=int(environ.get("GROUP_WORLD_SIZE", world // local_size)),
        )
    nproc = environ.get("PET_NPROC_PER_NODE", "1")
    if nproc.isdigit() and int(nproc) > 1:
        # The operator's RANK is then a node rank, not a process rank.
        raise RuntimeError(
            f"PET_NPROC_PER_NODE={nproc} but no LOCAL_RANK: with several processes per pod start the script "
            "through torchrun: python -m torch.distributed.run -m trainer.horovod.run SCRIPT [ARGS]"
        )
    nnodes = environ.get("PET_NNODES", "1")
    if "RANK" not in environ and nnodes.isdigit() and int(nnodes) > 1:
        # A Trainer v2 TrainJob injects only PET_*: without torchrun no process knows its rank,
        # and every pod would silently train alone as rank 0 of 1.
        raise RuntimeError(
            f"PET_NNODES={nnodes} but no RANK or LOCAL_RANK (a Kubeflow Trainer v2 TrainJob sets only PET_*): "
            "start the script through torchrun: python -m torch.distributed.run -m trainer.horovod.run SCRIPT [ARGS]"
        )
    # One process per pod: the operator's RANK/WORLD_SIZE are process ranks, each pod a node.
    return Topology(rank=rank_, size=world, local_rank=0, local_size=1, cross_rank=rank_, cross_size=world)


class _State:
    topology: Topology | None = None
    owns_group = False


_state = _State()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job's process group (idempotent): gloo for CPU tensors, and NCCL for CUDA tensors
    with the CUDA device set from the local rank when GPUs are present."""
    if comm is not None:
        raise NotImplementedError(
            "hvd.init(comm=...) is not supported by kftrain's Horovod shim: there is no MPI; ranks come from "
            "torchrun or the PyTorchJob environment"
        )
    if process_sets is not None:
        raise NotImplementedError(PROCESS_SET_MESSAGE)
    if _state.topology is not None:
        return
    topo = topology()
    if dist.is_initialized():  # the script (or a library) made the group itself: use it, leave it
        if (dist.get_rank(), dist.get_world_size()) != (topo.rank, topo.size):
            raise RuntimeError(
                f"an existing process group has rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"the environment says {topo.rank} of {topo.size}"
            )
    else:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(topo.local_rank)
        # Horovod reduces CPU and GPU tensors alike (metrics are often CPU tensors): one backend each.
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        timeout = datetime.timedelta(seconds=float(os.environ.get("KFTRAIN_HOROVOD_TIMEOUT_S", 1800)))
        if topo.size == 1 and "MASTER_ADDR" not in os.environ:
            # A plain `python script.py`: an in-memory store, no port to pick.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(backend, timeout=timeout)
        _state.owns_group = True
        atexit.register(shutdown)
    _state.topology = topo


def shutdown() -> None:
    """Leave the process group (if `init` made it); safe to call more than once."""
    if _state.owns_group and dist.is_initialized():
        dist.destroy_process_group()
    _state.topology, _state.owns_group = None, False


def is_initialized() -> bool:
    """Whether `init` has run (and `shutdown` has not)."""
    return _state.topology is not None


def _topo() -> Topology:
    if _state.topology is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state.topology


def rank() -> int:
    """This process's rank among all processes."""
    return _topo().rank


def size() -> int:
    """Processes in the job."""
    return _topo().size


def local_rank() -> int:
    """This process's rank on its node (its GPU index)."""
    return _topo().local_rank


def local_size() -> int:
    """Processes on this node."""
    return _topo().local_size


def cross_rank() -> int:
    """This node's rank among the nodes."""
    return _topo().cross_rank


def cross_size() -> int:
    """Nodes in the job."""
    return _topo().cross_size


def mpi_threads_supported() -> bool:
    """No MPI here."""
    return False


def mpi_enabled() -> bool:
    """No MPI here."""
    return False


def mpi_built() -> bool:
    """No MPI here."""
    return False


def gloo_enabled() -> bool:
    """gloo carries CPU tensors."""
    return True


def gloo_built() -> bool:
    """gloo carries CPU tensors."""
    return True


def nccl_built() -> bool:
    """NCCL carries CUDA tensors when CUDA and NCCL are available."""
    return torch.cuda.is_available() and dist.is_nccl_available()


def cuda_built() -> bool:
    """CUDA is available to this process."""
    return torch.cuda.is_available()


def rocm_built() -> bool:
    """This torch build targets ROCm."""
    return bool(getattr(torch.version, "hip", None))


def ddl_built() -> bool:
    """No IBM DDL here."""
    return False


def ccl_built() -> bool:
    """No oneCCL here."""
    return False


# --- asynchronous handles ------------------------------------------------------------------


class _Handle:
    """What the *_async functions return; pass it to `synchronize` or `poll`."""

    __slots__ = ("_finish", "_result", "_works")

    def __init__(self, works: list[Any], finish: Callable[[], Any]) -> None:
        self._works, self._finish, self._result = works, finish, None

    def done(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def wait(self) -> Any:
        if self._finish is not None:
            try:
                for w in self._works:
                    w.wait()
            except RuntimeError as exc:
                raise HorovodInternalError(str(exc)) from exc
            self._result, self._finish = self._finish(), None
        return self._result


def poll(handle: _Handle) -> bool:
    """True once the asynchronous operation has completed (`synchronize` will not block)."""
    return handle.done()


def synchronize(handle: _Handle) -> Any:
    """Wait for an asynchronous operation and return its output tensor."""
    return handle.wait()


# --- allreduce -----------------------------------------------------------------------------


def _resolve_op(op: Any, average: bool | None) -> _Op:
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Average if average is None or average else Sum
    if op == Adasum:
        raise NotImplementedError(ADASUM_MESSAGE)
    return _Op(op)


def _scale_(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:  # integers: the scaled value truncated toward zero, in the tensor's dtype
        tensor.copy_(tensor * factor)


def _allreduce_into(
    output: torch.Tensor, op: _Op, prescale_factor: float, postscale_factor: float, finish=lambda t: t
) -> _Handle:
    _topo()
    _scale_(output, prescale_factor)
    work = dist.all_reduce(output, op=_TORCH_OP[op], async_op=True)
    post = postscale_factor / size() if op == Average else postscale_factor

    def done() -> torch.Tensor:
        _scale_(output, post)
        return finish(output)

    return _Handle([work], done)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> _Handle:
    """Start reducing `tensor` over all processes into a new tensor (Average unless `op` says)."""
    op = _resolve_op(op, average)
    _check_process_set(process_set)
    return _allreduce_into(tensor.detach().clone(), op, prescale_factor, postscale_factor)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> _Handle:
    """Start reducing `tensor` over all processes in place."""
    op = _resolve_op(op, average)
    _check_process_set(process_set)
    return _allreduce_into(tensor.data, op, prescale_factor, postscale_factor, finish=lambda _: tensor)


class _AllreduceFunction(torch.autograd.Function):
    """Allreduce as an autograd op: the gradient of the result is reduced the same way."""

    @staticmethod
    def forward(ctx, tensor, op, prescale_factor, postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor)
        return synchronize(_allreduce_into(tensor.detach().clone(), op, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post = ctx.args
        grad = synchronize(_allreduce_into(grad_output.detach().clone(), op, pre, post))
        return grad, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """`tensor` reduced over all processes (a new tensor; differentiable), Average unless `op` says."""
    op = _resolve_op(op, average)
    _check_process_set(process_set)
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    out = _AllreduceFunction.apply(compressed, op, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> torch.Tensor:
    """Reduce `tensor` over all processes in place and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce(tensors: list[torch.Tensor], average=None, name=None, compression=None, op=None, **kwargs):
    """`allreduce` of each tensor of a list."""
    return [allreduce(t, average, name, compression, op, **kwargs) for t in tensors]


def grouped_allreduce_(tensors: list[torch.Tensor], average=None, name=None, op=None, **kwargs):
    """`allreduce_` of each tensor of a list."""
    handles = [allreduce_async_(t, average, name, op, **kwargs) for t in tensors]
    return [synchronize(h) for h in handles]


# --- allgather, broadcast, objects, barrier ------------------------------------------------


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> _Handle:
    """Start concatenating every process's `tensor` along dimension 0 (first dimensions may differ)."""
    _check_process_set(process_set)
    n = size()
    t = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach().contiguous()
    # The shapes travel first so that every rank pads to the longest and all of them can
    # report a mismatch the same way instead of hanging in the gather.
    shapes: list[Any] = [None] * n
    dist.all_gather_object(shapes, tuple(t.shape))
    if any(s[1:] != t.shape[1:] for s in shapes):
        raise ValueError(f"allgather: every dimension but the first must match across ranks, got shapes {shapes}")
    longest = max(s[0] for s in shapes)
    padded = t.new_zeros((longest, *t.shape[1:]))
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in range(n)]
    work = dist.all_gather(parts, padded, async_op=True)
    return _Handle([work], lambda: torch.cat([p[: s[0]] for p, s in zip(parts, shapes, strict=True)]))


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> torch.Tensor:
    """Every process's `tensor` concatenated along dimension 0, in rank order (differentiable)."""
    return grouped_allgather([tensor], name, process_set)[0]


def _check_root(root_rank: int) -> None:
    if not 0 <= root_rank < size():
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {size()})")


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> _Handle:
    """Start overwriting `tensor` with root_rank's value, in place."""
    _check_process_set(process_set)
    _check_root(root_rank)
    work = dist.broadcast(tensor.data, src=root_rank, async_op=True)
    return _Handle([work], lambda: tensor)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> _Handle:
    """Start broadcasting root_rank's `tensor` into a new tensor."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """root_rank's `tensor`, as a new tensor on every process (differentiable)."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


class _BroadcastFunction(torch.autograd.Function):
    """broadcast as an autograd op: Horovod's backward averages the gradient over the set and
    keeps it on the root only (zero elsewhere)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, average=True, process_set=ctx.process_set)
        if rank() != ctx.root_rank:  # root_rank is a global rank, in process sets too
            grad = torch.zeros_like(grad)
        return grad, None, None, None


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """Overwrite `tensor` with root_rank's value and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set):
    """root_rank's picklable `obj` on every process."""
    _check_process_set(process_set)
    _check_root(root_rank)
    box = [obj]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every process's picklable `obj`, in rank order."""
    _check_process_set(process_set)
    out: list[Any] = [None] * size()
    dist.all_gather_object(out, obj)
    return out


def barrier(process_set: Any = global_process_set) -> None:
    """Wait until every process gets here."""
    _check_process_set(process_set)
    _topo()
    dist.barrier()


def join(device: int = -1) -> int:
    """Wait until every process has joined and return the rank that joined last (by wall clock).

    Unlike Horovod, joined ranks do not answer the others' allreduces with zeros: every rank must
    run the same collectives (give each rank the same number of batches, e.g. DistributedSampler
    with drop_last=True)."""
    _topo()
    arrivals: list[Any] = [None] * size()
    dist.all_gather_object(arrivals, time.time())
    return max(range(len(arrivals)), key=lambda r: arrivals[r])


# --- model and optimizer state -------------------------------------------------------------


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Overwrite parameters/buffers with root_rank's, in place: `params` is a state_dict or an
    iterable of tensors or (name, tensor) pairs such as `model.named_parameters()`."""
    if isinstance(params, Mapping):
        items = sorted(params.items())  # the same order on every rank, whatever the insertion order
    elif isinstance(params, Iterable):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError(f"broadcast_parameters: {name or 'an entry'} is a {type(p).__name__}, not a tensor")
        handles.append(broadcast_async_(p, root_rank))
    for h in handles:
        synchronize(h)


class _TensorSlot(NamedTuple):
    """Stands for one tensor of root's optimizer state while the structure is pickled."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    cuda: bool
    sparse_dim: int | None = None  # a sparse tensor (SGD's momentum over sparse gradients) travels dense


def _strip_tensors(node: Any, tensors: list[torch.Tensor]) -> Any:
    if torch.is_tensor(node):
        sparse_dim = node.sparse_dim() if node.is_sparse else None
        tensors.append(node.detach().to_dense() if node.is_sparse else node.detach().contiguous())
        return _TensorSlot(len(tensors) - 1, tuple(node.shape), node.dtype, node.is_cuda, sparse_dim)
    if isinstance(node, dict):
        return {k: _strip_tensors(v, tensors) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_strip_tensors(v, tensors) for v in node)
    return node


def _fill_tensors(node: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(node, _TensorSlot):
        t = tensors[node.index]
        return t if node.sparse_dim is None else t.to_sparse(node.sparse_dim)
    if isinstance(node, dict):
        return {k: _fill_tensors(v, tensors) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_fill_tensors(v, tensors) for v in node)
    return node


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    """Give every process root_rank's optimizer state (moments, step counts, and param-group
    settings such as the learning rate), e.g. after rank 0 alone loaded a checkpoint.

    The structure travels pickled; the tensors travel as tensors (on their device), so the state
    never passes through one process's memory in full more than once."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        _fill_state(optimizer, model)
    tensors: list[torch.Tensor] = []
    skeleton = _strip_tensors(optimizer.state_dict(), tensors) if rank() == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank)
    if rank() != root_rank:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        slots: list[_TensorSlot] = []
        _collect_slots(skeleton, slots)
        tensors = [
            torch.empty(s.shape, dtype=s.dtype, device=device if s.cuda else "cpu")
            for s in sorted(slots, key=lambda s: s.index)
        ]
    handles = [broadcast_async_(t, root_rank) for t in tensors]
    for h in handles:
        synchronize(h)
    if rank() != root_rank:
        optimizer.load_state_dict(_fill_tensors(skeleton, tensors))


def _fill_state(optimizer: torch.optim.Optimizer, model: Any) -> None:
    """Create a new optimizer's state as Horovod does: one local step on zero gradients (sparse
    ones for SparseAdam, and for SGD over `model`'s sparse embeddings). The zero gradients stay."""
    sparse = set()
    if model is not None:
        for m in model.modules():
            if isinstance(m, torch.nn.Embedding) and m.sparse:
                sparse.update(id(p) for p in m.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                    isinstance(optimizer, torch.optim.SGD) and id(p) in sparse
                ):
                    p.grad = p.grad.to_sparse()
    if isinstance(optimizer, _DistributedOptimizer):
        # The wrapped optimizer's own step: a DistributedOptimizer's would reduce, and only
        # ranks whose state is empty get here.
        super(_DistributedOptimizer, optimizer).step()
    else:
        optimizer.step()


def _collect_slots(node: Any, out: list[_TensorSlot]) -> None:
    if isinstance(node, _TensorSlot):
        out.append(node)
    elif isinstance(node, dict):
        for v in node.values():
            _collect_slots(v, out)
    elif isinstance(node, (list, tuple)):
        for v in node:
            _collect_slots(v, out)


# --- compression and the distributed optimizer ---------------------------------------------


class _NoneCompressor:
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor itself, no context."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The tensor itself."""
        return tensor


class _FP16Compressor:
    """Send floating-point tensors as float16 (half the bytes; sums lose precision)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A float16 copy of a floating-point tensor, and its original dtype."""
        if tensor.is_floating_point():
            return tensor.to(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Back to the original dtype."""
        return tensor.to(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """Gradient compression for allreduce: `Compression.none` (default) or `Compression.fp16`."""

    none = _NoneCompressor
    fp16 = _FP16Compressor


class _DistributedOptimizer:
    """Mixed in before the user's optimizer class: gradients are reduced across processes
    before the wrapped optimizer's `step()` applies them.

    Each parameter's gradient is reduced once `backward_passes_per_step` backward passes have
    accumulated into it. Collectives must run in the same order on every rank, so reductions start
    in a fixed parameter order (last parameters first, as backward usually produces them); one
    whose gradient is ready early waits for its predecessors, and `synchronize()` reduces whatever
    is left (zeros for parameters this rank did not use, which other ranks may have).
    """

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: Any,
        backward_passes_per_step: int,
        op: _Op,
        gradient_predivide_factor: float,
        sparse_as_dense: bool,
    ) -> None:
        super().__init__(params)
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(item, tuple) for item in named):
                raise ValueError(
                    "named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                    "model.named_parameters()."
                )
            names = [n for n, _ in named]
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {dups}")
            missing = {id(p) for p in all_params} - {id(p) for _, p in named}
            if missing:
                raise ValueError(
                    f"named_parameters was specified, but {len(missing)} optimizer parameter(s) are not in it"
                )
        else:  # Horovod's names for unnamed parameters: group index, then index in the group
            named = [
                (f"allreduce.noname.{i}.{j}", p)
                for i, group in enumerate(self.param_groups)
                for j, p in enumerate(group["params"])
            ]
        self._parameter_names = {p: n for n, p in sorted(named, key=lambda item: item[0])}
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._order = [p for p in reversed(all_params) if p.requires_grad]
        self._delay = dict.fromkeys(self._order, backward_passes_per_step)
        self._handles: dict[torch.Tensor, tuple[_Handle, Any]] = {}
        self._next = 0  # the first parameter in `_order` whose reduction has not started
        self._synchronized = False
        self._should_synchronize = True
        # The hooks hold the optimizer weakly: once a script drops it (say, for a new one over the
        # same model), its hooks stop counting backward passes instead of keeping it alive.
        ref = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            opt = ref()
            if opt is not None:
                opt._grad_ready(p)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in self._order]

    def _reset(self) -> None:
        self._handles.clear()
        self._next = 0
        self._delay = dict.fromkeys(self._order, self.backward_passes_per_step)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before gradients are reduced."""
        self.backward_passes_per_step = passes
        self._reset()

    def _grad_ready(self, p: torch.Tensor) -> None:
        if self._delay[p] <= 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                "Increase backward_passes_per_step to accumulate gradients locally."
            )
        self._delay[p] -= 1
        if self._delay[p] == 0:
            self._start_ready()

    def _start_ready(self, flush: bool = False) -> None:
        while self._next < len(self._order):
            p = self._order[self._next]
            if self._delay[p] > 0 and not flush:
                return
            self._handles[p] = self._reduce_async(p)
            self._next += 1

    def _reduce_async(self, p: torch.Tensor) -> tuple[_Handle, Any]:
        name = self._parameter_names.get(p)
        grad = p.grad
        if grad is None:  # unused here, perhaps used on another rank
            grad = p.grad = torch.zeros_like(p)
        elif grad.is_sparse:
            if not self.sparse_as_dense:
                # Indices and values gathered from every rank; `synchronize` calls the result.
                return sparse_allreduce_async(grad, name=name, op=self.op), None
            # Reduced dense; `synchronize` hands the optimizer a sparse gradient again.
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            pre, post = 1.0, 1.0
        return allreduce_async_(compressed, name=name, op=self.op, prescale_factor=pre, postscale_factor=post), ctx

    def synchronize(self) -> None:
        """Finish reducing every gradient (e.g. before clipping); then call `step()` inside
        `skip_synchronize()`."""
        self._start_ready(flush=True)
        for p, (handle, ctx) in self._handles.items():
            out = handle() if callable(handle) else self._compression.decompress(synchronize(handle), ctx)
            if p.grad.is_sparse:  # optimizers for sparse gradients (SparseAdam) take only sparse ones
                p.grad = out if out.is_sparse else out.to_sparse(p.grad.sparse_dim())
            elif out is not p.grad:
                p.grad.copy_(out)
        self._reset()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`step()` inside this block applies the gradients as they are (already synchronized)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Reduce the gradients (unless inside `skip_synchronize()`), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                # Horovod warns and reduces again; reducing already-reduced gradients would
                # change them under op=Sum, so they are left as they are.
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(); the gradients are not reduced a second time.",
                    stacklevel=2,
                )
            else:
                self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; refused between backward() and step()/synchronize() (a reduction may be in flight)."""
        if self._handles or any(d != self.backward_passes_per_step for d in self._delay.values()):
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). This is prohibited as it can cause a race condition."
            )
        return super().zero_grad(set_to_none=set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load the wrapped optimizer's state and forget any pending reduction."""
        self._reset()
        self._synchronized, self._should_synchronize = False, True
        return super().load_state_dict(state_dict)


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
) -> torch.optim.Optimizer:
    """An optimizer of the same class as `optimizer` (over its param groups; its state is not
    carried over) that averages (or, with `op=Sum`, sums) gradients across processes before each
    `step()`. `num_groups`/`groups` only tune Horovod's tensor fusion and are ignored here."""
    _check_process_set(process_set)
    op = _resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    _topo()
    base = type(optimizer)
    # A subclass, so isinstance checks (LR schedulers, AMP) still see the user's optimizer class.
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    return cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
    )


# The rest of the collectives live in their own module, which builds on the ones above.
from trainer.horovod.collectives import (  # noqa: E402
    alltoall,
    alltoall_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
)
