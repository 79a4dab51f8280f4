"""Jobs the tests run on the local backend, and what they leave in a local store."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

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
