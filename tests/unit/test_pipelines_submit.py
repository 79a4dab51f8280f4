"""`kftrain submit` against a STAND-IN KFP API server (tests/kfp_standin.py): no KFP can run here."""

import subprocess
import sys
from pathlib import Path

from pipelines.submit import parse_params

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "compiled" / "training_pipeline.yaml"


def kftrain(*args, env_extra=None):
    import os

    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def test_parameters_are_typed_from_the_compiled_pipeline():
    args = parse_params(["learning_rate=1", "store=s3://bucket/x", "launcher=kubernetes", "min_accuracy=0.5"], PACKAGE)
    assert args == {"learning_rate": 1.0, "store": "s3://bucket/x", "launcher": "kubernetes", "min_accuracy": 0.5}
