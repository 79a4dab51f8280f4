"""The project image's Dockerfile, read as text: non-root, nothing installed at run time, and the
documented tag the components use. It is linted in tests/integration/test_dockerfile.py."""

from pathlib import Path

from components.image import IMAGE

REPO = Path(__file__).resolve().parents[2]


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
