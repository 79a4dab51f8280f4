"""The Horovod shim's collective protocol on real gloo processes (2 and 3 ranks): processes that
disagree about a collective fail on every rank within seconds, `join()` with uneven data trains
to the model Horovod's semantics give, process sets, re-initialisation, and int16 by widening.

A short script runs on every rank (started like a PyTorchJob's one-process pods, in their own
sessions, killed afterwards) and writes what it saw to a JSON file per rank: the disagreement test
runs its own per world size; the other tests read one job per world size (WORLD_JOBS) that runs
their cases in turn, each from its own init, once per test session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_horovod import kill_all, launch, start, write

PRELUDE = """
import gc, json, os, sys, time
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
        "allreduce mismatch at collective #{i} 'grad.fc1.weight': "
        "rank 0 passed float32[4, 8], rank 1 passed float32[4, 9]",
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
    # A sparse tensor beside a dense one travels by other collectives (was: a hang for 30 min).
    (
        "sparse beside dense",
        "hvd.allreduce(torch.ones(2).to_sparse(), name='emb')",
        "hvd.allreduce(torch.ones(2), name='emb')",
        "allreduce mismatch at collective #{i} 'emb': rank 0 passed sparse float32[2], rank 1 passed float32[2]",
    ),
    # The gathered indices fit the larger size (was: a wrong result there, in silence).
    (
        "sparse sizes",
        "hvd.sparse_allreduce_async(torch.ones(2).to_sparse(), name='emb', op=hvd.Sum)()",
        "hvd.sparse_allreduce_async(torch.ones(3).to_sparse(), name='emb', op=hvd.Sum)()",
        "sparse_allreduce mismatch at collective #{i} 'emb': rank 0 passed sparse float32[2], "
        "rank 1 passed sparse float32[3]",
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
    # Last, as it leaves gradients in flight: in steady state an optimizer sends its gradients
    # before its check completes; a rank issuing something else meets that check and fails
    # before sending data, and the optimizer's rank fails in synchronize().
    (
        "optimizer step in steady state",
        "steady.step()",
        "hvd.allreduce(torch.ones(2), name='metric')",
        "allreduce name mismatch at collective #{i}: rank 0 passed ['bias', 'weight'], rank 1 passed 'metric'",
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
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    model(torch.ones(2, model.in_features)).sum().backward()
    opt.step()


class Steady:
    def __init__(self):
        self.model = torch.nn.Linear(3, 2)
        sgd = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.opt = hvd.DistributedOptimizer(sgd, named_parameters=self.model.named_parameters())

    def step(self):
        self.model(torch.ones(2, 3)).sum().backward()
        self.opt.step()


steady = Steady()
steady.step()  # its first step waits for its check: the later ones do not
out = {}
# Waiting is what a barrier and a broadcast are for: rank 0 prepares alone for longer than the check
# timeout (downloads the data, loads a checkpoint), the others wait in them, with no error (2 ranks).
for name, call in [
    ("barrier", hvd.barrier),
    ("broadcast_parameters", lambda: hvd.broadcast_parameters(steady.model.state_dict(), root_rank=0)),
    ("broadcast_object", lambda: hvd.broadcast_object(r, root_rank=0)),
] if n == 2 else []:
    if r == 0:
        time.sleep(4)
    out[name] = attempt(call)
for name, mine, theirs in cases:
    if name == cases[-1][0]:
        gc.collect()  # the earlier cases' optimizers, held by their errors' tracebacks, are gone
        out["optimizers"] = len(api._OPTIMIZERS)  # one alone: its steady steps do not wait for checks
    index = api._state.sets[0].seq  # the number the next collective will carry
    out[name] = attempt(lambda: exec(mine if r == 0 else theirs))
    out[name]["index"] = index
    if name != cases[-1][0]:
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
@pytest.mark.serial  # each rank waits out the 3 s check timeout
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
    assert [got["optimizers"] for got in ranks] == [1] * world
    for r, got in enumerate(ranks if world == 2 else []):
        for name in ("barrier", "broadcast_parameters", "broadcast_object"):
            assert got[name]["type"] is None, (name, r, got[name])
            if r:
                assert got[name]["seconds"] > 3, (name, r, got[name])  # waited past the check timeout
    missing = ranks[0]["missing"]
    assert missing["type"] == "HorovodInternalError", missing
    assert "allreduce at collective" in missing["message"] and "'only rank 0'" in missing["message"]
    assert "within 3 s" in missing["message"] and "KFTRAIN_HOROVOD_CHECK_TIMEOUT_S" in missing["message"]
    assert 2.5 < missing["seconds"] < 10, missing


# --- shutdown: the processes leave together, and a peer still working is told ------------------

LEAVE_CASE = """
def leave_case(arg):
    hvd.init()
    r = hvd.rank()
    mark = f"{out_dir}/leave-rank1"
    if r == 1:
        time.sleep(1.0)
        open(mark, "w").close()
    hvd.shutdown()
    return {"saw_the_other_arrive": r == 1 or os.path.exists(mark)}
"""

GONE_CASE = """
def gone_case(arg):
    hvd.init()
    out = {}
    if hvd.rank() == 0:
        out["extra"] = attempt(lambda: hvd.allreduce(torch.ones(1), name="after the others left"))
    out["shutdown"] = attempt(hvd.shutdown)
    return out
"""

# Last in the 2-rank job (see WORLD_JOBS): rank 0's script ends while rank 1 is in join().
JOINED_CASE = """
def joined_case(arg):
    hvd.init()
    return {"join": attempt(hvd.join)} if hvd.rank() == 1 else {}
"""


@pytest.mark.timeout(120)
def test_shutdown_waits_for_every_process_before_tearing_the_group_down(shared):
    # A gloo rank that destroys its group while a peer still works in it can abort the peer
    # ("terminate called without an active exception"): rank 1 arrives a second late.
    assert [got["leave"] for got in world_job(shared, 2)] == [{"saw_the_other_arrive": True}] * 2


@pytest.mark.timeout(120)
def test_a_collective_or_join_after_another_process_shut_down_fails_at_once_naming_it(shared):
    ranks = world_job(shared, 2)
    extra = ranks[0]["gone"]["extra"]
    assert extra["type"] == "HorovodInternalError", extra
    assert "'after the others left'" in extra["message"] and "rank 1 has shut down" in extra["message"], extra
    assert extra["seconds"] < 10
    assert all(got["gone"]["shutdown"]["seconds"] < 10 for got in ranks), ranks  # not the 60 s check timeout
    join = ranks[1]["joined"]["join"]
    assert join["type"] == "HorovodInternalError" and join["seconds"] < 10, join
    assert "hvd.join() can never complete: rank 0 has shut down without joining" in join["message"], join


FAILED_RANK = (
    PRELUDE
    + """
hvd.init()
if hvd.rank() == 1:
    raise ValueError("boom on rank 1")
while not os.path.exists(f"{out_dir}/go"):
    time.sleep(0.05)
dump({"after": attempt(lambda: hvd.allreduce(torch.ones(1), name="after rank 1 failed"))})
"""
)


@pytest.mark.timeout(120)
def test_a_process_ending_on_an_uncaught_error_does_not_wait_for_the_others(tmp_path, monkeypatch):
    # Its peers may never come: waiting the check timeout (600 s here) would only hide the failure.
    monkeypatch.setenv("KFTRAIN_HOROVOD_CHECK_TIMEOUT_S", "600")
    path = write(tmp_path / "script.py", FAILED_RANK)
    procs = start([sys.executable, "-m", "trainer.horovod.run", str(path), str(tmp_path)], 2, tmp_path)
    try:
        try:
            procs[1].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 1 waited at its exit for rank 0:\n" + (tmp_path / "log1.txt").read_text()[-3000:])
        assert procs[1].returncode == 1 and "boom on rank 1" in (tmp_path / "log1.txt").read_text()
        (tmp_path / "go").touch()
        assert procs[0].wait(timeout=60) == 0, (tmp_path / "log0.txt").read_text()[-3000:]
    finally:
        kill_all(procs)
    after = json.loads((tmp_path / "rank0.json").read_text())["after"]
    assert after["type"] == "HorovodInternalError" and "left or failed" in after["message"], after
    assert after["seconds"] < 10, after


# --- join: ranks that run out of data answer the others' allreduces with zeros --------------

JOIN_DATA = """
import torch

LR = 0.1


def batch(r, k):
    g = torch.Generator().manual_seed(1000 * r + k)
    x = torch.randn(8, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3 * torch.randn(8, 1, generator=g)


def loss_of(model, r, k):
    x, y = batch(r, k)
    return torch.nn.functional.mse_loss(model(x), y)
"""

JOIN_CASE = """
def join_case(all_batches):
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    batches = all_batches[r]
    torch.manual_seed(r)  # every rank starts elsewhere: broadcast_parameters makes them agree
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    out = {"losses": []}
    for k in range(batches):
        opt.zero_grad()
        loss = loss_of(model, r, k)
        loss.backward()
        opt.step()
        out["losses"].append(hvd.allreduce(loss.detach(), op=hvd.Sum, name="loss").item())
    out["last"] = hvd.join()
    # A joined rank stopped stepping: its model is the one of its last step until the usual
    # broadcast from the last rank to join.
    out["at_join"] = {k: v.tolist() for k, v in model.state_dict().items()}
    hvd.broadcast_parameters(model.state_dict(), root_rank=out["last"])
    out["model"] = {k: v.tolist() for k, v in model.state_dict().items()}
    out["after"] = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
    # Horovod refuses collectives other than allreduce while a rank has joined, on every rank.
    if r == 0:
        out["broadcast"] = attempt(lambda: hvd.broadcast(torch.ones(2), root_rank=0))
    else:
        out["broadcast"] = attempt(hvd.join)
    out["in_step"] = hvd.allreduce(torch.tensor([2.0]), op=hvd.Sum).item()
    hvd.shutdown()
    return out
"""


def _expected_join_training(batches: list[int], over_active: bool = False):
    """Horovod's semantics by hand: at step k the ranks that still have data send their gradient,
    the joined ones zeros, and Average divides by the whole size (by the ranks still active if
    `over_active`, which is not Horovod's rule)."""
    ns: dict = {}
    exec(JOIN_DATA, ns)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    size = len(batches)
    sums, states = [], [{k: v.clone() for k, v in model.state_dict().items()}]
    for k in range(max(batches)):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        total = 0.0
        for r in range(size):
            if k < batches[r]:
                model.zero_grad()
                loss = ns["loss_of"](model, r, k)
                loss.backward()
                total += loss.item()
                grads = [g + p.grad for g, p in zip(grads, model.parameters(), strict=True)]
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p -= ns["LR"] * g / (sum(k < b for b in batches) if over_active else size)
        sums.append(total)
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states, sums


@pytest.mark.timeout(150)
@pytest.mark.parametrize("batches", [[5, 2], [3, 5, 1]], ids=["2 ranks", "3 ranks"])
def test_join_with_uneven_data_trains_the_model_horovod_semantics_give(shared, batches):
    assert ["join", batches] in WORLD_JOBS[len(batches)]
    ranks = [got["join"] for got in world_job(shared, len(batches))]
    states, sums = _expected_join_training(batches)
    last = max(range(len(batches)), key=lambda r: batches[r])
    for r, got in enumerate(ranks):
        for name in states[0]:
            at_join = torch.tensor(got["at_join"][name])
            torch.testing.assert_close(at_join, states[batches[r]][name], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(torch.tensor(got["model"][name]), states[-1][name], rtol=1e-5, atol=1e-6)
        assert got["losses"] == pytest.approx(sums[: batches[r]], rel=1e-5)
        assert got["last"] == last and got["after"] == len(batches)
        assert got["broadcast"]["type"] == "HorovodInternalError", got["broadcast"]
        assert "Broadcast is not supported with Join" in got["broadcast"]["message"]
        assert got["in_step"] == 2 * len(batches)
    # The rule matters here: averaging over the active ranks only would end elsewhere.
    other, _ = _expected_join_training(batches, over_active=True)
    assert max(float((states[-1][k] - other[-1][k]).abs().max()) for k in states[0]) > 0.01


# --- process sets (static and dynamic) and int16 --------------------------------------------

SETS_CASE = """
def sets_case(checks):
    n = int(os.environ["WORLD_SIZE"])
    evens = hvd.ProcessSet(range(0, n, 2))
    hvd.init(process_sets=[evens])
    r = hvd.rank()
    rest = hvd.add_process_set(list(range(1, n)))  # dynamic, after init, on every rank
    out = {"ids": [evens.process_set_id, rest.process_set_id]}

    def on(ps):
        got = {"included": ps.included(), "size": ps.size()}
        got["rank"] = ps.rank() if ps.included() else attempt(ps.rank)["type"]
        if not ps.included():
            got["outsider"] = attempt(lambda: hvd.allreduce(torch.ones(1), process_set=ps))
            return got
        x = torch.tensor([1.0, 2.0]) * (r + 1)
        got["average"] = hvd.allreduce(x, process_set=ps).tolist()
        y = x.clone()
        hvd.allreduce_(y, op=hvd.Sum, process_set=ps)
        got["inplace_sum"] = y.tolist()
        got["grouped"] = [t.tolist() for t in hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, process_set=ps)]
        h = hvd.allreduce_async(x, op=hvd.Max, process_set=ps)
        got["async_max"] = hvd.synchronize(h).tolist()
        got["allgather"] = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=ps).tolist()
        root = max(ps.ranks)
        got["broadcast"] = hvd.broadcast(torch.tensor([float(r)]), root_rank=root, process_set=ps).tolist()
        got["object"] = hvd.broadcast_object({"from": r}, root_rank=min(ps.ranks), process_set=ps)
        got["objects"] = hvd.allgather_object(r, process_set=ps)
        hvd.barrier(process_set=ps)
        w = torch.nn.Parameter(torch.zeros(1))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), process_set=ps)
        ((r + 1) * w).sum().backward()
        opt.step()
        got["optimizer"] = w.tolist()
        outside = next((q for q in range(n) if q not in ps.ranks), None)
        if outside is not None:
            got["foreign_root"] = attempt(lambda: hvd.broadcast(torch.ones(1), root_rank=outside, process_set=ps))
        return got

    out["evens"] = on(evens)
    out["rest"] = on(rest)
    out["global"] = hvd.allreduce(torch.tensor([float(r)]), op=hvd.Sum).item()
    out["duplicate"] = attempt(lambda: hvd.add_process_set(list(range(0, n, 2))))
    out["removed"] = hvd.remove_process_set(rest)
    out["after_remove"] = attempt(lambda: hvd.allreduce(torch.ones(1), process_set=rest))

    # int16 (which gloo and NCCL lack) travels widened and comes back exact, in int16.
    i16 = torch.tensor([1000 * (r + 1), -7, 3 * r], dtype=torch.int16)
    widened = {
        "sum": hvd.allreduce(i16, op=hvd.Sum),
        "average": hvd.allreduce(i16),
        "min": hvd.allreduce(i16, op=hvd.Min),
        "max": hvd.allreduce(i16, op=hvd.Max),
        "inplace": hvd.allreduce_(i16.clone(), op=hvd.Sum),
        "grouped": hvd.grouped_allreduce([i16, i16], op=hvd.Sum)[1],
        "allgather": hvd.allgather(i16[: r + 1]),
        "broadcast": hvd.broadcast(i16, root_rank=n - 1),
        "broadcast_inplace": hvd.broadcast_(i16.clone(), root_rank=n - 1),
    }
    out["int16"] = {k: [str(v.dtype), v.tolist()] for k, v in widened.items()}
    if evens.included():
        out["int16_set"] = hvd.allreduce(i16, op=hvd.Sum, process_set=evens).tolist()
    hvd.shutdown()
    return out
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("world", "cases"), [(2, ["1"]), (3, ["1", "0"])], ids=["2 ranks", "3 ranks checked and unchecked"]
)
def test_process_sets_static_and_dynamic_and_int16(shared, world, cases):
    """Every collective works with the checks off (KFTRAIN_HOROVOD_CHECKS=0) too: the 3-rank job
    runs the sets case once per setting, each after a fresh init, and each is checked alone."""
    assert all(["sets", checks] in WORLD_JOBS[world] for checks in cases)
    ranks = world_job(shared, world)
    for checks in cases:
        for r, rank in enumerate(ranks):
            try:
                assert_process_sets(rank[f"sets-{checks}"], r, world)
            except AssertionError as exc:
                raise AssertionError(f"KFTRAIN_HOROVOD_CHECKS={checks}, rank {r}: {exc}") from exc


def assert_process_sets(got: dict, r: int, world: int) -> None:
    """What rank `r` of `world` saw of SETS_CASE's process sets and int16 collectives."""
    sets = {"evens": list(range(0, world, 2)), "rest": list(range(1, world))}
    assert got["ids"] == [1, 2]
    for name, members in sets.items():
        seen = got[name]
        assert (seen["included"], seen["size"]) == (r in members, len(members))
        if r not in members:
            assert seen["rank"] == "ValueError"  # as Horovod
            assert seen["outsider"]["type"] == "ValueError" and "not a member" in seen["outsider"]["message"]
            continue
        k = len(members)
        total = sum(m + 1 for m in members)
        assert seen["rank"] == members.index(r)
        assert seen["average"] == pytest.approx([total / k, 2 * total / k])
        assert seen["inplace_sum"] == [total, 2 * total]
        assert seen["grouped"] == [[total, 2 * total], [2 * total, 4 * total]]
        assert seen["async_max"] == [max(members) + 1, 2 * (max(members) + 1)]
        assert seen["allgather"] == [[float(m)] * 2 for m in members for _ in range(m + 1)]
        assert seen["broadcast"] == [float(max(members))]
        assert seen["object"] == {"from": min(members)} and seen["objects"] == members
        assert seen["optimizer"] == pytest.approx([-total / k])  # gradients averaged over the set
        if "foreign_root" in seen:
            assert (
                seen["foreign_root"]["type"] == "ValueError" and "is not a rank of" in seen["foreign_root"]["message"]
            )
    assert got["global"] == sum(range(world))
    assert got["duplicate"]["type"] == "ValueError" and "duplicate process set" in got["duplicate"]["message"]
    assert got["removed"] is True
    assert got["after_remove"]["type"] == "ValueError" and "not registered" in got["after_remove"]["message"]
    values = [[1000 * (q + 1), -7, 3 * q] for q in range(world)]
    sums = [sum(col) for col in zip(*values, strict=True)]
    expected = {
        "sum": sums,
        "average": [int(s / world) for s in sums],  # truncated toward zero, as for any integer tensor
        "min": [min(col) for col in zip(*values, strict=True)],
        "max": [max(col) for col in zip(*values, strict=True)],
        "inplace": sums,
        "grouped": sums,
        "allgather": [v for q in range(world) for v in values[q][: q + 1]],
        "broadcast": values[-1],
        "broadcast_inplace": values[-1],
    }
    assert got["int16"] == {k: ["torch.int16", v] for k, v in expected.items()}
    if r in sets["evens"]:
        assert got["int16_set"] == [sum(col) for col in zip(*[values[q] for q in sets["evens"]], strict=True)]


# --- shutdown then init, again and again ----------------------------------------------------

REINIT_CASE = """
def reinit_case(arg):
    out = {"sums": [], "set_sums": []}
    for i in range(6):
        ps = hvd.ProcessSet([1])
        hvd.init(process_sets=[ps])
        r = hvd.rank()
        out["sums"].append(hvd.allreduce(torch.tensor([float(i * (r + 1))]), op=hvd.Sum).item())
        if ps.included():
            out["set_sums"].append(hvd.allreduce(torch.tensor([float(i)]), op=hvd.Sum, process_set=ps).item())
        hvd.shutdown()
        out["initialized_after"] = hvd.is_initialized()
        out["set_after"] = ps.process_set_id
    return out
"""

# --- one job per world size runs the cases above in turn, each from its own init -------------

#: [case, argument] in the order each job runs them (JOINED last: rank 0 leaves after it).
WORLD_JOBS = {
    2: [["sets", "1"], ["join", [5, 2]], ["reinit", None], ["leave", None], ["gone", None], ["joined", None]],
    3: [["sets", "1"], ["sets", "0"], ["join", [3, 5, 1]]],
}

WORLD_SCRIPT = (
    PRELUDE
    + JOIN_DATA
    + SETS_CASE
    + JOIN_CASE
    + REINIT_CASE
    + LEAVE_CASE
    + GONE_CASE
    + JOINED_CASE
    + """
results = {}
for name, arg in json.loads(sys.argv[2]):
    # KFTRAIN_HOROVOD_CHECKS is read by init: the sets case runs under the value it names, the
    # others under the default.
    os.environ["KFTRAIN_HOROVOD_CHECKS"] = arg if name == "sets" else "1"
    results[f"sets-{arg}" if name == "sets" else name] = globals()[f"{name}_case"](arg)
dump(results)
"""
)


def world_job(shared, world: int) -> list[dict]:
    """What each rank of the `world`-rank job running WORLD_JOBS[world] saw, by case: one job
    per world size, once per test session, for every test that reads it."""

    def build(folder: Path) -> None:
        run(folder, WORLD_SCRIPT, world, json.dumps(WORLD_JOBS[world]))

    folder = shared(f"test_horovod_api-world-{world}", build)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(120)
def test_shutdown_then_init_works_every_time(shared):
    for r, got in enumerate(got["reinit"] for got in world_job(shared, 2)):
        assert got["sums"] == [3.0 * i for i in range(6)]
        assert got["set_sums"] == ([float(i) for i in range(6)] if r == 1 else [])
        assert got["initialized_after"] is False and got["set_after"] is None
