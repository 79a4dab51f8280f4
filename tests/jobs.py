"""Jobs the tests run on the local backend, and what they leave in a local store."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.launch.spec import JobSpec
from trainer.storage import LocalStore, join_uri

#: A two-rank GPT small enough for CPU, with the same global batches under DDP and FSDP.
TINY_GPT = {
    "task": "causal_lm",
    "data.max_bytes": 200_000,
    "data.partitions": 2,  # the same global batches under both strategies
    "model.n_layer": 2,
    "model.n_head": 4,
    "model.n_embd": 64,
    "model.block_size": 64,
    "train.batch_size": 16,
    "train.max_steps": 16,
    "train.grad_accum_steps": 2,  # exercises the gradient sync skipped on micro-steps
    "train.grad_clip_norm": 0.5,  # exercises the global norm over sharded gradients
    "train.log_interval_steps": 1000,
    "job.replicas": 2,
    "checkpoint.enabled": False,
}


#: A 2-rank FSDP run of TINY_GPT with checkpoints (tests/integration/test_consolidate.py), and the
#: same run without (which test_train_fsdp.py compares with DDP): activation checkpointing on.
FSDP_CKPT = {
    **TINY_GPT,
    "train.strategy": "fsdp",
    "train.activation_checkpointing": True,
    "train.max_steps": 12,
    "checkpoint.enabled": True,
    "checkpoint.interval_steps": 5,  # saves at 5 and 10: the final step 12 is saved at the end
    "checkpoint.keep_last": 2,
}


def fsdp_runs(shared) -> tuple[Path, list[str], list[str]]:
    """(folder, lines of the checkpointed run, lines of the run without checkpoints) of the
    FSDP_CKPT runs, built once per test session; the folder holds the dataset `ds`, the runs'
    models `model` and `gathered`, and the checkpoints `ckpt`. Read-only."""
    from trainer.config import load_config
    from trainer.tasks import get_task

    def build(root: Path) -> None:
        cfg = load_config(overrides={**FSDP_CKPT, "checkpoint.uri": str(root / "ckpt")})
        get_task("causal_lm").prepare(cfg, LocalStore(), str(root / "ds"))
        with_ckpt = train(cfg, "ckpt", str(root / "ds"), str(root / "model"))
        plain = load_config(overrides={**FSDP_CKPT, "checkpoint.enabled": False})
        without = train(plain, "gather", str(root / "ds"), str(root / "gathered"))
        (root / "lines.json").write_text(json.dumps([with_ckpt, without]))

    root = shared("jobs-fsdp-runs", build)
    with_ckpt, without = json.loads((root / "lines.json").read_text())
    return root, with_ckpt, without


#: The demo on 2 DDP ranks with a fixed partition count (the same global batches on 1 rank).
TWO_RANKS = {"job.replicas": 2, "train.epochs": 3, "data.partitions": 2}


def two_rank_run(shared) -> tuple[str, list[str]]:
    """(model URI, log lines) of one TWO_RANKS run on the digits, a PyTorchJob on the local
    backend, built once per test session: test_train.py and test_trainjob_local.py read it."""
    from trainer.config import load_config

    digits = shared_digits(shared)

    def build(folder: Path) -> None:
        lines = train(load_config(overrides=TWO_RANKS), "two-ranks", digits, str(folder / "model"))
        (folder / "lines.json").write_text(json.dumps(lines))

    folder = shared("jobs-two-ranks", build)
    return str(folder / "model"), json.loads((folder / "lines.json").read_text())


def shared_digits(shared) -> str:
    """The demo's prepared digits dataset, built once per test session through the `shared`
    fixture (one for every xdist worker, where the `digits` fixture is one per worker): read-only."""
    from trainer.config import load_config
    from trainer.tasks.classification.data import prepare_dataset

    return str(shared("jobs-digits", lambda folder: prepare_dataset(load_config().data, LocalStore(), str(folder))))


def code_job(name: str, code: str, replicas: int = 1, nproc: int = 1, kind: str = "pytorchjob") -> JobSpec:
    """A job whose every process runs `code`."""
    return JobSpec(
        name=name,
        image="local",
        command=("python", "-c", textwrap.dedent(code)),
        replicas=replicas,
        nproc_per_node=nproc,
        kind=kind,
    )


def train(cfg, name: str, dataset: str, model_uri: str) -> list[str]:
    """Run the training job `cfg` describes on the local backend; its log lines."""
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(training_job(cfg, name, dataset, model_uri), timeout_s=240))
    return lines


def weights_of(model_uri: str) -> dict[str, torch.Tensor]:
    """The tensors of the model file a job wrote."""
    return load_safetensors(LocalStore().get_bytes(join_uri(model_uri, "model.safetensors")))


def record_of(model_uri: str) -> dict:
    """The training record a job wrote."""
    return json.loads(LocalStore().get_bytes(join_uri(model_uri, "training.json")))
