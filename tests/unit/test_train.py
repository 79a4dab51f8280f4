"""The training loop (trainer/train.py) in one process: non-finite losses, accumulation, the GPT task, export."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import warnings

import numpy as np
import pytest
import torch

from trainer.config import EPOCH_METRICS, ConfigError, load_config
from trainer.distributed import DistEnv
from trainer.evaluate import evaluate_model
from trainer.export import export_model, load_torchscript
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri
from trainer.tasks import get_task
from trainer.tasks.classification.data import load_split
from trainer.train import NonFiniteLoss, _resumed_epoch_loss, run_training

pytestmark = pytest.mark.timeout(120)


def test_skip_gives_up_after_max_consecutive_skips(digits, tmp_path):
    from trainer.distributed import DistEnv
    from trainer.tasks import get_task
    from trainer.train import NonFiniteLoss, run_training

    class Diverged(type(get_task("classification"))):
        def loss(self, model, batch):
            return super().loss(model, batch) * float("nan")

    cfg = load_config(
        overrides={
            "train.on_nonfinite": "skip",
            "train.max_consecutive_skips": 4,
            "train.epochs": 1,
            "checkpoint.enabled": False,
        }
    )
    with warnings.catch_warnings(record=True) as caught, pytest.raises(NonFiniteLoss) as err:
        warnings.simplefilter("always")
        run_training(cfg, digits, str(tmp_path / "model"), DistEnv(), task=Diverged())
    # Skipped updates advance the schedule without torch blaming the user's call order.
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)], [str(w.message) for w in caught]
    msg = str(err.value)
    assert "4 updates in a row skipped" in msg and "optimizer step 4" in msg and "rank" in msg, msg
    assert "train.max_consecutive_skips 4" in msg
    # Nothing written as if it had succeeded (the live TensorBoard curves may be there: they show the divergence).
    assert not any(
        (tmp_path / "model" / name).exists() for name in ("model.json", "model.safetensors", "training.json")
    )


pytestmark = pytest.mark.timeout(240)


def poison_first_train_shard(src: str, dst: str) -> None:
    """Copy a dataset, turning one training row into NaNs."""
    store = LocalStore()
    for uri in store.list(src):
        store.put_bytes(dst + uri[len(src) :], store.get_bytes(uri))
    manifest = json.loads(store.get_bytes(join_uri(dst, "manifest.json")))
    entry = manifest["splits"]["train"]["shards"][0]
    with np.load(io.BytesIO(store.get_bytes(join_uri(dst, entry["name"])))) as z:
        x, y = z["x"].copy(), z["y"]
    x[5] = np.nan
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    raw = buf.getvalue()
    store.put_bytes(join_uri(dst, entry["name"]), raw)
    # A legitimate dataset that holds a NaN: its manifest describes the shard as written.
    entry.update(bytes=len(raw), sha256=hashlib.sha256(raw).hexdigest())
    store.put_bytes(join_uri(dst, "manifest.json"), json.dumps(manifest).encode())


def single(cfg, dataset, model_uri):
    return run_training(cfg, dataset, model_uri, DistEnv())


TINY_GPT = {
    "task": "causal_lm",
    "data.max_bytes": 150_000,
    "model.n_layer": 2,
    "model.n_head": 4,
    "model.n_embd": 64,
    "model.block_size": 64,
    "train.batch_size": 16,
    "train.learning_rate": 0.003,
    "train.max_steps": 60,
    "train.warmup_steps": 10,
    "train.lr_schedule": "cosine",
    "job.replicas": 1,
    "checkpoint.enabled": False,
}


def test_nonfinite_loss_can_skip_the_update(digits, tmp_path):
    bad = str(tmp_path / "bad")
    poison_first_train_shard(digits, bad)
    cfg = load_config(
        overrides={"job.replicas": 1, "train.epochs": 2, "train.on_nonfinite": "skip", "checkpoint.enabled": False}
    )
    metrics = single(cfg, bad, str(tmp_path / "m"))
    assert metrics["skipped_steps"] == 2  # the poisoned row's batch, once per epoch
    # The skipped update's loss is no part of the epoch's (was: NaN, which then failed the step
    # when KFP's metrics could not hold it: a probe).
    history = json.loads((tmp_path / "m" / "training.json").read_text())["history"]
    assert len(history) == 2 and all(math.isfinite(e["train_loss"]) for e in history), history
    assert math.isfinite(metrics["train_loss"])
    model, _ = load_model(LocalStore(), str(tmp_path / "m"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_batch_size_must_divide_by_world_size_and_accumulation():
    with pytest.raises(
        ConfigError, match="train.batch_size: must divide by the world size 2 .* x train.grad_accum_steps 3"
    ):
        load_config(overrides={"train.grad_accum_steps": 3})


def test_runtime_world_size_is_checked_too(digits, tmp_path):
    cfg = load_config(overrides={"job.replicas": 1, "train.batch_size": 63})
    with pytest.raises(ConfigError, match="must divide by world size 2"):
        run_training(cfg, digits, str(tmp_path / "m"), DistEnv(rank=0, world_size=2))


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_the_learning_rate_logged_at_a_step_is_the_one_that_step_used(digits, tmp_path, schedule):
    """The rate was read after the schedule moved on: step 1 of a warm-up of 2 showed the full rate
    (its 1.5e-3 of 3e-3 never appeared) in the log, training.json and TensorBoard."""
    from trainer.train import lr_factor

    overrides = {
        "job.replicas": 1,
        "train.max_steps": 6,
        "train.warmup_steps": 2,
        "train.lr_schedule": schedule,
        "train.log_interval_steps": 1,
        "checkpoint.enabled": False,
    }
    cfg = load_config(overrides=overrides)
    single(cfg, digits, str(tmp_path / "m"))
    curve = json.loads((tmp_path / "m" / "training.json").read_text())["loss_curve"]
    expected = [cfg.train.learning_rate * lr_factor(step - 1, 6, cfg) for step in range(1, 7)]
    assert [point["lr"] for point in curve] == pytest.approx(expected), curve
    assert curve[0]["lr"] == pytest.approx(cfg.train.learning_rate / 2)


@pytest.mark.parametrize(("max_steps", "after"), [(25, True), (19, False)])  # an epoch is 19 steps here
def test_the_record_scores_the_model_written_when_the_run_ends_after_an_epoch(digits, tmp_path, max_steps, after):
    """`max_steps` past an epoch's end, not on one: val_* and train_loss were the last epoch's, a
    model 6 steps older than the one written, given as the run's (KFP's metrics, training.json)."""
    from trainer.report import AFTER_LAST_EPOCH, _training_measures

    overrides = {"job.replicas": 1, "train.batch_size": 64, "train.max_steps": max_steps, "checkpoint.enabled": False}
    single(load_config(overrides=overrides), digits, str(tmp_path / "m"))
    record = json.loads((tmp_path / "m" / "training.json").read_text())
    metrics, last_epoch = record["metrics"], record["history"][-1]
    assert len(record["history"]) == 1 and metrics["steps"] == max_steps
    assert (metrics["train_loss"] != last_epoch["train_loss"]) == after, (metrics, last_epoch)
    assert metrics.get(AFTER_LAST_EPOCH) == (max_steps if after else None)
    model, _ = load_model(LocalStore(), str(tmp_path / "m"))
    x, y = load_split(LocalStore(), digits, "val")
    with torch.no_grad():
        accuracy = float((model(torch.from_numpy(x)).argmax(-1) == torch.from_numpy(y)).float().mean())
    assert metrics["val_accuracy"] == pytest.approx(accuracy)  # the model written, scored
    labels = dict(_training_measures(record))
    said = "validation accuracy (at step 25, the end of training, after the last epoch)"
    assert (said in labels) == after and ("validation accuracy (last epoch)" in labels) != after, labels


def test_a_run_of_no_whole_epoch_records_its_training_loss(digits, tmp_path):
    """`max_steps` inside the first epoch: the record had val_* but no train_loss (a probe)."""
    overrides = {
        "job.replicas": 1,
        "train.batch_size": 64,
        "train.max_steps": 10,  # an epoch is 19 steps here
        "train.log_interval_steps": 1,
        "checkpoint.enabled": False,
    }
    single(load_config(overrides=overrides), digits, str(tmp_path / "m"))
    record = json.loads((tmp_path / "m" / "training.json").read_text())
    losses = [point["loss"] for point in record["loss_curve"]]
    assert record["history"] == [] and len(losses) == 10
    assert record["metrics"]["train_loss"] == pytest.approx(sum(losses) / 10)


@pytest.mark.parametrize(
    ("device", "given", "env"), [("cuda", None, ":4096:8"), ("cuda", ":16:8", ":16:8"), ("cpu", None, None)]
)
def test_deterministic_mode_on_a_gpu_sets_cublas_workspace(monkeypatch, device, given, env):
    """torch refuses the first cuBLAS matmul in deterministic mode without CUBLAS_WORKSPACE_CONFIG
    (was: a traceback on every rank of a GPU run with train.deterministic)."""
    from trainer.train import use_deterministic_algorithms

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    if given:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", given)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on: None)  # the process's mode stays
    use_deterministic_algorithms(torch.device(device))
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == env


def test_gradient_accumulation_matches_one_big_batch(digits, tmp_path):
    base = {"job.replicas": 1, "train.epochs": 2, "checkpoint.enabled": False}
    single(load_config(overrides=base), digits, str(tmp_path / "a"))
    single(load_config(overrides={**base, "train.grad_accum_steps": 4}), digits, str(tmp_path / "b"))
    a, _ = load_model(LocalStore(), str(tmp_path / "a"))
    b, _ = load_model(LocalStore(), str(tmp_path / "b"))
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-5)


def test_gpt_task_learns_on_a_tiny_shape(tmp_path):
    cfg = load_config(overrides=TINY_GPT)
    store = LocalStore()
    ds, model_uri = str(tmp_path / "ds"), str(tmp_path / "model")
    manifest = get_task("causal_lm").prepare(cfg, store, ds)
    assert manifest["vocab_size"] == 256 and manifest["splits"]["train"]["tokens"] > 100_000
    metrics = single(cfg, ds, model_uri)
    uniform = math.log(256)
    assert metrics["val_loss"] < 0.7 * uniform  # well below guessing bytes uniformly
    assert metrics["tokens_per_second"] > 0
    report = evaluate_model(store, model_uri, ds, str(tmp_path / "eval"))
    assert report["perplexity"] == pytest.approx(math.exp(report["loss"]))
    assert report["loss"] < 0.7 * uniform
    card = export_model(store, model_uri, str(tmp_path / "export"))
    assert card["inputs"] == {"name": "tokens", "dtype": "int64", "shape": [-1, -1], "max_length": 64}
    assert card["verification"]["onnx_max_abs_error"] < 1e-4
    scripted = load_torchscript(store, str(tmp_path / "export"))
    model, _ = load_model(store, model_uri)
    x = torch.randint(0, 256, (2, 64))
    torch.testing.assert_close(scripted(x), model(x))
    record = json.loads(store.get_bytes(join_uri(model_uri, "training.json")))
    assert record["config"]["task"] == "causal_lm"
    # What the task validates is what keep_best may name (the run ends within its first epoch).
    assert {k for k in metrics if k.startswith("val_")} == {m for m in EPOCH_METRICS["causal_lm"] if m != "train_loss"}


def test_gpt_default_shape_is_gpt2_small():
    from trainer.gpt import GPT, GPTConfig

    with torch.device("meta"):  # the shapes alone: 124M parameters neither allocated nor initialised
        model = GPT(GPTConfig(vocab_size=50257))
    assert 123e6 < model.num_params() < 125e6  # GPT-2 small: 124M parameters


def test_a_user_task_by_import_path():
    with pytest.raises(ConfigError, match="task: cannot import 'nowhere.module:Task'"):
        get_task("nowhere.module:Task")
    assert get_task("trainer.tasks.classification:ClassificationTask").name == "classification"


def test_gpt_export_loads_in_hugging_face_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = load_config(overrides={**TINY_GPT, "train.max_steps": 5, "train.warmup_steps": 2})
    store = LocalStore()
    ds, model_uri, out = str(tmp_path / "ds"), str(tmp_path / "model"), str(tmp_path / "export")
    get_task("causal_lm").prepare(cfg, store, ds)
    single(cfg, ds, model_uri)
    card = export_model(store, model_uri, out)
    assert "huggingface/config.json" in card["files"]["extra"]
    folder = tmp_path / "export" / "huggingface"
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours, _ = load_model(store, model_uri)
    x = torch.randint(0, 256, (2, 64))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, ours(x), rtol=1e-4, atol=1e-4)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "def héllo(wörld):\n    return 42"
    assert tok.encode(text) == list(text.encode("utf-8"))  # id = byte, as in training
    assert tok.decode(list(text.encode("utf-8"))) == text


def _dist_backend_error() -> BaseException:
    return torch.distributed.DistBackendError("[Rank 1] Watchdog caught collective operation timeout")


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (lambda: NonFiniteLoss("non-finite loss at step 7"), 3),
        (lambda: ConfigError("data.text_column: 'body' is not a column"), 1),
        # gloo's timeout as torch 2.13 raises it: a plain RuntimeError
        (
            lambda: RuntimeError(
                "[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv "
                "operation to complete"
            ),
            4,
        ),
        (_dist_backend_error, 4),
        # the TCPStore on the Master's pod gone (its node lost): a lost peer, not the run's fault
        (lambda: torch.distributed.DistStoreError("Failed to recv, got 0 bytes. Connection was likely closed."), 4),
    ],
    ids=["nonfinite", "user error", "gloo timeout", "nccl backend error", "store lost"],
)
def test_main_exits_with_the_code_of_the_cause(monkeypatch, raised, code):
    """The launcher tells the causes apart by these codes (trainer/exit_codes.py)."""
    import trainer.train as train
    from trainer import exit_codes
    from trainer.config import config_to_json

    def fail(*args, **kwargs):
        raise raised()

    monkeypatch.setattr(train, "run_training", fail)
    argv = ["--config-json", config_to_json(load_config()), "--dataset-uri", "d", "--model-uri", "m"]
    assert train.main(argv) == code
    assert code in (exit_codes.NONFINITE_LOSS, exit_codes.USER_ERROR, exit_codes.COLLECTIVE_TIMEOUT)


def test_main_lets_an_unknown_error_raise(monkeypatch):
    import trainer.train as train
    from trainer.config import config_to_json

    def fail(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(train, "run_training", fail)
    with pytest.raises(RuntimeError, match="CUDA error"):
        train.main(["--config-json", config_to_json(load_config()), "--dataset-uri", "d", "--model-uri", "m"])


def test_keep_best_keeps_the_best_epoch_through_pruning_and_a_restart_and_export_best_writes_it(digits, tmp_path):
    from trainer.checkpoint import CheckpointManager, step_dir

    store, model = LocalStore(), str(tmp_path / "m")
    prefix = join_uri(model, "checkpoints")
    # Lowest accuracy as "best" puts the best epoch early, where keep_last: 1 would prune it.
    base = {"job.replicas": 1, "checkpoint.keep_last": 1, "checkpoint.keep_best": "min:val_accuracy"}

    def kept_and_best(epochs: int) -> tuple[set[int], int, float]:
        record = json.loads(store.get_bytes(join_uri(model, "training.json")))
        per_epoch = record["metrics"]["steps"] // epochs
        assert all(set(h) == {"epoch", *EPOCH_METRICS["classification"]} for h in record["history"])
        scores = [(h["val_accuracy"], h["epoch"]) for h in record["history"]]
        value, epoch = min(scores)  # the earliest of equal scores, as keep_best takes it
        kept = {int(uri.split("/step-")[1][:8]) for uri in store.list(prefix) if "/step-" in uri}
        return kept, (epoch + 1) * per_epoch, value

    single(load_config(overrides={**base, "train.epochs": 3}), digits, model)
    kept, best, _ = kept_and_best(3)
    assert kept == {best, record_steps(store, model)} and best < record_steps(store, model)
    # The run goes on (a restart resumes from its checkpoint) for two more epochs; its model is the best's.
    metrics = single(load_config(overrides={**base, "train.epochs": 5, "checkpoint.export_best": True}), digits, model)
    kept, best, value = kept_and_best(5)
    assert kept == {best, metrics["steps"]} and metrics["best_step"] == best < metrics["steps"]
    # The restart's record has every epoch's validation at its step, which the report draws (was:
    # only the restart's own two epochs).
    validation = json.loads(store.get_bytes(join_uri(model, "training.json")))["progress"]["validation"]
    assert [v["step"] for v in validation] == [metrics["steps"] // 5 * (e + 1) for e in range(5)]
    assert metrics["val_accuracy"] == value
    exported, _ = load_model(store, model)
    state = {"model": {k: torch.zeros_like(v) for k, v in exported.state_dict().items()}}
    mgr = CheckpointManager(store, prefix)
    mgr.load(json.loads(store.get_bytes(join_uri(step_dir(prefix, best), "COMMIT.json"))), state)
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def test_a_start_that_resumes_a_finished_training_records_no_timing(digits, tmp_path):
    """A start of no step (an export that failed after training, resumed) has no throughput or
    first step (was: "first optimizer step at" the resume, "training time 0 ms", 0 samples/s)."""
    store, model = LocalStore(), str(tmp_path / "m")
    cfg = load_config(overrides={"job.replicas": 1, "train.epochs": 1})
    first = single(cfg, digits, model)
    again = single(cfg, digits, model)
    timing = ("samples_per_second", "train_seconds", "seconds_to_first_step", "first_step_unix_time")
    assert all(key in first for key in timing) and not any(key in again for key in timing), again
    assert again["resumed_from_step"] == again["steps"] == first["steps"] == record_steps(store, model)


def test_the_settings_each_resume_changed_reach_the_record_the_card_and_the_report(digits, tmp_path, caplog):
    """The training record's config is the last start's: a run resumed with another learning rate
    (and then resumed again at its last step with yet another) recorded that one alone, and the
    model card and report claimed the weights trained under it. Each start's changes are kept, at
    the step they took effect, through later resumes."""
    from trainer.report import html_report

    store, model, out = LocalStore(), str(tmp_path / "m"), str(tmp_path / "exported")
    base = {"job.replicas": 1, "train.epochs": 1}
    first = single(load_config(overrides=base), digits, model)
    per_epoch = first["steps"]
    # Where and when it saves is no setting the steps trained under: said in the log, not recorded.
    single(
        load_config(overrides={**base, "train.epochs": 2, "train.learning_rate": 0.01, "checkpoint.keep_last": 5}),
        digits,
        model,
    )
    # At the last step: nothing is left to train, said, and the change is recorded as such.
    with caplog.at_level("WARNING", logger="kftrain.train"):
        single(load_config(overrides={**base, "train.epochs": 2, "train.learning_rate": 0.02}), digits, model)
    assert (
        f"resumed at step {2 * per_epoch}, where training ends: no step trains under the changed train.learning_rate"
        in caplog.text
    )
    record = json.loads(store.get_bytes(join_uri(model, "training.json")))
    assert record["config"]["train"]["learning_rate"] == 0.02
    assert record["config_changes"] == [
        {"at_step": per_epoch, "field": "train.epochs", "from": 1, "to": 2},
        {"at_step": per_epoch, "field": "train.learning_rate", "from": 0.003, "to": 0.01},
        {"at_step": 2 * per_epoch, "field": "train.learning_rate", "from": 0.01, "to": 0.02},
    ]
    page = html_report(record, {}, (True, ""))
    assert f"<td>{per_epoch}</td><td>train.learning_rate</td><td>0.003</td><td>0.01</td>" in page
    assert f"<td>{2 * per_epoch} (the last: no step trained with it)</td><td>train.learning_rate</td>" in page
    card = export_model(store, model, out, training={"config_changes": record["config_changes"]})
    assert card["training"]["config_changes"] == record["config_changes"]
    # An uninterrupted run has none.
    other = str(tmp_path / "fresh")
    single(load_config(overrides=base), digits, other)
    fresh = json.loads(store.get_bytes(join_uri(other, "training.json")))
    assert fresh["config_changes"] == [] and "changed when the run resumed" not in html_report(fresh, {}, (True, ""))


def test_export_best_ranks_every_run_a_chain_of_resumes_came_through(digits, tmp_path, caplog):
    """Three runs, each begun from the one before's last checkpoint: the third ranks the first's
    checkpoints too (was: one level back, the second's only), and its model is that best's."""
    from trainer.checkpoint import CheckpointManager, step_dir

    store = LocalStore()
    best_of = {"job.replicas": 1, "checkpoint.keep_last": 1, "checkpoint.keep_best": "min:val_accuracy"}
    models = [str(tmp_path / name) for name in ("a", "b", "c")]
    resume_from = ""
    for epochs, model in zip((1, 2, 3), models, strict=True):
        overrides = {**best_of, "train.epochs": epochs, "checkpoint.export_best": True}
        with caplog.at_level(logging.INFO, logger="kftrain"):
            metrics = single(load_config(overrides={**overrides, "checkpoint.resume_from": resume_from}), digits, model)
        resume_from = step_dir(join_uri(model, "checkpoints"), metrics["steps"])
    first = join_uri(models[0], "checkpoints")
    history = json.loads(store.get_bytes(join_uri(models[2], "training.json")))["history"]
    per_epoch = metrics["steps"] // 3
    value, epoch = min((h["val_accuracy"], h["epoch"]) for h in history)
    assert epoch == 0, history  # the premise: the best is the first run's, two runs back
    assert metrics["best_step"] == per_epoch and metrics["val_accuracy"] == value
    assert f"from {first}, further back in its resumes" in caplog.text  # two runs back, not the one it resumed from
    exported, _ = load_model(store, models[2])
    state = {"model": {k: torch.zeros_like(v) for k, v in exported.state_dict().items()}}
    CheckpointManager(store, first).load(
        json.loads(store.get_bytes(join_uri(step_dir(first, per_epoch), "COMMIT.json"))), state
    )
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, state["model"][name]), name


def record_steps(store, model_uri) -> int:
    return json.loads(store.get_bytes(join_uri(model_uri, "training.json")))["metrics"]["steps"]


@pytest.mark.parametrize("max_steps", [1, 6], ids=["one-step", "six-steps"])
def test_a_run_records_its_peak_memory_and_median_step_time(digits, tmp_path, max_steps):
    """What the report sets the plan against: on the CPU the peak is measured over one step (the
    second, or the only one), and it holds at least the weights, their gradients and AdamW's two
    moments (16 bytes per fp32 parameter); the median leaves that measured step out."""
    cfg = load_config(overrides={"job.replicas": 1, "train.max_steps": max_steps, "checkpoint.enabled": False})
    metrics = single(cfg, digits, str(tmp_path / "m"))
    model, _ = load_model(LocalStore(), str(tmp_path / "m"))
    state_bytes = 16 * sum(p.numel() for p in model.parameters())
    assert state_bytes <= metrics["peak_memory_bytes"] < 50 * state_bytes
    if max_steps == 1:
        assert "median_step_seconds" not in metrics  # its only step was the measured one
    else:
        assert 0 < metrics["median_step_seconds"] < metrics["train_seconds"]


# -- what a resume continues: the step limit, the same inputs, the same model -------------------

# (checkpoint step, its position (epochs done, steps into the next), overrides, refused with)
STEPS_LEFT_CASES = {
    "max_steps past it": (5, (0, 5), {"train.max_steps": 8}, None),
    "max_steps before it": (5, (0, 5), {"train.max_steps": 3}, "train.max_steps 3 ends before"),
    "max_steps at it: its model written": (5, (0, 5), {"train.max_steps": 5}, None),
    "epochs past it": (40, (2, 0), {"train.epochs": 3}, None),
    "epochs before it": (40, (2, 0), {"train.epochs": 1}, "train.epochs 1 ends before"),
    "epochs before it, mid-epoch": (45, (2, 5), {"train.epochs": 2}, "train.epochs 2 ends before"),
    "epochs at it: its model written": (40, (2, 0), {"train.epochs": 2}, None),
    "mid-epoch, the epoch left to train": (7, (0, 7), {"train.epochs": 1}, None),
}


@pytest.mark.parametrize(
    ("step", "position", "overrides", "refused"), STEPS_LEFT_CASES.values(), ids=STEPS_LEFT_CASES.keys()
)
def test_a_resume_under_a_step_limit_before_the_checkpoint_is_refused(step, position, overrides, refused):
    """Was: resumed, trained nothing, exited 0 and exported the checkpoint's model under a config
    that says fewer steps."""
    from trainer.checkpoint import CheckpointError
    from trainer.train import check_steps_left

    record = {"step": step, "position": {"epoch": position[0], "epoch_step": position[1]}}
    cfg = load_config(overrides=overrides)
    if refused is None:
        check_steps_left(record, cfg, "start without resume_from")
        return
    with pytest.raises(CheckpointError, match=refused) as err:
        check_steps_left(record, cfg, "start without resume_from")
    assert f"the checkpoint's step {step}" in str(err.value) and str(err.value).endswith("start without resume_from")


# (what the checkpoint recorded, what the run has now, a changed data.shard_rows; refused with)
INPUT_CASES = {
    "the same": ({"dataset": "a", "base_model": "w"}, {"dataset": "a", "base_model": "w"}, None, None),
    "other data": ({"dataset": "a"}, {"dataset": "b"}, None, "holds other items than the checkpoint's"),
    "other data, other shards": ({"dataset": "a"}, {"dataset": "b"}, 64, r"data\.shard_rows changed \(512, now 64\)"),
    "other base weights": (
        {"dataset": "a", "base_model": "w"},
        {"dataset": "a", "base_model": "v"},
        None,
        "holds other weights",
    ),
    "a record from before inputs": ({}, {"dataset": "b", "base_model": "v"}, None, None),
    "data not prepared yet": ({"dataset": "a", "base_model": "w"}, {"base_model": "w"}, None, None),
}


@pytest.mark.parametrize(("saved", "now", "rows", "refused"), INPUT_CASES.values(), ids=INPUT_CASES.keys())
def test_a_resume_on_other_data_or_base_weights_under_the_same_settings_is_refused(saved, now, rows, refused):
    """Was: a source file or a base model replaced in place resumed without a word (test rows
    trained on; adapters trained half on one base, half on another)."""
    from trainer.checkpoint import CheckpointError
    from trainer.train import check_same_inputs

    cfg = load_config(overrides={"data.shard_rows": rows} if rows else {})
    saved_config = {"data": {"shard_rows": 512}}
    if refused is None:
        check_same_inputs(saved, now, saved_config, cfg, "start without resume_from")
        return
    with pytest.raises(CheckpointError, match=refused):
        check_same_inputs(saved, now, saved_config, cfg, "start without resume_from")


# (the checkpoint's method and LoRA settings, this run's; refused naming)
LORA_RESUME_CASES = {
    "full, unused lora settings changed": ({"train.method": "full"}, {"train.method": "full", "lora.rank": 4}, None),
    "full to lora": ({"train.method": "full"}, {"train.method": "lora", "lora.rank": 4}, "train.method"),
    "lora, rank changed": ({"train.method": "lora"}, {"train.method": "lora", "lora.rank": 4}, "lora.rank"),
    "lora, alpha changed": ({"train.method": "lora"}, {"train.method": "lora", "lora.alpha": 32.0}, "lora.alpha"),
    "lora, dropout changed": ({"train.method": "lora"}, {"train.method": "lora", "lora.dropout": 0.1}, None),
    # The same layers listed in another order, or as the exported adapter_config.json lists them
    # (sorted), are the same adapters (was: refused as a different lora.target_modules).
    "lora, the same targets in another order": (
        {"train.method": "lora", "lora.target_modules": ["q_proj", "v_proj", "o_proj"]},
        {"train.method": "lora", "lora.target_modules": ["o_proj", "q_proj", "v_proj"]},
        None,
    ),
    "lora, another target": (
        {"train.method": "lora", "lora.target_modules": ["q_proj", "v_proj"]},
        {"train.method": "lora", "lora.target_modules": ["q_proj", "k_proj"]},
        "lora.target_modules",
    ),
}


@pytest.mark.parametrize(("saved", "now", "named"), LORA_RESUME_CASES.values(), ids=LORA_RESUME_CASES.keys())
def test_lora_settings_count_on_resume_only_when_both_runs_train_adapters(saved, now, named):
    """Was: a full fine-tune refused over `lora.*` values it never read; a changed `lora.alpha`
    rescaled the adapters' learned update at once, logged only."""
    from trainer.checkpoint import CheckpointError
    from trainer.config import to_dict
    from trainer.train import check_resumable

    lm = {"task": "causal_lm", "model.init_from": "/models/base"}
    old, new = load_config(overrides={**lm, **saved}), load_config(overrides={**lm, **now})
    if named is None:
        check_resumable(to_dict(old), new, 2, 2, streams=True)
        return
    with pytest.raises(CheckpointError) as err:
        check_resumable(to_dict(old), new, 2, 2, streams=True)
    reasons = str(err.value).split("different ")[1]
    assert named in reasons and (named == "lora.rank" or "lora.rank" not in reasons), reasons


@pytest.mark.parametrize(("saved", "now"), [("causal_lm", "classification"), ("classification", "causal_lm")])
def test_a_resume_under_another_task_names_the_task_not_the_other_tasks_defaults(saved, now):
    """Was: a gpt run resumed with a digits config was refused over `model.hidden_sizes ([128, 64],
    now [32])` too, a field the checkpoint's task never read."""
    from trainer.checkpoint import CheckpointError
    from trainer.config import to_dict
    from trainer.train import check_resumable

    old = load_config(overrides={"task": saved})
    new = load_config(overrides={"task": now, "model.hidden_sizes": [32], "model.n_embd": 48})
    with pytest.raises(CheckpointError) as err:
        check_resumable(to_dict(old), new, 1, 1, streams=True)
    reasons = str(err.value).split("different ")[1].split("; resume")[0]
    assert reasons.startswith("task ") and "hidden_sizes" not in reasons and "n_embd" not in reasons, reasons


# (data.source the checkpoint was written with, the one now; whether the resume is refused)
SOURCE_SPELLINGS = {
    "relative and absolute": ("data/t.csv", "{cwd}/data/t.csv", False),
    "with ./ and a doubled slash": ("./data/t.csv", "data//t.csv", False),
    "a bare file name": ("t.csv", "./t.csv", False),
    "another file": ("data/t.csv", "data/u.csv", True),
    "a built-in name and a folder of that name": ("digits", "./digits", True),
    "an S3 key in other letters": ("s3://data/t.csv", "s3://data/T.csv", True),
}


@pytest.mark.parametrize(("saved", "now", "refused"), SOURCE_SPELLINGS.values(), ids=SOURCE_SPELLINGS.keys())
def test_a_local_source_written_another_way_is_the_same_source(tmp_path, monkeypatch, saved, now, refused):
    """Was: `data.source: data/t.csv` resumed as `./data/t.csv` or its absolute path was refused
    as another source (compared as text)."""
    from trainer.checkpoint import CheckpointError
    from trainer.config import to_dict
    from trainer.train import check_resumable

    monkeypatch.chdir(tmp_path)
    old = load_config(overrides={"data.source": saved})
    new = load_config(overrides={"data.source": now.format(cwd=tmp_path)})
    if not refused:
        check_resumable(to_dict(old), new, 1, 1, True, "start anew", log_changes=False)
        return
    with pytest.raises(CheckpointError, match="different data.source"):
        check_resumable(to_dict(old), new, 1, 1, True, "start anew", log_changes=False)


@pytest.mark.parametrize("log_changes", [True, False])
def test_the_compatible_changes_of_a_resume_are_said_once(caplog, log_changes):
    """The trainer's rank 0 names each change; a pre-flight's check and the other ranks stay
    quiet (were: every change said by the pre-flight and again by each rank)."""
    import logging

    from trainer.checks import check_continues
    from trainer.config import to_dict
    from trainer.train import check_resumable

    old, new = load_config(), load_config(overrides={"train.learning_rate": 0.01, "train.num_workers": 2})
    record = {"config": to_dict(old), "world_size": 2, "step": 5}
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        check_continues(new, record, "start anew")
        check_resumable(to_dict(old), new, 2, 2, True, "start anew", log_changes)
    said = [r.getMessage() for r in caplog.records if "resuming with a changed" in r.getMessage()]
    expected = [
        "resuming with a changed train.learning_rate: 0.003 -> 0.01",
        "resuming with a changed train.num_workers: 0 -> 2",
        "resuming with a changed train.num_workers: the epoch goes on with the items still to come",
    ]
    assert said == (expected if log_changes else [])


def test_fields_newer_than_the_checkpoint_are_not_said_to_have_changed_unless_set(caplog):
    """A checkpoint of an earlier kftrain lacks the fields added since: they ran as their default
    does (was: `resuming with a changed plan.network_gbits: None -> 400.0`, nothing changed)."""
    import logging

    from trainer.config import to_dict
    from trainer.train import check_resumable

    old = to_dict(load_config())
    del old["plan"]["network_gbits"], old["train"]["grad_clip_norm"]  # fields it did not have yet
    new = load_config(overrides={"train.grad_clip_norm": 0.5})  # one of them set now
    with caplog.at_level(logging.INFO, logger="kftrain.train"):
        check_resumable(old, new, 1, 1, True, "start anew", True)
    said = [r.getMessage() for r in caplog.records if "resuming with" in r.getMessage()]
    assert said == [
        "resuming with train.grad_clip_norm 0.5 (the checkpoint's kftrain had no such field: its default 0.0)"
    ]


@pytest.mark.parametrize("written", [3, "2"])
def test_a_checkpoint_of_a_newer_format_is_refused_in_one_line_before_any_step(written):
    """(was: an older kftrain met a newer record's per-rank epoch loss as a shape error in its ranks)"""
    from trainer.checkpoint import CheckpointError
    from trainer.checks import check_continues
    from trainer.config import to_dict

    record = {"config": to_dict(load_config()), "world_size": 1, "step": 5, "format": written}
    with pytest.raises(CheckpointError) as info:
        check_continues(load_config(), record, "start anew")
    assert str(info.value) == (
        f"checkpoint step 5 was written by a newer kftrain (checkpoint format {written!r}; this one reads up to 2): "
        "continue it with that kftrain, or upgrade this one"
    )
    record["format"] = 2
    check_continues(load_config(), record, "start anew")  # this kftrain's own


def test_a_resume_refuses_other_data_a_reached_step_limit_and_another_model_and_keeps_the_final_step(tmp_path, caplog):
    """In one process, through the trainer: the final step of a run that stops mid-epoch is
    committed (was: only under FSDP, so `kftrain runs` showed an older step, or none); resuming it
    with a lower `train.max_steps`, with `model.dropout` that adds a layer, or on the source
    changed in place is refused in one line; on the same data it continues."""
    from trainer.checkpoint import CheckpointError, CheckpointManager, step_dir
    from trainer.tasks.classification.data import prepare_dataset

    rng = np.random.default_rng(0)

    def csv(rows: int) -> str:
        x = rng.normal(size=(rows, 3))
        return "".join(f"{a:.4f},{b:.4f},{c:.4f},{'pos' if a + b > 0 else 'neg'}\n" for a, b, c in x)

    source = tmp_path / "t.csv"
    source.write_text("a,b,c,label\n" + csv(240))
    shape = {"data.source": str(source), "model.hidden_sizes": [8], "train.batch_size": 16, "job.replicas": 1}
    shape |= {"checkpoint.interval_steps": 3, "train.epochs": 3, "train.log_interval_steps": 1}

    def prepared(name: str) -> str:
        prepare_dataset(load_config(overrides=shape).data, LocalStore(), str(tmp_path / name))
        return str(tmp_path / name)

    def run(name: str, dataset: str, **overrides) -> dict:
        cfg = load_config(overrides={**shape, "checkpoint.uri": str(tmp_path / f"{name}-ckpt"), **overrides})
        return run_training(cfg, dataset, str(tmp_path / name), DistEnv())

    first = prepared("data-a")
    run("first", first, **{"train.max_steps": 5})
    assert CheckpointManager(LocalStore(), str(tmp_path / "first-ckpt")).committed_steps() == [3, 5]
    step5 = step_dir(str(tmp_path / "first-ckpt"), 5)
    with pytest.raises(CheckpointError, match="train.max_steps 4 ends before the checkpoint's step 5"):
        run("fewer", first, **{"train.max_steps": 4, "checkpoint.resume_from": step5})
    with pytest.raises(CheckpointError, match=r"has a tensor the checkpoint lacks \(model\.3\.weight\)"):
        run("dropout", first, **{"train.max_steps": 8, "model.dropout": 0.5, "checkpoint.resume_from": step5})
    source.write_text("a,b,c,label\n" + csv(60) + source.read_text().split("\n", 1)[1])  # rows put in front
    with pytest.raises(CheckpointError, match=f"data.source '{source}' changed since it was written"):
        run("changed", prepared("data-b"), **{"train.max_steps": 8, "checkpoint.resume_from": step5})
    # From its own checkpoint (a retry, `--run-id`) the way out is a new run (was: "point
    # checkpoint.uri at a new prefix", which `--run-id` refuses).
    from trainer.train import START_ANEW

    with pytest.raises(CheckpointError, match=re.escape(f"put back the data it was written on, or {START_ANEW}")):
        run("first", prepared("data-c"), **{"train.max_steps": 8})
    metrics = run("same", first, **{"train.max_steps": 8, "checkpoint.resume_from": step5})
    assert metrics["resumed_from_step"] == 5 and metrics["steps"] == 8
    # A checkpoint of an earlier kftrain (no format; rank 0's share of the epoch's loss alone) says
    # what its record's losses are (was: they went on in one curve with the job's, in silence).
    import logging
    import shutil

    shutil.copytree(tmp_path / "first-ckpt", tmp_path / "older-ckpt")
    commit = tmp_path / "older-ckpt" / "step-00000005" / "COMMIT.json"
    older = json.loads(commit.read_text())
    assert older.pop("format") == 2
    older["position"]["epoch_loss"] = older["position"]["epoch_loss"][0]
    commit.write_text(json.dumps(older))
    with caplog.at_level(logging.WARNING, logger="kftrain.train"):
        run("older", first, **{"train.max_steps": 8, "checkpoint.resume_from": str(commit.parent)})
    assert [r.getMessage() for r in caplog.records if "earlier kftrain" in r.getMessage()] == [
        "the checkpoint was written by an earlier kftrain, which recorded rank 0's share of the loss: the train_loss "
        "of the epochs before step 5 (the history, the loss curve) is rank 0's, and that of the epoch it cut is partly "
        "so; from here on it is the whole job's"
    ]

    # A changed learning rate and weight decay take effect, as logged (was: the checkpoint's kept).
    def record_of(name: str) -> dict:
        return json.loads((tmp_path / name / "training.json").read_text())

    same = record_of("same")
    lower = {"train.learning_rate": 1e-4, "train.weight_decay": 0.5, "train.max_steps": 8}
    run("lower", first, **{**lower, "checkpoint.resume_from": step5})
    changed = record_of("lower")
    ratio = 1e-4 / load_config().train.learning_rate
    for old, new in zip(same["loss_curve"], changed["loss_curve"], strict=True):
        assert new["lr"] == pytest.approx(old["lr"] * (ratio if new["step"] > 5 else 1)), (old, new)
    assert changed["parameter_digest"] != same["parameter_digest"]


@pytest.mark.parametrize(
    ("units", "grad", "loss", "counted"),
    [
        (4, [0.5, 1.0], 2.0, True),  # the gradients of the sum, divided by the tokens counted
        (0, [2.0, 4.0], 0.0, False),  # none in the global batch: nothing to average, no update
    ],
)
def test_a_summed_loss_becomes_the_mean_over_the_global_batchs_units(units, grad, loss, counted):
    from types import SimpleNamespace

    from trainer.train import Trainer

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([2.0, 4.0])
    trainer = SimpleNamespace(env=DistEnv(), trainable=[p])
    mean, job_mean, any_units = Trainer._mean_over_units(
        trainer, torch.tensor(8.0 if units else 0.0), torch.tensor(units)
    )
    # One rank: its own mean is the global batch's.
    assert (float(mean), float(job_mean), any_units) == (loss, loss, counted) and p.grad.tolist() == grad


def test_a_pretrained_task_with_its_own_loss_trains_on_it():
    """A subclass that overrides `loss` alone: training calls it, not the token-summed loss."""
    from types import SimpleNamespace

    from trainer.tasks.pretrained_lm import PretrainedLMTask

    class Mine(PretrainedLMTask):
        def loss(self, model, batch):
            return super().loss(model, batch) * 2  # the built-in loss, reweighted

    x = torch.tensor([[1, 2, 3]])
    batch = (x, torch.tensor([[2, 3, -100]]))
    model = lambda input_ids: SimpleNamespace(logits=torch.zeros(1, 3, 5))  # noqa: E731 (uniform over 5 tokens)
    assert Mine().summed_loss(model, batch) is None
    assert float(Mine().loss(model, batch)) == pytest.approx(2 * math.log(5))


@pytest.mark.parametrize(
    ("saved", "saved_world", "rank", "world", "own"),
    [
        ([1.0, 3.0], 2, 1, 2, 3.0),  # the same layout: each rank its own sum, exactly
        ([1.0, 3.0], 2, 0, 2, 1.0),
        ([1.0, 3.0, 5.0], 3, 0, 2, 3.0),  # another: the mean rank's sum, on every rank
        ([1.0, 3.0], 2, 2, 4, 2.0),
        (1.5, 2, 1, 2, 1.5),  # an earlier kftrain's checkpoint: rank 0's sum stands for each rank's
    ],
)
def test_a_resumed_epoch_s_loss_so_far_counts_every_rank_of_the_saved_run(saved, saved_world, rank, world, own):
    assert _resumed_epoch_loss(saved, saved_world, DistEnv(rank=rank, world_size=world)) == own


@pytest.mark.parametrize(
    ("device_name", "precision", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "auto", 989.0),
        ("NVIDIA H100 80GB HBM3", "fp32", 67.0),  # was: the bf16 peak, an fp32 run's MFU 15x too low
        ("NVIDIA H100 PCIe", "bf16", 756.0),  # was: the SXM module's 989
        ("NVIDIA H200 NVL", "auto", 835.0),
        ("NVIDIA L40S", "auto", 362.0),
        ("NVIDIA L40", "auto", 0.0),  # was: 121, an L4's: the name holds "L4"
        ("Tesla V100-SXM2-16GB", "auto", 0.0),
    ],
)
def test_the_mfu_peak_is_the_planner_s_gpu_type_at_the_run_s_precision(monkeypatch, device_name, precision, tflops):
    """One table of GPU types for the plan and the MFU estimate (was: a second one here, matched by
    substring, bf16 peaks only)."""
    from trainer.train import peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    cfg = load_config(overrides={"train.precision": precision})
    assert peak_flops(torch.device("cuda", 0), cfg) == tflops * 1e12
    assert peak_flops(torch.device("cuda", 0), load_config(overrides={"train.peak_tflops": 100.0})) == 100e12


@pytest.mark.parametrize(
    ("error", "lost_peer"),
    [
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5071"), True),
        # DCP's gather in a checkpoint save, a peer SIGKILLed (was: a raw traceback, exit 1 not 4).
        (
            RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:62161: Connection reset by peer"),
            True,
        ),
        (RuntimeError("[../gloo/transport/tcp/pair.cc:598] Write error: Broken pipe"), True),
        (RuntimeError("Timed out waiting 20000ms for recv operation to complete"), True),
        (RuntimeError("CUDA out of memory"), False),
        (ValueError("Connection reset by peer"), False),  # not a collective's error type
    ],
)
def test_a_lost_or_hung_peer_is_told_from_an_error_of_the_run(error, lost_peer):
    from trainer.distributed import collective_failed

    assert collective_failed(error) is lost_peer


# (a field changed on resume, its new value; whether the records keep the change)
RESUME_CHANGES = {
    "learning rate": ("train.learning_rate", 0.01, True),
    "lora-free dropout": ("model.dropout", 0.2, True),
    "world size": ("job.replicas", 4, True),
    "data partitions": ("data.partitions", 8, True),
    "a longer job timeout": ("job.timeout_seconds", 7200, False),
    "the data's cache key (a file's mtime)": ("data.source_version", "49538534ca2f61ac", False),
    "evaluation rows": ("data.eval_items", 64, False),
    "log interval": ("train.log_interval_steps", 7, False),
    "tensorboard": ("train.tensorboard", False, False),
    "checkpoints kept": ("checkpoint.keep_last", 9, False),
    "nccl debug": ("job.nccl_debug", "INFO", False),
}


@pytest.mark.parametrize(("field", "value", "kept"), RESUME_CHANGES.values(), ids=RESUME_CHANGES.keys())
def test_the_records_keep_a_resumes_changes_to_how_steps_train_only(field, value, kept):
    """Was: a continuation's longer job timeout, or a source file touched (its mtime in
    data.source_version), listed in the model card as a change the weights trained under."""
    from trainer.config import flatten_config, to_dict
    from trainer.train import check_resumable

    old, new = load_config(), load_config(overrides={field: value})
    changes = check_resumable(to_dict(old), new, 2, 2, True, log_changes=False)
    assert changes == ([{"field": field, "from": flatten_config(to_dict(old))[field], "to": value}] if kept else [])
