import re

from trainer.evaluate import quality_gate
from trainer.report import html_report, svg_line_chart


def test_quality_gate_in_both_directions():
    assert quality_gate({"accuracy": 0.95}, min_accuracy=0.9) == (
        True,
        "test accuracy 0.9500 reaches the minimum 0.9000 (min_accuracy)",
    )
    ok, why = quality_gate({"accuracy": 0.85}, min_accuracy=0.9)
    assert not ok and "is below the minimum" in why
    ok, why = quality_gate({"perplexity": 12.0}, max_perplexity=10.0)
    assert not ok and "exceeds the maximum 10.000" in why
    assert quality_gate({"perplexity": 8.0}, max_perplexity=10.0)[0]
    assert quality_gate({"perplexity": 80.0}, min_accuracy=0.9) == (
        True,
        "no quality bar set for this task (min_accuracy / max_perplexity)",
    )


def test_line_chart_maps_every_point_inside_the_frame():
    svg = svg_line_chart([(0, 2.0), (10, 1.0), (20, 0.5)], "loss", "step", "loss")
    (points,) = re.findall(r'points="([^"]+)"', svg)
    coords = [tuple(map(float, p.split(","))) for p in points.split()]
    assert len(coords) == 3
    assert coords[0][0] < coords[1][0] < coords[2][0]  # x grows with the step
    assert coords[0][1] < coords[1][1] < coords[2][1]  # lower loss is drawn lower
    assert all(0 <= x <= 640 and 0 <= y <= 260 for x, y in coords)


def test_too_few_points_say_so():
    assert "not enough points" in svg_line_chart([(0, 1.0)], "loss", "step", "loss")


def test_report_holds_curves_tables_and_the_verdict_escaped():
    training = {
        "loss_curve": [{"step": s, "loss": 1.0 / s} for s in range(1, 6)],
        "history": [{"epoch": 0, "val_accuracy": 0.8}, {"epoch": 1, "val_accuracy": 0.9}],
        "metrics": {"samples_per_second": 1000.0},
    }
    evaluation = {
        "accuracy": 0.9,
        "loss": 0.3,
        "per_class": {"<a>": {"precision": 1.0, "recall": 0.5, "f1": 0.667, "support": 2}},
    }
    page = html_report(training, evaluation, (False, "accuracy < bar"))
    assert page.count("<svg") == 2
    assert "Quality gate: failed</strong> &mdash; accuracy &lt; bar" in page
    assert "<td>&lt;a&gt;</td>" in page and "<td>0.9000</td>" in page
    assert "<script" not in page
