"""trainer/distributed.py's own pieces that need no process group (the group's are tested in
tests/integration through real multi-process gloo runs)."""

from __future__ import annotations

import pytest

from trainer import distributed
from trainer.distributed import GLOO_WORKERS, comm_threads_settled

WORKER_ASLEEP = [(GLOO_WORKERS, "S"), (GLOO_WORKERS, "S"), ("python", "R")]
WORKER_BUSY = [(GLOO_WORKERS, "S"), (GLOO_WORKERS, "R"), ("python", "R")]


@pytest.mark.parametrize(
    "looks, settled, looked",
    [
        ([WORKER_ASLEEP] * 3, True, 3),  # asleep at three looks in a row (this thread's own state is not theirs)
        ([WORKER_BUSY, WORKER_BUSY, WORKER_ASLEEP, WORKER_BUSY, *[WORKER_ASLEEP] * 3], True, 7),  # a row is three
        ([[("python", "R")]] * 3, True, 3),  # no gloo group: nothing to wait for
    ],
)
def test_comm_threads_settle_when_gloo_s_workers_are_asleep_at_looks_in_a_row(monkeypatch, looks, settled, looked):
    told = iter(looks)
    seen = []
    monkeypatch.setattr(distributed, "thread_states", lambda: seen.append(1) or next(told))
    assert comm_threads_settled(timeout_s=5.0, poll_s=0.001) is settled
    assert len(seen) == looked


def test_a_gloo_worker_that_stays_busy_is_waited_for_no_longer_than_the_limit(monkeypatch):
    monkeypatch.setattr(distributed, "thread_states", lambda: WORKER_BUSY)
    assert comm_threads_settled(timeout_s=0.05, poll_s=0.001) is False
