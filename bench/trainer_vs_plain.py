"""Benchmark: kftrain's training loop against a plain hand-written DDP loop, same model and data.

Run under torchrun; both loops run in the same processes, alternating, and rank 0 reports the
ratio of their throughputs (trainer / plain; 1.0 = no overhead) and the trainer's share of step
time spent waiting for data. The trainer runs twice per repeat, with TensorBoard event files on
(the default: written and uploaded to the model URI every log interval) and off, so the cost of
the live curves is a ratio too. Reported, never asserted.

    # CPU, 2 processes, gloo (a small GPT so compute, not Python, dominates a step)
    .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/trainer_vs_plain.py
    # GPU, NCCL, GPT-2 small, bf16, torch.compile
    python -m torch.distributed.run --nproc-per-node 1 bench/trainer_vs_plain.py --gpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.plain_loop import loader_steps  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.distributed import device_for, dist_env, process_group  # noqa: E402
from trainer.events import EventWriter  # noqa: E402
from trainer.shards import read_manifest, split_shards  # noqa: E402
from trainer.storage import LocalStore  # noqa: E402
from trainer.streaming import first_items  # noqa: E402
from trainer.tasks import get_task  # noqa: E402
from trainer.train import peak_flops, run_training  # noqa: E402

CPU = {
    "model.n_layer": 4, "model.n_head": 4, "model.n_embd": 128, "model.block_size": 128,
    "train.batch_size": 16, "data.max_bytes": 2_000_000,
}  # fmt: skip
GPU = {
    "model.n_layer": 12, "model.n_head": 12, "model.n_embd": 768, "model.block_size": 1024,
    "train.batch_size": 16, "train.compile": True, "data.max_bytes": 40_000_000,
}  # fmt: skip


def plain_loop(cfg, task, train_ds, device, env, steps: int) -> float:
    """What a user would write by hand: DDP, AdamW, DistributedSampler, autocast. Returns seconds."""
    torch.manual_seed(cfg.train.seed)
    model, _ = task.build_model(cfg, {"vocab_size": 256})
    model.to(device)
    ddp = model
    if env.distributed:
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    step_model = torch.compile(ddp) if cfg.train.compile else ddp
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.learning_rate, fused=device.type == "cuda")
    sampler = DistributedSampler(train_ds, num_replicas=env.world_size, rank=env.rank, seed=0, drop_last=True)
    loader = DataLoader(
        train_ds, batch_size=cfg.train.batch_size // env.world_size, sampler=sampler, drop_last=True,
        pin_memory=device.type == "cuda",
    )  # fmt: skip
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    t0 = time.perf_counter()
    for x, y in loader_steps(loader, steps):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with amp:
            logits = step_model(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def event_flush_seconds(tmp: str, flushes: int = 2000) -> float:
    """Training-thread seconds of one log interval's event-file work: 8 scalars and a flush (the
    upload itself runs on the writer's thread)."""
    writer = EventWriter(LocalStore(), os.path.join(tmp, "flush-bench"), 0)
    tags = [f"train/tag_{i}" for i in range(8)]
    t0 = time.perf_counter()
    for step in range(1, flushes + 1):
        writer.scalars(step, dict.fromkeys(tags, 0.5))
        writer.flush()
    seconds = (time.perf_counter() - t0) / flushes
    writer.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpu", action="store_true", help="GPT-2 small, bf16, compiled, NCCL")
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps per run (default 40 CPU / 100 GPU)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--log-interval", type=int, default=5, help="train.log_interval_steps (event-file flushes)")
    args = parser.parse_args()
    env = dist_env()
    device = device_for(env)
    steps = args.steps or (100 if args.gpu else 40)
    overrides = {
        **(GPU if args.gpu else CPU),
        "task": "causal_lm",
        "job.replicas": env.world_size,
        "train.max_steps": steps,
        "train.log_interval_steps": args.log_interval,
        "checkpoint.enabled": False,
    }
    cfg = load_config(overrides=overrides)
    cfg_off = load_config(overrides={**overrides, "train.tensorboard": False})
    task = get_task("causal_lm")
    store = LocalStore()
    with process_group(env, device), tempfile.TemporaryDirectory() as tmp:
        shared = [tmp]
        if env.distributed:
            dist.broadcast_object_list(shared)  # one dataset for every rank (same machine)
        ds = os.path.join(shared[0], "dataset")
        if env.is_main:
            task.prepare(cfg, store, ds)
        if env.distributed:
            dist.barrier()
        manifest = read_manifest(store, ds)
        # The plain loop's baseline: the whole train split preloaded in memory.
        items_of, take = task.stream(cfg, manifest)
        shards = split_shards(manifest, "train", ds)
        train_ds = TensorDataset(*first_items(store, ds, shards, items_of, take, sum(map(items_of, shards))))
        plain, ours, ours_off, waits = [], [], [], []
        for i in range(args.repeats):  # alternate so drift (thermal, caches) hits all three
            plain.append(plain_loop(cfg, task, train_ds, device, env, steps))
            # Event files off and on, in alternating order: neither always runs second.
            for events_on in (False, True) if i % 2 == 0 else (True, False):
                if events_on:
                    m = run_training(cfg, ds, os.path.join(shared[0], f"model-{i}"), env, task)
                    ours.append(m["train_seconds"])
                    waits.append(m["data_wait_fraction"])
                else:
                    m = run_training(cfg_off, ds, os.path.join(shared[0], f"model-off-{i}"), env, task)
                    ours_off.append(m["train_seconds"])
            if env.distributed:
                dist.barrier()
        if env.is_main:
            p, o, off = statistics.median(plain), statistics.median(ours), statistics.median(ours_off)
            # Paired per repeat (same moment, same machine load), then the median.
            paired = statistics.median(b / a for a, b in zip(ours, ours_off, strict=True))
            flush_s = event_flush_seconds(shared[0])
            tokens = steps * cfg.train.batch_size * cfg.model.block_size
            model, _ = task.build_model(cfg, {"vocab_size": 256})
            peak = peak_flops(device, cfg) * env.world_size
            report = {
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "world_size": env.world_size,
                "steps": steps,
                "plain_tokens_per_s": round(tokens / p),
                "trainer_tokens_per_s": round(tokens / o),
                "trainer_over_plain_throughput": round(p / o, 3),
                "trainer_without_event_files_over_plain": round(p / off, 3),
                "event_files_on_over_off": round(off / o, 3),
                "event_files_on_over_off_paired_median": round(paired, 3),
                "event_file_training_thread_ms_per_flush": round(flush_s * 1000, 3),
                "event_file_share_of_an_interval": round(flush_s / (o / steps * args.log_interval), 6),
                "log_interval_steps": args.log_interval,
                "trainer_data_wait_fraction": round(statistics.median(waits), 4),
            }
            if peak:
                report["trainer_mfu"] = round(tokens / o * model.flops_per_token() / peak, 3)
            print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
