"""The training loop (trainer/train.py) in one process: non-finite losses, accumulation, the GPT task, export."""

from __future__ import annotations

import hashlib
import io
import json
import math

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
from trainer.train import NonFiniteLoss, run_training

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
    with pytest.raises(NonFiniteLoss) as err:
        run_training(cfg, digits, str(tmp_path / "model"), DistEnv(), task=Diverged())
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
    assert card["inputs"] == {"name": "tokens", "dtype": "int64", "shape": [-1, -1]}
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
    cfg = load_config(overrides={**TINY_GPT, "train.max_steps": 5})
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
    assert metrics["val_accuracy"] == value
    exported, _ = load_model(store, model)
    state = {"model": {k: torch.zeros_like(v) for k, v in exported.state_dict().items()}}
    mgr = CheckpointManager(store, prefix)
    mgr.load(json.loads(store.get_bytes(join_uri(step_dir(prefix, best), "COMMIT.json"))), state)
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
