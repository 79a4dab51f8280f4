"""The data partition rule: when `data.partitions` cuts an epoch exactly among the readers.

The streaming reader's layout (`trainer/streaming.py`) applies it; the config checks it for
every world size a job can have before anything starts. It lives apart from the reader so the
config, which compiling a pipeline imports, needs no torch.
"""

from __future__ import annotations


def partition_problem(partitions: int, readers: int, micro_batch: int) -> str:
    """Why `partitions` cannot cut an epoch exactly among `readers` (world size x DataLoader
    workers) at `micro_batch` items per rank and micro-step, or ''."""
    if partitions % readers:
        return f"is not a multiple of the {readers} readers (world size x DataLoader workers)"
    if micro_batch % (partitions // readers):
        return (
            f"gives each of the {readers} readers {partitions // readers} partitions, which the per-rank "
            f"micro-batch of {micro_batch} items does not divide by"
        )
    return ""
