"""The Horovod shim's collective protocol on real gloo processes (2 and 3 ranks): processes that
disagree about a collective fail on every rank within seconds, `join()` with uneven data trains
to the model Horovod's semantics give, process sets, re-initialisation, and int16 by widening.

Each test runs one short script on every rank (started like a PyTorchJob's one-process pods, in
their own sessions, killed afterwards) that writes what it saw to a JSON file per rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_horovod import launch, write

PRELUDE = """
import json, os, sys, time
import torch
import horovod.torch as hvd

out_dir = sys.argv[1]


def dump(out):
    json.dump(out, open(f"{out_dir}/rank{hvd.rank() if hvd.is_initialized() else os.environ['RANK']}.json", "w"))


def attempt(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}
    return {"type": None, "seconds": time.monotonic() - start}
"""

# --- every kind of disagreement raises on every rank, quickly -------------------------------

# (case, what rank 0 does, what the other ranks do, what the message must say). Run in order in
# one job: after a mismatch every rank has raised at the same collective, so the next case starts
# in step. `r` is the rank, `n` the size.
MISMATCHES = [
    (
        "shape",
        "hvd.allreduce(torch.ones(4, 8), name='grad.fc1.weight')",
        "hvd.allreduce(torch.ones(4, 9), name='grad.fc1.weight')",
        "allreduce mismatch at collective #{i} 'grad.fc1.weight': rank 0 passed float32[4, 8], rank 1 passed float32[4, 9]",
    ),
    (
        "dtype",
        "hvd.allreduce(torch.ones(4, 8), name='grad.fc1.weight')",
        "hvd.allreduce(torch.ones(4, 8, dtype=torch.int32), name='grad.fc1.weight')",
        "rank 0 passed float32[4, 8], rank 1 passed int32[4, 8]",
    ),
    (
        "root_rank",
        "hvd.broadcast(torch.ones(3), root_rank=0)",
        "hvd.broadcast(torch.ones(3), root_rank=1)",
        "broadcast mismatch at collective #{i}: rank 0 passed root_rank 0, rank 1 passed root_rank 1",
    ),
    (
        "op",
        "hvd.allreduce(torch.ones(2), op=hvd.Sum)",
        "hvd.allreduce(torch.ones(2), op=hvd.Max)",
        "rank 0 passed op=Sum, prescale_factor=1.0, postscale_factor=1.0, rank 1 passed op=Max",
    ),
    (
        "order",
        "hvd.allreduce(torch.ones(2))",
        "hvd.broadcast(torch.ones(2), root_rank=0)",
        "order mismatch at collective #{i}: rank 0 called allreduce of float32[2], rank 1 called broadcast",
    ),
    (
        "name",
        "hvd.allreduce(torch.ones(2), name='loss')",
        "hvd.allreduce(torch.ones(2), name='accuracy')",
        "allreduce name mismatch at collective #{i}: rank 0 passed 'loss', rank 1 passed 'accuracy'",
    ),
    (
        "allgather trailing dims",
        "hvd.allgather(torch.ones(2, 3))",
        "hvd.allgather(torch.ones(5, 4))",
        "rank 0 passed float32[2, 3], rank 1 passed float32[5, 4] (every dimension but the first must match)",
    ),
    (
        "optimizer parameter shape",
        "step(torch.nn.Linear(8, 4))",
        "step(torch.nn.Linear(9, 4))",
        "allreduce mismatch at collective #{i} 'weight': rank 0 passed float32[4, 8], rank 1 passed float32[4, 9]",
    ),
    (
        "skipped collective",
        "hvd.allreduce(torch.ones(1), name='a'); hvd.allreduce(torch.ones(1), name='b')",
        "hvd.allreduce(torch.ones(1), name='b')",
        "allreduce name mismatch at collective #{i}: rank 0 passed 'a', rank 1 passed 'b'",
    ),
]

MISMATCH_SCRIPT = (
    PRELUDE
    + """
from trainer.horovod import api

hvd.init()
r, n = hvd.rank(), hvd.size()
cases = json.loads(sys.argv[2])


def step(model):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
    model(torch.ones(2, model.in_features)).sum().backward()
    opt.step()


# The first optimizer of a process imports half of torch: not part of what the cases time.
torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1).step()
out = {}
for name, mine, theirs in cases:
    index = api._state.sets[0].seq  # the number the next collective will carry
    out[name] = attempt(lambda: exec(mine if r == 0 else theirs))
    out[name]["index"] = index
    hvd.allreduce(torch.ones(1), name="in step again")  # every rank carries on after the error
# Last: rank 0 issues a collective no other rank ever issues; the others are busy, then leave.
if r == 0:
    out["missing"] = attempt(lambda: hvd.allreduce(torch.ones(1), name="only rank 0"))
else:
    time.sleep(8)
    out["missing"] = {"type": None}
dump(out)
os._exit(0)  # leave without the exit-time shutdown: the side group is mid-collective
"""
)


def run(tmp_path: Path, script: str, world: int, *args: str, timeout: float = 90) -> list[dict]:
    path = write(tmp_path / "script.py", script)
    launch([sys.executable, "-m", "trainer.horovod.run", str(path), str(tmp_path), *args], world, tmp_path, timeout)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3])
def test_every_kind_of_disagreement_raises_on_every_rank_within_seconds(tmp_path, monkeypatch, world):
    monkeypatch.setenv("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", "3")
    cases = json.dumps([case[:3] for case in MISMATCHES])
    ranks = run(tmp_path, MISMATCH_SCRIPT, world, cases)
    for name, _, _, expected in MISMATCHES:
        for r, got in enumerate(ranks):
            seen = got[name]
            assert seen["type"] == "HorovodInternalError", (name, r, seen)
            assert expected.format(i=seen["index"]) in seen["message"], (name, r, seen["message"])
            assert seen["seconds"] < 10, (name, r, seen)
    missing = ranks[0]["missing"]
    assert missing["type"] == "HorovodInternalError", missing
    assert "allreduce at collective" in missing["message"] and "'only rank 0'" in missing["message"]
    assert "within 3.0 s" in missing["message"] and "KFTRAIN_HOROVOD_CHECK_TIMEOUT_S" in missing["message"]
    assert 2.5 < missing["seconds"] < 10, missing
