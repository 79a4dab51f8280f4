"""Classification tasks that misbehave on one rank, for the fault tests (tests/integration/test_health.py).

Set by environment variables, which every replica of a local job inherits:
`KFTRAIN_TEST_SLOW_RANK` / `KFTRAIN_TEST_SLOW_SECONDS` (SlowRankTask sleeps that long in every
loss on those ranks, comma-separated), `KFTRAIN_TEST_CORRUPT_RANK` / `KFTRAIN_TEST_CORRUPT_AT` (CorruptRankTask
adds 1 to one weight of that rank's replica before that loss call, once), `KFTRAIN_TEST_RAISE_RANK` /
`KFTRAIN_TEST_RAISE_AT` (RaisingRankTask raises a ValueError, as a bug in a task would, on that rank at that loss
call while its peers wait in the step's collective).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from trainer.config import Config, load_config
from trainer.tasks.classification import ClassificationTask


def two_replicas_of(task: str, overrides: dict[str, Any]) -> Config:
    """The config of a job of two replicas (one process each) of one of these tasks, by class name."""
    return load_config(overrides={"task": f"tests.faulty_tasks:{task}", "job.replicas": 2, **overrides})


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class SlowRankTask(ClassificationTask):
    """A straggler: one rank computes slower than the others (or all alike, when all are listed)."""

    def loss(self, model, batch):
        if str(_rank()) in os.environ["KFTRAIN_TEST_SLOW_RANK"].split(","):
            time.sleep(float(os.environ.get("KFTRAIN_TEST_SLOW_SECONDS", "0.05")))
        return super().loss(model, batch)


class CorruptRankTask(ClassificationTask):
    """A silent fault: one rank's replica gets a changed weight, and DDP alone never notices."""

    calls = 0

    def loss(self, model, batch):
        self.calls += 1
        if _rank() == int(os.environ["KFTRAIN_TEST_CORRUPT_RANK"]) and self.calls == int(
            os.environ["KFTRAIN_TEST_CORRUPT_AT"]
        ):
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] += 1.0
        return super().loss(model, batch)


class RaisingRankTask(ClassificationTask):
    """A fault of the run on one rank: its peers are left waiting in the step's all-reduce."""

    calls = 0

    def loss(self, model, batch):
        self.calls += 1
        if _rank() == int(os.environ["KFTRAIN_TEST_RAISE_RANK"]) and self.calls == int(
            os.environ.get("KFTRAIN_TEST_RAISE_AT", "3")
        ):
            raise ValueError("label 11 is not one of the task's 10 classes")
        return super().loss(model, batch)
