"""A local run's summary reads its own kfp.local run folder, never the newest one in the root."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipelines.local_run import PipelineFailed, _task_output, kfp_run_folder


def kfp_run(root: Path, name: str, *, exported: bool, reason: str, mtime: float) -> Path:
    """A kfp.local run folder as it leaves one: per task, its executor_output.json."""
    folder = root / name
    (folder / "train" / "model").mkdir(parents=True)
    (folder / "evaluate").mkdir()
    (folder / "evaluate" / "executor_output.json").write_text(json.dumps({"parameterValues": {"reason": reason}}))
    if exported:
        (folder / "export").mkdir()
        out = {"artifacts": {"exported": {"artifacts": [{"uri": str(folder / "export" / "exported")}]}}}
        (folder / "export" / "executor_output.json").write_text(json.dumps(out))
    for path in folder.rglob("*"):
        os.utime(path, (mtime, mtime))
    return folder


@pytest.mark.parametrize(
    ("this", "newer_other"),
    [
        # This run failed the gate; an earlier one passed but its files look newer (or are).
        ({"exported": False, "reason": "0.97 is below the minimum 0.999"}, {"exported": True, "reason": "passed"}),
        # This run passed; another run that failed left the newest files.
        ({"exported": True, "reason": "passed"}, {"exported": False, "reason": "0.5 is below the minimum 0.9"}),
    ],
)
def test_the_summary_reads_this_runs_folder_not_the_newest(tmp_path, this, newer_other):
    mine = kfp_run(tmp_path, "training-pipeline-2026-12-01-10-00-00-000001", mtime=1_000, **this)
    kfp_run(tmp_path, "training-pipeline-2026-12-01-09-00-00-000001", mtime=2_000, **newer_other)
    folder = kfp_run_folder(tmp_path, ["s3://elsewhere/dataset", str(mine / "train" / "model")])
    assert folder == mine.resolve()
    assert _task_output(folder, "evaluate", "reason", parameter=True) == this["reason"]
    exported = _task_output(folder, "export", "exported")
    assert (exported is not None) is this["exported"]


def test_with_every_output_in_a_store_the_private_root_must_hold_one_run(tmp_path):
    only = kfp_run(tmp_path, "training-pipeline-1", exported=False, reason="r", mtime=1_000)
    assert kfp_run_folder(tmp_path, ["s3://bucket/x/model"]) == only.resolve()
    kfp_run(tmp_path, "training-pipeline-2", exported=False, reason="r", mtime=1_000)
    with pytest.raises(PipelineFailed, match="holds 2 run folders"):
        kfp_run_folder(tmp_path, ["s3://bucket/x/model"])
