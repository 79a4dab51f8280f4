"""Resume across runs with real processes and a real S3 server: a 2-replica run cut short is
continued by a new run (`checkpoint.resume_from`) bitwise equal to an uninterrupted one, and
`kftrain runs` lists the runs of an S3 store."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch

from pipelines.cli import main as cli
from tests.integration.test_checkpoint import reference_run
from tests.unit.test_checkpoint import save
from trainer.checkpoint import CheckpointManager
from trainer.config import ConfigError, load_config
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.runs import list_runs, resolve_resume_from
from trainer.storage import LocalStore, join_uri, open_store

STEPS_PER_EPOCH = 19  # digits: 1,259 train rows // global batch 64


def final_weights(model_uri: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(LocalStore().get_bytes(join_uri(model_uri, "model.safetensors")))


@pytest.mark.timeout(300)
def test_two_replicas_cut_short_are_continued_by_a_new_run_bitwise(shared, tmp_path):
    # The reference: test_checkpoint.py's uninterrupted DDP run, built once per session, whose
    # config differs from these only in where and how often it checkpoints.
    digits, ref_uri = reference_run(shared, {})

    def job(name: str, **overrides) -> list[str]:
        cfg = load_config(
            overrides={
                "model.dropout": 0.1,
                "train.epochs": 3,
                "train.deterministic": True,
                "train.log_interval_steps": 1000,
                "checkpoint.interval_steps": 5,
                "store.uri": str(tmp_path),
                "checkpoint.uri": str(tmp_path / "runs" / name / "checkpoints"),
                **overrides,
            }
        )
        lines: list[str] = []
        spec = training_job(cfg, name, digits, str(tmp_path / name / "model"))
        run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))
        return lines

    job("old", **{"train.max_steps": 25})
    lines = job("new", **{"checkpoint.resume_from": "old"})  # by run id, under store.uri
    new = str(tmp_path / "new" / "model")

    resumed = {m.group(1) for line in lines if (m := re.search(r"resumed at step 25 .* from (\S+)", line))}
    assert resumed == {join_uri(str(tmp_path / "runs" / "old" / "checkpoints"), "step-00000025")}
    # The same run but for where and how often it checkpoints (and where it resumed from).
    configs = [json.loads(LocalStore().get_bytes(join_uri(uri, "training.json")))["config"] for uri in (ref_uri, new)]
    ref_cfg, new_cfg = ({k: v for k, v in c.items() if k not in ("checkpoint", "store")} for c in configs)
    assert ref_cfg == new_cfg
    ref, got = final_weights(ref_uri), final_weights(new)
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.equal(ref[name], got[name]), name  # bitwise
    runs = {r.name: r for r in list_runs(LocalStore(), str(tmp_path))}
    assert (runs["old"].state, runs["old"].last_step) == ("partial", 25)
    assert runs["new"].last_step == 3 * STEPS_PER_EPOCH

    # Continuing the finished run with its own train.epochs trains nothing, and says so (was: silent).
    lines = job("again", **{"checkpoint.resume_from": "new"})
    said = [line for line in lines if "nothing is left to train" in line]
    assert len(said) == 1 and f"its step {3 * STEPS_PER_EPOCH} is where train.epochs 3 ends" in said[0], said


def test_runs_on_an_s3_store(bucket, capsys):
    root = f"s3://{bucket}/store"
    store = open_store(root)
    local_run = join_uri(root, "runs", "20261201-101500-abc123", "checkpoints")
    mgr = CheckpointManager(store, local_run, keep_last=3, owner="20261201-101500-abc123")
    for step in (3, 6):
        save(mgr, step)
    mgr.close()
    model = join_uri(root, "kfp-run-1", "train-42", "model")
    mgr = CheckpointManager(store, join_uri(model, "checkpoints"), owner="kfp-run-1/train")
    save(mgr, 9, blocking=True)
    mgr.close()
    store.put_bytes(join_uri(model, "training.json"), json.dumps({"metrics": {"steps": 9}}).encode())
    store.put_bytes(join_uri(root, "runs-other", "x.txt"), b"not a run")  # a sibling folder, not runs/

    assert cli(["runs", "--store", root, "--json"]) == 0
    listed = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert {name: (r["state"], r["last_step"]) for name, r in listed.items()} == {
        "20261201-101500-abc123": ("partial", 6),
        "kfp-run-1/train-42": ("finished", 9),
    }
    assert listed["20261201-101500-abc123"]["checkpoint"] == join_uri(local_run, "step-00000006")
    assert cli(["runs", "--store", root]) == 0
    assert re.search(r"^kfp-run-1/train-42 +finished +9 +\d{4}-\d\d-\d\d ", capsys.readouterr().out, re.M)

    for value, step in (("20261201-101500-abc123", 6), ("kfp-run-1/train", 9), (model, 9)):
        cfg = load_config(overrides={"store.uri": root, "checkpoint.resume_from": value})
        folder, record = resolve_resume_from(cfg, root)
        assert record["step"] == step and folder.endswith(f"step-{step:08d}")
    cfg = load_config(overrides={"store.uri": root, "checkpoint.resume_from": "kfp-run-2"})
    with pytest.raises(ConfigError, match=r"no committed checkpoint for run kfp-run-2 under s3://"):
        resolve_resume_from(cfg, root)


def test_a_finished_run_prints_its_summary_though_what_it_resumed_from_is_gone(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "report").mkdir()
    artifacts = {"model": "/m", "report": str(tmp_path / "report")}
    summary = {"artifacts": artifacts, "metrics": {"acc": 0.9}, "exported": True, "quality_gate": "ok"}
    record = tmp_path / "kftrain-outputs" / "runs" / "r1" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"status": "finished", "summary": summary}))
    (tmp_path / "c.yaml").write_text("checkpoint:\n  resume_from: /gone/run/checkpoints/step-00000005\n")
    assert main(["run", "--local", "--config", "c.yaml", "--run-id", "r1"]) == 0
    out = capsys.readouterr().out
    assert "run r1 had already finished; nothing to do" in out
    # An artifact deleted since is said (was: listed as if it were there).
    assert "  model     /m  (deleted since: start a new run to make it again)" in out
    assert f"  report    {tmp_path / 'report'}\n" in out
