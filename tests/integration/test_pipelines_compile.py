"""`kftrain compile` run as a process writes the pipeline YAML."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
