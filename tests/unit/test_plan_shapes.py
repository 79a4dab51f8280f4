"""The planned model: exact parameter counts against real builds, and traced activations."""

from __future__ import annotations

import warnings

import pytest
import torch

from trainer.config import Config
from trainer.example_model import tiny_llama_folder
from trainer.plan.shapes import (
    PlanError,
    build_on_meta,
    gpt_activation_formula,
    model_shape,
    planning_manifest,
    trace_activations,
)
from trainer.tasks import Task, task_for


def gpt_config(**model) -> Config:
    cfg = Config(task="causal_lm")
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = 2, 64, 4, 32
    for k, v in model.items():
        setattr(m, k, v)
    return cfg


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama", tie=True)


def real_counts(model: torch.nn.Module) -> tuple[int, int]:
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params if not p.requires_grad)


@pytest.mark.parametrize(
    ("tokenizer", "vocab"),
    [("bytes", 256), ("bpe:1000", 1000)],
)
def test_gpt_counts_equal_a_real_build(tokenizer, vocab):
    cfg = gpt_config()
    cfg.data.tokenizer = tokenizer
    task = task_for(cfg)
    manifest, note = planning_manifest(cfg, task)
    assert manifest["vocab_size"] == vocab and "data.tokenizer" in note
    shape = model_shape(build_on_meta(cfg, task, manifest), task, cfg)
    real, _ = task.build_model(cfg, manifest)
    assert (shape.trainable, shape.frozen) == real_counts(real)
    assert shape.trainable_bytes == 4 * shape.trainable  # fp32
    # Two blocks as shard units; the tied embedding counted once, in the root.
    assert len(shape.unit_params) == 2
    assert shape.root_params + sum(shape.unit_params) == shape.total
    assert shape.flops_per_item == real.flops_per_token()


def test_classifier_counts_from_the_manifest_or_a_stated_guess():
    cfg = Config(task="classification")
    task = task_for(cfg)
    guessed, note = planning_manifest(cfg, task)
    assert "assumed 64 features and 10 classes" in note
    manifest = {"num_features": 13, "classes": ["a", "b", "c"], "feature_names": [], "normalization": {}}
    given, note = planning_manifest(cfg, task, manifest)
    assert given is manifest and "prepared dataset" in note
    for m in (guessed, manifest):
        shape = model_shape(build_on_meta(cfg, task, m), task, cfg)
        assert (shape.trainable, shape.frozen) == real_counts(task.build_model(cfg, m)[0])


@pytest.mark.parametrize("method", ["full", "lora"])
def test_pretrained_llama_counts_trainable_and_frozen_exactly(llama, method):
    from transformers import AutoModelForCausalLM

    cfg = Config(task="causal_lm")
    cfg.model.init_from, cfg.model.block_size = llama, 64
    cfg.train.method = method
    task = task_for(cfg)
    manifest, note = planning_manifest(cfg, task)
    assert "config.json" in note
    with warnings.catch_warnings():  # a library's deprecation is not the user's to read
        warnings.simplefilter("error", FutureWarning)
        shape = model_shape(build_on_meta(cfg, task, manifest), task, cfg)
    real = AutoModelForCausalLM.from_pretrained(llama)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        real = get_peft_model(real, LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, task_type="CAUSAL_LM"))
        assert 0 < shape.trainable < shape.frozen
    assert (shape.trainable, shape.frozen) == real_counts(real)


def test_a_custom_task_without_a_manifest_says_to_prepare_the_data():
    class NeedsData(Task):
        name = "mine"

        def build_model(self, cfg, manifest):
            return torch.nn.Linear(manifest["width"], 2), {}

    cfg = Config(task="causal_lm")
    cfg.task = "mine"
    with pytest.raises(PlanError, match=r"task 'mine': its build_model needs 'width' .* run data prep first"):
        build_on_meta(cfg, NeedsData(), {})


def real_saved_bytes(model, task, cfg, batch) -> int:
    """Saved-for-backward bytes of a real forward (each storage once, no parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        task.loss(model, batch)
    return sum(seen.values())


def test_the_fake_trace_equals_a_real_forward_and_scales_with_the_micro_batch():
    cfg = gpt_config()
    task = task_for(cfg)
    manifest, _ = planning_manifest(cfg, task)
    traced = [trace_activations(build_on_meta(cfg, task, manifest), task, cfg, manifest, b, False) for b in (2, 4)]
    torch.manual_seed(0)
    real, _ = task.build_model(cfg, manifest)
    assert traced[0].saved_bytes == real_saved_bytes(real, task, cfg, task.synthetic_batch(cfg, manifest, 2))
    assert traced[1].saved_bytes == pytest.approx(2 * traced[0].saved_bytes, rel=0.01)
    # The logits' log-softmax is the largest saved tensor: micro x context x vocab fp32.
    assert traced[0].largest_saved == 2 * 32 * 256 * 4


def test_activation_checkpointing_keeps_the_units_inputs_and_one_unit():
    cfg = gpt_config(n_layer=4)
    task = task_for(cfg)
    manifest, _ = planning_manifest(cfg, task)
    trace = trace_activations(build_on_meta(cfg, task, manifest), task, cfg, manifest, 4, False)
    assert len(trace.unit_saved) == 4 and len(set(trace.unit_saved)) == 1
    assert trace.unit_input == [4 * 32 * 64 * 4] * 4  # each block's input: micro x context x width fp32
    full, kept = trace.bytes(False), trace.bytes(True)
    assert kept == full - 3 * trace.unit_saved[0] + 4 * trace.unit_input[0]
    assert kept < full


@pytest.mark.parametrize("bf16", [False, True])
def test_a_gpt_block_saves_what_korthikanti_et_al_count(bf16):
    """Per layer ~34 s b h bytes at 16 bits (no dropout masks, fused attention), twice that in
    fp32: the trace of one block within 15% of it. Under autocast the block also keeps the
    bf16 copies of its four weight matrices (autocast's cast cache), which the formula leaves out."""
    cfg = gpt_config(n_layer=2, n_embd=128, block_size=64)
    task = task_for(cfg)
    manifest, _ = planning_manifest(cfg, task)
    trace = trace_activations(build_on_meta(cfg, task, manifest), task, cfg, manifest, 4, bf16)
    per_layer = gpt_activation_formula(4, 64, 128, 4, 1, bf16)
    h = 128
    weight_copies = 2 * (h * 3 * h + h * h + h * 4 * h + 4 * h * h) if bf16 else 0
    assert trace.unit_saved[0] - weight_copies == pytest.approx(per_layer, rel=0.15)


def test_weights_the_gpu_holds_in_bf16_leave_no_autocast_copy_in_the_trace():
    """The trace runs on this CPU in the model's dtypes; under FSDP on GPUs the weights are
    gathered in bf16, and a LoRA base is built in bf16: autocast then copies none of them (was:
    2 bytes per parameter counted as activations, 128 GiB of a 70B plan)."""
    cfg = gpt_config(n_layer=2, n_embd=128, block_size=64)
    task = task_for(cfg)
    manifest, _ = planning_manifest(cfg, task)

    def trace(held):
        return trace_activations(build_on_meta(cfg, task, manifest), task, cfg, manifest, 4, True, held)

    copied, held = trace(None), trace(lambda p: True)
    h = 128
    weight_copies = 2 * (h * 3 * h + h * h + h * 4 * h + 4 * h * h)  # per block: its four matrices
    # At least the copies (the residual stream is bf16 too when the embeddings are, as on the GPU).
    assert copied.unit_saved[0] - held.unit_saved[0] >= weight_copies
    assert held.saved_bytes < copied.saved_bytes - 2 * weight_copies
