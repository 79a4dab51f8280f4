"""The Horovod shim: Horovod scripts written here run unchanged on real gloo processes.

Every multi-process test starts its processes in their own sessions with a timeout and kills
them all afterwards. The one stand-in is `fake_horovod`: a directory with a `horovod` package
made by the test to play a real Horovod installation the shim must not shadow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.s3server import free_port
from trainer.horovod import api as hvd
from trainer.horovod.run import SHIM_DIR

REPO = Path(__file__).resolve().parents[2]
QUIET = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def launch(cmd: list[str], world: int, logs: Path, timeout: float) -> None:
    """`world` processes with the environment a PyTorchJob gives one-process pods (no torchrun)."""
    port = free_port()
    procs = []
    try:
        for r in range(world):
            env = {**os.environ, **QUIET, "RANK": str(r), "WORLD_SIZE": str(world)}
            env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            with open(logs / f"log{r}.txt", "w") as log:
                procs.append(
                    subprocess.Popen(
                        cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{cmd} timed out after {timeout}s:\n" + (logs / "log0.txt").read_text()[-3000:])
        for r, p in enumerate(procs):
            assert p.returncode == 0, (logs / f"log{r}.txt").read_text()[-4000:]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# --- what is not supported says what to use instead ----------------------------------------


@pytest.fixture
def shim_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SHIM_DIR))
    yield
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        del sys.modules[name]


def _import_elastic():
    import horovod.torch.elastic  # noqa: F401


UNSUPPORTED = [
    ("hvd.elastic", lambda: hvd.elastic.run, "kubernetes.elastic"),
    ("import horovod.torch.elastic", _import_elastic, "torchrun"),
    ("allreduce op=Adasum", lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), "op=hvd.Average"),
    ("allreduce_ op=Adasum", lambda: hvd.allreduce_(torch.ones(1), op=hvd.Adasum), "op=hvd.Average"),
    (
        "DistributedOptimizer op=Adasum",
        lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))]), op=hvd.Adasum),
        "op=hvd.Average",
    ),
    ("ProcessSet", lambda: hvd.ProcessSet([0, 1]), "new_group"),
    ("add_process_set", lambda: hvd.add_process_set([0]), "new_group"),
    ("remove_process_set", lambda: hvd.remove_process_set(object()), "new_group"),
    ("process_set=", lambda: hvd.allreduce(torch.ones(1), process_set=object()), "new_group"),
    ("init(process_sets=)", lambda: hvd.init(process_sets=[[0]]), "new_group"),
    ("init(comm=)", lambda: hvd.init(comm=[0, 1]), "no MPI"),
    ("SyncBatchNorm", lambda: hvd.SyncBatchNorm(8), "convert_sync_batchnorm"),
    ("alltoall", lambda: hvd.alltoall(torch.ones(2)), "all_to_all_single"),
    ("reducescatter", lambda: hvd.reducescatter(torch.ones(2)), "reduce_scatter_tensor"),
    ("start_timeline", lambda: hvd.start_timeline("t.json"), "torch.profiler"),
]


# --- the environment contract --------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, hvd.Topology()),
        # PyTorchJob, one process per pod, no torchrun: process ranks, each pod a node.
        ({"RANK": "2", "WORLD_SIZE": "3", "PET_NPROC_PER_NODE": "1"}, hvd.Topology(2, 3, 0, 1, 2, 3)),
        # torchrun, 2 nodes x 4 processes: the 7th process is local rank 2 on node 1.
        (
            {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"},
            hvd.Topology(6, 8, 2, 4, 1, 2),
        ),
    ],
)
def test_topology_from_the_environment(environ, expected):
    assert hvd.topology(environ) == expected


def test_several_processes_per_pod_need_torchrun():
    with pytest.raises(RuntimeError, match="through torchrun"):
        hvd.topology({"RANK": "1", "WORLD_SIZE": "8", "PET_NPROC_PER_NODE": "4"})


@pytest.mark.parametrize(("what", "call", "instead"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_apis_say_what_to_use_instead(shim_on_path, what, call, instead):
    with pytest.raises(NotImplementedError, match="not supported") as exc:
        call()
    assert instead in str(exc.value)


def test_using_horovod_before_init_is_an_error():
    with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
        hvd.rank()
