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
