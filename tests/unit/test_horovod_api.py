"""The Horovod shim's API in one process: the topology read from the environment, several processes
per pod needing torchrun, unsupported APIs saying what to use instead, and use before init. Scripts
on real gloo processes are in tests/integration/test_horovod.py."""

from __future__ import annotations

import sys

import pytest
import torch

from trainer.horovod import api as hvd
from trainer.horovod.run import SHIM_DIR

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
