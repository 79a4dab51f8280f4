"""The Horovod shim's collectives without processes: how reducescatter splits dimension 0, how
alltoall's splits are checked, and that every public name of `horovod.torch` exists. Results on real
gloo processes are in tests/integration/test_horovod_collectives.py."""

from __future__ import annotations

import pytest
import torch

from trainer.horovod import api as hvd
from trainer.horovod.collectives import _alltoall_splits, reducescatter_sizes

# Every name horovod/torch/__init__.py exports (Horovod 0.28).
HOROVOD_TORCH = [
    "elastic",
    "Compression",
    "allgather_object",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "allreduce",
    "allreduce_async",
    "allreduce_",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "grouped_allreduce_",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "broadcast_",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "barrier",
    "poll",
    "synchronize",
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "HorovodInternalError",
    "DistributedOptimizer",
    "SyncBatchNorm",
]


@pytest.mark.parametrize("name", HOROVOD_TORCH)
def test_every_horovod_torch_name_is_exported(name):
    assert name in hvd.__all__ and hasattr(hvd, name)


@pytest.mark.parametrize(
    ("first_dim", "n", "sizes"),
    [
        (8, 2, [4, 4]),
        (7, 3, [3, 2, 2]),  # the first 7 % 3 ranks get the extra row
        (8, 3, [3, 3, 2]),
        (2, 3, [1, 1, 0]),  # fewer rows than ranks: the last get none
        (0, 2, [0, 0]),
        (5, 1, [5]),
    ],
)
def test_reducescatter_gives_the_first_ranks_the_extra_rows(first_dim, n, sizes):
    assert reducescatter_sizes(first_dim, n) == sizes
    assert sum(sizes) == first_dim


@pytest.mark.parametrize(
    ("rows", "splits", "n", "expected"),
    [
        (6, None, 3, [2, 2, 2]),
        (5, [2, 0, 3], 3, [2, 0, 3]),
        (6, [1, 1], 2, [1, 1]),  # rows past the splits are not sent
        (4, torch.tensor([3, 1], dtype=torch.int32), 2, [3, 1]),
    ],
)
def test_alltoall_splits(rows, splits, n, expected):
    assert _alltoall_splits(torch.zeros(rows, 2), splits, n) == expected


@pytest.mark.parametrize(
    ("tensor", "splits", "n", "error", "match"),
    [
        (torch.zeros(5), None, 2, ValueError, "not an even multiple"),
        (torch.zeros(2), [2, 1], 2, ValueError, "greater than the first dimension"),
        (torch.zeros(4), [1, 1, 1], 2, ValueError, "does not equal number of workers"),
        (torch.zeros(4), torch.tensor([2, 2]), 2, ValueError, "32-bit integer"),
        (torch.zeros(4), torch.ones(2, 1, dtype=torch.int32), 2, ValueError, "1D splits"),
        (torch.zeros(4), [3, -1], 2, ValueError, "must not be negative"),
        (torch.tensor(1.0), None, 2, hvd.HorovodInternalError, "rank-zero"),
    ],
)
def test_bad_alltoall_splits_are_refused_before_anything_is_sent(tensor, splits, n, error, match):
    with pytest.raises(error, match=match):
        _alltoall_splits(tensor, splits, n)


@pytest.mark.parametrize(
    ("version", "code"),
    [((2, 21, 5), 22105), ((2, 9, 6), 20906), ((2, 8, 4), 2804), ((2, 7, 8), 2708), (2708, 2708)],
)
def test_nccl_built_gives_horovods_version_code(version, code):
    # Horovod returns NCCL_VERSION_CODE, which scripts compare (`hvd.nccl_built() >= 2700`).
    assert hvd.nccl_version_code(version) == code


@pytest.mark.parametrize(
    ("dtype", "value", "factor", "expected"),
    [
        # Average of 3 ranks' 123456789 (the sum times 1/3): was 123456792, scaled in float32.
        (torch.int64, 3 * 123456789, 1 / 3, 123456789),
        (torch.int32, 2 * (2**25 + 1), 0.5, 2**25 + 1),  # a postscale_factor of 1/size
        (torch.int64, 2 * (2**40 + 1), 0.5, 2**40 + 1),
        (torch.int64, 2**40 + 1, 3.0, 3 * (2**40 + 1)),  # a prescale_factor
        (torch.int64, -7, 0.5, -3),  # truncated toward zero, as Horovod's C++ conversion
        (torch.uint8, 201, 0.5, 100),
        (torch.float64, 2**52 + 2, 0.5, 2**51 + 1),
    ],
)
def test_scaling_an_integer_tensor_is_exact_as_horovods_double(dtype, value, factor, expected):
    """Horovod scales (Average's 1/size, pre- and postscale_factor) in C++ double: integers are exact up to 2**53."""
    tensor = torch.tensor([value, value], dtype=dtype)
    hvd._scale_(tensor, factor)
    assert tensor.dtype == dtype and tensor.tolist() == [expected, expected]
