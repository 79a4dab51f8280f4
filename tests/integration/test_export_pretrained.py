"""trainer/export_pretrained.py (through trainer.export.export_model): a fine-tuned tiny Llama,
saved by trainer.model_io as the trainer saves it (weights changed as training would: every
weight for full fine-tuning, the adapters for LoRA), exported from the S3 store and loaded back
with transformers and peft the way people load it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from trainer.config import load_config
from trainer.example_model import tiny_llama_folder
from trainer.export import export_model
from trainer.export_pretrained import ADAPTER_FOLDER, shard_plan
from trainer.model_io import frozen_names, save_model, trained_state
from trainer.pretrained import PretrainedError
from trainer.storage import join_uri, open_store
from trainer.tasks.causal_lm import HF_FOLDER
from trainer.tasks.pretrained_lm import PretrainedLMTask

pytestmark = pytest.mark.timeout(300)

#: Adapters on attention and MLP, so the merge covers square and non-square weights.
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
RANK, ALPHA = 4, 8.0
#: Token ids every model here scores (inside the tiny vocabulary).
IDS = torch.arange(48).reshape(2, 24) % 300 + 3


def upload_folder(folder: str, uri: str) -> str:
    store = open_store(uri)
    for path in sorted(Path(folder).iterdir()):
        store.put_file(f"{uri}/{path.name}", path)
    return uri


def download(uri: str, to: Path) -> Path:
    """Every object under `uri` into the local folder `to` (what KServe's storage initializer does)."""
    store = open_store(uri)
    for obj in store.list(uri):
        path = to / obj[len(uri) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        store.get_file(obj, path)
    return to


def trained_model(base_uri: str, model_uri: str, method: str, targets: list[str] = TARGETS) -> torch.nn.Module:
    """A PretrainedLMTask model built and filled from the base folder as training builds it, its
    trainable weights moved (a fixed random step), saved by save_model as the trainer saves it;
    returns the model (in eval mode) for reference logits."""
    cfg = load_config(
        overrides={
            "task": "causal_lm",
            "model.init_from": base_uri,
            "model.block_size": 32,
            "train.method": method,
            "lora.rank": RANK,
            "lora.alpha": ALPHA,
            "lora.target_modules": targets,
            "job.replicas": 1,
            "train.batch_size": 8,
        }
    )
    task = PretrainedLMTask()
    model, meta = task.build_model(cfg, {"vocab_size": 1, "tokenizer": {"kind": "pretrained"}})
    task.materialize(model, torch.device("cpu"))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    meta.update(task="causal_lm", dataset_uri="s3://somewhere/dataset")
    save_model(open_store(model_uri), model_uri, model, meta, state=trained_state(model, frozen_names(model)))
    return model.eval()


def logits(model, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture
def base(bucket, tmp_path) -> tuple[str, str]:
    """The tiny Llama (untied) as a local folder and in the S3 store."""
    folder = tiny_llama_folder(tmp_path / "base")
    return folder, upload_folder(folder, f"s3://{bucket}/models/tiny-llama")


def test_full_fine_tune_exports_a_hugging_face_folder_that_loads_generates_and_matches(base, bucket, tmp_path):
    folder, base_uri = base
    model_uri, out = f"s3://{bucket}/runs/r1/model", f"s3://{bucket}/runs/r1/exported"
    trained = trained_model(base_uri, model_uri, "full")
    card = export_model(open_store(out), model_uri, out, metrics={"loss": 1.5}, training_config={"x": 1})
    local = download(out, tmp_path / "exported")
    hf = local / HF_FOLDER
    assert sorted(p.name for p in hf.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
        + ["chat_template.jinja"]
    )
    assert not (local / "model.pt").exists() and not (local / ADAPTER_FOLDER).exists()  # nothing traced
    # The base's files as they were: the chat template and generation defaults travel.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (hf / name).read_bytes() == (Path(folder) / name).read_bytes()
    config = json.loads((hf / "config.json").read_text())
    base_config = json.loads((Path(folder) / "config.json").read_text())
    assert config == {**base_config, "dtype": "float32"}
    with safe_open(str(hf / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}

    loaded = AutoModelForCausalLM.from_pretrained(hf).eval()
    assert loaded.dtype == torch.float32
    assert torch.equal(logits(loaded), logits(trained))  # the trained weights, bit for bit
    tok = AutoTokenizer.from_pretrained(hf)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What comes after red?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    gen = loaded.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] > ids.shape[1] and isinstance(tok.decode(gen[0, ids.shape[1] :]), str)
    assert gen[0, ids.shape[1]] == logits(trained, ids)[0, -1].argmax()  # greedy: the trained model's choice

    assert card == json.loads((local / "model_card.json").read_text())
    assert card["base_model"] == {"origin": base_uri, "revision": ""}
    assert card["method"] == "full" and "lora" not in card
    assert card["files"]["huggingface"] == HF_FOLDER and "adapter" not in card["files"]
    assert sorted(card["files"]["written"]) == sorted(
        str(p.relative_to(local)) for p in local.rglob("*") if p.is_file() and p.name != "model_card.json"
    )
    assert card["weights"]["files"] == ["model.safetensors"] and card["weights"]["dtype"] == "float32"
    assert card["metrics"] == {"loss": 1.5} and card["source_model_uri"] == model_uri


def test_forced_sharding_writes_hugging_faces_index_and_the_shards_load(base, bucket, tmp_path):
    _folder, base_uri = base
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained = trained_model(base_uri, model_uri, "full")
    open_store(base_uri).delete(f"{base_uri}/generation_config.json")  # a base without one
    # The embeddings and lm_head (320 x 64 floats, 80 KiB) are the largest tensors: each alone.
    card = export_model(open_store(out), model_uri, out, max_shard_bytes=60_000)
    hf = download(out, tmp_path / "e") / HF_FOLDER
    generation = GenerationConfig.from_pretrained(hf)  # derived from config.json: its end token
    assert (generation.eos_token_id, generation.pad_token_id) == (2, 0)
    shards = sorted(p.name for p in hf.glob("*.safetensors"))
    n = len(shards)
    assert n > 3 and shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert card["weights"]["files"] == shards
    index = json.loads((hf / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    total = 0
    for shard in shards:
        with safe_open(str(hf / shard), "pt") as f:
            names = list(f.keys())
            assert all(index["weight_map"][name] == shard for name in names)
            sizes = [f.get_slice(k).get_shape() for k in names]
            nbytes = sum(4 * torch.Size(s).numel() for s in sizes)
            assert nbytes <= 60_000 or len(names) == 1  # a tensor over the limit alone
            total += nbytes
    assert index["metadata"]["total_size"] == total == card["weights"]["total_size"]
    assert len(index["weight_map"]) == card["weights"]["tensors"]
    loaded = AutoModelForCausalLM.from_pretrained(hf).eval()
    assert torch.equal(logits(loaded), logits(trained))


def test_shard_plan_groups_like_save_pretrained():
    assert shard_plan([4, 4, 4], 8) == [[0, 1], [2]]
    assert shard_plan([3, 20, 3, 3], 8) == [[0], [1], [2, 3]]  # the big one alone
    assert shard_plan([5], 1) == [[0]]
    assert shard_plan([1, 2, 3], 100) == [[0, 1, 2]]


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_lora_exports_the_peft_adapter_and_on_request_the_merged_model(bucket, tmp_path, tie):
    from peft import PeftModel

    folder = tiny_llama_folder(tmp_path / "base", tie=tie)
    base_uri = upload_folder(folder, f"s3://{bucket}/models/base")
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained = trained_model(base_uri, model_uri, "lora")
    card = export_model(open_store(out), model_uri, out, merge_lora=True)
    local = download(out, tmp_path / "e")

    adapter = local / ADAPTER_FOLDER
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"]) == ("LORA", "CAUSAL_LM")
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (RANK, ALPHA, 0.0)
    assert sorted(config["target_modules"]) == sorted(TARGETS)
    assert config["base_model_name_or_path"] == base_uri and config["inference_mode"] is True
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and all(".default" not in n and ".lora_" in n for n in names)  # peft's saved names

    base_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    base_logits = logits(base_model)
    with_adapter = PeftModel.from_pretrained(base_model, adapter).eval()
    expected = logits(trained)
    assert not torch.allclose(expected, base_logits, atol=1e-3)  # the adapters do change the model
    torch.testing.assert_close(logits(with_adapter), expected, rtol=0, atol=1e-5)

    merged = AutoModelForCausalLM.from_pretrained(local / HF_FOLDER).eval()
    torch.testing.assert_close(logits(merged), expected, rtol=0, atol=1e-4)
    with safe_open(str(local / HF_FOLDER / "model.safetensors"), "pt") as f:
        merged_names = set(f.keys())
    assert ("lm_head.weight" in merged_names) is not tie  # a tied weight is stored once, as HF does
    assert not any("lora" in n or "base_layer" in n for n in merged_names)

    assert card["method"] == "lora" and card["base_model"]["origin"] == base_uri
    assert card["lora"] == {
        "rank": RANK,
        "alpha": ALPHA,
        "dropout": 0.0,
        "target_modules": sorted(TARGETS),
        "merged": True,
    }
    assert card["files"]["adapter"] == ADAPTER_FOLDER and card["files"]["huggingface"] == HF_FOLDER


def test_lora_without_merging_writes_only_the_adapter(base, bucket, tmp_path):
    _folder, base_uri = base
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained_model(base_uri, model_uri, "lora")
    card = export_model(open_store(out), model_uri, out)
    written = sorted(obj[len(out) + 1 :] for obj in open_store(out).list(out))
    assert written == [
        "adapter/adapter_config.json",
        "adapter/adapter_model.safetensors",
        "model_card.json",
    ]
    assert "huggingface" not in card["files"] and card["lora"]["merged"] is False and "weights" not in card


def test_a_model_file_that_does_not_match_its_metadata_is_named(base, bucket):
    _folder, base_uri = base
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained_model(base_uri, model_uri, "full")
    store = open_store(model_uri)
    meta = json.loads(store.get_bytes(join_uri(model_uri, "model.json")))
    meta["hf_config"]["num_hidden_layers"] = 3  # a layer the file does not hold
    store.put_bytes(join_uri(model_uri, "model.json"), json.dumps(meta).encode())
    with pytest.raises(PretrainedError, match=r"model\.safetensors: no tensor 'model\.layers\.2\."):
        export_model(open_store(out), model_uri, out)


def test_a_base_without_its_tokenizer_any_more_fails_before_the_folder_is_written(base, bucket):
    """(was: the weights, config.json and the other tokenizer files written first, a folder that
    looked loadable, without its tokenizer)"""
    _folder, base_uri = base
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained_model(base_uri, model_uri, "lora")
    open_store(base_uri).delete(join_uri(base_uri, "tokenizer.json"))
    with pytest.raises(
        PretrainedError, match=r"has no tokenizer\.json any more .* restore the folder and export again"
    ):
        export_model(open_store(out), model_uri, out, merge_lora=True)
    assert not open_store(out).list(out)  # nothing: not the adapter either


def test_merging_an_adapter_on_a_tied_weight_is_refused_by_name(bucket, tmp_path):
    base_uri = upload_folder(tiny_llama_folder(tmp_path / "base", tie=True), f"s3://{bucket}/models/base")
    model_uri, out = f"s3://{bucket}/m", f"s3://{bucket}/e"
    trained_model(base_uri, model_uri, "lora", targets=["q_proj", "lm_head"])  # lm_head is the embeddings
    with pytest.raises(PretrainedError, match=r"export\.merge_lora: the adapter on 'lm_head\.weight' changes a weight"):
        export_model(open_store(out), model_uri, out, merge_lora=True)
    assert open_store(out).list(out) == []  # refused before anything was written
    export_model(open_store(out), model_uri, out)  # the adapter alone is fine
