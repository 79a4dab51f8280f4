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


def text_config(folder, source, **overrides):
    """A causal_lm config fine-tuning the model in `folder` on the text at `source`."""
    from trainer.config import load_config

    return load_config(
        overrides={
            "task": "causal_lm",
            "model.init_from": str(folder),
            "model.block_size": 16,
            "data.source": str(source),
            **overrides,
        }
    )


def _sentencepiece_style_folder(tmp_path, words: list[str]):
    """The tiny Llama with a tokenizer shaped as transformers writes Llama 2's and Mistral's: a
    `▁` before each word, before the first only at the very start of the input (Metaspace,
    prepend_scheme "first"), `<s>` put before a text, `</s>` its end."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    folder = tmp_path / "spm"
    shutil.copytree(tiny_llama_folder(tmp_path / "tiny"), folder)
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate([*specials, *words, *(f"\u2581{w}" for w in words), "\u2581", "\n"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config.update(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer_config.pop("added_tokens_decoder", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    for name in ("special_tokens_map.json", "generation_config.json"):
        (folder / name).unlink(missing_ok=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "bos_token_id": 1, "eos_token_id": 2}))
    return folder


def test_a_sentencepiece_style_tokenizer_reads_each_document_from_its_start(tmp_path):
    """Each record's first word gets the `▁` transformers' `tokenizer(text)` gives it (was: read
    as the middle of a text after the previous record's end, `Story` not `▁Story`: the model
    fine-tuned on input that serving never sends)."""
    import json

    import numpy as np
    from transformers import PreTrainedTokenizerFast

    from trainer.shards import read_shard, split_shards
    from trainer.storage import LocalStore

    texts = [f"record {i} alpha beta" for i in range(300)]
    folder = _sentencepiece_style_folder(tmp_path, ["record", "alpha", "beta", *map(str, range(300))])
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = text_config(folder, tmp_path / "d.jsonl")
    manifest = PretrainedLMTask().prepare(cfg, LocalStore(), str(tmp_path / "ds"))
    assert manifest["document_marks"] == {"start": "<s>", "end": "</s>"}
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    expected = {tuple(hf(t)["input_ids"]) for t in texts}  # <s> and the text's ids, as transformers makes them
    found = 0
    for split in ("train", "val", "test"):
        tokens = np.concatenate(
            [
                read_shard(LocalStore(), str(tmp_path / "ds"), i)
                for i in split_shards(manifest, split, str(tmp_path / "ds"))
            ]
        ).tolist()
        starts = [i for i, t in enumerate(tokens) if t == 1]
        for at in starts:
            end = tokens.index(2, at) if 2 in tokens[at:] else None
            if end is not None:  # a whole document in this split
                assert tuple(tokens[at:end]) in expected, hf.convert_ids_to_tokens(tokens[at:end])
                found += 1
    assert found >= 290


@pytest.mark.parametrize(
    ("eos", "bos"),
    [("<|im_end|>", False), ("<|im_end|>", True), ("", False)],
    ids=["eos", "bos-eos", "none"],
)
def test_text_for_a_pretrained_model_is_tokenized_document_by_document_as_transformers_does(tmp_path, caplog, eos, bos):
    """Data prep of `data.format: jsonl` for a pretrained model makes each record one document:
    the special tokens the tokenizer's post-processor puts before a text (Llama's BOS), the text,
    the model's end-of-text token, so that the model learns to stop (was: records joined by a line
    end alone, a window running from one into the next); a folder naming no end token is said with
    a warning, and the records are joined as before. (An end token tokenizer.json lacks, which
    transformers would add past its ids, is refused before any step: tests/unit/test_checks.py.)"""
    import json

    import numpy as np

    from trainer.shards import read_shard, split_shards
    from trainer.storage import LocalStore

    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_folder(tmp_path / "tiny"), folder)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["eos_token"] = eos
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "eos_token_id"}))
    for name in ("special_tokens_map.json", "generation_config.json"):  # where else transformers looks
        (folder / name).unlink(missing_ok=True)
    if bos:  # as a Llama tokenizer.json: `<|endoftext|>` (id 0) before every text
        tokenizer = json.loads((folder / "tokenizer.json").read_text())
        start = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
        tokenizer["post_processor"]["single"].insert(0, start)
        tokenizer["post_processor"]["special_tokens"] = {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}
        }
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 8}) + "\n" for i in range(300)))
    cfg = text_config(folder, tmp_path / "d.jsonl", **{"data.val_fraction": 0.1, "data.test_fraction": 0.1})
    task = PretrainedLMTask()
    with caplog.at_level("WARNING", logger="kftrain.pretrained"):
        manifest = task.prepare(cfg, LocalStore(), str(tmp_path / "ds"))
    tokens = np.concatenate(
        [
            read_shard(LocalStore(), str(tmp_path / "ds"), info)
            for split in ("train", "val", "test")
            for info in split_shards(manifest, split, str(tmp_path / "ds"))
        ]
    )
    tokenizer = task.tokenizer(cfg)
    end_id, start_id = (int(tokenizer.encode(text.encode())[0]) for text in ("<|im_end|>", "<|endoftext|>"))
    assert (end_id, start_id) == (2, 0)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert int((tokens == start_id).sum()) == (300 if bos else 0)  # one per record, none lost at a cut
    if bos:
        assert tokens[0] == start_id
    if eos == "<|im_end|>":
        assert manifest["document_marks"] == {"start": "<|endoftext|>" if bos else "", "end": eos} and warned == []
        assert int((tokens == end_id).sum()) == 300
    else:
        assert "document_marks" not in manifest and int((tokens == end_id).sum()) == 0
        assert len(warned) == 1 and "the model does not learn where one ends" in warned[0], warned
        assert "names no end-of-text token" in warned[0]


@pytest.mark.parametrize("model_type", pretrained.SUPPORTED_MODEL_TYPES)
@pytest.mark.parametrize("data_format", ["chat", "jsonl"])
def test_data_prep_tokenizes_as_transformers_loads_the_whole_folder(tmp_path, model_type, data_format):
    """Data prep reads the tokenizer as transformers loads the model's folder, config.json included
    (was: from the tokenizer files alone, where transformers picks another class: a qwen2 folder's
    tokenizer.json loads as Qwen2Tokenizer, with Qwen's own pre-tokenizer, so a model was trained
    on other token ids than its exported folder gives vLLM and transformers)."""
    import json

    from transformers import AutoTokenizer

    from trainer.chat_data import load_chat_tokenizer
    from trainer.example_model import tiny_tokenizer

    folder = tmp_path / "model"
    tiny_tokenizer().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 512}))
    text = "Numbers 12345 and  two spaces,\n\nthen 'quotes' and café"
    served = AutoTokenizer.from_pretrained(folder)(text, add_special_tokens=False)["input_ids"]
    source = pretrained.resolve(str(folder))
    if data_format == "chat":
        (tmp_path / "tok").mkdir()
        tokenizer = load_chat_tokenizer(source, tmp_path / "tok", trust_remote_code=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        cfg = text_config(folder, tmp_path / "d.jsonl")
        ids = PretrainedLMTask().tokenizer(cfg).encode(text.encode()).tolist()
    assert ids == served


@pytest.mark.parametrize(
    ("family", "tied", "head_dim"),
    [("qwen3", True, 32), ("llama", False, None), ("llama", True, None)],
    ids=["qwen3-tied-wide-heads", "llama-untied", "llama-tied"],
)
@pytest.mark.parametrize("method", ["full", "lora"])
def test_training_flops_count_the_weights_that_multiply_and_the_heads_width(family, tied, head_dim, method):
    """6 (LoRA: 4) per weight that multiplies, plus 12 * layers * heads * head_dim * context (was:
    an untied input embedding, a lookup, counted; attention at hidden_size where Qwen3's heads are
    wider: its plan and MFU 14% off)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.config import Config
    from trainer.tasks.pretrained_lm import _lora_dict, apply_lora

    sizes = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
    extra = {"head_dim": head_dim} if head_dim else {}
    config = AutoConfig.for_model(
        family, **sizes, **extra, intermediate_size=128, vocab_size=1000, tie_word_embeddings=tied
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    cfg = Config(task="causal_lm")
    cfg.model.block_size, cfg.train.method = 64, method
    multiplying = sum(p.numel() for p in model.parameters()) - (0 if tied else 1000 * 64)
    if method == "lora":
        model = apply_lora(model, _lora_dict(cfg.lora))
        multiplying += sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    expected = (4 if method == "lora" else 6) * multiplying + 12 * 2 * 4 * (head_dim or 16) * 64
    assert PretrainedLMTask().flops_per_item(model, cfg) == expected


def test_lora_adapters_are_built_on_the_meta_device_asking_for_no_memory(tmp_path, monkeypatch):
    """peft makes each adapter's layers with plain `nn.Linear(...)`: under the meta device they
    ask for no memory (was: made on the CPU, then moved, so a lora.rank of 10**9 asked the
    pre-flight for 256 GB before its rank check could refuse it)."""
    import torch

    from trainer.tasks.pretrained_lm import apply_lora

    source = pretrained.resolve(tiny_llama_folder(tmp_path / "tiny"))
    model = pretrained.build_on_meta(pretrained.read_config(source, False), torch.float32, source)
    made, new = [], torch.nn.Parameter.__new__

    def recording(cls, data=None, requires_grad=True):  # where each parameter's tensor was made
        made.append(data.device.type)
        return new(cls, data, requires_grad)

    monkeypatch.setattr(torch.nn.Parameter, "__new__", staticmethod(recording))
    adapted = apply_lora(model, {"rank": 4096, "alpha": 16.0, "dropout": 0.0, "target_modules": []})
    assert made and set(made) == {"meta"}, made
    assert {p.shape[0] for n, p in adapted.named_parameters() if ".lora_A." in n} == {4096}


def test_a_tokenizer_with_its_own_code_loads_with_it_under_trust_remote_code(tmp_path):
    """A tokenizer whose tokenizer_config.json names its own class (`auto_map`) is loaded with the
    folder's Python files, for text data and chat data alike (was: its code left behind, and the
    error said to set model.trust_remote_code, which was set)."""
    import json

    from transformers import AutoTokenizer

    from trainer.chat_data import load_chat_tokenizer
    from trainer.example_model import tiny_tokenizer

    folder = tmp_path / "model"
    tiny_tokenizer().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512}))
    (folder / "tokenization_mine.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\nclass MineTokenizer(PreTrainedTokenizerFast):\n"
        "    pass\n"
    )
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": [None, "tokenization_mine.MineTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    text = "Numbers 12345 and text"
    served = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)(text, add_special_tokens=False)
    source = pretrained.resolve(str(folder))

    chat = load_chat_tokenizer(source, tmp_path, trust_remote_code=True)
    assert type(chat).__name__ == "MineTokenizer"
    assert chat(text, add_special_tokens=False)["input_ids"] == served["input_ids"]
    cfg = text_config(folder, tmp_path / "d.jsonl", **{"model.trust_remote_code": True})
    assert PretrainedLMTask().tokenizer(cfg).encode(text.encode()).tolist() == served["input_ids"]
    (tmp_path / "again").mkdir()  # untrusted, its code does not run: transformers' own class reads tokenizer.json
    assert type(load_chat_tokenizer(source, tmp_path / "again", trust_remote_code=False)).__name__ != "MineTokenizer"
