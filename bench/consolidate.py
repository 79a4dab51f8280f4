"""Benchmark: rank 0's peak memory writing an FSDP model's file, consolidated from the
checkpoint's shards one tensor at a time against the full-state-dict gather it replaces.

Two ranks shard a GPT with FSDP2 (gloo, CPU), save one checkpoint, then rank 0 writes
`model.safetensors` twice: first consolidated from the checkpoint (`trainer.consolidate`), then
from a full gather (`full_state_dict`, then `save_model`). Each is measured as the growth of rank
0's peak RSS over its RSS just before (the kernel's peak is reset in between through
/proc/self/clear_refs), so the ratio says how much less host memory rank 0 needs. Memory, not
time; reported, never asserted. It also reports the bytes consolidation downloads against the
shard files' total (what it downloaded before ranged reads): only the blocks holding model
tensors are fetched (`--block-mib`, default the checkpoint's 32 MiB).

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc-per-node 2 bench/consolidate.py
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.checkpoint import BLOCK_BYTES, COMMIT, CheckpointManager, step_dir  # noqa: E402
from trainer.consolidate import consolidate  # noqa: E402
from trainer.distributed import checkpoint_group, dist_env, full_state_dict, parallelize  # noqa: E402
from trainer.gpt import GPT, GPTConfig  # noqa: E402
from trainer.model_io import WEIGHTS, save_model, tied_names  # noqa: E402
from trainer.storage import LocalStore, join_uri  # noqa: E402


def mmap_large_allocations() -> None:
    """Make glibc serve every allocation over 64 KiB with its own mapping, returned to the
    kernel when freed: RSS then follows what is live. By default glibc raises that threshold
    (up to 32 MiB) as blocks are freed and keeps freed heap memory, which later allocations
    reuse without RSS growing: the measurement would depend on what ran before."""
    import ctypes
    import ctypes.util

    m_mmap_threshold = -3
    ctypes.CDLL(ctypes.util.find_library("c")).mallopt(m_mmap_threshold, 64 * 1024)


def status(field: str) -> int:
    """A /proc/self/status memory field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_growth(fn) -> int:
    """How far this process's peak RSS rose above its RSS while `fn()` ran."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from the current RSS
    before = status("VmRSS:")
    fn()
    return status("VmHWM:") - before


class CountingStore(LocalStore):
    """A local store that counts the bytes downloaded (whole objects and ranged reads)."""

    def __init__(self) -> None:
        self.fetched = 0

    def get_bytes(self, uri: str, offset: int = 0, length: int = 0) -> bytes:
        data = super().get_bytes(uri, offset, length)
        self.fetched += len(data)
        return data

    def get_file(self, uri: str, path) -> None:
        super().get_file(uri, path)
        self.fetched += Path(path).stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--n-embd", type=int, default=512)
    parser.add_argument("--block-mib", type=float, default=BLOCK_BYTES / 2**20)
    args = parser.parse_args()
    mmap_large_allocations()
    env = dist_env()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=args.n_layer, n_head=8, n_embd=args.n_embd, block_size=128))
    tied = tied_names(model)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    model = parallelize(model, env, torch.device("cpu"), strategy="fsdp", units=list(model.blocks))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randint(0, 256, (2, 16))).sum().backward()
    opt.step()  # the optimizer state a real checkpoint carries (and consolidation skips)
    box = [tempfile.mkdtemp(prefix="kftrain-bench-") if env.is_main else None]
    dist.broadcast_object_list(box)
    root = Path(box[0])
    store, prefix = LocalStore(), str(root / "ckpt")
    mgr = CheckpointManager(
        store,
        prefix,
        rank=env.rank,
        world_size=env.world_size,
        group=checkpoint_group(env),
        block_bytes=int(args.block_mib * 2**20),
    )
    model_state, optim_state = get_state_dict(model, opt)
    mgr.save(1, {"model": model_state, "optimizer": optim_state}, blocking=True)
    mgr.close()
    del model_state, optim_state
    dist.barrier()

    result = {}
    if env.is_main:
        out = root / "consolidated" / WEIGHTS
        out.parent.mkdir()
        counting = CountingStore()
        result["consolidate_peak_mb"] = peak_growth(
            lambda: consolidate(counting, step_dir(prefix, 1), out, exclude=tied)
        )
        commit = store.get_bytes(join_uri(step_dir(prefix, 1), COMMIT))
        parts = json.loads(commit)["parts"]
        result["distcp"] = sum(p["bytes"] for name, p in parts.items() if name.endswith(".distcp"))
        # What consolidation downloads besides the commit record: .metadata and shard blocks.
        result["fetched"] = counting.fetched - len(commit)
    dist.barrier()

    def gather_and_write() -> None:
        weights = full_state_dict(model)  # a collective: every rank calls it
        if env.is_main:
            save_model(store, str(root / "gathered"), model, {}, state=weights)

    grew = peak_growth(gather_and_write)
    if env.is_main:
        result["gather_peak_mb"] = grew
        same = (root / "gathered" / WEIGHTS).read_bytes() == out.read_bytes()
        mb = 2**20
        print(
            json.dumps(
                {
                    "model_mb": round(model_bytes / mb, 1),
                    "largest_tensor_mb": round(largest / mb, 1),
                    "consolidate_peak_mb": round(result["consolidate_peak_mb"] / mb, 1),
                    "gather_peak_mb": round(result["gather_peak_mb"] / mb, 1),
                    "gather_over_consolidate": round(result["gather_peak_mb"] / result["consolidate_peak_mb"], 1),
                    "consolidate_peak_over_largest_tensor": round(result["consolidate_peak_mb"] / largest, 2),
                    "same_file_bytes": same,
                    "block_mib": args.block_mib,
                    "distcp_mb": round(result["distcp"] / mb, 1),
                    "consolidate_fetched_mb": round(result["fetched"] / mb, 1),
                    "fetched_over_distcp": round(result["fetched"] / result["distcp"], 2),
                },
                indent=2,
            )
        )
    dist.barrier()
    if env.is_main:
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
