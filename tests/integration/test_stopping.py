"""SIGTERM-safe training: ranks agree on a stop signal, commit a checkpoint, exit 143, and resume bitwise."""

from __future__ import annotations

import re
import signal
import textwrap
import time
import warnings
from dataclasses import replace

import pytest

from tests.conftest import run_ranks
from tests.integration.test_checkpoint import (
    RESUME_STRATEGIES,
    STEPS_PER_EPOCH,
    assert_ends_as_uninterrupted,
    reference_run,
    resume_config,
    start_until_mid_epoch_checkpoint,
)
from trainer.exit_codes import TERMINATED_CHECKPOINTED
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend

AGREE_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch.distributed as dist
    from trainer.distributed import DistEnv, checkpoint_group
    from trainer.stopping import StopSignal

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    stop = StopSignal(checkpoint_group(DistEnv(rank=rank, world_size=2)))
    timed = []
    with stop.installed():
        for step in range(1, 100000):
            time.sleep(0.02)  # the training step: long enough for the all-reduce to finish under load
            if rank == 1 and step == 40:
                os.kill(os.getpid(), signal.SIGTERM)  # only rank 1 is signalled
            t0 = time.perf_counter()
            agreed = stop.agreed()
            timed.append(time.perf_counter() - t0)
            if agreed:
                break
    us = sorted(timed)[len(timed) // 2] * 1e6
    sys.stdout.write(f"rank {rank} stopped after step {step} signal {stop.signum} agree_us {us:.0f}\\n")
    dist.barrier()  # leave together: a rank tearing the group down can abort a peer still in it
    dist.destroy_process_group()
    """
)


@pytest.mark.timeout(120)
def test_ranks_agree_to_stop_after_the_same_step_when_one_is_signalled(tmp_path):
    ranks = run_ranks(AGREE_SCRIPT, 2, timeout=90)
    out = [o for _, o in ranks]
    assert [rc for rc, _ in ranks] == [0, 0], out
    lines = [re.search(r"rank (\d) stopped after step (\d+) signal (\S+) agree_us (\d+)", o) for o in out]
    assert all(lines), out
    # Both stop after the same step, the one after rank 1 got the signal (the agreement started
    # at one step boundary is read at the next); rank 0 never got one itself.
    assert [int(m.group(2)) for m in lines] == [41, 41]
    assert [m.group(3) for m in lines] == ["None", str(int(signal.SIGTERM))]
    # The time a step boundary spends agreeing: the all-reduce ran during the step.
    assert max(int(m.group(4)) for m in lines) < 1000, out
    print("agreement all-reduce, median per step:", [f"{m.group(4)} us" for m in lines])


def replica_exit_codes(backend: LocalBackend, spec, lines: list[str], slow_s: float = 30.0) -> list[int]:
    """The exit codes of the job's replicas once they all ended.

    One still running `slow_s` after the first ended has every process of the job print its
    stacks, which go into a warning with the job's last lines (the CI log's warnings summary
    keeps them), and the rest of the pod's grace period: torchrun SIGKILLs a rank still running
    at TORCH_ELASTIC_SHUTDOWN_TIMEOUT, as the kubelet would the pod."""
    replicas = backend._jobs[spec.name]
    end = time.monotonic() + slow_s
    while any(r.proc.poll() is None for r in replicas) and time.monotonic() < end:
        time.sleep(0.1)
    if any(r.proc.poll() is None for r in replicas):
        asked = backend.ask_for_stacks(spec)
        warnings.warn(
            f"a replica of {spec.name} still ran {slow_s:.0f}s after another ended; the stacks of {asked}, "
            "in its last lines:\n" + "\n".join(lines[-150:]),
            stacklevel=2,
        )
    grace = int(spec.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
    return [r.proc.wait(timeout=grace + 30) for r in replicas]


@pytest.mark.slow
@pytest.mark.timeout(420)
@RESUME_STRATEGIES
def test_sigterm_mid_epoch_commits_exits_143_and_resumes_bitwise_equal(shared, tmp_path, strategy):
    dataset, ref_uri = reference_run(shared, strategy)
    epochs = resume_config("unused").train.epochs

    # SIGTERM to every process of the job (as deleting its pods would) right after the first
    # mid-epoch interval checkpoint, so it lands mid-epoch between two interval checkpoints.
    prefix = str(tmp_path / "ckpt")
    spec = replace(
        training_job(resume_config(prefix, **strategy), "victim", dataset, str(tmp_path / "victim")), timeout_s=240
    )
    lines: list[str] = []
    backend, mgr = start_until_mid_epoch_checkpoint(spec, prefix, sink=lines.append)
    before = set(mgr.committed_steps())
    signalled = time.monotonic()
    backend.kill(spec, signal.SIGTERM)
    while set(mgr.committed_steps()) <= before:
        assert time.monotonic() < signalled + 60, "no checkpoint committed after SIGTERM"
        time.sleep(0.01)
    commit_s = time.monotonic() - signalled
    with pytest.raises(JobFailed, match=f"exited with code {TERMINATED_CHECKPOINTED}"):
        backend.wait(spec)
    # Every replica (its torchrun agent, whose exit the pod reports) ended with 143.
    assert replica_exit_codes(backend, spec, lines) == [TERMINATED_CHECKPOINTED] * 2

    stops = {int(m.group(1)) for line in lines if (m := re.search(r"stopped by SIGTERM at step (\d+)", line))}
    assert len(stops) == 1, lines[-40:]
    stopped_at = stops.pop()
    assert stopped_at < epochs * STEPS_PER_EPOCH
    if not stopped_at % STEPS_PER_EPOCH:  # signalled right after a mid-epoch checkpoint, a loaded machine can be late
        pytest.skip(f"the stop fell on an epoch's end (step {stopped_at}): this run cannot show a mid-epoch resume")
    assert max(mgr.committed_steps()) == stopped_at  # the step it stopped at, not an older one
    reported = [float(m.group(1)) for line in lines if (m := re.search(r"committed ([\d.]+)s after the signal", line))]
    assert len(reported) == 1, "rank 0 alone reports the time"
    print(f"SIGTERM -> checkpoint of step {stopped_at} committed in {commit_s:.2f}s (rank 0: {reported[0]:.2f}s)")

    # The same job again resumes from that step and ends as if never stopped.
    lines.clear()
    run_job(LocalBackend(sink=lines.append), spec)
    resumed = [int(m.group(1)) for line in lines if (m := re.search(r"resumed at step (\d+)", line))]
    assert resumed and resumed[0] == stopped_at
    assert_ends_as_uninterrupted(ref_uri, str(tmp_path / "victim"))
