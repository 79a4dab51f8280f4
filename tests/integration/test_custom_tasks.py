"""A task of the user's own (`task: module:Class`, docs/data.md) through `kftrain run --local`:
what its author gets wrong ends the run with one line naming the task's method and the fix, and
what kftrain cannot read before the run (the metrics its evaluation reports) is checked at the gate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_group

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]

TASKS = '''
import torch
from trainer.tasks.classification import ClassificationTask


class Regression(ClassificationTask):
    """Its validation gives tensors (0-d), its evaluation no accuracy."""

    def validate(self, model, dataset, device, batch_size):
        return {k: torch.tensor(v) for k, v in super().validate(model, dataset, device, batch_size).items()}

    def evaluate(self, model, meta, store, dataset_uri, max_items):
        report = super().evaluate(model, meta, store, dataset_uri, max_items)
        return {"loss": 1.0 - report["accuracy"], "test_rows": 10}


class Unused(ClassificationTask):
    """A parameter its loss never uses."""

    def build_model(self, cfg, manifest):
        model, meta = super().build_model(cfg, manifest)
        model.register_parameter("spare", torch.nn.Parameter(torch.zeros(3)))
        return model, meta


class DatasetsOnly(ClassificationTask.__mro__[1]):
    """What the docs' one sentence once led to: only datasets()."""

    def datasets(self, cfg, store, dataset_uri, manifest):
        return [], []
'''


def kftrain(tmp_path: Path, task: str, *flags: str, replicas: int = 1) -> tuple[int, list[str]]:
    (tmp_path / "mytasks.py").write_text(TASKS)
    (tmp_path / "c.yaml").write_text(
        f"task: mytasks:{task}\njob:\n  replicas: {replicas}\ntrain:\n  epochs: 1\n  batch_size: 32\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "--local", "--config", "c.yaml", "--output-dir", "out", *flags]
    rc, out = run_group(cmd, timeout=280, env=env, cwd=str(tmp_path))
    return rc, out.strip().splitlines()


def test_a_task_that_leaves_methods_out_is_refused_before_any_step_naming_them(tmp_path):
    rc, lines = kftrain(tmp_path, "DatasetsOnly")
    assert rc == 2, lines[-20:]
    assert "does not implement prepare(), build_model()" in lines[-1] and "docs/data.md" in lines[-1], lines[-5:]
    assert not (tmp_path / "out").exists()


def test_a_bar_the_evaluation_does_not_report_fails_the_gate_and_tensor_metrics_are_numbers(tmp_path):
    rc, lines = kftrain(tmp_path, "Regression", "--min-accuracy", "0.95")
    assert rc == 3, lines[-20:]  # finished, gate failed, nothing exported (was: passed, "no quality bar set")
    gate = next(line for line in lines if line.startswith("Quality gate"))
    assert gate == (
        "Quality gate FAILED: the model was not exported (min_accuracy 0.95 is set, but the evaluation reports "
        "no accuracy (it reports loss, test_rows): return 'accuracy' from the task's evaluate(), or leave "
        "min_accuracy unset)"
    ), lines[-10:]
    assert any("epoch 0 done:" in line and "val_accuracy" in line for line in lines), lines[-30:]


def test_a_parameter_the_loss_never_uses_is_named_as_the_task_s_on_two_ranks(tmp_path):
    rc, lines = kftrain(tmp_path, "Unused", replicas=2)
    assert rc == 1, lines[-20:]
    assert "parameters of the model took no part in the loss" in lines[-1], lines[-10:]
    assert "requires_grad=False" in lines[-1] and "find_unused_parameters" not in lines[-1]
    assert "Parameter indices which did not receive grad for rank" in lines[-1], lines[-1]
