"""The demo pipeline end to end through kfp.local, as `kftrain run --local` runs it."""

import json
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_group
from tests.pipeline_demo import PLAN_CONFIG, check_plan_demo_run, full_log
from trainer.storage import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

KFTRAIN = [sys.executable, "-m", "pipelines.cli"]
REPO = Path(__file__).resolve().parents[2]


def cli_env(extra=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(extra or {})}
    return env


@pytest.mark.s3_servers("strict")
def test_demo_on_an_s3_store_reaches_95_percent_and_writes_nothing_locally(s3_env, bucket, tmp_path):
    """The whole demo on an S3 store (RGW where it runs, which checks credentials and names as
    MinIO and AWS do; moto elsewhere), its training replicas under the Training Operator's (v1)
    environment contract, with the plan step on: its plan is an artifact, and the report sets its
    prediction against what the run measured (tests/pipeline_demo.py's checks, read through the
    store). Kubeflow Trainer's (v2) contract gets the same checks on a local directory, on the
    first run of tests/integration/test_run_ownership.py. The plan's own files (Markdown and
    HTML) are checked on both: in the store here, as KFP outputs on the local directory there."""
    config, cwd, scratch = tmp_path / "plan.yaml", tmp_path / "cwd", tmp_path / "tmp"
    config.write_text(PLAN_CONFIG.format(kind="pytorchjob"))
    cwd.mkdir()
    scratch.mkdir()
    args = ["--config", str(config), "--store", f"s3://{bucket}/runs", "--summary", "summary.json"]
    env = {**cli_env(), "TMPDIR": str(scratch)}
    rc, out = run_group([*KFTRAIN, "run", "--local", *args], timeout=360, env=env, cwd=str(cwd))
    assert rc == 0, out[-5000:]
    assert sorted(os.listdir(cwd)) == ["summary.json"]  # nothing else lands locally
    assert os.listdir(scratch) == []  # nor in the temporary folder: no step's or torchrun's leftovers
    summary = json.loads((cwd / "summary.json").read_text())
    assert summary["metrics"]["test_accuracy"] >= 0.95
    artifacts = summary["artifacts"]
    assert summary["exported"] is True and "reaches the minimum 0.9000" in summary["quality_gate"]
    assert set(artifacts) == {"dataset", "plan", "model", "metrics", "report", "exported"}
    assert all(uri.startswith(f"s3://{bucket}/runs/") for uri in artifacts.values())  # the plan's too
    store = open_store(f"s3://{bucket}/runs")
    names = {uri.rsplit("/", 2)[-2] + "/" + uri.rsplit("/", 1)[-1] for uri in store.list(f"s3://{bucket}/runs")}
    for expected in [
        "dataset/manifest.json",
        "train/rows-00000.npz",
        "test/rows-00000.npz",
        "model/model.safetensors",
        "model/model.json",
        "model/training.json",
        "evaluation/metrics.json",
        "exported/model.pt",
        "exported/model.safetensors",
        "exported/model_card.json",
    ]:
        assert expected in names, (expected, sorted(names))
    report = store.get_bytes(artifacts["report"]).decode()
    assert report.startswith("<!doctype html>") and "<svg" in report and "Quality gate: passed" in report
    assert f"<dt>run</dt><dd>{summary['run_id']}</dd>" in report  # the id --run-id takes (was: kfp.local's job id)
    # Replica logs reach the step log with their replica prefix.
    assert "[master-0] [rank 0]" in out and "[worker-0] [rank 1]" in out
    # The full log sits beside the run record in the store.
    log_uri = full_log(out)
    assert log_uri.startswith(f"s3://{bucket}/runs/runs/{summary['run_id']}/log-")
    assert b"Got executor_input" in store.get_bytes(log_uri)
    # It ends as the terminal did (it was uploaded again after those lines; none left in $TMPDIR).
    assert store.get_bytes(log_uri).decode().rstrip().endswith(out.rstrip().splitlines()[-1])
    card = json.loads(store.get_bytes(artifacts["exported"] + "/model_card.json"))
    assert card["source_dataset_uri"] == artifacts["dataset"]
    assert card["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["test_accuracy"])
    check_plan_demo_run(f"s3://{bucket}/runs", summary, out, first_node="master-0")


def test_plan_strict_stops_the_run_before_training_with_the_reason(tmp_path):
    """plan.strict with a GPU too small for the model: the plan step fails the run with the
    reason as its last line, and the training step never starts."""
    (tmp_path / "c.yaml").write_text("plan:\n  enabled: true\n  strict: true\nkubernetes:\n  gpu_memory_gb: 0.001\n")
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", "--config", "c.yaml", "--output-dir", "out"],
        timeout=240,
        env=cli_env(),
        cwd=str(tmp_path),
    )
    assert rc == 1, out[-5000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: step plan: the plan refuses this run (plan.strict): "), out[-5000:]
    assert "predicted peak memory per rank" in last and "exceeds the device's" in last
    assert any(line.endswith(" data-prep started") for line in out.splitlines())
    assert " train started" not in out and "[master-0]" not in out  # training never started
    assert not list((tmp_path / "out").rglob("training.json"))


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        ([], "train:\n  epochs: 2\n  learning_rat: 0.1\n", "train.learning_rat: unknown key"),
        (["--store", "gs://bucket/x"], "", "unsupported storage URI scheme 'gs'"),
        (["--store", "s3://no-such-bucket-here/x"], "", "bucket 'no-such-bucket-here' does not exist"),
        (["--store", "s3://BUCKET/x"], "", "invalid bucket name 'BUCKET'"),
    ],
)
def test_bad_input_stops_the_run_before_training(s3_env, tmp_path, args, config, message):
    (tmp_path / "c.yaml").write_text(config)
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", *(["--config", "c.yaml"] if config else []), *args],
        timeout=60,
        env=cli_env(),
        cwd=str(tmp_path),
    )
    assert rc == 2
    assert message in out
    assert "configure started" not in out  # stopped before the pipeline started


@pytest.mark.s3_servers("moto", "rgw")
def test_wrong_credentials_stop_the_run_before_training(s3_env, bucket, tmp_path):
    env = cli_env({"AWS_SECRET_ACCESS_KEY": "not-the-secret-key"})
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", "--store", f"s3://{bucket}/x"], timeout=60, env=env, cwd=str(tmp_path)
    )
    assert rc == 2
    assert "rejected the credentials" in out
    assert "not-the-secret-key" not in out
    assert "configure started" not in out


def test_the_language_model_path_end_to_end(tmp_path):
    """configs/gpt-tiny.yaml: a GPT over bytes, 2 replicas, through all four steps."""
    args = ["--config", str(REPO / "configs" / "gpt-tiny.yaml"), "--output-dir", "out", "--summary", "s.json"]
    rc, out = run_group([*KFTRAIN, "run", "--local", *args], timeout=360, env=cli_env(), cwd=str(tmp_path))
    assert rc == 0, out[-5000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["metrics"]["test_perplexity"] < 60  # bytes guessed uniformly: 256
    assert summary["exported"] is True  # no perplexity bar set
    exported = Path(summary["artifacts"]["exported"])
    for name in ("model.pt", "model_repository/kftrain/1/model.onnx", "huggingface/config.json", "model_card.json"):
        assert (exported / name).is_file(), name
    assert "tokens/s" in out
    # The sequence dimension is -1 in every format: the card says how long it may be.
    inputs = json.loads((exported / "model_card.json").read_text())["inputs"]
    assert inputs["shape"] == [-1, -1] and inputs["max_length"] == 64


def test_fine_tuning_the_example_model_end_to_end(tmp_path):
    """`kftrain example-model`, then configs/finetune-tiny.yaml (LoRA on chat data, 2 ranks, FSDP)
    through all four steps, as the README says; the exports load in transformers and peft."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rc, out = run_group([*KFTRAIN, "example-model"], timeout=120, env=cli_env(), cwd=str(tmp_path))
    assert rc == 0, out
    args = ["--config", str(REPO / "configs" / "finetune-tiny.yaml"), "--summary", "s.json"]
    rc, out = run_group([*KFTRAIN, "run", "--local", *args], timeout=360, env=cli_env(), cwd=str(tmp_path))
    assert rc == 0, out[-5000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    # The assistant's tokens of the held-out conversations, against log(vocabulary) = 5.77 before.
    assert summary["metrics"]["test_perplexity"] < 200
    report = json.loads((Path(summary["artifacts"]["metrics"]) / "metrics.json").read_text())
    assert len(report["generations"]) == 3
    assert all(g["after"].startswith("After ") for g in report["generations"])  # it learned the answers' form
    exported = Path(summary["artifacts"]["exported"])
    card = json.loads((exported / "model_card.json").read_text())
    # Absolute, as the run recorded it (was: relative, a place only from the folder it started in)
    assert card["base_model"]["origin"] == str(tmp_path / "kftrain-outputs/example/tiny-llama")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "kftrain-outputs/example/tiny-llama")
    adapted = PeftModel.from_pretrained(base, exported / "adapter")
    merged = AutoModelForCausalLM.from_pretrained(exported / "huggingface")
    x = torch.arange(24).reshape(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=x).logits, adapted(input_ids=x).logits, rtol=1e-4, atol=1e-4)


def test_a_failing_step_fails_the_run_with_exit_code_1_verbose_too(tmp_path):
    """With --verbose (kfp.local's own output on the terminal) the step's own error is still the
    last line. The same run is the command line's check that a float32-overflowing cell stops data
    prep (tests/integration/test_data_prep_inputs.py refuses the other sources through the CLI);
    without --verbose: tests/integration/test_cli_errors.py's `non-numeric-cell`."""
    # A cell float32 cannot carry shows only when data prep reads the rows (a missing source
    # fails before any step: tests/integration/test_data_prep_inputs.py).
    (tmp_path / "bad.csv").write_text(
        "a,b,label\n" + "1.5,1.5,x\n1.5,1.5,y\n" * 3 + "1e308,1.5,x\n" + "1.5,1.5,y\n" * 40
    )
    (tmp_path / "c.yaml").write_text(f"data:\n  source: {tmp_path / 'bad.csv'}\ntrain:\n  epochs: 1\n")
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", "--config", "c.yaml", "--verbose"],
        timeout=120,
        env=cli_env(),
        cwd=str(tmp_path),
    )
    assert rc == 1, out[-3000:]
    # The configure step knew the config for the one the pre-flight had just checked (no second check).
    assert "pre-flight checks: done by `kftrain run` before this step" in out
    # The data-prep step's own error reaches the terminal, whatever else is left in the log.
    assert "column 'a': '1e308' overflows float32" in out
    # The last line is the step's own error; the one before it says where the full log is.
    assert out.strip().splitlines()[-1] == (
        "kftrain: error: step data-prep: " + str(tmp_path / "bad.csv") + ": row 7 (line 8), column 'a': '1e308' "
        "overflows float32, the model's feature type (at most ±3.403e+38); every feature must be a finite number "
        "within float32's range: fix or drop the row"
    ), out[-3000:]
    assert out.strip().splitlines()[-2].startswith("kftrain: see full log: ")
    assert "[master-0]" not in out and "non-finite loss" not in out  # training never started
    assert "Got executor_input" in out  # --verbose: kfp.local's own output too
    assert "Traceback (most recent call last)" in Path(full_log(out)).read_text()
