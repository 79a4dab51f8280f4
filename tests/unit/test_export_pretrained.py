"""trainer/export_pretrained.py's pure parts (the whole export runs in
tests/integration/test_export_pretrained.py)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest


@pytest.mark.parametrize(
    ("origin", "named"),
    [
        ("hf://org/llama@abc123", "org/llama"),
        ("s3://models/llama", "s3://models/llama"),
        ("minio://models/llama", "minio://models/llama"),
        # A local folder as typed is no path peft loads (was: `<cwd>/~/m` and `file:///m` kept as written).
        ("/srv/models/llama", "/srv/models/llama"),
        ("models/llama", os.path.abspath("models/llama")),
        ("./models/llama/", os.path.abspath("models/llama")),
        ("~/models/llama", os.path.expanduser("~/models/llama")),
        ("file:///srv/models/llama", "/srv/models/llama"),
    ],
)
def test_the_adapter_names_its_base_as_peft_can_load_it(origin, named):
    from peft import LoraConfig

    from trainer.export_pretrained import ADAPTER_NAME, adapter_config

    model = SimpleNamespace(peft_config={ADAPTER_NAME: LoraConfig(r=4, target_modules=["q_proj"])})
    config = adapter_config(model, {"base_model": {"origin": origin, "revision": "abc123"}})
    assert config["base_model_name_or_path"] == named
    assert config["inference_mode"] is True
