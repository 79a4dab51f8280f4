"""The probe: a few real training steps of the configured model, measured.

It runs in the calling process group (every rank calls it, as the trainer's ranks do) on
synthetic batches of the real shape (:meth:`Task.synthetic_batch`), with the trainer's own
pieces: the model the task builds, :func:`trainer.distributed.parallelize`, the same AdamW,
:func:`trainer.distributed.gradient_sync`, :func:`trainer.train.autocast_for` and
:func:`trainer.distributed.clip_grad_norm`, and the peak memory as every real run measures it
(:class:`trainer.plan.measure.PeakMemory`).

The step time is split by running the steps twice: once with the gradient reduction switched
off on every micro-step (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync(False)``),
which is the compute (under FSDP it still holds the parameter all-gathers, which cannot be
switched off), and once as training runs them; the difference is the exposed communication.
The data wait is the time to move the batch to the device. The peak memory is measured over
one further step, after the timed ones (on the CPU the measure slows the ops it records).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from trainer.config import Config
from trainer.plan.measure import PeakMemory


@dataclass
class ProbeResult:
    """What the probe measured on this rank (times: medians over the measured steps)."""

    world_size: int
    steps: int
    step_seconds: float
    compute_seconds: float
    data_wait_seconds: float
    comm_seconds: float
    peak_memory_bytes: int
    device: str = "cpu"  # the device's name (a GPU's as CUDA names it)
    micro_batch: int = 0
    memory_method: str = ""

    def as_dict(self) -> dict:
        """Plain mapping (the plan's record)."""
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_probe(cfg: Config, *, steps: int = 5, manifest: dict | None = None) -> ProbeResult:
    """Run `steps` measured optimizer steps (after one warm-up step, which creates the optimizer
    state) of `cfg`'s model on this rank of the current process group; return the medians.

    Collective: under torchrun every rank calls it (the process group already initialised).
    """
    from trainer.distributed import (
        DistEnv,
        clip_grad_norm,
        device_for,
        dist_env,
        gradient_sync,
        is_sharded,
        micro_batch_size,
        parallelize,
    )
    from trainer.plan.shapes import PlanError, planning_manifest
    from trainer.rng import seed_everything
    from trainer.tasks import task_for
    from trainer.tasks.contract import checked_batch, checked_built, checked_loss
    from trainer.train import autocast_for

    # No process group, no peers: a WORLD_SIZE or LOCAL_RANK left in a shell is no job of this
    # process (was: a DDP wrapper over no group in the plan and evaluate steps).
    env = dist_env() if torch.distributed.is_available() and torch.distributed.is_initialized() else DistEnv()
    device = device_for(env)
    peak = PeakMemory(device)
    task = task_for(cfg)
    tc = cfg.train
    accum = tc.grad_accum_steps
    micro = micro_batch_size(tc.batch_size, env, accum)
    manifest, _note = planning_manifest(cfg, task, manifest)
    seed_everything(tc.seed)
    model, _meta = checked_built(task, task.build_model(cfg, manifest))
    deferred = any(p.is_meta for p in model.parameters())
    sharded = tc.strategy == "fsdp" and env.distributed
    if not (deferred and sharded):
        task.materialize(model, device)
    parallel = parallelize(
        model,
        env,
        device,
        strategy=tc.strategy,
        units=task.shard_units(model),
        activation_checkpointing=tc.activation_checkpointing,
        bf16=tc.precision in ("auto", "bf16"),
        bucket_cap_mb=tc.bucket_cap_mb,
    )
    if deferred and sharded:
        task.materialize(model, device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=tc.learning_rate, weight_decay=tc.weight_decay, fused=device.type == "cuda"
    )
    batches = [checked_batch(task, task.synthetic_batch(cfg, manifest, micro)) for _ in range(accum)]
    if batches[0] is None:
        raise PlanError(f"task {cfg.task!r} gives no synthetic_batch: the probe cannot run it")

    def step(sync: bool) -> tuple[float, float]:
        _sync(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        wait = 0.0
        for i, cpu_batch in enumerate(batches):
            w0 = time.perf_counter()
            batch = tuple(t.to(device, non_blocking=True) for t in cpu_batch)
            wait += time.perf_counter() - w0
            with gradient_sync(parallel, enabled=sync and i == accum - 1):
                with autocast_for(device, cfg):
                    loss = checked_loss(task, task.loss(parallel, batch)) / accum
                loss.backward()
        if sync or not is_sharded(parallel):  # FSDP holds no sharded gradients before a sync
            clip_grad_norm(trainable, tc.grad_clip_norm or float("inf"))
            optimizer.step()
        _sync(device)
        return time.perf_counter() - t0, wait

    step(True)  # warm-up: optimizer state, DDP's buckets, kernels chosen
    local: list[float] = []
    if env.distributed:  # one process has nothing to reduce: its whole step is compute
        local = [step(False)[0] for _ in range(steps)]
        step(True)  # reduces what the unsynced steps left (FSDP keeps unsharded gradients until then)
    timed = [step(True) for _ in range(steps)]
    # Memory over one more step of its own: the CPU measure records every op, which would
    # slow the timed ones.
    with peak.window():
        step(True)
    peak_bytes = peak.peak_bytes()
    total = statistics.median(t for t, _ in timed)
    wait = statistics.median(w for _, w in timed)
    # FSDP keeps unsharded gradients across unsynced steps, which can make them the slower ones.
    compute = min(statistics.median(local), total) if local else total
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ProbeResult(
        world_size=env.world_size,
        steps=steps,
        step_seconds=total,
        compute_seconds=compute - wait,
        data_wait_seconds=wait,
        comm_seconds=max(0.0, total - compute),
        peak_memory_bytes=peak_bytes,
        device=name,
        micro_batch=micro,
        memory_method=peak.method,
    )
