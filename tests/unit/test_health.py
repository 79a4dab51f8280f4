"""The straggler and divergence rules of trainer/health.py, without processes (the multi-process
runs are in tests/integration/test_health.py)."""

from __future__ import annotations

import time

import pytest
import torch

from trainer.distributed import DistEnv
from trainer.health import Health, differing_ranks, own_time, parameter_fingerprint, stragglers


@pytest.mark.parametrize(
    ("own", "factor", "floor", "expected"),
    [
        ([0.01, 0.10], 1.5, 0.0, [1]),  # two ranks: the lower middle value is the fast one's
        ([0.10, 0.10, 0.10, 0.10], 1.5, 0.0, []),  # all alike
        ([0.10, 0.11, 0.12, 0.30], 1.5, 0.0, [3]),
        ([0.10, 0.11, 0.12, 0.30], 3.5, 0.0, []),  # within the factor
        ([0.30, 0.10, 0.31, 0.10, 0.10], 1.5, 0.0, [0, 2]),  # two slow of five
        ([0.0001, 0.0004], 1.5, 0.001, []),  # noise below the floor is never named
        ([0.01, 0.10], 0, 0.0, []),  # factor 0: off
        ([0.5], 1.5, 0.0, []),  # one rank has no peers
        ([0.0, 0.0], 1.5, 0.0, []),  # idle ranks
    ],
)
def test_a_straggler_is_slower_than_the_median_by_the_factor(own, factor, floor, expected):
    assert stragglers(own, factor, floor) == expected


def test_own_time_is_the_step_less_the_sync_wait_or_the_data_wait_when_sync_is_unmeasured():
    assert own_time(0.5, 0.1, 0.4) == pytest.approx(0.1)
    assert own_time(0.5, 0.1, -1.0) == pytest.approx(0.1)
    assert own_time(0.5, 0.3, -1.0) == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("digests", "expected"),
    [
        ([[1.0, 2.0, 3.0]] * 4, []),
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.5, 2.0, 3.0], [1.0, 2.0, 3.0]], [2]),
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.5]], [0, 1]),  # two ranks: no majority
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [2.0, 2.0, 3.0], [2.0, 2.0, 3.0]], [0, 1, 2, 3]),  # a tie
        ([[1.0, 2.0, 3.0], [9.0, 2.0, 3.0], [8.0, 2.0, 3.0]], [0, 1, 2]),  # three values: none is the majority
        ([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [8.0, 2.0, 3.0]], [2]),
    ],
)
def test_the_ranks_that_differ_are_those_outside_the_majority(digests, expected):
    assert differing_ranks(digests) == expected


def test_the_fingerprint_sees_one_changed_weight_and_equal_replicas_agree():
    torch.manual_seed(0)
    params = [torch.randn(64, 32), torch.randn(32), torch.randn(0)]
    same = [p.clone() for p in params]
    assert torch.equal(parameter_fingerprint(params), parameter_fingerprint(same))
    for change in (1e-6, -3.0):
        other = [p.clone() for p in params]
        other[0][5, 7] += change
        assert not torch.equal(parameter_fingerprint(params), parameter_fingerprint(other)), change
    # A swap of two weights keeps all three numbers: the digest is cheap, not a hash (documented).
    swapped = [p.clone() for p in params]
    swapped[1][[0, 1]] = swapped[1][[1, 0]]
    assert torch.equal(parameter_fingerprint(params), parameter_fingerprint(swapped))


def test_a_step_that_is_not_the_runs_own_is_left_out_of_the_step_time():
    """The CPU's profiled memory step runs slower on purpose: its time must not make a straggler."""
    env = DistEnv(rank=0, world_size=1, local_rank=0)
    health = Health(torch.nn.Linear(2, 2), [], env, torch.device("cpu"), interval=10, factor=1.5, divergence_steps=0)
    data_wait = 0.0
    for step, timed in enumerate([True, False, True], start=1):
        health.begin_step(data_wait)
        health._arrived = time.perf_counter()  # as the DDP comm hook marks it
        if not timed:
            time.sleep(0.05)
            data_wait += 0.5
        health.after_backward()
        health.end_step(step, data_wait, timed=timed)
    assert health._steps == 2 and health._step_seconds < 0.05
    # Nor its sync and data waits (were kept: a rank's own time, the step less its sync, went negative).
    assert len(health._waits) == 2 and max(health._waits) < 0.05
    assert health._data0 == 0.5
