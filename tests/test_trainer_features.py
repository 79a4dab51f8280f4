"""Trainer features: NaN handling, divisibility errors, gradient accumulation, the GPT task."""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from trainer.config import ConfigError, load_config
from trainer.distributed import DistEnv
from trainer.evaluate import evaluate_model
from trainer.export import export_model, load_torchscript
from trainer.launch.backend import JobFailed, run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.model_io import load_model
from trainer.storage import LocalStore, join_uri
from trainer.tasks import get_task
from trainer.train import run_training

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


def test_nonfinite_loss_stops_the_job_naming_step_and_rank(digits, tmp_path):
    bad = str(tmp_path / "bad")
    poison_first_train_shard(digits, bad)
    cfg = load_config(overrides={"train.epochs": 1, "checkpoint.enabled": False})
    with pytest.raises(JobFailed) as info:
        run_job(
            LocalBackend(sink=lambda line: None),
            replace(training_job(cfg, "nan", bad, str(tmp_path / "m")), timeout_s=120),
        )
    message = str(info.value)
    assert "training failed: non-finite loss or gradients at optimizer step" in message
    # Only one rank's batch holds the NaN row; whichever replica is reported names that rank.
    assert re.search(r"the loss was non-finite on rank\(s\) \[[01]\]", message), message
    assert not LocalStore().exists(join_uri(str(tmp_path / "m"), "model.json"))  # no model marked complete


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


TINY_GPT = {
    "task": "causal_lm",
    "data.max_bytes": 300_000,
    "model.n_layer": 2,
    "model.n_head": 4,
    "model.n_embd": 64,
    "model.block_size": 64,
    "train.batch_size": 16,
    "train.learning_rate": 0.003,
    "train.max_steps": 120,
    "train.warmup_steps": 10,
    "train.lr_schedule": "cosine",
    "job.replicas": 1,
    "checkpoint.enabled": False,
}


def test_gpt_task_learns_on_a_tiny_shape(tmp_path):
    cfg = load_config(overrides=TINY_GPT)
    store = LocalStore()
    ds, model_uri = str(tmp_path / "ds"), str(tmp_path / "model")
    manifest = get_task("causal_lm").prepare(cfg, store, ds)
    assert manifest["vocab_size"] == 256 and manifest["splits"]["train"]["tokens"] > 200_000
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


def test_gpt_default_shape_is_gpt2_small():
    from trainer.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=50257))
    assert 123e6 < model.num_params() < 125e6  # GPT-2 small: 124M parameters


def test_a_user_task_by_import_path():
    with pytest.raises(ConfigError, match="task: cannot import 'nowhere.module:Task'"):
        get_task("nowhere.module:Task")
    assert get_task("trainer.tasks.classification:ClassificationTask").name == "classification"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpt_trains_in_bf16_on_cuda(tmp_path):
    cfg = load_config(overrides={**TINY_GPT, "train.max_steps": 20})
    store = LocalStore()
    get_task("causal_lm").prepare(cfg, store, str(tmp_path / "ds"))
    metrics = run_training(cfg, str(tmp_path / "ds"), str(tmp_path / "m"), DistEnv())
    assert math.isfinite(metrics["val_loss"])


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
