"""The DDP contract, written once.

A run is distributed when torchrun (or the Training Operator through torchrun) set ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE``. Rank 0 logs and writes outputs; the seed is offset by rank;
the global batch is divided by the world size; ``.module`` is unwrapped before ``state_dict()``;
the process group is destroyed in ``finally``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


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
    """Join the job's process group for the duration of the block (no-op for one process)."""
    if not env.distributed:
        yield
        return
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend_for(device), timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside a DDP (or compiled) wrapper, whose state_dict has clean keys."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner
