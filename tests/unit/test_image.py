"""trainer/image.py: the one image setting."""

from pathlib import Path

import components.image
from trainer.config import load_config
from trainer.image import IMAGE

REPO = Path(__file__).resolve().parents[2]


def test_the_replicas_and_the_steps_run_the_one_image_set():
    """Changing components/image.py changed every step's image but not the training replicas'
    (`job.image` had its own copy of the tag: a probe)."""
    assert components.image.IMAGE is IMAGE and load_config().job.image == IMAGE
    registry = IMAGE.split("/", 1)[0] + "/"
    holders = [
        str(path.relative_to(REPO))
        for folder in ("trainer", "components", "pipelines")
        for path in (REPO / folder).rglob("*.py")
        if registry + IMAGE.split("/", 1)[1].split(":", 1)[0] in path.read_text()
    ]
    assert holders == ["trainer/image.py"]
