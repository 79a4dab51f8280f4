"""trainer/tasks/pretrained_lm.py: fine-tuning a pretrained Hugging Face model on real gloo ranks,
the "pretrained" model a tiny Llama (random weights, saved with save_pretrained) in the S3 store."""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.utils.data import TensorDataset
from transformers import AutoModelForCausalLM

from tests.jobs import code_job, record_of, train, weights_of
from trainer.checkpoint import CheckpointManager
from trainer.config import load_config
from trainer.evaluate import evaluate_model
from trainer.example_model import tiny_llama_folder, write_chat_jsonl
from trainer.launch.backend import run_job
from trainer.launch.job import training_job
from trainer.launch.local import LocalBackend
from trainer.pipeline_steps import prepare_data
from trainer.shards import read_manifest, split_shards
from trainer.storage import LocalStore, open_store
from trainer.streaming import first_items
from trainer.tasks.pretrained_lm import CHAT_FORMAT, PretrainedLMTask

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def upload_folder(folder: str, uri: str) -> str:
    """Every file of a local folder to `uri` (a prefix in the store)."""
    store = open_store(uri)
    for path in sorted(Path(folder).iterdir()):
        store.put_file(f"{uri}/{path.name}", path)
    return uri


@pytest.fixture
def base_model(bucket, tmp_path) -> str:
    """The tiny Llama, untied, in the S3 store."""
    return upload_folder(tiny_llama_folder(tmp_path / "tiny-llama"), f"s3://{bucket}/models/tiny-llama")


def corpus(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"{i} the quick brown fox jumps over the lazy dog\n" for i in range(2000)))
    return str(path)


def finetune_config(base: str, source: str, **overrides):
    return load_config(
        overrides={
            "task": "causal_lm",
            "data.source": source,
            "model.init_from": base,
            "model.block_size": 32,
            "train.batch_size": 8,
            "train.max_steps": 12,
            "train.learning_rate": 0.003,
            "train.log_interval_steps": 1,
            "job.replicas": 2,
            "checkpoint.enabled": False,
            **overrides,
        }
    )


#: Adapters on every linear layer of a Llama block (attention and MLP).
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

LOAD_AND_SCORE = """
    import json, logging, os, torch
    from trainer.config import config_from_json
    from trainer.distributed import dist_env, parallelize, process_group
    from trainer.tasks import task_for
    env = dist_env()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import trainer.pretrained
    trainer.pretrained.READ_PIECE_BYTES = 1000  # many ranged reads per tensor, as for a large model
    with process_group(env, torch.device("cpu")):
        # One model after the other in the same processes: each loads, shards and scores alike.
        for name, cfg_json in json.loads(os.environ["CFGS"]).items():
            cfg = config_from_json(cfg_json)
            task = task_for(cfg)
            model, meta = task.build_model(cfg, {"vocab_size": 1, "tokenizer": {}})
            parallelize(model, env, torch.device("cpu"), strategy="fsdp", units=task.shard_units(model))
            task.materialize(model, torch.device("cpu"))
            x = torch.arange(60).reshape(3, 20) % meta["vocab_size"]
            with torch.no_grad():
                logits = model(input_ids=x).logits
            if env.rank == 0:
                torch.save(logits, os.path.join(os.environ["OUT"], f"{name}.pt"))
"""


def test_each_fsdp_rank_loads_its_shards_and_the_logits_equal_transformers(bucket, tmp_path):
    # The untied and the tied model in one job (two ranks): the checks are per model.
    from trainer.config import config_to_json

    source = corpus(tmp_path)
    folders, cfgs = {}, {}
    for tie, name in ((False, "untied"), (True, "tied")):
        folders[name] = tiny_llama_folder(tmp_path / name, tie=tie)
        base = upload_folder(folders[name], f"s3://{bucket}/models/{name}")
        cfgs[name] = config_to_json(finetune_config(base, source, **{"train.strategy": "fsdp"}))
    out = tmp_path / "logits"
    out.mkdir()
    spec = replace(code_job("load", LOAD_AND_SCORE, replicas=2), env={"CFGS": json.dumps(cfgs), "OUT": str(out)})
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))
    reads: dict[str, list[int]] = {name: [] for name in cfgs}
    for line in lines:  # each rank's read names the model it read
        if m := re.search(r"read (\d+) bytes .* of pretrained weights .* from s3://.*/models/(\w+)$", line):
            reads[m.group(2)].append(int(m.group(1)))
    for name, folder in folders.items():
        # Each rank read its own rows only: together about the model once, not twice.
        read = reads[name]
        total = sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))
        assert len(read) == 2 and sum(read) == pytest.approx(total, rel=0.02), (name, read)  # the header is the rest
        assert max(read) < 0.6 * total, (name, read)
        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        x = torch.arange(60).reshape(3, 20) % ref.config.vocab_size
        with torch.no_grad():
            # exactly: rotary buffers and tying right
            assert torch.equal(torch.load(out / f"{name}.pt"), ref(input_ids=x).logits), name


def resume_config(base: str, source: str, prefix: str, **overrides):
    return finetune_config(
        base,
        source,
        **{
            "train.strategy": "fsdp",
            "train.method": "lora",
            "train.learning_rate": 0.03,
            "train.max_steps": 16,
            "train.deterministic": True,
            "lora.dropout": 0.1,  # per-rank RNG streams that a resume must restore
            "lora.target_modules": ALL_LINEAR,
            "checkpoint.enabled": True,
            "checkpoint.uri": prefix,
            "checkpoint.interval_steps": 5,
            "checkpoint.keep_last": 3,
            **overrides,
        },
    )


def test_a_lora_run_killed_by_sigkill_resumes_bitwise_equal(base_model, tmp_path):
    source, dataset = corpus(tmp_path), str(tmp_path / "ds")
    ref = resume_config(base_model, source, str(tmp_path / "ref-ckpt"))
    prepare_data(ref, dataset)
    train(ref, "ref", dataset, str(tmp_path / "ref"))
    # The same run, SIGKILLed (whole process groups) right after its first checkpoint...
    prefix = str(tmp_path / "ckpt")
    spec = training_job(resume_config(base_model, source, prefix), "victim", dataset, str(tmp_path / "victim"))
    backend = LocalBackend(sink=lambda line: None)
    backend.submit(spec)
    mgr = CheckpointManager(LocalStore(), prefix)
    deadline = time.monotonic() + 120
    while not mgr.committed_steps():
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    backend.kill(spec, signal.SIGKILL)
    killed_at = max(mgr.committed_steps())
    assert killed_at < 16, "the run finished before it was killed"
    # The checkpoint holds the adapters and their optimizer state only, not the frozen base.
    saved = FileSystemReader(f"{prefix}/step-{killed_at:08d}").read_metadata().state_dict_metadata
    weights = [key for key in saved if key.startswith("model.")]
    assert weights and all(".lora_" in key for key in weights)
    # ... then started again: it resumes from the latest complete checkpoint by itself.
    lines: list[str] = []
    run_job(LocalBackend(sink=lines.append), replace(spec, timeout_s=240))
    resumed = [int(m.group(1)) for line in lines if (m := re.search(r"resumed at step (\d+)", line))]
    assert resumed and resumed[0] >= killed_at
    ref_w, got_w = weights_of(str(tmp_path / "ref")), weights_of(str(tmp_path / "victim"))
    assert ref_w.keys() == got_w.keys() and ref_w
    for name in ref_w:
        assert torch.equal(ref_w[name], got_w[name]), name  # bitwise, not approximately


def test_a_two_rank_lora_checkpoint_resumes_on_three_ranks(base_model, tmp_path):
    source, dataset = corpus(tmp_path), str(tmp_path / "ds")
    # Global batches that every world size cuts exactly: the same data either way.
    # (A learning rate low enough that the float-sum order of 2 or 3 ranks does not send the
    # runs apart: Adam amplifies near-zero gradients' rounding at 0.03.)
    shape = {
        "train.batch_size": 12,
        "data.partitions": 6,
        "lora.dropout": 0.0,
        "train.max_steps": 12,
        "train.learning_rate": 0.003,
        "checkpoint.interval_steps": 6,
    }
    # The reference's own checkpoint of step 6 (two ranks, mid-run) is where the three ranks resume.
    ref = resume_config(base_model, source, str(tmp_path / "ref-ckpt"), **shape)
    prepare_data(ref, dataset)
    train(ref, "ref", dataset, str(tmp_path / "ref"))
    # The reference is also the test of LoRA fine-tuning on plain text on two FSDP ranks (full
    # fine-tuning under FSDP and LoRA under DDP: the chat test below). Adapters move a random
    # "pretrained" model less than full training does (its frozen output layer maps any hidden
    # state to near-uniform logits), but they move it; and it saves the adapters only, the base
    # being the pretrained model's. (Not the SIGKILL test's reference: its dropout, which that
    # resume needs, keeps its gain under this bar.)
    curve = [point["loss"] for point in record_of(str(tmp_path / "ref"))["loss_curve"]]
    assert sum(curve[:3]) / 3 - sum(curve[-3:]) / 3 > 0.15, curve
    saved = weights_of(str(tmp_path / "ref"))
    assert saved and all(".lora_" in name for name in saved)
    prefix = tmp_path / "ckpt"
    shutil.copytree(tmp_path / "ref-ckpt", prefix, ignore=shutil.ignore_patterns("step-00000012"))
    assert sorted(p.name for p in prefix.iterdir() if p.name.startswith("step-")) == ["step-00000006"]
    three = resume_config(base_model, source, str(prefix), **{**shape, "job.replicas": 3})
    lines = train(three, "three", dataset, str(tmp_path / "three"))
    assert any("resumed at step 6" in line for line in lines)
    assert record_of(str(tmp_path / "three"))["metrics"]["steps"] == 12
    ref_w, got_w = weights_of(str(tmp_path / "ref")), weights_of(str(tmp_path / "three"))
    for name in ref_w:  # equal up to the order of float sums across 2 or 3 ranks
        torch.testing.assert_close(got_w[name], ref_w[name], rtol=1e-3, atol=1e-5, msg=name)


def chat_source(bucket: str, tmp_path, n: int, long_every: int = 0) -> str:
    """The colour conversations as a JSON Lines object in the S3 store; with `long_every`, every
    such conversation's answer is four times as long (rows of very unequal assistant tokens)."""
    uri = f"s3://{bucket}/data/chat.jsonl"
    path = write_chat_jsonl(tmp_path / "chat.jsonl", n)
    if long_every:
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        for record in records[::long_every]:
            record["messages"][-1]["content"] = " ".join([record["messages"][-1]["content"]] * 4)
        Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
    open_store(uri).put_file(uri, path)
    return uri


def base_val_loss(cfg, folder: str, dataset: str, split: str = "val") -> float:
    """The assistant-token loss of the base model (transformers' own) on a split, before any fine-tuning."""
    task = PretrainedLMTask()
    store = open_store(dataset)
    manifest = read_manifest(store, dataset, CHAT_FORMAT)
    items_of, take = task.stream(cfg, manifest)
    x, y = first_items(store, dataset, split_shards(manifest, split, dataset), items_of, take, cfg.data.eval_items)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return task.validate(model, TensorDataset(x, y), torch.device("cpu"), 8)["val_loss"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("strategy", "method"), [("fsdp", "full"), ("ddp", "lora")], ids=["fsdp-full", "ddp-lora"])
def test_chat_fine_tuning_on_two_ranks_lowers_the_assistant_token_loss(base_model, bucket, tmp_path, strategy, method):
    # Each method under one strategy (LoRA under FSDP: the 2 -> 3 ranks test's reference, on plain text).
    cfg = finetune_config(
        base_model,
        chat_source(bucket, tmp_path, 140),
        **{
            "data.format": "chat",
            "data.val_fraction": 0.15,
            "data.test_fraction": 0.15,
            "model.block_size": 64,
            "train.strategy": strategy,
            "train.method": method,
            "train.max_steps": 0,
            "train.epochs": 2,
            "train.learning_rate": 0.003 if method == "full" else 0.03,
            "lora.target_modules": ALL_LINEAR,
        },
    )
    dataset, model_uri = str(tmp_path / "ds"), str(tmp_path / "model")
    manifest = prepare_data(cfg, dataset)
    assert manifest["format"] == CHAT_FORMAT and manifest["dropped"] == 0
    before = base_val_loss(cfg, str(tmp_path / "tiny-llama"), dataset)
    train(cfg, "chat", dataset, model_uri)
    history = [epoch["val_loss"] for epoch in record_of(model_uri)["history"]]
    # The answer follows from the question (the colour after the one named): the assistant's
    # tokens become predictable, the loss on them falls epoch after epoch.
    assert len(history) == 2 and before > history[0] > history[1], (before, history)
    # Adapters on a random "pretrained" model move it less (see the 2 -> 3 ranks test), but they move it.
    margin = 2.0 if method == "full" else 0.2
    assert history[1] < before - margin, (before, history)
    report = evaluate_model(open_store(model_uri), model_uri, dataset, None, 64)
    assert report["test_tokens"] == manifest["splits"]["test"]["assistant_tokens"]  # every test row: fewer than 64
    assert report["loss"] < before - margin / 2, (before, report)
    # The base model's loss on the same test rows, beside it: transformers' own base model's.
    assert report["base_loss"] == pytest.approx(
        base_val_loss(cfg, str(tmp_path / "tiny-llama"), dataset, "test"), rel=1e-5
    )
    saved = weights_of(model_uri)
    if method == "lora":  # the adapters only: the base is the pretrained model's
        assert saved and all(".lora_" in name for name in saved)
    else:
        assert "model.embed_tokens.weight" in saved and "lm_head.weight" in saved


@pytest.mark.timeout(200)
def test_chat_fine_tuning_learns_the_same_on_one_rank_accumulating_as_on_two(base_model, bucket, tmp_path):
    """The loss of chat data is the mean over the assistant's tokens of the whole global batch, which
    rows hold in different numbers: 1 rank accumulating 2 micro-batches and 2 FSDP ranks of one each
    take the same step (was: the mean of each micro-batch's mean, weights 5e-2 apart after 3 steps)."""
    cfg = finetune_config(
        base_model,
        chat_source(bucket, tmp_path, 28, long_every=3),
        **{
            "data.format": "chat",
            "data.partitions": 2,  # the same global batches at either world size
            "model.block_size": 64,
            "train.batch_size": 8,
            "train.max_steps": 3,
            "train.epochs": 1,
            "train.learning_rate": 0.01,
            "train.deterministic": True,
        },
    )
    dataset = str(tmp_path / "ds")
    prepare_data(cfg, dataset)
    rows = read_manifest(open_store(dataset), dataset, CHAT_FORMAT)["splits"]["train"]
    assert rows["assistant_tokens"] % rows["rows"], rows  # rows with unequal counts: the case at stake
    one = replace(cfg, job=replace(cfg.job, replicas=1), train=replace(cfg.train, grad_accum_steps=2))
    train(one, "one-rank", dataset, str(tmp_path / "one"))
    two = replace(cfg, train=replace(cfg.train, strategy="fsdp"))  # the sharded gradients scaled too
    train(two, "two-ranks", dataset, str(tmp_path / "two"))
    base = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tiny-llama"), dtype=torch.float32).state_dict()
    models = (str(tmp_path / "one"), str(tmp_path / "two"))
    one_w, two_w = (weights_of(m) for m in models)
    moved = max(float((one_w[name] - base[name]).abs().max()) for name in one_w)
    assert moved > 1e-2, moved  # it trained
    for name in one_w:  # equal up to the order of float sums
        torch.testing.assert_close(two_w[name], one_w[name], rtol=1e-4, atol=1e-5, msg=name)
    # And so is the epoch's train_loss (was: the mean of the two ranks' own means).
    one_h, two_h = (record_of(m)["history"] for m in models)
    assert one_h and [h["train_loss"] for h in two_h] == pytest.approx([h["train_loss"] for h in one_h], rel=1e-5)


def test_a_trusted_model_with_its_own_code_is_built_from_the_store(bucket, tmp_path, monkeypatch):
    """Each build imports the code from a copy named by its digest: transformers' module cache
    keeps one entry for the model (was: one more at every build, for good)."""
    from tests.unit.test_pretrained import remote_code_folder
    from trainer import pretrained

    modules = tmp_path / "hf-modules"
    monkeypatch.setenv("HF_MODULES_CACHE", str(modules))
    monkeypatch.setattr("transformers.dynamic_module_utils.HF_MODULES_CACHE", str(modules))
    local = remote_code_folder(tiny_llama_folder(tmp_path / "base"), tmp_path / "remote")
    source = pretrained.resolve(upload_folder(local, f"s3://{bucket}/models/remote"))
    config = pretrained.read_config(source, trust_remote_code=True)
    for _ in range(3):
        model = pretrained.build_on_meta(config, torch.float32, source)  # its code copied out of the store
    assert type(model).__name__ == "TinyRemoteForCausalLM"
    assert len([p for p in (modules / "transformers_modules").iterdir() if p.is_dir()]) == 1
    pretrained.give_storage(model, torch.device("cpu"), pretrained.buffers_of(model))
    assert pretrained.load_base_weights(model, source, pretrained.tensor_index(source)) == []
