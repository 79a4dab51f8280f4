"""trainer/tasks/pretrained_lm.py in one process (its training runs: tests/integration/)."""

from __future__ import annotations

import shutil

import pytest

from trainer import pretrained
from trainer.example_model import tiny_llama_folder
from trainer.tasks.pretrained_lm import PretrainedLMTask


def test_adapters_are_loaded_only_on_the_base_weights_they_were_trained_on(tmp_path):
    """Evaluation and export rebuild a LoRA model on its base model's folder: replaced in place
    since training, it is refused naming it (was: the adapters merged into the other weights)."""
    from safetensors.torch import load_file, save_file

    base = tmp_path / "base"
    shutil.copytree(tiny_llama_folder(tmp_path / "tiny"), base)
    source = pretrained.resolve(str(base))
    meta = {
        "method": "lora",
        "hf_config": pretrained.read_config(source),
        "base_model": {"origin": str(base), "folder": str(base), "revision": "", "fingerprint": "0" * 64},
    }
    with pytest.raises(pretrained.PretrainedError, match="holds other weights than when the adapters were trained"):
        PretrainedLMTask().model_from_meta(meta)
    meta["base_model"]["fingerprint"] = pretrained.weights_fingerprint(source)
    weights = base / pretrained.SINGLE_FILE
    save_file({k: v * 1.01 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    with pytest.raises(pretrained.PretrainedError, match=f"model.init_from '{base}' holds other weights"):
        PretrainedLMTask().model_from_meta(meta)


def test_a_saved_models_base_is_read_through_the_configured_store(monkeypatch):
    """Evaluation and export read a fine-tuned model's base in S3 through `store.*`, as data prep
    and training did (was: through the environment's endpoint, else AWS S3, with the default retry
    budget: a base in MinIO failed evaluation after the training had run)."""
    from trainer.config import StoreConfig
    from trainer.storage import ENDPOINT_ENV
    from trainer.tasks.pretrained_lm import source_from_meta

    for name in ENDPOINT_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    meta = {"base_model": {"origin": "s3://models/qwen3-0.6b"}}
    with pretrained.bases_through(StoreConfig(endpoint="http://127.0.0.1:9000", retry_budget_seconds=5)):
        source = source_from_meta(meta)
    assert source.store.endpoint == "http://127.0.0.1:9000" and source.store.policy.budget_s == 5
    assert source.uri == "s3://models/qwen3-0.6b"
    assert source_from_meta(meta).store.endpoint != "http://127.0.0.1:9000"  # outside the block: the default


@pytest.mark.parametrize("targets", [["c_attn", "c_fc"], ["lm_head"]], ids=["conv1d", "tied-head"])
def test_peft_notes_with_nothing_to_act_on_stay_off_the_terminal(targets):
    """(were: a UserWarning on every GPT-2 LoRA run, and on an adapter of a tied head)"""
    import warnings

    from transformers import GPT2Config, GPT2LMHeadModel

    from trainer.tasks.pretrained_lm import apply_lora

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        apply_lora(model, {"rank": 2, "alpha": 4, "dropout": 0.0, "target_modules": targets})
    assert not [str(w.message) for w in seen if "peft" in w.filename], [str(w.message) for w in seen]
