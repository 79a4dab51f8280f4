"""The local backend emulating Kubeflow Trainer v2 (`job.kind: trainjob`): real processes with only
the `PET_*` variables the v2.3.0 torch plugin injects, and the demo trains to the same model as
under the Training Operator's v1 contract."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace

import pytest
import torch

from tests.jobs import TWO_RANKS, shared_digits, two_rank_run
from tests.jobs import code_job as local_job
from trainer.config import load_config
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.launch.spec import JobSpec
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri

pytestmark = pytest.mark.timeout(180)
KEYS = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE"]
KEYS += ["PET_MASTER_ADDR", "PET_MASTER_PORT", "PYTHONUNBUFFERED"]


def job(name: str, code: str, replicas: int, nproc: int = 1, kind: str = "trainjob") -> JobSpec:
    return local_job(name, code, replicas, nproc, kind)


def test_nodes_see_only_the_v2_variables(monkeypatch):
    # The launcher's own environment may carry v1 names (it may itself run in a PyTorchJob pod):
    # a v2 node must not inherit them, or a script relying on them would pass here and fail there.
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "9")
    monkeypatch.setenv("MASTER_ADDR", "elsewhere")
    lines: list[str] = []
    code = f"import json, os; print('ENV', json.dumps({{k: os.environ.get(k) for k in {KEYS!r}}}))"
    run_job(LocalBackend(sink=lines.append), replace(job("env-v2", code, replicas=3, nproc=2), timeout_s=60))
    seen = {}
    for line in lines:
        prefix, _, rest = line.partition(" ")
        if rest.startswith("ENV "):
            seen[prefix] = json.loads(rest[4:])
    assert set(seen) == {"[node-0-0]", "[node-0-1]", "[node-0-2]"}
    assert len({env["PET_MASTER_PORT"] for env in seen.values()}) == 1
    for rank in range(3):
        env = seen[f"[node-0-{rank}]"]
        assert env["PET_NODE_RANK"] == str(rank)
        assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"], env["PET_MASTER_ADDR"]) == ("3", "2", "127.0.0.1")
        assert env["MASTER_ADDR"] is env["MASTER_PORT"] is env["RANK"] is env["WORLD_SIZE"] is None
        assert env["PYTHONUNBUFFERED"] == "1"  # kftrain sets it in spec.trainer.env too


def test_torchrun_forms_the_job_from_pet_variables_alone(tmp_path):
    """2 nodes x 2 processes under torchrun with only PET_*: four ranks that all-reduce."""
    script = tmp_path / "allreduce.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, torch, torch.distributed as dist
            dist.init_process_group("gloo")
            t = torch.tensor([1.0])
            dist.all_reduce(t)
            sys.stdout.write(f"RANK {os.environ['RANK']} {os.environ['WORLD_SIZE']} {int(t.item())}\\n")
            dist.barrier()  # leave together: a rank tearing the group down can abort a peer still in it
            dist.destroy_process_group()
            """
        )
    )
    spec = JobSpec(
        name="torchrun-v2",
        image="local",
        command=("python", "-m", "torch.distributed.run", str(script)),
        replicas=2,
        nproc_per_node=2,
        kind="trainjob",
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=120))
    ranks = sorted(m.group(1, 2, 3) for line in lines if (m := re.search(r"RANK (\d) (\d) (\d)", line)))
    assert ranks == [("0", "4", "4"), ("1", "4", "4"), ("2", "4", "4"), ("3", "4", "4")]


@pytest.mark.parametrize(("kind", "fails"), [("trainjob", True), ("pytorchjob", False)])
def test_a_trainjob_succeeds_only_when_every_node_does(kind, fails):
    """JobSet's default success policy waits for every node; the operator's PyTorchJob is done
    when its Master is (and stops the stragglers)."""
    # Node 1 fails after its peer has succeeded: 1.5 s later for the TrainJob, whose outcome does
    # not depend on the order; for the PyTorchJob long after the Master's success ended the job
    # (its replicas may start seconds apart on a loaded machine), which stops it.
    code = f"""
        import os, sys, time
        rank = int(os.environ["PET_NODE_RANK"])
        if rank == 1:
            time.sleep({1.5 if fails else 60})
            sys.exit(3)
    """
    backend = LocalBackend(sink=lambda line: None, grace_s=5.0)
    spec = job(f"success-{kind}", code, replicas=2, kind=kind)
    if fails:
        with pytest.raises(JobFailed, match="replica node-0-1 exited with code 3"):
            run_job(backend, replace(spec, timeout_s=60))
    else:
        run_job(backend, replace(spec, timeout_s=60))


def test_the_demo_learns_the_same_model_under_the_v1_and_v2_contracts(shared, tmp_path):
    """Same config, same seed, 2 nodes: the kind changes only how the processes learn their ranks.
    The v1 run is tests/jobs.py's shared 2-rank PyTorchJob run."""
    runs = {"pytorchjob": two_rank_run(shared)}
    cfg = load_config(overrides={**TWO_RANKS, "job.kind": "trainjob"})
    uri, lines = str(tmp_path / "trainjob"), []
    digits = shared_digits(shared)
    run_job(LocalBackend(sink=lines.append), replace(training_job(cfg, "demo-trainjob", digits, uri), timeout_s=150))
    runs["trainjob"] = (uri, lines)
    models = {}
    for kind, (uri, lines) in runs.items():
        record = json.loads(LocalStore().get_bytes(join_uri(uri, "training.json")))
        assert record["metrics"]["world_size"] == 2
        assert record["config"]["job"]["kind"] == kind
        prefix = "[node-0-0]" if kind == "trainjob" else "[master-0]"
        assert any(line.startswith(f"{prefix} [rank 0]") for line in lines)
        models[kind] = load_model(LocalStore(), uri)[0]
    for p1, p2 in zip(models["pytorchjob"].parameters(), models["trainjob"].parameters(), strict=True):
        torch.testing.assert_close(p1, p2, rtol=0, atol=0)
