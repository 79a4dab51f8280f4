"""Evaluation on the held-out test split (each task computes its own report), the quality gate in
front of export, and the report's scalars for the KFP UI."""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from trainer.checks import GATE_DEFAULTS, GATE_METRICS
from trainer.generations import GenerationSettings
from trainer.model_io import load_model
from trainer.storage import ObjectStore, join_uri
from trainer.tasks import task_for_meta
from trainer.tasks.contract import checked_report, plain

EVAL_RECORD = "metrics.json"


def evaluate_model(
    store: ObjectStore,
    model_uri: str,
    dataset_uri: str,
    output_uri: str | None = None,
    max_items: int = 2048,
    generation: GenerationSettings | None = None,
) -> dict[str, Any]:
    """Evaluate the model at `model_uri` on (the first `max_items` items of) the test split;
    write `metrics.json` to `output_uri`. `generation`: the prompts and bounds of a fine-tuned
    pretrained model's before/after generations (default: `GenerationSettings()`)."""
    from trainer.tasks.pretrained_lm import PretrainedLMTask

    model, meta = load_model(store, model_uri)
    task = task_for_meta(meta)
    if generation is not None and isinstance(task, PretrainedLMTask):
        task.generation = generation
    with torch.no_grad():
        report = checked_report(task, task.evaluate(model, meta, store, dataset_uri, max_items))
    report.update(task=meta["task"], model_uri=model_uri, dataset_uri=dataset_uri)
    if output_uri:
        store.put_bytes(join_uri(output_uri, EVAL_RECORD), json.dumps(report, indent=2).encode())
    return report


def quality_gate(report: dict[str, Any], min_accuracy: float = 0.0, max_perplexity: float = 0.0) -> tuple[bool, str]:
    """Whether the model may be exported, and why (a sentence for the run's UI and log): every
    bar in effect is checked, and the model passes when it meets them all.

    A bar set to other than its default (:data:`trainer.checks.GATE_DEFAULTS`) whose measure the
    report lacks fails the gate, naming what the report holds: a custom task's evaluation, which
    no check before the run can read (was: the gate passed, "no quality bar set"; or a second bar
    went unchecked once the first was met). The defaults apply to the tasks that report their
    measure only (`--min-accuracy`'s 0.9 to classification)."""
    verdicts = []
    for name, bar in (("min_accuracy", min_accuracy), ("max_perplexity", max_perplexity)):
        measure = GATE_METRICS[name].removeprefix("val_")  # the test report's name of the epoch's measure
        if not bar:
            continue
        if measure in report:
            verdicts.append(_against_bar(report[measure], bar, name, measure, higher=name.startswith("min_")))
        elif bar != GATE_DEFAULTS[name]:
            held = sorted(k for k, v in report.items() if isinstance(v, int | float) and not isinstance(v, bool))
            verdicts.append(
                (
                    False,
                    (
                        f"{name} {bar:g} is set, but the evaluation reports no {measure} (it reports "
                        f"{', '.join(held) or 'no number'}): return {measure!r} from the task's evaluate(), or leave "
                        f"{name} unset"
                    ),
                )
            )
    if not verdicts:
        if min_accuracy == GATE_DEFAULTS["min_accuracy"] and "perplexity" not in report:
            # Given or not, the default cannot be told from a bar in a KFP run: say what it gates.
            return True, (
                f"no quality bar: min_accuracy {min_accuracy:g} (its default) gates only an evaluation that "
                "reports accuracy, and this one reports none; return 'accuracy' or 'perplexity' from the task's "
                "evaluate() to gate on it"
            )
        return True, "no quality bar set for this task (min_accuracy / max_perplexity)"
    failed = [why for ok, why in verdicts if not ok]
    return not failed, "; ".join(failed or [why for _, why in verdicts])


def _against_bar(value: Any, bar: float, name: str, measure: str, higher: bool) -> tuple[bool, str]:
    """The verdict on one measure: a number (a tensor of one value or a numpy number is taken as
    its value) on the right side of `bar`."""
    value = plain(value)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False, f"the evaluation reports {measure} as a {type(value).__name__}, not a number ({name})"
    ok = value >= bar if higher else value <= bar
    got, shown = _told_apart(value, bar, 4 if higher else 3)
    if higher:
        return ok, f"test {measure} {got} {'reaches' if ok else 'is below'} the minimum {shown} ({name})"
    return ok, f"test {measure} {got} {'is within' if ok else 'exceeds'} the maximum {shown} ({name})"


def _told_apart(measured: float, bar: float, digits: int) -> tuple[str, str]:
    """`measured` and `bar` with `digits` decimals, or as many more as it takes to show them
    different where they are (0.9750 below the minimum 0.9750 reads as a contradiction)."""
    for places in range(digits, 16):
        shown = f"{measured:.{places}f}", f"{bar:.{places}f}"
        if measured == bar or shown[0] != shown[1]:
            return shown
    return repr(measured), repr(bar)


def ui_scalars(report: dict[str, Any]) -> dict[str, float]:
    """The evaluation's scalars under the names the KFP UI lists and compares across runs.

    Every test-split measure says so: `test_accuracy`, `test_loss`, `test_macro_f1`,
    `test_perplexity`, `test_rows` / `test_tokens`; per class `test_class_<name>_precision`,
    `_recall` and `_f1`, with the class's own name (characters other than letters, digits,
    `_`, `.` and `-` become `_`; a name that collides after that gets its class index).
    """
    out: dict[str, float] = {}
    for key, value in report.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key if key.startswith("test_") else f"test_{key}"] = float(value)
    seen: set[str] = set()
    for index, (cls, scores) in enumerate(report.get("per_class", {}).items()):
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(cls)).strip("_") or str(index)
        while name in seen:  # `a!!` -> `a` -> `a_2`, which `a 2` may hold: until the name is free
            name = f"{name}_{index}"
        seen.add(name)
        for measure in ("precision", "recall", "f1"):
            out[f"test_class_{name}_{measure}"] = float(scores[measure])
    return out
