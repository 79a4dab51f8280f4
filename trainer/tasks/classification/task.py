"""The built-in classification task's :class:`~trainer.tasks.base.Task`: data prep, the model,
its loss, validation and serving, each from the package's modules."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from trainer.config import Config
from trainer.data_rules import source_store
from trainer.shards import ShardInfo
from trainer.storage import ObjectStore
from trainer.tasks.base import Task, evaluating
from trainer.tasks.classification.data import load_split, prepare_dataset
from trainer.tasks.classification.model import ServingModel, build_mlp
from trainer.tasks.classification.report import classification_report
from trainer.tasks.contract import checked_model


def _rows(info: ShardInfo) -> int:
    return info.items


def _row_batch(arrays: dict[str, np.ndarray], idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(arrays["x"][idx]), torch.from_numpy(arrays["y"][idx])


class ClassificationTask(Task):
    name = "classification"
    item_name = "samples"

    def prepare(self, cfg: Config, store: ObjectStore, dataset_uri: str) -> dict[str, Any]:
        source = source_store(cfg, cfg.data.source) if cfg.data.source not in ("", "digits") else None
        return prepare_dataset(cfg.data, store, dataset_uri, source=source)

    def stream(self, cfg, manifest):
        return _rows, _row_batch

    def build_model(self, cfg, manifest):
        arch = {
            "num_features": manifest["num_features"],
            "hidden_sizes": cfg.model.hidden_sizes,
            "num_classes": len(manifest["classes"]),
            "dropout": cfg.model.dropout,
        }
        meta = {
            "architecture": arch,
            "classes": manifest["classes"],
            "feature_names": manifest["feature_names"],
            "normalization": manifest["normalization"],
        }
        return checked_model(self, self.model_from_meta(meta)), meta

    def model_from_meta(self, meta):
        a = meta["architecture"]
        return build_mlp(a["num_features"], a["hidden_sizes"], a["num_classes"], a["dropout"])

    def loss(self, model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    def synthetic_batch(self, cfg, manifest, size):
        return torch.randn(size, manifest["num_features"]), torch.randint(0, len(manifest["classes"]), (size,))

    def flops_per_item(self, model, cfg):
        return 6.0 * sum(p.numel() for p in model.parameters())

    @torch.no_grad()
    def validate(self, model, dataset, device, batch_size):
        x, y = dataset.tensors
        with evaluating(model):
            pred = model(x.to(device)).argmax(dim=1)
        return {"val_accuracy": float((pred == y.to(device)).float().mean())}

    @torch.no_grad()
    def evaluate(self, model, meta, store, dataset_uri, max_items):
        x, y = load_split(store, dataset_uri, "test", max_rows=max_items)
        logits = model(torch.from_numpy(x))
        report = classification_report(y, logits.argmax(dim=1).numpy(), meta["classes"])
        report["loss"] = float(nn.functional.cross_entropy(logits, torch.from_numpy(y)))
        report["test_rows"] = int(len(y))
        return report

    def serving_module(self, model, meta):
        serving = ServingModel(model, **meta["normalization"]).eval()
        norm = meta["normalization"]
        # Raw-feature-scale inputs: normalised values of a standard normal sample.
        z = torch.randn(8, meta["architecture"]["num_features"], generator=torch.Generator().manual_seed(0))
        return serving, z * torch.tensor(norm["std"]) + torch.tensor(norm["mean"])
