"""The `horovod.torch` API, implemented on torch.distributed (gloo on CPU, NCCL on GPUs).

Ranks come from the environment torchrun or the Training Operator sets (see
trainer/launch/spec.py): under torchrun `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
`GROUP_RANK`, `GROUP_WORLD_SIZE`; in a PyTorchJob pod started without torchrun (one process per
pod) the operator's `RANK`/`WORLD_SIZE` are process ranks and every pod is its own node. With no
such variables a script is rank 0 of 1.

Every collective starts with `_collective_group` (process set and root validated, then the
consistency check; see "the collective protocol" below): before the data moves, the processes of
the set compare a descriptor of the collective (kind, name, shapes, dtypes, root, op) over a gloo
side group, and a disagreement raises one HorovodInternalError on every process naming both
sides, instead of a hang or a gloo abort. A process that never arrives fails the others after
KFTRAIN_HOROVOD_CHECK_TIMEOUT_S (default 60, Horovod's stall-warning time; a barrier's or a
broadcast's after KFTRAIN_HOROVOD_TIMEOUT_S, see PATIENT_KINDS);
KFTRAIN_HOROVOD_CHECKS=0 turns the checks off (and `join()` back into a barrier).
`DistributedOptimizer`, grouped allreduce and `broadcast_parameters` check once per group (an
optimizer's steady-state check runs behind its reductions, see `_DistributedOptimizer._start_check`).

Differences from Horovod that a script can notice, each deliberate:

- collectives are issued in program order, not negotiated by name: every rank must call the same
  collectives in the same order (as with torch.distributed); `name=` must then agree too.
- DistributedOptimizer reduces gradients one tensor at a time in a fixed parameter order (started
  from the backward hooks as soon as that order allows), with no tensor fusion; `groups` and
  `num_groups` are accepted and ignored.
- Elastic training raises ShimUnsupportedError (not a RuntimeError, so
  a script catching Horovod's RuntimeErrors does not swallow it) naming what to use instead;
  Adasum raises NotImplementedError, Horovod's own type for an Adasum it cannot run.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import enum
import functools
import gc
import hashlib
import importlib
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions, AllreduceOptions

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
    "ShimUnsupportedError",
    "ShimUnsupportedImportError",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
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
    "handle_average_backwards_compatibility",
    "init",
    "is_homogeneous",
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
    "remove_process_set",
    "rocm_built",
    "shutdown",
    "size",
    "sparse_allreduce_async",
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


class HorovodInternalError(RuntimeError):
    """A collective failed or the processes disagree about one (Horovod's type for both)."""


class HorovodEnvironmentError(ValueError, RuntimeError):
    """The process's environment is not one a job runs with (a rank or size that is no number,
    a KFTRAIN_HOROVOD_* setting out of range, a pod that needs torchrun): `horovod-run` says it in
    one line, naming the variable. A ValueError (a bad value) and a RuntimeError (as the shim
    raised for a pod that needs torchrun), for code that catches either."""


class ShimUnsupportedError(Exception):
    """A Horovod feature kftrain's shim does not provide; the message says what to use instead.

    Deliberately not a RuntimeError: a script that catches RuntimeError for Horovod's own
    collective failures must not swallow it."""


class ShimUnsupportedImportError(ShimUnsupportedError, ImportError):
    """A Horovod module the shim does not provide (`horovod.torch.elastic`), at its import: also an
    ImportError, so a script that probes for it (`try: from horovod.torch.elastic import ...
    except ImportError:`) takes its own fallback, as with a Horovod built without it."""


class ShimUnsupportedAttributeError(ShimUnsupportedError, AttributeError):
    """A name of `hvd.elastic`, which the shim does not provide: also an AttributeError, so a
    script that probes for it (`hasattr(hvd.elastic, "run")`, `getattr(..., None)`) takes its own
    fallback."""


class AdasumUnsupportedError(NotImplementedError, ShimUnsupportedError):
    """Adasum, which the shim does not provide: Horovod's own type for an Adasum it cannot run
    (NotImplementedError), and the shim's, so that the launcher ends on its one line."""


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
        raise ShimUnsupportedAttributeError(ELASTIC_MESSAGE)


elastic = _Elastic()


class ProcessSet:
    """Processes that run collectives among themselves (Horovod's `hvd.ProcessSet`), given by
    their global ranks.

    Register one on every process, in the same order: `hvd.init(process_sets=[...])` or, after
    init, `hvd.add_process_set(...)`; then pass it as `process_set=` to any collective, which only
    its members call. A `root_rank` stays a global rank that belongs to the set."""

    def __init__(self, ranks_or_comm: Any) -> None:
        if isinstance(ranks_or_comm, (str, bytes, Mapping)) or not isinstance(ranks_or_comm, Iterable):
            raise ValueError(
                "ProcessSet should be initialized with a list of process ranks (a communicator needs MPI, "
                f"which kftrain's Horovod shim does not have); got {ranks_or_comm!r}"
            )
        ranks = list(ranks_or_comm)
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError(f"ProcessSet should be initialized with a list of integer process ranks, got {ranks}")
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}")
        self.ranks: list[int] = sorted(ranks)
        self.process_set_id: int | None = None
        self.mpi_comm = None

    def _invalidate(self) -> None:
        self.process_set_id = None

    def included(self) -> bool:
        """Whether this process belongs to the set."""
        return rank() in self.ranks

    def rank(self) -> int | None:
        """This process's rank within the set (its index among the sorted ranks); None if the set
        is not registered; ValueError if this process is not in it (as Horovod)."""
        if self.process_set_id is None:
            return None
        if rank() not in self.ranks:
            raise ValueError(f"Process is not part of provided process set: rank {rank()} is not in {self}")
        return self.ranks.index(rank())

    def size(self) -> int | None:
        """Processes in the set; None if the set is not registered."""
        return None if self.process_set_id is None else len(self.ranks)

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0  # its ranks are filled in by init


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a process set after init and return it; every process must call this (members or
    not), with the same ranks, in the same order. No registered set may have the same ranks."""
    _topo()
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    _register(ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (on every process); False for the global set or one not registered."""
    pid = getattr(process_set, "process_set_id", None)
    if not pid or _state.topology is None or pid not in _state.sets:
        return False
    st = _state.sets.pop(pid)
    process_set._invalidate()
    for group in (st.group, st.side):
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER and dist.is_initialized():
            dist.destroy_process_group(group)
    return True


# --- topology and lifetime -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Topology:
    """Where this process sits: global, per-node (local) and across-node (cross) ranks."""

    rank: int = 0
    """This process's rank among all processes (`hvd.rank()`)."""
    size: int = 1
    """Processes in the job (`hvd.size()`)."""
    local_rank: int = 0
    """This process's rank on its node, its GPU index (`hvd.local_rank()`)."""
    local_size: int = 1
    """Processes on this node (`hvd.local_size()`)."""
    cross_rank: int = 0
    """This node's rank among the nodes (`hvd.cross_rank()`)."""
    cross_size: int = 1
    """Nodes in the job (`hvd.cross_size()`)."""


def topology(environ: Mapping[str, str] = os.environ) -> Topology:
    """This process's ranks from the torchrun / PyTorchJob environment (rank 0 of 1 without one)."""
    world = _env_int(environ, "WORLD_SIZE", 1, minimum=1)
    if world > 1 and "RANK" not in environ:
        # Every process would be rank 0 of the job, and the rendezvous fails asking for RANK.
        raise HorovodEnvironmentError(
            f"WORLD_SIZE={world} but no RANK: each process of a job needs its own; start the script through "
            "torchrun (python -m torch.distributed.run -m trainer.horovod.run SCRIPT [ARGS]), which sets both, or "
            "unset WORLD_SIZE to run one process"
        )
    rank_ = _env_int(environ, "RANK", 0, minimum=0)
    if rank_ >= world:
        raise HorovodEnvironmentError(f"RANK={rank_} is not a rank of WORLD_SIZE={world} processes (0..{world - 1})")
    if "LOCAL_RANK" in environ:  # torchrun (or anything that follows its contract)
        local_size = _env_int(environ, "LOCAL_WORLD_SIZE", 1, minimum=1)
        topo = Topology(
            rank=rank_,
            size=world,
            local_rank=_env_int(environ, "LOCAL_RANK", 0, minimum=0),
            local_size=local_size,
            cross_rank=_env_int(environ, "GROUP_RANK", rank_ // local_size, minimum=0),
            cross_size=_env_int(environ, "GROUP_WORLD_SIZE", world // local_size, minimum=1),
        )
        for of, size, rank_name, size_name in (
            (topo.local_rank, local_size, "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
            (topo.cross_rank, topo.cross_size, "GROUP_RANK", "GROUP_WORLD_SIZE"),
        ):
            if of >= size:
                raise HorovodEnvironmentError(f"{rank_name}={of} is not below {size_name}={size}")
        return topo
    nproc = environ.get("PET_NPROC_PER_NODE", "1")
    if nproc.isdigit() and int(nproc) > 1:
        # The operator's RANK is then a node rank, not a process rank.
        raise HorovodEnvironmentError(
            f"PET_NPROC_PER_NODE={nproc} but no LOCAL_RANK: with several processes per pod start the script "
            "through torchrun: python -m torch.distributed.run -m trainer.horovod.run SCRIPT [ARGS]"
        )
    nnodes = environ.get("PET_NNODES", "1")
    if "RANK" not in environ and nnodes.isdigit() and int(nnodes) > 1:
        # A Trainer v2 TrainJob injects only PET_*: without torchrun no process knows its rank,
        # and every pod would silently train alone as rank 0 of 1.
        raise HorovodEnvironmentError(
            f"PET_NNODES={nnodes} but no RANK or LOCAL_RANK (a Kubeflow Trainer v2 TrainJob sets only PET_*): "
            "start the script through torchrun: python -m torch.distributed.run -m trainer.horovod.run SCRIPT [ARGS]"
        )
    # One process per pod: the operator's RANK/WORLD_SIZE are process ranks, each pod a node.
    return Topology(rank=rank_, size=world, local_rank=0, local_size=1, cross_rank=rank_, cross_size=world)


def _check_rendezvous(environ: Mapping[str, str]) -> None:
    """MASTER_ADDR and MASTER_PORT, where the ranks meet (torch's env:// rendezvous; torchrun and
    the operator set both), are given and well formed (was: torch's traceback, `MASTER_ADDR
    expected`, or `invalid literal for int()` naming no variable)."""
    if not environ.get("MASTER_ADDR", "").strip():
        raise HorovodEnvironmentError(
            "MASTER_ADDR is not set: the ranks meet at rank 0's address (MASTER_ADDR, MASTER_PORT), which torchrun "
            "and the Training Operator set; start the script through them, or set both"
        )
    if "MASTER_PORT" not in environ:
        raise HorovodEnvironmentError("MASTER_PORT is not set: the port rank 0 listens on, beside MASTER_ADDR")
    if _env_int(environ, "MASTER_PORT", 0, minimum=1) > 65535:
        raise HorovodEnvironmentError(f"MASTER_PORT={environ['MASTER_PORT']!r} is not a port (1-65535)")


def _env_int(environ: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    """The whole number `environ[name]` (`default` when unset), at least `minimum`."""
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise HorovodEnvironmentError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise HorovodEnvironmentError(f"{name}={raw!r} must be at least {minimum}")
    return value


@dataclass(slots=True)
class _SetState:
    """A registered process set: its data group and the gloo side group its descriptors travel on."""

    ranks: tuple[int, ...]
    group: Any  # None: the default (world) group
    side: Any  # None when the set has one process: nothing to agree with
    owner: ProcessSet
    seq: int = 0  # collectives issued on this set so far: the number each check compares
    # Checks started and not yet finished (DistributedOptimizer's, in steady state), oldest first.
    pending: list[Any] = field(default_factory=list)


class _State:
    topology: Topology | None = None
    owns_group = False
    checks = True
    check_timeout = datetime.timedelta(seconds=60)
    # How long a collective's data may take (KFTRAIN_HOROVOD_TIMEOUT_S); also the patient kinds' checks.
    timeout = datetime.timedelta(seconds=1800)
    sets: dict[int, _SetState] = {}
    next_set_id = 1
    # The rendezvous store lives as long as the process: every init after a shutdown works under
    # a fresh key prefix of it, so no rank ever meets a store another rank is tearing down.
    store: Any = None
    incarnation = 0
    atexit_registered = False
    # Whether shutdown waits for the other processes (not at an exit by an uncaught error).
    leave_together = True


_state = _State()


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise HorovodEnvironmentError(f"{name}={value!r}: use 1 (on) or 0 (off)")


#: The longest wait a KFTRAIN_HOROVOD_*_TIMEOUT_S may set (a week; past it, a typo).
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _env_seconds(name: str, default: float) -> datetime.timedelta:
    raw = os.environ.get(name, "")
    try:
        seconds = float(raw) if raw.strip() else default
    except ValueError:
        raise HorovodEnvironmentError(f"{name}={raw!r} is not a number of seconds") from None
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise HorovodEnvironmentError(
            f"{name}={raw!r} must be a positive number of seconds, at most {MAX_TIMEOUT_S:.0f} (a week)"
        )
    return datetime.timedelta(seconds=seconds)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job's process group (idempotent): gloo for CPU tensors, and NCCL for CUDA tensors
    with the CUDA device set from the local rank when GPUs are present.

    `process_sets`: ProcessSet objects (or rank lists) to register now, on every process alike,
    or "dynamic" (accepted: sets can always be added later with `add_process_set`)."""
    if comm is not None:
        raise ShimUnsupportedError(
            "hvd.init(comm=...) is not supported by kftrain's Horovod shim: there is no MPI; ranks come from "
            "torchrun or the PyTorchJob environment (use hvd.init() and, for sub-groups, process_sets=[...])"
        )
    if process_sets == "dynamic":
        process_sets = None
    if process_sets is not None and (isinstance(process_sets, (str, bytes)) or not isinstance(process_sets, Iterable)):
        raise ValueError(f"process_sets must be a list of ProcessSet objects or 'dynamic', got {process_sets!r}")
    if _state.topology is not None:
        return
    _state.checks = _env_flag("KFTRAIN_HOROVOD_CHECKS", True)
    _state.check_timeout = _env_seconds("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", 60.0)
    timeout = _state.timeout = _env_seconds("KFTRAIN_HOROVOD_TIMEOUT_S", 1800.0)
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
        if topo.size == 1 and "MASTER_ADDR" not in os.environ:
            # A plain `python script.py`: an in-memory store, no port to pick.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            if _state.store is None:
                _check_rendezvous(os.environ)
                _state.store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
            store = dist.PrefixStore(f"kftrain-horovod/{_state.incarnation}/", _state.store)
            dist.init_process_group(backend, store=store, rank=topo.rank, world_size=topo.size, timeout=timeout)
        _state.incarnation += 1
        _state.owns_group = True
        if not _state.atexit_registered:
            atexit.register(_at_exit)
            _state.atexit_registered = True
    _state.topology = topo
    global_process_set.ranks = list(range(topo.size))
    side = dist.new_group(backend="gloo", timeout=timeout) if topo.size > 1 else None
    _state.sets = {0: _SetState(tuple(range(topo.size)), None, side, global_process_set)}
    _state.next_set_id = 1
    for ps in process_sets or ():
        _register(ps if isinstance(ps, ProcessSet) else ProcessSet(ps))
    if os.environ.get("HOROVOD_TIMELINE") and topo.rank == 0:
        # horovodrun --timeline-filename sets it; a file that silently never appears would puzzle.
        print(
            "kftrain horovod shim: HOROVOD_TIMELINE is not read here; call hvd.start_timeline(path) and "
            "hvd.stop_timeline() around the steps to record (docs/horovod.md)",
            file=sys.stderr,
        )


def _register(ps: ProcessSet) -> None:
    n = size()
    if not ps.ranks or any(not 0 <= r < n for r in ps.ranks):
        raise ValueError(f"{ps}: ranks must be a non-empty list of ranks of this job (0 to {n - 1})")
    if ps.process_set_id is not None and _state.sets.get(ps.process_set_id, None) is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {ps} is already registered")
    if any(st.ranks == tuple(ps.ranks) for st in _state.sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {ps} (a registered set has these ranks)")
    timeout = _state.timeout
    # new_group is collective over the whole job: every process takes part, members or not.
    group = dist.new_group(ps.ranks, timeout=timeout)
    side = dist.new_group(ps.ranks, backend="gloo", timeout=timeout) if len(ps.ranks) > 1 else None
    ps.process_set_id = _state.next_set_id
    _state.next_set_id += 1
    _state.sets[ps.process_set_id] = _SetState(tuple(ps.ranks), group, side, ps)


def ending_on_error() -> None:
    """The script ended on an uncaught error: `shutdown` at exit does not wait for the other
    processes (they may never come, and the job should learn of the failure at once)."""
    _state.leave_together = False


def _at_exit() -> None:
    if hasattr(sys, "last_value"):  # `python script.py` ended on an uncaught error, printed
        ending_on_error()
        # Its frames may hold process groups: they let go now, not in the interpreter's teardown.
        sys.last_traceback = sys.last_value.__traceback__ = None
    shutdown()
    # The store outlives shutdown() for the next init(); at exit it goes while the interpreter
    # is still whole, not in its teardown (where dropping it can abort the process).
    _state.store = None


#: Called (once each) first thing in `shutdown`, which also runs at exit: what must end while the
#: process is whole (a timeline's profiler, which left running aborts the interpreter's teardown).
_ON_SHUTDOWN: list[Callable[[], None]] = []


def shutdown() -> None:
    """Leave the process group (if `init` made it); safe to call more than once. `init` may be
    called again afterwards (process sets must then be registered again). A timeline being
    recorded is written, as Horovod closes its timeline at shutdown."""
    while _ON_SHUTDOWN:
        hook = _ON_SHUTDOWN.pop()
        try:
            hook()
        except Exception as exc:  # the groups are torn down whatever a hook met (a full disk)
            print(f"kftrain horovod shim: hvd.shutdown(): {type(exc).__name__}: {exc}", file=sys.stderr)
    if _state.leave_together:
        _leave_together()
    destroyed = False
    for pid, st in list(_state.sets.items()):
        if pid:
            st.owner._invalidate()
        if not _state.owns_group and dist.is_initialized():  # the script's group stays: drop only ours
            for group in (st.group, st.side):
                if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                    dist.destroy_process_group(group)
                    destroyed = True
    _state.sets = {}
    # Whatever still holds a group (a caught error's traceback) lets go before the groups are
    # destroyed, rather than in the interpreter's teardown, where that aborts the process.
    gc.collect()
    if _state.owns_group and dist.is_initialized():
        dist.destroy_process_group()
        destroyed = True
    if destroyed:  # gloo's workers asleep before the script's teardown can meet them
        from trainer.distributed import comm_threads_settled

        comm_threads_settled()
    _state.topology, _state.owns_group = None, False


def _leave_together() -> None:
    """Wait until every process got to its shutdown, for at most the check timeout: a gloo rank
    that tears its groups down while a peer still works in them can abort the peer ("terminate
    called without an active exception"). It is a round of the collective protocol, so a peer
    that issues a collective instead learns at once that this process has shut down; a peer that
    failed or left only costs the wait."""
    st = _state.sets.get(0)
    if st is None or st.side is None or not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # a peer gone, or one that called a collective: it is told
        while st.pending:  # this process's own checks in flight come first (as in join())
            st.pending[0].finish()
        codes, _ = _exchange(st, _SHUTDOWN, st.seq, _ACTIVE, _state.check_timeout)
        active = [i for i, code in enumerate(codes) if code == _ACTIVE]
        if len(active) < len(codes):  # processes in join() read what the first active one does
            box = [_SHUTDOWN if st.ranks[active[0]] == rank() else None]
            dist.broadcast_object_list(box, src=st.ranks[active[0]], group=st.side)


def is_initialized() -> bool:
    """Whether `init` has run (and `shutdown` has not)."""
    return _state.topology is not None


def _topo() -> Topology:
    if _state.topology is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _state.topology


def _topology_reader(name: str, doc: str) -> Callable[[], int]:
    """Horovod's function `name`: one field of the topology `init` found."""

    def read() -> int:
        return getattr(_topo(), name)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = doc
    return read


def _fixed_answer(name: str, value: bool, doc: str) -> Callable[[], bool]:
    """Horovod's build-query function `name`, whose answer is the same in every kftrain process."""

    def answer() -> bool:
        return value

    answer.__name__ = answer.__qualname__ = name
    answer.__doc__ = doc
    return answer


rank = _topology_reader("rank", "This process's rank among all processes.")
size = _topology_reader("size", "Processes in the job.")
local_rank = _topology_reader("local_rank", "This process's rank on its node (its GPU index).")
local_size = _topology_reader("local_size", "Processes on this node.")
cross_rank = _topology_reader("cross_rank", "This node's rank among the nodes.")
cross_size = _topology_reader("cross_size", "Nodes in the job.")
mpi_threads_supported = _fixed_answer("mpi_threads_supported", False, "No MPI here.")
mpi_enabled = _fixed_answer("mpi_enabled", False, "No MPI here.")
mpi_built = _fixed_answer("mpi_built", False, "No MPI here.")
gloo_enabled = _fixed_answer("gloo_enabled", True, "gloo carries CPU tensors.")
gloo_built = _fixed_answer("gloo_built", True, "gloo carries CPU tensors.")
ddl_built = _fixed_answer("ddl_built", False, "No IBM DDL here.")
ccl_built = _fixed_answer("ccl_built", False, "No oneCCL here.")


def is_homogeneous() -> bool:
    """Whether every node runs as many processes as this one: always in a job of kftrain's (one
    `nprocPerNode` for every replica), as the topology `init` found says."""
    topo = _topo()
    return topo.size == topo.local_size * topo.cross_size


def handle_average_backwards_compatibility(op: Any, average: bool | None) -> Any:
    """The op of a call given `op` or the older `average` flag (Horovod's helper for both forms):
    `op` where given, else Average or Sum as `average` says (Average when neither is)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is not None:
        return op
    return Average if average is None or average else Sum


def nccl_built() -> int:
    """NCCL's version code (e.g. 22105 for 2.21.5; Horovod's NCCL_VERSION_CODE) when NCCL carries
    CUDA tensors here, else 0."""
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return 0
    return nccl_version_code(torch.cuda.nccl.version())


def nccl_version_code(version: tuple[int, ...] | int) -> int:
    """NCCL's NCCL_VERSION_CODE for a (major, minor, patch) version: X*1000+Y*100+Z up to 2.8,
    X*10000+Y*100+Z from 2.9 on (torch's older builds give the code itself, an int)."""
    if isinstance(version, int):
        return version
    major, minor, patch = (tuple(version) + (0, 0))[:3]
    if (major, minor) <= (2, 8):
        return major * 1000 + minor * 100 + patch
    return major * 10000 + minor * 100 + patch


def cuda_built() -> bool:
    """CUDA is available to this process."""
    return torch.cuda.is_available()


def rocm_built() -> bool:
    """This torch build targets ROCm."""
    return bool(getattr(torch.version, "hip", None))


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


# --- the collective protocol: process sets, consistency checks, join ------------------------
#
# Every collective starts with `_collective_group`. With checks on (the default), the processes
# of the set first exchange a few integers on a gloo side group (one MAX-allreduce, see
# `_exchange`): the collective's number on this set, a hash of its descriptor (kind, name,
# shapes, dtypes, root, detail), and whether the process has joined. All equal: the collective
# proceeds on the data group. Not: every process gathers the full descriptors and raises one
# HorovodInternalError naming both sides. A process that never arrives: the others' side exchange times out after
# KFTRAIN_HOROVOD_CHECK_TIMEOUT_S. A process in `join()` answers each exchange as joined, reads
# the collective from the lowest active rank and takes part with zeros (allreduce), as Horovod.

# Each process's state in the exchange: active, or joined (1 + the rounds it has answered since).
_ACTIVE = 0
_NOTHING = -(2**62)  # what a joined process sends for the hash and number: never the maximum
# Kinds whose tensors may differ in their first dimension across ranks (Horovod's allgather):
# the descriptor hashes the other dimensions and the Agreement carries every rank's first ones.
FIRST_DIM_FREE_KINDS = {"allgather"}
# Kinds the other processes reach first by design and wait in, as long as it takes (Horovod waits
# without limit): a barrier, and a broadcast, which follows what its root alone prepares (rank 0
# downloading the data, loading a checkpoint before `broadcast_parameters`). Their checks wait up to
# KFTRAIN_HOROVOD_TIMEOUT_S, not KFTRAIN_HOROVOD_CHECK_TIMEOUT_S.
PATIENT_KINDS = {"barrier", "broadcast", "broadcast_object"}


class TensorSpec(NamedTuple):
    """A tensor as the descriptor sees it (stands in for one not yet computed)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    cuda: bool = False
    #: A sparse COO tensor (its shape the dense one's): it travels by other collectives than a dense
    #: one, so a rank passing one where another passes a dense tensor would wait forever.
    sparse: bool = False

    @classmethod
    def of(cls, t: torch.Tensor | TensorSpec) -> TensorSpec:
        """The spec of a tensor (a spec is returned as it is)."""
        if isinstance(t, TensorSpec):
            return t
        return cls(tuple(t.shape), t.dtype, t.is_cuda, t.is_sparse)

    def __str__(self) -> str:
        return f"{'sparse ' if self.sparse else ''}{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


class _Desc(NamedTuple):
    kind: str
    names: tuple[str, ...]
    tensors: tuple[TensorSpec, ...]
    root: int | None
    detail: tuple


# What a process sends in its last round, `shutdown()`: a collective's peers see it as the kind.
_SHUTDOWN = _Desc("shutdown", (), (), None, ())


@dataclass(frozen=True, slots=True)
class Agreement:
    """What `_collective_group` returns: where to issue the collective and what the set agreed on.

    `group` is the torch ProcessGroup (None: the default group); `rank`/`size` are within the set;
    `ranks` its global ranks; `joined` the global ranks that have called `join()` (they contribute
    zeros to allreduce); `index` the collective's number on the set; `root_rank` the global root and
    `group_root` its rank within the set; `first_dims[r][i]`, for FIRST_DIM_FREE_KINDS, the first
    dimension of tensor i on the set's r-th process."""

    group: Any
    ranks: tuple[int, ...]
    rank: int
    size: int
    joined: tuple[int, ...] = ()
    index: int = 0
    root_rank: int | None = None
    group_root: int | None = None
    first_dims: tuple[tuple[int, ...], ...] | None = None


def _set_state(process_set: Any) -> _SetState:
    _topo()
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be an hvd.ProcessSet (default hvd.global_process_set), got {process_set!r}")
    st = _state.sets.get(process_set.process_set_id) if process_set.process_set_id is not None else None
    if st is None or st.owner is not process_set:
        raise ValueError(
            f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or hvd.add_process_set(...) "
            "on every process first"
        )
    if rank() not in st.ranks:
        raise ValueError(f"rank {rank()} is not a member of {process_set}: only its members may use it")
    return st


def _names(name: str | Sequence[str] | None) -> tuple[str, ...]:
    if name is None:
        return ()
    if isinstance(name, str):
        return (name,)
    return tuple(str(x) for x in name)


@functools.lru_cache(maxsize=256)
def _hash(desc: _Desc) -> int:
    tensors = desc.tensors
    if desc.kind in FIRST_DIM_FREE_KINDS:
        tensors = tuple(TensorSpec((-1, *t.shape[1:]), t.dtype, t.cuda, t.sparse) for t in tensors)
    key = repr((desc.kind, desc.names, tensors, desc.root, desc.detail)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")


def _all_gather_words(st: _SetState, words: list[int], timeout: datetime.timedelta | None) -> list[list[int]]:
    t = torch.tensor(words, dtype=torch.int64)
    out = [torch.empty_like(t) for _ in st.ranks]
    opts = AllgatherOptions()
    if timeout is not None:
        opts.timeout = timeout
    st.side.allgather([out], [t], opts).wait()
    return [o.tolist() for o in out]


def _collective_group(
    kind: str,
    tensors: Sequence[torch.Tensor | TensorSpec],
    *,
    name: str | Sequence[str] | None,
    process_set: Any,
    root_rank: int | None = None,
    detail: tuple = (),
) -> Agreement:
    """The entry point of every collective: validate `process_set` (this process must be in it)
    and `root_rank` (a global rank in the set), check that every process of the set issues the
    same collective (kind, name, shapes, dtypes, root, detail: raising HorovodInternalError on every
    process if not), and say where to issue it. `detail`: any other per-call data that must agree,
    best as (label, value) pairs, which the mismatch message shows as label=value."""
    return _start_check(kind, tensors, name, process_set, root_rank, detail).finish()


class _Check:
    """A consistency check on its way: `agreement` is usable at once for where to issue the data
    (group, size, ranks); `finish()` waits for the exchange and returns the checked Agreement."""

    __slots__ = ("agreement", "desc", "error", "start", "st", "timeout", "words", "work")

    def __init__(self, st: _SetState, agreement: Agreement, desc: _Desc | None) -> None:
        self.st, self.agreement, self.desc = st, agreement, desc
        self.work = self.words = self.error = None
        self.start, self.timeout = time.monotonic(), _check_timeout(desc.kind if desc else "")

    def finish(self) -> Agreement:
        """Wait for the exchange (once) and act on it; raises HorovodInternalError as _exchange."""
        if self.error is not None:
            raise self.error
        if self.work is not None:
            work, self.work = self.work, None
            if self in self.st.pending:
                self.st.pending.remove(self)
            try:
                self.agreement = self._decide(work)
            except HorovodInternalError as exc:
                # A copy without the traceback: the raised one's frames hold this check, and a
                # cycle would keep the side group alive until interpreter teardown.
                self.error = HorovodInternalError(str(exc))
                raise
        return self.agreement

    def _decide(self, work: Any) -> Agreement:
        st, desc, agreement = self.st, self.desc, self.agreement
        codes, _ = _exchange_finish(st, desc, agreement.index, self.words, work, self.start, self.timeout)
        joined = tuple(st.ranks[i] for i, code in enumerate(codes) if code != _ACTIVE)
        if joined:
            active = [i for i, code in enumerate(codes) if code == _ACTIVE]
            box = [desc if agreement.rank == active[0] else None]
            dist.broadcast_object_list(box, src=st.ranks[active[0]], group=st.side)
            if desc.kind not in JOIN_MIRRORS:
                raise HorovodInternalError(_join_unsupported(desc.kind))
            agreement = replace(agreement, joined=joined)
        if desc.kind in FIRST_DIM_FREE_KINDS:
            dims = _all_gather_words(st, [_first_dim(t) for t in desc.tensors], None)
            agreement = replace(agreement, first_dims=tuple(tuple(d) for d in dims))
        return agreement


def _start_check(
    kind: str,
    tensors: Sequence[torch.Tensor | TensorSpec],
    name: str | Sequence[str] | None,
    process_set: Any,
    root_rank: int | None = None,
    detail: tuple = (),
) -> _Check:
    """`_collective_group` without waiting: validate, start the exchange, return the check."""
    st = _set_state(process_set)
    # Checks still in flight on this set finish first, so that every process acts on them at the
    # same point of its sequence of collectives.
    while st.pending:
        st.pending[0].finish()
    me = st.ranks.index(rank())
    group_root = None
    if root_rank is not None:
        if isinstance(root_rank, bool) or not isinstance(root_rank, int):
            raise ValueError(f"root_rank must be an int (a rank), got {type(root_rank).__name__} {root_rank!r}")
        if root_rank not in st.ranks:
            where = "this job" if st.owner is global_process_set else str(st.owner)
            raise ValueError(f"root_rank {root_rank} is not a rank of {where} (ranks {list(st.ranks)})")
        group_root = st.ranks.index(root_rank)
    index = st.seq
    st.seq += 1
    agreement = Agreement(st.group, st.ranks, me, len(st.ranks), (), index, root_rank, group_root)
    specs = tuple(TensorSpec.of(t) for t in tensors)
    desc = _Desc(kind, _names(name), specs, root_rank, tuple(detail))
    check = _Check(st, agreement, desc)
    if st.side is None:
        if kind in FIRST_DIM_FREE_KINDS:
            check.agreement = replace(agreement, first_dims=(tuple(_first_dim(t) for t in specs),))
        return check
    if not _state.checks:
        if kind in FIRST_DIM_FREE_KINDS:
            dims = _all_gather_words(st, [_first_dim(t) for t in specs], None)
            check.agreement = replace(agreement, first_dims=tuple(tuple(d) for d in dims))
        return check
    check.words, check.work = _exchange_start(st, desc, index, _ACTIVE, check.timeout)
    st.pending.append(check)
    return check


def _check_timeout(kind: str) -> datetime.timedelta:
    """How long the processes of a set wait for each other in the check of a `kind` collective
    (the variable `_timeout_variable` names): KFTRAIN_HOROVOD_CHECK_TIMEOUT_S, except where waiting
    is what the collective is for (:data:`PATIENT_KINDS`), whose checks wait as long as the data may take."""
    return _state.timeout if kind in PATIENT_KINDS else _state.check_timeout


def _first_dim(t: torch.Tensor | TensorSpec) -> int:
    shape = TensorSpec.of(t).shape
    return shape[0] if shape else 1


def _join_unsupported(kind: str) -> str:
    word = kind.removeprefix("grouped_").split("_")[0].capitalize()
    return f"{word} is not supported with Join at this time (a rank has called hvd.join(); only allreduce is)."


def _exchange_start(
    st: _SetState, desc: _Desc | None, seq: int, code: int, timeout: datetime.timedelta | None
) -> tuple[torch.Tensor, Any]:
    """Start one round of the protocol (see `_exchange`)."""
    n, me = len(st.ranks), st.ranks.index(rank())
    words = [_NOTHING] * 4 + [-1] * n
    if desc is not None:
        h = _hash(desc)
        words[:4] = [h, -h, seq, -seq]
    words[4 + me] = code
    t = torch.tensor(words, dtype=torch.int64)
    opts = AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    if timeout is not None:
        opts.timeout = timeout
    return t, st.side.allreduce([t], opts)


def _timeout_variable(desc: _Desc | None) -> str:
    kind = desc.kind if desc else ""
    return "KFTRAIN_HOROVOD_TIMEOUT_S" if kind in PATIENT_KINDS else "KFTRAIN_HOROVOD_CHECK_TIMEOUT_S"


def _exchange_finish(
    st: _SetState,
    desc: _Desc | None,
    seq: int,
    t: torch.Tensor,
    work: Any,
    start: float,
    timeout: datetime.timedelta | None,
) -> tuple[list[int], int]:
    """Wait for a round started by `_exchange_start` and act on it (see `_exchange`)."""
    try:
        work.wait()
    except RuntimeError as exc:
        what = f"{desc.kind} at collective #{seq}{_quoted(desc.names)}" if desc else "hvd.join()"
        waited = time.monotonic() - start
        if timeout is not None and waited >= 0.9 * timeout.total_seconds():
            why = (
                f"not every process of {st.owner} reached this collective within {timeout.total_seconds():g} s "
                "(one may have skipped it or be stuck elsewhere). A process that is legitimately slower (rank 0 "
                f"saving a checkpoint) needs a larger {_timeout_variable(desc)}; KFTRAIN_HOROVOD_CHECKS=0 "
                "turns these checks off"
            )
        else:
            why = f"a process of {st.owner} left or failed before reaching this collective"
        raise HorovodInternalError(
            f"{what}: {why}. Every process must issue the same collectives in the same order. ({exc})"
        ) from exc
    w = t.tolist()
    codes = w[4:]
    if _ACTIVE in codes and (w[0] != -w[1] or w[2] != -w[3]):
        descs: list[Any] = [None] * len(st.ranks)
        dist.all_gather_object(descs, (seq, desc), group=st.side)
        raise HorovodInternalError(_mismatch_message(st, codes, descs))
    return codes, w[2]


def _exchange(
    st: _SetState, desc: _Desc | None, seq: int, code: int, timeout: datetime.timedelta | None
) -> tuple[list[int], int]:
    """One round of the protocol: every process's state code, and the number of the collective
    the active ones issue; raises on every process if the active ones disagree.

    One int64 MAX-allreduce carries it all: the hash and the number, each also negated (so the
    maximum of the negation is minus the minimum: equal maxima mean equal values), and one slot
    per process for its state code."""
    start = time.monotonic()
    t, work = _exchange_start(st, desc, seq, code, timeout)
    return _exchange_finish(st, desc, seq, t, work, start, timeout)


def _quoted(names: tuple[str, ...]) -> str:
    if len(names) > 3:  # a model's parameters: enough to recognise it
        shown = ", ".join(repr(n) for n in names[:2])
        return f" [{shown}, ... ({len(names)} names)]"
    return f" '{names[0]}'" if len(names) == 1 else (f" {list(names)}" if names else "")


def _mismatch_message(st: _SetState, codes: list[int], descs: list[Any]) -> str:
    active = [i for i, code in enumerate(codes) if code == _ACTIVE]
    keys = {i: (descs[i][0], _hash(descs[i][1])) for i in active}
    a = active[0]
    b = next(i for i in active[1:] if keys[i] != keys[a])
    (seq_a, da), (seq_b, db) = descs[a], descs[b]
    ra, rb = st.ranks[a], st.ranks[b]
    if seq_a != seq_b:
        return (
            f"collectives out of order: rank {ra} is at collective #{seq_a} ({_summary(da)}), rank {rb} at "
            f"collective #{seq_b} ({_summary(db)}); a rank skipped or added a collective"
        )
    head = f"{da.kind} mismatch at collective #{seq_a}{_quoted(da.names)}"
    if _SHUTDOWN in (da, db) and seq_a == seq_b:
        r_gone, here, r_here = (ra, db, rb) if da == _SHUTDOWN else (rb, da, ra)
        return (
            f"{_summary(here)} at collective #{seq_a} on rank {r_here} can never complete: rank {r_gone} has "
            "shut down (its script ended or called hvd.shutdown()); a collective after another process "
            "finished is an error, as in Horovod"
        )
    if da.kind != db.kind:
        return (
            f"order mismatch at collective #{seq_a}: rank {ra} called {_summary(da)}, rank {rb} called {_summary(db)}"
        )
    if da.names != db.names:
        na, nb = (_quoted(d.names).strip() or "no name" for d in (da, db))
        return f"{da.kind} name mismatch at collective #{seq_a}: rank {ra} passed {na}, rank {rb} passed {nb}"
    if len(da.tensors) != len(db.tensors):
        return f"{head}: rank {ra} passed {len(da.tensors)} tensors, rank {rb} passed {len(db.tensors)}"
    for i, (ta, tb) in enumerate(zip(da.tensors, db.tensors, strict=True)):
        if da.kind in FIRST_DIM_FREE_KINDS:
            same = ta.dtype == tb.dtype and ta.shape[1:] == tb.shape[1:] and len(ta.shape) == len(tb.shape)
        else:
            same = (ta.shape, ta.dtype) == (tb.shape, tb.dtype)
        if not same or (ta.cuda, ta.sparse) != (tb.cuda, tb.sparse):
            where = (
                f"collective #{seq_a} '{da.names[i]}'"
                if len(da.names) > 1
                else f"collective #{seq_a}{_quoted(da.names)}"
            )
            # What differs, in Horovod's terms: its own message says "Mismatched data types".
            if ta.dtype != tb.dtype:
                note = " (the data types differ)"
            elif ta.sparse != tb.sparse:
                note = " (one is sparse, the other dense)"
            elif ta.cuda == tb.cuda and da.kind in FIRST_DIM_FREE_KINDS:
                note = " (every dimension but the first must match)"
            else:
                note = ""
            a_, b_ = (f"{t}{' on cuda' if t.cuda else ''}" for t in (ta, tb))
            return f"{da.kind} mismatch at {where}: rank {ra} passed {a_}, rank {rb} passed {b_}{note}"
    if da.root != db.root:
        return f"{head}: rank {ra} passed root_rank {da.root}, rank {rb} passed root_rank {db.root}"
    return f"{head}: rank {ra} passed {_detail(da.detail)}, rank {rb} passed {_detail(db.detail)}"


def _detail(detail: tuple) -> str:
    if all(isinstance(d, tuple) and len(d) == 2 and isinstance(d[0], str) for d in detail):
        return ", ".join(f"{k}={v}" for k, v in detail)
    return repr(detail)


def _summary(desc: _Desc | None) -> str:
    if desc is None:
        return "hvd.join()"
    tensors = ", ".join(map(str, desc.tensors[:3])) + (", ..." if len(desc.tensors) > 3 else "")
    return f"{desc.kind}{_quoted(desc.names)} of {tensors or 'no tensors'}"


def _mirror_allreduce(desc: _Desc, st: _SetState, device: torch.device) -> None:
    op = _TORCH_OP[_Op[dict(desc.detail)["op"].upper()]]
    works = []
    for spec in desc.tensors:
        where = device if spec.cuda else torch.device("cpu")
        zeros = torch.zeros(spec.shape, dtype=_WIDER.get(spec.dtype, spec.dtype), device=where)
        works.append(dist.all_reduce(zeros, op=op, group=st.group, async_op=True))
    for w in works:
        w.wait()


# How a joined process takes part in a collective the others issue (Horovod: allreduce only;
# the barrier is the exchange itself).
JOIN_MIRRORS: dict[str, Callable[[_Desc, _SetState, torch.device], None]] = {
    "allreduce": _mirror_allreduce,
    "barrier": lambda desc, st, device: None,
}


def join(device: int = -1) -> int:
    """This process has run out of data: until every process has joined, take part in the
    others' allreduces with zeros (Average still divides by the full size, as Horovod does);
    return the rank that joined last (the same on every process).

    Other collectives issued while a process has joined raise HorovodInternalError, as in
    Horovod. With KFTRAIN_HOROVOD_CHECKS=0 join is a plain barrier."""
    _topo()
    st = _state.sets[0]
    if st.side is None:
        return rank()
    if not _state.checks:
        arrivals: list[Any] = [None] * size()
        dist.all_gather_object(arrivals, time.time())
        return max(range(len(arrivals)), key=lambda r: arrivals[r])
    while st.pending:  # this process's own checks in flight come first
        st.pending[0].finish()
    where = (
        torch.device("cuda", device if device >= 0 else torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    rounds = 0
    while True:
        codes, seq = _exchange(st, None, st.seq, 1 + rounds, None)
        active = [i for i, code in enumerate(codes) if code == _ACTIVE]
        if not active:
            st.seq += 1
            # The last to join has answered the fewest rounds; ties go to the highest rank.
            return st.ranks[max(range(len(codes)), key=lambda i: (-codes[i], i))]
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=st.ranks[active[0]], group=st.side)
        desc = box[0]
        st.seq = seq + 1
        if desc == _SHUTDOWN:
            raise HorovodInternalError(
                f"hvd.join() can never complete: rank {st.ranks[active[0]]} has shut down without joining (its "
                "script ended or called hvd.shutdown()); every process must call hvd.join() once it runs out of data"
            )
        mirror = JOIN_MIRRORS.get(desc.kind)
        if mirror is None:
            raise HorovodInternalError(_join_unsupported(desc.kind))
        mirror(desc, st, where)
        rounds += 1


# gloo and NCCL have no int16: such tensors travel widened and come back narrowed, exactly.
_WIDER = {torch.int16: torch.int32}
#: The other dense layout of a tensor of so many dimensions (a conv model's gradients).
_DENSE_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _widen(t: torch.Tensor, wider_dtypes: Mapping[torch.dtype, torch.dtype] = _WIDER) -> torch.Tensor:
    """What goes on the wire for `t`: `t` itself where a collective can work in it, else a dense
    copy (widened where the backend has no such dtype, `wider_dtypes`) that the caller copies
    back. gloo and NCCL read and write `numel` elements from the first one's address: a view with
    gaps (`x[:, 1]`, `x[::2]`) would get other elements' values and overwrite memory outside it.
    A dense layout (row-major, channels_last) and a sparse tensor travel as they are."""
    wider = wider_dtypes.get(t.dtype)
    if wider is not None:
        t = t.to(wider)
    if (
        t.is_sparse
        or t.is_contiguous()
        or t.is_contiguous(memory_format=_DENSE_FORMATS.get(t.dim(), torch.contiguous_format))
    ):
        return t
    return t.contiguous()


# --- allreduce -----------------------------------------------------------------------------


def _resolve_op(op: Any, average: bool | None) -> _Op:
    op = handle_average_backwards_compatibility(op, average)
    if op == Adasum:
        # Horovod's own type when Adasum cannot run in a configuration.
        raise AdasumUnsupportedError(ADASUM_MESSAGE)
    return _Op(op)


def _scale_(tensor: torch.Tensor, factor: float) -> None:
    if factor == 1:
        return
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.mul_(factor)
    else:  # integers: scaled in float64 as Horovod (exact to 2**53), truncated toward zero, in the tensor's dtype
        tensor.copy_(tensor.to(torch.float64) * factor)


def _allreduce_detail(op: _Op, prescale_factor: float, postscale_factor: float) -> tuple:
    return (("op", op.name.capitalize()), ("prescale_factor", prescale_factor), ("postscale_factor", postscale_factor))


def _allreduce_into(
    output: torch.Tensor,
    op: _Op,
    prescale_factor: float,
    postscale_factor: float,
    agreement: Agreement,
    finish=lambda t: t,
) -> _Handle:
    """Issue the (already agreed) allreduce of `output`, in place."""
    wire = _widen(output)
    _scale_(wire, prescale_factor)
    work = dist.all_reduce(wire, op=_TORCH_OP[op], group=agreement.group, async_op=True)
    # Horovod divides by the whole set, joined processes (which sent zeros) included.
    post = postscale_factor / agreement.size if op == Average else postscale_factor

    def done() -> torch.Tensor:
        _scale_(wire, post)
        if wire is not output:
            output.copy_(wire)
        return finish(output)

    return _Handle([work], done)


def _allreduce_agreed(
    tensors: Sequence[torch.Tensor], name: Any, op: _Op, pre: float, post: float, process_set: Any
) -> Agreement:
    detail = _allreduce_detail(op, pre, post)
    return _collective_group("allreduce", tensors, name=name, process_set=process_set, detail=detail)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> _Handle:
    """Start reducing `tensor` over the set's processes into a new tensor (Average unless `op` says)."""
    op = _resolve_op(op, average)
    out = tensor.detach().clone()
    agreement = _allreduce_agreed([out], name, op, prescale_factor, postscale_factor, process_set)
    return _allreduce_into(out, op, prescale_factor, postscale_factor, agreement)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> _Handle:
    """Start reducing `tensor` over the set's processes in place."""
    op = _resolve_op(op, average)
    agreement = _allreduce_agreed([tensor], name, op, prescale_factor, postscale_factor, process_set)
    return _allreduce_into(tensor.data, op, prescale_factor, postscale_factor, agreement, finish=lambda _: tensor)


class _AllreduceFunction(torch.autograd.Function):
    """Allreduce as an autograd op: the gradient of the result is reduced the same way."""

    @staticmethod
    def forward(ctx, tensor, op, prescale_factor, postscale_factor, name, process_set):
        ctx.args = (op, prescale_factor, postscale_factor, name, process_set)
        out = tensor.detach().clone()
        agreement = _allreduce_agreed([out], name, op, prescale_factor, postscale_factor, process_set)
        return synchronize(_allreduce_into(out, op, prescale_factor, postscale_factor, agreement))

    @staticmethod
    def backward(ctx, grad_output):
        op, pre, post, name, process_set = ctx.args
        grad = grad_output.detach().clone()
        agreement = _allreduce_agreed([grad], name and f"{name}.grad", op, pre, post, process_set)
        return synchronize(_allreduce_into(grad, op, pre, post, agreement)), None, None, None, None, None


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
    """`tensor` reduced over the set's processes (a new tensor; differentiable), Average unless `op` says."""
    op = _resolve_op(op, average)
    compression = compression or Compression.none
    compressed, ctx = compression.compress(tensor)
    out = _AllreduceFunction.apply(compressed, op, prescale_factor, postscale_factor, name, process_set)
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
    """Reduce `tensor` over the set's processes in place and return it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def _grouped_allreduce_async(
    tensors: list[torch.Tensor], outputs: list[torch.Tensor], average, name, op, pre, post, process_set, finish
) -> list[_Handle]:
    op = _resolve_op(op, average)
    # One check for the whole group, as Horovod negotiates a group once.
    agreement = _allreduce_agreed(outputs, name, op, pre, post, process_set)
    return [
        _allreduce_into(o, op, pre, post, agreement, finish=finish(t)) for t, o in zip(tensors, outputs, strict=True)
    ]


def grouped_allreduce(
    tensors: list[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """`allreduce` of each tensor of a list (new tensors), checked once for the whole list."""
    compression = compression or Compression.none
    pairs = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async(
        [c for c, _ in pairs], average, name, op, prescale_factor, postscale_factor, process_set
    )
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(synchronize(handle), pairs, strict=True)]


def grouped_allreduce_(
    tensors: list[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> list[torch.Tensor]:
    """`allreduce_` of each tensor of a list, in place, checked once for the whole list."""
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    )


# --- allgather, broadcast, objects, barrier ------------------------------------------------


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> _Handle:
    """Start concatenating every process's `tensor` along dimension 0 (first dimensions may differ)."""
    t = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach().contiguous()
    agreement = _collective_group("allgather", [t], name=name, process_set=process_set)
    firsts = [dims[0] for dims in agreement.first_dims]
    if not _state.checks and agreement.size > 1:
        # Without the descriptor check the other dimensions travel here, so that a mismatch is
        # still an error on every rank rather than a crash in the gather.
        shapes: list[Any] = [None] * agreement.size
        dist.all_gather_object(shapes, tuple(t.shape), group=_set_state(process_set).side)
        if any(s[1:] != t.shape[1:] for s in shapes):
            raise ValueError(f"allgather: every dimension but the first must match across ranks, got shapes {shapes}")
    wire = _widen(t)
    longest = max(firsts)
    padded = wire.new_zeros((longest, *wire.shape[1:]))
    padded[: wire.shape[0]] = wire
    parts = [torch.empty_like(padded) for _ in range(agreement.size)]
    work = dist.all_gather(parts, padded, group=agreement.group, async_op=True)

    def done() -> torch.Tensor:
        return torch.cat([p[:n] for p, n in zip(parts, firsts, strict=True)]).to(t.dtype)

    return _Handle([work], done)


def _combined(handles: Sequence[Any], finish: Callable[[list[Any]], Any] = list) -> Any:
    """One handle for several: done when all are, `synchronize` gives `finish` of their results."""
    works = [w for h in handles for w in h._works]
    return _Handle(works, lambda: finish([h.wait() for h in handles]))


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> Any:
    """Start `allreduce` of each tensor of a list into new tensors (checked once for the list);
    `synchronize` gives the list."""
    outs = [t.detach().clone() for t in tensors]
    return _combined(
        _grouped_allreduce_async(
            outs, outs, average, name, op, prescale_factor, postscale_factor, process_set, lambda t: lambda r: r
        )
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: Any = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Any = global_process_set,
) -> Any:
    """Start `allreduce_` of each tensor of a list, in place (checked once for the list);
    `synchronize` gives the list."""
    tensors = list(tensors)
    return _combined(
        _grouped_allreduce_async(
            tensors,
            [t.data for t in tensors],
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
            lambda t: lambda _: t,
        )
    )


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: Any = global_process_set
) -> Any:
    """Start `allgather` of each tensor of a list; `synchronize` gives the list of results."""
    return _combined([allgather_async(t, _part(name, i), process_set) for i, t in enumerate(tensors)])


def _part(name: str | None, i: int) -> str | None:
    return None if name is None else f"{name}.{i}"


class _AllgatherFunction(torch.autograd.Function):
    """allgather as an autograd op: Horovod's backward averages the gradient over the set and
    keeps this rank's rows."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set, ctx.rows = process_set, [t.shape[0] if t.dim() else 1 for t in tensors]
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        reduced = grouped_allreduce([g.contiguous() for g in grads], average=True, process_set=ctx.process_set)
        counts = synchronize(
            grouped_allgather_async([torch.tensor([r]) for r in ctx.rows], process_set=ctx.process_set)
        )
        me = ctx.process_set.rank()
        out = []
        for g, c, rows in zip(reduced, counts, ctx.rows, strict=True):
            offset = int(c[:me].sum())
            out.append(g.narrow(0, offset, rows))
        return (None, None, *out)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: str | None = None, process_set: Any = global_process_set
) -> list[torch.Tensor]:
    """`allgather` of each tensor of a list (differentiable)."""
    scalars = [t.dim() == 0 for t in tensors]
    outs = _AllgatherFunction.apply(
        name, process_set, *[t.reshape(1) if s else t for t, s in zip(tensors, scalars, strict=True)]
    )
    return list(outs)


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str | None, op: Any, process_set: Any = global_process_set
) -> Callable[[], torch.Tensor]:
    """Start reducing a sparse COO tensor over the set as Horovod does: every rank's indices and
    values are gathered (Average divides the values by the set size). Returns a function to call
    for the result: an uncoalesced sparse tensor of the same size (duplicate indices add up)."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor: use allreduce_async for dense tensors")
    if op not in (Sum, Average):
        raise ValueError(f"sparse_allreduce_async reduces with op=hvd.Sum or op=hvd.Average, got {_Op(op).name}")
    # Every rank's tensor has the same dense size (was: another size on one rank built a wrong
    # result on the others, in silence, as their indices fit); then allgather concatenates along
    # dimension 0: the indices travel as (nnz, sparse_dim).
    _collective_group("sparse_allreduce", [tensor], name=name, process_set=process_set, detail=(("op", _Op(op).name),))
    indices = allgather_async(tensor._indices().t().contiguous(), _part(name, 0), process_set)
    values = allgather_async(tensor._values(), _part(name, 1), process_set)

    def result() -> torch.Tensor:
        vals = synchronize(values)
        idx = synchronize(indices)
        if op == Average:
            vals = vals / process_set.size()
        # Checked: indices from a rank whose tensor is larger would otherwise corrupt memory.
        return torch.sparse_coo_tensor(idx.t(), vals, tensor.size(), check_invariants=True)

    return result


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = global_process_set) -> torch.Tensor:
    """Every process's `tensor` concatenated along dimension 0, in rank order (differentiable)."""
    return grouped_allgather([tensor], name, process_set)[0]


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> _Handle:
    """Start overwriting `tensor` with root_rank's value (a global rank of the set), in place."""
    agreement = _collective_group("broadcast", [tensor], name=name, process_set=process_set, root_rank=root_rank)
    return _broadcast_into(tensor, agreement)


def _broadcast_into(tensor: torch.Tensor, agreement: Agreement) -> _Handle:
    wire = _widen(tensor.data)
    work = dist.broadcast(wire, src=agreement.root_rank, group=agreement.group, async_op=True)

    def done() -> torch.Tensor:
        if wire is not tensor.data:
            tensor.data.copy_(wire)
        return tensor

    return _Handle([work], done)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> _Handle:
    """Start broadcasting root_rank's `tensor` into a new tensor."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = global_process_set
) -> torch.Tensor:
    """root_rank's `tensor`, as a new tensor on every process of the set (differentiable)."""
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


def _serialized(obj: Any) -> bytes | tuple[str, str]:
    """`obj` as bytes, as Horovod serialises objects (cloudpickle: a lambda, a closure or a local
    class travels too), else ("error", why) for the other ranks to raise on."""
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # the object's own failure, whatever its type
        return ("error", f"{type(exc).__name__}: {exc}")


def _objects(what: str, payloads: list[Any], ranks: list[int]) -> list[Any]:
    """The objects the ranks' `payloads` (:func:`_serialized`) hold; a rank whose object could
    not be serialised fails the collective on every rank, naming it (was: the others waited)."""
    import pickle

    failed = [f"rank {r}: {p[1]}" for r, p in zip(ranks, payloads, strict=True) if isinstance(p, tuple)]
    if failed:
        raise HorovodInternalError(f"{what}: an object could not be serialised ({'; '.join(failed)})")
    return [pickle.loads(p) for p in payloads]


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = global_process_set):
    """root_rank's `obj` (anything cloudpickle serialises) on every process of the set."""
    agreement = _collective_group("broadcast_object", [], name=name, process_set=process_set, root_rank=root_rank)
    box = [_serialized(obj) if rank() == root_rank else None]
    dist.broadcast_object_list(box, src=root_rank, group=agreement.group)
    return _objects("broadcast_object", box, [root_rank])[0]


def allgather_object(obj: Any, name: str | None = None, process_set: Any = global_process_set) -> list[Any]:
    """Every process's `obj` (anything cloudpickle serialises), in the set's rank order."""
    agreement = _collective_group("allgather_object", [], name=name, process_set=process_set)
    out: list[Any] = [None] * agreement.size
    dist.all_gather_object(out, _serialized(obj), group=agreement.group)
    return _objects("allgather_object", out, list(agreement.ranks))


def barrier(process_set: Any = global_process_set) -> None:
    """Wait until every process of the set gets here."""
    agreement = _collective_group("barrier", [], name=None, process_set=process_set)
    if not _state.checks or agreement.size == 1:  # with checks on, the exchange itself was the barrier
        dist.barrier(group=agreement.group)


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
    items = [(name, p) for name, p in items if p is not None]
    for name, p in items:
        if not torch.is_tensor(p):
            raise ValueError(f"broadcast_parameters: {name or 'an entry'} is a {type(p).__name__}, not a tensor")
    names = [str(name) for name, _ in items] if all(name is not None for name, _ in items) else None
    # One check for all of them (names, shapes, dtypes, root), then one broadcast each.
    agreement = _collective_group(
        "broadcast", [p for _, p in items], name=names, process_set=global_process_set, root_rank=root_rank
    )
    handles = [_broadcast_into(p, agreement) for _, p in items]
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
    agreement = _collective_group(
        "broadcast", tensors, name="optimizer state", process_set=global_process_set, root_rank=root_rank
    )
    handles = [_broadcast_into(t, agreement) for t in tensors]
    for h in handles:
        synchronize(h)
    if rank() != root_rank:
        optimizer.load_state_dict(_fill_tensors(skeleton, tensors))


def _fill_state(optimizer: torch.optim.Optimizer, model: Any) -> None:
    """Create a new optimizer's state as Horovod does: one local step on zero gradients (sparse
    ones for SparseAdam, and for SGD over `model`'s sparse embeddings). The zero gradients stay;
    the parameters do not move: weight decay (AdamW, SGD's `weight_decay`) would shrink them on
    these ranks alone, after `broadcast_parameters` made them equal (Horovod's own resume order)."""
    with torch.no_grad():  # the parameters that step can move: those it gives a gradient
        before = [
            (p, p.detach().clone()) for group in optimizer.param_groups for p in group["params"] if p.requires_grad
        ]
    _zero_grad_step(optimizer, model)
    with torch.no_grad():
        for p, value in before:
            p.copy_(value)


def _zero_grad_step(optimizer: torch.optim.Optimizer, model: Any) -> None:
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


# Live DistributedOptimizers of this process (see _DistributedOptimizer._start_check).
_OPTIMIZERS: weakref.WeakSet = weakref.WeakSet()


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
        process_set: Any = global_process_set,
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
            dups = sorted(n for n, k in collections.Counter(names).items() if k > 1)  # linear: models have 10**4
            if dups:
                raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {dups}")
            missing = {id(p) for p in all_params} - {id(p) for _, p in named}
            if missing:
                raise ValueError(
                    f"named_parameters was specified, but {len(missing)} optimizer parameter(s) are not in it"
                )
            by_id = {id(p): n for n, p in named}
        else:
            by_id = {}
            # Horovod's names for unnamed parameters: group index, then index in the group.
            named = [
                (f"allreduce.noname.{i}.{j}", p)
                for i, group in enumerate(self.param_groups)
                for j, p in enumerate(group["params"])
            ]
        self._parameter_names = {p: n for n, p in sorted(named, key=lambda item: item[0])}
        self._named = by_id
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._agreement: Agreement | None = None
        self._check: _Check | None = None
        self._checked_specs: tuple[TensorSpec, ...] | None = None
        _OPTIMIZERS.add(self)
        self._spec_key: tuple = ()
        self._specs: tuple[TensorSpec, ...] = ()
        self._order: list[torch.Tensor] = []
        self._names: tuple[str, ...] | None = None
        self._delay: dict[torch.Tensor, int] = {}
        self._hooks: dict[torch.Tensor, Any] = {}
        self._handles: dict[torch.Tensor, tuple[_Handle, Any]] = {}
        self._next = 0  # the first parameter in `_order` whose reduction has not started
        self._followed = False  # whether this step's `_order` is that of the parameters trained now
        self._synchronized = False
        self._should_synchronize = True
        # The hooks hold the optimizer weakly: once a script drops it (say, for a new one over the
        # same model), its hooks stop counting backward passes instead of keeping it alive.
        ref = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            opt = ref()
            if opt is not None:
                opt._grad_ready(p)

        self._hook = hook
        self._follow_trainable()

    def _follow_trainable(self) -> None:
        """Reduce the gradients of the parameters the optimizer trains now: those of its param
        groups that require a gradient, each once (a parameter listed twice got two hooks, and one
        backward counted as two), last first as backward usually produces them. A parameter
        unfrozen or added (`add_param_group`) since the last step gets its hook (was: its local
        gradient applied unreduced, the ranks drifting apart); one frozen since loses it (was: a
        zero gradient, with which momentum and weight decay moved it). Called before a step's
        first reduction: a script changes the same parameters on every rank, so every rank
        reduces the same list."""
        now = list({id(p): p for group in reversed(self.param_groups) for p in reversed(group["params"])}.values())
        now = [p for p in now if p.requires_grad]
        self._followed = True
        if [id(p) for p in now] == [id(p) for p in self._order]:
            return
        trained = {id(p) for p in now}
        for p in [p for p in self._hooks if id(p) not in trained]:
            self._hooks.pop(p).remove()
        for p in now:
            if p not in self._hooks:
                self._hooks[p] = p.register_post_accumulate_grad_hook(self._hook)
        # Horovod's names for parameters named_parameters left out (added later): group, then index.
        positional = {
            id(p): f"allreduce.noname.{i}.{j}"
            for i, group in enumerate(self.param_groups)
            for j, p in enumerate(group["params"])
        }
        for p in now:
            self._parameter_names.setdefault(p, self._named.get(id(p), positional[id(p)]))
        self._names = tuple(self._parameter_names[p] for p in now) if self._named else None
        self._delay = {p: self._delay.get(p, self.backward_passes_per_step) for p in now}
        self._order = now
        self._spec_key = ()  # the wire specs follow the new order

    def _reset(self) -> None:
        self._handles.clear()
        self._agreement = None
        self._check = None  # one still in flight is finished by the set's next collective
        self._next = 0
        self._followed = False
        self._delay = dict.fromkeys(self._order, self.backward_passes_per_step)

    def _in_flight(self) -> bool:
        """Whether a backward pass has started gradients toward a reduction not yet finished."""
        return bool(self._handles) or any(d != self.backward_passes_per_step for d in self._delay.values())

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

    def _step_specs(self) -> tuple[TensorSpec, ...]:
        # What goes on the wire for each gradient (after compression), recomputed only if a
        # parameter's dtype changes.
        key = tuple(p.dtype for p in self._order)
        if key != self._spec_key:
            wire = [self._compression.compress(torch.zeros(0, dtype=p.dtype))[0].dtype for p in self._order]
            self._specs = tuple(
                TensorSpec(tuple(p.shape), w, p.is_cuda) for p, w in zip(self._order, wire, strict=True)
            )
            self._spec_key = key
        return self._specs

    def _start_check(self) -> Agreement:
        """One consistency check per step for all the gradients.

        The first step (and any step after the gradients' shapes or dtypes change) waits for it
        before sending any gradient. Later steps send the gradients at once and finish the check
        in `synchronize()`, hiding its round trip behind the reductions: the descriptor is the
        one every process already agreed on, and a process doing anything else meets this check
        with a blocking one of its own and fails before sending data. Two DistributedOptimizers
        in one process could send each other's gradients before a check tells them apart, so
        with more than one every step waits."""
        pre, post = self._pre_post()
        specs = self._step_specs()
        detail = _allreduce_detail(self.op, pre, post)
        check = _start_check("allreduce", specs, self._names, self._process_set, None, detail)
        if self._checked_specs == specs and len(_OPTIMIZERS) == 1:
            self._check = check
            return check.agreement
        agreement = check.finish()
        self._checked_specs = specs
        return agreement

    def _pre_post(self) -> tuple[float, float]:
        if self.op == Average:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _start_ready(self, flush: bool = False) -> None:
        if not self._followed:
            self._follow_trainable()
        while self._next < len(self._order):
            p = self._order[self._next]
            if self._delay[p] > 0 and not flush:
                return
            if self._agreement is None:
                self._agreement = self._start_check()
            reduction = self._reduce_async(p, self._agreement)
            if reduction is not None:
                self._handles[p] = reduction
            self._next += 1

    def _reduce_async(self, p: torch.Tensor, agreement: Agreement) -> tuple[_Handle, Any] | None:
        name = self._parameter_names.get(p)
        grad = p.grad
        if grad is None:
            if agreement.size == 1:
                return None  # no other process has a gradient for it: the optimizer skips it, as without Horovod
            grad = p.grad = torch.zeros_like(p)  # unused here, perhaps used on another rank (Horovod's zeros)
        elif grad.is_sparse:
            if not self.sparse_as_dense:
                # Indices and values gathered from every rank; `synchronize` calls the result.
                return sparse_allreduce_async(grad, name=name, op=self.op, process_set=self._process_set), None
            # Reduced dense; `synchronize` hands the optimizer a sparse gradient again.
            grad = grad.to_dense()
        compressed, ctx = self._compression.compress(grad)
        pre, post = self._pre_post()
        out = compressed.data
        return _allreduce_into(out, self.op, pre, post, agreement, finish=lambda _: compressed), ctx

    def synchronize(self) -> None:
        """Finish reducing every gradient (e.g. before clipping); then call `step()` inside
        `skip_synchronize()`."""
        self._start_ready(flush=True)
        if self._check is not None:
            check, self._check = self._check, None
            check.finish()  # a disagreement raises here, before waiting for data that may never come
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
        """Reduce the gradients (unless inside `skip_synchronize()`), then the wrapped optimizer's step.

        With a `closure` (LBFGS, or any optimizer given one), the gradients its backward computes
        are reduced each time the optimizer calls it (Horovod reduces them only at the next step,
        after the optimizer has used the local ones); under LBFGS it returns the loss averaged over
        the processes, so that every rank takes the same line-search and stopping decisions."""
        if closure is not None:
            return self._step_with(closure)
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

    def _step_with(self, closure: Callable[[], Any]) -> Any:
        if self._should_synchronize and self._in_flight():  # a backward before the step: settled first
            self.synchronize()
        averaged = isinstance(self, torch.optim.LBFGS)  # the one of torch's optimizers that decides on the loss

        def reduced() -> Any:
            with torch.enable_grad():
                loss = closure()
            if self._in_flight():  # what the closure's own backward started, and only that
                self.synchronize()
            self._synchronized = False
            return _mean_over(loss, self._process_set) if averaged else loss

        self._synchronized = False
        return super().step(reduced)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; refused between backward() and step()/synchronize() (a reduction may be in flight)."""
        if self._in_flight():
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


def _mean_over(loss: Any, process_set: Any) -> Any:
    """An LBFGS closure's loss averaged over the processes: a tensor as a detached tensor, a
    number as a float."""
    if isinstance(loss, torch.Tensor):
        return allreduce(loss.detach(), op=Average, name="DistributedOptimizer.closure_loss", process_set=process_set)
    mean = allreduce(
        torch.tensor(float(loss), dtype=torch.float64),
        op=Average,
        name="DistributedOptimizer.closure_loss",
        process_set=process_set,
    )
    return float(mean)


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
    op = _resolve_op(op, None)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    _set_state(process_set)
    base = type(optimizer)
    # A subclass, so isinstance checks (LR schedulers, AMP) still see the user's optimizer class.
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": base.__module__})
    wrapped = cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
        process_set,
    )
    # The class's defaults were built from no arguments (SGD's lr 0.001, no momentum): a group
    # added later (`add_param_group`) takes the settings the script gave its optimizer instead.
    wrapped.defaults = dict(optimizer.defaults)
    return wrapped


# alltoall, reducescatter, SyncBatchNorm and the timeline live
# in their own modules, which build on this one: they are this module's attributes too, loaded on
# first use (so neither module imports the other back at import time).
_ELSEWHERE = {
    "alltoall": "collectives",
    "alltoall_async": "collectives",
    "grouped_reducescatter": "collectives",
    "grouped_reducescatter_async": "collectives",
    "reducescatter": "collectives",
    "reducescatter_async": "collectives",
    "SyncBatchNorm": "sync_batch_norm",
    "start_timeline": "timeline",
    "stop_timeline": "timeline",
}
__all__ += list(_ELSEWHERE)


def __getattr__(name: str) -> Any:
    if name in _ELSEWHERE:
        module = importlib.import_module(f"trainer.horovod.{_ELSEWHERE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_ELSEWHERE})
