import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load as load_safetensors

from trainer.evaluate import evaluate_model
from trainer.export import export_model, load_torchscript
from trainer.model_io import load_model, save_model
from trainer.storage import LocalStore, join_uri
from trainer.tasks.classification import ClassificationTask
from trainer.tasks.classification.model import build_mlp
from trainer.tasks.classification.report import classification_report


@pytest.fixture
def trained(tmp_path):
    store = LocalStore()
    torch.manual_seed(0)
    model = build_mlp(4, [8], 3, 0.0)
    meta = {
        "task": "classification",
        "architecture": {"num_features": 4, "hidden_sizes": [8], "num_classes": 3, "dropout": 0.0},
        "classes": ["x", "y", "z"],
        "feature_names": ["f0", "f1", "f2", "f3"],
        "normalization": {"mean": [1.0, 2.0, 3.0, 4.0], "std": [2.0, 2.0, 1.0, 0.5]},
        "dataset_uri": "s3://bucket/ds",
    }
    uri = str(tmp_path / "model")
    save_model(store, uri, model, meta)
    return store, uri, model, meta


def small_csv_dataset(store, tmp_path) -> str:
    """A 60-row, 3-class CSV prepared into a dataset under `tmp_path`; its URI."""
    from trainer.config import DataConfig
    from trainer.tasks.classification.data import prepare_dataset

    rows = ["f0,f1,f2,f3,label"] + [f"{i % 5},{i % 7},{i % 3},{i % 2},{'xyz'[i % 3]}" for i in range(60)]
    store.put_bytes(str(tmp_path / "in.csv"), "\n".join(rows).encode())
    ds = str(tmp_path / "ds")
    prepare_dataset(DataConfig(source=str(tmp_path / "in.csv")), store, ds)
    return ds


def test_report_on_a_known_confusion():
    # truth:      a a a a b b c c c c
    # prediction: a a a b b b c c a c   -> cm = [[3,1,0],[0,2,0],[1,0,3]]
    y_true = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2])
    y_pred = np.array([0, 0, 0, 1, 1, 1, 2, 2, 0, 2])
    r = classification_report(y_true, y_pred, ["a", "b", "c"])
    assert r["confusion_matrix"] == [[3, 1, 0], [0, 2, 0], [1, 0, 3]]
    assert r["accuracy"] == pytest.approx(0.8)
    assert r["per_class"]["a"]["precision"] == pytest.approx(3 / 4)
    assert r["per_class"]["a"]["recall"] == pytest.approx(3 / 4)
    assert r["per_class"]["b"]["precision"] == pytest.approx(2 / 3)
    assert r["per_class"]["b"]["recall"] == pytest.approx(1.0)
    assert r["per_class"]["c"]["precision"] == pytest.approx(1.0)
    assert r["per_class"]["c"]["recall"] == pytest.approx(3 / 4)
    assert r["per_class"]["c"]["support"] == 4


def test_a_class_never_predicted_has_zero_precision_not_nan():
    r = classification_report(np.array([0, 1]), np.array([0, 0]), ["a", "b"])
    assert r["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}


def test_saved_model_loads_back_identically(trained):
    store, uri, model, _ = trained
    loaded, meta = load_model(store, uri)
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded(x), model(x))
    assert meta["classes"] == ["x", "y", "z"]


def test_export_formats_load_and_match_the_pytorch_model(trained, tmp_path):
    store, uri, model, meta = trained
    out = str(tmp_path / "export")
    card = export_model(store, uri, out, metrics={"accuracy": 0.9}, training_config={"train": {"epochs": 1}})
    raw = torch.randn(16, 4) * 3 + 2
    norm = meta["normalization"]
    expected = model((raw - torch.tensor(norm["mean"])) / torch.tensor(norm["std"]))
    scripted = load_torchscript(store, out)
    torch.testing.assert_close(scripted(raw), expected)
    state = load_safetensors(store.get_bytes(join_uri(out, "model.safetensors")))
    rebuilt = build_mlp(4, [8], 3, 0.0)
    rebuilt.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    torch.testing.assert_close(rebuilt((raw - state["mean"]) / state["std"]), expected)
    on_disk = json.loads(store.get_bytes(join_uri(out, "model_card.json")))
    assert on_disk == card
    assert card["classes"] == ["x", "y", "z"]
    assert card["inputs"] == {"name": "features", "dtype": "float32", "shape": [-1, 4]}
    assert card["outputs"] == {"name": "logits", "dtype": "float32", "shape": [-1, 3]}
    # ONNX, loaded as a serving runtime would, on a batch size it was not traced with.
    import onnxruntime

    session = onnxruntime.InferenceSession(
        store.get_bytes(join_uri(out, card["files"]["onnx"])), providers=["CPUExecutionProvider"]
    )
    (logits,) = session.run(None, {"features": raw.numpy()})
    torch.testing.assert_close(torch.from_numpy(logits), expected, rtol=1e-4, atol=1e-5)
    config = store.get_bytes(join_uri(out, "model_repository/kftrain/config.pbtxt")).decode()
    assert 'platform: "onnxruntime_onnx"' in config
    assert 'name: "features" data_type: TYPE_FP32 dims: [ -1, 4 ]' in config
    assert 'name: "logits" data_type: TYPE_FP32 dims: [ -1, 3 ]' in config
    assert card["verification"]["onnx_max_abs_error"] < 1e-4
    assert card["metrics"] == {"accuracy": 0.9}
    assert card["source_dataset_uri"] == "s3://bucket/ds"
    assert card["training_config"] == {"train": {"epochs": 1}}


def test_evaluate_model_writes_its_report(trained, tmp_path):
    store, uri, model, meta = trained
    ds = small_csv_dataset(store, tmp_path)
    report = evaluate_model(store, uri, ds, str(tmp_path / "eval"))
    assert json.loads(store.get_bytes(str(tmp_path / "eval/metrics.json"))) == report
    assert report["test_rows"] == sum(sum(r) for r in report["confusion_matrix"])


# -- what the KFP UI gets from the evaluate component ------------------------------------------


def test_ui_scalars_say_what_they_measure_and_name_the_class():
    from trainer.evaluate import ui_scalars

    report = classification_report(np.array([0, 1, 2, 2]), np.array([0, 1, 2, 1]), ["3", "cat dog", "cat/dog"])
    report.update(loss=0.25, test_rows=4, task="classification")
    names = ui_scalars(report)
    assert {"test_accuracy", "test_loss", "test_macro_f1", "test_rows"} <= set(names)
    assert names["test_accuracy"] == 0.75 and "test_test_rows" not in names
    assert names["test_class_3_precision"] == 1.0 and names["test_class_3_recall"] == 1.0
    assert names["test_class_cat_dog_recall"] == 1.0  # "cat dog"
    assert names["test_class_cat_dog_2_recall"] == 0.5  # "cat/dog" collides after cleaning: its index
    assert not [n for n in names if re.fullmatch(r"(precision|recall)_\d+", n)]
    # A name that an earlier class's index made its own (was: `a!!` overwrote `a 2`'s measures).
    report = classification_report(np.array([0, 1, 2]), np.array([0, 1, 1]), ["a!", "a 2", "a!!"])
    names = ui_scalars(report)
    assert len([n for n in names if n.startswith("test_class_")]) == 9
    assert names["test_class_a_2_recall"] == 1.0 and names["test_class_a_2_2_recall"] == 0.0


def test_ui_scalars_leave_out_text_such_as_the_generations():
    from trainer.evaluate import ui_scalars

    report = {
        "loss": 2.0,
        "perplexity": 7.4,
        "test_tokens": 640,
        "generations": [{"prompt": "1", "before": "2", "after": "3"}],
        "task": "causal_lm",
        "model_uri": "s3://b/m",
    }
    assert ui_scalars(report) == {"test_loss": 2.0, "test_perplexity": 7.4, "test_tokens": 640.0}


def test_the_confusion_matrix_reaches_classification_metrics_in_the_shape_the_kfp_ui_renders(trained, tmp_path):
    """Through the component function itself (KFP's `python_func`), with real artifact objects."""
    from kfp.dsl import HTML, ClassificationMetrics, Dataset, Metrics, Model

    from components.evaluate import evaluate

    store, uri, _, meta = trained
    ds = small_csv_dataset(store, tmp_path)
    store.put_bytes(join_uri(uri, "model.json"), json.dumps({**meta, "dataset_uri": ds}).encode())  # trained on it
    store.put_bytes(join_uri(uri, "training.json"), json.dumps({"metrics": {}, "loss_curve": []}).encode())
    metrics, confusion = Metrics(uri=str(tmp_path / "evaluation")), ClassificationMetrics(uri=str(tmp_path / "cm"))
    report = HTML(uri=str(tmp_path / "report.html"))
    out = evaluate.python_func(
        dataset=Dataset(uri=ds), model=Model(uri=uri), metrics=metrics, confusion=confusion, report=report,
        run_id="run-1", task_name="evaluate",
    )  # fmt: skip
    saved = json.loads(store.get_bytes(str(tmp_path / "evaluation" / "metrics.json")))
    # The structure KFP's executor records in ML Metadata and the UI's confusion-matrix view reads.
    assert confusion.metadata == {
        "confusionMatrix": {
            "annotationSpecs": [{"displayName": c} for c in ["x", "y", "z"]],
            "rows": [{"row": row} for row in saved["confusion_matrix"]],
        }
    }
    assert sum(sum(r["row"]) for r in confusion.metadata["confusionMatrix"]["rows"]) == saved["test_rows"]
    assert metrics.metadata["test_accuracy"] == pytest.approx(saved["accuracy"])
    assert {"test_loss", "test_macro_f1", "test_class_x_precision", "test_class_z_f1"} <= set(metrics.metadata)
    assert all(isinstance(v, float) for v in metrics.metadata.values())
    assert out.passed is True
    page = store.get_bytes(str(tmp_path / "report.html")).decode()
    assert 'aria-label="confusion matrix"' in page and "run-1/evaluate" in page


class ServedFromItsOwnFiles(ClassificationTask):
    """A task with no serving module: serving loads its `extra_exports` (here, the first weight)."""

    def serving_module(self, model, meta):
        return None

    def extra_exports(self, model, meta):
        return {"served/first_weight.json": json.dumps(model[0].weight.tolist()).encode()}


@pytest.mark.parametrize("failing", ["TorchScript", "ONNX"])
def test_a_format_that_fails_its_check_leaves_nothing_published(trained, tmp_path, monkeypatch, failing):
    """Every format is checked before any is written: a failed check once left `model.pt` beside
    no model card, where a server watching the folder would pick it up."""
    import trainer.export as export

    check = export._check

    def failing_check(name, got, expected):
        if name == failing:
            raise export.ExportError(f"{name} output differs")
        return check(name, got, expected)

    monkeypatch.setattr(export, "_check", failing_check)
    store, uri, _, _ = trained
    with pytest.raises(export.ExportError, match=failing):
        export_model(store, uri, str(tmp_path / "export"))
    assert not (tmp_path / "export").exists() or not any((tmp_path / "export").rglob("*"))


def test_a_task_without_a_serving_module_exports_its_own_files_from_the_loaded_weights(trained, tmp_path):
    store, uri, model, meta = trained
    meta = {**meta, "task": f"{__name__}:ServedFromItsOwnFiles"}
    store.put_bytes(join_uri(uri, "model.json"), json.dumps(meta).encode())
    out = str(tmp_path / "export")
    card = export_model(store, uri, out)
    assert sorted(p.relative_to(out).as_posix() for p in (tmp_path / "export").rglob("*") if p.is_file()) == [
        "model_card.json",
        "served/first_weight.json",
    ]
    # The trained weights, not a freshly initialised model's.
    assert json.loads(store.get_bytes(join_uri(out, "served/first_weight.json"))) == model[0].weight.tolist()
    assert card["files"] == {"extra": ["served/first_weight.json"]} and card["classes"] == ["x", "y", "z"]


@pytest.mark.parametrize(
    ("expected", "got", "passes"),
    [
        ([1e12, -3e11], [1e12 + 6e6, -3e11], True),  # large logits: float32's rounding, 6e-6 of them (was refused)
        ([0.5, -0.25], [0.5 + 5e-5, -0.25], True),
        ([0.5, -0.25], [0.5 + 1e-3, -0.25], False),  # small outputs: still held to 1e-4
        ([1e4, 1.0], [1e4 * (1 + 1e-3), 1.0], False),  # 0.1% off: wrong, however large
        ([1.0, 2.0], [float("nan"), 2.0], False),
        ([float("nan"), 2.0], [float("nan"), 2.0], False),  # the same NaN: no model to serve
        ([float("inf"), 2.0], [float("-inf"), 2.0], False),
        ([1.0, 2.0], [float("inf"), 2.0], False),
    ],
)
def test_an_exported_format_is_held_to_a_relative_and_an_absolute_tolerance(expected, got, passes):
    import numpy as np

    from trainer.export import ExportError, _check

    expected, got = np.array(expected, dtype=np.float32), np.array(got, dtype=np.float32)
    if passes:
        _check("ONNX", got, expected)
    else:
        with pytest.raises(ExportError, match="ONNX output"):
            _check("ONNX", got, expected)


@pytest.mark.parametrize(
    ("task", "trained_on", "given", "refused"),
    [
        ("classification", "DS", "DS", None),
        ("classification", "s3://bkt/run/data-prep/dataset", "minio://bkt/run/data-prep/dataset/", None),  # one bucket
        ("classification", None, "DS", None),  # a model from before its dataset was recorded
        # Another run's dataset of the same source: its test split holds rows the model trained on.
        ("classification", "s3://bkt/run-a/dataset", "DS", "dataset: DS is not the dataset the model at MODEL trained"),
        # The config of another task: its gate and report would follow the config (was: a KeyError, late).
        ("causal_lm", "DS", "DS", "config: task 'causal_lm', but the model at MODEL is a 'classification' model"),
    ],
)
def test_the_evaluate_step_refuses_inputs_that_are_not_one_run_s(trained, tmp_path, task, trained_on, given, refused):
    from trainer.config import ConfigError, load_config
    from trainer.pipeline_steps import check_evaluation_inputs

    store, uri, _, meta = trained
    ds = str(tmp_path / "ds")
    recorded = {**meta, "dataset_uri": trained_on.replace("DS", ds)} if trained_on else dict(meta, dataset_uri="")
    store.put_bytes(join_uri(uri, "model.json"), json.dumps(recorded).encode())
    cfg = load_config(overrides={"task": task})
    if refused is None:
        check_evaluation_inputs(cfg, store, uri, given.replace("DS", ds))
        return
    with pytest.raises(ConfigError) as err:
        check_evaluation_inputs(cfg, store, uri, given.replace("DS", ds))
    assert str(err.value).startswith(refused.replace("DS", ds).replace("MODEL", uri)), err.value


def test_export_refuses_another_model_s_evaluation(trained, tmp_path):
    """Its numbers went into this model's card (was: accepted, the card naming this model)."""
    from kfp.dsl import Metrics, Model

    from components.export import export
    from trainer.config import ConfigError

    store, uri, _, _ = trained
    evaluation = tmp_path / "evaluation"
    store.put_bytes(
        str(evaluation / "metrics.json"), json.dumps({"accuracy": 0.99, "model_uri": "/other/model"}).encode()
    )
    with pytest.raises(ConfigError, match=r"^metrics: the evaluation at .* scored the model at /other/model, not "):
        export.python_func(
            metrics=Metrics(uri=str(evaluation)), model=Model(uri=uri), exported=Model(uri=str(tmp_path / "x"))
        )


@pytest.mark.parametrize("step", ["evaluate", "export"])
@pytest.mark.parametrize(
    ("files", "said"),
    [
        # Another artifact wired into the step's `model` input (was: "no file at .../model.json", or
        # at .../training.json for export, alone).
        ({}, "is not a model kftrain's train step wrote; give the step the `model` output of train"),
        ({"model.json": b"{not json"}, "is not a valid kftrain model's model.json"),
        ({"model.json": b"[1, 2]"}, "is not a kftrain model's model.json (a JSON object)"),  # was: AttributeError
        ({"model.json": b"{}", "training.json": b"[]"}, "is not a kftrain model's training.json (a JSON object)"),
    ],
)
def test_a_model_input_kftrain_did_not_write_is_named_with_the_fix(tmp_path, step, files, said):
    """Through the pipeline steps themselves, before any scoring."""
    from trainer import pipeline_steps
    from trainer.config import load_config
    from trainer.storage import CorruptObject, ObjectNotFound

    folder = tmp_path / "someone-elses-model"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"weights of another kind")
    for name, content in files.items():
        (folder / name).write_bytes(content)
    cfg = load_config(None, {})
    with pytest.raises((ObjectNotFound, CorruptObject), match=re.escape(said)):
        if step == "evaluate":
            pipeline_steps.evaluate(
                cfg, str(folder), str(tmp_path / "dataset"), str(tmp_path / "m"), str(tmp_path / "r")
            )
        else:
            pipeline_steps.export(cfg, str(folder), str(tmp_path / "out"), {})
