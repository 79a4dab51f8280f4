"""trainer/checks.py: a pretrained base model is checked before any step, from its small files and
safetensors headers (nothing here reads a weight or reaches the network: the tier refuses it),
and every refusal names the field and the fix on one line."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from tests.hf_models import base_model_config, model_variant
from trainer.checks import GATE_DEFAULTS, check_base_model, check_model_memory, check_run_settings, state_bytes_per_rank
from trainer.config import ConfigError, load_config, parse_config
from trainer.errors import KftrainError
from trainer.example_model import tiny_llama_folder

#: The tiny Llama's context (max_position_embeddings).
CONTEXT = 256


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama")


def check(init_from: str, extra: str = "") -> None:
    check_base_model(parse_config(base_model_config(init_from, extra)))


LORA = "train:\n  method: lora\n"
#: Chat data (the built-in source is plain text: a chat config names a JSON Lines one).
CHAT = "data:\n  format: chat\n  source: /data/chat.jsonl\n"
NO_TEMPLATE = {"tokenizer_config": {"chat_template": None}, "drop": ("chat_template.jinja", "chat_template.json")}
# (how the folder differs from the tiny Llama, extra config, phrases the one-line message holds)
REFUSED = {
    "no-folder": (None, "", ["model.init_from", "no such folder (nothing at or under it)", "fix the path"]),
    "a-file": (None, "", ["model.init_from", "a file, not a folder; name the model's folder"]),
    "weights-cut-short": (None, "", ["model.safetensors: the file is cut short", "copy the model's weights again"]),
    "no-config": ({"drop": ("config.json",)}, "", ["model.init_from", "no config.json in the folder"]),
    "architecture": ({"config": {"model_type": "t5"}}, "", ["model_type 't5' is not supported", "llama"]),
    # config.json of another architecture than the weights: said as such, LoRA or not (was, under
    # LoRA: "lora.target_modules [...]: not found in the model", a fix that does not help).
    "config-of-another-architecture": (
        {"config": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}},
        LORA + "lora:\n  target_modules: [q_proj, v_proj]\n",
        ["model.init_from", "the folder's weights lack", "incomplete or of another architecture"],
    ),
    "remote-code": (
        {"config": {"auto_map": {"AutoModelForCausalLM": "modeling.My"}}},
        "",
        ["needs its own Python code", "model.trust_remote_code: true"],
    ),
    "remote-code-trusted": (
        {"config": {"auto_map": {"AutoModelForCausalLM": "modeling.My"}}},
        "model:\n  trust_remote_code: true\n",
        [
            "model.init_from",
            "its own code (config.json auto_map",
            "does not build a model",
            "put the model's .py files",
        ],
    ),
    "no-safetensors": (
        {"drop": ("model.safetensors",)},
        "",
        ["model.init_from", "safetensors only", "save_pretrained"],
    ),
    "shards-without-their-index": (  # was: "no model.safetensors or ...index.json", the shards not named
        {
            "drop": ("model.safetensors",),
            "add": {"model-00001-of-00002.safetensors": "", "model-00002-of-00002.safetensors": ""},
        },
        "",
        ["model-00001-of-00002.safetensors and 1 more safetensors files but no model.safetensors.index.json"],
    ),
    "no-tokenizer": ({"drop": ("tokenizer.json",)}, "", ["model.init_from", "no tokenizer.json", "save_pretrained"]),
    "missing-tensor": (
        {"drop_tensors": ("model.norm.weight",)},
        "",
        ["model.init_from", "lack 'model.norm.weight'", "incomplete or of another architecture"],
    ),
    # Tensors config.json has no place for (was: dropped, the run and export green): a config of
    # fewer layers, a stray tensor.
    "fewer-layers-than-the-weights": (
        {"config": {"num_hidden_layers": 1}},
        "",
        [
            "model.init_from",
            "the folder's weights hold 9 tensor(s) the model of its config.json has no place for",
            "'model.layers.1.",
            "use the config.json saved with these weights, or save the model alone",
        ],
    ),
    "a-stray-tensor": (
        {"add_tensors": ("model.layers.0.mlp.down_proj.bias",)},
        LORA,
        ["hold 1 tensor(s)", "'model.layers.0.mlp.down_proj.bias'", "a bias flag?"],
    ),
    # A token the tokenizer files declare that tokenizer.json lacks: transformers adds it past its
    # ids (was: the train step failed with a fix that did not work, or text data read it apart).
    "declared-token-tokenizer-json-lacks": (
        {"tokenizer_config": {"extra_special_tokens": ["<|sys|>"]}},
        "",
        [
            "model.init_from",
            "tokenizer_config.json declares the token '<|sys|>', which tokenizer.json lacks",
            "tokenizer.save_pretrained(folder)",
        ],
    ),
    "a-pad-token-tokenizer-json-lacks": (
        {
            "tokenizer_config": {"pad_token": {"content": "<pad>"}},
            "add": {"special_tokens_map.json": '{"mask_token": "<m>"}'},
        },
        "",
        ["tokenizer_config.json declares the token '<pad>' (and 1 more), which tokenizer.json lacks"],
    ),
    "wrong-shape": (
        {"config": {"intermediate_size": 64}},
        "",
        ["model.safetensors: tensor", "has shape [128, 64]", "expects [64, 64]", "config.json disagree"],
    ),
    "block-size": (
        {},
        f"model:\n  block_size: {CONTEXT * 2}\n",
        [f"model.block_size {CONTEXT * 2} is longer than the pretrained model's context", f"at most {CONTEXT}"],
    ),
    "chat-without-template": (
        NO_TEMPLATE,
        CHAT,
        ["data.format: chat needs the model's chat template", "instruct", "data.format: text or jsonl"],
    ),
    "lora-unknown-module": (
        {},
        LORA + "lora:\n  target_modules: [qkv]\n",
        ["lora.target_modules ['qkv']", "not found", "The model's linear layers: down_proj, gate_proj, k_proj"],
    ),
    "lora-not-linear": (
        {},
        LORA + "lora:\n  target_modules: [input_layernorm]\n",
        ["lora.target_modules: 'input_layernorm' names a LlamaRMSNorm, not a layer LoRA adapts", "q_proj"],
    ),
    # A block of layers (was: peft's error with the block's whole module tree, hundreds of lines).
    "lora-a-block": (
        {},
        LORA + "lora:\n  target_modules: [self_attn]\n",
        ["lora.target_modules: 'self_attn' names a LlamaAttention, a block of layers; name the layers in it", "q_proj"],
    ),
    "lora-the-whole-model": (
        {},
        LORA + "lora:\n  target_modules: [layers]\n",
        ["lora.target_modules: 'layers' names a ModuleList, a block of layers", "down_proj"],
    ),
    # The folder's other small files, each as transformers reads them (was: found in data prep, at
    # evaluation after the whole run, or in the train step, blaming the data or the dataset).
    "generation-config-not-json": (
        {"add": {"generation_config.json": "{"}},
        "",
        ["model.init_from", "generation_config.json is not valid JSON", "copy the model's files again"],
    ),
    "tokenizer-not-json": (
        {"add": {"tokenizer.json": '{"version": '}},
        "",
        ["tokenizer.json is not valid JSON", "copy the model's files again"],
    ),
    "tokenizer-config-not-an-object": ({"add": {"tokenizer_config.json": "[1]"}}, "", ["is not a JSON object"]),
    "chat-template-does-not-parse": (
        {"drop": ("chat_template.json",), "add": {"chat_template.jinja": "{% for m in messages %}{{ m.content "}},
        CHAT,
        ["the chat template in chat_template.jinja does not parse (TemplateSyntaxError line 1", "fix it"],
    ),
    "tokenizer-past-the-embedding": (
        {"config": {"vocab_size": 100}},
        "",
        ["tokenizer.json has token ids up to", "config.json's vocab_size is 100", "do not belong together"],
    ),
    "weights-an-empty-file": (
        {"add": {"model.safetensors": ""}},
        "",
        ["model.safetensors: not a safetensors file (0 bytes", "copy them again"],
    ),
    "weights-not-safetensors": (
        {"add": {"model.safetensors": "PK\x03\x04 a zip, or pickle"}},
        "",
        ["model.safetensors: not a safetensors file (its first 8 bytes give a header of", "copy them again"],
    ),
    "index-naming-a-file-outside": (
        {"add": {"model.safetensors.index.json": json.dumps({"weight_map": {"w": "../other/model.safetensors"}})}},
        "",
        ["weight_map names '../other/model.safetensors', not a file of the folder"],
    ),
    "index-beside-a-single-file": (  # was: the shards trained, transformers loading model.safetensors
        {
            "add": {
                "model.safetensors.index.json": json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}),
                "model-00001-of-00001.safetensors": "",
            }
        },
        "",
        ["holds both model.safetensors and model.safetensors.index.json (of model-00001-of-00001.safetensors)"],
    ),
    "a-stale-index-beside-a-single-file": (  # transformers' save_pretrained leaves an older save's index
        {
            "add": {
                "model.safetensors.index.json": json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors"}})
            }
        },
        "",
        [
            "model.safetensors.index.json lists model-00001-of-00002.safetensors, which the folder does not hold",
            "remove model.safetensors.index.json",
        ],
    ),
    "index-without-a-map": (
        {"add": {"model.safetensors.index.json": json.dumps({"weight_map": ["model.safetensors"]})}},
        "",
        ["not a safetensors index (no weight_map of tensor names to files", "copy the model's files again"],
    ),
    "gpu-memory": (
        {},
        "kubernetes:\n  gpu_memory_gb: 0.001\n",
        ["kubernetes.gpu_memory_gb 0.001:", "train.method full", "1.0 MiB", "train.strategy: fsdp", "lora"],
    ),
    "replica-memory": (
        {},
        "kubernetes:\n  memory: 1Mi\n",
        ["kubernetes.memory 1Mi:", "in each replica", "a larger kubernetes.memory"],
    ),
    "hub-uri": (None, "", ["model.init_from 'hf://org/na me'", "hf://<org>/<name>"]),
    # A misspelled entry beside a good one: peft drops it in silence.
    "lora-target-misspelled": (
        {},
        LORA + "lora:\n  target_modules: [q_proj, foo_proj]\n",
        ["lora.target_modules ['foo_proj']: not found in the model", "q_proj", "v_proj"],
    ),
    # peft's own special value: said as such (was: "not found in the model" alone).
    "lora-target-all-linear": (
        {},
        LORA + "lora:\n  target_modules: [all-linear]\n",
        ["lora.target_modules ['all-linear']: not found", "peft's 'all-linear' is not taken here: list the layers"],
    ),
    # lm_head tied to the embeddings, an adapter on it, merged at export: found before the run.
    "merge-a-tied-copy": (
        {"config": {"tie_word_embeddings": True}, "drop_tensors": ("lm_head.weight",)},
        LORA + "lora:\n  target_modules: [q_proj, lm_head]\nexport:\n  merge_lora: true\n",
        ["export.merge_lora: the adapter on 'lm_head' changes a weight tied to another one", "merge_lora: false"],
    ),
    # ... and on the tie's other side, the embeddings (was: merged into the one tensor, which changed
    # lm_head too: the exported model's loss far from the reported one).
    "merge-a-tied-source": (
        {"config": {"tie_word_embeddings": True}, "drop_tensors": ("lm_head.weight",)},
        LORA + "lora:\n  target_modules: [q_proj, embed_tokens]\nexport:\n  merge_lora: true\n",
        ["export.merge_lora: the adapter on 'model.embed_tokens' changes a weight tied to another one"],
    ),
    "lora-rank-past-a-layer": ({}, LORA + "lora:\n  rank: 1000\n", ["lora.rank: 1000 is larger than the smaller"]),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_base_model_is_refused_on_one_line_naming_the_fix(case, folder, tmp_path):
    variant, extra, phrases = REFUSED[case]
    if case == "no-folder":
        init_from = str(tmp_path / "no-such-model")
    elif case == "weights-cut-short":
        init_from = model_variant(folder, tmp_path / "model")
        weights = Path(init_from) / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-1000])
    elif case == "a-file":
        init_from = str(tmp_path / "config.yaml")
        (tmp_path / "config.yaml").write_text("train: {}\n")
    elif case == "hub-uri":
        init_from = "hf://org/na me"
    else:
        init_from = model_variant(folder, tmp_path / "model", **variant)
    with pytest.raises(KftrainError) as info:
        check(init_from, extra)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message, message
    for phrase in phrases:
        assert phrase in message, message


def test_an_hf_model_is_fetched_by_the_pre_flight_only_where_the_steps_run_here(monkeypatch):
    """`kftrain run --local` (hub=True) asks the Hub before any step, as data prep would on this
    machine (was: the run started and data prep failed on it); a cluster's configure step, without
    the network and the token, checks the URI's form. The Hub here is a closed port: no network."""
    import huggingface_hub.constants

    from trainer.pretrained import PretrainedError

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    cfg = parse_config(base_model_config("hf://kftrain-tests/no-such-model"))
    check_base_model(cfg)  # the form alone
    with pytest.raises(PretrainedError, match="'hf://kftrain-tests/no-such-model': cannot fetch it from the Hugging"):
        check_base_model(cfg, hub=True)


@pytest.mark.parametrize(
    ("variant", "extra"),
    [
        ({}, ""),
        ({}, LORA),
        ({}, LORA + "lora:\n  target_modules: [q_proj, k_proj, v_proj, o_proj, down_proj]\n"),
        ({}, CHAT),
        # The chat template where older transformers kept it: in tokenizer_config.json.
        (
            {"drop": ("chat_template.jinja",), "tokenizer_config": {"chat_template": "{{ messages }}"}},
            CHAT,
        ),
        (
            {"drop": ("chat_template.jinja",), "add": {"chat_template.json": json.dumps({"chat_template": "{{ x }}"})}},
            CHAT,
        ),
        ({}, "kubernetes:\n  gpu_memory_gb: 80\n"),
        ({}, "kubernetes:\n  memory: 8Gi\n"),
        (
            {},
            "kubernetes:\n  gpu_memory_gb: 0\n  memory: 1Mi\n  gpus_per_node: 1\njob:\n  nproc_per_node: 1\n",
        ),
    ],
)
def test_a_good_base_model_passes(folder, tmp_path, variant, extra):
    check(model_variant(folder, tmp_path / "model", **variant), extra + f"model:\n  block_size: {CONTEXT}\n")


def test_a_tied_model_whose_files_hold_their_own_lm_head_is_said_to_train_the_embeddings(tmp_path, caplog):
    """transformers 5 unties the two where they differ (was: tied in silence, a different model)."""
    from safetensors.torch import load_file, save_file

    tied = tiny_llama_folder(tmp_path / "tied", tie=True)
    weights = load_file(Path(tied) / "model.safetensors")
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"] + 1
    save_file(weights, Path(tied) / "model.safetensors", metadata={"format": "pt"})
    check(tied, f"model:\n  block_size: {CONTEXT}\n")
    (said,) = [r.getMessage() for r in caplog.records if "tie_word_embeddings" in r.getMessage()]
    assert "the weights hold their own 'lm_head.weight' too" in said and "set tie_word_embeddings: false" in said
    caplog.clear()
    check(tiny_llama_folder(tmp_path / "plain", tie=True), f"model:\n  block_size: {CONTEXT}\n")
    assert not [r for r in caplog.records if "tie_word_embeddings" in r.getMessage()]


def test_a_hub_model_is_checked_for_its_form_only():
    """No network in this tier: a well-formed hf:// URI passes without the Hub being asked."""
    check("hf://Qwen/Qwen3-0.6B@main")


def test_no_base_model_means_no_check():
    check_base_model(parse_config("task: causal_lm\n"))


def test_a_store_that_fails_is_named_with_the_field(tmp_path, monkeypatch, folder):
    from trainer import pretrained
    from trainer.storage import StoreError

    def fail(source):
        raise StoreError("connection refused")

    monkeypatch.setattr(pretrained, "tensor_index", fail)
    with pytest.raises(StoreError, match=r"^model.init_from .*tiny-llama: connection refused$"):
        check(folder)


# -- the memory estimate ----------------------------------------------------------------------

GIB = 2**30
#: Qwen2-7B's parameter count (untied embeddings), and a LoRA of rank 16 on q_proj and v_proj.
SEVEN_B, ADAPTERS = 7_615_616_512, 5_046_272


@pytest.mark.parametrize(
    ("method", "shards", "frozen", "expected"),
    [
        ("full", 1, 2, 16 * SEVEN_B),
        ("full", 8, 2, 16 * SEVEN_B // 8),
        ("lora", 1, 2, 2 * SEVEN_B + 16 * ADAPTERS),
        ("lora", 4, 4, (4 * SEVEN_B + 16 * ADAPTERS) // 4),
        ("full", 3, 2, -(-16 * SEVEN_B // 3)),  # a remainder rounds up
    ],
)
def test_state_bytes_per_rank(method, shards, frozen, expected):
    assert state_bytes_per_rank(SEVEN_B, ADAPTERS, method, shards, frozen) == expected


def memory_config(**fields) -> str:
    lines = {"kubernetes": [], "train": [], "job": []}
    for dotted, value in fields.items():
        section, name = dotted.split("__")
        lines[section].append(f"  {name}: {value}")
    body = "".join(f"{s}:\n" + "\n".join(v) + "\n" for s, v in lines.items() if v)
    return "task: causal_lm\nmodel:\n  init_from: /models/qwen2-7b\n" + body


@pytest.mark.parametrize(
    ("fields", "adapters", "refused"),
    [
        # 16 bytes x 7.6B = 113.5 GiB: no 80 GiB GPU holds it under DDP...
        ({"kubernetes__gpu_memory_gb": 80}, 0, True),
        # ...FSDP over 2 ranks (the default job) still needs 56.7 GiB, over 8 ranks 14.2 GiB.
        ({"kubernetes__gpu_memory_gb": 40, "train__strategy": "fsdp"}, 0, True),
        ({"kubernetes__gpu_memory_gb": 80, "train__strategy": "fsdp"}, 0, False),
        ({"kubernetes__gpu_memory_gb": 16, "train__strategy": "fsdp", "job__replicas": 8}, 0, False),
        # LoRA: the bf16 base is 14.2 GiB on each DDP rank; in fp32 (precision fp32) 28.4 GiB.
        ({"kubernetes__gpu_memory_gb": 24, "train__method": "lora"}, ADAPTERS, False),
        ({"kubernetes__gpu_memory_gb": 24, "train__method": "lora", "train__precision": "fp32"}, ADAPTERS, True),
        # An elastic job can run at its fewest replicas: those hold the largest shards.
        (
            {
                "kubernetes__gpu_memory_gb": 16,
                "train__strategy": "fsdp",
                "job__replicas": 8,
                "kubernetes__elastic": "{enabled: true, min_replicas: 4, max_replicas: 8}",
                "train__batch_size": 840,  # divides by every world size from 4 to 8
            },
            0,
            True,
        ),
        # A CPU job: the replica's memory holds nproc_per_node ranks.
        ({"kubernetes__memory": "200Gi", "job__nproc_per_node": 2, "train__batch_size": 64}, 0, True),
        ({"kubernetes__memory": "256Gi"}, 0, False),
        # Nothing set, or GPUs without gpu_memory_gb (kubernetes.memory is the host's then): no check.
        ({}, 0, False),
        ({"kubernetes__memory": "1Gi", "kubernetes__gpus_per_node": 1, "job__nproc_per_node": 1}, 0, False),
    ],
)
def test_the_training_state_must_fit_the_configured_memory(fields, adapters, refused):
    cfg = parse_config(memory_config(**fields))
    if refused:
        with pytest.raises(ConfigError):
            check_model_memory(cfg, SEVEN_B, adapters)
    else:
        check_model_memory(cfg, SEVEN_B, adapters)


def test_the_memory_message_names_the_estimate_the_limit_and_the_fixes():
    cfg = parse_config(memory_config(kubernetes__gpu_memory_gb=80, job__replicas=4))
    with pytest.raises(ConfigError) as info:
        check_model_memory(cfg, SEVEN_B, 0)
    assert str(info.value) == (
        "kubernetes.gpu_memory_gb 80: training '/models/qwen2-7b' (7.62B parameters, train.method full, "
        "train.strategy ddp) needs at least 113.5 GiB in each GPU before activations (weights, gradients and "
        "AdamW moments in fp32: 16 bytes per parameter), more than its 80.0 GiB; use train.strategy: fsdp "
        "(28.4 GiB over the 4 ranks), train.method: lora (the frozen base alone: 14.2 GiB), at least 2 ranks "
        "under fsdp (job.replicas x job.nproc_per_node, now 4), or larger GPUs"
    )


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"lora.rank": 4}, ["lora.rank: set, but LoRA is off (train.method 'full'): no effect"]),
        # A LoRA config switched to full fine-tuning (was: refused, failing a pipeline run that set train_method).
        (
            {"task": "causal_lm", "model.init_from": "/m", "export.merge_lora": True},
            ["export.merge_lora: set, but LoRA is off (train.method 'full'): no effect"],
        ),
        (
            {"model.n_layer": 48, "data.max_bytes": 5},
            ["data.max_bytes: set, but only task 'causal_lm' reads it", "model.n_layer: set, but only task"],
        ),
        ({"task": "causal_lm", "model.hidden_sizes": [8]}, ["model.hidden_sizes: set, but only task 'classification'"]),
        ({"data.eval_prompts": ["hi"]}, ["data.eval_prompts: set, but only task 'causal_lm' reads it"]),
        ({"task": "causal_lm", "model.n_layer": 2, "data.tokenizer": "bpe:300"}, []),  # its own fields
        ({"model.hidden_sizes": [8], "train.epochs": 3}, []),
        ({"model.hidden_sizes": [128, 64]}, []),  # the default, written out
        ({"task": "causal_lm", "model.dropout": 0.1}, []),  # both tasks read these two
        ({"data.shard_rows": 64}, []),
        # A field another setting decides instead of (a pipeline's `epochs` over a config with max_steps).
        ({"train.max_steps": 100, "train.epochs": 1}, ["train.epochs: set, but train.max_steps (100) decides"]),
        ({"train.max_steps": 100}, []),
        ({"train.epochs": 1}, []),
        ({"train.max_consecutive_skips": 3}, ["train.max_consecutive_skips: set, but it counts skipped updates"]),
        ({"train.max_consecutive_skips": 3, "train.on_nonfinite": "skip"}, []),
        ({"train.bucket_cap_mb": 50, "train.strategy": "fsdp"}, ["train.bucket_cap_mb: set, but DDP's gradient"]),
        ({"train.bucket_cap_mb": 50}, []),
        ({"train.divergence_check_steps": 10, "train.strategy": "fsdp"}, ["train.divergence_check_steps: set, but"]),
        ({"train.divergence_check_steps": 10}, []),
        ({"train.activation_checkpointing": True}, ["train.activation_checkpointing: set, but the classifier's MLP"]),
        # A local run fills checkpoint.uri in itself (was: "checkpoint.uri: set" on every run without checkpoints).
        ({"checkpoint.enabled": False, "checkpoint.uri": "/out/runs/r1/checkpoints"}, []),
        (
            {"checkpoint.enabled": False, "checkpoint.keep_last": 5, "checkpoint.interval_steps": 10},
            [
                "checkpoint.interval_steps: set, but checkpoint.enabled is false",
                "checkpoint.keep_last: set, but checkpoint.enabled is false",
            ],
        ),
        (
            {"task": "causal_lm", "data.eval_prompts": ["hi"], "model.trust_remote_code": True},
            ["data.eval_prompts: set, but only a pretrained model's run", "model.trust_remote_code: set, but only"],
        ),
        (
            {"task": "causal_lm", "model.init_from": "/m", "model.dropout": 0.5},
            ["model.dropout: set, but the pretrained model's config.json sets its dropout"],
        ),
        (
            {"task": "causal_lm", "data.tokenizer_sample_bytes": 1000},
            ["data.tokenizer_sample_bytes: set, but it bounds the text a bpe: tokenizer trains on"],
        ),
        ({"task": "causal_lm", "data.tokenizer": "bpe:300", "data.tokenizer_sample_bytes": 1000}, []),
        ({"data.label_column": "target"}, ["data.label_column: set, but the built-in 'digits' source has its own"]),
        ({"data.label_column": "target", "data.source": "/d/t.csv"}, []),
        ({"task": "causal_lm", "data.text_field": "body"}, ["data.text_field: set, but the built-in 'python-stdlib'"]),
        ({"task": "causal_lm", "data.text_field": "body", "data.source": "/d/c.jsonl"}, []),
        (
            {"task": "causal_lm", "data.text_field": "body", "data.source": "/d/c.txt", "data.format": "text"},
            ["data.text_field: set, but data.format is 'text', which reads no text field"],
        ),
        (
            {"task": "causal_lm", "data.messages_field": "turns", "data.source": "/d/c.jsonl"},
            ["data.messages_field: set, but only chat data reads it (data.format is 'auto')"],
        ),
        ({"task": "causal_lm", "data.num_proc": 4}, ["data.num_proc: set, but the bytes tokenizer makes its tokens"]),
        ({"task": "causal_lm", "data.num_proc": 4, "data.tokenizer": "bpe:300"}, []),
        ({"export.max_shard_bytes": 1000}, ["export.max_shard_bytes: set, but only a fine-tuned pretrained model"]),
        # Elastic bounds without elasticity, a runtime for a PyTorchJob (were: ignored in silence).
        (
            {"kubernetes.elastic.max_replicas": 4, "kubernetes.elastic.max_restarts": 9},
            [
                "kubernetes.elastic.max_replicas: set, but kubernetes.elastic.enabled is false",
                "kubernetes.elastic.max_restarts: set, but kubernetes.elastic.enabled is false",
            ],
        ),
        ({"kubernetes.elastic.enabled": True, "kubernetes.elastic.max_replicas": 4, "train.batch_size": 48}, []),
        ({"kubernetes.runtime": "my-runtime"}, ["kubernetes.runtime: set, but only a TrainJob runs on"]),
        ({"kubernetes.runtime": "my-runtime", "job.kind": "trainjob"}, []),
        ({"kubernetes.runtime": "my-runtime", "job.kind": "auto"}, []),
        # Two reasons, one line: the first.
        ({"task": "causal_lm", "data.messages_field": "turns"}, ["data.messages_field: set, but the built-in"]),
        ({"task": "causal_lm", "model.init_from": "/m", "export.max_shard_bytes": 1000}, []),
    ],
)
def test_a_setting_the_run_never_reads_is_named(overrides, said):
    """Another built-in task's field, or LoRA's without train.method lora: the configure step
    warns, one line each (not an error: a config is often switched between tasks)."""
    from trainer.checks import ignored_settings
    from trainer.config import load_config

    lines = ignored_settings(load_config(overrides=overrides))
    assert len(lines) == len(said) and all(line.startswith(s) for line, s in zip(lines, said, strict=True)), lines


def test_a_resume_on_a_base_model_replaced_in_place_is_refused_before_any_step(folder, tmp_path):
    """The configure step compares the base weights' fingerprint (a few ranged reads of samples,
    :func:`trainer.pretrained.weights_fingerprint`) with the checkpoint's, and the step limit with
    its step, so neither is found after data prep."""
    import shutil

    from safetensors.torch import load_file, save_file

    from trainer import pretrained
    from trainer.checkpoint import CheckpointError
    from trainer.checks import check_continues
    from trainer.config import to_dict

    base = tmp_path / "base"
    shutil.copytree(folder, base)
    cfg = parse_config(base_model_config(str(base), "train:\n  max_steps: 8\n"))
    record = {
        "step": 5,
        "position": {"epoch": 0, "epoch_step": 5},
        "config": to_dict(cfg),
        "inputs": {"base_model": pretrained.weights_fingerprint(pretrained.source_for(cfg, weights=False))},
    }
    check_continues(cfg, record, "start without resume_from")
    fewer = parse_config(base_model_config(str(base), "train:\n  max_steps: 4\n"))
    with pytest.raises(CheckpointError, match="train.max_steps 4 ends before the checkpoint's step 5"):
        check_continues(fewer, record, "start without resume_from")
    weights = base / pretrained.SINGLE_FILE
    save_file({k: v + 0.01 for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"model.init_from '{base}' holds other weights than when the checkpoint"):
        check_continues(cfg, record, "start without resume_from")


LM = {"task": "causal_lm"}
S3 = {"store.uri": "s3://kftrain-runs/r", "store.endpoint": "http://127.0.0.1:9000"}


@pytest.mark.parametrize(
    ("overrides", "settings", "refused"),
    [
        ({}, {"min_accuracy": -1.0}, "min_accuracy -1: must be a number in [0, 1]"),  # was: the gate off
        ({}, {"min_accuracy": 90.0}, "min_accuracy 90: must be a number in [0, 1]"),  # a percentage
        ({}, {"min_accuracy": math.nan}, "min_accuracy nan: must be a number in [0, 1]"),
        (LM, {"max_perplexity": -1.0}, "max_perplexity -1: must be 0 (no bar) or a number of at least 1"),
        # a perplexity is never below 1: the gate could never pass (was: accepted)
        (LM, {"max_perplexity": 0.5}, "max_perplexity 0.5: must be 0 (no bar) or a number of at least 1"),
        (LM, {"max_perplexity": 1.0}, ""),
        ({}, {"max_perplexity": 1.5}, "max_perplexity 1.5: task 'classification' reports no perplexity"),
        (LM, {"min_accuracy": 0.5}, "min_accuracy 0.5: task 'causal_lm' reports no accuracy"),
        ({}, {"launcher": "Local"}, "launcher 'Local': must be one of auto, local, kubernetes"),
        ({"store.uri": "/tmp/runs"}, {"launcher": "kubernetes"}, "store.uri"),  # pods share no disk
        ({**S3, "checkpoint.uri": "/tmp/ckpt"}, {"launcher": "kubernetes"}, "checkpoint.uri"),
        # never written: no checkpoint for pods to share (was: refused all the same)
        ({**S3, "checkpoint.uri": "/tmp/ckpt", "checkpoint.enabled": False}, {"launcher": "kubernetes"}, ""),
        ({}, {}, ""),  # the pipeline's defaults, on either task
        (LM, {}, ""),
        (LM, {"max_perplexity": 40.0}, ""),
        (S3, {"launcher": "kubernetes", "min_accuracy": 0.0}, ""),
        ({"store.uri": "/tmp/runs"}, {"launcher": "local"}, ""),
    ],
)
def test_the_pipeline_s_own_parameters_are_checked_in_its_first_step(overrides, settings, refused):
    """What the KFP UI takes beside the config: a bad value was found at the training step (a
    launcher typo, after data prep), after training (a local store on a cluster), or never (a
    negative min_accuracy turned the gate off, a perplexity bar on a classifier was ignored)."""
    cfg = load_config(overrides=overrides)
    given = {"launcher": "auto", "min_accuracy": GATE_DEFAULTS["min_accuracy"], "max_perplexity": 0.0, **settings}
    if not refused:
        check_run_settings(cfg, **given)
        return
    with pytest.raises(ConfigError) as err:
        check_run_settings(cfg, **given)
    assert str(err.value).startswith(refused), str(err.value)


@pytest.mark.parametrize(
    ("source", "writes", "refused"),
    [
        ("{tmp}/corpus/", {"output_dir": "{tmp}/corpus/out"}, "--output-dir"),  # was: trained on its own logs
        ("{tmp}/corpus", {"output_dir": "{tmp}/corpus"}, "--output-dir"),
        ("{tmp}/corpus", {"store.uri": "{tmp}/corpus/runs"}, "store.uri"),
        ("{tmp}/corpus", {"checkpoint.uri": "{tmp}/corpus/ck"}, "checkpoint.uri"),
        ("s3://bkt/data/", {"store.uri": "minio://bkt/data/runs"}, "store.uri"),  # one store, two schemes
        ("{tmp}/corpus", {"output_dir": "{tmp}/corpus-out"}, ""),  # a neighbour whose name starts alike
        ("{tmp}/corpus/t.txt", {"output_dir": "{tmp}/corpus"}, ""),  # beside a one-file source
        ("s3://bkt", {"store.uri": "s3://bkt/runs"}, "store.uri"),  # a whole bucket (was: not seen)
        ("s3://bkt/data/", {"store.uri": "s3://other/data/runs"}, ""),
        ("s3://bkt/data/", {"store.uri": "{tmp}/corpus"}, ""),  # a local folder is not the bucket
        ("{tmp}/corpus", {"checkpoint.uri": "{tmp}/corpus/ck", "checkpoint.enabled": False}, ""),  # never written
        # Through a link in the source to a folder it reads (was: past the pre-flight, then data
        # prep read the run's own files)
        ("{tmp}/corpus", {"output_dir": "{tmp}/outz"}, "--output-dir"),  # corpus/zz -> outz
        ("{tmp}/corpus", {"store.uri": "{tmp}/outz/store"}, "store.uri"),
        ("{tmp}/corpus", {"output_dir": "{tmp}/elsewhere"}, ""),
        # A file a command writes (was: `--summary` into the source, trained on by the next run)
        ("{tmp}/corpus", {"--summary": "{tmp}/corpus/summary.json"}, "--summary"),
        ("{tmp}/corpus/t.txt", {"--summary": "{tmp}/corpus/t.txt"}, "--summary"),  # the one-file source itself
        ("{tmp}/corpus", {"--output": "{tmp}/outz/plan.md"}, "--output"),  # through the link
        ("{tmp}/corpus", {"--summary": "{tmp}/summary.json"}, ""),
        # A file's path, whatever it reads as (was: refused as a malformed store URI, naming no flag)
        ("{tmp}/corpus", {"--summary": "{tmp}/corpus/out.json "}, "--summary"),
        ("{tmp}/corpus", {"--summary": "s3:report.json"}, ""),
    ],
)
def test_a_run_never_writes_inside_its_data_source(tmp_path, source, writes, refused):
    from trainer.checks import check_writes_outside_inputs, run_writes

    (tmp_path / "corpus").mkdir()
    (tmp_path / "outz").mkdir()
    (tmp_path / "corpus" / "zz").symlink_to(tmp_path / "outz")
    fill = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in writes.items()}
    output_dir = fill.pop("output_dir", "")
    files = {flag: fill.pop(flag) for flag in ("--summary", "--output") if flag in fill}
    cfg = load_config(overrides={"data.source": source.format(tmp=tmp_path), **fill})
    writes = {**run_writes(cfg, output_dir), **files}
    if not refused:
        check_writes_outside_inputs(cfg, writes)
        return
    with pytest.raises(ConfigError, match=f"^{re.escape(refused)} .* is inside data.source .*: data prep would read"):
        check_writes_outside_inputs(cfg, writes)


@pytest.mark.parametrize(
    ("writes", "refused"),
    [
        ({"--output-dir": "{model}"}, "--output-dir"),  # was: runs and exports inside the base model's folder
        ({"store.uri": "{model}/runs"}, "store.uri"),
        ({"--summary": "{model}/summary.json"}, "--summary"),
        ({"--output-dir": "{tmp}/out"}, ""),
        ({"--output-dir": "{tmp}"}, ""),  # the folder holding the model's: beside it, not in it
    ],
)
def test_a_run_never_writes_inside_its_base_model(tmp_path, writes, refused):
    from trainer.checks import check_writes_outside_inputs

    model = tmp_path / "base"
    model.mkdir()
    cfg = load_config(overrides={"task": "causal_lm", "model.init_from": str(model), "data.source": "python-stdlib"})
    writes = {flag: path.format(model=model, tmp=tmp_path) for flag, path in writes.items()}
    if not refused:
        check_writes_outside_inputs(cfg, writes)
        return
    with pytest.raises(ConfigError, match=f"^{re.escape(refused)} .* is inside model.init_from .*: the run's files"):
        check_writes_outside_inputs(cfg, writes)


def test_a_leftover_tensor_transformers_drops_is_no_refusal(folder, tmp_path):
    """An older save's per-layer rotary table, which transformers' loader itself drops, is no sign
    of another model (the check of unused tensors refuses the rest)."""
    check(model_variant(folder, tmp_path / "model", add_tensors=("model.layers.0.self_attn.rotary_emb.inv_freq",)))


@pytest.mark.parametrize("case", ["a-stale-map", "the-map-over-the-config"])
def test_the_tokens_transformers_does_not_read_are_not_refused(case, folder, tmp_path):
    """transformers reads special_tokens_map.json only where tokenizer_config.json has no
    `added_tokens_decoder`, and then over it key by key: a token the unread map names, or one the
    map overrides, is no token transformers adds (a map it reads that names one is refused,
    test_a_bad_base_model_is_refused_on_one_line_naming_the_fix)."""
    if case == "a-stale-map":
        added = json.loads((Path(folder) / "tokenizer.json").read_text())["added_tokens"]
        decoder = {str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added}
        changes, the_map = {"added_tokens_decoder": decoder}, '{"pad_token": "<pad>"}'
    else:
        changes, the_map = {"pad_token": "<pad>"}, '{"pad_token": "<|endoftext|>"}'
    check(model_variant(folder, tmp_path / "model", tokenizer_config=changes, add={"special_tokens_map.json": the_map}))


@pytest.mark.parametrize(
    "overrides",
    [
        {"model.hidden_sizes": [128, 64]},
        {"model.hidden_sizes": [3]},
        {"task": "causal_lm", "model.n_layer": 2, "model.n_head": 4, "model.n_embd": 64, "model.block_size": 64},
    ],
)
def test_the_scratch_parameter_count_is_a_lower_bound_of_the_built_models(overrides):
    """At the least the data can give (one feature and two classes; 256 tokens): never above the model built."""
    from trainer.checks import scratch_parameters
    from trainer.gpt import GPT, GPTConfig
    from trainer.tasks.classification.model import build_mlp

    cfg = load_config(overrides=overrides)
    m = cfg.model
    if cfg.task == "classification":
        model = build_mlp(1, m.hidden_sizes, 2, 0.0)
    else:
        model = GPT(
            GPTConfig(vocab_size=256, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head, n_embd=m.n_embd)
        )
    built = sum(p.numel() for p in model.parameters())
    assert 0.9 * built <= scratch_parameters(cfg) <= built


@pytest.mark.parametrize(
    ("overrides", "memory", "said"),
    [
        # Was: passed every check, then "can't allocate 4398046511104 bytes" in the replicas, naming no field.
        (
            {"model.hidden_sizes": [1_000_000, 1_000_000]},
            24 * 2**30,
            "this machine's memory: training the classification model of model.* (at least 1000.01B parameters, "
            "train.method full, train.strategy ddp) needs at least 29802.5 GiB in this machine, where all 2 local "
            "ranks run, before activations (weights, gradients and AdamW moments in fp32: 16 bytes per parameter, x "
            "2 local ranks), more than its 24.0 GiB; use train.strategy: fsdp (14901.2 GiB for the 2 ranks together), "
            "a smaller model (model.hidden_sizes), or a machine with more memory",
        ),
        (
            {"task": "causal_lm", "model.n_layer": 48, "model.n_head": 64, "model.n_embd": 8192, "job.replicas": 1},
            64 * 2**30,
            "(at least 38.67B parameters, train.method full, train.strategy ddp) needs at least 576.2 GiB in this "
            "machine before activations",
        ),
        ({"model.hidden_sizes": [1000, 1000]}, 24 * 2**30, None),
    ],
)
def test_a_model_from_scratch_that_cannot_fit_this_machine_is_refused_before_any_step(
    monkeypatch, overrides, memory, said
):
    from trainer import checks

    monkeypatch.setattr(checks, "_total_memory", lambda: memory)
    monkeypatch.setattr(checks, "_ranks_on_cpu", lambda: True)
    cfg = load_config(overrides=overrides)
    checks.check_scratch_model(cfg)  # not a local run: no limit of this machine's
    if said is None:
        checks.check_scratch_model(cfg, here=True)
        return
    with pytest.raises(ConfigError) as err:
        checks.check_scratch_model(cfg, here=True)
    assert said in str(err.value)


def test_a_model_from_scratch_past_the_configured_gpu_memory_is_refused():
    from trainer.checks import check_scratch_model

    cfg = load_config(
        overrides={
            "task": "causal_lm",
            "model.n_layer": 48,
            "model.n_head": 64,
            "model.n_embd": 8192,
            "kubernetes.gpus_per_node": 8,
            "job.nproc_per_node": 8,
            "kubernetes.gpu_memory_gb": 80,
        }
    )
    with pytest.raises(ConfigError, match=r"^kubernetes.gpu_memory_gb 80: training the causal_lm model of model\.\*"):
        check_scratch_model(cfg)


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"AWS_REGION": "not a region"}, "$AWS_REGION: 'not a region' is not a region name"),
        ({"AWS_ENDPOINT_URL": "minio:9000"}, "$AWS_ENDPOINT_URL: S3 endpoint 'minio:9000' must be a URL"),
    ],
)
def test_a_bad_store_setting_from_the_environment_is_named_alone(monkeypatch, env, said):
    """Was: "store.uri: $AWS_REGION: ..." (or "store.uri: store.region: ..."), blaming a field that is fine."""
    from trainer.checks import check_writable
    from trainer.storage import StoreSettingError

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    cfg = load_config(overrides={"store.uri": "s3://bucket/prefix"})
    with pytest.raises(StoreSettingError) as err:
        check_writable(cfg, cfg.store.uri, "store.uri")
    assert str(err.value).startswith(said), err.value


@pytest.mark.parametrize(
    ("on_cpu", "overrides"),
    [
        (False, {}),  # a GPU here: the ranks' state is in GPU memory (was: refused against the host's)
        (True, {"kubernetes.gpus_per_node": 2, "job.nproc_per_node": 2}),
    ],
    ids=["cuda-here", "gpus-configured"],
)
def test_this_machine_s_memory_bounds_only_ranks_that_train_on_its_cpu(monkeypatch, on_cpu, overrides):
    from trainer import checks

    monkeypatch.setattr(checks, "_total_memory", lambda: 32 * 2**30)
    monkeypatch.setattr(checks, "_ranks_on_cpu", lambda: on_cpu)
    big = {"task": "causal_lm", "model.n_layer": 24, "model.n_head": 16, "model.n_embd": 2048, **overrides}
    checks.check_scratch_model(load_config(overrides=big), here=True)


@pytest.mark.parametrize(
    ("driver", "on_cpu"), [(None, True), ("/proc/driver/nvidia", False), ("/dev/kfd", False)], ids=str
)
def test_ranks_count_as_on_the_cpu_only_where_no_gpu_driver_shows(monkeypatch, driver, on_cpu):
    from trainer import checks

    monkeypatch.delitem(sys.modules, "torch", raising=False)  # the pre-flight does not import it
    monkeypatch.setattr(checks.os.path, "exists", lambda path: path == driver)
    assert checks._ranks_on_cpu() is on_cpu


def test_a_memory_refusal_with_one_fix_reads_as_one(monkeypatch):
    """Was: "...; use , or a machine with more memory" (a LoRA run on one rank)."""
    from trainer import checks

    monkeypatch.setattr(checks, "_total_memory", lambda: 16 * 2**30)
    monkeypatch.setattr(checks, "_ranks_on_cpu", lambda: True)
    cfg = load_config(
        overrides={"task": "causal_lm", "model.init_from": "/m", "train.method": "lora", "job.replicas": 1}
    )
    with pytest.raises(ConfigError) as err:
        checks.check_model_memory(cfg, 8_000_000_000, 1_000_000, here=True)
    assert str(err.value).endswith("more than its 16.0 GiB; use a machine with more memory"), err.value


# (field, as given, as the run records it: "{cwd}" the working directory, "{home}" the home folder)
PINNED = [
    ("data.source", "data/chat.jsonl", "{cwd}/data/chat.jsonl"),
    ("data.source", "./data/../data/x.csv", "{cwd}/data/x.csv"),
    ("data.source", "~/corpus", "{home}/corpus"),
    ("data.source", "/abs/corpus", "/abs/corpus"),
    ("data.source", "s3://bucket/corpus", "s3://bucket/corpus"),
    ("data.source", "digits", "digits"),  # a built-in source, not a path
    ("model.init_from", "kftrain-outputs/example/tiny-llama", "{cwd}/kftrain-outputs/example/tiny-llama"),
    ("model.init_from", "hf://org/name", "hf://org/name"),
    ("data.tokenizer", "tok/tokenizer.json", "{cwd}/tok/tokenizer.json"),
    ("data.tokenizer", "bpe:512", "bpe:512"),
    ("store.uri", "out/store", "{cwd}/out/store"),
    ("checkpoint.uri", "ck", "{cwd}/ck"),
]


@pytest.mark.parametrize(("field", "given", "pinned"), PINNED)
def test_a_run_s_relative_local_paths_are_pinned_absolute(tmp_path, monkeypatch, field, given, pinned):
    """Was: kept relative in the run's records and model card, so a `--run-id` continuation from
    another folder read another place ("no object there")."""
    from trainer.checks import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    task = {"data.source": "causal_lm", "model.init_from": "causal_lm", "data.tokenizer": "causal_lm"}
    overrides = {"task": task.get(field, "classification"), field: given}
    if field == "data.source" and given == "digits":
        overrides["task"] = "classification"
    cfg = with_absolute_paths(parse_config("", overrides))
    section, name = field.split(".")
    home = str(Path.home())
    assert getattr(getattr(cfg, section), name) == pinned.format(cwd=tmp_path, home=home)
