"""The data partition rule: when `data.partitions` cuts an epoch exactly among the readers.

The streaming reader's layout (`trainer/streaming.py`) applies it; the config checks it for
every world size a job can have before anything starts. It lives apart from the reader so the
config, which compiling a pipeline imports, needs no torch.
"""

from __future__ import annotations


def partition_problem(partitions: int, readers: int, micro_batch: int) -> str:
    """Why `partitions` cannot cut an epoch exactly among `readers` (world size x DataLoader
    workers) at `micro_batch` items per rank and micro-step, or '', with the values that would."""
    if partitions % readers:
        problem = f"is not a multiple of the {readers} readers (world size x DataLoader workers)"
    elif micro_batch % (partitions // readers):
        problem = (
            f"gives each of the {readers} readers {partitions // readers} partitions, which the per-rank "
            f"micro-batch of {micro_batch} items (train.batch_size / (world size x train.grad_accum_steps)) "
            "does not divide by"
        )
    else:
        return ""
    fits = [readers * d for d in range(1, micro_batch + 1) if micro_batch % d == 0][:6]
    return f"{problem}: {', '.join(map(str, fits)) + ' fit at this world size, ' if fits else ''}or 0 (one per reader)"
