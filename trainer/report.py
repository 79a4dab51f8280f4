"""The evaluation report people look at in the KFP UI: one self-contained HTML page with the
training loss curve (inline SVG, no scripts or external files) and the evaluation table."""

from __future__ import annotations

import html
from typing import Any

WIDTH, HEIGHT, PAD = 640, 260, 40


def svg_line_chart(points: list[tuple[float, float]], title: str, x_label: str, y_label: str) -> str:
    """A minimal line chart; an empty-state note when there are fewer than two points."""
    if len(points) < 2:
        return f"<p><em>{html.escape(title)}: not enough points to draw.</em></p>"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 == y0:
        y1 = y0 + 1.0

    def sx(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0 or 1.0) * (WIDTH - 2 * PAD)

    def sy(y: float) -> float:
        return HEIGHT - PAD - (y - y0) / (y1 - y0) * (HEIGHT - 2 * PAD)

    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{html.escape(title)}">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#444"/>'
        f'<polyline fill="none" stroke="#1f6feb" stroke-width="2" points="{path}"/>'
        f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="14">{html.escape(title)}</text>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">{html.escape(x_label)}</text>'
        f'<text x="12" y="{HEIGHT / 2}" font-size="12" transform="rotate(-90 12 {HEIGHT / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
        f'<text x="{PAD - 4}" y="{PAD + 4}" text-anchor="end" font-size="10">{y1:.3g}</text>'
        f'<text x="{PAD - 4}" y="{HEIGHT - PAD}" text-anchor="end" font-size="10">{y0:.3g}</text>'
        f'<text x="{WIDTH - PAD}" y="{HEIGHT - PAD + 14}" text-anchor="end" font-size="10">{x1:.0f}</text>'
        "</svg>"
    )


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(training: dict[str, Any], evaluation: dict[str, Any], gate: tuple[bool, str]) -> str:
    """The report page from the training record (`training.json`) and the evaluation report."""
    curve = [(p["step"], p["loss"]) for p in training.get("loss_curve", [])]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kftrain report</title>",
        "<style>body{font-family:sans-serif;margin:16px}table{border-collapse:collapse;margin:8px 0}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}</style>",
        "</head><body><h2>kftrain training report</h2>",
        f"<p><strong>Quality gate: {'passed' if gate[0] else 'failed'}</strong> &mdash; {html.escape(gate[1])}</p>",
        svg_line_chart(curve, "training loss", "optimizer step", "loss"),
    ]
    val_key = next((k for k in ("val_accuracy", "val_loss") if any(k in h for h in training.get("history", []))), None)
    if val_key:
        points = [(h["epoch"], h[val_key]) for h in training["history"] if val_key in h]
        parts.append(svg_line_chart(points, val_key.replace("_", " "), "epoch", val_key))
    scalars = [(k, f"{v:.4f}") for k, v in evaluation.items() if isinstance(v, float)]
    parts += ["<h3>Test evaluation</h3>", _table(scalars, ("metric", "value"))]
    if "per_class" in evaluation:
        rows = [
            (cls, f"{m['precision']:.3f}", f"{m['recall']:.3f}", f"{m['f1']:.3f}", str(m["support"]))
            for cls, m in evaluation["per_class"].items()
        ]
        parts += ["<h3>Per class</h3>", _table(rows, ("class", "precision", "recall", "F1", "support"))]
    train_metrics = [(k, f"{v:.4g}") for k, v in training.get("metrics", {}).items() if isinstance(v, int | float)]
    parts += ["<h3>Training</h3>", _table(train_metrics, ("measure", "value")), "</body></html>"]
    return "\n".join(parts)
