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
    # Also an ImportError: a script that probes for elastic takes its fallback (was: failed).
    ("import horovod.torch.elastic, an ImportError", _import_elastic, ImportError, "torchrun"),
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


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not a whole number"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be at least 1"),  # was: "MASTER_ADDR expected"
        ({"RANK": "3", "WORLD_SIZE": "2"}, r"RANK=3 is not a rank of WORLD_SIZE=2 processes \(0..1\)"),
        # Every process rank 0 of the job (was: torch's "environment variable RANK expected" traceback).
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "WORLD_SIZE=2 but no RANK: each process of a job needs"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK='x' is not a whole number"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK='-1' must be at least 0"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "GROUP_RANK": "3"}, "GROUP_RANK=3 is not below"),
    ],
)
def test_an_environment_no_job_runs_with_is_named_by_its_variable(environ, said):
    """Was: `invalid literal for int() with base 10: 'abc'` in a traceback, not naming RANK."""
    with pytest.raises(hvd.HorovodEnvironmentError, match=said):
        hvd.topology(environ)


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({}, "MASTER_ADDR is not set: the ranks meet at rank 0's address"),
        ({"MASTER_ADDR": " "}, "MASTER_ADDR is not set"),
        ({"MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a whole"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "0"}, "MASTER_PORT='0' must be at least 1"),
        ({"MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a port"),
    ],
)
def test_where_the_ranks_meet_is_named_by_its_variable_before_torch_reads_it(environ, said):
    """What init() checks before torch's env:// rendezvous (was: torch's traceback, `MASTER_ADDR
    expected`, or `invalid literal for int()` naming no variable)."""
    from trainer.horovod.api import _check_rendezvous

    with pytest.raises(hvd.HorovodEnvironmentError, match=said):
        _check_rendezvous(environ)
    _check_rendezvous({"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "23456"})


def test_several_processes_per_pod_need_torchrun():
    with pytest.raises(RuntimeError, match="through torchrun"):
        hvd.topology({"RANK": "1", "WORLD_SIZE": "8", "PET_NPROC_PER_NODE": "4"})


@pytest.mark.parametrize(("what", "call", "error", "instead"), UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_apis_say_what_to_use_instead(shim_on_path, what, call, error, instead):
    with pytest.raises(error, match="not supported") as exc:
        call()
    # Horovod's own type where it has one, and always the shim's (horovod-run's one line).
    assert isinstance(exc.value, error) and isinstance(exc.value, hvd.ShimUnsupportedError), type(exc.value)
    assert instead in str(exc.value)


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
        ("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", "inf", "at most 604800"),
        ("KFTRAIN_HOROVOD_TIMEOUT_S", "1e400", "at most 604800"),  # was: OverflowError, naming no variable
    ],
)
def test_bad_check_settings_are_named(monkeypatch, variable, value, message):
    """One line from `horovod-run` (tests/integration/test_horovod.py), not a traceback."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(hvd.HorovodEnvironmentError, match=f"{variable}.*{message}"):
        hvd.init()
    assert not hvd.is_initialized()


def test_a_root_rank_that_is_no_int_is_said_as_such():
    """Was: "root_rank 0 is not a rank of this job (ranks [0])" for the text '0'."""
    hvd.init()
    try:
        with pytest.raises(ValueError, match=r"root_rank must be an int \(a rank\), got str '0'"):
            hvd.broadcast(torch.ones(2), root_rank="0")
        assert hvd.broadcast(torch.ones(2), root_rank=0).tolist() == [1.0, 1.0]
    finally:
        hvd.shutdown()


def test_using_horovod_before_init_is_an_error():
    with pytest.raises(ValueError, match=r"hvd\.init\(\)"):
        hvd.rank()


# --- the mismatch message names both sides ---------------------------------------------------


def _desc(kind="allreduce", names=("w",), tensors=((4, 8),), dtype=torch.float32, root=None, detail=()):
    specs = tuple(hvd.TensorSpec(shape, dtype) for shape in tensors)
    return hvd._Desc(kind, names, specs, root, detail)


MESSAGES = [
    (
        "shape",
        _desc(),
        _desc(tensors=((4, 9),)),
        "allreduce mismatch at collective #7 'w': rank 0 passed float32[4, 8], rank 2 passed float32[4, 9]",
    ),
    (
        "dtype",
        _desc(),
        _desc(dtype=torch.int32),
        "rank 0 passed float32[4, 8], rank 2 passed int32[4, 8] (the data types differ)",
    ),
    # The shapes agree: the dimensions are not what to fix (was: "every dimension but the first must match").
    (
        "allgather dtype",
        _desc(kind="allgather", tensors=((2,),)),
        _desc(kind="allgather", tensors=((2,),), dtype=torch.float64),
        "rank 0 passed float32[2], rank 2 passed float64[2] (the data types differ)",
    ),
    (
        "kind",
        _desc(),
        _desc(kind="broadcast", root=0),
        "order mismatch at collective #7: rank 0 called allreduce 'w' of "
        "float32[4, 8], rank 2 called broadcast 'w' of float32[4, 8]",
    ),
    ("name", _desc(), _desc(names=()), "name mismatch at collective #7: rank 0 passed 'w', rank 2 passed no name"),
    ("count", _desc(), _desc(tensors=((4, 8), (2,))), "rank 0 passed 1 tensors, rank 2 passed 2"),
    (
        "root",
        _desc(kind="broadcast", root=0),
        _desc(kind="broadcast", root=2),
        "rank 0 passed root_rank 0, rank 2 passed root_rank 2",
    ),
    (
        "detail",
        _desc(detail=(("op", "Sum"),)),
        _desc(detail=(("op", "Max"),)),
        "allreduce mismatch at collective #7 'w': rank 0 passed op=Sum, rank 2 passed op=Max",
    ),
    (
        "one of many tensors",
        _desc(names=("a", "b", "c", "d"), tensors=((1,), (2,), (3,), (4,))),
        _desc(names=("a", "b", "c", "d"), tensors=((1,), (2,), (5,), (4,))),
        "allreduce mismatch at collective #7 'c': rank 0 passed float32[3], rank 2 passed float32[5]",
    ),
    (
        "allgather first dimension is free",
        _desc(kind="allgather", tensors=((2, 3),)),
        _desc(kind="allgather", tensors=((5, 4),)),
        "rank 0 passed float32[2, 3], rank 2 passed float32[5, 4] (every dimension but the first must match)",
    ),
]


@pytest.mark.parametrize(("what", "mine", "theirs", "expected"), MESSAGES, ids=[m[0] for m in MESSAGES])
def test_the_mismatch_message_names_both_sides(what, mine, theirs, expected):
    # Three processes: the first that differs from rank 0 is named (rank 1 has joined: not compared).
    st = hvd._SetState((0, 1, 2), None, None, hvd.global_process_set)
    message = hvd._mismatch_message(st, [0, 1, 0], [(7, mine), (7, None), (7, theirs)])
    assert expected in message


def test_ranks_at_different_collectives_are_out_of_order():
    st = hvd._SetState((0, 1), None, None, hvd.global_process_set)
    message = hvd._mismatch_message(st, [0, 0], [(3, _desc()), (4, _desc(names=("v",)))])
    assert message.startswith(
        "collectives out of order: rank 0 is at collective #3 (allreduce 'w' of float32[4, 8]), "
        "rank 1 at collective #4 (allreduce 'v'"
    )


def test_a_first_dimension_alone_does_not_change_an_allgather_descriptor():
    assert hvd._hash(_desc(kind="allgather", tensors=((2, 3),))) == hvd._hash(
        _desc(kind="allgather", tensors=((9, 3),))
    )
    assert hvd._hash(_desc(tensors=((2, 3),))) != hvd._hash(_desc(tensors=((9, 3),)))


# --- a script for another framework's Horovod -------------------------------------------------


def run_script(monkeypatch, path, text: str) -> int:
    """`kftrain horovod-run` of a script holding `text`, in this process; its exit status."""
    from trainer.horovod.run import main

    path.write_text(text)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the runner puts the shim first, in this process
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    try:
        return main([str(path)])
    finally:
        for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    ("imports", "missing"),
    [
        ("import horovod.tensorflow as hvd", "horovod.tensorflow"),
        ("import horovod.tensorflow.keras as hvd", "horovod.tensorflow"),
        ("import horovod.keras as hvd", "horovod.keras"),
        ("import horovod.mxnet as hvd", "horovod.mxnet"),
        ("from horovod import tensorflow", "horovod.tensorflow"),
        ("from horovod.tensorflow import keras", "horovod.tensorflow"),
    ],
)
def test_a_script_importing_another_framework_s_horovod_is_one_line(tmp_path, monkeypatch, capsys, imports, missing):
    """`kftrain horovod-run` of a TensorFlow/Keras/MXNet script: one line saying the shim has only
    horovod.torch (was: the script's bare ModuleNotFoundError traceback)."""
    script = tmp_path / "train.py"
    assert run_script(monkeypatch, script, f"{imports}\nprint('trained')\n") == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"kftrain horovod-run: {script} imports {missing}, which kftrain's Horovod shim does not provide: it "
        "provides only horovod.torch (a PyTorch script's Horovod API, on torch.distributed); run a TensorFlow, "
        "Keras or MXNet script with horovodrun and a real Horovod"
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('import os\nprint("hi"\n', ['  File "SCRIPT", line 2', "SyntaxError: '(' was never closed"]),
        ("def f():\nreturn 1\n", ['  File "SCRIPT", line 2', "IndentationError: expected an indented block"]),
        (
            "def f():\n    return 1 / 0\n\nf()\n",
            ["Traceback (most recent call last):", '  File "SCRIPT", line 4, in <module>', "ZeroDivisionError"],
        ),
        ("import no_such_module_here\n", ["Traceback (most recent call last):", "ModuleNotFoundError: No module"]),
    ],
    ids=["syntax", "indentation", "runtime", "import"],
)
def test_a_script_s_own_error_is_shown_as_python_shows_it_without_the_runner_s_frames(
    tmp_path, monkeypatch, capsys, text, said
):
    """As `python script.py` shows it: the script's frames only (was: the runner's and runpy's
    frames above them; a script that does not compile, a traceback through kftrain's code)."""
    script = tmp_path / "train.py"
    assert run_script(monkeypatch, script, text) == 1
    err = capsys.readouterr().err
    for line in said:
        assert any(got.startswith(line.replace("SCRIPT", str(script))) for got in err.splitlines()), err
    assert "runpy" not in err and "trainer/horovod/run.py" not in err, err


# (module, name) of Horovod 0.28's PyTorch side that scripts and libraries import directly.
HOROVOD_TORCH_MODULES = [
    ("horovod.torch.mpi_ops", "allreduce_async"),
    ("horovod.torch.mpi_ops", "synchronize"),
    ("horovod.torch.mpi_ops", "Average"),
    ("horovod.torch.mpi_ops", "handle_average_backwards_compatibility"),  # was: ImportError
    ("horovod.torch.mpi_ops", "is_homogeneous"),
    ("horovod.torch", "is_homogeneous"),
    ("horovod.torch.compression", "Compression"),
    ("horovod.torch.functions", "broadcast_object"),
    ("horovod.torch.functions", "broadcast_optimizer_state"),
    ("horovod.torch.sync_batch_norm", "SyncBatchNorm"),
    ("horovod.torch.optimizer", "DistributedOptimizer"),
    ("horovod.common.exceptions", "HorovodInternalError"),
    ("horovod.common.process_sets", "ProcessSet"),
    ("horovod.common.process_sets", "add_process_set"),
]


@pytest.mark.parametrize(("module", "name"), HOROVOD_TORCH_MODULES)
def test_horovods_pytorch_modules_give_the_shims_objects(shim_on_path, module, name):
    """(was: refused, saying the script was a TensorFlow, Keras or MXNet one)"""
    import importlib

    assert getattr(importlib.import_module(module), name) is getattr(hvd, name)


@pytest.mark.parametrize(
    ("op", "average", "resolved"),
    [(None, None, hvd.Average), (None, True, hvd.Average), (None, False, hvd.Sum), (hvd.Max, None, hvd.Max)],
)
def test_the_op_of_a_call_from_op_or_the_older_average_flag(op, average, resolved):
    assert hvd.handle_average_backwards_compatibility(op, average) == resolved


def test_op_and_average_together_are_refused_as_horovod_refuses_them():
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.handle_average_backwards_compatibility(hvd.Sum, True)


def test_compressors_have_horovods_names(shim_on_path):
    from horovod.torch.compression import FP16Compressor, NoneCompressor

    assert (NoneCompressor, FP16Compressor) == (hvd.Compression.none, hvd.Compression.fp16)


@pytest.mark.parametrize(
    ("imports", "missing", "said"),
    [
        # A name imported from a package of the shim (was: ImportError's traceback).
        ("from horovod.common import util", "horovod.common.util", "import the names from horovod.torch"),
        ("from horovod.torch import mpi_lib_v2", "horovod.torch.mpi_lib_v2", "import the names from horovod.torch"),
        ("from horovod.torch.mpi_ops import _basics", "horovod.torch.mpi_ops._basics", "horovod.torch.mpi_ops,"),
        # Horovod's own launchers, PyTorch scripts all (was: called a TensorFlow, Keras or MXNet one).
        ("import horovod.spark.torch", "horovod.spark", "Horovod's own launchers (horovod.run, horovodrun"),
        ("from horovod.ray import RayExecutor", "horovod.ray", "Spark and Ray) are not part of it"),
        ("from horovod.runner import run", "horovod.runner", "start the processes with torchrun"),
        ("from horovod import run", "horovod.run", "or as a PyTorchJob (docs/horovod.md)"),
        # The same parts looked up on the package, as Horovod's docs write them (was: AttributeError's traceback).
        ("import horovod\nhorovod.run(print, np=2)", "horovod.run", "or as a PyTorchJob (docs/horovod.md)"),
        ("import horovod\nhorovod.spark.run(print)", "horovod.spark", "Spark and Ray) are not part of it"),
    ],
)
def test_a_module_or_launcher_the_shim_lacks_is_one_line_naming_it(
    tmp_path, monkeypatch, capsys, imports, missing, said
):
    script = tmp_path / "train.py"
    assert run_script(monkeypatch, script, f"{imports}\nprint('trained')\n") == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    verb = "uses" if imports.startswith("import horovod\n") else "imports"  # an attribute of the package
    assert err.startswith(f"kftrain horovod-run: {script} {verb} {missing}, which kftrain's Horovod shim"), err
    assert said in err and "TensorFlow" not in err, err


def test_any_other_missing_name_of_the_package_is_an_attribute_error_as_usual(tmp_path, monkeypatch, capsys):
    """`hasattr` and `getattr(horovod, name, default)` work on the shim as on any module."""
    script = tmp_path / "train.py"
    body = (
        "import horovod\nprint(hasattr(horovod, 'no_such_name'), hasattr(horovod, 'spark'), getattr(horovod, 'x', 3))\n"
    )
    assert run_script(monkeypatch, script, body) == 0
    assert capsys.readouterr().out == "False False 3\n"


def test_a_missing_pytorch_side_module_is_named_with_what_the_shim_has(tmp_path, monkeypatch, capsys):
    from trainer.horovod.run import shim_modules

    script = tmp_path / "train.py"
    assert run_script(monkeypatch, script, "from horovod.torch.mpi_lib_v2 import horovod_torch_allreduce_async_\n") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kftrain horovod-run: {script} imports horovod.torch.mpi_lib_v2, which kftrain's")
    assert "horovod.torch.mpi_ops, horovod.torch.optimizer" in err and "TensorFlow" not in err
    assert {module for module, _ in HOROVOD_TORCH_MODULES} <= set(shim_modules())


@pytest.mark.parametrize(
    ("script", "code", "said"),
    [
        # A script that probes for a framework and falls back runs on, as under python.
        ("try:\n    import horovod.tensorflow\nexcept ImportError:\n    print('no tf')\n", 0, "no tf"),
        # Another missing module is the script's own error: its traceback, as python shows it.
        ("import no_such_module_kftrain\n", 1, "ModuleNotFoundError: No module named 'no_such_module_kftrain'"),
    ],
    ids=["caught-by-the-script", "another-module"],
)
def test_other_import_errors_stay_the_script_s_own(tmp_path, monkeypatch, capsys, script, code, said):
    assert run_script(monkeypatch, tmp_path / "train.py", script) == code
    out, err = capsys.readouterr()
    assert said in out + err and "kftrain's Horovod shim" not in err


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK='abc' is not a whole number"),
        ({"KFTRAIN_HOROVOD_CHECK_TIMEOUT_S": "soon"}, "KFTRAIN_HOROVOD_CHECK_TIMEOUT_S='soon' is not a number"),
    ],
)
def test_horovod_run_says_an_environment_no_job_runs_with_in_one_line(
    shim_on_path, tmp_path, monkeypatch, capsys, env, said
):
    """Was: the script's traceback, ending in `invalid literal for int()` (not naming RANK)."""
    from trainer.horovod.run import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    script = tmp_path / "train.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    assert main([str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kftrain horovod-run: hvd.init(): {said}") and "\n" not in err, err


@pytest.mark.parametrize(
    ("make", "as_is"),
    [
        (lambda: torch.randn(4, 4), True),
        (lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), True),  # a conv model's gradient
        (lambda: torch.randn(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d), True),
        (lambda: torch.randn(3, 3).to_sparse(), True),
        (lambda: torch.arange(9.0).reshape(3, 3)[:, 1], False),  # a view with gaps: a dense copy
        (lambda: torch.arange(9.0)[::2], False),
    ],
    ids=["row-major", "channels-last", "channels-last-3d", "sparse", "column", "strided"],
)
def test_what_an_in_place_collective_puts_on_the_wire(make, as_is):
    """The tensor itself where gloo and NCCL can work in it (no copy of every gradient), else a
    dense copy the collective's result is copied back from."""
    from trainer.horovod.api import _widen

    t = make()
    wire = _widen(t)
    assert (wire is t) == as_is
    assert torch.equal(wire.to_dense() if wire.is_sparse else wire, t.to_dense() if t.is_sparse else t)
