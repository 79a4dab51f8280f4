"""trainer/distributed.py in real two-process gloo groups."""

from __future__ import annotations

import pytest

from tests.conftest import run_ranks

RANK = """
import torch
from torch.nn.parallel import DistributedDataParallel
from trainer.distributed import GLOO_WORKERS, comm_threads_settled, device_for, dist_env, process_group
from trainer.procfs import thread_states

env = dist_env()
with process_group(env, device_for(env), timeout_s=60):
    model = DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()
workers = [name for name, _ in thread_states()].count(GLOO_WORKERS)
print(f"rank {env.rank}: {workers} workers left, settled {comm_threads_settled()}", flush=True)
"""


@pytest.mark.timeout(120)
def test_gloo_workers_that_outlive_the_group_are_found_by_name_and_asleep_when_it_is_left(tmp_path):
    """The group's gloo workers outlive it once DDP used it (torch 2.13) and are what
    process_group waits for before the process may end (comm_threads_settled): found by the name
    torch gives them, asleep once the group is left. No worker found would make that wait a no-op."""
    ranks = run_ranks(RANK, 2, timeout=90)
    for r, (returncode, out) in enumerate(ranks):
        assert returncode == 0, out
        said = next(line for line in out.splitlines() if line.startswith(f"rank {r}:"))
        workers = int(said.split()[2])
        assert workers > 0, f"no thread named as torch's gloo workers were: {out}"
        assert said.endswith("settled True"), out
