"""Benchmark: GPT-2 small on GPUs with DDP and FSDP2, and a model that only fits sharded (issue #9).

Run under torchrun, one process per GPU; prints one JSON line (rank 0). The project's own
model (:class:`trainer.gpt.GPT`), :func:`trainer.distributed.parallelize` and the task's loss,
as the trainer runs them: bf16 autocast (FSDP: bf16 all-gathers, fp32 gradient reduction),
``torch.compile`` of the parallelized model, fused AdamW, a global gradient-norm clip.

1. Throughput: GPT-2 small (12 layers x 768, 12 heads, context 1024, vocab 50257) with each
   strategy, both models built and compiled first, then timed windows alternating between
   them. Per strategy: tokens/s (median window), MFU (the model's training FLOPs per token
   against the device's bf16 peak, ``trainer.train.peak_flops``), and the peak memory the
   strategy's own model, optimizer and steps allocated (``torch.cuda.max_memory_allocated``
   over its build and warm-up, minus what was allocated before).
2. Memory cap: ``torch.cuda.set_per_process_memory_fraction`` caps each process below the
   bytes of a replicated GPT-2 large (774M parameters: fp32 weights + gradients + AdamW state,
   16 bytes per parameter) and above a shard of them; FSDP then trains it and DDP runs out of
   memory (both with activation checkpointing, not compiled). FSDP's attempt runs first: if
   DDP's failure left the ranks out of step, the results are still printed (on stderr) first.

Limitations: with one GPU the world size is 1 and ``parallelize`` returns the model as it is
for either strategy (NCCL does not allow two ranks on one GPU), so the throughput part reports
one ``single`` entry, and the memory cap is reported as not applicable: FSDP's saving needs
at least 2 GPUs. ``--smoke`` runs the same code on the CPU (gloo, tiny models, a few steps,
no cap: the CPU has no per-process limit) to prove the script before a GPU session.

    # a GPU machine, all its GPUs
    python -m torch.distributed.run --nproc-per-node gpu bench/gpu_gpt2.py
    # CPU check
    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/gpu_gpt2.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.config import load_config  # noqa: E402
from trainer.distributed import clip_grad_norm, device_for, dist_env, parallelize, process_group  # noqa: E402
from trainer.gpt import GPT, GPTConfig  # noqa: E402
from trainer.tasks.causal_lm import CausalLMTask  # noqa: E402
from trainer.train import peak_flops  # noqa: E402

GPT2_SMALL = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
GPT2_LARGE = GPTConfig(vocab_size=50257, block_size=1024, n_layer=36, n_head=20, n_embd=1280)
SMOKE_SMALL = GPTConfig(vocab_size=50257, block_size=64, n_layer=2, n_head=2, n_embd=64)
SMOKE_LARGE = GPTConfig(vocab_size=50257, block_size=64, n_layer=4, n_head=2, n_embd=128)
#: Bytes per parameter of what each rank holds for training in fp32: weight, gradient, AdamW's two moments.
STATE_BYTES_PER_PARAM = 16


class Run:
    """One strategy's model, optimizer and step, built on the device."""

    def __init__(self, cfg: GPTConfig, strategy: str, env, device, *, compile: bool, ac: bool) -> None:
        self.env, self.device, self.cfg = env, device, cfg
        torch.manual_seed(0)  # the same initial weights on every rank
        with device:  # initialised on the device itself: no host copy of a large model
            self.model = GPT(cfg)
        self.flops_per_token = self.model.flops_per_token()  # before sharding: whole tensors
        self.num_params = self.model.num_params()
        wrapped = parallelize(
            self.model,
            env,
            device,
            strategy=strategy,
            units=CausalLMTask().shard_units(self.model),
            activation_checkpointing=ac,
            bf16=True,
        )
        self.step_model = torch.compile(wrapped) if compile else wrapped
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=device.type == "cuda")
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
        self.task = CausalLMTask()

    def steps(self, data: torch.Tensor, n: int) -> float:
        """`n` optimizer steps on `data` (batches, micro, block + 1); wall seconds, device synchronised."""
        return timed_steps(self, data, n, self.amp, list(self.model.parameters()), 1.0)[0]


def timed_steps(run, data: torch.Tensor, n: int, amp, params: list, max_norm: float) -> tuple[float, torch.Tensor]:
    """`n` optimizer steps of `run` (its `step_model`, `task` and `opt` on its `device`) on `data` (batches,
    micro, block + 1), the forward under `amp`, the gradients of `params` clipped to `max_norm`:
    (wall seconds, device synchronised; the last step's loss)."""
    sync(run.device)
    t0 = time.perf_counter()
    for i in range(n):
        batch = data[i % len(data)]
        run.opt.zero_grad(set_to_none=True)
        with amp:
            loss = run.task.loss(run.step_model, (batch[:, :-1], batch[:, 1:]))
        loss.backward()
        clip_grad_norm(params, max_norm)
        run.opt.step()
    sync(run.device)
    return time.perf_counter() - t0, loss


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def peak_gb_since(device: torch.device, before: int) -> float | None:
    """Peak bytes allocated since the last reset, above `before`, in GB (None on the CPU: not tracked)."""
    return round((torch.cuda.max_memory_allocated(device) - before) / 1e9, 3) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def batches(cfg: GPTConfig, micro: int, env, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + env.rank)  # each rank its own samples
    return torch.randint(0, cfg.vocab_size, (4, micro, cfg.block_size + 1), generator=gen).to(device)


def throughput(args, env, device, strategies: list[str]) -> dict:
    cfg = SMOKE_SMALL if args.smoke else GPT2_SMALL
    data = batches(cfg, args.micro_batch, env, device)
    runs, out = {}, {}
    for s in strategies:
        before = allocated(device)
        reset_peak(device)
        runs[s] = Run(cfg, s, env, device, compile=not args.no_compile, ac=False)
        warm = runs[s].steps(data, args.warmup)  # compiles, creates AdamW state
        out[s] = {"warmup_s": round(warm, 2), "peak_memory_gb": peak_gb_since(device, before)}
    windows: dict[str, list[float]] = {s: [] for s in strategies}
    for r in range(args.repeats):
        for s in strategies[r % len(strategies) :] + strategies[: r % len(strategies)]:
            windows[s].append(runs[s].steps(data, args.steps))
    tokens = args.steps * args.micro_batch * env.world_size * cfg.block_size
    peak = peak_flops(device, load_config()) * env.world_size
    for s in strategies:
        tps = tokens / statistics.median(windows[s])
        out[s].update(
            tokens_per_s=round(tps),
            tokens_per_s_windows=[round(tokens / w) for w in windows[s]],
            mfu=round(tps * runs[s].flops_per_token / peak, 4) if peak else None,
        )
    if len(strategies) == 2:
        out["fsdp_over_ddp_throughput"] = round(out["fsdp"]["tokens_per_s"] / out["ddp"]["tokens_per_s"], 3)
        if device.type == "cuda":
            out["fsdp_over_ddp_peak_memory"] = round(out["fsdp"]["peak_memory_gb"] / out["ddp"]["peak_memory_gb"], 3)
    out["model"] = {**cfg.as_dict(), "params_m": round(runs[strategies[0]].num_params / 1e6, 1)}
    del runs
    gc.collect()
    return out


def attempt(cfg: GPTConfig, strategy: str, args, env, device) -> dict:
    """Train `cfg` for a few steps with `strategy`; whether it fitted, and its peak memory."""
    before = allocated(device)
    reset_peak(device)
    run = None
    try:
        run = Run(cfg, strategy, env, device, compile=False, ac=True)
        run.steps(batches(cfg, 1, env, device), args.cap_steps)
        result = {"fits": True, "peak_memory_gb": peak_gb_since(device, before)}
    except torch.OutOfMemoryError as exc:
        result = {"fits": False, "error": str(exc).splitlines()[0][:200]}
    del run
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    every = [None] * env.world_size
    dist.all_gather_object(every, result["fits"])
    result["fits_on_every_rank"] = all(every)
    return result


def memory_cap(args, env, device) -> dict:
    if not env.distributed:
        return {"applicable": False, "reason": "one process: FSDP shards nothing (needs at least 2 GPUs)"}
    cfg = SMOKE_LARGE if args.smoke else GPT2_LARGE
    with torch.device("meta"):  # counted without allocating it
        params = GPT(cfg).num_params()
    replicated = params * STATE_BYTES_PER_PARAM
    cap = int(args.cap_of_replicated * replicated)
    out: dict = {
        "model": {**cfg.as_dict(), "params_m": round(params / 1e6, 1)},
        "replicated_state_gb": round(replicated / 1e9, 2),
        "sharded_state_gb": round(replicated / env.world_size / 1e9, 2),
        "cap_gb": round(cap / 1e9, 2),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
        out["cap_fraction"] = round(cap / total, 4)
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
    else:
        out["note"] = "no CUDA: the attempts ran without a cap (the CPU has no per-process limit)"
    out["fsdp"] = attempt(cfg, "fsdp", args, env, device)
    if env.is_main:
        print(json.dumps({"partial": True, "memory_cap": out}), file=sys.stderr, flush=True)
    out["ddp"] = attempt(cfg, "ddp", args, env, device)
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny models on the CPU, a few steps")
    parser.add_argument("--micro-batch", type=int, default=0, help="sequences per rank per step (default 16; smoke 2)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps, compilation included (default 10)")
    parser.add_argument("--steps", type=int, default=0, help="steps per timed window (default 30; smoke 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed windows per strategy")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--cap-of-replicated", type=float, default=0.85, help="memory cap / replicated state bytes")
    parser.add_argument("--cap-steps", type=int, default=3)
    args = parser.parse_args()
    args.micro_batch = args.micro_batch or (2 if args.smoke else 16)
    args.warmup = args.warmup or (1 if args.smoke else 10)
    args.steps = args.steps or (2 if args.smoke else 30)
    env = dist_env()
    device = device_for(env)
    if device.type != "cuda" and not args.smoke:
        raise SystemExit("no CUDA device: run with --smoke for the CPU check")
    # One process: parallelize() returns the model unchanged for either strategy.
    strategies = ["ddp", "fsdp"] if env.distributed else ["single"]
    with process_group(env, device, timeout_s=300):
        report = {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "world_size": env.world_size,
            "torch": torch.__version__,
            "compiled": not args.no_compile,
            "micro_batch_per_rank": args.micro_batch,
            "throughput": throughput(args, env, device, strategies),
            "memory_cap": memory_cap(args, env, device),
        }
        if env.is_main:
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
