"""The checks of a demo run with the plan step on, shared by the tests that make such a run
(tests/integration/test_pipeline_local.py's demo on an S3 store for the Training Operator's
contract, tests/integration/test_run_ownership.py's first run, on a local directory, for Kubeflow
Trainer's), so each contract costs one pipeline run, not one more. The checks read through the
run's store, so they hold for a local directory and for S3 alike, the plan's own files included
(KFP outputs on a local directory; `plan.md` and `plan.html` in the store when one is set)."""

from __future__ import annotations

import json
import re

from trainer.storage import open_store

#: The plan step on, with a scaling table over three node counts; `{kind}` is the job's kind.
PLAN_CONFIG = "job:\n  kind: {kind}\nplan:\n  enabled: true\n  nodes: [1, 2, 4]\n"
#: A quick demo config (one epoch) with the plan step on; `{kind}` is the job's kind.
PLAN_DEMO_CONFIG = "train:\n  epochs: 1\n" + PLAN_CONFIG


def full_log(out: str) -> str:
    """Where the CLI said the run's full log is (`full log: PATH` or `see full log: PATH`)."""
    [line] = [line for line in out.splitlines() if "full log: " in line]
    return line.split("full log: ", 1)[1]


def check_plan_demo_run(output: str, summary: dict, out: str, first_node: str) -> None:
    """A run of a PLAN_CONFIG config into `output` (a local directory or a store URI; its summary,
    its terminal output) that passed the gate: its artifacts, its plan between data prep and
    training, the report's predicted vs measured section, a calm terminal, the full log beside the
    run record; the first replica's lines carry `first_node`, the job kind's name for it."""
    output = str(output).rstrip("/")
    store = open_store(output)
    for name, uri in summary["artifacts"].items():
        assert uri.startswith(output + "/"), (name, uri, output)
    check_plan_files(output, summary)  # among the run's artifacts when enabled
    assert summary["exported"] is True
    assert store.exists(summary["artifacts"]["exported"] + "/model_card.json")
    assert "Quality gate passed" in out
    assert f"[{first_node}] " in out
    # The plan step ran between data prep and training, from the prepared dataset's manifest.
    starts = [line.split()[1] for line in out.splitlines() if line.endswith(" started")]
    assert starts.index("plan") == starts.index("data-prep") + 1 == starts.index("train") - 1, starts
    record = json.loads(store.get_bytes(summary["artifacts"]["model"] + "/training.json"))
    assert record["metrics"]["peak_memory_bytes"] > 0 and record["metrics"]["median_step_seconds"] > 0
    report = store.get_bytes(summary["artifacts"]["report"]).decode()
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
    log = full_log(out)
    assert log.rsplit("/", 1)[0] == f"{output}/runs/{summary['run_id']}", log
    text = store.get_bytes(log).decode()
    assert "Got executor_input" in text and f"[{first_node}] " in text


def check_plan_files(output: str, summary: dict) -> None:
    """The plan's own files of a run of a PLAN_CONFIG config into `output` (a local directory or a
    store URI): the plan as Markdown (a summary artifact under `output`) and as an HTML page
    (beside it: KFP's `page` output on a local directory, `plan.html` with a store set)."""
    output = str(output).rstrip("/")
    uri = summary["artifacts"]["plan"]
    assert uri.startswith(output + "/"), (uri, output)
    store = open_store(uri)
    text = store.get_bytes(uri).decode()
    assert text.startswith("# Training plan") and "model built from the prepared dataset's manifest" in text
    assert "| 4 |" in text  # the scaling table's rows of plan.nodes
    page = uri.removesuffix(".md") + ".html" if uri.endswith("/plan.md") else uri.rsplit("/", 1)[0] + "/page"
    assert "<table>" in store.get_bytes(page).decode()
