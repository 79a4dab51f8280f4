"""Slow and silent faults (trainer/health.py) in real 2-process gloo jobs: a straggler is named,
a corrupted replica stops the job."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests.faulty_tasks import two_replicas_of
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.storage import LocalStore, join_uri

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def fault_env(monkeypatch):
    """Replicas inherit the environment: the test tasks' settings and the repository on the path."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return monkeypatch


def run(cfg, name, dataset, model_uri):
    lines: list[str] = []
    job = replace(training_job(cfg, name, dataset, model_uri), timeout_s=180)
    try:
        run_job(LocalBackend(sink=lines.append), job)
    except JobFailed as exc:
        return lines, exc
    return lines, None


def test_a_rank_that_sleeps_is_named_as_the_straggler(digits, tmp_path, fault_env):
    fault_env.setenv("KFTRAIN_TEST_SLOW_RANK", "1")
    fault_env.setenv("KFTRAIN_TEST_SLOW_SECONDS", "0.05")
    fault_env.setenv("KFTRAIN_NODE_NAME", "node-a")
    cfg = two_replicas_of(
        "SlowRankTask",
        {
            "train.max_steps": 8,
            "train.log_interval_steps": 4,
            "checkpoint.enabled": False,
        },
    )
    lines, failed = run(cfg, "slow", digits, str(tmp_path / "m"))
    assert failed is None, failed
    named = [line for line in lines if "straggler at step" in line]
    # Rank 0 logs it, at both intervals, and names rank 1 alone with its pod and node.
    assert len(named) == 2, "\n".join(lines[-30:])
    assert all(line.startswith("[master-0] [rank 0]") for line in named)
    own = [re.search(r"rank 1 \(pod [^,]+, node node-a\) takes ([\d.]+)s of its own per step", n) for n in named]
    assert all(own) and all(float(m.group(1)) >= 0.05 for m in own), named  # its sleep, and what a loaded machine adds
    assert all("sync wait 0.0" in n for n in named), named  # rank 1 barely waits: the others wait for it


def test_no_straggler_is_named_when_the_ranks_are_alike(digits, tmp_path, fault_env):
    # Both ranks compute 30 ms a step, so a loaded test machine's millisecond jitter stays noise.
    fault_env.setenv("KFTRAIN_TEST_SLOW_RANK", "0,1")
    fault_env.setenv("KFTRAIN_TEST_SLOW_SECONDS", "0.03")
    cfg = two_replicas_of(
        "SlowRankTask",
        {
            "train.max_steps": 28,  # past the first epoch's end, where rank 0 alone validates
            "train.log_interval_steps": 4,
            "checkpoint.enabled": False,
        },
    )
    lines, failed = run(cfg, "even", digits, str(tmp_path / "m"))
    assert failed is None, failed
    assert [line for line in lines if "epoch 0 done" in line]
    assert not [line for line in lines if "straggler at step" in line]


def test_a_corrupted_replica_stops_the_job_within_the_check_interval(digits, tmp_path, fault_env):
    fault_env.setenv("KFTRAIN_TEST_CORRUPT_RANK", "1")
    fault_env.setenv("KFTRAIN_TEST_CORRUPT_AT", "6")  # before the 6th step's forward pass
    cfg = two_replicas_of(
        "CorruptRankTask",
        {
            "train.max_steps": 30,
            "train.divergence_check_steps": 4,
        },
    )
    model = str(tmp_path / "m")
    lines, failed = run(cfg, "corrupt", digits, model)
    assert failed is not None, "\n".join(lines[-20:])
    message = str(failed)
    # Steps 4 agreed; by step 8 the replicas differ, and the job says so in one line.
    assert "training failed: the DDP replicas' parameters differ at optimizer step 8: " in message, message
    assert "ranks [0, 1] all differ" in message
    assert "train.divergence_check_steps" in message and "Traceback" not in message
    assert not LocalStore().exists(join_uri(model, "model.json"))
