"""The checks of a demo run on a local directory with the plan step on, shared by the tests that
make such a run (tests/integration/test_pipeline_local.py for the Training Operator's contract,
tests/integration/test_run_ownership.py's first run for Kubeflow Trainer's), so each contract
costs one pipeline run, not one more."""

from __future__ import annotations

import json
import re
from pathlib import Path

#: A quick demo config with the plan step on; `{kind}` is the job's kind.
PLAN_DEMO_CONFIG = "train:\n  epochs: 1\njob:\n  kind: {kind}\nplan:\n  enabled: true\n  nodes: [1, 2, 4]\n"


def full_log(out: str) -> str:
    """Where the CLI said the run's full log is (`full log: PATH` or `see full log: PATH`)."""
    [line] = [line for line in out.splitlines() if "full log: " in line]
    return line.split("full log: ", 1)[1]


def check_plan_demo_run(output_dir: Path, summary: dict, out: str, first_node: str) -> None:
    """A run of PLAN_DEMO_CONFIG into `output_dir` (its summary, its terminal output) that passed
    the gate: its artifacts, its plan between data prep and training, the report's predicted vs
    measured section, a calm terminal, the full log beside the run record; the first replica's
    lines carry `first_node`, the job kind's name for it."""
    for uri in summary["artifacts"].values():
        assert uri.startswith(str(output_dir))
    assert summary["exported"] is True
    assert (Path(summary["artifacts"]["exported"]) / "model_card.json").is_file()
    assert "Quality gate passed" in out
    assert f"[{first_node}] " in out
    # The plan step ran between data prep and training, from the prepared dataset's manifest.
    starts = [line.split()[1] for line in out.splitlines() if line.endswith(" started")]
    assert starts.index("plan") == starts.index("data-prep") + 1 == starts.index("train") - 1, starts
    plan = Path(summary["artifacts"]["plan"]).read_text()  # among the run's artifacts when enabled
    assert plan.startswith("# Training plan") and "model built from the prepared dataset's manifest" in plan
    assert "| 4 |" in plan  # the scaling table's rows of plan.nodes
    assert "<table>" in next(output_dir.rglob("plan/page")).read_text()
    record = json.loads((Path(summary["artifacts"]["model"]) / "training.json").read_text())
    assert record["metrics"]["peak_memory_bytes"] > 0 and record["metrics"]["median_step_seconds"] > 0
    report = Path(summary["artifacts"]["report"]).read_text()
    section = report.split("<h2>Predicted vs measured</h2>", 1)[1].split("<h2>", 1)[0]
    # Memory, step time and ETA, each predicted against measured (on the CPU without a probe the
    # plan has no step time: those rows say n/a); the memory's error is there.
    assert section.count("<tr><td>") == 3 and section.count("%</td></tr>") >= 1, section
    assert "peak memory per rank (max over ranks)" in section
    # A calm terminal: a line per step start and end, the replicas' lines, the summary; kfp.local's
    # own output (the executor input: the whole config, per step) only in the full log.
    assert "executor_input" not in out and '"parameterValues"' not in out
    lines = out.splitlines()
    others = [line for line in lines if not re.match(r"  \[[a-z]+(-\d+)+\] ", line)]
    assert len(others) < 60, "\n".join(others)
    assert any(line.endswith(" train started") for line in lines)
    assert any(" train done in " in line for line in lines)
    assert lines[-1].startswith("full log: ")
    log = Path(full_log(out))
    assert log.parent == output_dir / "runs" / summary["run_id"]
    text = log.read_text()
    assert "Got executor_input" in text and f"[{first_node}] " in text
