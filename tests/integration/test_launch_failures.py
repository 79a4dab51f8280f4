"""The cause the launcher reads from real replicas: two torchrun agents (a Master and a Worker
node, one gloo process each) run until both have ended, so the peer's side of a fault is in its
log as it would be in its pod's. Only the pod statuses around the real logs and exit codes are
written here (no cluster runs on this machine)."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.faulty_tasks import two_replicas_of
from trainer import exit_codes
from trainer.launch import failures
from trainer.launch.job import training_job
from trainer.launch.local import free_port, run_captured
from trainer.launch.spec import replica_env

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def run_until_every_replica_ends(spec) -> dict[str, tuple[int, list[str]]]:
    """Each replica's exit code and log, by pod name; unlike a backend's wait, a failed replica
    does not stop the others (a cluster leaves the peers to fail by themselves)."""
    port = str(free_port())
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    cmd = [sys.executable if c == "python" else c for c in spec.command]

    def replica(rtype: str, index: int) -> tuple[int, list[str]]:
        env = {**os.environ, **spec.env, **replica_env(spec, rtype, index, master_addr="127.0.0.1")}
        env.update(MASTER_PORT=port, PET_MASTER_PORT=port, PYTHONPATH=path)
        code, out = run_captured(cmd, timeout_s=180, env=env)
        return code, out.splitlines()

    replicas = spec.replicas_by_rank()
    with ThreadPoolExecutor(len(replicas)) as pool:
        ended = pool.map(lambda r: replica(*r), replicas)
        return {
            f"{spec.name}-{rtype.lower()}-{index}": result
            for (rtype, index), result in zip(replicas, ended, strict=True)
        }


def failed_pod(name: str, code: int) -> dict:
    return {
        "metadata": {"name": name},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "pytorch", "state": {"terminated": {"exitCode": code}}}],
        },
    }


def test_one_rank_s_error_is_the_cause_not_the_collective_failures_it_leaves_its_peers_in(
    digits, tmp_path, monkeypatch
):
    """Rank 1 raises in its loss; rank 0, waiting in the all-reduce, reports a failed collective.
    The diagnosis is rank 1's error (user_error: no re-creation), not a collective timeout
    (which would re-create the job to fail the same way)."""
    monkeypatch.setenv("KFTRAIN_TEST_RAISE_RANK", "1")
    cfg = two_replicas_of(
        "RaisingRankTask",
        {
            "train.max_steps": 8,
            "checkpoint.enabled": False,
            "job.collective_timeout_seconds": 60,
        },
    )
    ended = run_until_every_replica_ends(training_job(cfg, "raise", digits, str(tmp_path / "m")))
    logs = {name: lines for name, (_, lines) in ended.items()}
    master, worker = ended
    assert failures.root_cause_exit_code(logs[worker]) == exit_codes.USER_ERROR, "\n".join(logs[worker][-30:])
    # The premise: the peer's own report is a failed collective, which alone would be retried.
    assert failures.root_cause_exit_code(logs[master]) == exit_codes.COLLECTIVE_TIMEOUT, "\n".join(logs[master][-30:])
    assert failures.classify([failed_pod(master, ended[master][0])], [], logs).cause == failures.COLLECTIVE_TIMEOUT

    diagnosis = failures.classify([failed_pod(name, code) for name, (code, _) in ended.items()], [], logs)
    assert diagnosis.cause == failures.USER_ERROR, diagnosis
    assert worker in diagnosis.evidence
