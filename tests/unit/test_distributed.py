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


DDP_SAID = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss. You can enable unused "
    "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
    "`torch.nn.parallel.DistributedDataParallel`, ...\n"
)


@pytest.mark.parametrize(
    "exc, said",
    [
        (RuntimeError(DDP_SAID + "Parameter indices which did not receive grad for rank 0: 2 3"), "rank 0: 2 3"),
        (
            RuntimeError(DDP_SAID + "Parameters which did not receive grad for rank 1: spare, head.bias\n"),
            "rank 1: spare, head.bias",
        ),
        (RuntimeError(DDP_SAID), "torch named none"),
    ],
)
def test_ddp_s_unused_parameters_error_says_the_task_s_fix_with_the_parameters_torch_names(exc, said):
    told = distributed.unused_parameters(exc)
    assert said in told and "requires_grad=False" in told, told
    assert "find_unused_parameters" not in told  # an argument of DDP's that no kftrain config sets


@pytest.mark.parametrize("exc", [RuntimeError("Connection closed by peer"), ValueError(DDP_SAID)])
def test_other_errors_are_not_taken_for_unused_parameters(exc):
    assert distributed.unused_parameters(exc) == ""
