"""The Horovod shim: Horovod scripts written here run unchanged on real gloo processes.

Every multi-process test starts its processes in their own sessions with a timeout and kills
them all afterwards. The one stand-in is `fake_horovod`: a directory with a `horovod` package
made by the test to play a real Horovod installation the shim must not shadow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.conftest import run_group
from trainer.horovod.run import SHIM_DIR, horovod_command
from trainer.launch.backend import run_job
from trainer.launch.local import LocalBackend, free_port
from trainer.launch.preflight import validate_pytorchjob
from trainer.launch.pytorchjob import pytorchjob_manifest
from trainer.launch.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
QUIET = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def write(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


def start(cmd: list[str], world: int, logs: Path) -> list[subprocess.Popen]:
    """`world` processes with the environment a PyTorchJob gives one-process pods (no torchrun),
    each in its own session, writing to logs/log{rank}.txt."""
    port = free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, **QUIET, "RANK": str(r), "WORLD_SIZE": str(world)}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with open(logs / f"log{r}.txt", "w") as log:
            procs.append(
                subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
    return procs


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def launch(cmd: list[str], world: int, logs: Path, timeout: float) -> None:
    """Run `start`'s processes to the end; fail unless every one exits 0 within `timeout`."""
    procs = start(cmd, world, logs)
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{cmd} timed out after {timeout}s:\n" + (logs / "log0.txt").read_text()[-3000:])
        for r, p in enumerate(procs):
            assert p.returncode == 0, (logs / f"log{r}.txt").read_text()[-4000:]
    finally:
        kill_all(procs)


# --- the runner never shadows a real Horovod ----------------------------------------------

RAN = """
import pathlib, sys
import horovod, horovod.torch as hvd
pathlib.Path(sys.argv[1]).write_text(horovod.__file__)
"""


# --- one process, no distributed environment: DistributedOptimizer's contract -------------

SINGLE = """
import json, sys, warnings
import torch
import horovod, horovod.torch as hvd

hvd.init()
out = {"file": horovod.__file__, "size": hvd.size(), "rank": hvd.rank(), "argv": sys.argv[1:]}
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), backward_passes_per_step=2
)
out["class"] = [type(opt).__name__, isinstance(opt, torch.optim.SGD)]
x = torch.ones(3, 4)
model(x).sum().backward()
try:
    opt.zero_grad()
except AssertionError as e:
    out["zero_grad_between"] = str(e)
model(x).sum().backward()
try:
    model(x).sum().backward()
except AssertionError as e:
    out["third_backward"] = str(e)

# Gradient clipping the Horovod way: synchronize, clip, step inside skip_synchronize.
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
opt.zero_grad()
(100 * model(x).sum()).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
out["clipped_norm"] = float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm())
opt.zero_grad()
model(x).sum().backward()
opt.synchronize()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    opt.step()
out["warned"] = [str(w.message) for w in caught]

for names in ([("w", model.weight)], [("w", model.weight), ("w", model.bias)]):
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=names)
    except ValueError as e:
        out.setdefault("bad_names", []).append(str(e))

# Alone, a parameter the script never uses keeps no gradient, so AdamW's decay and momentum leave
# it where it is, as without Horovod (was: a zero gradient, and it moved).
used, unused = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.AdamW([*used.parameters(), *unused.parameters()], lr=0.1))
before = [p.detach().clone() for p in unused.parameters()]
for step in range(3):
    opt.zero_grad()
    used(x).sum().backward()
    opt.step()
out["unused_moved"] = max(float((p - b).abs().max()) for p, b in zip(unused.parameters(), before))
out["unused_grads"] = [p.grad is None for p in unused.parameters()]
out["elastic_probe"] = [hasattr(hvd.elastic, "run"), getattr(hvd.elastic, "TorchState", "absent")]
json.dump(out, open(sys.argv[1], "w"))
"""


# --- collectives on two real gloo processes ------------------------------------------------

COLLECTIVES = """
import json, sys
import torch
import horovod.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
out = {"topology": [r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]}
x = torch.tensor([1.0, 2.0]) * (r + 1)
out["average"] = hvd.allreduce(x).tolist()
out["sum"] = hvd.allreduce(x, op=hvd.Sum).tolist()
out["legacy_sum"] = hvd.allreduce(x, average=False).tolist()
out["legacy_average"] = hvd.allreduce(x, average=True).tolist()
out["min"] = hvd.allreduce(x, op=hvd.Min).tolist()
out["max"] = hvd.allreduce(x, op=hvd.Max).tolist()
out["product"] = hvd.allreduce(x, op=hvd.Product).tolist()
out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25).tolist()
out["fp16"] = [hvd.allreduce(x, compression=hvd.Compression.fp16).tolist(), str(hvd.allreduce(x).dtype)]
out["int_average"] = hvd.allreduce(torch.tensor([3 + r])).tolist()
out["input_untouched"] = x.tolist()
y = x.clone()
out["inplace_returns_it"] = hvd.allreduce_(y, op=hvd.Sum) is y
out["inplace"] = y.tolist()
h = hvd.allreduce_async(x, op=hvd.Sum)
out["async"] = hvd.synchronize(h).tolist()
out["polled"] = hvd.poll(h)
z = x.clone()
hvd.synchronize(hvd.allreduce_async_(z))
out["async_inplace"] = z.tolist()
out["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)]
g = torch.tensor([float(r)], requires_grad=True)
hvd.allreduce(3 * g, op=hvd.Sum).sum().backward()
out["grad"] = g.grad.tolist()
out["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r))).tolist()
out["allgather_scalar"] = hvd.synchronize(hvd.allgather_async(torch.tensor(10 + r))).tolist()
try:
    hvd.allgather(torch.zeros(1, r + 1))
except hvd.HorovodInternalError as e:  # Horovod's type for ranks that disagree
    out["allgather_mismatch"] = str(e)
b = torch.tensor([float(r)] * 3)
out["broadcast"] = hvd.broadcast(b, root_rank=1).tolist()
out["broadcast_input"] = b.tolist()
hvd.broadcast_(b, root_rank=1)
out["broadcast_inplace"] = b.tolist()
out["homogeneous"] = hvd.is_homogeneous()
out["object"] = hvd.broadcast_object({"from": r}, root_rank=1)
out["objects"] = hvd.allgather_object({"rank": r})
# As Horovod serialises them (cloudpickle): a lambda and a closure travel too.
out["lambda"] = hvd.broadcast_object(lambda v, r=r: v + 10 * r, root_rank=1)(1)
out["closures"] = [f(1) for f in hvd.allgather_object(lambda v: v * (r + 2))]
# An object root cannot serialise fails every rank at once, naming it (was: the others waited).
try:
    hvd.broadcast_object(__import__("threading").Lock(), root_rank=1)
except hvd.HorovodInternalError as e:
    out["unserialisable"] = str(e)
out["after_unserialisable"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).tolist()
try:
    hvd.broadcast(b, root_rank=n)
except ValueError as e:
    out["bad_root"] = str(e)
hvd.barrier()
out["join"] = hvd.join()
hvd.shutdown()
out["after_shutdown"] = hvd.is_initialized()
json.dump(out, open(f"{sys.argv[1]}/rank{r}.json", "w"))
"""


# --- a Horovod training script trains the same model as the plain DDP one ------------------

COMMON = """
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F

STEPS, BATCH, LR = 12, 16, 0.05


def data():
    d = load_digits()
    return torch.tensor(d.data / 16.0, dtype=torch.float32), torch.tensor(d.target)


def net():
    return nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10))


def warm_start():
    # The checkpoint the job resumes from: a seed-0 model after one local momentum step.
    torch.manual_seed(0)
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x, y = data()
    F.cross_entropy(model(x[:64]), y[:64]).backward()
    opt.step()
    return model.state_dict(), opt.state_dict()


def batch(x, y, step, micro, passes, rank, size):
    # Every (step, micro-step, rank) reads its own slice, in the same order in both scripts.
    i = ((step * passes + micro) * size + rank) * BATCH
    return x[i : i + BATCH], y[i : i + BATCH]


def loss_of(model, xb, yb, passes):
    return F.cross_entropy(model(xb), yb) / passes
"""

HOROVOD_TRAIN = """
import json, sys
import torch
import horovod.torch as hvd
from common import STEPS, LR, batch, data, loss_of, net, warm_start

hvd.init()
out_dir = sys.argv[1]
x, y = data()
result = {"topology": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()]}
for passes, compression in ((1, "none"), (2, "none"), (1, "fp16")):
    torch.manual_seed(1000 + hvd.rank())  # every rank starts elsewhere: broadcast_parameters must fix that
    model = net()
    # Settings rank 0's checkpoint overrides: broadcast_optimizer_state must carry them too.
    opt = torch.optim.SGD(model.parameters(), lr=3 * LR, momentum=0.5)
    opt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        compression=getattr(hvd.Compression, compression),
    )
    if hvd.rank() == 0:
        model_state, opt_state = warm_start()
        model.load_state_dict(model_state)
        opt.load_state_dict(opt_state)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(STEPS):
        for micro in range(passes):
            loss = loss_of(model, *batch(x, y, step, micro, passes, hvd.rank(), hvd.size()), passes)
            loss.backward()
        opt.step()
        opt.zero_grad()
    result[f"loss-{passes}-{compression}"] = hvd.allreduce(loss.detach() * passes, name="loss").item()
    torch.save(model.state_dict(), f"{out_dir}/hvd-{passes}-{compression}-rank{hvd.rank()}.pt")
json.dump(result, open(f"{out_dir}/hvd-rank{hvd.rank()}.json", "w"))
hvd.join()  # every rank has written its files before the master's exit ends the job
"""

DDP_TRAIN = """
import contextlib, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from common import STEPS, LR, batch, data, loss_of, net, warm_start

dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
x, y = data()
for passes in (1, 2):
    model_state, opt_state = warm_start()
    model = net()
    model.load_state_dict(model_state)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    opt.load_state_dict(opt_state)
    for step in range(STEPS):
        for micro in range(passes):
            sync = micro == passes - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss_of(ddp, *batch(x, y, step, micro, passes, rank, size), passes).backward()
        opt.step()
        opt.zero_grad()
    torch.save(model.state_dict(), f"{sys.argv[1]}/ddp-{passes}-rank{rank}.pt")
# Leave together: a gloo rank that tears its group down while a peer is still in it can abort.
dist.barrier()
dist.destroy_process_group()
"""


def _warm_start_here(tmp_path: Path):
    sys.path.insert(0, str(tmp_path))
    try:
        import common

        return common.warm_start()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("common", None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["PYTHONPATH", "beside the script"])
def test_a_real_horovod_is_never_shadowed(tmp_path, where):
    # A stand-in for a real Horovod installation: a `horovod` package that is not the shim.
    site = tmp_path / ("site" if where == "PYTHONPATH" else "scripts")
    (site / "horovod").mkdir(parents=True)
    (site / "horovod" / "__init__.py").write_text("raise SystemExit('the stand-in Horovod was imported')\n")
    (tmp_path / "scripts").mkdir(exist_ok=True)
    script = write(tmp_path / "scripts" / "train.py", RAN)
    env = {**os.environ, **QUIET}
    if where == "PYTHONPATH":
        env["PYTHONPATH"] = str(site)
    marker = tmp_path / "ran"
    rc, out = run_group(
        [sys.executable, "-m", "pipelines.cli", "horovod-run", str(script), str(marker)], timeout=100, env=env, cwd=REPO
    )
    assert rc == 2, out
    assert "a real Horovod is installed" in out and str(site / "horovod") in out, out
    assert not marker.exists()


@pytest.mark.timeout(120)
def test_one_plain_process_and_the_optimizer_contract(tmp_path):
    script = write(tmp_path / "single.py", SINGLE)
    result = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")}
    env["HOROVOD_TIMELINE"] = str(tmp_path / "timeline.json")  # what horovodrun --timeline-filename sets
    rc, out = run_group([sys.executable, "-m", "trainer.horovod.run", str(script), str(result)], 100, env, str(REPO))
    assert rc == 0, out
    # Not read (was: ignored in silence): the line names what records a timeline instead.
    assert out.count("HOROVOD_TIMELINE is not read here; call hvd.start_timeline(path)") == 1, out
    got = json.loads(result.read_text())
    assert Path(got["file"]).is_relative_to(SHIM_DIR)
    assert (got["size"], got["rank"], got["argv"]) == (1, 0, [str(result)])
    assert got["class"] == ["SGD", True]
    assert "before optimizer.step()" in got["zero_grad_between"]
    assert "more than backward_passes_per_step" in got["third_backward"]
    assert got["clipped_norm"] == pytest.approx(1.0, rel=1e-5)
    assert len(got["warned"]) == 1 and "skip_synchronize" in got["warned"][0]
    assert "not in it" in got["bad_names"][0] and "duplicates" in got["bad_names"][1]
    assert got["unused_moved"] == 0.0 and got["unused_grads"] == [True, True]
    # A script probing for elastic support takes its own fallback (was: the shim's error).
    assert got["elastic_probe"] == [False, "absent"]


TIMELINE_LEFT_RUNNING = """
import sys, torch, horovod.torch as hvd
hvd.init()
try:
    hvd.start_timeline(sys.argv[1] + "/no/such/folder/timeline.json")
except ValueError as exc:
    print("refused:", exc)
hvd.start_timeline(sys.argv[1] + "/first.json")
hvd.start_timeline(sys.argv[1] + "/timeline.json")  # while recording: the file changes
hvd.allreduce(torch.ones(2), name="x")
"""  # and no stop_timeline(), as Horovod scripts end


@pytest.mark.timeout(120)
def test_a_timeline_is_refused_where_it_cannot_be_written_and_written_at_exit_without_stop(tmp_path):
    """Horovod writes its timeline from the start and closes it at shutdown (was: a path in no
    folder accepted, the trace lost at the end; without stop_timeline a segfault at exit, no file)."""
    script = write(tmp_path / "timeline.py", TIMELINE_LEFT_RUNNING)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")}
    rc, out = run_group([sys.executable, "-m", "trainer.horovod.run", str(script), str(tmp_path)], 100, env, str(REPO))
    assert rc == 0, out
    assert f"refused: start_timeline: cannot write '{tmp_path}/no/such/folder/timeline.json'" in out, out
    assert json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    assert not (tmp_path / "first.json").exists()  # was: left behind, an empty file


def test_a_failing_script_exits_1_with_its_traceback(tmp_path):
    script = write(tmp_path / "bad.py", "raise ValueError('from the script')\n")
    rc, out = run_group([sys.executable, "-m", "pipelines.cli", "horovod-run", str(script)], 100, None, str(REPO))
    assert rc == 1
    assert "Traceback" in out and "ValueError: from the script" in out


@pytest.mark.parametrize(
    ("call", "says"),
    [
        ("hvd.allreduce(torch.ones(2), op=hvd.Adasum)", "op=hvd.Adasum is not supported by kftrain's Horovod shim"),
        ("hvd.elastic.run(lambda state: None)", "hvd.elastic is not supported by kftrain's Horovod shim"),
        ("hvd.init(comm=[0])", "hvd.init(comm=...) is not supported by kftrain's Horovod shim"),
        # An ImportError too (a script may probe for it), and still one line uncaught (was, at
        # first: a traceback).
        ("import horovod.torch.elastic", "hvd.elastic is not supported by kftrain's Horovod shim"),
    ],
    ids=["adasum", "elastic", "mpi-comm", "elastic-import"],
)
def test_a_feature_the_shim_lacks_ends_the_process_on_one_line_naming_the_script_s_call(tmp_path, call, says):
    script = write(tmp_path / "uses.py", f"import torch\nimport horovod.torch as hvd\n\nhvd.init()\n{call}\n")
    rc, out = run_group([sys.executable, "-m", "pipelines.cli", "horovod-run", str(script)], 100, None, str(REPO))
    assert rc == 1 and "Traceback" not in out, out
    assert f"kftrain horovod-run: {script}:5: {says}" in out, out


@pytest.mark.timeout(180)
def test_collectives_on_two_gloo_processes(tmp_path):
    script = write(tmp_path / "collectives.py", COLLECTIVES)
    launch([sys.executable, "-m", "trainer.horovod.run", str(script), str(tmp_path)], 2, tmp_path, timeout=150)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, got in enumerate(ranks):
        # Without torchrun each one-process pod is a node of its own.
        assert got["topology"] == [r, 2, 0, 1, r, 2]
        assert got["average"] == got["legacy_average"] == [1.5, 3.0]
        assert got["sum"] == got["legacy_sum"] == got["inplace"] == got["async"] == [3.0, 6.0]
        assert got["async_inplace"] == [1.5, 3.0] and got["polled"] is True
        assert (got["min"], got["max"], got["product"]) == ([1.0, 2.0], [2.0, 4.0], [2.0, 8.0])
        assert got["scaled"] == [1.5, 3.0]  # (2 * 1 + 2 * 2) * 0.25, (2 * 2 + 2 * 4) * 0.25
        assert got["fp16"] == [[1.5, 3.0], "torch.float32"]
        assert got["int_average"] == [3]  # (3 + 4) / 2, truncated in the integer dtype
        assert got["input_untouched"] == [1.0 * (r + 1), 2.0 * (r + 1)] and got["inplace_returns_it"] is True
        assert got["grouped"] == [[3.0, 6.0], [6.0, 12.0]]
        assert got["grad"] == [6.0]  # d/dg of the sum over ranks of 3g, reduced again by Sum: 3 * 2
        assert got["allgather"] == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert got["allgather_scalar"] == [10, 11]
        assert "every dimension but the first" in got["allgather_mismatch"]
        assert got["broadcast"] == [1.0] * 3 and got["broadcast_input"] == [float(r)] * 3
        assert got["broadcast_inplace"] == [1.0] * 3
        assert got["object"] == {"from": 1} and got["objects"] == [{"rank": 0}, {"rank": 1}]
        assert got["lambda"] == 11 and got["closures"] == [2, 3]
        assert got["homogeneous"] is True
        assert got["unserialisable"].startswith("broadcast_object: an object could not be serialised (rank 1: ")
        assert got["after_unserialisable"] == [2.0]  # the job goes on
        assert "not a rank of this job" in got["bad_root"]
        assert got["join"] in (0, 1) and got["after_shutdown"] is False
    assert ranks[0]["join"] == ranks[1]["join"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_horovod_script_as_a_pytorchjob_trains_the_same_model_as_ddp(tmp_path):
    write(tmp_path / "common.py", COMMON)
    hvd_script = write(tmp_path / "train_hvd.py", HOROVOD_TRAIN)
    ddp_script = write(tmp_path / "train_ddp.py", DDP_TRAIN)

    # The Horovod script as a 2-replica PyTorchJob (Master + 1 Worker, torchrun in each), run by
    # the local backend with the operator's environment; the manifest itself passes preflight.
    command = horovod_command(str(hvd_script), [str(tmp_path)])
    spec = JobSpec(name="hvd-digits", image="kftrain:dev", command=command, replicas=2, env=dict(QUIET))
    validate_pytorchjob(pytorchjob_manifest(spec))
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))

    (tmp_path / "ddp").mkdir()
    launch([sys.executable, str(ddp_script), str(tmp_path / "ddp")], 2, tmp_path / "ddp", timeout=150)

    results = [json.loads((tmp_path / f"hvd-rank{r}.json").read_text()) for r in range(2)]
    # torchrun in each one-process replica: two nodes of one process each.
    assert [res["topology"] for res in results] == [[0, 2, 0, 1, 0, 2], [1, 2, 0, 1, 1, 2]]
    losses = [{k: v for k, v in res.items() if k.startswith("loss-")} for res in results]
    assert len(losses[0]) == 3 and losses[0] == losses[1]  # the allreduced loss is the same everywhere

    def load(name: str) -> dict:
        return torch.load(name, weights_only=True)

    start, _ = _warm_start_here(tmp_path)
    for passes, compression, tol in ((1, "none", 1e-5), (2, "none", 1e-5), (1, "fp16", 2e-3)):
        hvd0, hvd1 = (load(tmp_path / f"hvd-{passes}-{compression}-rank{r}.pt") for r in range(2))
        ddp0 = load(tmp_path / "ddp" / f"ddp-{passes}-rank0.pt")
        for k in ddp0:
            torch.testing.assert_close(hvd0[k], hvd1[k], rtol=0, atol=0)  # the ranks agree exactly
            torch.testing.assert_close(hvd0[k], ddp0[k], rtol=tol, atol=tol, msg=f"{passes}-{compression} {k}")
        moved = max(float((ddp0[k] - start[k]).abs().max()) for k in ddp0)
        assert moved > 20 * tol, "training barely moved the weights: the comparison would prove nothing"


@pytest.mark.timeout(60)
def test_a_script_that_does_not_compile_is_shown_as_python_shows_it_where_runpy_is_not_frozen(tmp_path):
    """Python 3.10 (or `-X frozen_modules=off`) names runpy's frames by its file (was: kept, a
    traceback through the runner above the script's syntax error)."""
    script = tmp_path / "train.py"
    script.write_text('import os\nprint("hi"\n')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rc, out = run_group(
        [sys.executable, "-X", "frozen_modules=off", "-m", "trainer.horovod.run", str(script)], timeout=50, env=env
    )
    assert rc == 1 and out.splitlines() == [
        f'  File "{script}", line 2',
        '    print("hi"',
        "         ^",
        "SyntaxError: '(' was never closed",
    ], out
