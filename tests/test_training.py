"""Real multi-process DDP runs (gloo on CPU) through the local backend."""

import json
import re
from dataclasses import replace

import pytest
import torch

from trainer.config import load_config
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri

pytestmark = pytest.mark.timeout(180)


def train(digits, model_uri, replicas, **overrides):
    cfg = load_config(overrides={"job.replicas": replicas, "train.epochs": 3, **overrides})
    lines = []
    run_job(
        LocalBackend(sink=lines.append), replace(training_job(cfg, f"t{replicas}", digits, model_uri), timeout_s=150)
    )
    return lines


def test_two_ranks_end_with_identical_parameters(digits, tmp_path):
    lines = train(digits, str(tmp_path / "model"), replicas=2)
    digests = {
        m.group(1): m.group(2)
        for line in lines
        if (m := re.match(r"\[(master-0|worker-0)\] .*final parameter digest (\w+)", line))
    }
    assert set(digests) == {"master-0", "worker-0"}
    assert digests["master-0"] == digests["worker-0"]
    record = json.loads(LocalStore().get_bytes(join_uri(str(tmp_path / "model"), "training.json")))
    assert record["parameter_digest"] == digests["master-0"]
    assert record["metrics"]["world_size"] == 2
    assert any(line.startswith("[master-0] [rank 0]") and "loss" in line for line in lines)


def test_one_rank_and_two_ranks_learn_the_same_model(digits, tmp_path):
    """Same global batches (a fixed data.partitions), same seed: DDP's averaged gradients equal
    the single-process ones."""
    train(digits, str(tmp_path / "one"), replicas=1, **{"data.partitions": 2})
    train(digits, str(tmp_path / "two"), replicas=2, **{"data.partitions": 2})
    one, _ = load_model(LocalStore(), str(tmp_path / "one"))
    two, _ = load_model(LocalStore(), str(tmp_path / "two"))
    for p1, p2 in zip(one.parameters(), two.parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-5)
