"""Benchmark: fine-tuning a ~1B Llama-shaped model on GPUs, full and LoRA (issue #18).

Run under torchrun, one process per GPU; prints one JSON line (rank 0). The model is built
from a config (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocabulary
32000, untied: 1.1B parameters; nothing is downloaded) the way kftrain builds a
``model.init_from`` model: parameters on the meta device (``trainer.pretrained.build_on_meta``),
peft's LoRA adapters for ``lora`` (``trainer.tasks.pretrained_lm.apply_lora``), sharded with
``trainer.distributed.parallelize`` (FSDP2 per decoder layer, bf16 all-gathers; one GPU: the
model as it is), then given storage on the GPU (``give_storage``) and random weights (a
pretrained folder's values would not change the speed). The base weights' dtype is kftrain's
choice (``pretrained_lm._dtype``): fp32 for full fine-tuning, bf16 for LoRA's frozen base.
The step is the trainer's: bf16 autocast, the task's loss, backward, the global gradient norm,
fused AdamW over the trainable parameters.

Per method: tokens/s (median of the timed windows), MFU (the task's training FLOPs per token,
``PretrainedLMTask.flops_per_item``: 6N for full, 4N for LoRA, plus attention; against the
device's bf16 peak, ``trainer.train.peak_flops``), and the peak memory the method's model,
optimizer and steps allocated (``torch.cuda.max_memory_allocated`` over its build, warm-up and
windows, minus what was allocated before). Full runs first and is freed before LoRA is built.

Without CUDA it prints a JSON line saying so and exits 0 (nothing measured); ``--smoke`` runs
the same code on the CPU (gloo, a tiny Llama, a few steps) to prove the script before a GPU
session.

    # a GPU machine, all its GPUs
    python -m torch.distributed.run --nproc-per-node gpu bench/gpu_llama.py
    # CPU check
    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/gpu_llama.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.fsdp_vs_ddp import local_tensor  # noqa: E402
from bench.gpu_gpt2 import allocated, peak_gb_since, reset_peak, timed_steps  # noqa: E402
from bench.llama_setup import add_llama_arguments, llama_config  # noqa: E402
from trainer import pretrained  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.distributed import device_for, dist_env, parallelize, process_group  # noqa: E402
from trainer.tasks import pretrained_lm  # noqa: E402
from trainer.train import autocast_for, peak_flops  # noqa: E402

#: The ~1B shape of issue #18.
LLAMA_1B = {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "intermediate": 8192, "vocab": 32000}
SMOKE = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 1000}


class Run:
    """One method's model (sharded, on the device, random weights), optimizer and step."""

    def __init__(self, args, method: str, env, device) -> None:
        self.device = device
        self.cfg = load_config(
            overrides={
                "task": "causal_lm",
                # Names no folder: the model is built from a config here, never read.
                "model.init_from": "/built-from-a-config",
                "model.block_size": args.block,
                "train.method": method,
                "train.activation_checkpointing": args.ac,
            }
        )
        hf_config = llama_config(args, context=args.block).to_dict()
        # kftrain's own choices for a model.init_from run (private to the task; the same code here).
        self.dtype = pretrained_lm._dtype(self.cfg)
        model = pretrained.build_on_meta(hf_config, self.dtype)
        model.config.use_cache = False
        if method == "lora":
            model = pretrained_lm.apply_lora(model, pretrained_lm._lora_dict(self.cfg.lora))
        self.task = pretrained_lm.PretrainedLMTask()
        # Before sharding: the whole tensors' sizes.
        self.flops_per_token = self.task.flops_per_item(model, self.cfg)
        self.params = sum(p.numel() for p in model.parameters())
        self.trainable_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        buffers = pretrained.buffers_of(model)
        self.step_model = parallelize(
            model,
            env,
            device,
            strategy="fsdp",
            units=self.task.shard_units(model),
            activation_checkpointing=args.ac,
            bf16=True,
        )
        pretrained.give_storage(model, device, buffers)
        random_weights(model, seed=env.rank)
        self.model = model
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.trainable, lr=1e-5, fused=device.type == "cuda")

    def steps(self, data: torch.Tensor, n: int) -> float:
        """`n` optimizer steps on `data` (batches, micro, block + 1); wall seconds, device synchronised."""
        # float("inf"): the trainer's default, the norm computed but no clipping.
        seconds, loss = timed_steps(self, data, n, autocast_for(self.device, self.cfg), self.trainable, float("inf"))
        self.last_loss = float(loss)  # a NaN here would make the timing meaningless
        return seconds


@torch.no_grad()
def random_weights(model: torch.nn.Module, seed: int) -> None:
    """Initialise every parameter this rank holds: N(0, 0.02) matrices, unit norms, LoRA as kftrain does."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    adapters = []
    for name, p in model.named_parameters():
        if ".lora_" in name:
            adapters.append(name)
            continue
        local = local_tensor(p)
        if local.dim() == 1:
            local.fill_(1.0)
        else:
            local.normal_(0.0, 0.02, generator=gen)
    pretrained_lm.init_adapters(model, adapters, seed=0, origin="random")


def batches(vocab: int, micro: int, block: int, env, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + env.rank)  # each rank its own samples
    return torch.randint(0, vocab, (4, micro, block + 1), generator=gen).to(device)


def measure(args, method: str, env, device) -> dict:
    before = allocated(device)
    reset_peak(device)
    run = Run(args, method, env, device)
    data = batches(args.vocab, args.micro_batch, args.block, env, device)
    warm = run.steps(data, args.warmup)
    windows = [run.steps(data, args.steps) for _ in range(args.repeats)]
    tokens = args.steps * args.micro_batch * env.world_size * args.block
    tps = tokens / statistics.median(windows)
    peak = peak_flops(device, run.cfg) * env.world_size
    out = {
        "params_m": round(run.params / 1e6, 1),
        "trainable_params_m": round(run.trainable_params / 1e6, 3),
        "base_dtype": str(run.dtype).removeprefix("torch."),
        "warmup_s": round(warm, 2),
        "tokens_per_s": round(tps),
        "tokens_per_s_windows": [round(tokens / w) for w in windows],
        "mfu": round(tps * run.flops_per_token / peak, 4) if peak else None,
        "peak_memory_gb": peak_gb_since(device, before),
        "last_loss": round(run.last_loss, 4),
    }
    del run, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny Llama on the CPU, a few steps")
    add_llama_arguments(parser, **LLAMA_1B)
    parser.add_argument("--block", type=int, default=0, help="context length (default 2048; smoke 32)")
    parser.add_argument("--micro-batch", type=int, default=0, help="sequences per rank per step (default 8; smoke 2)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps first (default 3; smoke 1)")
    parser.add_argument("--steps", type=int, default=0, help="steps per timed window (default 10; smoke 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per method")
    parser.add_argument("--ac", action="store_true", help="activation checkpointing of the decoder layers")
    parser.add_argument("--methods", default="full,lora")
    args = parser.parse_args()
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
    args.block = args.block or (32 if args.smoke else 2048)
    args.micro_batch = args.micro_batch or (2 if args.smoke else 8)
    args.warmup = args.warmup or (1 if args.smoke else 3)
    args.steps = args.steps or (2 if args.smoke else 10)
    if not torch.cuda.is_available() and not args.smoke:
        print(json.dumps({"skipped": "no CUDA device: nothing measured (--smoke runs the CPU check)"}), flush=True)
        return
    env = dist_env()
    device = device_for(env)
    with process_group(env, device, timeout_s=300):
        report = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": env.world_size,
            "strategy": "fsdp" if env.distributed else "single",
            "torch": torch.__version__,
            "model": {k: getattr(args, k) for k in LLAMA_1B},
            "block": args.block,
            "micro_batch_per_rank": args.micro_batch,
            "activation_checkpointing": args.ac,
        }
        for method in args.methods.split(","):
            report[method] = measure(args, method, env, device)
            if env.is_main:  # in case a later method runs out of memory
                print(json.dumps({"partial": True, method: report[method]}), file=sys.stderr, flush=True)
        if "full" in report and "lora" in report:
            speed = report["lora"]["tokens_per_s"] / report["full"]["tokens_per_s"]
            report["lora_over_full_throughput"] = round(speed, 3)
            if device.type == "cuda":
                report["lora_over_full_peak_memory"] = round(
                    report["lora"]["peak_memory_gb"] / report["full"]["peak_memory_gb"], 3
                )
        if env.is_main:
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
