"""The `pytorchjob` component end to end through kfp.local: a user's own script that uses only
torch.distributed (no kftrain import) trains on 2 local replicas and writes its model to the
output artifact's URI. kfp.local runs in a subprocess of its own process group, so a hang is
killed whole."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import run_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
REPO = Path(__file__).resolve().parents[2]

# What a user writes: the Training Operator's environment, the artifact URIs, nothing else.
USER_SCRIPT = """\
import json
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if os.environ.get("FAIL_RANK") == str(rank):
    print(f"rank {rank}: cannot open the input shard", flush=True)
    sys.exit(3)
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
world = dist.get_world_size()
print(f"rank {rank} of {world} joined", flush=True)
with open(os.path.join(os.environ["KFTRAIN_INPUT_URI"], "data.json")) as f:
    data = json.load(f)
x = torch.tensor(data["x"])[rank::world]
y = torch.tensor(data["y"])[rank::world]
torch.manual_seed(0)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(os.environ["STEPS"])):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(gathered, weights)
assert all(torch.equal(g, weights) for g in gathered), "replicas diverged"
if rank == 0:
    out = os.environ["KFTRAIN_OUTPUT_URI"]
    os.makedirs(out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out, "model.pt"))
    print(f"rank 0 wrote {out}/model.pt", flush=True)
# Leave together: a gloo rank that tears its group down while a peer is still in it can abort.
dist.barrier()
dist.destroy_process_group()
"""

# The same training written for Horovod: it runs unchanged through kftrain's shim.
HOROVOD_SCRIPT = """\
import json
import os

import horovod.torch as hvd
import torch

hvd.init()
rank, world = hvd.rank(), hvd.size()
print(f"hvd rank {rank} of {world} joined", flush=True)
with open(os.path.join(os.environ["KFTRAIN_INPUT_URI"], "data.json")) as f:
    data = json.load(f)
x = torch.tensor(data["x"])[rank::world]
y = torch.tensor(data["y"])[rank::world]
torch.manual_seed(rank)  # different starting weights: broadcast_parameters must align them
model = torch.nn.Linear(x.shape[1], 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
for step in range(int(os.environ["STEPS"])):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
    loss.backward()
    opt.step()
    mean = hvd.allreduce(loss.detach(), op=hvd.Average)
    print(f"hvd rank {rank} step {step} mean loss {mean.item():.4f}", flush=True)
if rank == 0:
    out = os.environ["KFTRAIN_OUTPUT_URI"]
    os.makedirs(out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out, "model.pt"))
"""

# The user's pipeline: a data step, then their script as a PyTorchJob.
DRIVER = """\
import sys
import warnings

from kfp import dsl, local
from kfp.dsl import Dataset, Model, Output

from components.pytorchjob import pytorchjob
from components.task_options import launcher_task_options

script, root, fail_rank, *runner = sys.argv[1:]
# A Horovod script starts through the shim's runner module; a plain one directly.
prefix = ["python", "-m", runner[0]] if runner else ["python"]


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def make_data(data: Output[Dataset]) -> None:
    import json
    import os
    import random

    rng = random.Random(0)
    x = [[rng.uniform(-1, 1) for _ in range(4)] for _ in range(64)]
    y = [2 * a - b + 0.5 * c for a, b, c, _ in x]
    os.makedirs(data.path, exist_ok=True)
    with open(os.path.join(data.path, "data.json"), "w") as f:
        json.dump({"x": x, "y": y}, f)


@dsl.pipeline(name="byo-demo")
def byo_demo(script: str, fail_rank: str) -> Model:
    data = make_data()
    job = pytorchjob(
        image="registry.example/team/train:1",
        command=[*prefix, script],
        input_data=data.outputs["data"],
        replicas=2,
        env={"STEPS": 5, "FAIL_RANK": fail_rank},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        timeout_seconds=180,
        launcher="local",
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        dag_execution_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    )
    launcher_task_options(job)
    return job.outputs["model"]


warnings.filterwarnings("ignore")
local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
model = byo_demo(script=script, fail_rank=fail_rank).output
print("MODEL_URI", model.uri, "JOB", model.metadata["job_name"])
"""


def run_pipeline(tmp_path: Path, fail_rank: str, script: str = USER_SCRIPT, runner: str = "") -> tuple[int, str]:
    (tmp_path / "train.py").write_text(script)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "train.py"), str(tmp_path / "root"), fail_rank]
    return run_group([*cmd, *([runner] if runner else [])], timeout=300, env=env, cwd=str(tmp_path))


def test_a_user_script_trains_on_two_replicas_and_writes_the_output_artifact(tmp_path):
    rc, out = run_pipeline(tmp_path, fail_rank="")
    assert rc == 0, out[-6000:]
    uri = next(line.split()[1] for line in out.splitlines() if line.startswith("MODEL_URI"))
    assert uri.startswith(str(tmp_path / "root")) and uri.endswith("/model")

    import torch

    state = torch.load(Path(uri) / "model.pt")
    assert set(state) == {"weight", "bias"} and state["weight"].shape == (1, 4)
    # Both replicas ran, and their lines reached the step log with their replica prefix.
    assert "[master-0] rank 0 of 2 joined" in out and "[worker-0] rank 1 of 2 joined" in out
    assert "[master-0] rank 0 step 4 loss" in out and "[worker-0] rank 1 step 4 loss" in out
    losses = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "[master-0] rank 0 step" in line]
    assert losses[-1] < losses[0]
    assert " JOB kftrain-" in out  # the job's name, from the task identity, recorded on the artifact


def test_a_failing_replica_fails_the_step_with_its_last_lines(tmp_path):
    rc, out = run_pipeline(tmp_path, fail_rank="1")
    assert rc != 0
    assert "replica worker-0 exited with code 3. Its last log lines:" in out
    assert "[worker-0] rank 1: cannot open the input shard" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # kfp.local colours its status lines
    assert "trainer.launch.backend.JobFailed: job kftrain-" in plain  # the step's own error
    assert "finished with status FAILURE. Inner task failed: 'pytorchjob'" in plain
    assert not list((tmp_path / "root").rglob("model.pt"))  # the Master was stopped, not left training


def test_a_script_that_writes_no_output_fails_its_step_saying_where_it_should_have(tmp_path):
    """Was: the step succeeded, its `model` an empty folder, and the next step failed with a bare
    FileNotFoundError."""
    silent = "import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
    rc, out = run_pipeline(tmp_path, fail_rank="", script=silent)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert rc != 0 and "finished with status FAILURE. Inner task failed: 'pytorchjob'" in plain, out[-4000:]
    assert "succeeded, but nothing is at" in plain and "(KFTRAIN_OUTPUT_URI), where rank 0 is to write" in plain


def test_a_horovod_script_runs_unchanged_as_a_pytorchjob_step(tmp_path):
    rc, out = run_pipeline(tmp_path, fail_rank="", script=HOROVOD_SCRIPT, runner="trainer.horovod.run")
    assert rc == 0, out[-6000:]
    assert "[master-0] hvd rank 0 of 2 joined" in out and "[worker-0] hvd rank 1 of 2 joined" in out
    means = {
        line.split("]", 1)[0]: line.rsplit(" ", 1)[1]
        for line in out.splitlines()
        if "hvd rank" in line and "step 4 mean loss" in line
    }
    assert len(means) == 2 and len(set(means.values())) == 1, (means, out[-4000:])  # allreduced: the same on both ranks
    uri = next(line.split()[1] for line in out.splitlines() if line.startswith("MODEL_URI"))
    assert (Path(uri) / "model.pt").is_file()
