"""The evaluation step's HTML report: one self-contained page (inline SVG, no script, no external
file) that the KFP UI shows as an HTML artifact.

What it shows: a header naming the run (run id, config digest and the fields that differ from the
defaults, dataset URI and size, image, world size and strategy, checkpoints and resumes, where the
TensorBoard event files are); the quality gate; training, validation and test loss on one log
axis; the validation metric per epoch; throughput over wall-clock time; the confusion matrix as a
heatmap (classification); a fine-tune's generations before and after, side by side; and tables
with units, percentages and dates instead of raw floats.

The charts are hand-drawn SVG rather than matplotlib: four simple kinds of chart do not justify
~40 MB of plotting stack (matplotlib, pillow, fonttools, contourpy, kiwisolver) in the image and
a second of import time, and every piece of user text (class names, config values, URIs) goes
through one escaping function here instead of a plotting library's text layer (matplotlib
parses `$...$` in labels as math). Every string that reaches the page passes `html.escape`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import math
import re
from typing import Any

from trainer.config import ConfigError, best_metric
from trainer.progress import format_memory

WIDTH, HEIGHT = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 70, 44, 50, 52
COLORS = ("#1f6feb", "#d4700a", "#2da44e", "#a371f7", "#cf222e")


def esc(text: Any) -> str:
    """Any value as text safe inside HTML/SVG elements and quoted attributes."""
    return html.escape(str(text), quote=True)


# -- numbers, units, dates ---------------------------------------------------------------------


def short_number(v: float) -> str:
    """A tick label: `1.5k`, `20M`, `0.05`, `3e-05`: at most 3 significant digits."""
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    if a == 0 or a >= 1e-3:
        return f"{v:.3g}"
    return f"{v:.1e}".replace("e-0", "e-")


def duration(seconds: float) -> str:
    """`805 µs`, `4.2 ms`, `850 ms`, `12.3 s`, `4 min 05 s`, `2 h 07 min`: below 10 ms with the
    digits a GPU's step time needs (was: whole ms, a 0.3 ms step "0 ms", 0.8 and 1.0 ms alike)."""
    if 0 < seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if 0 < seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def date_time(unix: float) -> str:
    """A wall-clock time as a UTC date: `2026-11-30 07:02:13 UTC`."""
    return dt.datetime.fromtimestamp(unix, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


#: The training record's measure saying its validation scored the model after the last epoch's
#: end (`train.max_steps` past one, not on one), at that step.
AFTER_LAST_EPOCH = "validated_after_last_epoch_at_step"
#: How measures of the training record and the evaluation read on the page.
LABELS = {
    "accuracy": "test accuracy",
    "loss": "test loss (cross-entropy)",
    "perplexity": "test perplexity",
    "base_loss": "base model's test loss (before fine-tuning)",
    "base_perplexity": "base model's test perplexity (before fine-tuning)",
    "macro_f1": "macro-average F1",
    "val_accuracy": "validation accuracy (last epoch)",
    "val_loss": "validation loss (last epoch)",
    "val_perplexity": "validation perplexity (last epoch)",
    "train_loss": "training loss (last epoch mean)",
    "train_seconds": "training time",
    "seconds_to_first_step": "start to first optimizer step",
    "first_step_unix_time": "first optimizer step at",
    "data_wait_fraction": "time waiting for data",
    "mfu": "model FLOPs utilisation (MFU)",
    "world_size": "world size (processes)",
    "steps": "optimizer steps",
    "resumed_from_step": "resumed from step",
    "skipped_steps": "updates skipped (non-finite)",
    "test_tokens": "test tokens",
    "peak_memory_bytes": "peak memory per rank (max over ranks)",
    "median_step_seconds": "step time (median)",
}
_PERCENT = ("accuracy", "macro_f1", "mfu", "data_wait_fraction")
#: Measures of the process start that wrote the record: a resumed run's last start, not its whole.
_OF_A_START = (
    "train_seconds",
    "seconds_to_first_step",
    "first_step_unix_time",
    "data_wait_fraction",
    "mfu",
    "median_step_seconds",
    "skipped_steps",
    "peak_memory_bytes",
)


def _measure_label(key: str, best_step: int | None, end_step: int | None = None, epochs: bool = False) -> str:
    """A training measure's name; with `checkpoint.export_best` (`best_step`) the epoch measures
    are the exported step's epoch's, not the last epoch's, and say so; with `end_step` (a run
    that ended before any epoch did, or, with `epochs`, after the last one) the validation is the
    end of training's."""
    if key not in ("val_accuracy", "val_loss", "val_perplexity", "train_loss"):
        return label(key)
    name = label(key).split(" (")[0]
    if best_step is not None:
        if key == "train_loss":
            return f"{name} (mean of the epoch ending at step {best_step}, the exported model's)"
        return f"{name} (at step {best_step}, the exported model's)"
    if end_step is not None and epochs:
        if key == "train_loss":
            return f"{name} (mean of the steps after the last epoch, to step {end_step})"
        return f"{name} (at step {end_step}, the end of training, after the last epoch)"
    if end_step is not None:
        if key == "train_loss":
            return f"{name} (mean of the steps to step {end_step}, the end of training: no epoch ended)"
        return f"{name} (at step {end_step}, the end of training: no epoch ended)"
    return label(key)


def _restarted(training: dict[str, Any]) -> bool:
    """Whether the record's run started more than once: a start that resumed this run's own
    checkpoint (one begun from another run's is its only start), or a cluster's restart (its
    TensorBoard segments). Its :data:`_OF_A_START` measures are then the last start's."""
    metrics = training.get("metrics", {})
    return (bool(metrics.get("resumed_from_step")) and not training.get("resumed_from_another_run")) or bool(
        (training.get("progress") or {}).get("segment")
    )


def _training_measures(training: dict[str, Any]) -> list[tuple[str, str]]:
    """The training record's measures as rows, and where `checkpoint.export_best` found no
    checkpoint to rank (no epoch ended before the run's step limit), which model was exported."""
    metrics, config = training.get("metrics", {}), training.get("config") or {}
    epochs = bool(training.get("history"))
    end_step = metrics.get("steps") if not epochs or metrics.get(AFTER_LAST_EPOCH) else None
    restarted = _restarted(training)
    rows = [
        (
            _measure_label(k, metrics.get("best_step"), end_step, epochs)
            + (" (its last start)" if restarted and (k in _OF_A_START or k.endswith("_per_second")) else ""),
            format_value(k, v),
        )
        for k, v in metrics.items()
        if k != AFTER_LAST_EPOCH  # said by the labels
    ]
    checkpoint = config.get("checkpoint") or {}
    if checkpoint.get("export_best") and "best_step" not in metrics and "steps" in metrics:
        try:
            metric = (best_metric(str(checkpoint.get("keep_best") or "")) or ("", "?"))[1]
        except ConfigError:  # a record's config is shown as it is, not checked again
            metric = "?"
        rows.append(("exported model", f"the last step's ({metrics['steps']:,}): no checkpoint had {metric} to rank"))
    return rows


def label(key: str) -> str:
    """A person's name for a measure (`samples_per_second` -> `throughput (samples/s)`)."""
    if key in LABELS:
        return LABELS[key]
    if key.endswith("_per_second"):
        return f"throughput ({key.removesuffix('_per_second')}/s)"
    return key.replace("_", " ")


def format_value(key: str, value: Any) -> str:
    """A measure with its unit: percentages, durations, dates, thousands separators."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key in _PERCENT or key.endswith(("_accuracy", "_fraction", "_share")):
        return f"{value:.2%}"
    if key.endswith("_unix_time"):
        return date_time(value)
    if key.endswith("_bytes"):
        return format_memory(value)
    if key.endswith("_seconds") or key.startswith("seconds_"):
        return duration(value)
    if key.endswith("_per_second"):
        return f"{value:,.0f} {key.removesuffix('_per_second')}/s"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1 and "loss" not in key):
        return f"{int(value):,}"
    return f"{value:.4g}"


# -- axes ----------------------------------------------------------------------------------------


def linear_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis covering [lo, hi] (both > 0): powers of ten, and 2 and 5 times them
    when the values span less than three decades."""
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1,) if math.log10(hi / lo) >= 3 else (1, 2, 5)
    ticks = [m * 10.0**e for e in range(a, b + 1) for m in mults]
    below = [t for t in ticks if t <= lo]
    above = [t for t in ticks if t >= hi]
    start, end = (below[-1] if below else ticks[0]), (above[0] if above else ticks[-1])
    return [t for t in ticks if start <= t <= end]


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def time_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Unix times on round seconds, minutes or hours covering [lo, hi]."""
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= target), 86400 * math.ceil(span / 86400 / target))
    t = math.floor(lo / step) * step
    ticks = []
    while t < hi + step:
        ticks.append(float(t))
        if t >= hi:
            break
        t += step
    return ticks


def time_label(unix: float, span: float) -> str:
    """A time tick: `07:02` (or `07:02:30` when ticks are seconds apart; with the day past a day)."""
    when = dt.datetime.fromtimestamp(unix, dt.timezone.utc)
    if span > 86400:
        return when.strftime("%m-%d %H:%M")
    return when.strftime("%H:%M:%S" if span < 600 else "%H:%M")


# -- charts --------------------------------------------------------------------------------------


def svg_chart(
    series: list[dict[str, Any]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_log: bool = False,
    x_time: bool = False,
    y_percent: bool = False,
) -> str:
    """A line chart with labelled ticks on both axes, gridlines and a legend.

    `series`: `{"name", "points": [(x, y), ...]}` plus optional `"markers": True` (dots; a
    single point is always a dot); a None among the points breaks the line there (a run stopped
    and resumed). Log axes drop points <= 0. Without two points in all, an empty-state note
    instead of a chart.
    """
    drawn = []
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        for p in s["points"]:
            if p is None:
                runs.append([])
            elif math.isfinite(float(p[1])) and (not y_log or float(p[1]) > 0):
                runs[-1].append((float(p[0]), float(p[1])))
        if any(runs):
            drawn.append({**s, "points": [p for run in runs for p in run], "runs": [r for r in runs if r]})
    every = [p for s in drawn for p in s["points"]]
    if len(every) < 2:
        # One measurement (a one-epoch run's validation): its value, where a line needs two.
        said = " not enough points to draw."
        if every:
            x, y = every[0]
            value = f"{y:.2%}" if y_percent else f"{y:.4g}"
            # A time is its own label (the axis label's date again was printed twice).
            at = date_time(x) if x_time else f"{x_label} {short_number(x)}"
            said = f" one point, {drawn[0]['name']} {value} at {at}; a line needs two"
        return f'<p class="empty"><em>{esc(title)}:{esc(said)}</em></p>'
    xs, ys = [p[0] for p in every], [p[1] for p in every]
    xt = time_ticks(min(xs), max(xs)) if x_time else linear_ticks(min(xs), max(xs), target=6)
    if not x_time and all(x == int(x) for x in xs) and max(xs) - min(xs) < 6:  # steps, epochs: no 1.2
        xt = [float(t) for t in range(math.floor(min(xs)), math.ceil(max(xs)) + 1)]
    if y_log:
        yt = log_ticks(min(ys), max(ys))
        ymap = math.log10
    else:
        yt = linear_ticks(min(min(ys), 0.0) if y_percent else min(ys), max(ys))
        ymap = float
    x0, x1, y0, y1 = xt[0], xt[-1], ymap(yt[0]), ymap(yt[-1])
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (ymap(y) - y0) / (y1 - y0) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(title)}">',
        f"<title>{esc(title)}</title>",
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{esc(title)}</text>',
    ]
    span = xt[-1] - xt[0]
    for t in xt:
        x = sx(t)
        text = time_label(t, span) if x_time else short_number(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#eee"/>')
        out.append(
            f'<text class="xtick" x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="11">'
            f"{esc(text)}</text>"
        )
    for t in yt:
        y = sy(t)
        text = f"{t:.0%}" if y_percent else short_number(t)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(
            f'<text class="ytick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{esc(text)}</text>'
        )
    out += [
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
        f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 10}" text-anchor="middle" font-size="12">{esc(x_label)}</text>',
        f'<text x="16" y="{TOP + ph / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + ph / 2})">{esc(y_label + (" (log scale)" if y_log else ""))}</text>',
    ]
    legend_x = LEFT
    for i, s in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        for pts in s["runs"]:
            if len(pts) > 1 and not s.get("markers"):
                path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
                out.append(
                    f'<polyline class="series" data-name="{esc(s["name"])}" fill="none" stroke="{color}" '
                    f'stroke-width="1.8" points="{path}"/>'
                )
                continue
            for x, y in pts:
                out.append(
                    f'<circle class="series" data-name="{esc(s["name"])}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" '
                    f'fill="{color}"><title>{esc(s["name"])}: {esc(short_number(y))}</title></circle>'
                )
        # The legend: one row between the title and the plot, never over the data.
        out.append(f'<rect x="{legend_x}" y="{TOP - 17}" width="12" height="10" fill="{color}"/>')
        out.append(f'<text x="{legend_x + 16}" y="{TOP - 8}" font-size="11">{esc(s["name"])}</text>')
        legend_x += 16 + 6.5 * len(s["name"]) + 18
    out.append("</svg>")
    return "".join(out)


def svg_confusion_matrix(classes: list[str], matrix: list[list[int]]) -> str:
    """The confusion matrix as a heatmap: rows are the true class, columns the predicted one; the
    colour is the share of the row (so each class's recall reads along the diagonal), the number
    is the count."""
    k = len(classes)
    if not k:
        return '<p class="empty"><em>confusion matrix: no classes.</em></p>'
    cell = max(8, min(44, 520 // k))
    names = [c if len(c) <= 14 else c[:13] + "…" for c in map(str, classes)]
    if len(set(names)) < len(names):  # cut to one name (`xxxxxxxxxxxxA`, `...B`): their indexes tell them apart
        names = [f"{i}: {n}" if names.count(n) > 1 else n for i, n in enumerate(names)]
    margin = 34 + 7 * max(len(n) for n in names)  # the rotated axis title, then the row labels
    size = margin + cell * k
    width, height = size + 20, size + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="confusion matrix">',
        "<title>confusion matrix</title>",
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{margin + cell * k / 2}" y="16" text-anchor="middle" font-size="12">predicted class</text>',
        f'<text x="12" y="{40 + margin + cell * k / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 12 {40 + margin + cell * k / 2})">true class</text>',
    ]
    top = 40 + margin
    for j, name in enumerate(names):
        x = margin + cell * j + cell / 2
        out.append(
            f'<text x="{x:.1f}" y="{top - 6}" font-size="11" text-anchor="start" '
            f'transform="rotate(-60 {x:.1f} {top - 6})">{esc(name)}</text>'
        )
    for i, row in enumerate(matrix):
        total = sum(row) or 1
        y = top + cell * i
        out.append(
            f'<text x="{margin - 6}" y="{y + cell / 2 + 4:.1f}" font-size="11" text-anchor="end">{esc(names[i])}</text>'
        )
        for j, count in enumerate(row):
            share = count / total
            shade = f"rgb({int(255 - 224 * share)},{int(255 - 144 * share)},{int(255 - 20 * share)})"
            out.append(
                f'<rect class="cell" x="{margin + cell * j}" y="{y}" width="{cell}" height="{cell}" '
                f'fill="{shade}" stroke="#fff"><title>true {esc(classes[i])}, predicted {esc(classes[j])}: '
                f"{count} ({share:.1%} of the row)</title></rect>"
            )
            if cell >= 18:
                ink = "white" if share > 0.55 else "#222"
                out.append(
                    f'<text x="{margin + cell * j + cell / 2}" y="{y + cell / 2 + 4}" font-size="{min(12, cell // 3)}" '
                    f'text-anchor="middle" fill="{ink}">{count}</text>'
                )
    out.append("</svg>")
    return "".join(out)


# -- the page ------------------------------------------------------------------------------------


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_FREE_FORM = ("labels", "annotations", "env", "node_selector", "store_secret_keys", "affinity")


def config_digest(config: dict[str, Any]) -> str:
    """A short hash of the whole config (equal digests: equal configs)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        # Sections recurse; free-form mappings (labels, env, ...) compare whole.
        if isinstance(value, dict) and value and key not in _FREE_FORM:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def config_changes(config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(field, value, default) for every config field that differs from the defaults, where a
    field a pipeline run fills from its own parameter's default, at that
    value is no change (was: listed as one the user set)."""
    from trainer.config import KFP_HF_TOKEN_SECRET, Config, to_dict

    defaults, actual = _flatten(to_dict(Config())), _flatten(config)
    filled = {"kubernetes.hf_token_secret": KFP_HF_TOKEN_SECRET}  # the Secret the step pods mount
    return [
        # As written (was: `\u00fc` for ü): the page is UTF-8, and escapes HTML itself.
        (
            key,
            json.dumps(value, ensure_ascii=False),
            json.dumps(defaults.get(key), ensure_ascii=False) if key in defaults else "(none)",
        )
        for key, value in sorted(actual.items())
        if defaults.get(key, object()) != value and filled.get(key, object()) != value
    ]


def _header(training: dict[str, Any], evaluation: dict[str, Any], context: dict[str, Any]) -> list[str]:
    config = training.get("config", {})
    metrics = training.get("metrics", {})
    progress = training.get("progress", {})
    job = config.get("job", {})
    elastic = config.get("kubernetes", {}).get("elastic", {}).get("enabled")
    sizes = context.get("dataset_size", {})
    size = "; ".join(
        f"{split} " + ", ".join(f"{n:,} {unit}" for unit, n in units.items()) for split, units in sizes.items()
    )
    world = metrics.get("world_size", job.get("replicas", 0) * job.get("nproc_per_node", 1))
    # The run's (was "DDP" whatever it was); one process is neither.
    name = str(config.get("train", {}).get("strategy", "ddp")).upper() if world != 1 else "one process, no parallelism"
    strategy = (
        f"{name}, {world} process(es): {job.get('replicas', '?')} replica(s) × {job.get('nproc_per_node', '?')} "
        f"per replica" + (", elastic" if elastic else "")
    )
    ckpts = progress.get("checkpoints", [])
    if ckpts:
        stall = sorted(c["stage_seconds"] for c in ckpts)[len(ckpts) // 2]
        steps = ", ".join(str(c["step"]) for c in ckpts[:12]) + (" …" if len(ckpts) > 12 else "")
        ckpt_text = f"{len(ckpts)} written by the last start (steps {steps}; median stall {duration(stall)})"
    else:
        ckpt_text = "none written by the last start"
    resumed = int(metrics.get("resumed_from_step", 0))
    restarts = int(progress.get("segment", 0))  # a cluster run's; each local start has a folder of its own
    elsewhere = training.get("resumed_from_another_run")  # absent in a record kftrain wrote before it kept it
    if elsewhere:
        resume_text = f"begun from step {resumed:,} of another run's checkpoint (checkpoint.resume_from)"
        resume_text = f"{restarts} restart(s); the last {resume_text}" if restarts else resume_text
    elif restarts:
        resume_text = f"{restarts} restart(s); the last resumed from step {resumed:,}"
    elif resumed:
        resume_text = f"restarted; the last start resumed from step {resumed:,} of this run's own checkpoint"
        resume_text = resume_text if elsewhere is not None else f"resumed from step {resumed:,}"
    else:
        resume_text = "none (one uninterrupted start)"
    facts = [
        ("run", context.get("run_id") or "(not given)"),
        ("task", config.get("task", evaluation.get("task", "?"))),
        ("config digest", config_digest(config) if config else "(no config in the training record)"),
        (
            "dataset",
            f"{evaluation.get('dataset_uri') or context.get('dataset_uri', '?')}" + (f" ({size})" if size else ""),
        ),
        ("model", evaluation.get("model_uri", "?")),
        ("image", job.get("image", "?")),
        ("world size and strategy", strategy),
        ("checkpoints", ckpt_text),
        ("resumes", resume_text),
    ]
    # A resumed run's are its last start's, said as the Training table says it (was: unlabelled).
    start = " (its last start)" if _restarted(training) else ""
    if "first_step_unix_time" in metrics:
        facts.append((f"first optimizer step at{start}", date_time(metrics["first_step_unix_time"])))
    if "train_seconds" in metrics:
        facts.append((f"training time{start}", duration(metrics["train_seconds"])))
    if progress.get("tensorboard_uri"):
        facts.append(("TensorBoard logs", progress["tensorboard_uri"]))
    parts = ['<dl class="facts">'] + [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts] + ["</dl>"]
    changes = config_changes(config) if config else []
    if changes:
        parts += [
            "<details open><summary>Config fields that differ from the defaults</summary>",
            _table(changes, ("field", "value", "default")),
            "</details>",
        ]
    resumed_with = _changed_on_resume(training)
    if resumed_with:
        parts += [
            "<details open><summary>Settings changed when the run resumed (the config above is the last "
            "start's; the steps before each change trained under its earlier value)</summary>",
            _table(resumed_with, ("from step", "field", "before", "after")),
            "</details>",
        ]
    return parts


def _changed_on_resume(training: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The training record's `config_changes` as table rows; a change at the last step says that
    no step trained under it."""
    changes = training.get("config_changes")
    last = training.get("metrics", {}).get("steps")
    rows = []
    for c in changes if isinstance(changes, list) else []:
        if isinstance(c, dict) and isinstance(c.get("at_step"), int) and "field" in c:
            at = f"{c['at_step']:,}" + (" (the last: no step trained with it)" if c["at_step"] == last else "")
            rows.append((at, str(c["field"]), repr(c.get("from")), repr(c.get("to"))))
    return rows


def _charts(training: dict[str, Any], evaluation: dict[str, Any]) -> list[str]:
    curve = training.get("loss_curve", [])
    validation = training.get("progress", {}).get("validation") or [
        {**h, "step": h["epoch"] + 1} for h in training.get("history", [])
    ]
    by_step = bool(training.get("progress", {}).get("validation"))
    last_step = training.get("metrics", {}).get("steps") or (curve[-1]["step"] if curve else 0)
    loss_series = [{"name": "training (mean per log interval)", "points": [(p["step"], p["loss"]) for p in curve]}]
    val_loss = [(v["step"], v["val_loss"]) for v in validation if "val_loss" in v]
    if val_loss and by_step:
        loss_series.append({"name": "validation (end of epoch)", "points": val_loss, "markers": len(val_loss) < 3})
    best = training.get("metrics", {}).get("best_step")  # checkpoint.export_best: the model evaluated is its
    if "loss" in evaluation and last_step:
        name, at = ("test (final model)", last_step) if best is None else (f"test (step {best}'s model)", best)
        loss_series.append({"name": name, "points": [(at, evaluation["loss"])], "markers": True})
    parts = [
        "<h2>Loss</h2>",
        svg_chart(loss_series, title="loss", x_label="optimizer step", y_label="loss", y_log=True),
    ]
    for key, name, percent in (("val_accuracy", "validation accuracy", True), ("val_perplexity", "perplexity", False)):
        points = [(v["step"], v[key]) for v in validation if key in v]
        if points:
            parts += [
                f"<h2>{esc(name.capitalize())}</h2>",
                svg_chart(
                    [{"name": name, "points": points, "markers": len(points) < 3}],
                    title=name,
                    x_label="optimizer step" if by_step else "epoch",
                    y_label=name,
                    y_percent=percent,
                    y_log=not percent,
                ),
            ]
    item = next(
        (k.removesuffix("_per_second") for k in training.get("metrics", {}) if k.endswith("_per_second")), "items"
    )
    rate: list[tuple[float, float] | None] = []
    for p in curve:
        if "time" in p and "items_per_second" in p:
            if p.get("start") and rate:  # a resume: no line across the time the run was stopped
                rate.append(None)
            rate.append((p["time"], p["items_per_second"]))
    parts += [
        "<h2>Throughput</h2>",
        svg_chart(
            [{"name": f"{item}/s (per log interval)", "points": rate}],
            title=f"throughput ({item}/s)",
            x_label="wall-clock time (UTC)" + (f", {date_time(rate[0][0])[:10]}" if rate and rate[0] else ""),
            y_label=f"{item}/s",
            x_time=True,
        ),
    ]
    if evaluation.get("confusion_matrix") and evaluation.get("classes"):
        parts += [
            "<h2>Confusion matrix</h2>",
            svg_confusion_matrix(evaluation["classes"], evaluation["confusion_matrix"]),
        ]
    return parts


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def visible(text: Any) -> str:
    """Text with its control characters (other than tab and line breaks), which HTML does not
    allow, shown as symbols: C0 and DEL as their Unicode control pictures (BEL -> U+2407), C1 as U+FFFD."""

    def picture(m: re.Match[str]) -> str:
        code = ord(m.group())
        return chr(0x2400 + code) if code < 0x20 else "\u2421" if code == 0x7F else "\ufffd"

    return _CONTROL.sub(picture, str(text))


def _generations(rows: list[dict[str, Any]]) -> list[str]:
    """The prompts and what the model wrote for each before and after fine-tuning, side by side.
    Model output is untrusted text: escaped like every other string, control characters made
    visible, line breaks kept."""
    body = "".join(
        "<tr>"
        + "".join(f"<td>{esc(visible(row.get(key, '')))}</td>" for key in ("prompt", "before", "after"))
        + "</tr>"
        for row in rows
    )
    return [
        "<h2>Generations before and after fine-tuning</h2>",
        "<p>Greedy continuations of each prompt (new tokens only) by the base model and by the fine-tuned one.</p>",
        '<table class="generations"><thead><tr><th>prompt</th><th>before (base model)</th>'
        f"<th>after (fine-tuned)</th></tr></thead><tbody>{body}</tbody></table>",
    ]


# -- predicted against measured -------------------------------------------------------------------

#: What the report compares: (the prediction's key, the training record's metric, the row's name).
PREDICTED_MEASURED = (
    ("peak_memory_bytes", "peak_memory_bytes", "peak memory per rank (max over ranks)"),
    ("step_seconds", "median_step_seconds", "step time (median)"),
    ("eta_seconds", "train_seconds", "training time (ETA)"),
)


def error_percent(predicted: float, measured: float) -> float | None:
    """The prediction's error relative to the measurement, in percent (positive: over-predicted);
    None when there is no measurement to compare with."""
    if not measured:
        return None
    return 100.0 * (predicted - measured) / measured


def predicted_vs_measured(prediction: dict[str, Any], metrics: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The rows (measure, predicted, measured, error) of the plan's prediction (`peak_memory_bytes`,
    `step_seconds`, `eta_seconds`) against the training record's metrics; a side that is missing
    reads `n/a`."""
    rows = []
    for key, metric, name in PREDICTED_MEASURED:
        predicted, measured = prediction.get(key), metrics.get(metric)
        if key == "eta_seconds" and predicted is not None:
            predicted = _predicted_for_this_start(predicted, metrics)
        shown = [
            ("n/a" if v is None else format_memory(v) if key == "peak_memory_bytes" else duration(v))
            for v in (predicted, measured)
        ]
        error = error_percent(predicted, measured) if predicted is not None and measured is not None else None
        rows.append((name, *shown, "n/a" if error is None else f"{error:+.1f}%"))
    return rows


def _predicted_for_this_start(eta_seconds: float, metrics: dict[str, Any]) -> float:
    """The plan's ETA is for the whole run, step 0 to its last; a resumed start trained only its
    steps past `resumed_from_step` (its `train_seconds` measures those): its share of the ETA."""
    steps, resumed = metrics.get("steps"), metrics.get("resumed_from_step") or 0
    if not resumed or not isinstance(steps, int) or steps <= 0:
        return eta_seconds
    return eta_seconds * max(steps - resumed, 0) / steps


def _prediction(prediction: dict[str, Any] | None, metrics: dict[str, Any]) -> list[str]:
    if not prediction:
        return []
    note = prediction.get("source", "")
    if "problem" in prediction:
        return ["<h2>Predicted vs measured</h2>", f"<p>No prediction: {esc(prediction['problem'])}</p>"]
    return [
        "<h2>Predicted vs measured</h2>",
        f"<p>{esc(note)}</p>" if note else "",
        _table(predicted_vs_measured(prediction, metrics), ("measure", "predicted", "measured", "error")),
    ]


# -- a Markdown page as HTML ---------------------------------------------------------------------

_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")


def _inline(text: str) -> str:
    """Escaped text with `code` and **bold** marked up."""
    out, last = [], 0
    for m in _INLINE.finditer(text):
        out.append(esc(text[last : m.start()]))
        out.append(f"<code>{esc(m[1])}</code>" if m[1] is not None else f"<strong>{esc(m[2])}</strong>")
        last = m.end()
    out.append(esc(text[last:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_html(text: str, title: str = "kftrain plan") -> str:
    """A self-contained HTML page of the Markdown the planner writes: headings, paragraphs, bullet
    lists, pipe tables, `code` and **bold** (the subset it uses; every piece of text escaped)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"]
    parts.append(f"<style>{STYLE}</style></head><body>")
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            parts.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif line.lstrip().startswith("|"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append(lines[i])
                i += 1
            rows = [_cells(b) for b in block if not re.fullmatch(r"[\s|:-]+", b)]
            head = "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif line.lstrip().startswith(("- ", "* ")):
            items = []
            while i < len(lines) and lines[i].lstrip().startswith(("- ", "* ")):
                items.append(f"<li>{_inline(lines[i].lstrip()[2:])}</li>")
                i += 1
            parts.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(("#", "|", "- ", "* ")):
                para.append(lines[i].strip())
                i += 1
            parts.append(f"<p>{_inline(' '.join(para))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:16px 24px;color:#222;max-width:1000px}"
    "h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.4em}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}th{background:#f4f4f4}"
    "dl.facts{display:grid;grid-template-columns:max-content auto;gap:2px 16px}dt{font-weight:bold}dd{margin:0}"
    ".gate{padding:8px 12px;border-radius:6px}.passed{background:#dafbe1}.failed{background:#ffebe9}"
    "svg.chart{display:block;margin:6px 0}"
    "table.generations{table-layout:fixed;width:100%}"
    "table.generations td{text-align:left;vertical-align:top;white-space:pre-wrap;overflow-wrap:anywhere;"
    "font-family:ui-monospace,monospace;font-size:0.9em}"
)


def html_report(
    training: dict[str, Any],
    evaluation: dict[str, Any],
    gate: tuple[bool, str],
    context: dict[str, Any] | None = None,
) -> str:
    """The report page from the training record (`training.json`), the evaluation report and the
    gate's verdict. `context`: `run_id`, `dataset_uri`, `dataset_size` (`{split: {"rows" or "tokens": n}}`) and
    `prediction`, the plan's prediction for the run (`peak_memory_bytes`, `step_seconds`, `eta_seconds`, and a
    `source` note; or `problem`: why there is none), shown against the measurements."""
    context = context or {}
    verdict = "passed" if gate[0] else "failed"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kftrain report</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>kftrain training report</h1>",
        *_header(training, evaluation, context),
        f'<p class="gate {verdict}"><strong>Quality gate: {verdict}</strong> &mdash; {esc(gate[1])}</p>',
        *_charts(training, evaluation),
    ]
    skip = {"per_class", "confusion_matrix", "classes", "task", "model_uri", "dataset_uri"}
    scalars = [
        (label(k), format_value(k, v))
        for k, v in evaluation.items()
        if k not in skip and not isinstance(v, dict | list)
    ]
    parts += ["<h2>Test evaluation</h2>", _table(scalars, ("measure", "value"))]
    if evaluation.get("generations"):
        parts += _generations(evaluation["generations"])
    if "per_class" in evaluation:
        rows = [
            (cls, f"{m['precision']:.1%}", f"{m['recall']:.1%}", f"{m['f1']:.1%}", f"{m['support']:,}")
            for cls, m in evaluation["per_class"].items()
        ]
        parts += ["<h2>Per class</h2>", _table(rows, ("class", "precision", "recall", "F1", "support (test rows)"))]
    parts += _prediction(context.get("prediction"), training.get("metrics", {}))
    parts += ["<h2>Training</h2>", _table(_training_measures(training), ("measure", "value")), "</body></html>"]
    return "\n".join(parts)
