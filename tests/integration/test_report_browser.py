"""The HTML report rendered by a real browser: headless Chromium (when installed) builds the page
with every chart and no script, and a screenshot shows drawn charts. The page itself, built in one
process, is tested in tests/unit/test_report.py, whose sample report this file renders."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.test_report import Page, render


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
