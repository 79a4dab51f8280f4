"""compiled/*.yaml is what a fresh compile produces (GitOps: CI fails when it is stale)."""

import subprocess
import sys
from pathlib import Path

import yaml

from pipelines.compile import compile_all
from pipelines.registry import PIPELINES

REPO = Path(__file__).resolve().parents[1]


def test_committed_yaml_matches_a_fresh_compile(tmp_path):
    paths = compile_all(tmp_path)
    assert {p.name for p in paths} == {f"{name}.yaml" for name in PIPELINES}
    for path in paths:
        committed = REPO / "compiled" / path.name
        assert committed.is_file(), f"{committed} is missing: run `kftrain compile`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `kftrain compile`"


def test_compiling_twice_is_byte_identical(tmp_path):
    a = compile_all(tmp_path / "a")
    b = compile_all(tmp_path / "b")
    for pa, pb in zip(a, b, strict=True):
        assert pa.read_text() == pb.read_text()


def test_compiled_yaml_holds_no_credentials_and_uses_the_secret():
    text = (REPO / "compiled" / "training_pipeline.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for executor in platform.values():
        (secret,) = executor["secretAsEnv"]
        assert secret["secretName"] == "mlpipeline-minio-artifact"
        assert {m["envVar"] for m in secret["keyToEnv"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    # No literal credential anywhere: not as a container env value, not as a parameter default.
    for executor in docs[0]["deploymentSpec"]["executors"].values():
        for env in executor["container"].get("env", []):
            assert "KEY" not in env["name"].upper(), env
    for value in ("minio123", "AKIA", "aws_secret_access_key="):
        assert value.lower() not in text.lower()


def test_the_training_step_is_never_cached():
    spec = yaml.safe_load_all((REPO / "compiled" / "training_pipeline.yaml").read_text())
    tasks = next(spec)["root"]["dag"]["tasks"]
    assert tasks["train"]["cachingOptions"] == {}
    assert tasks["data-prep"]["cachingOptions"] == {"enableCache": True}


def test_steps_install_nothing_at_pod_start():
    text = (REPO / "compiled" / "training_pipeline.yaml").read_text()
    assert "pip install" not in text


def test_cli_compile_writes_the_yaml(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "compile", "--output-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "training_pipeline.yaml").is_file()


def test_readme_lists_every_component_parameter():
    from components.data_prep import data_prep
    from components.evaluate import evaluate
    from components.export import export
    from components.gate import quality_gate_failed
    from components.train import train

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Components") : readme.index("## Running on a cluster")]
    for component in (data_prep, train, evaluate, export, quality_gate_failed):
        for name in (component.component_spec.inputs or {}) | (component.component_spec.outputs or {}):
            assert f"`{name}`" in section, (component.name, name)
