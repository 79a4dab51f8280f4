"""What a task must implement and return (trainer/tasks/contract.py): each mistake a task's author
makes is one line naming the task, the method and what it must return."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trainer.config import ConfigError
from trainer.tasks import Task, get_task
from trainer.tasks.classification import ClassificationTask
from trainer.tasks.contract import (
    TaskError,
    checked_batch,
    checked_built,
    checked_datasets,
    checked_loss,
    checked_manifest,
    checked_metrics,
    checked_model,
    checked_report,
    checked_serving,
    checked_summed_loss,
    streamed,
    unimplemented,
)


class DatasetsOnly(Task):
    """A task the docs' one sentence ("implement stream() ... or only datasets()") leads to."""

    def datasets(self, cfg, store, dataset_uri, manifest):
        return [], []


class Whole(ClassificationTask):
    """A complete task: a built-in one's methods, one overridden."""

    def loss(self, model, batch):
        return super().loss(model, batch)


NAME = f"{__name__}:{{}}"


@pytest.mark.parametrize(
    "cls, missing",
    [
        (
            Task,
            [
                *(
                    f"{m}()"
                    for m in (
                        "prepare",
                        "build_model",
                        "model_from_meta",
                        "loss",
                        "validate",
                        "evaluate",
                        "serving_module",
                    )
                ),
                "stream() or datasets()",
            ],
        ),
        (
            DatasetsOnly,
            [
                "prepare()",
                "build_model()",
                "model_from_meta()",
                "loss()",
                "validate()",
                "evaluate()",
                "serving_module()",
            ],
        ),
        (Whole, []),
    ],
)
def test_the_methods_a_task_leaves_to_the_base_class_are_named(cls, missing):
    assert unimplemented(cls) == missing


def test_loading_a_task_that_leaves_methods_out_names_them():
    with pytest.raises(ConfigError) as exc:
        get_task(NAME.format("DatasetsOnly"))
    assert str(exc.value) == (
        f"task: '{NAME.format('DatasetsOnly')}' does not implement prepare(), build_model(), model_from_meta(), "
        "loss(), validate(), evaluate(), serving_module(); a task implements each of them (docs/data.md, "
        "'Your own task')"
    )
    assert isinstance(get_task(NAME.format("Whole")), Whole)


TASK = Whole()
SAID = f"task {NAME.format('Whole')}: "
GRAD = torch.ones(3, requires_grad=True)


@pytest.mark.parametrize(
    "check, value, said",
    [
        (checked_manifest, {"note": "x"}, "prepare() returned a mapping with no 'splits'"),
        (checked_manifest, None, "prepare() returned a NoneType"),
        (checked_built, torch.nn.Linear(2, 2), "build_model() returned a Linear; it must return (the model, its"),
        (checked_built, (torch.nn.Linear(2, 2), None), "build_model() returned (a Linear, a NoneType)"),
        (checked_built, ({}, torch.nn.Linear(2, 2)), "build_model() returned (a dict, a Linear)"),
        (checked_model, ({}, {}), "model_from_meta() returned a tuple; it must return the model"),
        (checked_report, [0.9], "evaluate() returned a list; it must return the test report"),
        (checked_report, {"task": "mine"}, "evaluate() returned a value named 'task'; it must return values named"),
        (checked_report, {"model": torch.nn.Linear(1, 1)}, "evaluate() returned 'model': a Linear; it must return"),
        (checked_batch, torch.ones(2), "synthetic_batch() returned a tensor of shape (2,); it must return None or"),
        (checked_batch, (torch.ones(2), [1]), "synthetic_batch() returned a tuple"),
        (checked_serving, torch.nn.Linear(2, 2), "serving_module() returned a Linear; it must return None or"),
        (checked_serving, (torch.ones(1), torch.ones(1)), "serving_module() returned a tuple"),
        (checked_datasets, [1], "datasets() returned a list; it must return two datasets, (train, validation)"),
        (checked_datasets, "ab", "datasets() returned a str"),
        (checked_loss, GRAD * 2, "loss() returned a tensor of shape (3,); it must return the batch's loss"),
        (checked_loss, 0.5, "loss() returned a float"),
        (checked_loss, torch.tensor(0.5), "loss() returned a loss with no gradient"),
        (checked_summed_loss, GRAD.sum(), "summed_loss() returned a tensor of shape ()"),
        (checked_summed_loss, (GRAD.sum(), "4"), "summed_loss() returned a count that is a str"),
        (checked_summed_loss, (GRAD, 4), "summed_loss() returned a tensor of shape (3,)"),
        (checked_metrics, [("val_loss", 1.0)], "validate() returned a list; it must return a mapping"),
        (checked_metrics, {"note": "hello"}, "validate() returned 'note': a str"),
        (checked_metrics, {"val_loss": torch.ones(2)}, "validate() returned 'val_loss': a tensor of shape (2,)"),
        (checked_metrics, {"many": np.ones(2)}, "validate() returned 'many': a ndarray"),
    ],
)
def test_what_a_task_returns_that_kftrain_cannot_use_is_refused_naming_the_method(check, value, said):
    with pytest.raises(TaskError) as exc:
        check(TASK, value)
    assert str(exc.value).startswith(SAID + said), str(exc.value)
    assert str(exc.value).endswith("(see docs/data.md)")


def test_what_a_task_returns_in_a_form_kftrain_can_use_is_taken_as_it_means():
    loss = GRAD.sum()
    assert checked_loss(TASK, loss) is loss
    assert checked_loss(TASK, GRAD[:1] * 1).shape == ()  # one value in a 1-d tensor
    total, count = checked_summed_loss(TASK, (loss, 4))  # a count as a plain number
    assert total is loss and count.item() == 4 and count.shape == ()
    kept = torch.tensor(7)
    assert checked_summed_loss(TASK, (loss, kept))[1] is kept  # a tensor count as it is (bitwise runs)
    metrics = checked_metrics(
        TASK,
        {"val_loss": torch.tensor(0.25), "val_rows": np.int64(3), "val_mae": np.float32(0.5), "n": 2, "best": True},
    )
    assert metrics == {"val_loss": 0.25, "val_rows": 3, "val_mae": 0.5, "n": 2, "best": 1}
    assert all(type(v) in (int, float) for v in metrics.values())  # what JSON writes
    assert checked_manifest(TASK, {"splits": {}}) == {"splits": {}}
    assert checked_datasets(TASK, ([1], [2])) == ([1], [2])
    model = torch.nn.Linear(2, 2)
    assert checked_built(TASK, [model, {"a": 1}]) == (model, {"a": 1})
    assert checked_model(TASK, model) is model
    assert checked_report(TASK, {"accuracy": 0.5, "confusion": [[1]]}) == {"accuracy": 0.5, "confusion": [[1]]}


def test_a_validation_metric_named_as_one_of_the_trainer_s_own_is_refused():
    with pytest.raises(
        TaskError, match="validate\\(\\) returned a metric named 'train_loss'; it must return metrics named"
    ):
        checked_metrics(TASK, {"val_loss": 1.0, "train_loss": 123.0}, reserved=("epoch", "train_loss"))


def test_a_report_s_numbers_given_as_tensors_or_numpy_are_numbers_and_the_rest_stays():
    given = {
        "accuracy": torch.tensor(0.5),
        "n": np.int64(3),
        "confusion": [[1]],
        "per_class": {"a": {"precision": np.float32(0.5)}},  # at any depth (was: a traceback at the write)
        "hist": torch.ones(2),
        "note": "x",
    }
    report = checked_report(TASK, given)
    assert report == {
        "accuracy": 0.5,
        "n": 3,
        "confusion": [[1]],
        "per_class": {"a": {"precision": 0.5}},
        "hist": [1.0, 1.0],
        "note": "x",
    }
    assert type(report["accuracy"]) is float and type(report["n"]) is int
    assert json.loads(json.dumps(report)) == report
    assert checked_batch(TASK, None) is None and checked_serving(TASK, None) is None
    pair = (torch.nn.Linear(2, 2), torch.ones(1, 2))
    assert checked_serving(TASK, list(pair)) == pair


class LoadsWhole(ClassificationTask):
    """A built-in task's subclass that loads its data whole."""

    def datasets(self, cfg, store, dataset_uri, manifest):
        return [], []


class StreamsAgain(LoadsWhole):
    """... and its own subclass that streams once more."""

    def stream(self, cfg, manifest):
        return "streamed"


@pytest.mark.parametrize("cls, used", [(LoadsWhole, None), (StreamsAgain, "streamed")])
def test_the_nearest_of_stream_and_datasets_in_the_task_s_classes_is_the_one_used(cls, used):
    """Was: a ClassificationTask subclass's datasets() never called, the built-in stream trained on."""
    assert streamed(cls(), cfg=None, manifest={}) == used
