"""Two runs meeting: on one checkpoint prefix in a real S3 server (conditional writes), through
the CLI before any step starts, and in one `--output-dir`, whose summaries stay each run's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from pipelines.cli import GATE_FAILED
from tests.conftest import run_group
from tests.pipeline_demo import PLAN_DEMO_CONFIG, check_plan_demo_run
from trainer.checkpoint import CheckpointError, CheckpointManager, claim_prefix, current_owner
from trainer.storage import S3Store

KFTRAIN = [sys.executable, "-m", "pipelines.cli"]
REPO = Path(__file__).resolve().parents[2]


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def save(ckpt: CheckpointManager, step: int) -> None:
    ckpt.save(step, {"model": {"w": torch.full((4,), float(step))}}, blocking=True)


@pytest.mark.parametrize("kind", ["new", "same bytes (a retried attempt)", "other bytes"])
def test_create_only_writes_are_conditional_puts_on_s3(bucket, kind):
    store, uri = S3Store(), f"s3://{bucket}/p/owner.json"
    if kind != "new":
        assert store.put_bytes_if_absent(uri, b"first")
    data = b"other" if kind == "other bytes" else b"first"
    assert store.put_bytes_if_absent(uri, data) is (kind != "other bytes")
    assert store.get_bytes(uri) == b"first"


def test_two_runs_on_one_s3_prefix_the_second_refuses_and_the_first_loses_nothing(bucket):
    store, prefix = S3Store(), f"s3://{bucket}/shared/checkpoints"
    a = CheckpointManager(store, prefix, 2, owner="run-a")
    a.claim(resume=False)
    for step in (1, 2, 3):
        save(a, step)
    with pytest.raises(CheckpointError, match="belongs to run 'run-a'"):
        CheckpointManager(store, prefix, 2, owner="run-b").claim(resume=False)
    save(a, 4)  # the first run goes on undisturbed
    assert a.committed_steps() == [3, 4]
    record = a.latest()
    state = {"model": {"w": torch.zeros(4)}}
    CheckpointManager(store, prefix, 2, owner="reader").load(record, state)
    torch.testing.assert_close(state["model"]["w"], torch.full((4,), 4.0))
    assert current_owner(store, prefix)["owner"] == "run-a"


def test_the_cli_refuses_a_prefix_another_run_owns_before_any_step_starts(tmp_path):
    prefix = str(tmp_path / "shared-ckpt")
    from trainer.storage import LocalStore

    claim_prefix(LocalStore(), prefix, "earlier-run", resume=False)
    config = tmp_path / "c.yaml"
    config.write_text(f"checkpoint:\n  uri: {prefix}\n  resume: false\n")
    args = ["--config", str(config), "--output-dir", "out", "--run-id", "later-run"]
    rc, out = run_group([*KFTRAIN, "run", "--local", *args], timeout=120, env=cli_env(), cwd=str(tmp_path))
    assert rc == 2, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"kftrain: error: checkpoint prefix {prefix} belongs to run 'earlier-run' (claimed ")
    assert last.endswith("set checkpoint.resume: true to continue from them")
    assert not (tmp_path / "out").exists()  # refused before any step ran


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_run_in_one_output_dir_that_fails_the_gate_reports_its_own_failure(tmp_path):
    """Also the quality gate's own test (the second run): it stops export and says why, in the summary,
    the terminal, the quality-gate-failed step's log and the report. The first run is the demo on a
    local directory under Kubeflow Trainer's (v2) environment contract, with the plan step on, and
    gets all of that demo's checks (tests/pipeline_demo.py; the v1 contract's run is the demo on
    an S3 store in tests/integration/test_pipeline_local.py)."""
    first_config, config = tmp_path / "plan-trainjob.yaml", tmp_path / "quick.yaml"
    first_config.write_text(PLAN_DEMO_CONFIG.format(kind="trainjob"))
    config.write_text("train:\n  epochs: 1\n")
    first_args = ["--config", str(first_config), "--output-dir", "out", "--summary", "first.json"]
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", *first_args, "--min-accuracy", "0.5"],
        timeout=280,
        env=cli_env(),
        cwd=str(tmp_path),
    )
    assert rc == 0, out[-5000:]
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["exported"] is True
    check_plan_demo_run(tmp_path / "out", first, out, first_node="node-0-0")

    common = ["--config", str(config), "--output-dir", "out"]
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", *common, "--summary", "second.json", "--min-accuracy", "0.999"],
        timeout=280,
        env=cli_env(),
        cwd=str(tmp_path),
    )
    assert rc == GATE_FAILED, out[-5000:]  # finished, and said so, but a script must not deploy it
    lines = out.strip().splitlines()
    assert lines[-1].startswith("full log: ")  # then the summary file, then the gate's verdict
    assert lines[-2] == "summary written to second.json"
    assert lines[-3].startswith("Quality gate FAILED: the model was not exported (")
    assert "is below the minimum 0.9990 (min_accuracy)" in lines[-3]
    second = json.loads((tmp_path / "second.json").read_text())
    assert second["exported"] is False and "exported" not in second["artifacts"]
    # Without the plan step the summary names exactly the other steps' artifacts (with it, and
    # exported: tests/integration/test_pipeline_local.py's demo on an S3 store).
    assert set(second["artifacts"]) == {"dataset", "model", "metrics", "report"}
    assert "is below the minimum 0.9990" in second["quality_gate"]
    # Each summary's artifacts are its own run's.
    assert second["artifacts"]["model"] != first["artifacts"]["model"]
    assert second["run_id"] != first["run_id"]
    # The gate says why, in the quality-gate-failed step's own log and in the report.
    assert "Model not exported" in Path(lines[-1].removeprefix("full log: ")).read_text()
    assert "Quality gate: failed" in Path(second["artifacts"]["report"]).read_text()


def test_the_logs_killed_starts_left_behind_reach_the_run_folder_at_its_next_start(bucket, tmp_path, monkeypatch):
    """A store run's log waits in the temporary folder until its start uploads it: a start killed
    outright never does (was: left there unnamed). The run's next start uploads each, under the
    start time it began at; another run's, and files of other names, stay."""
    import tempfile

    from pipelines.local_run import keep_left_logs, logs_left_by_others, run_log
    from trainer.config import load_config

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cfg = load_config(overrides={"store.uri": f"s3://{bucket}/root"})
    uri, path = run_log(cfg, "run-a")
    path.write_text("the killed start's lines\n")
    kept = {run_log(cfg, "run-a-2")[1]: "another run's\n"}  # each stays where it is
    kept[run_log(load_config(overrides={"store.uri": f"s3://{bucket}/other"}), "run-a")[1]] = "another store's\n"
    kept[tmp_path / "kftrain-run-a-notes.log"] = "not a log of a start\n"
    for other, text in kept.items():
        other.write_text(text)
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = x\n")
    link = path.with_name(path.name.replace(path.name[-12:-4], "0" * 8))  # a link planted under a log's name
    link.symlink_to(secret)
    assert keep_left_logs(cfg, "run-a") == [uri]
    assert uri.startswith(f"s3://{bucket}/root/runs/run-a/log-")
    assert S3Store().get_bytes(uri) == b"the killed start's lines\n"
    assert sorted(S3Store().list(f"s3://{bucket}/root/runs/run-a/")) == [uri]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*(p.name for p in kept), "credentials", link.name])
    assert keep_left_logs(load_config(overrides={"store.uri": str(tmp_path / "local")}), "run-a-2") == []
    if os.getuid() == 0:  # another user's killed start (was: passed over in silence): named, left for them
        _, theirs = run_log(cfg, "run-a")
        theirs.write_text("their lines\n")
        os.chown(theirs, 65534, 65534)
        assert keep_left_logs(cfg, "run-a") == [] and logs_left_by_others(cfg, "run-a") == [theirs]
        assert theirs.read_text() == "their lines\n"
