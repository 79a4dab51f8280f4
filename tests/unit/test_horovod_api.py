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


# (what, call, the type raised, what the message says to use instead). Horovod's own type where
# Horovod has one for the situation (NotImplementedError for an Adasum configuration it cannot
# run); otherwise ShimUnsupportedError, which a script catching RuntimeError does not swallow.
UNSUPPORTED = [
    ("hvd.elastic", lambda: hvd.elastic.run, hvd.ShimUnsupportedError, "kubernetes.elastic"),
    ("import horovod.torch.elastic", _import_elastic, hvd.ShimUnsupportedError, "torchrun"),
    ("allreduce op=Adasum", lambda: hvd.allreduce(torch.ones(1), op=hvd.Adasum), NotImplementedError, "op=hvd.Average"),
    (
        "allreduce_ op=Adasum",
        lambda: hvd.allreduce_(torch.ones(1), op=hvd.Adasum),
        NotImplementedError,
        "op=hvd.Average",
    ),
    (
        "DistributedOptimizer op=Adasum",
        lambda: hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))]), op=hvd.Adasum),
        NotImplementedError,
        "op=hvd.Average",
    ),
    ("init(comm=)", lambda: hvd.init(comm=[0, 1]), hvd.ShimUnsupportedError, "no MPI"),
    ("start_timeline", lambda: hvd.start_timeline("t.json"), hvd.ShimUnsupportedError, "torch.profiler"),
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


@pytest.mark.parametrize(("what", "call", "error", "instead"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_apis_say_what_to_use_instead(shim_on_path, what, call, error, instead):
    with pytest.raises(error, match="not supported") as exc:
        call()
    assert type(exc.value) is error and instead in str(exc.value)


def test_the_shims_own_error_is_not_a_runtime_error():
    # Scripts catch RuntimeError for Horovod's collective failures (HorovodInternalError): they
    # must not swallow "this feature is missing".
    assert not issubclass(hvd.ShimUnsupportedError, RuntimeError)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


BAD_PROCESS_SETS = [
    ("a string", "0,1", "list of process ranks"),
    ("a communicator-like object", object(), "list of process ranks"),
    ("non-integer ranks", [0, 1.5], "integer process ranks"),
    ("a bool rank", [0, True], "integer process ranks"),
    ("duplicate ranks", [1, 1], "distinct"),
]


@pytest.mark.parametrize(("what", "ranks", "message"), BAD_PROCESS_SETS, ids=[b[0] for b in BAD_PROCESS_SETS])
def test_a_bad_process_set_is_a_value_error(what, ranks, message):
    with pytest.raises(ValueError, match=message):
        hvd.ProcessSet(ranks)


def test_a_process_set_is_sorted_and_unregistered_until_added():
    ps = hvd.ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and ps.process_set_id is None and ps.size() is None and ps.rank() is None
    assert hvd.remove_process_set(ps) is False and hvd.remove_process_set(hvd.global_process_set) is False


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("KFTRAIN_HOROVOD_CHECKS", "maybe", "use 1"),
        ("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", "soon", "not a number"),
        ("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", "0", "positive"),
    ],
)
def test_bad_check_settings_are_named(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=f"{variable}.*{message}"):
        hvd.init()
    assert not hvd.is_initialized()


def test_using_horovod_before_init_is_an_error():
    with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
        hvd.rank()
