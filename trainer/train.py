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
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from trainer import exit_codes
from trainer.checkpoint import CheckpointError, CheckpointManager, best_step, step_dir
from trainer.checkpoint_owner import check_format, checkpoint_owner, checkpoint_prefix
from trainer.config import (
    Config,
    best_metric,
    config_from_json,
    flatten_config,
    replica_config,
    same_setting,
    to_dict,
)
from trainer.consolidate import consolidate
from trainer.distributed import (
    DistEnv,
    checkpoint_group,
    clip_grad_norm,
    collective_failed,
    device_for,
    dist_env,
    full_state_dict,
    gradient_sync,
    is_sharded,
    leave_together,
    micro_batch_size,
    nonfinite_ranks,
    parallelize,
    process_group,
    seed_rank_streams,
    unused_parameters,
    unwrap,
)
from trainer.errors import KftrainError
from trainer.events import EVENTS_FOLDER, EventWriter
from trainer.health import Health
from trainer.job_status import reporter_from_env
from trainer.launch.backend import FAILURE_MARKER
from trainer.model_io import WEIGHTS, frozen_names, publish_model, save_model, tied_names, trained_state
from trainer.progress import Progress
from trainer.report import AFTER_LAST_EPOCH
from trainer.rng import rng_state, seed_everything, set_rng_state
from trainer.runs import TRAINING_RECORD, lineage_of, split_step_folder
from trainer.safetensors_file import TensorFile
from trainer.shards import content_digest, read_manifest
from trainer.stacks import print_stacks_on_signals
from trainer.stopping import GRACE_ENV, StopSignal, Terminated, grace_warning, stop_while_starting
from trainer.storage import ObjectStore, StoreError, join_uri, open_store
from trainer.tasks import Task, task_for
from trainer.tasks.contract import checked_built, checked_loss, checked_metrics, checked_summed_loss
from trainer.training_data import TrainingData, training_data

log = logging.getLogger("kftrain.train")

#: What torch warns when a scheduler steps before its optimizer ever has (a regex).
SCHEDULER_ORDER_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


class NonFiniteLoss(KftrainError, RuntimeError):
    """The loss or the gradients became NaN/inf (train.on_nonfinite: stop)."""


def parameter_digest(model: nn.Module, state: dict[str, torch.Tensor] | None = None) -> str:
    """A short hash of all parameters (equal on every rank when DDP kept them in sync); from
    `state` (full tensors by name) when given, for a sharded model."""
    h = hashlib.sha256()
    for name, p in unwrap(model).named_parameters():
        if not p.requires_grad:
            continue  # a frozen base is the pretrained model's, not the run's
        t = p if state is None else state[name]
        h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def write_final_model(
    model: nn.Module,
    meta: dict[str, Any],
    store: ObjectStore,
    model_uri: str,
    env: DistEnv,
    ckpt: CheckpointManager | None,
) -> str:
    """Rank 0 writes `model.safetensors`, then `model.json`, to `model_uri`; every rank calls it and
    gets the final parameter digest ("" where this rank holds no full weights).

    DDP (or one process): rank 0 streams its own weights into the file one tensor at a time.
    FSDP with checkpoints: rank 0 consolidates the checkpoint `ckpt` last saved or loaded (the
    last step's, or `checkpoint.export_best`'s pick), which the caller closed
    (:meth:`CheckpointManager.close` waits for the commit), from the shards one tensor at a
    time: rank 0 needs memory for one tensor, not the model, and no rank gathers.
    FSDP without checkpoints: the full state dict is gathered into rank 0's host memory (a
    collective), as there are no shards to consolidate from.
    """
    bare = unwrap(model)
    frozen = frozen_names(bare)
    if not is_sharded(model):
        digest = parameter_digest(model)
        if env.is_main:
            save_model(store, model_uri, bare, meta, state=trained_state(bare, frozen))
    elif ckpt is not None and ckpt.last_step is not None:
        digest = ""
        if env.is_main:
            with tempfile.TemporaryDirectory(prefix="kftrain-final-") as tmp:
                path = Path(tmp) / WEIGHTS
                consolidate(ckpt.store, step_dir(ckpt.prefix, ckpt.last_step), path, exclude=tied_names(bare))
                # The same digest as from gathered weights, read back from the file tensor by tensor.
                digest = parameter_digest(model, TensorFile(path))
                publish_model(store, model_uri, path, meta)
    else:
        if env.is_main:
            log.info(
                "gathering the full FSDP weights into rank 0's memory for the model file: "
                "consolidating them from the shards one tensor at a time needs checkpoint.enabled"
            )
        weights = full_state_dict(model)  # a collective; only rank 0 gets the tensors
        weights = {k: v for k, v in weights.items() if k not in frozen}
        digest = parameter_digest(model, weights) if weights else ""
        if env.is_main:
            save_model(store, model_uri, bare, meta, state=weights)
    if digest:
        log.info("final parameter digest %s", digest)
    return digest


#: cuBLAS's workspace setting torch's deterministic mode needs on a GPU (torch raises at the first
#: matmul without it): a fixed workspace per stream, so reductions run in one order.
CUBLAS_DETERMINISTIC = ":4096:8"


def use_deterministic_algorithms(device: torch.device) -> None:
    """`train.deterministic`: torch's deterministic kernels, and on a GPU cuBLAS's fixed workspace
    (read when cuBLAS runs its first matmul; a value the user set stands)."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC)
    torch.use_deterministic_algorithms(True)


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
    """Peak FLOP/s of one device for MFU, at the precision the run computes in: the planner's GPU
    type of the device's name (:func:`trainer.plan.hardware.gpu_spec`); 0 on CPU or an unknown GPU."""
    if cfg.train.peak_tflops:
        return cfg.train.peak_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    from trainer.plan.hardware import HardwareError, gpu_spec

    try:
        spec = gpu_spec(torch.cuda.get_device_name(device))
    except HardwareError:
        return 0.0
    return spec.tflops(bf16=computes_in_bf16(device, cfg)) * 1e12


def computes_in_bf16(device: torch.device, cfg: Config) -> bool:
    """Whether the run computes under bf16 autocast: on CUDA (precision auto or bf16); on CPU only when asked."""
    return cfg.train.precision == "bf16" or (cfg.train.precision == "auto" and device.type == "cuda")


def autocast_for(device: torch.device, cfg: Config):
    """bf16 autocast where :func:`computes_in_bf16`, else nothing."""
    if computes_in_bf16(device, cfg):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


#: Config fields a checkpoint cannot be resumed under when they changed: the model's shape and
#: the meaning of its weights and of the data position (which positions of which epoch order,
#: counted in global batches), and the prepared data the position counts in (its items and
#: their split: a changed split puts test rows into training, a shorter one ends past its end).
INCOMPATIBLE_FIELDS = (
    "data.source",
    "data.label_column",
    "data.val_fraction",
    "data.test_fraction",
    "data.seed",
    "data.text_field",
    "data.messages_field",
    "data.max_bytes",
    "data.tokenizer_sample_bytes",
    "task",
    "model.init_from",
    "train.method",
    "lora.rank",
    "lora.alpha",
    "lora.target_modules",
    "data.format",
    "model.hidden_sizes",
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
    "model.block_size",
    "data.tokenizer",
    "train.strategy",
    "train.batch_size",
    "train.seed",
)


#: The way out of a resume this config cannot make from the run's own checkpoint: a new run,
#: which checkpoints elsewhere (a retry, or `--run-id`, keeps the same prefix).
START_ANEW = "start a new run (locally: without --run-id; with checkpoint.uri set: another prefix)"


#: The fields a resume's recorded changes keep (:func:`check_resumable`): what a step computes (the
#: model, the adapters, the optimisation, the world size and the data's layout over it). Not where
#: and when the run saves, exports, plans, logs or times out, nor data prep's and evaluation's
#: settings (`data.source_version` changes with a file's modification time alone).
HOW_STEPS_TRAIN = ("model.", "lora.", "train.", "data.partitions", "job.replicas", "job.nproc_per_node")
#: Fields under :data:`HOW_STEPS_TRAIN` that only watch or tune the run's speed.
_WATCHING = (
    "train.log_interval_steps",
    "train.tensorboard",
    "train.straggler_factor",
    "train.divergence_check_steps",
    "train.peak_tflops",
    "train.bucket_cap_mb",
)


def check_resumable(
    saved: dict[str, Any],
    cfg: Config,
    saved_world: int,
    world: int,
    streams: bool,
    other: str = START_ANEW,
    log_changes: bool = True,
) -> list[dict[str, Any]]:
    """Refuse to resume a checkpoint written under `saved` (a config as a mapping) with `cfg`
    when the change matters, naming the fields; return the compatible changes to how steps train
    (`{field, from, to}`, of :data:`HOW_STEPS_TRAIN`); log every compatible change when
    `log_changes` (once per resume: by the trainer's rank 0, not again by a pre-flight or every
    rank).

    A different world size (or `train.grad_accum_steps`, `train.num_workers`,
    `data.partitions`) changes which items each rank reads. A streaming task carries its place
    over by the items still to come in the epoch (recorded in the checkpoint); a task that does
    not stream samples in memory with the world size in its order, so it cannot. `other` is the
    message's way out besides the checkpoint's values.
    """
    from trainer.checks import unread_by

    old, new = flatten_config(replica_config(saved)), flatten_config(replica_config(to_dict(cfg)))
    # A field either run's task never reads changes nothing it resumes (a change of task is named
    # by itself; was: another task's defaults named beside it), nor do the adapters' settings
    # unless both runs train adapters (a change of method is named by itself).
    lora_both = old.get("train.method") == new.get("train.method") == "lora"
    tasks = {cfg.task, str(old.get("task", cfg.task))}
    changed = sorted(
        k
        for k in old.keys() | new.keys()
        if not same_setting(k, old.get(k), new.get(k))
        and not any(unread_by(task, k) for task in tasks)
        and (lora_both or not k.startswith("lora."))
    )
    # A field the checkpoint's record lacks came after it was written (it ran as the default does).
    bad = [k for k in changed if k in INCOMPATIBLE_FIELDS and k in old]
    if bad:
        raise CheckpointError(
            "cannot resume: the checkpoint was written with a different "
            + ", ".join(f"{k} ({old.get(k)!r}, now {new.get(k)!r})" for k in bad)
            + f"; resume with the checkpoint's values or {other}"
        )
    layout = [k for k in ("train.grad_accum_steps", "train.num_workers", "data.partitions") if k in changed]
    if saved_world != world:
        layout.insert(0, f"world size ({saved_world}, now {world})")
    if layout and not streams:
        raise CheckpointError(
            f"cannot resume: {', '.join(layout)} changed, and task {cfg.task!r} does not stream its data "
            "(Task.stream), so its batches depend on the world size; resume with the checkpoint's shape"
        )
    defaults = flatten_config(replica_config(to_dict(Config())))
    changes = []
    for k in changed:
        if k.startswith("kubernetes."):  # where the pods run, not what they train
            continue
        if k in old:
            before, said = old.get(k), f"resuming with a changed {k}: {old.get(k)!r} -> {new.get(k)!r}"
        elif not same_setting(k, defaults.get(k), new.get(k)):  # a field newer than the checkpoint, ran as its default
            before = defaults.get(k)
            said = (
                f"resuming with {k} {new.get(k)!r} (the checkpoint's kftrain had no such field: its default {before!r})"
            )
        else:
            continue
        if k.startswith(HOW_STEPS_TRAIN) and k not in _WATCHING:  # the others are said only
            changes.append({"field": k, "from": before, "to": new.get(k)})
        if log_changes:
            log.info("%s", said)
    if layout and log_changes:
        log.info("resuming with a changed %s: the epoch goes on with the items still to come", ", ".join(layout))
    return changes


def check_steps_left(record: dict[str, Any], cfg: Config, other: str) -> None:
    """Refuse to resume the checkpoint of `record` under a step limit that ends before it: the
    model would stay the checkpoint's, trained further than `cfg` says. A limit at its step is a
    resume that only writes the checkpoint's model (and evaluates and exports it)."""
    step, pos, tc = int(record.get("step", 0)), record.get("position") or {}, cfg.train
    epoch, epoch_step = int(pos.get("epoch", 0)), int(pos.get("epoch_step", 0))
    if tc.max_steps:
        limit, past = f"train.max_steps {tc.max_steps}", step > tc.max_steps
    else:
        limit, past = f"train.epochs {tc.epochs}", epoch > tc.epochs or (epoch == tc.epochs and epoch_step > 0)
    if past:
        raise CheckpointError(
            f"cannot resume: {limit} ends before the checkpoint's step {step} ({epoch} epochs and {epoch_step} "
            f"steps done), so the model would be the checkpoint's, trained further than the config says: set "
            f"{limit.split()[0]} at or past it, or {other}"
        )


def input_fingerprints(manifest: dict[str, Any], meta: dict[str, Any]) -> dict[str, str]:
    """What a run trains on, as its checkpoints record it: the prepared data's items
    (:func:`trainer.shards.content_digest`) and a base model's weights (their fingerprint)."""
    inputs = {"dataset": content_digest(manifest)}
    if base := (meta.get("base_model") or {}).get("fingerprint"):
        inputs["base_model"] = base
    return inputs


def check_same_inputs(
    saved: dict[str, str], inputs: dict[str, str], saved_config: dict[str, Any], cfg: Config, other: str
) -> None:
    """Refuse to resume a checkpoint that recorded other inputs (:func:`input_fingerprints`) than
    `inputs` under the same settings (:func:`check_resumable` compares those): the data or the
    base model changed in place. An input that either side lacks (a record from before inputs
    were recorded; the data before it is prepared) is not compared."""
    from trainer.pretrained import base_changed

    def differs(name: str) -> bool:
        return name in saved and name in inputs and saved[name] != inputs[name]

    if differs("base_model"):
        raise CheckpointError(
            f"cannot resume: {base_changed(cfg.model.init_from, 'the checkpoint was written')}: put back the weights "
            f"it was trained on, or {other}"
        )
    if not differs("dataset"):
        return
    rows = flatten_config(saved_config).get("data.shard_rows", cfg.data.shard_rows)
    if rows != cfg.data.shard_rows:
        raise CheckpointError(
            f"cannot resume: data.shard_rows changed ({rows!r}, now {cfg.data.shard_rows!r}), which cuts the data into "
            f"other shards (and text into other windows), so the epoch's position would count other items; resume "
            f"with the checkpoint's value, or {other}"
        )
    raise CheckpointError(
        f"cannot resume: the prepared data holds other items than the checkpoint's under the same settings: "
        f"data.source {cfg.data.source!r} changed since it was written (its split would put test rows into training, "
        f"and the epoch's position would count other items); put back the data it was written on, or {other}"
    )


def _resumed_epoch_loss(saved: float | list[float], saved_world: int, env: DistEnv) -> float:
    """This rank's share of the epoch's loss so far, from a checkpoint's position: its own sum
    when the world size is the same; under another, the mean of the saved ranks' sums, so that
    the ranks together hold as many rank-steps of loss as they go on to add. A checkpoint of an
    earlier kftrain holds rank 0's sum alone, which then stands for every rank's."""
    sums = saved if isinstance(saved, list) else [float(saved)] * saved_world
    if len(sums) == env.world_size:
        return sums[env.rank]
    return sum(sums) / len(sums)


class Trainer:
    """One rank's training run, in the phases the loop is made of: setup (the constructor and
    :meth:`resume`), :meth:`train_step`, :meth:`end_epoch`, :meth:`save_checkpoint` and
    :meth:`finish`. :meth:`run` strings them together."""

    def __init__(self, cfg: Config, dataset_uri: str, model_uri: str, env: DistEnv, task: Task | None = None) -> None:
        self.t_start = time.time()
        self.cfg, self.dataset_uri, self.model_uri, self.env = cfg, dataset_uri, model_uri, env
        self.task = task = task or task_for(cfg)
        self.device = device = device_for(env)
        # Peak memory as the plan's probe measures it, for the report to set the plan against: on
        # a GPU the allocator's counter over the whole run; on the CPU the profiler's count over
        # one step (`_measures_peak`), as recording every op of a whole run would slow it.
        from trainer.plan.measure import PeakMemory  # trainer.plan's probe runs this module's Trainer

        self.peak_memory = PeakMemory(device)
        if device.type == "cuda":
            self.peak_memory.reset()
        self.measured_peak: int | None = None
        self.step_seconds: list[float] = []  # optimizer steps of this start, for the median
        tc = cfg.train
        if tc.deterministic:
            use_deterministic_algorithms(device)
        self.accum = tc.grad_accum_steps
        self.micro = micro_batch_size(tc.batch_size, env, self.accum)
        self.store = open_store(dataset_uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy())
        manifest = read_manifest(self.store, dataset_uri)
        self.data: TrainingData = training_data(cfg, task, self.store, dataset_uri, manifest, env, self.micro, device)

        # Identical initial weights on every rank (DDP also broadcasts rank 0's), then per-rank
        # streams for anything random in the step (dropout).
        seed_everything(tc.seed)
        self.model, self.meta = checked_built(task, task.build_model(cfg, manifest))
        self.inputs = input_fingerprints(manifest, self.meta)
        # A model built on the meta device (a pretrained one) gets its weights after sharding, so
        # each rank reads only its shards; a replicated one before DDP wraps it.
        deferred = any(p.is_meta for p in self.model.parameters())
        sharded_here = tc.strategy == "fsdp" and env.distributed
        if not (deferred and sharded_here):
            task.materialize(self.model, device)
        seed_rank_streams(tc.seed, env)
        self.items_per_step = tc.batch_size * task.items_per_sample(cfg)
        self.flops_per_step = task.flops_per_item(self.model, cfg) * self.items_per_step  # whole tensors
        self.parallel = parallelize(
            self.model,
            env,
            device,
            strategy=tc.strategy,
            units=task.shard_units(self.model),
            activation_checkpointing=tc.activation_checkpointing,
            bf16=tc.precision in ("auto", "bf16"),
            bucket_cap_mb=tc.bucket_cap_mb,
        )
        if deferred and sharded_here:
            task.materialize(self.model, device)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.health = Health(
            self.parallel,
            self.trainable,
            env,
            device,
            interval=tc.log_interval_steps,
            factor=tc.straggler_factor,
            divergence_steps=tc.divergence_check_steps,
            measure_sync=not tc.compile,  # a compiled DDP module's buckets are its own
        )
        # Frozen weights (LoRA's base) come from model.init_from again: checkpoints hold the rest.
        partial = len(self.trainable) < len(list(self.model.parameters()))
        self.state_options = StateDictOptions(ignore_frozen_params=partial, strict=not partial)
        # FSDP: every rank runs validation forward passes too (each one all-gathers the weights).
        self.validates = env.is_main or is_sharded(self.model)
        self.step_model = torch.compile(self.parallel) if tc.compile else self.parallel
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=tc.learning_rate, weight_decay=tc.weight_decay, fused=device.type == "cuda"
        )
        self.total_steps = tc.max_steps or tc.epochs * self.data.steps_per_epoch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.total_steps, cfg)
        )
        self.ckpt = self._checkpoints()
        # Its own group: the checkpoint upload thread uses the checkpoint group meanwhile.
        self.stop = StopSignal(checkpoint_group(env, cfg.job.collective_timeout_seconds))
        self.grace_s = float(os.environ.get(GRACE_ENV) or 0)
        self.grace_warned = False

        # Where the run stands: the position and what the epoch so far added up to.
        self.step = self.epoch = self.epoch_step = 0
        self.epoch_loss, self.epoch_steps = torch.zeros((), device=device), 0
        self.history: list[dict[str, float]] = []
        self.loss_curve: list[dict[str, float]] = []  # the progress log's curve, the same list
        self.validation: list[dict[str, float]] = []  # the progress log's validation points, the same list
        self.data_wait = 0.0
        self.skipped = self.nonfinite_in_a_row = 0
        self.updated = False  # whether this process's optimizer has stepped (the scheduler's warning)
        self.first_step_at: float | None = None
        self.resumed_elsewhere = False  # from checkpoint.resume_from, another run's checkpoint
        # The step folders of the other runs' checkpoints this run's weights began from, newest
        # first (this start's resume_from and where that run began in turn, or what this run's own
        # checkpoints record); empty for none.
        self.lineage: list[str] = []
        #: The settings changed at each resume (`{at_step, field, from, to}`), the earliest first.
        self.config_changes: list[dict[str, Any]] = []
        self.resumed_window: dict[str, float] | None = None  # the progress line's interval a checkpoint kept
        resumes = cfg.checkpoint.resume or cfg.checkpoint.resume_from
        left = self.resume() if self.ckpt is not None and resumes else None
        self.start_step = self.step
        self.epoch_steps_total = self.data.begin_epoch(self.epoch, self.epoch_step, left)
        self.total_steps = self._planned_steps()
        if self.resumed_elsewhere and self.step >= self.total_steps and env.is_main:
            # Legitimate after a retry of this run; from another run's checkpoint, most likely
            # train.epochs left as that run had it.
            limit = f"train.max_steps {tc.max_steps}" if tc.max_steps else f"train.epochs {tc.epochs}"
            log.warning(
                "checkpoint.resume_from: its step %d is where %s ends, so nothing is left to train and the "
                "model is the checkpoint's; raise %s to train it further",
                self.step,
                limit,
                limit.split()[0],
            )
        late = [c["field"] for c in self.config_changes if c["at_step"] == self.step]
        if late and self.step >= self.total_steps and env.is_main:
            log.warning(
                "resumed at step %d, where training ends: no step trains under the changed %s; the records list "
                "the change at the last step",
                self.step,
                ", ".join(late),
            )

        self.peak = peak_flops(device, cfg) * env.world_size
        events = None
        if env.is_main and tc.tensorboard:
            events = EventWriter(self.store, join_uri(model_uri, EVENTS_FOLDER), self.step)
        self.progress = Progress(
            total_steps=self.total_steps,
            items_per_step=self.items_per_step,
            item_name=task.item_name,
            flops_per_step=self.flops_per_step,
            peak_flops=self.peak,
            interval=tc.log_interval_steps,
            device=device,
            enabled=env.is_main,
            events=events,
            reporter=reporter_from_env() if env.is_main else None,
        )
        self.progress.curve, self.progress.validation = self.loss_curve, self.validation
        self.progress.resume_window(self.resumed_window, self.step)

    def _planned_steps(self) -> int:
        """The step the run ends at: train.max_steps, or the end of the last epoch (the epoch
        resumed under another layout may have a step more or fewer than a whole one)."""
        tc = self.cfg.train
        if tc.max_steps:
            return tc.max_steps
        if self.epoch >= tc.epochs:
            return self.step
        later = (tc.epochs - self.epoch - 1) * self.data.steps_per_epoch
        return self.step - self.epoch_step + self.epoch_steps_total + later

    def _checkpoints(self) -> CheckpointManager | None:
        cfg, env = self.cfg, self.env
        if not cfg.checkpoint.enabled:
            return None
        prefix = checkpoint_prefix(cfg, self.model_uri)
        ckpt = CheckpointManager(
            open_store(prefix, cfg.store.endpoint, cfg.store.region, cfg.store.policy()),
            prefix,
            cfg.checkpoint.keep_last,
            rank=env.rank,
            world_size=env.world_size,
            group=checkpoint_group(env, cfg.job.collective_timeout_seconds),
            owner=checkpoint_owner(cfg, self.model_uri),
            keep_best=best_metric(cfg.checkpoint.keep_best),
        )
        # Before any write; the training step claimed it already (this confirms it), a trainer
        # started by hand claims it here.
        try:
            ckpt.claim(resume=cfg.checkpoint.resume)
        except CheckpointError:
            ckpt.close()  # its staging folder
            raise
        return ckpt

    def _resume_source(self) -> tuple[CheckpointManager, dict[str, Any]]:
        """The checkpoint `checkpoint.resume_from` names, read only (a collective: rank 0 finds
        it, every rank reads the same one); the run writes its own under its own prefix."""
        from trainer.runs import resolve_resume_from, split_step_folder

        cfg, env = self.cfg, self.env
        found = ("", "")
        if env.is_main:
            try:
                found = (resolve_resume_from(cfg, cfg.store.uri)[0], "")
            except KftrainError as exc:
                found = ("", str(exc))
        if self.ckpt.group is not None:
            box = [found]
            torch.distributed.broadcast_object_list(box, src=0, group=self.ckpt.group)
            found = box[0]
        folder, error = found
        if error:
            raise CheckpointError(error)
        prefix, step = split_step_folder(folder)
        source = self._reader(prefix)
        record = source.latest(only=step)
        if record is None:
            source.close()
            raise CheckpointError(f"checkpoint.resume_from: {folder} is no longer a complete checkpoint")
        return source, record

    def _reader(self, prefix: str) -> CheckpointManager:
        """The checkpoints of another run under `prefix`, read only, ranked by this run's
        `checkpoint.keep_best`."""
        cfg, env = self.cfg, self.env
        store = open_store(prefix, cfg.store.endpoint, cfg.store.region, cfg.store.policy())
        return CheckpointManager(
            store,
            prefix,
            rank=env.rank,
            world_size=env.world_size,
            group=self.ckpt.group,
            keep_best=self.ckpt.keep_best,
        )

    def resume(self) -> list | None:
        """Restore the latest complete checkpoint, if any (a collective): weights, optimizer,
        schedule, RNG streams, the position and the record so far. Return the positions of the
        epoch it left still to come (None at an epoch boundary or without a checkpoint).

        The run's own prefix comes first (a restart of this run); with none there, the checkpoint
        `checkpoint.resume_from` names (another run's, which this run only reads)."""
        cfg = self.cfg
        record, source = self.ckpt.latest() if cfg.checkpoint.resume else None, self.ckpt
        if record is None and cfg.checkpoint.resume_from:
            source, record = self._resume_source()
        if record is None:
            return None
        self.resumed_elsewhere = source is not self.ckpt
        try:
            return self._restore(source, record)
        except CheckpointError as exc:
            if source is self.ckpt:
                raise
            raise CheckpointError(f"checkpoint.resume_from {cfg.checkpoint.resume_from!r}: {exc}") from None
        finally:
            if source is not self.ckpt:
                source.close()

    def _restore(self, source: CheckpointManager, record: dict[str, Any]) -> list | None:
        cfg, env = self.cfg, self.env
        check_format(record, step_dir(source.prefix, int(record["step"])))
        saved_world = int(record["world_size"])
        other = START_ANEW if source is self.ckpt else "start without resume_from"
        changes = check_resumable(
            record["config"], cfg, saved_world, env.world_size, self.data.streams, other, env.is_main
        )
        check_same_inputs(record.get("inputs") or {}, self.inputs, record["config"], cfg, other)
        check_steps_left(record, cfg, other)
        own = self._load(record, source)
        began = [step_dir(source.prefix, int(record["step"]))] if source is not self.ckpt else []
        self.lineage = lineage_of(record, began, self.ckpt.prefix)
        self.scheduler.load_state_dict(record["scheduler"])
        self._apply_optimizer_settings()
        self.step = int(record["step"])
        # Each start's changes, kept through later resumes: the config a record shows is the last start's.
        recorded = record.get("config_changes")
        self.config_changes = [
            *(recorded if isinstance(recorded, list) else []),
            *({"at_step": self.step, **change} for change in changes),
        ]
        if own is not None and saved_world == env.world_size:
            set_rng_state(own["rng"])
        else:
            # Another world size: the per-rank streams (dropout) cannot continue; new ones, still
            # distinct per rank and reproducible.
            seed_rank_streams(cfg.train.seed, env, salt=self.step)
            log.info("RNG streams re-seeded: the checkpoint was written by %s ranks", saved_world)
        pos = record["position"]
        if env.is_main and not isinstance(pos["epoch_loss"], list):
            log.warning(
                "the checkpoint was written by an earlier kftrain, which recorded rank 0's share of the loss: the "
                "train_loss of the epochs before step %d (the history, the loss curve) is rank 0's, and that of the "
                "epoch it cut is partly so; from here on it is the whole job's",
                int(record["step"]),
            )
        self.epoch, self.epoch_step = int(pos["epoch"]), int(pos["epoch_step"])
        if self.epoch_step:
            # The epoch's loss so far, so the resumed run reports the same mean for the epoch.
            own = _resumed_epoch_loss(pos["epoch_loss"], saved_world, env)
            self.epoch_loss += torch.tensor(own, dtype=self.epoch_loss.dtype, device=self.device)
            self.epoch_steps = int(pos["epoch_steps"])
        # The record of a resumed run covers the whole run (the report draws all three).
        self.history[:] = record.get("history", [])
        self.loss_curve[:] = record.get("loss_curve", [])
        self.validation[:] = record.get("validation", [])
        if saved_world == env.world_size:  # rank 0's losses: of other items at another world size
            self.resumed_window = record.get("progress_window")
        log.info(
            "resumed at step %d (epoch %d, after %d of its steps) from %s",
            self.step,
            self.epoch,
            self.epoch_step,
            step_dir(source.prefix, self.step),
        )
        return pos.get("left")

    def _load(self, record: dict[str, Any], source: CheckpointManager | None = None) -> Any | None:
        """Load the weights and optimizer state of the checkpoint of `record` (a collective) from
        `source` (default: this run's checkpoints); return this rank's own part."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=self.state_options)
        state = {"model": model_state, "optimizer": optim_state}
        own = (source or self.ckpt).load(record, state)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=self.state_options,
        )
        return own

    def save_checkpoint(self, metrics: dict[str, float] | None = None) -> None:
        """Checkpoint the state after the current step (this rank's part; rank 0 commits), with the
        validation `metrics` of the epoch it ends, if any (checkpoint.keep_best ranks by them)."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=self.state_options)
        at_end = self.epoch_step >= self.epoch_steps_total
        position = {
            "epoch": self.epoch + 1 if at_end else self.epoch,
            "epoch_step": 0 if at_end else self.epoch_step,
            # Every rank's sum of its step losses so far this epoch (a collective, as the save is).
            "epoch_loss": [0.0] * self.env.world_size if at_end else self._epoch_losses(),
            "epoch_steps": 0 if at_end else self.epoch_steps,
            # What the epoch has still to give, in case the run resumes under another layout.
            "left": None if at_end else self.data.left(self.epoch_step),
        }
        record = {
            "position": position,
            "scheduler": self.scheduler.state_dict(),
            "config": replica_config(to_dict(self.cfg)),
            "inputs": self.inputs,
            "history": self.history,
            "loss_curve": self.loss_curve,
            "validation": self.validation,
            # The progress line's interval so far (rank 0's, which logs it).
            "progress_window": self.progress.window() if self.env.is_main else None,
        }
        if metrics is not None:
            record["metrics"] = metrics
        if self.lineage:
            record["lineage"] = self.lineage
        if self.config_changes:
            record["config_changes"] = self.config_changes
        self.ckpt.save(
            self.step,
            {"model": model_state, "optimizer": optim_state},
            record=record if self.env.is_main else None,
            local=lambda: {"rng": rng_state()},
        )
        self.progress.checkpoint(self.step, self.ckpt.last_stage_seconds, self.ckpt.last_bytes)
        # save() waited for the previous checkpoint: its commit time, with this one's staging.
        warning = grace_warning(self.grace_s, self.ckpt.last_stage_seconds, self.ckpt.last_upload_seconds)
        if warning and self.env.is_main and not self.grace_warned:
            log.warning("%s", warning)
            self.grace_warned = True

    def train_step(self, batches) -> None:
        """One optimizer step: `train.grad_accum_steps` micro-batches, one gradient sync, the
        update (or a skip on a non-finite gradient), the schedule and the progress line; its
        time, or the peak memory of the one step measured on the CPU."""
        measuring = self._measures_peak()
        # The window ends however the step does (a non-finite loss raises inside it).
        with self.peak_memory.window() if measuring else contextlib.nullcontext():
            t_step = time.perf_counter()
            self._step(batches, timed=not measuring)
            seconds = time.perf_counter() - t_step
        if measuring:  # the profiler slowed this step: its time is not the run's
            self.measured_peak = self.peak_memory.peak_bytes()
        else:
            self.step_seconds.append(seconds)

    def _step(self, batches, timed: bool) -> None:
        cfg, device, tc = self.cfg, self.device, self.cfg.train
        self.health.begin_step(self.data_wait)
        self.optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        units = None  # this rank's units of a summed loss (Task.summed_loss), else None
        for i in range(self.accum):
            t0 = time.perf_counter()
            batch = tuple(t.to(device, non_blocking=True) for t in next(batches))
            self.data_wait += time.perf_counter() - t0
            # Gradients are reduced across ranks on the last micro-batch only.
            with gradient_sync(self.parallel, enabled=i == self.accum - 1):
                with autocast_for(device, cfg):
                    summed = self.task.summed_loss(self.step_model, batch)
                    if summed is None:
                        loss = checked_loss(self.task, self.task.loss(self.step_model, batch)) / self.accum
                    else:
                        loss, count = checked_summed_loss(self.task, summed)
                        units = count.detach() + (0 if units is None else units)
                loss.backward()
            step_loss += loss.detach()
        counted, job_loss = True, None
        if units is not None:
            step_loss, job_loss, counted = self._mean_over_units(step_loss, units)
        self.health.after_backward()
        grad_norm = clip_grad_norm(self.trainable, tc.grad_clip_norm or float("inf"))
        # Gradients are identical on every rank after the all-reduce, so every rank takes the same
        # decision here; the loss is this rank's own, which names where it went wrong.
        applied = counted and bool(torch.isfinite(grad_norm))
        if not counted:  # nothing to learn from, and AdamW's momentum and weight decay would still move the weights
            if self.env.is_main:
                log.warning(
                    "optimizer step %d: no token the loss counts in the global batch; update skipped", self.step + 1
                )
        elif applied:
            self.nonfinite_in_a_row = 0
            self.optimizer.step()
            self.updated = True
        else:
            self._skip_update(float(step_loss), float(grad_norm))
        lr = self.scheduler.get_last_lr()[0]  # the rate this step used, before the schedule moves on
        if self.updated:
            self.scheduler.step()
        else:
            with warnings.catch_warnings():
                # A skipped update still advances the schedule, which follows the step count; torch reads
                # a run whose first update was skipped as calling the two in the old order, and says so.
                warnings.filterwarnings("ignore", SCHEDULER_ORDER_WARNING, UserWarning)
                self.scheduler.step()
        self.step += 1
        self.epoch_step += 1
        if self.first_step_at is None:
            self.first_step_at = time.time()
        # The epoch's loss is the job's: a summed loss's ranks hold unequal numbers of units. Only
        # the updates applied count (alike on every rank): a skipped one's loss, of no token or not
        # finite, made the epoch's NaN, which failed the step after training (was: KFP's metrics).
        if applied:
            self.epoch_loss += step_loss if job_loss is None else job_loss
            self.epoch_steps += 1
        self.health.end_step(self.step, self.data_wait, timed=timed)
        # After the step's timing ends: a rank waiting here for a slower peer is not slow itself.
        shown = self._job_step_loss(step_loss) if job_loss is None else job_loss
        self.progress.step(self.step, self.epoch, shown, lr, grad_norm, self.data_wait, timed=timed)

    def _apply_optimizer_settings(self) -> None:
        """The config's learning rate and weight decay over the checkpoint's: the optimizer's and
        the scheduler's saved states carry the values they were written with, so a change was
        logged as taking effect and then ignored. Unchanged, the values are the same floats."""
        tc = self.cfg.train
        self.scheduler.base_lrs = [tc.learning_rate] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["initial_lr"], group["weight_decay"] = tc.learning_rate, tc.weight_decay
            group["lr"] = tc.learning_rate * lr_factor(self.scheduler.last_epoch, self.total_steps, self.cfg)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what the log shows

    def _job_step_loss(self, own: torch.Tensor) -> torch.Tensor:
        """The step's loss over the whole global batch (a collective: every rank calls it), for the
        progress line, the loss curve and TensorBoard: each rank's mean over equal shares. Equal on
        every rank, so the interval a checkpoint keeps from rank 0 is the job's at any world size."""
        if not self.env.distributed:
            return own
        every = own.detach().clone()
        torch.distributed.all_reduce(every)  # SUM: gloo has no AVG
        return every / self.env.world_size

    def _mean_over_units(self, summed: torch.Tensor, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Turn the gradients of summed losses, averaged over the ranks by the sync, into those of
        the mean over every unit of the global batch (a collective: every rank calls it); return
        this rank's own mean loss, for its progress line and the non-finite check, the global
        batch's mean loss, and whether the global batch had any unit at all."""
        # A custom task may count on the CPU: the collective needs both on the loss's device.
        both = torch.stack([summed.detach().to(torch.float64), units.to(summed.device, torch.float64)])
        if self.env.distributed:
            torch.distributed.all_reduce(both)
        total = both[1].item()
        if total > 0:  # none at all: the gradients are zero, and stay so
            scale = self.env.world_size / total
            for p in self.trainable:
                if p.grad is not None:
                    p.grad.mul_(scale)
        job_loss = (both[0] / max(total, 1.0)).to(summed.dtype)
        return summed / units.clamp(min=1), job_loss, total > 0

    def _measures_peak(self) -> bool:
        """Whether this step is the CPU's measured one: the second of this start (the first
        creates the optimizer state, as the probe's warm-up step does), or the last when there is
        no second."""
        if self.device.type == "cuda" or self.measured_peak is not None:
            return False
        return self.step - self.start_step == 1 or self.step + 1 == self.total_steps

    def _skip_update(self, step_loss: float, grad_norm: float) -> None:
        tc = self.cfg.train
        culprits = nonfinite_ranks(step_loss, self.env, self.device)
        what = (
            f"the loss was non-finite on rank(s) {culprits}"
            if culprits
            else "the loss was finite on every rank, the gradients overflowed"
        )
        where = (
            f"optimizer step {self.step + 1} (epoch {self.epoch}): {what}; grad norm {grad_norm} (reported by rank "
            f"{self.env.rank})"
        )
        if tc.on_nonfinite == "stop":
            raise NonFiniteLoss(f"non-finite loss or gradients at {where} (train.on_nonfinite: stop)")
        self.nonfinite_in_a_row += 1
        if self.nonfinite_in_a_row >= tc.max_consecutive_skips:
            raise NonFiniteLoss(
                f"{self.nonfinite_in_a_row} updates in a row skipped for non-finite loss or gradients, the last at "
                f"{where}: the run has diverged (train.on_nonfinite: skip, train.max_consecutive_skips "
                f"{tc.max_consecutive_skips}); lower train.learning_rate or set train.grad_clip_norm"
            )
        log.warning("skipping the update of %s (train.on_nonfinite: skip)", where)
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped += 1

    def _epoch_losses(self) -> list[float]:
        """Each rank's sum of its step losses this epoch, by rank (a collective: every rank calls it)."""
        if not self.env.distributed:
            return [float(self.epoch_loss)]
        every = [torch.zeros_like(self.epoch_loss) for _ in range(self.env.world_size)]
        torch.distributed.all_gather(every, self.epoch_loss)
        return [float(t) for t in every]

    def _validated(self) -> dict[str, float]:
        """The task's validation metrics (rank 0's, on the validation sample), as numbers; none
        named as the trainer's own in the same records."""
        reserved = (*TRAINER_METRICS, f"{self.task.item_name}_per_second")
        metrics = self.task.validate(unwrap(self.model), self.data.val, self.device, self.micro)
        return checked_metrics(self.task, metrics, reserved=reserved)

    def end_epoch(self) -> None:
        """Score the validation sample, record the epoch, and checkpoint at its end if asked."""
        # The mean over the epoch's steps of every rank's loss: the whole job's data, not rank 0's share.
        mean = sum(self._epoch_losses()) / (self.env.world_size * self.epoch_steps) if self.epoch_steps else math.nan
        record = {"epoch": self.epoch, "train_loss": mean}  # NaN: every update of the epoch was skipped
        if self.validates:
            record.update(self._validated())
        if self.env.is_main:
            log.info(
                "epoch %d done: %s", self.epoch, " ".join(f"{k} {v:.4f}" for k, v in record.items() if k != "epoch")
            )
        self.history.append(record)
        self.progress.epoch_end(self.step, record)
        # After the record, so a run resumed from here has the epoch in its history.
        if self.ckpt is not None and (self.cfg.checkpoint.at_epoch_end or self._interval_due()):
            self.save_checkpoint(self._best_candidate(record))

    def _best_candidate(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The epoch's record as the checkpoint's metrics when checkpoint.keep_best ranks them;
        every rank stops alike if rank 0's validation has no such metric."""
        if self.ckpt is None or self.ckpt.keep_best is None:
            return None
        name = self.ckpt.keep_best[1]
        problem = ""
        if self.env.is_main and name not in record:
            found = ", ".join(k for k in record if k != "epoch")
            problem = (
                f"checkpoint.keep_best: task {self.cfg.task!r} reports no validation metric {name!r} "
                f"(it reports: {found}); name one of those"
            )
        if self.env.distributed:
            box = [problem]
            torch.distributed.broadcast_object_list(box, src=0)
            problem = box[0]
        if problem:
            raise CheckpointError(problem)
        return record

    def _interval_due(self) -> bool:
        interval = self.cfg.checkpoint.interval_steps
        return bool(interval) and self.step % interval == 0

    def run(self) -> dict[str, Any]:
        """Train to the end (train.max_steps or train.epochs) and finish; return the final metrics."""
        self.t_train = time.perf_counter()
        with self.stop.installed():
            try:
                return self._run()
            finally:
                self.stop.drain()

    def _run(self) -> dict[str, Any]:
        while self.step < self.total_steps:
            batches = self.data.batches()
            while self.epoch_step < self.epoch_steps_total and self.step < self.total_steps:
                self.train_step(batches)
                mid_epoch = self.epoch_step < self.epoch_steps_total
                if self.ckpt is not None and mid_epoch and self._interval_due():
                    self.save_checkpoint()
                if mid_epoch and self._stopping():
                    self.terminate()
            if self.epoch_step < self.epoch_steps_total:
                break  # train.max_steps reached mid-epoch
            self.end_epoch()
            # After the epoch's record and validation, so a resumed run has them.
            if self._stopping():
                self.terminate()
            self.epoch, self.epoch_step = self.epoch + 1, 0
            self.epoch_loss, self.epoch_steps = torch.zeros((), device=self.device), 0
            self.epoch_steps_total = self.data.begin_epoch(self.epoch)
        return self.finish()

    def _stopping(self) -> bool:
        # The last step finishes the run instead: stopping there would save nothing more.
        return self.step < self.total_steps and self.stop.agreed()

    def terminate(self) -> None:
        """Stop after the current step on a stop signal (every rank, at the same step): commit a
        checkpoint of it and raise :class:`Terminated`."""
        env, why = self.env, self.stop.name()
        if self.ckpt is None:
            if env.is_main:
                log.warning(
                    "stopped by %s at step %d: nothing was saved (checkpoint.enabled is off), a new run starts over",
                    why,
                    self.step,
                )
            raise Terminated(f"stopped by {why} at step {self.step} without a checkpoint")
        if self.ckpt.last_step != self.step:
            self.save_checkpoint()
        self.ckpt.close()  # waits for the commit
        self.progress.close()
        if env.is_main:
            log.info(
                "stopped by %s at step %d: checkpoint committed %.2fs after the signal; a rerun resumes from it",
                why,
                self.step,
                self.stop.seconds_since(),
            )
        raise Terminated(f"stopped by {why} at step {self.step}; checkpoint committed")

    def _take_best(self) -> tuple[dict[str, Any], CheckpointManager] | None:
        """checkpoint.export_best: load the best checkpoint's weights for the model file (a
        collective); return its commit record and the checkpoints it is one of, or None when no
        checkpoint has the metric. A run resumed from another run's checkpoint ranks that run's
        checkpoints up to the one it began from with its own, and so on back through the runs that
        one began from: one line of training, validated on the same split (a resume on another
        split is refused), so the best may be from before."""
        direction, name = self.ckpt.keep_best
        found = {}  # step -> (commit record, its checkpoints); this run's own first, then back in time
        holders = [self.ckpt]
        if (own := self.ckpt.best()) is not None:
            found[int(own["step"])] = (own, self.ckpt)
        for folder in self.lineage:
            prefix, began = split_step_folder(folder)
            holders.append(earlier := self._reader(prefix))
            try:
                before = earlier.best(up_to=began)
            except StoreError as exc:  # the training is done: an unreadable earlier run costs its candidates only
                if self.env.is_main:
                    log.warning("checkpoint.export_best: %s's checkpoints are not ranked: %s", prefix, exc)
                continue
            if before is not None:
                found.setdefault(int(before["step"]), (before, earlier))
        step = best_step({s: record["metrics"] for s, (record, _) in found.items()}, direction, name)
        best, holder = found[step] if step is not None else (None, self.ckpt)
        for other in holders[1:]:
            if other is not holder:
                other.close()
        if best is None:
            if self.env.is_main:
                log.warning("checkpoint.export_best: no checkpoint has %s; the model is the last step's", name)
            return None
        if self.env.is_main:
            where = ""
            if holder is not self.ckpt:
                parent = split_step_folder(self.lineage[0])[0]
                how = "which this run resumed from" if holder.prefix == parent else "further back in its resumes"
                where = f", from {holder.prefix}, {how}"
            log.info(
                "checkpoint.export_best: the model is step %d's (%s %s %.6g)%s",
                best["step"],
                name,
                "lowest" if direction == "min" else "highest",
                best["metrics"][name],
                where,
            )
        if holder is not self.ckpt or int(best["step"]) != self.step:
            self._load(best, holder)
        return best, holder

    def _peak_memory_bytes(self) -> int:
        """The largest peak memory of any rank (a collective: every rank calls it): on a GPU since
        the trainer was built, on the CPU in the measured step; 0 when no step ran."""
        mine = self.peak_memory.peak_bytes() if self.device.type == "cuda" else self.measured_peak or 0
        peak = torch.tensor([float(mine)], dtype=torch.float64, device=self.device)
        if self.env.distributed:
            torch.distributed.all_reduce(peak, op=torch.distributed.ReduceOp.MAX)
        return int(peak.item())

    def finish(self) -> dict[str, Any]:
        """Wait for the last checkpoint, write the model and the training record (rank 0), and
        return the metrics."""
        cfg, env, task = self.cfg, self.env, self.task
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        train_seconds = time.perf_counter() - self.t_train
        peak_memory = self._peak_memory_bytes()  # the training loop's: before the final model is written
        if self.ckpt is not None:
            if self.ckpt.last_step != self.step:
                # The run's latest checkpoint is its model (what `kftrain runs` lists and a new run
                # continues); FSDP's model file is also consolidated from it (write_final_model).
                self.save_checkpoint()
            self.ckpt.close()
        self.progress.close()
        steps_run = self.step - self.start_step
        final = self.history[-1] if self.history else {}
        taken = self._take_best() if cfg.checkpoint.export_best and self.ckpt is not None else None
        best, holder = taken or (None, self.ckpt)
        if best is not None:
            final = best["metrics"]
        # `train.max_steps` past an epoch's end, not on one (or before the first's): the model written
        # has steps the last epoch's scores do not, scored now, its training loss over the steps since
        # (a run of no whole epoch had none). Alike on every rank (the history and the step counts
        # are): the loss's gather is a collective, the validation rank 0's.
        tail = best is None and self.epoch_steps > 0
        after_last_epoch = tail and bool(self.history)
        if tail:
            final = {"train_loss": sum(self._epoch_losses()) / (env.world_size * max(self.epoch_steps, 1))}
            if self.validates:
                final.update(self._validated())
        if self.validates and not final:
            final = self._validated()
        metrics = {
            **{k: v for k, v in final.items() if k != "epoch"},
            **({AFTER_LAST_EPOCH: self.step} if after_last_epoch else {}),
            "world_size": env.world_size,
            "steps": self.step,
            "resumed_from_step": self.start_step,
            "skipped_steps": self.skipped,
        }
        if steps_run and self.first_step_at is not None:  # a start that only resumed a finished training has no timing
            metrics.update(
                {
                    f"{task.item_name}_per_second": steps_run * self.items_per_step / max(train_seconds, 1e-9),
                    "train_seconds": train_seconds,
                    "seconds_to_first_step": self.first_step_at - self.t_start,
                    "first_step_unix_time": self.first_step_at,
                    "data_wait_fraction": self.data_wait / max(train_seconds, 1e-9),
                }
            )
        if peak_memory:
            metrics["peak_memory_bytes"] = peak_memory
        if self.step_seconds:
            metrics["median_step_seconds"] = statistics.median(self.step_seconds)
        if best is not None:
            metrics["best_step"] = int(best["step"])
        if self.peak and self.flops_per_step and steps_run:
            metrics["mfu"] = steps_run * self.flops_per_step / train_seconds / self.peak
        self.meta.update(task=cfg.task, dataset_uri=self.dataset_uri)
        digest = write_final_model(self.model, self.meta, self.store, self.model_uri, env, holder)
        if holder is not self.ckpt:
            holder.close()
        if env.is_main:
            record = {
                "metrics": metrics,
                "history": self.history,
                "loss_curve": self.progress.curve,
                "progress": self.progress.summary(),
                # What `resumed_from_step` continued: another run's checkpoint (checkpoint.resume_from), or this
                # run's own (a restart: on a cluster a new TensorBoard segment, locally a new start's folder).
                "resumed_from_another_run": self.resumed_elsewhere,
                "config": replica_config(to_dict(cfg)),
                # `config` is the last start's: what earlier starts trained under differs by these.
                "config_changes": self.config_changes,
                "device": self.device.type,  # what the job trained on (the report's prediction is for it)
                "parameter_digest": digest,
            }
            self.store.put_bytes(join_uri(self.model_uri, TRAINING_RECORD), json.dumps(record, indent=2).encode())
            log.info("model written to %s", self.model_uri)
        leave_together(env)
        return metrics


def run_training(
    cfg: Config, dataset_uri: str, model_uri: str, env: DistEnv, task: Task | None = None
) -> dict[str, Any]:
    """Train on this rank; return the final metrics (complete on rank 0)."""
    return Trainer(cfg, dataset_uri, model_uri, env, task).run()


def _stopped_outside_the_loop(env: DistEnv, received: list[int]) -> int:
    """The one line and the exit code of a rank stopped by a signal before the training loop."""
    if env.is_main:
        log.info(
            "stopped by %s before the training loop: nothing of this start to commit; a rerun resumes from the "
            "newest committed checkpoint",
            signal.Signals(received[0]).name,
        )
    return exit_codes.TERMINATED_CHECKPOINTED


#: What the trainer itself writes into the records an epoch's and the run's validation metrics
#: join (and `<items>_per_second`).
TRAINER_METRICS = (
    "epoch",
    "step",  # the progress record's, which the report's curves plot validation at
    "train_loss",
    AFTER_LAST_EPOCH,
    "world_size",
    "steps",
    "resumed_from_step",
    "skipped_steps",
    "train_seconds",
    "seconds_to_first_step",
    "first_step_unix_time",
    "data_wait_fraction",
    "peak_memory_bytes",
    "median_step_seconds",
    "best_step",
    "mfu",
)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of one training process."""
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    parser.add_argument("--config-json", required=True, help="the whole config as JSON")
    parser.add_argument("--dataset-uri", required=True, help="prepared dataset (data prep output)")
    parser.add_argument("--model-uri", required=True, help="where rank 0 writes the model")
    args = parser.parse_args(argv)
    print_stacks_on_signals()
    env = dist_env()
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {env.rank}] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
    )
    cfg = config_from_json(args.config_json)
    device = device_for(env)
    received: list[int] = []
    try:
        with stop_while_starting() as received, process_group(env, device, cfg.job.collective_timeout_seconds):
            run_training(cfg, args.dataset_uri, args.model_uri, env)
    except Terminated as exc:
        return _stopped_outside_the_loop(env, received) if received else exc.exit_code
    except KftrainError as exc:
        # A message that says what to fix, not a traceback repeated by every rank; the exit code
        # tells the launcher the cause (trainer/exit_codes.py).
        log.error("%s%s", FAILURE_MARKER, exc)
        return exit_codes.NONFINITE_LOSS if isinstance(exc, NonFiniteLoss) else exit_codes.USER_ERROR
    except RuntimeError as exc:
        if received:  # a collective that broke as its peers stopped on the same signal
            return _stopped_outside_the_loop(env, received)
        if unused := unused_parameters(exc):
            log.error("%s%s", FAILURE_MARKER, unused)
            return exit_codes.USER_ERROR
        if not collective_failed(exc):
            raise
        log.error(
            "%sa collective failed or timed out (a hung or lost peer; job.collective_timeout_seconds=%s): %s",
            FAILURE_MARKER,
            cfg.job.collective_timeout_seconds,
            exc,
        )
        return exit_codes.COLLECTIVE_TIMEOUT
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
