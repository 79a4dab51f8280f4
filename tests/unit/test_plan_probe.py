"""run_probe in one process (the multi-rank probe is tests/integration/test_local_probe.py)."""

from __future__ import annotations

import pytest

from trainer.config import Config
from trainer.plan import PlanError, make_plan, run_probe
from trainer.plan.probe import ProbeResult


def tiny(task: str = "causal_lm") -> Config:
    cfg = Config(task=task)
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = 2, 32, 2, 32
    cfg.train.batch_size, cfg.train.max_steps = 4, 10
    cfg.job.replicas, cfg.job.nproc_per_node = 1, 1
    return cfg


@pytest.mark.parametrize(
    ("task", "shell"),
    [
        ("causal_lm", {}),
        ("classification", {}),
        # A torchrun job's variables left in the shell `kftrain run --local` starts from: no process
        # group, so no job (was: a DDP wrapper over no group, the evaluate and plan steps' crash).
        ("causal_lm", {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}),
    ],
)
def test_one_process_probe_measures_a_step_and_its_peak_near_the_plan(task, shell, monkeypatch):
    for name, value in shell.items():
        monkeypatch.setenv(name, value)
    cfg = tiny(task)
    result = run_probe(cfg, steps=2)
    assert (result.world_size, result.steps, result.micro_batch, result.device) == (1, 2, 4, "cpu")
    assert result.comm_seconds == 0 and result.compute_seconds > 0
    assert result.step_seconds == pytest.approx(result.compute_seconds + result.data_wait_seconds)
    predicted = make_plan(cfg).memory.tensors
    assert predicted / 2 < result.peak_memory_bytes < predicted * 2
    assert ProbeResult(**result.as_dict()) == result


def test_a_task_without_a_synthetic_batch_cannot_be_probed(monkeypatch):
    from trainer.tasks.classification import ClassificationTask

    class NoBatch(ClassificationTask):
        def synthetic_batch(self, cfg, manifest, size):
            return None

    monkeypatch.setattr("trainer.tasks.task_for", lambda cfg: NoBatch())
    with pytest.raises(PlanError, match="gives no synthetic_batch"):
        run_probe(tiny("classification"), steps=1)
