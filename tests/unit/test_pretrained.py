"""trainer/pretrained.py: finding, checking and reading a Hugging Face model folder."""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trainer import pretrained
from trainer.example_model import tiny_llama_folder
from trainer.storage import LocalStore


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama", tie=True)


def source(uri: str) -> pretrained.ModelSource:
    return pretrained.resolve(uri)


@pytest.mark.parametrize(
    ("uri", "repo", "revision"),
    [
        ("hf://Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", ""),
        ("hf://meta-llama/Llama-3.2-1B@main", "meta-llama/Llama-3.2-1B", "main"),
        ("hf://org/name@0123abcd", "org/name", "0123abcd"),
        ("hf://org/name@refs/pr/1", "org/name", "refs/pr/1"),
    ],
)
def test_hub_uris_parse(uri, repo, revision):
    assert pretrained.parse_hf_uri(uri) == (repo, revision)


@pytest.mark.parametrize(
    "uri",
    [
        "hf://",
        "hf://just-a-name",
        "hf://org/name@",
        "hf://org/na me",
        "hf://a/b/c",
        "hf://org/name@ma in",
        "hf://o/n@v~1",
    ],
)
def test_malformed_hub_uris_are_refused_naming_the_form(uri):
    with pytest.raises(pretrained.PretrainedError, match="hf://<org>/<name>"):
        pretrained.parse_hf_uri(uri)


def test_the_index_comes_from_headers_and_matches_the_file(folder):
    index = pretrained.tensor_index(source(folder))
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert "lm_head.weight" not in index  # tied: stored once
    for name, entry in index.items():
        assert entry.shape == tuple(ref[name].shape)
        rows = pretrained.read_rows(LocalStore(), entry, 1, 1) if entry.shape[0] > 1 else None
        if rows is not None:
            assert torch.equal(rows[0], ref[name][1])


def test_parameters_on_meta_keep_buffers_real(folder):
    config = pretrained.read_config(source(folder))
    model = pretrained.build_on_meta(config, torch.float32)
    assert all(p.is_meta for p in model.parameters())
    assert not any(b.is_meta for b in model.buffers())  # the rotary frequencies are computed
    assert all(not p.is_meta for p in torch.nn.Linear(2, 2).parameters())  # the patch is undone


def test_a_replicated_model_loads_equal_to_transformers(folder):
    src = source(folder)
    model = pretrained.build_on_meta(pretrained.read_config(src), torch.float32)
    buffers = pretrained.buffers_of(model)
    pretrained.give_storage(model, torch.device("cpu"), buffers)
    assert pretrained.load_base_weights(model, src, pretrained.tensor_index(src)) == []
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    x = torch.arange(30).reshape(2, 15)
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, ref(input_ids=x).logits)


def edit_config(folder, tmp_path, **changes) -> str:
    out = tmp_path / "edited"
    out.mkdir()
    for f in ("model.safetensors", "tokenizer.json"):
        (out / f).write_bytes(Path(folder, f).read_bytes())
    config = json.loads(Path(folder, "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (out / "config.json").write_text(json.dumps(config))
    return str(out)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "t5"}, "model_type 't5' is not supported"),
        ({"auto_map": {"AutoModelForCausalLM": "x.Y"}}, "needs its own Python code"),
        # Sizes that describe no model (were: `integer modulo by zero`, a negative dimension, or a
        # traceback naming no field, from transformers as the model was built).
        ({"num_attention_heads": 0}, "config.json: num_attention_heads must be positive, got 0; the file is damaged"),
        ({"vocab_size": -1}, "vocab_size must be positive, got -1"),
        # Was: the plan's KeyError traceback, and the train step's "the model None; prepare the data again".
        ({"vocab_size": None}, "config.json: vocab_size is missing: add the model's vocabulary size"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be a whole number, got '2'"),
        ({"intermediate_size": 1.5}, "intermediate_size must be a whole number, got 1.5"),
        ({"hidden_size": True}, "hidden_size must be a whole number, got True"),
        ({"hidden_size": 63, "head_dim": None}, "hidden_size 63 does not divide by num_attention_heads 4"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 does not divide by num_key_value_heads 3"),
    ],
)
def test_config_problems_are_named(folder, tmp_path, changes, message):
    with pytest.raises(pretrained.PretrainedError, match=message):
        pretrained.read_config(source(edit_config(folder, tmp_path, **changes)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rms_norm_eps": "x"}, "TypeError: Field 'rms_norm_eps' expected float, got str"),
        ({"hidden_act": "nope"}, "nope"),
    ],
)
def test_a_config_transformers_cannot_build_is_named_by_the_pre_flight_and_the_plan(folder, tmp_path, changes, message):
    """What passes the size checks and still breaks transformers is one error naming the folder,
    from the run's pre-flight and from the planner alike (was: transformers' traceback in `kftrain plan`)."""
    from trainer.checks import check_base_model
    from trainer.config import load_config
    from trainer.plan.plan import make_plan

    edited = edit_config(folder, tmp_path, **changes)
    cfg = load_config(overrides={"task": "causal_lm", "model.init_from": edited, "model.block_size": 32})
    for check in (check_base_model, make_plan):
        with pytest.raises(pretrained.PretrainedError) as raised:
            check(cfg)
        said = str(raised.value)
        assert said.startswith(f"model.init_from {edited!r}: transformers cannot build the model its config.json")
        assert message in said and "\n" not in said, said


def test_a_folder_without_config_is_named(tmp_path):
    with pytest.raises(pretrained.PretrainedError, match="no config.json"):
        pretrained.read_config(source(str(tmp_path)))


def test_a_folder_without_safetensors_is_named(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(pretrained.PretrainedError, match="safetensors only"):
        pretrained.weight_files(source(str(tmp_path)))


@pytest.mark.parametrize("raw", [b"", b"\x01\x02", struct.pack("<Q", 10**12) + b"{}", struct.pack("<Q", 4) + b"nope"])
def test_broken_safetensors_files_are_named(tmp_path, raw):
    (tmp_path / "model.safetensors").write_bytes(raw)
    with pytest.raises(pretrained.PretrainedError, match="model.safetensors"):
        pretrained.tensor_index(source(str(tmp_path)))


def test_context_length_reads_each_family_s_key():
    assert pretrained.context_length({"max_position_embeddings": 4096}) == 4096
    assert pretrained.context_length({"n_positions": 1024}) == 1024
    assert pretrained.context_length({}) == 0


@pytest.mark.parametrize("shape", [(), (1,), (5, 3), (4, 2, 2)], ids=["scalar", "one", "matrix", "3d"])
def test_fill_tensor_reads_each_shape_whole(tmp_path, shape):
    from safetensors.torch import save_file

    value = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape) + 7
    save_file({"t": value}, tmp_path / "model.safetensors")
    entry = pretrained.tensor_index(source(str(tmp_path)))["t"]
    target = torch.zeros(shape)
    pretrained.fill_tensor(target, lambda start, count: pretrained.read_rows(LocalStore(), entry, start, count))
    assert torch.equal(target, value)


def test_large_tensors_are_read_in_bounded_pieces(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    value = torch.arange(40 * 6, dtype=torch.float32).reshape(40, 6)
    save_file({"t": value}, tmp_path / "model.safetensors")
    entry = pretrained.tensor_index(source(str(tmp_path)))["t"]
    monkeypatch.setattr(pretrained, "READ_PIECE_BYTES", 7 * entry.row_bytes)
    asked: list[tuple[int, int]] = []

    def rows(start, count):
        asked.append((start, count))
        return pretrained.read_rows(LocalStore(), entry, start, count)

    target = torch.nn.Parameter(torch.zeros(40, 6))  # a trainable parameter, as the model's are
    assert pretrained.fill_tensor(target, rows, entry.row_bytes) == value.numel() * 4
    assert torch.equal(target, value)
    assert asked == [(i, min(7, 40 - i)) for i in range(0, 40, 7)]


REMOTE_CONFIG = """
from transformers import LlamaConfig

class TinyRemoteConfig(LlamaConfig):
    model_type = "kftrain-tiny-remote"
"""
REMOTE_MODEL = """
from transformers import LlamaForCausalLM
from .configuration_tiny import TinyRemoteConfig

class TinyRemoteForCausalLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig
"""


def remote_code_folder(folder: str, out: Path) -> str:
    """The tiny model as a model with its own code (config.json auto_map + two Python files)."""
    out.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (out / name).write_bytes(Path(folder, name).read_bytes())
    config = json.loads(Path(folder, "config.json").read_text())
    config.update(
        model_type="kftrain-tiny-remote",
        architectures=["TinyRemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tiny.TinyRemoteForCausalLM",
        },
    )
    (out / "config.json").write_text(json.dumps(config))
    (out / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (out / "modeling_tiny.py").write_text(REMOTE_MODEL)
    return str(out)


def test_a_model_with_its_own_code_loads_when_trusted(folder, tmp_path):
    remote = remote_code_folder(folder, tmp_path / "remote")
    src = source(remote)
    with pytest.raises(pretrained.PretrainedError, match="trust_remote_code"):
        pretrained.read_config(src)
    config = pretrained.read_config(src, trust_remote_code=True)
    model = pretrained.build_on_meta(config, torch.float32, src)
    assert type(model).__name__ == "TinyRemoteForCausalLM"
    pretrained.give_storage(model, torch.device("cpu"), pretrained.buffers_of(model))
    assert pretrained.load_base_weights(model, src, pretrained.tensor_index(src)) == []
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    x = torch.arange(30).reshape(2, 15)
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, ref(input_ids=x).logits)


class MovingHub:
    """A FAKE `huggingface_hub.snapshot_download` (no network here) over one repository whose main
    branch gets a new commit at every call, as a busy Hub repository can between two steps of a
    run: it returns the commit's snapshot folder, holding the files `allow_patterns` matches."""

    def __init__(self, model: str, root: Path) -> None:
        self.model, self.root, self.calls, self.head = Path(model), root, [], 0

    def __call__(self, repo, revision=None, allow_patterns=None, token=None):
        import fnmatch
        import shutil

        self.head += 1
        commit = revision or f"commit{self.head:02d}"
        self.calls.append((revision, tuple(allow_patterns)))
        snapshot = self.root / repo.replace("/", "--") / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for f in self.model.iterdir():
            if any(fnmatch.fnmatch(f.name, p) for p in allow_patterns):
                shutil.copy(f, snapshot / f.name)
        return str(snapshot)


def test_a_hub_model_is_read_at_one_commit_by_every_step_and_downloads_weights_only_to_train(
    folder, tmp_path, monkeypatch
):
    """Data prep records the commit it tokenized with; training (every restart of it too) reads
    that commit although the branch moved, and only training downloads the weights."""
    from trainer.config import Config
    from trainer.tasks import task_for

    hub = MovingHub(folder, tmp_path / "hub")
    monkeypatch.setattr("huggingface_hub.snapshot_download", hub)
    cfg = Config(task="causal_lm")
    cfg.model.init_from, cfg.model.block_size = "hf://org/tiny-llama", 64
    task = task_for(cfg)
    record = task.tokenizer_record(cfg, task.tokenizer(cfg))
    assert record["revision"] == "commit01" and record["model"] == "hf://org/tiny-llama"
    assert hub.calls[0][0] is None and "*.safetensors" not in hub.calls[0][1]  # data prep: no weights
    manifest = {"vocab_size": record["vocab_size"], "tokenizer": record}
    for _restart in range(2):
        task_for(cfg).build_model(cfg, manifest)
    assert [c[0] for c in hub.calls[1:]] == ["commit01", "commit01"]  # the branch is at commit03 by now
    assert all("*.safetensors" in c[1] for c in hub.calls[1:])


def _rewrite_values(path: Path, change) -> None:
    """The safetensors file at `path` with its tensors passed through `change` (same names, shapes
    and dtypes: a header byte for byte the same)."""
    from safetensors.torch import load_file, save_file

    save_file({k: change(k, v).contiguous() for k, v in load_file(path).items()}, path, metadata={"format": "pt"})


# How the copy of the base model differs from the folder the fingerprint was taken of.
FINGERPRINT_CASES = {
    "an unchanged copy": (None, True),
    "every value nudged (a new version)": (lambda k, v: v + 0.01, False),
    "another dtype (a header of other offsets)": (lambda k, v: v.to(torch.bfloat16), False),
}


@pytest.mark.parametrize(("change", "same"), FINGERPRINT_CASES.values(), ids=FINGERPRINT_CASES.keys())
def test_a_base_model_replaced_in_place_is_told_from_an_identical_copy(folder, tmp_path, change, same):
    import shutil

    before = pretrained.weights_fingerprint(source(folder))
    copy = tmp_path / "base"
    shutil.copytree(folder, copy)
    if change is not None:
        _rewrite_values(copy / pretrained.SINGLE_FILE, change)
    assert (pretrained.weights_fingerprint(source(str(copy))) == before) is same
    if same:
        pretrained.check_same_weights(source(str(copy)), before, "the adapters were trained")
    else:
        with pytest.raises(pretrained.PretrainedError, match="holds other weights than when the adapters were trained"):
            pretrained.check_same_weights(source(str(copy)), before, "the adapters were trained")
    pretrained.check_same_weights(source(str(copy)), "", "the adapters were trained")  # nothing recorded: no check


def test_building_the_model_leaves_its_config_as_the_folder_has_it(tmp_path):
    """transformers writes into the nested dicts it is given (rope_theta into a transformers-4 style
    rope_scaling); the config is what the export writes out again (was: changed in place)."""
    import copy

    config = json.loads((Path(tiny_llama_folder(tmp_path / "m")) / "config.json").read_text())
    config["rope_theta"] = 500000.0
    config["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    before = copy.deepcopy(config)
    pretrained.build_on_meta(config, torch.float32)
    assert config == before


def test_a_gpt2_lora_target_not_found_lists_its_conv1d_layers(tmp_path):
    """GPT-2's c_attn, c_proj and c_fc (transformers' Conv1D) are what its LoRA targets: the
    pre-flight's hint for a target not found lists them (was: lm_head alone)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.hf_models import base_model_config
    from trainer.checks import check_base_model
    from trainer.config import parse_config
    from trainer.errors import KftrainError

    folder = Path(tiny_llama_folder(tmp_path / "gpt2"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "model.safetensors").unlink()
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=16, n_layer=1, n_head=2)).save_pretrained(
        folder
    )
    extra = "train:\n  method: lora\nlora:\n  target_modules: [q_proj]\n"
    with pytest.raises(KftrainError, match="linear layers: c_attn, c_fc, c_proj, lm_head"):
        check_base_model(parse_config(base_model_config(str(folder), extra, block_size=64)))


def test_a_gpt2_saved_as_its_base_model_is_read_under_the_causal_lms_names(tmp_path):
    """The Hub's GPT-2 holds `wte.weight`, `h.0.attn.c_attn.weight` (saved from GPT2Model), which
    transformers loads into GPT2LMHeadModel's `transformer.*` (was: refused, "the folder's weights
    lack 'transformer.wte.weight'")."""
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "lm")
    ours = pretrained.tensor_index(source(str(tmp_path / "lm")))
    assert "transformer.wte.weight" in ours
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hub")
    weights = tmp_path / "hub" / "model.safetensors"
    tensors = load_file(weights)
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, weights, metadata={"format": "pt"})
    hub = pretrained.tensor_index(source(str(tmp_path / "hub")))
    assert {k: e.shape for k, e in hub.items()} == {k: e.shape for k, e in ours.items()}
    # A model with its own code names its weights as its code does: left as they are.
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling.My"}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(config))
    assert "wte.weight" in pretrained.tensor_index(source(str(tmp_path / "hub")))


@pytest.mark.parametrize(
    ("names", "prefix", "expected"),
    [
        (
            ["wte.weight", "h.0.mlp.c_fc.weight"],
            "transformer",
            ["transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"],
        ),
        (["embed_tokens.weight", "lm_head.weight"], "model", ["model.embed_tokens.weight", "lm_head.weight"]),
        (["model.embed_tokens.weight", "lm_head.weight"], "model", ["model.embed_tokens.weight", "lm_head.weight"]),
        (["embed_tokens.weight"], "", ["embed_tokens.weight"]),  # a model type transformers does not know
    ],
)
def test_the_base_prefix_is_added_only_where_the_files_have_none(names, prefix, expected):
    index = {name: pretrained.TensorEntry("u", torch.float32, (1,), 0) for name in names}
    assert list(pretrained.with_base_prefix(index, prefix)) == expected


@pytest.mark.parametrize("uri", ["HF://org/name", "Hf://org/name@main"])
def test_the_hugging_face_scheme_in_another_case_is_named_with_its_fix(uri):
    """Was: 'unsupported storage URI scheme 'hf'', as if hf:// were not supported."""
    from trainer.config import ConfigError, load_config

    with pytest.raises(
        ConfigError, match=rf"model.init_from: '{uri}': write the Hugging Face scheme in lower case, hf://"
    ):
        load_config(overrides={"task": "causal_lm", "model.init_from": uri})


def _with_files(folder: str, tmp_path: Path, files: dict[str, dict | None]) -> pretrained.ModelSource:
    """A copy of `folder` with each of `files` written (a dict) or removed (None)."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    for name, content in files.items():
        (out / name).unlink(missing_ok=True)
        if content is not None:
            (out / name).write_text(json.dumps(content))
    return source(str(out))


NO_EOS = {"tokenizer_config.json": {}, "special_tokens_map.json": None, "generation_config.json": None}
NO_IDS = {"config.json": "no_eos", "generation_config.json": None}


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, "<|im_end|>"),  # the example model's tokenizer_config.json
        ({"tokenizer_config.json": {"eos_token": "</s>"}, **NO_IDS}, "</s>"),  # no id names a stop: the tokenizer's
        ({"tokenizer_config.json": {"eos_token": {"content": "<|eot|>", "special": True}}, **NO_IDS}, "<|eot|>"),
        # The tokenizer's eos_token is not one generation stops at: the one it stops at (was: the tokenizer's,
        # and the fine-tuned model ran on past its end).
        ({"tokenizer_config.json": {"eos_token": "<|endoftext|>"}}, "<|im_end|>"),
        (
            {"tokenizer_config.json": {"eos_token": "<|endoftext|>"}, "generation_config.json": "gen_both"},
            "<|endoftext|>",
        ),
        ({**NO_EOS, "special_tokens_map.json": {"eos_token": "<|im_end|>"}}, "<|im_end|>"),
        ({**NO_EOS, "config.json": "eos_id", "generation_config.json": None}, "<|im_end|>"),  # by id
        ({**NO_EOS, "config.json": "eos_ids"}, "<|im_end|>"),  # a list of ids: the first
        ({**NO_EOS, "config.json": "no_eos"}, ""),
        ({**NO_EOS, "config.json": "eos_bad", "generation_config.json": "gen_eos"}, "<|im_end|>"),  # the next file
    ],
)
def test_the_end_of_text_token_is_found_where_transformers_looks(folder, tmp_path, files, expected):
    """tokenizer_config.json's eos_token (text or an AddedToken), special_tokens_map.json's, then
    the token of config.json's eos_token_id (an id or a list) in tokenizer.json; none is ""."""
    config = json.loads((Path(folder) / "config.json").read_text())
    eos_id = json.loads((Path(folder) / "tokenizer.json").read_text())["added_tokens"]
    eos_id = next(t["id"] for t in eos_id if t["content"] == "<|im_end|>")
    configs = {
        "eos_id": {**config, "eos_token_id": eos_id},
        "eos_ids": {**config, "eos_token_id": [eos_id, 0]},
        "no_eos": {k: v for k, v in config.items() if k != "eos_token_id"},
        "eos_bad": {**config, "eos_token_id": 99_999},  # no token of the tokenizer's
        "gen_eos": {"eos_token_id": eos_id},
        "gen_both": {"eos_token_id": [eos_id, 0]},  # <|im_end|> and <|endoftext|>, as Qwen2.5-Instruct's
    }
    files = {
        name: configs.get(content, content) if isinstance(content, str) else content for name, content in files.items()
    }
    assert pretrained.end_token(_with_files(folder, tmp_path, files)) == expected


def test_the_end_of_text_token_is_found_in_a_unigram_vocabulary(folder, tmp_path):
    """A Unigram tokenizer.json lists its vocabulary as [token, score] by id: config.json's
    eos_token_id names one of those (was: only BPE-style vocabularies were read, and "")."""
    config = json.loads((Path(folder) / "config.json").read_text())
    files = {
        **NO_EOS,
        "config.json": {**config, "eos_token_id": 1},
        "tokenizer.json": {"model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["</s>", 0.0], ["a", -1.0]]}},
    }
    assert pretrained.end_token(_with_files(folder, tmp_path, files)) == "</s>"


def test_a_damaged_tokenizer_config_is_named_when_its_end_token_is_read(folder, tmp_path):
    out = _with_files(folder, tmp_path, {})
    Path(out.uri, "tokenizer_config.json").write_text("{not json")
    with pytest.raises(pretrained.PretrainedError, match="tokenizer_config.json is not valid JSON"):
        pretrained.end_token(out)


def test_the_hubs_gpt2_with_its_saved_attention_masks_passes_the_check_of_unused_tensors(tmp_path):
    """The Hub's GPT-2 keeps each block's causal mask (`attn.bias`) and `attn.masked_bias`, which
    transformers loads past: no sign of another model (a stray weight is refused, test_checks.py)."""
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.hf_models import base_model_config
    from trainer.checks import check_base_model
    from trainer.config import parse_config

    folder = Path(tiny_llama_folder(tmp_path / "gpt2"))
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    (folder / "model.safetensors").unlink()
    GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=16, n_layer=2, n_head=2)).save_pretrained(
        folder
    )
    weights = folder / "model.safetensors"
    hub = {k.removeprefix("transformer."): v for k, v in load_file(weights).items() if not k.startswith("lm_head")}
    for block in range(2):
        hub[f"h.{block}.attn.bias"] = torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64)
        hub[f"h.{block}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(hub, weights, metadata={"format": "pt"})
    check_base_model(parse_config(base_model_config(str(folder), block_size=64)))


def test_two_saves_in_a_hub_model_are_refused_with_a_fix_a_user_can_make(folder, tmp_path):
    """A Hub repository's files are not the user's to remove: download, keep one save, point at it."""
    out = tmp_path / "snapshot"
    shutil.copytree(folder, out)
    (out / pretrained.INDEX_FILE).write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
    (out / "model-00001-of-00001.safetensors").write_text("")
    hub = pretrained.ModelSource(uri=str(out), store=source(str(out)).store, origin="hf://org/name@main")
    with pytest.raises(pretrained.PretrainedError) as err:
        pretrained.weight_files(hub)
    assert "holds both model.safetensors and model.safetensors.index.json" in str(err.value)
    assert "download the model (`hf download org/name --local-dir DIR`), there keep one save" in str(err.value)
