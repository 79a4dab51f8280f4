"""The distributed training entry point every replica runs (under torchrun).

    python -m torch.distributed.run ... -m trainer.train \\
        --config-json '{...}' --dataset-uri s3://.../dataset --model-uri s3://.../model

Each rank reads the dataset from the object store itself (replicas are not KFP tasks), trains
its shard of every global batch with DDP, and rank 0 writes the model and the training record
to `--model-uri`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainer.config import Config, ConfigError, config_from_json, to_dict
from trainer.data import load_split, read_manifest
from trainer.distributed import DistEnv, device_for, dist_env, process_group, unwrap
from trainer.model import build_mlp, save_model
from trainer.storage import join_uri, open_store

TRAINING_RECORD = "training.json"
log = logging.getLogger("kftrain.train")


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def parameter_digest(model: nn.Module) -> str:
    """A short hash of all parameters: equal on every rank when DDP kept them in sync."""
    h = hashlib.sha256()
    for p in unwrap(model).parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Share of rows whose arg-max logit is the label."""
    model.eval()
    pred = model(x).argmax(dim=1)
    model.train()
    return float((pred == y).float().mean())


def run_training(cfg: Config, dataset_uri: str, model_uri: str, env: DistEnv) -> dict[str, Any]:
    """Train on this rank; return the final metrics (complete on rank 0)."""
    t_start = time.time()
    device = device_for(env)
    if cfg.train.batch_size % env.world_size:
        raise ConfigError(
            f"train.batch_size: must divide by the world size {env.world_size}, got {cfg.train.batch_size}"
        )
    local_batch = cfg.train.batch_size // env.world_size
    store = open_store(dataset_uri, cfg.store.endpoint, cfg.store.region)
    manifest = read_manifest(store, dataset_uri)
    x_train, y_train = load_split(store, dataset_uri, "train", manifest)
    x_val, y_val = load_split(store, dataset_uri, "val", manifest)

    # Identical initial weights on every rank (DDP also broadcasts rank 0's), then per-rank
    # streams for anything random in the step (dropout).
    seed_everything(cfg.train.seed)
    model = build_mlp(
        manifest["num_features"],
        cfg.model.hidden_sizes,
        len(manifest["classes"]),
        cfg.model.dropout,
    ).to(device)
    seed_everything(cfg.train.seed + env.rank)
    ddp_model: nn.Module = (
        DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        if env.distributed
        else model
    )
    optimizer = torch.optim.AdamW(
        ddp_model.parameters(), lr=cfg.train.learning_rate, weight_decay=cfg.train.weight_decay
    )
    if len(y_train) < cfg.train.batch_size:
        raise ConfigError(
            f"train.batch_size: must not exceed the {len(y_train)} training rows, got {cfg.train.batch_size}"
        )
    dataset = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    # Full global batches only: every step sees exactly batch_size rows on any world size, so
    # one process and N processes take the same optimizer steps. The shuffle moves the few
    # left-over rows to a different place every epoch.
    sampler = DistributedSampler(
        dataset, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=cfg.train.seed, drop_last=True
    )
    loader = DataLoader(dataset, batch_size=local_batch, sampler=sampler, drop_last=True)
    xv, yv = torch.from_numpy(x_val).to(device), torch.from_numpy(y_val).to(device)
    loss_fn = nn.CrossEntropyLoss()

    history: list[dict[str, float]] = []
    step, first_step_at, samples = 0, None, 0
    t_train = time.time()
    for epoch in range(cfg.train.epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        loss_sum, batches = 0.0, 0
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp_model(xb), yb)
            loss.backward()
            optimizer.step()
            step += 1
            samples += len(xb) * env.world_size
            loss_sum += loss.item()
            batches += 1
            if first_step_at is None:
                first_step_at = time.time()
            if env.is_main and step % cfg.train.log_interval_steps == 0:
                rate = samples / max(time.time() - t_train, 1e-9)
                log.info("epoch %d step %d loss %.4f %.0f samples/s", epoch, step, loss.item(), rate)
        val_acc = accuracy(ddp_model, xv, yv)
        history.append({"epoch": epoch, "train_loss": loss_sum / max(batches, 1), "val_accuracy": val_acc})
        if env.is_main:
            log.info(
                "epoch %d done: train_loss %.4f val_accuracy %.4f",
                epoch,
                history[-1]["train_loss"],
                val_acc,
            )

    digest = parameter_digest(ddp_model)
    log.info("final parameter digest %s", digest)
    train_seconds = time.time() - t_train
    metrics = {
        "train_loss": history[-1]["train_loss"],
        "val_accuracy": history[-1]["val_accuracy"],
        "samples_per_second": samples / max(train_seconds, 1e-9),
        "train_seconds": train_seconds,
        "seconds_to_first_step": (first_step_at or time.time()) - t_start,
        "first_step_unix_time": first_step_at or time.time(),
        "world_size": env.world_size,
        "steps": step,
    }
    if env.is_main:
        meta = {
            "task": "classification",
            "architecture": {
                "num_features": manifest["num_features"],
                "hidden_sizes": cfg.model.hidden_sizes,
                "num_classes": len(manifest["classes"]),
                "dropout": cfg.model.dropout,
            },
            "classes": manifest["classes"],
            "feature_names": manifest["feature_names"],
            "normalization": manifest["normalization"],
            "dataset_uri": dataset_uri,
        }
        save_model(store, model_uri, unwrap(ddp_model), meta)
        record = {
            "metrics": metrics,
            "history": history,
            "config": to_dict(cfg),
            "parameter_digest": digest,
        }
        store.put_bytes(join_uri(model_uri, TRAINING_RECORD), json.dumps(record, indent=2).encode())
        log.info("model written to %s", model_uri)
    if env.distributed:
        dist.barrier()  # no rank leaves (and tears the group down) while rank 0 still writes
    return metrics


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of one training process."""
    parser = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__)
    parser.add_argument("--config-json", required=True, help="the whole config as JSON")
    parser.add_argument("--dataset-uri", required=True, help="prepared dataset (data prep output)")
    parser.add_argument("--model-uri", required=True, help="where rank 0 writes the model")
    args = parser.parse_args(argv)
    env = dist_env()
    logging.basicConfig(
        level=logging.INFO,
        format=f"[rank {env.rank}] %(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
    )
    cfg = config_from_json(args.config_json)
    device = device_for(env)
    with process_group(env, device, timeout_s=cfg.job.collective_timeout_seconds):
        run_training(cfg, args.dataset_uri, args.model_uri, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
