"""The distributed training entry point every replica runs (under torchrun).

    python -m torch.distributed.run ... -m trainer.train \\
        --config-json '{...}' --dataset-uri s3://.../dataset --model-uri s3://.../model

Each rank reads the dataset from the object store itself (replicas are not KFP tasks), trains
its share of every global batch with DDP or FSDP (`train.strategy`), writes its own part of
every checkpoint to the store and resumes from it (at the same or another world size), and
rank 0 writes the model and the training record to `--model-uri`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import random
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainer.checkpoint import CheckpointError, CheckpointManager
from trainer.config import Config, ConfigError, config_from_json, to_dict
from trainer.data import DataError, read_manifest
from trainer.distributed import (
    DistEnv,
    checkpoint_group,
    clip_grad_norm,
    device_for,
    dist_env,
    full_state_dict,
    gradient_sync,
    is_sharded,
    parallelize,
    process_group,
    unwrap,
)
from trainer.events import EVENTS_FOLDER, EventWriter
from trainer.launch.backend import FAILURE_MARKER
from trainer.model import save_model
from trainer.progress import Progress
from trainer.storage import StoreError, join_uri, open_store
from trainer.tasks import Task, get_task
from trainer.training_data import training_data

TRAINING_RECORD = "training.json"
log = logging.getLogger("kftrain.train")

#: Dense bf16 peak TFLOP/s per GPU by device-name fragment, for the MFU estimate.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0, "L4": 121.0}


class NonFiniteLoss(RuntimeError):
    """The loss or the gradients became NaN/inf (train.on_nonfinite: stop)."""


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's RNG states as plain bytes and numbers (safe to pickle, gather and torch.load)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, keys.tobytes(), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().numpy().tobytes(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().numpy().tobytes()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.frombuffer(keys, dtype=np.uint32).copy(), pos, has_gauss, cached))

    def as_tensor(raw: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    torch.set_rng_state(as_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(as_tensor(state["cuda"]))


def parameter_digest(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> str:
    """A short hash of all parameters (equal on every rank when DDP kept them in sync); from
    `state` (full tensors by name) when given, for a sharded model."""
    h = hashlib.sha256()
    for name, p in unwrap(model).named_parameters():
        t = p if state is None else state[name]
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def lr_factor(step: int, total: int, cfg: Config) -> float:
    """Multiplier of train.learning_rate at optimizer step `step` (warm-up, then the schedule)."""
    warm = cfg.train.warmup_steps
    if warm and step < warm:
        return (step + 1) / warm
    if cfg.train.lr_schedule == "cosine":
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def peak_flops(device: torch.device, cfg: Config) -> float:
    """Peak FLOP/s of one device for MFU (0 on CPU or an unknown GPU)."""
    if cfg.train.peak_tflops:
        return cfg.train.peak_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for key, tf in PEAK_BF16_TFLOPS.items() if key in name), 0.0)


def autocast_for(device: torch.device, cfg: Config):
    """bf16 autocast on CUDA (precision auto or bf16); nothing on CPU unless asked."""
    precision = cfg.train.precision
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


#: Config fields a checkpoint cannot be resumed under when they changed: the model's shape and
#: the meaning of its weights and of the data position.
INCOMPATIBLE_FIELDS = (
    "task",
    "model.hidden_sizes",
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
    "model.block_size",
    "data.tokenizer",
    "train.strategy",
    "train.batch_size",
    "train.seed",
    "data.partitions",
)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_resumable(saved: dict[str, Any], cfg: Config, saved_world: int, world: int, streams: bool) -> None:
    """Refuse to resume a checkpoint written under `saved` (a config as a mapping) with `cfg`
    when the change matters, naming the fields; log the compatible changes.

    A different world size (or `train.grad_accum_steps`, `train.num_workers`) keeps the data
    position exact only when the items of every global batch do not depend on it: a streaming
    task with a fixed `data.partitions`, the same in both runs.
    """
    old, new = _flat(saved), _flat(to_dict(cfg))
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    bad = [k for k in changed if k in INCOMPATIBLE_FIELDS]
    if bad:
        raise CheckpointError(
            "cannot resume: the checkpoint was written with a different "
            + ", ".join(f"{k} ({old.get(k)!r}, now {new.get(k)!r})" for k in bad)
            + "; resume with the checkpoint's values or point checkpoint.uri at a new prefix"
        )
    layout = [k for k in ("train.grad_accum_steps", "train.num_workers") if k in changed]
    if saved_world != world:
        layout.insert(0, f"world size ({saved_world}, now {world})")
    if layout and not streams:
        raise CheckpointError(
            f"cannot resume: {', '.join(layout)} changed, and task {cfg.task!r} does not stream its data "
            "(Task.stream), so its batches depend on the world size; resume with the checkpoint's shape"
        )
    if layout and not cfg.data.partitions:
        raise CheckpointError(
            f"cannot resume: {', '.join(layout)} changed, and the checkpoint was written with data.partitions 0 "
            "(one partition per reader), so which items its position covers depends on the world size; resume at "
            f"world size {saved_world}, or train with data.partitions fixed to a multiple of every world size you "
            "will use (e.g. 6 for 2 and 3 ranks) from the start"
        )
    for k in changed:
        log.info("resuming with a changed %s: %r -> %r", k, old.get(k), new.get(k))
    for k in layout:
        log.info("resuming with a changed %s: the position is exact with data.partitions %d", k, cfg.data.partitions)


def resume(
    ckpt: CheckpointManager, model: nn.Module, optimizer, scheduler, cfg: Config, env: DistEnv, streams: bool
) -> dict[str, Any] | None:
    """Restore the latest complete checkpoint, if any (a collective); return its commit record."""
    record = ckpt.latest()
    if record is None:
        return None
    check_resumable(record["config"], cfg, int(record["world_size"]), env.world_size, streams)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    own = ckpt.load(record, state)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    scheduler.load_state_dict(record["scheduler"])
    if own is not None and int(record["world_size"]) == env.world_size:
        set_rng_state(own["rng"])
    else:
        # Another world size: the per-rank streams (dropout) cannot continue; new ones, still
        # distinct per rank and reproducible.
        seed_everything(cfg.train.seed + env.rank + 1_000_003 * int(record["step"]))
        log.info("RNG streams re-seeded: the checkpoint was written by %s ranks", record["world_size"])
    pos = record["position"]
    log.info("resumed at step %d (epoch %d, %d steps into it)", record["step"], pos["epoch"], pos["epoch_step"])
    return record


def nonfinite_ranks(local_loss: float, env: DistEnv, device: torch.device) -> list[int]:
    """The ranks whose own loss was NaN/inf (a collective: every rank calls it together)."""
    flag = torch.tensor([0.0 if math.isfinite(local_loss) else 1.0], device=device)
    if not env.distributed:
        return [0] if flag.item() else []
    flags = [torch.zeros_like(flag) for _ in range(env.world_size)]
    dist.all_gather(flags, flag)
    return [rank for rank, f in enumerate(flags) if f.item()]


def _to(batch, device: torch.device):
    return tuple(t.to(device, non_blocking=True) for t in batch)


def run_training(
    cfg: Config, dataset_uri: str, model_uri: str, env: DistEnv, task: Task | None = None
) -> dict[str, Any]:
    """Train on this rank; return the final metrics (complete on rank 0)."""
    t_start = time.time()
    task = task or get_task(cfg.task)
    device = device_for(env)
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True)
    tc = cfg.train
    accum = tc.grad_accum_steps
    if tc.batch_size % (env.world_size * accum):
        raise ConfigError(
            f"train.batch_size: must divide by world size {env.world_size} x train.grad_accum_steps {accum}, "
            f"got {tc.batch_size}"
        )
    micro = tc.batch_size // (env.world_size * accum)
    store = open_store(dataset_uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy())
    manifest = read_manifest(store, dataset_uri)
    data = training_data(cfg, task, store, dataset_uri, manifest, env, micro, device)

    # Identical initial weights on every rank (DDP also broadcasts rank 0's), then per-rank
    # streams for anything random in the step (dropout).
    seed_everything(tc.seed)
    model, meta = task.build_model(cfg, manifest)
    model.to(device)
    seed_everything(tc.seed + env.rank)
    items_per_step = tc.batch_size * task.items_per_sample(cfg)
    flops_per_step = task.flops_per_item(model, cfg) * items_per_step  # before sharding: whole tensors
    ddp = parallelize(
        model,
        env,
        device,
        strategy=tc.strategy,
        units=task.shard_units(model),
        activation_checkpointing=tc.activation_checkpointing,
        bf16=tc.precision in ("auto", "bf16"),
        bucket_cap_mb=tc.bucket_cap_mb,
    )
    # FSDP: every rank runs validation forward passes too (each one all-gathers the weights).
    validates = env.is_main or is_sharded(model)
    step_model = torch.compile(ddp) if tc.compile else ddp
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=tc.learning_rate,
        weight_decay=tc.weight_decay,
        fused=device.type == "cuda",
    )

    steps_per_epoch = data.steps_per_epoch
    total_steps = tc.max_steps or tc.epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps, cfg))

    ckpt = None
    if cfg.checkpoint.enabled:
        prefix = cfg.checkpoint.uri or join_uri(model_uri, "checkpoints")
        ckpt = CheckpointManager(
            open_store(prefix, cfg.store.endpoint, cfg.store.region, cfg.store.policy()),
            prefix,
            cfg.checkpoint.keep_last,
            rank=env.rank,
            world_size=env.world_size,
            group=checkpoint_group(env, cfg.job.collective_timeout_seconds),
        )
    step = 0
    resumed = None
    if ckpt is not None and cfg.checkpoint.resume:
        resumed = resume(ckpt, model, optimizer, scheduler, cfg, env, data.streams)
        step = int(resumed["step"]) if resumed else 0

    def save_checkpoint(epoch: int, epoch_step: int) -> None:
        if ckpt is None:
            return
        model_state, optim_state = get_state_dict(model, optimizer)
        record = {
            # The epoch's loss so far, so the resumed run reports the same mean for the epoch.
            "position": {
                "epoch": epoch,
                "epoch_step": epoch_step,
                "epoch_loss": float(epoch_loss) if epoch_step else 0.0,
                "epoch_steps": epoch_steps if epoch_step else 0,
            },
            "scheduler": scheduler.state_dict(),
            "config": to_dict(cfg),
            # The record of a resumed run covers the whole run.
            "history": history,
            "loss_curve": progress.curve,
        }
        ckpt.save(
            step,
            {"model": model_state, "optimizer": optim_state},
            record=record if env.is_main else None,
            local=lambda: {"rng": rng_state()},
        )
        progress.checkpoint(step, ckpt.last_stage_seconds, ckpt.last_bytes)

    peak = peak_flops(device, cfg) * env.world_size
    progress = Progress(
        total_steps=total_steps,
        items_per_step=items_per_step,
        item_name=task.item_name,
        flops_per_step=flops_per_step,
        peak_flops=peak,
        interval=tc.log_interval_steps,
        device=device,
        enabled=env.is_main,
        events=EventWriter(store, join_uri(model_uri, EVENTS_FOLDER), step) if env.is_main and tc.tensorboard else None,
    )
    history: list[dict[str, float]] = list(resumed.get("history", [])) if resumed else []
    if resumed:
        progress.curve = list(resumed.get("loss_curve", []))
    first_step_at = None
    data_wait = 0.0
    skipped = in_a_row = 0
    t_train = time.perf_counter()
    start_step = step
    epoch = step // steps_per_epoch
    while step < total_steps:
        epoch_step = step - epoch * steps_per_epoch
        batches = data.epoch_batches(epoch, epoch_step)
        epoch_loss, epoch_steps = torch.zeros((), device=device), 0
        if resumed and step == int(resumed["step"]) and epoch_step:
            carried = resumed["position"]
            epoch_loss += torch.tensor(carried["epoch_loss"], dtype=epoch_loss.dtype, device=device)
            epoch_steps = int(carried["epoch_steps"])
        while epoch_step < steps_per_epoch and step < total_steps:
            optimizer.zero_grad(set_to_none=True)
            step_loss = torch.zeros((), device=device)
            for i in range(accum):
                t0 = time.perf_counter()
                batch = _to(next(batches), device)
                data_wait += time.perf_counter() - t0
                # Gradients are reduced across ranks on the last micro-batch only.
                with gradient_sync(ddp, enabled=i == accum - 1):
                    with autocast_for(device, cfg):
                        loss = task.loss(step_model, batch) / accum
                    loss.backward()
                step_loss += loss.detach()
            max_norm = tc.grad_clip_norm or float("inf")
            grad_norm = clip_grad_norm(list(model.parameters()), max_norm)
            # Gradients are identical on every rank after the all-reduce, so every rank takes the
            # same decision here; the loss is this rank's own, which names where it went wrong.
            if not torch.isfinite(grad_norm):
                culprits = nonfinite_ranks(float(step_loss), env, device)
                where = (
                    f"optimizer step {step + 1} (epoch {epoch}): the loss was non-finite on rank(s) "
                    f"{culprits or 'none (the gradients overflowed)'}; grad norm {float(grad_norm)} "
                    f"(reported by rank {env.rank})"
                )
                if tc.on_nonfinite == "stop":
                    raise NonFiniteLoss(f"non-finite loss or gradients at {where} (train.on_nonfinite: stop)")
                in_a_row += 1
                if in_a_row >= tc.max_consecutive_skips:
                    raise NonFiniteLoss(
                        f"{in_a_row} updates in a row skipped for non-finite loss or gradients, the last at "
                        f"{where}: the run has diverged (train.on_nonfinite: skip, train.max_consecutive_skips "
                        f"{tc.max_consecutive_skips}); lower train.learning_rate or set train.grad_clip_norm"
                    )
                log.warning("skipping the update of %s (train.on_nonfinite: skip)", where)
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
            else:
                in_a_row = 0
                optimizer.step()
            scheduler.step()
            step += 1
            epoch_step += 1
            if first_step_at is None:
                first_step_at = time.time()
            epoch_loss += step_loss
            epoch_steps += 1
            progress.step(step, epoch, step_loss, scheduler.get_last_lr()[0], grad_norm, data_wait)
            if ckpt is not None and cfg.checkpoint.interval_steps and step % cfg.checkpoint.interval_steps == 0:
                save_checkpoint(epoch, epoch_step)
        if epoch_step >= steps_per_epoch:
            record = {"epoch": epoch, "train_loss": float(epoch_loss) / max(epoch_steps, 1)}
            if validates:
                record.update(task.validate(unwrap(model), data.val, device, micro))
            if env.is_main:
                log.info(
                    "epoch %d done: %s", epoch, " ".join(f"{k} {v:.4f}" for k, v in record.items() if k != "epoch")
                )
            history.append(record)
            progress.epoch_end(step, record)
            interval = cfg.checkpoint.interval_steps
            just_saved = bool(interval) and step % interval == 0
            if ckpt is not None and cfg.checkpoint.at_epoch_end and not just_saved:
                save_checkpoint(epoch + 1, 0)
            epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.perf_counter() - t_train
    if ckpt is not None:
        ckpt.close()
    progress.close()
    # FSDP: all-gathered tensor by tensor into rank 0's host memory (other ranks get nothing).
    weights = full_state_dict(model)
    digest = parameter_digest(model, weights if is_sharded(model) else None) if weights else ""
    if digest:
        log.info("final parameter digest %s", digest)
    steps_run = step - start_step
    final = history[-1] if history else {}
    if validates and not final:
        final = task.validate(unwrap(model), data.val, device, micro)
    metrics = {
        **{k: v for k, v in final.items() if k != "epoch"},
        f"{task.item_name}_per_second": steps_run * items_per_step / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "seconds_to_first_step": (first_step_at or time.time()) - t_start,
        "first_step_unix_time": first_step_at or time.time(),
        "data_wait_fraction": data_wait / max(train_seconds, 1e-9),
        "world_size": env.world_size,
        "steps": step,
        "resumed_from_step": start_step,
        "skipped_steps": skipped,
    }
    if peak and flops_per_step and steps_run:
        metrics["mfu"] = steps_run * flops_per_step / train_seconds / peak
    if env.is_main:
        meta.update(task=cfg.task, dataset_uri=dataset_uri)
        save_model(store, model_uri, unwrap(model), meta, state=weights)
        record = {
            "metrics": metrics,
            "history": history,
            "loss_curve": progress.curve,
            "progress": progress.summary(),
            "config": to_dict(cfg),
            "parameter_digest": digest,
        }
        store.put_bytes(join_uri(model_uri, TRAINING_RECORD), json.dumps(record, indent=2).encode())
        log.info("model written to %s", model_uri)
    if env.distributed:
        dist.barrier()  # no rank leaves (and tears the group down) while rank 0 still writes
    return metrics


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of one training process."""
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    parser.add_argument("--config-json", required=True, help="the whole config as JSON")
    parser.add_argument("--dataset-uri", required=True, help="prepared dataset (data prep output)")
    parser.add_argument("--model-uri", required=True, help="where rank 0 writes the model")
    args = parser.parse_args(argv)
    env = dist_env()
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {env.rank}] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
    )
    cfg = config_from_json(args.config_json)
    device = device_for(env)
    try:
        with process_group(env, device, timeout_s=cfg.job.collective_timeout_seconds):
            run_training(cfg, args.dataset_uri, args.model_uri, env)
    except (ConfigError, DataError, StoreError, CheckpointError, NonFiniteLoss) as exc:
        # A message that says what to fix, not a traceback repeated by every rank.
        log.error("%s%s", FAILURE_MARKER, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
