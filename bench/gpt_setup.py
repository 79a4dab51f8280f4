"""What the 2-rank GPT benchmarks share: their model arguments, the model made data-parallel the
trainer's way, and random token data."""

from __future__ import annotations

import argparse

import torch

from trainer.distributed import DistEnv, parallelize
from trainer.gpt import GPT, GPTConfig
from trainer.tasks.base import Task


def add_gpt_arguments(parser: argparse.ArgumentParser, steps: int, help_steps: str) -> None:
    """The model, batch and repeat options of a GPT benchmark."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps, help=help_steps)
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--block", type=int, default=128, help="context length")
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences per step)")


def require_ranks(env: DistEnv) -> None:
    """These benchmarks compare multi-rank strategies: refuse to run as one process."""
    if env.world_size < 2:
        raise SystemExit("run under torch.distributed.run --nproc-per-node 2 (or more)")


def gpt(args: argparse.Namespace) -> GPT:
    """A fresh GPT of the benchmark's shape, the same weights on every rank (seed 0)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.block))


def parallel_gpt(args, env: DistEnv, device: torch.device, strategy: str, activation_checkpointing: bool = False):
    """(model, the module the loop calls) for `strategy`, sharded by the task's default units."""
    model = gpt(args).to(device)
    step_model = parallelize(
        model,
        env,
        device,
        strategy=strategy,
        units=Task().shard_units(model),
        activation_checkpointing=activation_checkpointing,
    )
    return model, step_model


def token_batches(args: argparse.Namespace, steps: int) -> torch.Tensor:
    """`steps` global batches of random byte tokens, `block + 1` long (inputs and targets)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, 256, (steps, args.batch, args.block + 1), generator=gen)
