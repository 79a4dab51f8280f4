"""The probe on 2 gloo ranks (real processes) against the plan's prediction: the measured peak
memory per rank and step time within a loose factor of what the plan predicts from the shapes
and a 1-rank probe (a sanity bound, not a timing assertion: bench/plan_accuracy.py measures the
error)."""

from __future__ import annotations

import pytest

from trainer.config import Config
from trainer.plan import make_plan
from trainer.plan.local import probe_locally

pytestmark = pytest.mark.timeout(300)


def tiny_gpt(strategy: str, world: int) -> Config:
    cfg = Config(task="causal_lm")
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = 2, 64, 4, 64
    cfg.train.batch_size, cfg.train.max_steps, cfg.train.strategy = 8, 50, strategy
    cfg.job.replicas, cfg.job.nproc_per_node = 1, world  # all on this machine
    return cfg


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_rank_probe_is_within_a_loose_factor_of_the_prediction(strategy):
    (base,) = probe_locally(tiny_gpt("ddp", 1), 1, steps=3, timeout_s=240)[0]
    assert base.world_size == 1 and base.comm_seconds == 0 and base.compute_seconds > 0
    cfg = tiny_gpt(strategy, 2)
    plan = make_plan(cfg, probe=base, nodes=(1,))
    (ranks,) = probe_locally(cfg, 2, steps=3, timeout_s=240)
    assert [r.world_size for r in ranks] == [2, 2] and [r.micro_batch for r in ranks] == [4, 4]
    predicted_memory = plan.memory.tensors
    for r in ranks:
        assert predicted_memory / 3 < r.peak_memory_bytes < predicted_memory * 3
        assert r.step_seconds >= r.compute_seconds > 0 and r.comm_seconds >= 0
    step = plan.point(1).step_seconds
    measured = max(r.step_seconds for r in ranks)
    assert step / 3 < measured < step * 3
