"""The HTML report: axes and units, every chart present, the run header, user text escaped, and
(when Chromium is installed) a real browser rendering it."""

from __future__ import annotations

import math
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from trainer.config import Config, to_dict
from trainer.report import (
    html_report,
)

EVIL = "<script>alert(1)</script>"


# -- the page ----------------------------------------------------------------------------------


def training_record(**config_overrides) -> dict:
    config = to_dict(Config())
    config["train"]["epochs"] = 3
    config["job"]["image"] = EVIL
    config["store"]["uri"] = 's3://bucket/"quoted"&<more>'
    t0 = 1_796_000_000.0
    return {
        "loss_curve": [
            {"step": s, "loss": 2.3 * math.exp(-s / 10), "lr": 3e-3, "items_per_second": 900.0 + s, "time": t0 + 2 * s}
            for s in range(5, 61, 5)
        ],
        "history": [{"epoch": e, "train_loss": 1.0 / (e + 1), "val_accuracy": 0.8 + 0.05 * e} for e in range(3)],
        "progress": {
            "validation": [
                {"step": 20 * (e + 1), "epoch": e, "train_loss": 1.0 / (e + 1), "val_loss": 0.5 / (e + 1)}
                | {"val_accuracy": 0.8 + 0.05 * e}
                for e in range(3)
            ],
            "checkpoints": [{"step": 20, "time": t0 + 40, "stage_seconds": 0.05, "bytes": 10_000}],
            "tensorboard_uri": "s3://bucket/run/model/tensorboard",
            "segment": 1,
        },
        "metrics": {
            "samples_per_second": 950.5,
            "data_wait_fraction": 0.07172,
            "first_step_unix_time": t0,
            "train_seconds": 125.0,
            "world_size": 2,
            "steps": 60,
            "resumed_from_step": 20,
        },
        "config": config,
    }


def evaluation_record() -> dict:
    classes = ["zero", EVIL, "two&<b>"]
    return {
        "accuracy": 0.9,
        "loss": 0.3,
        "macro_f1": 0.88,
        "per_class": {c: {"precision": 1.0, "recall": 0.5, "f1": 0.667, "support": 2} for c in classes},
        "confusion_matrix": [[5, 1, 0], [0, 4, 2], [1, 0, 6]],
        "classes": classes,
        "task": "classification",
        "model_uri": "s3://bucket/run/model",
        "dataset_uri": "s3://bucket/data/<ds>",
    }


class Page(HTMLParser):
    """The parts of the page the tests look at: chart titles, element names, text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.charts: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "svg":
            self.charts.append(dict(attrs)["aria-label"])

    def handle_data(self, data):
        self.text.append(data)


def render() -> str:
    context = {
        "run_id": f"run-1/{EVIL}",
        "dataset_uri": "s3://bucket/data",
        "dataset_size": {"train": {"rows": 1259}, "val": {"rows": 180}, "test": {"rows": 358}},
    }
    return html_report(training_record(), evaluation_record(), (False, "accuracy < bar"), context)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed (apt-get install chromium)")
def test_headless_chromium_renders_every_chart(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render())
    shot = tmp_path / "report.png"
    base = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path}",
    ]
    dom = subprocess.run([*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = Page()
    parsed.feed(dom.stdout)  # what the browser built, not our string
    assert parsed.charts == ["loss", "validation accuracy", "throughput (samples/s)", "confusion matrix"]
    assert "script" not in parsed.tags
    run = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1000,2600", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # drawn charts, not a blank page
    blue = sum(n for n, (r, g, b) in colours if b > 180 and r < 120)
    assert blue > 500  # the loss line, legend swatches and heatmap cells are on the page
