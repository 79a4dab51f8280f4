"""trainer/generations.py through the evaluation: a "fine-tuned" tiny Llama (the base's weights
changed, saved the way the trainer saves, full or LoRA) evaluated with `evaluate_model` and the
evaluation step, the base model read from the S3 store. What the report calls `before` must be
exactly what transformers' own `from_pretrained(...).generate` writes for the prompt."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.test_tasks_pretrained_lm import ALL_LINEAR, corpus, finetune_config, upload_folder
from trainer.evaluate import EVAL_RECORD, evaluate_model, ui_scalars
from trainer.example_model import tiny_llama_folder
from trainer.generations import GenerationSettings
from trainer.model_io import frozen_names, save_model, trained_state
from trainer.pipeline_steps import evaluate, prepare_data
from trainer.report import visible
from trainer.shards import read_manifest
from trainer.storage import LocalStore, join_uri
from trainer.tasks import task_for
from trainer.train import TRAINING_RECORD

pytestmark = pytest.mark.timeout(300)


def fine_tune_by_hand(cfg, dataset: str, model_uri: str, noise: float = 0.5) -> None:
    """The model `cfg` trains, its trainable weights moved by fixed noise instead of training
    (`noise` 0: left as built, the base's weights and LoRA's zero adapters), saved as the
    trainer saves it (a full state dict, or the adapters only)."""
    store = LocalStore()
    task = task_for(cfg)
    model, meta = task.build_model(cfg, read_manifest(store, dataset))
    task.materialize(model, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    meta.update(task=cfg.task, dataset_uri=dataset)
    save_model(store, model_uri, model, meta, state=trained_state(model, frozen_names(model)))


def reference(folder: str, prompt: str, new_tokens: int) -> str:
    """transformers' own greedy continuation of `prompt` by the model in `folder`."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_the_report_holds_the_base_and_fine_tuned_continuations_of_test_prompts(bucket, tmp_path, method):
    folder = tiny_llama_folder(tmp_path / "tiny-llama")
    base = upload_folder(folder, f"s3://{bucket}/models/tiny-llama")
    text = corpus(tmp_path)
    cfg = finetune_config(base, text, **{"job.replicas": 1, "train.method": method, "lora.target_modules": ALL_LINEAR})
    dataset, model_uri = str(tmp_path / "ds"), str(tmp_path / "model")
    prepare_data(cfg, dataset)
    fine_tune_by_hand(cfg, dataset, model_uri)
    settings = GenerationSettings(count=2, new_tokens=8)

    report = evaluate_model(LocalStore(), model_uri, dataset, max_items=4, generation=settings)
    assert report["loss"] > 0 and report["perplexity"] > 1  # the loss still comes with them
    rows = report["generations"]
    assert [sorted(r) for r in rows] == [["after", "before", "prompt"]] * 2
    source = Path(text).read_text()
    # The test split's first prompts: text of the corpus, two different places in it.
    assert rows[0]["prompt"] != rows[1]["prompt"] and all(r["prompt"] in source for r in rows)
    for row in rows:
        assert row["before"] == reference(folder, row["prompt"], 8)
        assert row["after"] != row["before"]  # the changed weights write something else
    # Greedy: the same text on every run.
    assert evaluate_model(LocalStore(), model_uri, dataset, max_items=4, generation=settings)["generations"] == rows
    # The base model's test loss, on the same rows: what the base itself, saved as a fine-tune
    # that changed nothing, scores.
    unchanged = str(tmp_path / "unchanged")
    fine_tune_by_hand(cfg, dataset, unchanged, noise=0.0)
    base_scores = evaluate_model(LocalStore(), unchanged, dataset, max_items=4, generation=settings)
    assert report["base_loss"] == pytest.approx(base_scores["loss"], rel=1e-5)
    assert report["base_perplexity"] == pytest.approx(base_scores["perplexity"], rel=1e-5)
    assert base_scores["base_loss"] == pytest.approx(base_scores["loss"], rel=1e-5)
    assert abs(report["loss"] - report["base_loss"]) > 1e-3  # the changed weights score otherwise
    # Without generations a full fine-tune does not build its base again (one model in memory, not
    # two), so it has no base measures; LoRA's base is the same model with its adapters off.
    quiet = evaluate_model(LocalStore(), model_uri, dataset, max_items=4, generation=GenerationSettings(count=0))
    assert "generations" not in quiet and quiet["loss"] == report["loss"]
    assert ("base_loss" in quiet) == (method == "lora")


def test_the_evaluation_step_shows_the_configured_prompts_in_its_report(bucket, tmp_path):
    folder = tiny_llama_folder(tmp_path / "tiny-llama", tie=True)
    base = upload_folder(folder, f"s3://{bucket}/models/tiny-llama")
    prompts = ["What comes after red?", "<b>blue</b> & green"]
    cfg = finetune_config(
        base,
        corpus(tmp_path),
        **{
            "job.replicas": 1,
            "data.eval_prompts": prompts,
            "data.eval_generations": 2,
            "data.eval_new_tokens": 6,
        },
    )
    dataset, model_uri, out = str(tmp_path / "ds"), str(tmp_path / "model"), str(tmp_path / "eval")
    prepare_data(cfg, dataset)
    fine_tune_by_hand(cfg, dataset, model_uri)
    LocalStore().put_bytes(join_uri(model_uri, TRAINING_RECORD), json.dumps({"metrics": {}, "loss_curve": []}).encode())

    report, _passed, _reason = evaluate(cfg, model_uri, dataset, out, str(tmp_path / "report.html"))
    rows = report["generations"]
    assert [r["prompt"] for r in rows] == prompts
    assert [r["before"] for r in rows] == [reference(folder, p, 6) for p in prompts]
    assert json.loads(LocalStore().get_bytes(join_uri(out, EVAL_RECORD)))["generations"] == rows
    page = (tmp_path / "report.html").read_text()
    for row in rows:
        cells = "".join(f"<td>{html.escape(visible(row[k]), quote=True)}</td>" for k in ("prompt", "before", "after"))
        assert f"<tr>{cells}</tr>" in page
    assert "<b>blue</b>" not in page
    # The base model's loss and perplexity beside the fine-tuned one's, in the page and the KFP UI's scalars.
    assert "<td>base model&#x27;s test loss (before fine-tuning)</td>" in page
    assert {"test_loss", "test_perplexity", "test_base_loss", "test_base_perplexity"} <= set(ui_scalars(report))
