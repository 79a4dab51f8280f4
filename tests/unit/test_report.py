"""The HTML report, built in one process: axes and units, every chart present, the run header, user
text escaped. tests/integration/test_report_browser.py renders the same sample page in Chromium."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from trainer.config import Config, to_dict
from trainer.evaluate import quality_gate
from trainer.report import (
    config_changes,
    config_digest,
    date_time,
    duration,
    format_value,
    html_report,
    linear_ticks,
    log_ticks,
    markdown_html,
    predicted_vs_measured,
    short_number,
    svg_chart,
    svg_confusion_matrix,
    time_label,
    time_ticks,
)

EVIL = "<script>alert(1)</script>"


def ys_of(svg: str) -> list[float]:
    (points,) = re.findall(r'<polyline[^>]*points="([^"]+)"', svg)
    return [float(p.split(",")[1]) for p in points.split()]


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


@pytest.mark.parametrize(
    ("segment", "resumed", "elsewhere", "said"),
    [
        (1, 20, False, "1 restart(s); the last resumed from step 20"),
        # Begun from another run's checkpoint, never restarted (was: "1 restart(s)").
        (0, 57, True, "begun from step 57 of another run's checkpoint (checkpoint.resume_from)"),
        (2, 400, True, "2 restart(s); the last begun from step 400 of another run's checkpoint"),
        # A local run resumed with --run-id: each start has its own folder, segment 0 (was: said to be
        # begun from another run's checkpoint).
        (0, 575, False, "restarted; the last start resumed from step 575 of this run's own checkpoint"),
        (0, 575, None, "resumed from step 575"),  # a record from before kftrain kept where it resumed from
        (0, 0, False, "none (one uninterrupted start)"),
    ],
)
def test_the_header_counts_restarts_only_where_the_run_restarted(segment, resumed, elsewhere, said):
    record = training_record()
    record["progress"]["segment"] = segment
    record["metrics"]["resumed_from_step"] = resumed
    if elsewhere is not None:
        record["resumed_from_another_run"] = elsewhere
    parsed = Page()
    parsed.feed(html_report(record, evaluation_record(), (True, "no bar")))
    assert said in " ".join(parsed.text)


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
    assert quality_gate({"perplexity": 80.0}, min_accuracy=0.9) == (  # the default: classification's
        True,
        "no quality bar set for this task (min_accuracy / max_perplexity)",
    )


@pytest.mark.parametrize(
    "report, gates, said",
    [
        # A custom task's evaluation, which no check before the run can read (was: the gate passed).
        (
            {"loss": 0.1, "test_rows": 40, "task": "mymod:MyTask"},
            {"min_accuracy": 0.95},
            "min_accuracy 0.95 is set, but the evaluation reports no accuracy (it reports loss, test_rows): "
            "return 'accuracy' from the task's evaluate(), or leave min_accuracy unset",
        ),
        (
            {"accuracy": 0.99, "flag": True},
            {"min_accuracy": 0.0, "max_perplexity": 20.0},
            "max_perplexity 20 is set, but the evaluation reports no perplexity (it reports accuracy): return "
            "'perplexity' from the task's evaluate(), or leave max_perplexity unset",
        ),
        (
            {"note": "text only"},
            {"max_perplexity": 3.0},
            "max_perplexity 3 is set, but the evaluation reports no perplexity (it reports no number): return "
            "'perplexity' from the task's evaluate(), or leave max_perplexity unset",
        ),
    ],
)
def test_a_bar_set_that_the_evaluation_does_not_report_fails_the_gate_saying_so(report, gates, said):
    assert quality_gate(report, **gates) == (False, said)


def test_the_default_accuracy_bar_over_an_evaluation_without_accuracy_says_it_gates_nothing():
    """A custom task's: `--min-accuracy 0.9` typed, or the KFP default, cannot be told apart."""
    ok, why = quality_gate({"loss": 0.2}, min_accuracy=0.9)
    assert ok and why.startswith("no quality bar: min_accuracy 0.9 (its default) gates only an evaluation"), why


@pytest.mark.parametrize(
    "report, ok, said",
    [
        # Each bar in effect is checked (was: the second went unchecked once the first was met).
        ({"accuracy": 0.97, "perplexity": 500.0}, False, "test perplexity 500.000 exceeds the maximum 20.000"),
        ({"accuracy": 0.97}, False, "max_perplexity 20 is set, but the evaluation reports no perplexity"),
        ({"perplexity": 7.4, "loss": 2.0}, False, "min_accuracy 0.95 is set, but the evaluation reports no accuracy"),
        (
            {"accuracy": 0.97, "perplexity": 7.4},
            True,
            "test accuracy 0.9700 reaches the minimum 0.9500 (min_accuracy); test perplexity 7.400 is within the "
            "maximum 20.000 (max_perplexity)",
        ),
        # A custom task's measure as a tensor or numpy number is its value; text is no measure.
        ({"accuracy": torch.tensor(0.97), "perplexity": np.float32(7.5)}, True, "test accuracy 0.9700 reaches"),
        ({"accuracy": "97%", "perplexity": 7.4}, False, "the evaluation reports accuracy as a str, not a number"),
        ({"accuracy": "0.97", "perplexity": 7.4}, False, "the evaluation reports accuracy as a str, not a number"),
    ],
)
def test_every_bar_in_effect_is_checked_and_the_model_passes_only_when_it_meets_them_all(report, ok, said):
    passed, why = quality_gate(report, min_accuracy=0.95, max_perplexity=20.0)
    assert passed is ok and said in why, why
    # A bar just past the measure: both shown with the digits that tell them apart (was: "0.9750
    # is below the minimum 0.9750").
    assert quality_gate({"accuracy": 0.975}, min_accuracy=0.97501)[1].startswith(
        "test accuracy 0.97500 is below the minimum 0.97501"
    )
    assert "18.8497 exceeds the maximum 18.8496" in quality_gate({"perplexity": 18.84966}, max_perplexity=18.8496)[1]
    assert "0.9750 reaches the minimum 0.9750" in quality_gate({"accuracy": 0.975}, min_accuracy=0.975)[1]


# -- axes and units --------------------------------------------------------------------------------


def test_linear_ticks_are_round_and_cover_the_range():
    assert linear_ticks(0, 380) == [0, 100, 200, 300, 400]
    assert linear_ticks(0.62, 0.97) == pytest.approx([0.6, 0.7, 0.8, 0.9, 1.0])
    assert linear_ticks(5, 5)[0] <= 5 <= linear_ticks(5, 5)[-1]


def test_log_ticks_span_decades_with_2_and_5_in_between():
    assert log_ticks(0.03, 2.4) == pytest.approx([0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5])
    assert log_ticks(1e-4, 20) == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100])


def test_time_ticks_fall_on_round_minutes_and_read_as_clock_times():
    t0 = 1_796_000_000  # 2026-11-30 00:53:20 UTC
    ticks = time_ticks(t0, t0 + 3600)
    assert all(t % 600 == 0 for t in ticks) and ticks[0] <= t0 and ticks[-1] >= t0 + 3600
    assert time_label(ticks[0], 3600) == "00:50"
    assert date_time(t0) == "2026-11-30 00:53:20 UTC"


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("data_wait_fraction", 0.07172, "7.17%"),
        ("accuracy", 0.9583, "95.83%"),
        ("first_step_unix_time", 1_796_000_000.4, "2026-11-30 00:53:20 UTC"),
        ("train_seconds", 3725.0, "1 h 02 min"),
        ("seconds_to_first_step", 3.42, "3.4 s"),
        ("samples_per_second", 12345.6, "12,346 samples/s"),
        ("world_size", 4, "4"),
        ("steps", 19000.0, "19,000"),
        ("loss", 0.123456, "0.1235"),
        ("peak_memory_bytes", 3 * 2**30 + 2**29, "3.5 GiB"),
        ("peak_memory_bytes", 200 * 2**20, "200.0 MiB"),
        ("median_step_seconds", 0.0421, "42 ms"),
    ],
)
def test_measures_read_with_units(key, value, text):
    assert format_value(key, value) == text


def test_tick_labels_are_short():
    assert [short_number(v) for v in (5000, 1500, 25_000, 2e7, 0.05, 3e-5, 0)] == [
        "5k", "1.5k", "25k", "20M", "0.05", "3.0e-5", "0",
    ]  # fmt: skip


def test_durations():
    assert [duration(s) for s in (0.25, 42.0, 245.0)] == ["250 ms", "42.0 s", "4 min 05 s"]
    # A GPU's step times (were: "0 ms" and "1 ms" for 0.3 and 0.8 ms: a probe).
    assert [duration(s) for s in (0.0003, 0.000805, 0.00104, 0.0421, 0.0)] == [
        "300 µs",
        "805 µs",
        "1.0 ms",
        "42 ms",
        "0 ms",
    ]


def test_a_log_axis_gives_each_decade_the_same_height():
    svg = svg_chart(
        [{"name": "train", "points": [(0, 10.0), (1, 1.0), (2, 0.1), (3, 0.01)]}],
        title="loss",
        x_label="step",
        y_label="loss",
        y_log=True,
    )
    y = ys_of(svg)
    gaps = [b - a for a, b in zip(y, y[1:], strict=False)]
    assert all(g > 0 for g in gaps) and max(gaps) - min(gaps) < 0.2  # lower loss lower, equal decades
    assert "(log scale)" in svg
    ticks = re.findall(r'class="ytick"[^>]*>([^<]+)<', svg)
    assert ticks == ["0.01", "0.1", "1", "10"]


def test_too_few_points_say_so():
    assert "not enough points" in svg_chart([{"name": "a", "points": []}], title="t", x_label="x", y_label="y")
    # A one-epoch run's validation: its one value, said (was: "not enough points", the value nowhere on the chart).
    one = svg_chart([{"name": "val", "points": [(19, 0.95)]}], title="t", x_label="step", y_label="y")
    assert "t: one point, val 0.95 at step 19; a line needs two" in one
    # A time axis's point is a date, a percent axis's a percentage (were: 1.79658e+09, 0.7877).
    # The report's own time axis names the date: said once (was: twice, the label's and the point's).
    when = svg_chart(
        [{"name": "rate", "points": [(1796580000, 280.3)]}],
        title="t",
        x_label="wall-clock time (UTC), 2026-12-06",
        y_label="y",
        x_time=True,
    )
    assert "rate 280.3 at 2026-12-06 " in when and "UTC; a line needs two" in when and when.count("2026-12-06") == 1
    share = svg_chart(
        [{"name": "val", "points": [(19, 0.78771)]}], title="t", x_label="step", y_label="y", y_percent=True
    )
    assert "val 78.77% at step 19" in share


def test_a_step_axis_over_few_steps_has_whole_steps():
    svg = svg_chart([{"name": "a", "points": [(1, 2.0), (2, 1.0)]}], title="t", x_label="step", y_label="y")
    ticks = re.findall(r'class="xtick"[^>]*>([^<]*)<', svg)
    assert ticks == ["1", "2"], ticks


def test_confusion_heatmap_has_a_cell_per_pair_shaded_by_row_share():
    svg = svg_confusion_matrix(["cat", "dog"], [[9, 1], [0, 5]])
    cells = re.findall(r'<rect class="cell"[^>]*fill="rgb\((\d+),(\d+),(\d+)\)"', svg)
    assert len(cells) == 4
    darkness = [255 - int(r) for r, _, _ in cells]
    assert darkness[3] > darkness[0] > darkness[1] > darkness[2] == 0  # 100% > 90% > 10% > 0%
    ET.fromstring(svg)


def test_every_chart_is_present_and_well_formed():
    page = render()
    parsed = Page()
    parsed.feed(page)
    assert parsed.charts == ["loss", "validation accuracy", "throughput (samples/s)", "confusion matrix"]
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        ET.fromstring(svg)  # well-formed XML: nothing unescaped broke it
    loss = re.search(r'<svg[^>]*aria-label="loss".*?</svg>', page, flags=re.S).group(0)
    names = re.findall(r'class="series" data-name="([^"]+)"', loss)
    assert {
        "training (mean per log interval)",
        "validation (end of epoch)",
        "test (final model)",
    } <= set(names)
    throughput = re.search(r'<svg[^>]*aria-label="throughput.*?</svg>', page, flags=re.S).group(0)
    assert re.findall(r'class="xtick"[^>]*>([^<]+)<', throughput)[0] == "00:53:30"  # clock times, not raw floats


def test_the_throughput_line_breaks_where_a_resumed_start_began():
    """No line across the hours a run was stopped; a lone point between two breaks is a dot."""
    training = training_record()
    curve = training["loss_curve"]

    def drawn():
        page = html_report(training, evaluation_record(), (True, ""), {"run_id": "r"})
        svg = re.search(r'<svg[^>]*aria-label="throughput.*?</svg>', page, flags=re.S).group(0)
        ET.fromstring(svg)
        return len(re.findall("<polyline", svg)), len(re.findall("<circle", svg))

    assert drawn() == (1, 0)
    for p in curve[6:]:
        p["time"] += 7200.0  # resumed two hours later
    curve[6]["start"] = True
    assert drawn() == (2, 0)
    curve[11]["start"] = True  # the last point began a start of its own
    assert drawn() == (2, 1)


def test_the_header_names_the_run_and_its_inputs():
    page = render()
    parsed = Page()
    parsed.feed(page)
    text = " ".join(parsed.text)
    config = training_record()["config"]
    assert config_digest(config) in text
    assert "s3://bucket/data/<ds> (train 1,259 rows; val 180 rows; test 358 rows)" in text
    assert "DDP, 2 process(es): 2 replica(s) × 1 per replica" in text
    assert "1 written by the last start (steps 20; median stall 50 ms)" in text
    assert "1 restart(s); the last resumed from step 20" in text
    assert "2026-11-30 00:53:20 UTC" in text and "2 min 05 s" in text and "7.17%" in text
    assert "s3://bucket/run/model/tensorboard" in text
    assert "1.796e+09" not in page and "0.07172" not in page
    changed = {field for field, _, _ in config_changes(config)}
    assert changed == {"train.epochs", "job.image", "store.uri"}


@pytest.mark.parametrize(
    ("secret", "listed"),
    [("hf-token", False), ("", False), ("my-hf-token", True)],
    ids=["the pipeline's default", "the config's default", "the user's own"],
)
def test_a_secret_a_pipeline_run_fills_by_default_is_no_change_of_the_users(secret, listed):
    """Was: every pipeline run's report listed `kubernetes.hf_token_secret "hf-token"` as a field the
    user changed: the value the pipeline's `hf_token_secret` parameter fills in by default."""
    config = to_dict(Config())
    config["kubernetes"]["hf_token_secret"] = secret
    changes = config_changes(config)
    assert (("kubernetes.hf_token_secret", f'"{secret}"', '""') in changes) is listed, changes


def test_a_changed_field_shows_its_text_as_written():
    """Was: `"Gr\\u00fcn? \\ud83c\\udf08"` in the config table, where the report's header and
    generations showed the text itself."""
    config = to_dict(Config())
    config["data"]["eval_prompts"] = ["Was kommt nach Grün? 🌈"]
    config["checkpoint"]["uri"] = "/tmp/ausgabe-ü-日本/ck"
    changes = {field: value for field, value, _ in config_changes(config)}
    assert changes["data.eval_prompts"] == '["Was kommt nach Grün? 🌈"]'
    assert changes["checkpoint.uri"] == '"/tmp/ausgabe-ü-日本/ck"'


def test_a_run_that_ends_before_an_epoch_says_its_validation_is_the_ends_and_what_was_exported():
    """`train.max_steps` before the first epoch's end: the validation is at the last step, not
    "(last epoch)", and export_best's fallback to the last step's model is in the report (was:
    in the log alone)."""
    training = training_record()
    training["history"] = []
    training["config"]["checkpoint"] |= {"export_best": True, "keep_best": "val_loss"}
    training["metrics"] |= {"val_loss": 2.5, "steps": 40}
    parsed = Page()
    parsed.feed(html_report(training, evaluation_record(), (True, ""), {"run_id": "r"}))
    text = " ".join(parsed.text)
    assert "validation loss (at step 40, the end of training: no epoch ended)" in text and "last epoch" not in text
    assert "exported model the last step's (40): no checkpoint had val_loss to rank" in text
    # Its training loss is the mean of its steps (was: "at step 40", as if the loss there).
    training["metrics"]["train_loss"] = 2.7
    parsed = Page()
    parsed.feed(html_report(training, evaluation_record(), (True, ""), {"run_id": "r"}))
    assert "training loss (mean of the steps to step 40, the end of training: no epoch ended)" in " ".join(parsed.text)


def test_a_resumed_run_s_times_say_they_are_its_last_start_s():
    training = training_record()
    training["metrics"] |= {
        "resumed_from_step": 575,
        "train_seconds": 5.5,
        "samples_per_second": 6606.0,
        "skipped_steps": 3,
        "first_step_unix_time": 1_700_000_000.0,
    }
    parsed = Page()
    parsed.feed(html_report(training, evaluation_record(), (True, ""), {"run_id": "r"}))
    text = " ".join(parsed.text)
    assert "training time (its last start)" in text and "throughput (samples/s) (its last start)" in text
    # The header's facts too (was: unlabelled there, as if the whole run's: a probe).
    html = html_report(training, evaluation_record(), (True, ""), {"run_id": "r"})
    assert (
        "<dt>first optimizer step at (its last start)</dt>" in html
        and "<dt>training time (its last start)</dt>" in html
    )
    assert "updates skipped (non-finite) (its last start)" in text
    assert "optimizer steps (its last start)" not in text
    training["resumed_from_another_run"] = True  # begun once from another run's checkpoint: its only start
    training["progress"]["segment"] = 0
    parsed = Page()
    parsed.feed(html_report(training, evaluation_record(), (True, ""), {"run_id": "r"}))
    assert "(its last start)" not in " ".join(parsed.text)


def test_an_fsdp_run_exporting_its_best_step_says_both():
    """The header named DDP whatever the strategy, and with checkpoint.export_best the epoch
    measures (the exported step's) read as the last epoch's, the test point drawn at the last step."""
    training = training_record()
    training["config"]["train"]["strategy"] = "fsdp"
    training["metrics"] |= {"best_step": 20, "val_loss": 0.5, "train_loss": 1.0}
    page = html_report(training, evaluation_record(), (True, ""), {"run_id": "r"})
    parsed = Page()
    parsed.feed(page)
    text = " ".join(parsed.text)
    assert "FSDP, 2 process(es): 2 replica(s) × 1 per replica" in text and "DDP" not in text
    assert "validation loss (at step 20, the exported model's)" in text and "last epoch" not in text
    assert "training loss (mean of the epoch ending at step 20, the exported model's)" in text
    loss = re.search(r'<svg[^>]*aria-label="loss".*?</svg>', page, flags=re.S).group(0)
    assert "test (step 20&#x27;s model)" in loss or "test (step 20's model)" in loss, loss[:2000]
    training["metrics"]["world_size"] = 1  # FSDP and DDP are not applied to one process
    assert "one process, no parallelism, 1 process(es)" in html_report(training, evaluation_record(), (True, ""), {})


def test_user_text_is_escaped_everywhere():
    page = render()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # class name, run id, config value
    assert "two&amp;&lt;b&gt;" in page
    assert "&amp;&lt;more&gt;" in page and "&quot;quoted" in page
    parsed = Page()
    parsed.feed(page)
    assert "script" not in parsed.tags and "b" not in parsed.tags
    assert sum(EVIL in t for t in parsed.text) >= 4  # shown as text: header, heatmap, tables


def test_a_record_from_before_this_report_still_renders():
    """Older training records have no progress section and no wall times: charts say so."""
    old = {"loss_curve": [{"step": s, "loss": 1.0 / s} for s in range(1, 6)], "metrics": {}, "history": []}
    page = html_report(old, {"loss": 0.3}, (True, "no bar"))
    assert page.count("<svg") == 1 and "throughput (items/s): not enough points" in page


def test_a_language_model_report_draws_perplexity_and_no_heatmap():
    record = training_record()
    record["metrics"] = {"tokens_per_second": 20000.0, "steps": 60}
    for v in record["progress"]["validation"]:
        v.pop("val_accuracy")
        v["val_perplexity"] = math.exp(v["val_loss"])
    evaluation = {"loss": 1.2, "perplexity": 3.3, "test_tokens": 5000}
    page = html_report(record, evaluation, (True, "ok"))
    parsed = Page()
    parsed.feed(page)
    assert parsed.charts == ["loss", "perplexity", "throughput (tokens/s)"]
    text = " ".join(parsed.text)
    assert "test perplexity" in text and "5,000" in text and "20,000 tokens/s" in text


class Cells(HTMLParser):
    """The text of each cell of the generations table, row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.inside = False
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and ("class", "generations") in attrs:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = []
        elif self.inside and tag not in ("thead", "tbody"):
            self.rows[-1].append(f"<{tag}>")  # any element inside a cell would be the model's markup

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_generations_show_side_by_side_escaped_with_their_line_breaks():
    generations = [
        {"prompt": "def add(a, b):\n", "before": f"{EVIL}\n  &amp;", "after": "    return a + b\n"},
        {"prompt": "<|im_start|>user\nHi<|im_end|>\n", "before": "</td></tr></table><b>x", "after": "Hello"},
        {"prompt": "bell", "before": "a\x07b\x00\x7f\x85", "after": "tab\tok\r\n"},
    ]
    page = html_report(training_record(), {"loss": 1.2, "perplexity": 3.3, "generations": generations}, (True, "ok"))
    assert "<script" not in page.lower() and "</table><b>" not in page
    parsed = Cells()
    parsed.feed(page)
    assert parsed.rows[0] == ["prompt", "before (base model)", "after (fine-tuned)"]
    assert parsed.rows[1:3] == [[g["prompt"], g["before"], g["after"]] for g in generations[:2]]  # exactly, as text
    # Control characters, which HTML does not allow, show as symbols; tab and line breaks stay.
    assert parsed.rows[3] == ["bell", "a\u2407b\u2400\u2421\ufffd", "tab\tok\r\n"]
    assert not re.search(r"[\x00\x07\x7f\x85]", page)
    assert "white-space:pre-wrap" in page  # line breaks and indentation read as the model wrote them
    # Not a measure: the test table lists the scalars only.
    assert "generations" not in re.search(r"<h2>Test evaluation</h2>(.*?)</table>", page, flags=re.S).group(1)


def test_no_generations_no_section():
    for evaluation in ({"loss": 1.2}, {"loss": 1.2, "generations": []}):
        page = html_report(training_record(), evaluation, (True, "ok"))
        assert "Generations" not in page and 'class="generations"' not in page


# -- predicted against measured -----------------------------------------------------------------

#: The metrics a real run records (trainer/train.py, Trainer.finish) that the plan is checked against.
RECORDED = {"peak_memory_bytes": 400 * 2**20, "median_step_seconds": 0.050, "train_seconds": 125.0, "steps": 60}


@pytest.mark.parametrize(
    ("prediction", "rows"),
    [
        (
            {"peak_memory_bytes": 460 * 2**20, "step_seconds": 0.040, "eta_seconds": 150.0},
            [
                ("peak memory per rank (max over ranks)", "460.0 MiB", "400.0 MiB", "+15.0%"),
                ("step time (median)", "40 ms", "50 ms", "-20.0%"),
                ("training time (ETA)", "2 min 30 s", "2 min 05 s", "+20.0%"),
            ],
        ),
        (  # a side missing (a record from before these metrics, a plan without a step time) reads n/a
            {"peak_memory_bytes": 400 * 2**20, "step_seconds": None, "eta_seconds": 125.0},
            [
                ("peak memory per rank (max over ranks)", "400.0 MiB", "400.0 MiB", "+0.0%"),
                ("step time (median)", "n/a", "50 ms", "n/a"),
                ("training time (ETA)", "2 min 05 s", "2 min 05 s", "+0.0%"),
            ],
        ),
    ],
)
def test_predicted_vs_measured_rows_give_the_error_in_percent(prediction, rows):
    assert predicted_vs_measured(prediction, RECORDED) == rows
    assert predicted_vs_measured(prediction, {})[0][2:] == ("n/a", "n/a")


@pytest.mark.parametrize(
    ("resumed_from_step", "measured", "row"),
    [
        (20, {"train_seconds": 100.0}, ("training time (ETA)", "1 min 40 s", "1 min 40 s", "+0.0%")),  # 40 of 60
        (60, {}, ("training time (ETA)", "0 ms", "n/a", "n/a")),  # resumed at its end: no step, nothing timed
    ],
)
def test_a_resumed_start_is_held_to_its_share_of_the_eta(resumed_from_step, measured, row):
    """The plan's ETA is the whole run's; a resumed start's training time is of its own steps
    (was: compared whole, and a start of no step at all read "measured 0 ms, +11481502.2%")."""
    metrics = {"steps": 60, "resumed_from_step": resumed_from_step, **measured}
    assert predicted_vs_measured({"eta_seconds": 150.0}, metrics)[2] == row


def test_the_report_shows_the_prediction_against_the_run_or_why_there_is_none():
    record = training_record()
    record["metrics"].update(RECORDED)
    prediction = {"peak_memory_bytes": 460 * 2**20, "step_seconds": 0.040, "eta_seconds": 150.0}
    page = html_report(record, evaluation_record(), (True, "ok"), {"prediction": {**prediction, "source": EVIL}})
    section = page.split("<h2>Predicted vs measured</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<td>460.0 MiB</td><td>400.0 MiB</td><td>+15.0%</td>" in section
    assert "<td>40 ms</td><td>50 ms</td><td>-20.0%</td>" in section
    assert EVIL not in page and "&lt;script&gt;" in section
    refused = html_report(record, evaluation_record(), (True, "ok"), {"prediction": {"problem": "no model <x>"}})
    assert "No prediction: no model &lt;x&gt;" in refused
    assert "Predicted vs measured" not in html_report(record, evaluation_record(), (True, "ok"), {})


def test_a_markdown_plan_becomes_a_page_with_its_headings_lists_and_tables_escaped():
    text = (
        "# Plan for `gpt` <b>\n\nIt **fits**: 3.5 GiB of 80 GiB.\n\n- one <i>\n- two\n\n"
        "| nodes | step time |\n|---:|---|\n| 1 | 0.12 s |\n| 2 | 0.07 s |\n"
    )
    page = markdown_html(text)
    assert "<h1>Plan for <code>gpt</code> &lt;b&gt;</h1>" in page
    assert "<p>It <strong>fits</strong>: 3.5 GiB of 80 GiB.</p>" in page
    assert "<ul><li>one &lt;i&gt;</li><li>two</li></ul>" in page
    assert (
        "<table><thead><tr><th>nodes</th><th>step time</th></tr></thead>"
        "<tbody><tr><td>1</td><td>0.12 s</td></tr><tr><td>2</td><td>0.07 s</td></tr></tbody></table>"
    ) in page
    parsed = Page()
    parsed.feed(page)
    assert parsed.tags.count("table") == 1 and "<i>" not in page


def test_class_names_cut_to_one_label_are_told_apart():
    """Two classes whose names share their first 13 characters had the same axis labels (a probe)."""
    from trainer.report import svg_confusion_matrix

    svg = svg_confusion_matrix(["x" * 20 + "A", "x" * 20 + "B", "short"], [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    assert svg.count(">0: xxxxxxxxxxxxx…<") == 2 and svg.count(">1: xxxxxxxxxxxxx…<") == 2, svg
    assert svg.count(">short<") == 2
