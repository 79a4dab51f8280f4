"""`kftrain plan --probe` through the real command: the probe runs in job.world_size local processes
(torchrun on loopback, gloo), and the plan's time model starts from what they measured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import run_group
from trainer.config import Config
from trainer.launch.local import JOB_MARKER_ENV, marked_pids
from trainer.local_probe import probe_locally
from trainer.plan import make_plan

REPO = Path(__file__).resolve().parents[2]
KFTRAIN = [sys.executable, "-m", "pipelines.cli"]

pytestmark = pytest.mark.timeout(300)


def env_with(*paths: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *map(str, paths)])}


def test_the_probe_runs_every_rank_and_the_plan_scales_from_it(tmp_path):
    (tmp_path / "c.yaml").write_text("job:\n  replicas: 2\ntrain:\n  batch_size: 32\n  max_steps: 200\n")
    cmd = [*KFTRAIN, "plan", "--config", "c.yaml", "--probe", "--probe-steps", "3", "--json", "--nodes", "1,2"]
    rc, out = run_group(cmd, timeout=240, env=env_with(), cwd=str(tmp_path))
    assert rc == 0, out[-4000:]
    assert "kftrain: probing 3 steps on 2 process(es)" in out
    plan = json.loads(out[out.index("{") :])
    probe = plan["probe"]
    assert probe["world_size"] == 2 and probe["steps"] == 3 and probe["device"] == "cpu"
    assert probe["step_seconds"] > 0 and probe["peak_memory_bytes"] > 0
    assert any("probe" in line for line in plan["assumptions"]), plan["assumptions"]
    here = next(p for p in plan["scaling"] if p["nodes"] == 2)
    assert here["eta_seconds"] > 0  # 200 steps at the probed pace


def test_a_probe_that_cannot_run_fails_on_one_line_saying_why(tmp_path):
    """A custom task without synthetic_batch: every rank stops with the planner's reason, and
    `kftrain plan` ends with that one line (no rank's traceback)."""
    (tmp_path / "blind_task.py").write_text(
        "from trainer.tasks.classification import ClassificationTask\n\n\n"
        "class BlindTask(ClassificationTask):\n"
        "    def synthetic_batch(self, cfg, manifest, size):\n"
        "        return None\n"
    )
    (tmp_path / "c.yaml").write_text("task: blind_task:BlindTask\njob:\n  replicas: 2\n")
    cmd = [*KFTRAIN, "plan", "--config", "c.yaml", "--probe", "--probe-steps", "2"]
    rc, out = run_group(cmd, timeout=240, env=env_with(tmp_path), cwd=str(tmp_path))
    assert rc == 2, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: the probe failed: "), out[-4000:]
    assert "gives no synthetic_batch: the probe cannot run it" in last
    assert "Traceback" not in out


def test_a_probe_with_the_prepared_dataset_builds_the_model_from_its_manifest(tmp_path, digits):
    """`plan --probe --dataset URI`: the ranks build the model from the dataset's manifest, as
    the plan does (was: from the plan's guess; a custom task that reads the manifest failed with a
    KeyError in every rank, a classification table of another shape was probed as 64 x 10)."""
    (tmp_path / "needs_manifest.py").write_text(
        "from trainer.tasks.classification import ClassificationTask\n\n\n"
        "class NeedsManifest(ClassificationTask):\n"
        "    def build_model(self, cfg, manifest):\n"
        "        assert manifest['num_features'] == 64 and len(manifest['classes']) == 10, manifest\n"
        "        return super().build_model(cfg, manifest)\n"
    )
    (tmp_path / "c.yaml").write_text("task: needs_manifest:NeedsManifest\n")
    cmd = [*KFTRAIN, "plan", "--config", "c.yaml", "--probe", "--probe-steps", "2", "--dataset", digits, "--json"]
    rc, out = run_group(cmd, timeout=240, env=env_with(tmp_path), cwd=str(tmp_path))
    assert rc == 0, out[-4000:]
    assert json.loads(out[out.index("{") :])["probe"]["steps"] == 2


def probe_processes(tag: str) -> list[int]:
    """The processes of the probe the test started (agent and workers carry the probe's marker)."""
    return [pid for pid in marked_pids(tag, "TEST_TAG") if b"\0" + JOB_MARKER_ENV.encode() + b"=probe-" in environ(pid)]


def environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"\0" + f.read()
    except OSError:
        return b""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_stopping_kftrain_plan_mid_probe_stops_every_rank_of_it(tmp_path, sig):
    """torchrun starts its workers in sessions of their own: a Ctrl-C (the CLI cleans up) or a
    SIGKILL (its watchdog does) of `kftrain plan --probe` must leave none of them running, nor
    its temporary folder."""
    (tmp_path / "c.yaml").write_text("job:\n  replicas: 2\n")
    (tmp_path / "tmp").mkdir()
    tag = uuid.uuid4().hex
    from pipelines.cli import MAX_PROBE_STEPS

    # The most steps a probe takes: it is stopped while its ranks still start.
    cmd = [*KFTRAIN, "plan", "--config", "c.yaml", "--probe", "--probe-steps", str(MAX_PROBE_STEPS)]
    log = open(tmp_path / "plan.log", "wb")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env={**env_with(), "TEST_TAG": tag, "TMPDIR": str(tmp_path / "tmp")},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(probe_processes(tag)) < 3:  # torchrun's agent and both ranks are up
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "plan.log").read_text()[-3000:]
            time.sleep(0.1)
        os.kill(proc.pid, sig)  # the CLI alone, as a terminal's Ctrl-C or the OOM killer would
        proc.wait(timeout=60)
        deadline = time.monotonic() + 20
        while left := marked_pids(tag, "TEST_TAG"):  # the watchdog is tagged too: it ends when done
            assert time.monotonic() < deadline, f"still running 20s after the CLI ended: {left}"
            time.sleep(0.1)
        assert not list((tmp_path / "tmp").iterdir()), f"{sig.name} left temporary files behind"
        if sig == signal.SIGINT:
            assert proc.returncode != 0 and "Traceback" not in (tmp_path / "plan.log").read_text()
    finally:
        for pid in marked_pids(tag, "TEST_TAG"):  # leave the machine clean before failing
            os.kill(pid, signal.SIGKILL)


def tiny_gpt(strategy: str, world: int) -> Config:
    cfg = Config(task="causal_lm")
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = 2, 64, 4, 64
    cfg.train.batch_size, cfg.train.max_steps, cfg.train.strategy = 8, 50, strategy
    cfg.job.replicas, cfg.job.nproc_per_node = 1, world  # all on this machine
    return cfg


@pytest.mark.slow
def test_the_two_rank_probe_s_peak_memory_is_within_a_loose_factor_of_the_plans_prediction():
    """The probe on 2 gloo ranks (twice in the same processes) against the plan's prediction from
    the shapes and a 1-rank probe: peak memory per rank within a factor of 3. Step time is not
    bounded here: on a shared 2-core machine a 30 ms step moves by more than any factor a test
    could hold, so bench/plan_accuracy.py measures the time model's error instead."""
    (base,) = probe_locally(tiny_gpt("ddp", 1), steps=3, timeout_s=240)
    assert base.world_size == 1 and base.comm_seconds == 0 and base.compute_seconds > 0
    for strategy in ("ddp", "fsdp"):
        cfg = tiny_gpt(strategy, 2)
        plan = make_plan(cfg, probe=base, nodes=(1,))
        assert plan.point(1).step_seconds > 0
        repeats = probe_locally(cfg, steps=3, timeout_s=240, repeats=2)
        assert len(repeats) == 2
        for measured in repeats:
            assert measured.world_size == 2 and measured.micro_batch == 4
            assert plan.memory.tensors / 3 < measured.peak_memory_bytes < plan.memory.tensors * 3, strategy
            assert measured.step_seconds >= measured.compute_seconds > 0 and measured.comm_seconds >= 0
