"""Benchmark: fine-tuning a pretrained model with kftrain's trainer against a plain hand-written
transformers + FSDP2 loop, and LoRA against full fine-tuning (issue #18).

Run under torchrun (2 ranks, gloo, CPU). Rank 0 saves a Llama-shaped model built from a config
(random weights, ``save_pretrained``, the tests' small byte-level BPE tokenizer; nothing is
downloaded) and prepares a text dataset with it (kftrain's data prep, ``model.init_from``); then,
in the same processes:

1. Throughput, alternating: the trainer (:class:`trainer.train.Trainer`, ``train.strategy:
   fsdp``, ``train.method: full``, checkpoints off) against what a user writes by hand on the
   same model, data and global batch: ``AutoModelForCausalLM.from_pretrained`` on every rank,
   ``fully_shard`` on each decoder layer and then the root, AdamW with the same learning rate
   and weight decay, a ``DistributedSampler`` over the training split preloaded in memory, the
   same loss (cross-entropy of the logits, ignore index -100). The trainer additionally reads
   its data through the streaming shard reader, computes the global gradient norm, checks it
   for NaN/inf, runs the LR schedule, measures data wait and writes TensorBoard events (its
   defaults). Both times cover the steps only (not loading the model, not writing it).
2. LoRA against full: the trainer once with each method (fsdp, checkpoints on, LoRA's defaults:
   rank 8 on the attention's q and v projections), and per rank the bytes of what training
   holds (parameters trainable and frozen, gradients, AdamW state; a DTensor's local shard,
   each storage once), the bytes of the one committed checkpoint under the prefix (the final
   step's: ``.metadata``, the ranks' ``.distcp`` parts and RNG files, ``COMMIT.json``), and the
   throughput of the same steps.

Reported, never asserted. Throughput is rank 0's seconds (FSDP's collectives keep the ranks in step).

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/finetune_vs_plain.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.fsdp_vs_ddp import held_bytes  # noqa: E402
from bench.gpt_setup import require_ranks  # noqa: E402
from bench.llama_setup import add_llama_arguments, llama_config, save_llama_folder  # noqa: E402
from bench.plain_loop import loader_steps  # noqa: E402
from trainer.checkpoint import COMMIT, step_dir  # noqa: E402
from trainer.checkpoint_owner import checkpoint_prefix  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.distributed import device_for, dist_env, process_group  # noqa: E402
from trainer.pretrained import parameter_bytes, resolve, tensor_index  # noqa: E402
from trainer.shards import read_manifest, split_shards  # noqa: E402
from trainer.storage import LocalStore  # noqa: E402
from trainer.streaming import first_items  # noqa: E402
from trainer.tasks import task_for  # noqa: E402
from trainer.train import Trainer  # noqa: E402

#: Labels that do not count in the loss (the task's and torch's default).
IGNORE = -100


def config(args, folder: str, **overrides):
    return load_config(
        overrides={
            "task": "causal_lm",
            "model.init_from": folder,
            "model.block_size": args.block,
            "data.source": "python-stdlib",
            "data.max_bytes": args.corpus_bytes,
            "data.eval_items": 16,  # the validation at the end of a run is not what is measured
            "train.batch_size": args.batch,
            "train.max_steps": args.steps,
            "train.strategy": "fsdp",
            "job.replicas": 2,
            "checkpoint.enabled": False,
            **overrides,
        }
    )


def plain_loop(folder: str, cfg, train_ds: TensorDataset, env, steps: int) -> float:
    """What a user writes by hand: transformers' model, FSDP2 per decoder layer, AdamW,
    DistributedSampler. Returns the seconds of `steps` optimizer steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    mesh = init_device_mesh("cpu", (env.world_size,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    tc = cfg.train
    opt = torch.optim.AdamW(model.parameters(), lr=tc.learning_rate, weight_decay=tc.weight_decay)
    sampler = DistributedSampler(train_ds, num_replicas=env.world_size, rank=env.rank, seed=0, drop_last=True)
    loader = DataLoader(train_ds, batch_size=tc.batch_size // env.world_size, sampler=sampler, drop_last=True)
    dist.barrier()
    t0 = time.perf_counter()
    for x, y in loader_steps(loader, steps):
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=IGNORE
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = time.perf_counter() - t0
    del model, opt
    gc.collect()
    return seconds


class MeasuredTrainer(Trainer):
    """The trainer, counting what it holds after its last optimizer step (before the final
    validation pass, whose forward under no_grad leaves FSDP's root unit unsharded)."""

    def finish(self):
        self.state_at_end = state_bytes(self)
        return super().finish()


def trainer_run(cfg, dataset: str, model_uri: str, env) -> tuple[float, dict[str, int], Trainer]:
    """One trainer run to `train.max_steps`: its training seconds, this rank's state bytes, and itself."""
    dist.barrier()
    trainer = MeasuredTrainer(cfg, dataset, model_uri, env)
    metrics = trainer.run()
    return metrics["train_seconds"], trainer.state_at_end, trainer


def state_bytes(trainer: Trainer) -> dict[str, int]:
    """Bytes this rank holds for training: parameters (trainable and frozen), gradients, AdamW state."""
    params = list(trainer.model.parameters())
    trainable = [p for p in params if p.requires_grad]
    opt_state = [v for s in trainer.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    out = {
        "params_trainable": held_bytes(trainable),
        "params_frozen": held_bytes(p for p in params if not p.requires_grad),
        "grads": held_bytes(p.grad for p in trainable if p.grad is not None),
        "optimizer": held_bytes(opt_state),
    }
    out["trainable_state"] = out["params_trainable"] + out["grads"] + out["optimizer"]
    out["all_state"] = out["trainable_state"] + out["params_frozen"]
    return out


def checkpoint_bytes(cfg, model_uri: str, step: int) -> dict[str, int]:
    """Bytes of the committed checkpoint of `step` under the run's prefix, by kind of file."""
    store = LocalStore()
    folder = step_dir(checkpoint_prefix(cfg, model_uri), step)
    names = {uri.rsplit("/", 1)[-1]: store.size(uri) for uri in store.list(folder)}
    if COMMIT not in names:
        raise SystemExit(f"{folder}: no committed checkpoint (no {COMMIT})")
    return {
        "total": sum(names.values()),
        "distcp": sum(v for k, v in names.items() if k.endswith(".distcp")),
        "files": len(names),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_llama_arguments(parser, layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each loop, alternating")
    parser.add_argument("--block", type=int, default=128, help="context length (model.block_size)")
    parser.add_argument("--batch", type=int, default=8, help="global batch (train.batch_size)")
    parser.add_argument("--corpus-bytes", type=int, default=600_000, help="data.max_bytes of python-stdlib")
    args = parser.parse_args()
    env = dist_env()
    require_ranks(env)
    device = device_for(env)
    if device.type != "cpu":
        raise SystemExit("a CPU benchmark (gloo): run it without CUDA_VISIBLE_DEVICES, or see bench/gpu_llama.py")
    store = LocalStore()
    with process_group(env, device), tempfile.TemporaryDirectory() as tmp:
        shared = [tmp]
        dist.broadcast_object_list(shared)  # one folder and dataset for every rank (same machine)
        root = Path(shared[0])
        folder, dataset = str(root / "base"), str(root / "dataset")
        if env.is_main:
            from trainer.example_model import tiny_tokenizer

            tokenizer = tiny_tokenizer()
            save_llama_folder(folder, llama_config(args, vocab=len(tokenizer), context=args.block), tokenizer)
            cfg = config(args, folder)
            task_for(cfg).prepare(cfg, store, dataset)
        dist.barrier()
        cfg = config(args, folder)
        manifest = read_manifest(store, dataset)
        # The plain loop's data: the whole training split in memory, as a user would load it.
        items_of, take = task_for(cfg).stream(cfg, manifest)
        shards = split_shards(manifest, "train", dataset)
        train_ds = TensorDataset(*first_items(store, dataset, shards, items_of, take, sum(map(items_of, shards))))
        steps_per_epoch = len(train_ds) // args.batch
        if steps_per_epoch <= args.steps:  # an epoch end would put validation inside the timed steps
            raise SystemExit(f"{steps_per_epoch} steps per epoch: raise --corpus-bytes above {args.steps} steps")

        plain, ours = [], []
        for r in range(args.repeats):  # alternate which goes first, so drift hits both
            for which in ("plain", "trainer") if r % 2 == 0 else ("trainer", "plain"):
                if which == "plain":
                    plain.append(plain_loop(folder, cfg, train_ds, env, args.steps))
                else:
                    seconds, _, trainer = trainer_run(cfg, dataset, str(root / f"model-{r}"), env)
                    ours.append(seconds)
                    del trainer
                    gc.collect()

        methods: dict[str, dict] = {}
        for method in ("full", "lora"):
            mcfg = config(args, folder, **{"train.method": method, "checkpoint.enabled": True})
            model_uri = str(root / f"model-{method}")
            seconds, state, trainer = trainer_run(mcfg, dataset, model_uri, env)
            methods[method] = {"seconds": seconds, "state": state}
            if env.is_main:
                methods[method]["checkpoint"] = checkpoint_bytes(mcfg, model_uri, trainer.step)
            del trainer
            gc.collect()

        per_rank = [None] * env.world_size
        dist.all_gather_object(per_rank, {m: methods[m]["state"] for m in methods})
        if not env.is_main:
            return
        tokens = args.steps * args.batch * args.block
        p, o = statistics.median(plain), statistics.median(ours)
        mb = 1e6
        report: dict = {
            "world_size": env.world_size,
            "model": {
                "shape": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate")},
                "vocab": manifest["vocab_size"],
                "params_m": round(parameter_bytes(tensor_index(resolve(folder))) / 4 / 1e6, 2),  # fp32
            },
            "block": args.block,
            "global_batch": args.batch,
            "steps": args.steps,
            "repeats": args.repeats,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "plain_tokens_per_s": round(tokens / p),
            "trainer_tokens_per_s": round(tokens / o),
            "plain_tokens_per_s_runs": [round(tokens / s) for s in plain],
            "trainer_tokens_per_s_runs": [round(tokens / s) for s in ours],
            "trainer_over_plain_throughput": round(p / o, 3),
            # Per repeat (the two ran back to back, under the same load), then the median.
            "trainer_over_plain_paired_median": round(
                statistics.median(a / b for a, b in zip(plain, ours, strict=True)), 3
            ),
        }
        for m, res in methods.items():
            report[m] = {
                "tokens_per_s": round(tokens / res["seconds"]),
                "state_mb_per_rank": {
                    k: [round(r[m][k] / mb, 2) for r in per_rank] for k in per_rank[0][m]
                },  # fmt: skip
                "checkpoint_mb": round(res["checkpoint"]["total"] / mb, 3),
                "checkpoint_distcp_mb": round(res["checkpoint"]["distcp"] / mb, 3),
                "checkpoint_files": res["checkpoint"]["files"],
            }
        full_all = max(r["full"]["all_state"] for r in per_rank)
        report["lora_over_full"] = {
            "all_state_per_rank": round(max(r["lora"]["all_state"] for r in per_rank) / full_all, 4),
            "trainable_state_per_rank": round(max(r["lora"]["trainable_state"] for r in per_rank) / full_all, 4),
            "checkpoint_bytes": round(
                methods["lora"]["checkpoint"]["total"] / methods["full"]["checkpoint"]["total"], 4
            ),
            "throughput": round(methods["full"]["seconds"] / methods["lora"]["seconds"], 3),
        }
        print(json.dumps(report, indent=2), flush=True)


if __name__ == "__main__":
    main()
