"""The KFP edge end to end through kfp.local, in real processes: the compiled pipeline YAML run with
only `config` trains exactly that config, and the standalone component YAMLs work in someone else's
pipeline (two training tasks in one DAG get their own job and their own model folder)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_group
from trainer.storage import open_store

REPO = Path(__file__).resolve().parents[2]
QUICK = {"job": {"replicas": 1}, "train": {"epochs": 2, "batch_size": 32}}


def run_kfp_local(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> dict:
    """Run `body` (a user's script around kfp.local) in its own process group, with a timeout;
    it prints one JSON line starting with RESULT."""
    script = tmp_path / "user_pipeline.py"
    script.write_text(
        "import json, sys\nfrom kfp import components, dsl, local\n"
        f"REPO = {str(REPO)!r}\n"
        f"local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root={str(tmp_path / 'root')!r})\n"
        + textwrap.dedent(body)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    rc, out = run_group([sys.executable, str(script)], timeout=300, env=env, cwd=str(tmp_path))
    assert rc == 0, out[-6000:]
    (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
    return {"out": out, **json.loads(line.removeprefix("RESULT "))}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_compiled_pipeline_with_only_config_trains_that_config_into_its_store(s3_env, bucket, tmp_path):
    config = {**QUICK, "store": {"uri": f"s3://{bucket}/runs"}}
    result = run_kfp_local(
        tmp_path,
        f"""
        pipeline = components.load_component_from_file(REPO + "/compiled/training_pipeline.yaml")
        task = pipeline(config={yaml.safe_dump(config)!r}, launcher="local", min_accuracy=0.5)
        print("RESULT " + json.dumps({{k: task.outputs[k].uri for k in ("dataset", "model", "metrics", "report")}}))
        """,
    )
    for name in ("dataset", "model", "metrics", "report"):
        assert result[name].startswith(f"s3://{bucket}/runs/"), (name, result[name])
    store = open_store(result["model"])
    record = json.loads(store.get_bytes(result["model"] + "/training.json"))
    assert record["metrics"]["world_size"] == 1
    assert record["config"]["train"]["epochs"] == 2 and record["config"]["train"]["batch_size"] == 32
    assert [h["epoch"] for h in record["history"]] == [0, 1]
    assert "[worker-0]" not in result["out"]  # one replica: no Worker ran


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_component_yamls_in_a_user_pipeline_two_training_tasks_get_their_own_jobs(tmp_path):
    store = tmp_path / "store"
    config = {**QUICK, "store": {"uri": str(store)}}
    result = run_kfp_local(
        tmp_path,
        f"""
        load = lambda name: components.load_component_from_file(f"{{REPO}}/compiled/components/{{name}}.yaml")
        configure, data_prep, train = load("configure"), load("data_prep"), load("train")
        ids = dict(run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
                   dag_execution_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER)

        @dsl.pipeline
        def user_pipeline(config: str) -> str:
            conf = configure(config=config, epochs=1)
            prep = data_prep(config=conf.output)
            a = train(dataset=prep.outputs["dataset"], config=conf.output, launcher="local", **ids)
            b = train(dataset=prep.outputs["dataset"], config=conf.output, launcher="local", **ids)
            return conf.output

        task = user_pipeline(config={yaml.safe_dump(config)!r})
        print("RESULT " + json.dumps({{"effective": json.loads(task.output)}}))
        """,
    )
    assert result["effective"]["train"]["epochs"] == 1  # the parameter set on configure wins
    names = sorted(
        {
            line.split("training job ")[1].split()[0]
            for line in result["out"].splitlines()
            if "training job kftrain-" in line
        }
    )
    assert len(names) == 2, names
    models = sorted(p.parent for p in store.rglob("model/training.json"))
    assert len(models) == 2 and {m.parent.name.split("-")[0] for m in models} == {"train"}
    for model in models:
        assert json.loads((model / "training.json").read_text())["config"]["train"]["epochs"] == 1


@pytest.mark.timeout(200)
def test_the_pipeline_s_own_parameters_fail_its_first_step_naming_them(tmp_path):
    """As typed in the KFP UI: each bad value fails `configure` with its one line, before data
    prep (was: min_accuracy -1 exported whatever model; a launcher typo failed the training step
    after data prep; a store URI with a trailing space ran the whole pipeline under another prefix)."""
    cases = {
        "min_accuracy": (
            {"min_accuracy": -1.0},
            "kftrain-error: configure: min_accuracy -1: must be a number in [0, 1]",
        ),
        "launcher": ({"launcher": "Local"}, "kftrain-error: configure: launcher 'Local': must be one of"),
        "store": ({"store": str(tmp_path / "store ")}, "starts or ends with whitespace: remove it"),
    }
    result = run_kfp_local(
        tmp_path,
        f"""
        pipeline = components.load_component_from_file(REPO + "/compiled/training_pipeline.yaml")
        failed = {{}}
        for name, params in {json.dumps({k: v[0] for k, v in cases.items()})}.items():
            try:
                pipeline(**{{"config": "job: {{replicas: 1}}", "launcher": "local", **params}})
            except RuntimeError as exc:
                failed[name] = str(exc)
        print("RESULT " + json.dumps(failed))
        """,
    )
    for name, (_, line) in cases.items():
        assert "Inner task failed" in result[name] and "'configure'" in result[name], result[name]
        assert line in result["out"], (name, result["out"][-3000:])
    assert "data-prep" not in result["out"] and "Executing task 'data-prep'" not in result["out"]
