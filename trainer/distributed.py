"""The DDP and FSDP contract, written once.

A run is distributed when torchrun (or the Training Operator through torchrun) set ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE``. Rank 0 logs and writes outputs; every rank starts from the
same weights and then draws from its own random streams (:func:`seed_rank_streams`); the global
batch is divided by the world size and the accumulation steps (:func:`micro_batch_size`);
``.module`` is unwrapped before ``state_dict()``; no rank leaves before rank 0 has written the
outputs (:func:`leave_together`, which :func:`process_group` also does before the group is
destroyed); the process group is destroyed in ``finally``.

``train.strategy`` picks how the model is made data-parallel (:func:`parallelize`): ``ddp``
keeps a full replica per rank and all-reduces gradients; ``fsdp`` (FSDP2, ``fully_shard``)
shards parameters, gradients and optimizer state, each of the task's shard units first
(:meth:`trainer.tasks.Task.shard_units`, the GPT blocks) and then the root. What differs
between the two for the loop lives here: skipping the gradient sync on accumulation
micro-steps (:func:`gradient_sync`), the global gradient norm (:func:`clip_grad_norm`), and a
full copy of the weights (:func:`full_state_dict`: the export's fallback when there is no
checkpoint to consolidate from, see :mod:`trainer.consolidate`).
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from trainer.config import ConfigError
from trainer.procfs import thread_states
from trainer.rng import seed_everything
from trainer.torchrun import PEER_CLOSED


@dataclass(frozen=True, slots=True)
class DistEnv:
    """This process's place in the job."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes outputs."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process takes part."""
        return self.world_size > 1


def dist_env(environ: Mapping[str, str] = os.environ) -> DistEnv:
    """Read the torchrun environment; a plain `python` run is rank 0 of 1."""
    return DistEnv(
        rank=int(environ.get("RANK", 0)),
        local_rank=int(environ.get("LOCAL_RANK", 0)),
        world_size=int(environ.get("WORLD_SIZE", 1)),
    )


def micro_batch_size(batch_size: int, env: DistEnv, accum: int) -> int:
    """Items each rank takes per micro-step so that the ranks' micro-steps of one optimizer step
    add up to the global `batch_size` (train.batch_size), on any world size."""
    if batch_size % (env.world_size * accum):
        raise ConfigError(
            f"train.batch_size: must divide by world size {env.world_size} x train.grad_accum_steps {accum}, "
            f"got {batch_size}"
        )
    return batch_size // (env.world_size * accum)


def seed_rank_streams(seed: int, env: DistEnv, salt: int = 0) -> None:
    """Give this rank its own random streams (dropout) after the shared initial weights: the
    seed offset by the rank, and by `salt` where the streams must differ from an earlier run's."""
    seed_everything(seed + env.rank + 1_000_003 * salt)


def nonfinite_ranks(local_loss: float, env: DistEnv, device: torch.device) -> list[int]:
    """The ranks whose own loss was NaN/inf (a collective: every rank calls it together)."""
    flag = torch.tensor([0.0 if math.isfinite(local_loss) else 1.0], device=device)
    if not env.distributed:
        return [0] if flag.item() else []
    flags = [torch.zeros_like(flag) for _ in range(env.world_size)]
    dist.all_gather(flags, flag)
    return [rank for rank, f in enumerate(flags) if f.item()]


def leave_together(env: DistEnv) -> None:
    """Wait until every rank got here: no rank tears the group down while rank 0 still writes."""
    if env.distributed:
        dist.barrier()


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors."""
    return "nccl" if device.type == "cuda" else "gloo"


def device_for(env: DistEnv) -> torch.device:
    """One GPU per local rank when CUDA is present, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


@contextlib.contextmanager
def process_group(env: DistEnv, device: torch.device, timeout_s: float = 600) -> Iterator[None]:
    """Join the job's process group for the duration of the block (no-op for one process).

    A block that ends normally leaves together (:func:`leave_together`) before the group is
    destroyed: a gloo rank that tears the group down while a peer is still in it can abort
    the peer. A block that raises does not wait (its peers may be gone)."""
    if not env.distributed:
        yield
        return
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend_for(device), timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    try:
        yield
        leave_together(env)
    finally:
        dist.destroy_process_group()
        comm_threads_settled()  # this process's own workers: a rank's error exit meets the teardown too


#: The names torch 2.13 gives gloo's worker threads (each runs a group's collectives).
GLOO_WORKERS = "pt_gloo_runloop"


def comm_threads_settled(timeout_s: float = 2.0, quiet_polls: int = 3, poll_s: float = 0.01) -> bool:
    """Wait until gloo's worker threads of this process are all asleep (`quiet_polls` looks in a
    row, `poll_s` apart), for at most `timeout_s`; whether they are.

    A worker drops a collective's tensors a moment after the caller saw it complete, and dropping
    a tensor that Python knows takes the GIL. Such a worker that asks for it just as the
    interpreter's teardown begins is ended by unwinding through code that may not throw, which
    aborts the process ("terminate called without an active exception", SIGABRT): a rank that had
    done all its work failed its job (seen in CI, on a loaded machine). The workers outlive
    ``destroy_process_group`` once DDP used the group (torch 2.13), so the teardown can meet them.
    Between looks this thread sleeps, which frees the GIL: a worker waiting for it takes it, and
    one that is still asleep at every look waits for work that will not come."""
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < quiet_polls and time.monotonic() < deadline:
        time.sleep(poll_s)
        busy = any(name == GLOO_WORKERS and state != "S" for name, state in thread_states())
        quiet = 0 if busy else quiet + 1
    return quiet >= quiet_polls


#: How DDP says a parameter got no gradient in the last step (torch 2.13's message, its start).
DDP_UNUSED = "Expected to have finished reduction in the prior iteration before starting a new one"


def unused_parameters(exc: BaseException) -> str:
    """What to tell the user when `exc` is DDP's error for parameters that took no part in the
    loss, or '': torch's advice names a DDP argument no kftrain config sets, so the fix said is the
    task's (freeze them), with the parameters torch names."""
    text = str(exc)
    if not isinstance(exc, RuntimeError) or DDP_UNUSED not in text:
        return ""
    named = re.search(r"(Parameter indices which did not receive grad for rank \d+: [\d ]+)", text)
    names = re.search(r"(Parameters which did not receive grad for rank \d+: [^\n]+)", text)
    which = "; ".join(m.group(1).strip() for m in (names, named) if m)
    return (
        "parameters of the model took no part in the loss (DDP reduces the gradient of every trainable "
        f"parameter at each step; {which or 'torch named none'}): freeze those the task's loss() or "
        "summed_loss() does not use (requires_grad=False in its build_model()), or make the loss use them"
        + ("" if names else "; TORCH_DISTRIBUTED_DEBUG=INFO makes torch name them")
    )


def collective_failed(exc: BaseException) -> bool:
    """Whether `exc` is a collective that timed out or lost its peer, as torch 2.13 reports it:
    NCCL's `DistBackendError` (the watchdog's timeout, a peer's abort), a `DistNetworkError`, a
    `DistStoreError` (the rendezvous store on the Master's pod gone), or
    gloo's plain RuntimeError ("Timed out waiting 600000ms for recv operation to complete", a
    connection the peer closed: "Connection closed by peer", "Read error ...: Connection reset by
    peer" as DCP's gather in a checkpoint save meets it, "Broken pipe")."""
    if isinstance(exc, (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("Timed out waiting" in text or any(c in text for c in PEER_CLOSED))


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside a DDP (or compiled) wrapper, whose state_dict has clean keys."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def checkpoint_group(env: DistEnv, timeout_s: float = 600) -> dist.ProcessGroup | None:
    """A gloo group of all ranks for checkpoint coordination (a collective: every rank calls it).

    The checkpoint upload thread agrees on durability through it while the main thread runs the
    training collectives on the default group: two threads never share one group's sequence.
    """
    if not env.distributed:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


def recompute_in_backward(module: nn.Module) -> None:
    """Activation checkpointing of one module: keep only its inputs, recompute the rest in backward.

    The instance's ``forward`` is replaced (no wrapper module), so parameter names and state
    dicts stay as they are; non-reentrant checkpointing restores the RNG state, so dropout
    draws the same masks when recomputed.
    """
    forward = module.forward

    def recomputed(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing to save for backward
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = recomputed


def parallelize(
    model: nn.Module,
    env: DistEnv,
    device: torch.device,
    *,
    strategy: str,
    units: list[nn.Module],
    activation_checkpointing: bool = False,
    bf16: bool = False,
    bucket_cap_mb: int = 25,
) -> nn.Module:
    """Make `model` (already on `device`) data-parallel; return the module the loop calls.

    ``ddp``: a DistributedDataParallel wrapper. ``fsdp``: `model` itself, sharded in place
    (each unit, then the root); on CUDA with `bf16` the parameters are all-gathered in bf16 and
    gradients reduced in fp32. One process: the model as it is, whatever the strategy.
    Activation checkpointing applies to `units` with either strategy.
    """
    if activation_checkpointing:
        for unit in units:
            recompute_in_backward(unit)
    if not env.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        kwargs: dict = {"mesh": init_device_mesh(device.type, (env.world_size,))}
        if device.type == "cuda" and bf16:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        return model
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy
        bucket_cap_mb=bucket_cap_mb,
    )


def is_sharded(model: nn.Module) -> bool:
    """The model's parameters are FSDP2 shards (every rank must take part in forward and state dicts)."""
    return hasattr(model, "set_requires_gradient_sync")


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Within the block, backward reduces gradients across ranks only when `enabled`.

    Accumulation micro-steps run with it off and the last one with it on: DDP's ``no_sync()``,
    FSDP2's ``set_requires_gradient_sync(False)`` (gradients stay unsharded until the last).
    """
    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip gradients to a global 2-norm of `max_norm`; return that norm as a plain tensor.

    With FSDP the gradients are DTensor shards: their norm is reduced over the ranks
    (``full_tensor()``) so every rank sees, and decides on, the same global norm.
    """
    from torch.distributed.tensor import DTensor

    with_grad = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in with_grad], 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, norm)
    return norm


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight as a full CPU tensor on rank 0 (other ranks: {} under FSDP).

    FSDP: a collective (every rank calls it) that all-gathers one tensor at a time and keeps
    it in rank 0's host memory only: rank 0 needs host RAM for the whole model in its dtype,
    no rank needs GPU memory beyond one unsharded tensor.
    """
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
