"""`kftrain job manifest` run as a process: the PyTorchJob and TrainJob manifests it prints match
the golden files (and the strict v2 schema), and preflight errors end in one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.unit.test_launch_trainjob import EXAMPLES as TRAINJOB_EXAMPLES
from trainer.launch.preflight import (
    validate_trainjob,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
EXAMPLES = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
#: The `--set`s of TRAINJOB_EXAMPLES that give a local demo's paths cluster URIs.
PATHS = ("data.source=", "model.init_from=")


@pytest.mark.parametrize("config", EXAMPLES)
def test_manifest_matches_golden(config):
    """`kftrain job manifest` output is reviewed in tests/golden/ (KFTRAIN_UPDATE_GOLDEN=1 rewrites)."""
    sets = [arg for s in TRAINJOB_EXAMPLES.get(config) or [] if s.startswith(PATHS) for arg in ("--set", s)]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "job",
            "manifest",
            "--config",
            f"configs/{config}.yaml",
            "--namespace",
            "team-a",
            *sets,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    golden = GOLDEN / f"{config}.pytorchjob.yaml"
    if os.environ.get("KFTRAIN_UPDATE_GOLDEN"):
        golden.write_text(out.stdout)
    assert out.stdout == golden.read_text()


def test_cli_prints_a_preflight_error_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kubernetes:\n  tolerations:\n    - {key: gpu, efect: NoSchedule}\n")
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "job", "manifest", "--config", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "tolerations[0]: Additional properties are not allowed ('efect'" in out.stderr


def cli_manifest(config: str, sets: list[str]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "pipelines.cli", "job", "manifest", "--config", f"configs/{config}.yaml"]
    args += ["--namespace", "team-a", "--kind", "trainjob"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("config", [c for c, s in TRAINJOB_EXAMPLES.items() if s is not None])
def test_trainjob_manifest_matches_golden_and_the_strict_v2_schema(config):
    """`kftrain job manifest --kind trainjob` is reviewed in tests/golden/ (KFTRAIN_UPDATE_GOLDEN=1 rewrites)."""
    out = cli_manifest(config, TRAINJOB_EXAMPLES[config])
    assert out.returncode == 0, out.stderr
    golden = GOLDEN / f"{config}.trainjob.yaml"
    if os.environ.get("KFTRAIN_UPDATE_GOLDEN"):
        golden.write_text(out.stdout)
    assert out.stdout == golden.read_text()
    manifest = yaml.safe_load(golden.read_text())
    validate_trainjob(manifest)  # the reviewed file itself passes preflight
    assert (manifest["apiVersion"], manifest["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")


def test_a_local_demos_paths_are_refused_as_submit_refuses_them():
    """What the pods read, as a path relative to this machine (the fine-tuning demo's
    `kftrain-outputs/example/...`), is refused naming the field (was: printed into the job)."""
    out = cli_manifest("finetune-tiny", [])
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("kftrain: error: data.source 'kftrain-outputs/example/chat.jsonl' is a path on this machine")
    )


def test_elastic_example_is_refused_as_a_trainjob_with_the_field_named():
    out = cli_manifest("elastic", [])
    assert out.returncode != 0
    assert "kubernetes.elastic.enabled" in out.stderr


def test_auto_cannot_be_printed_without_a_cluster():
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "job", "manifest", "--set", "job.kind=auto"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "--kind" in out.stderr
