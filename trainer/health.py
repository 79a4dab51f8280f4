"""Slow and silent faults: name the straggler rank, and stop when DDP replicas drift apart.

A synchronous job runs at the pace of its slowest rank, and every rank's step takes the same wall
time: the fast ones wait in the gradient all-reduce for the slow one. So a rank is judged by its
*own* time per step, the step's wall time less the time it sat in the gradient sync waiting for
the others. Each rank measures over a log interval (`train.log_interval_steps`):

- step: seconds per optimizer step, from its start to its update (what runs between steps is
  not counted);
- data: seconds per step waiting for batches;
- sync: seconds per step from the moment its last gradient bucket was ready (DDP calls the
  communication hook this module registers) to the end of its backward, i.e. what it waited for
  the slowest rank plus the transfer itself. On CUDA both ends are CUDA events on the compute
  stream, read back only at the interval; on CPU, host clocks. FSDP interleaves its collectives
  with compute and has no such hook: there sync is not measured (-1) and ranks are judged by
  their data wait alone.

At each interval every rank contributes those three floats to one small all_gather, so every rank
holds the same table and takes the same decision. A rank whose own time exceeds the median's
(the lower middle value for an even count) by `train.straggler_factor` is logged by rank 0 with
its pod (``HOSTNAME``, the pod's name in Kubernetes; else the host name) and node
(``KFTRAIN_NODE_NAME`` where the replica's env sets it from ``spec.nodeName``).

Every `train.divergence_check_steps` steps the ranks all_gather a digest of their trainable
parameters (the float64 sum, sum of squares and largest magnitude): DDP replicas are bitwise equal,
so any difference means a rank's weights were corrupted (a bit flip, a bad kernel) and every
later step trains a different model on it. The job stops with :class:`ReplicaDivergence` naming the
step and the ranks that differ. Under FSDP each rank holds its own shards, so there are no replicas
to compare and the check is off.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainer.distributed import DistEnv
from trainer.errors import KftrainError
from trainer.launch.spec import NODE_ENV, POD_ENV

log = logging.getLogger("kftrain.health")
#: A rank is named only when its own time exceeds the median's by this share of the median step
#: time as well as by the factor, so microsecond-scale noise on idle ranks never names one.
MIN_EXCESS_SHARE = 0.1


class ReplicaDivergence(KftrainError, RuntimeError):
    """DDP replicas' parameters differ across ranks (train.divergence_check_steps)."""


def stragglers(own: Sequence[float], factor: float, floor: float = 0.0) -> list[int]:
    """The ranks whose `own` time exceeds `factor` times the median (the lower middle value) and
    the median by more than `floor`; none when `factor` is 0 or there is one rank."""
    if factor <= 0 or len(own) < 2:
        return []
    median = statistics.median_low(own)
    return [rank for rank, t in enumerate(own) if t > factor * median and t - median > floor]


def own_time(step_s: float, data_s: float, sync_s: float) -> float:
    """A rank's own seconds per step: the step less its wait in the gradient sync, or (sync not
    measured, -1) its data wait."""
    return step_s - sync_s if sync_s >= 0 else data_s


def differing_ranks(digests: Sequence[Sequence[float]]) -> list[int]:
    """The ranks whose digest is not the most common one (all of them when no digest is held by
    more ranks than every other; empty when all agree)."""
    keys = [tuple(d) for d in digests]
    counts = {k: keys.count(k) for k in keys}
    if len(counts) == 1:
        return []
    top = max(counts.values())
    majority = [k for k, n in counts.items() if n == top]
    if len(majority) > 1:
        return list(range(len(keys)))
    return [rank for rank, k in enumerate(keys) if k != majority[0]]


def parameter_fingerprint(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum, sum of squares and largest magnitude of all `params` in float64 (three numbers on
    their device): equal across replicas that are equal, computed without leaving the device."""
    out = torch.zeros(3, dtype=torch.float64, device=params[0].device if params else "cpu")
    for p in params:
        t = p.detach().double()
        out[0] += t.sum()
        out[1] += (t * t).sum()
        out[2] = torch.maximum(out[2], t.abs().max()) if t.numel() else out[2]
    return out


class Health:
    """One rank's straggler and divergence checks; every rank calls :meth:`begin_step` as an
    optimizer step starts, :meth:`after_backward` after its gradient sync and :meth:`end_step`
    after the update, together. Only the steps are timed: what runs between them (rank 0's
    validation, checkpoint staging) shows as the others' sync wait in the next step, not as
    anyone's own time."""

    def __init__(
        self,
        model: nn.Module,
        params: list[nn.Parameter],
        env: DistEnv,
        device: torch.device,
        *,
        interval: int,
        factor: float,
        divergence_steps: int,
        measure_sync: bool = True,
    ) -> None:
        self.env, self.device, self.params = env, device, params
        self.interval, self.factor = interval, factor
        self.ddp = isinstance(model, DistributedDataParallel)
        self.watch = env.distributed and factor > 0
        self.divergence_steps = divergence_steps if env.distributed and self.ddp else 0
        if env.distributed and divergence_steps and not self.ddp and env.is_main:
            log.info("train.divergence_check_steps: off under FSDP (each rank holds other shards, no replicas)")
        self.cuda = device.type == "cuda"
        self._arrived: float | torch.cuda.Event | None = None
        self._waits: list = []  # per step: seconds, or (arrival, done) CUDA events
        self._t = 0.0  # when the step in progress began
        self._step_seconds = 0.0
        self._steps = 0
        self._data0 = 0.0
        self._step_began = (0, 0.0)  # at the step in progress's start: len(self._waits), the data wait
        self.names: list[str] = []
        if self.watch:
            if self.ddp and measure_sync:
                model.register_comm_hook(None, self._hook)
            me = os.environ.get(POD_ENV, "") or socket.gethostname()
            node = os.environ.get(NODE_ENV, "")
            self.names = [None] * env.world_size  # type: ignore[list-item]
            dist.all_gather_object(self.names, f"pod {me}" + (f", node {node}" if node else ""))

    def _hook(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        # The last bucket to become ready marks the end of this rank's own backward compute.
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._arrived = event
        else:
            self._arrived = time.perf_counter()
        return allreduce_hook(state, bucket)

    def begin_step(self, data_wait: float = 0.0) -> None:
        """Mark the start of an optimizer step; `data_wait`: the run's total seconds waiting for batches so far."""
        self._t = time.perf_counter()
        self._step_began = (len(self._waits), data_wait)

    def after_backward(self) -> None:
        """Mark the end of the step's gradient sync (the last backward returned)."""
        if self._arrived is None:
            return
        if self.cuda:
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            self._waits.append((self._arrived, done))
        else:
            self._waits.append(max(0.0, time.perf_counter() - self._arrived))
        self._arrived = None

    def end_step(self, step: int, data_wait: float, timed: bool = True) -> None:
        """After optimizer step `step`; `data_wait` is the run's total seconds waiting for batches.
        At a log interval compare the ranks' times; every divergence interval their parameters.
        `timed` False: the step's time is not the run's (the CPU's profiled memory step) and is left
        out of the comparison."""
        if timed:
            self._steps += 1
            self._step_seconds += time.perf_counter() - self._t
        else:  # its sync and data waits go too: the rest of them less its wait made times negative
            waits, data0 = self._step_began
            del self._waits[waits:]
            self._data0 += data_wait - data0
        if self.watch and step % self.interval == 0:
            self._compare_times(step, data_wait)
        if self.divergence_steps and step % self.divergence_steps == 0:
            self._compare_parameters(step)

    def _sync_seconds(self) -> float:
        if not self._waits:
            return -1.0
        if self.cuda:
            self._waits[-1][1].synchronize()
            total = sum(a.elapsed_time(d) for a, d in self._waits) / 1000.0
        else:
            total = sum(self._waits)
        return total / len(self._waits)

    def _compare_times(self, step: int, data_wait: float) -> None:
        steps = max(self._steps, 1)
        mine = torch.tensor(
            [self._step_seconds / steps, (data_wait - self._data0) / steps, self._sync_seconds()],
            dtype=torch.float64,
            device=self.device,
        )
        table = [torch.zeros_like(mine) for _ in range(self.env.world_size)]
        dist.all_gather(table, mine)
        rows = [t.tolist() for t in table]
        self._step_seconds, self._steps, self._data0, self._waits = 0.0, 0, data_wait, []
        own = [own_time(*row) for row in rows]
        median_step = statistics.median_low(row[0] for row in rows)
        slow = stragglers(own, self.factor, MIN_EXCESS_SHARE * median_step)
        if not self.env.is_main:
            return
        median = statistics.median_low(own)
        for rank in slow:
            step_s, data_s, sync_s = rows[rank]
            log.warning(
                "straggler at step %d: rank %d (%s) takes %.3fs of its own per step, %.1fx the median rank's %.3fs "
                "(step %.3fs, data wait %.3fs, sync wait %s; train.straggler_factor %g)",
                step,
                rank,
                self.names[rank],
                own[rank],
                own[rank] / max(median, 1e-9),
                median,
                step_s,
                data_s,
                f"{sync_s:.3f}s" if sync_s >= 0 else "not measured under FSDP",
                self.factor,
            )

    def _compare_parameters(self, step: int) -> None:
        mine = parameter_fingerprint(self.params).to(self.device)
        table = [torch.zeros_like(mine) for _ in range(self.env.world_size)]
        dist.all_gather(table, mine)
        digests = [t.tolist() for t in table]
        bad = differing_ranks(digests)
        if not bad:
            return
        shown = "; ".join(
            f"rank {r}: sum {d[0]!r}, sum of squares {d[1]!r}, max |w| {d[2]!r}" for r, d in enumerate(digests)
        )
        which = (
            f"rank(s) {bad} differ from the others"
            if len(bad) < len(digests)
            else f"ranks {bad} all differ (no majority tells which is wrong)"
        )
        raise ReplicaDivergence(
            f"the DDP replicas' parameters differ at optimizer step {step}: {which} ({shown}); a rank's weights "
            "were corrupted (faulty GPU memory or kernel), so the run stops rather than train diverging models; "
            "resume from the last checkpoint, on other nodes if it recurs (train.divergence_check_steps)"
        )
