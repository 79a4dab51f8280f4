"""Checkpoint prefixes belong to one run: a second run refuses naming the owner, or takes the
prefix over deliberately (checkpoint.resume); nothing the first run committed is lost, a
committed step is never overwritten, and pruning touches only the run's own steps."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from trainer.checkpoint import (
    COMMIT,
    CheckpointError,
    CheckpointManager,
    claim_prefix,
    current_owner,
    step_dir,
)
from trainer.checkpoint_owner import complete_record, latest_complete, objects_by_step
from trainer.storage import LocalStore, join_uri


def manager(store, prefix: str, owner: str, keep_last: int = 2) -> CheckpointManager:
    return CheckpointManager(store, prefix, keep_last, owner=owner)


def weights(step: int, owner: str) -> dict[str, torch.Tensor]:
    """A state that says which run wrote which step."""
    return {"w": torch.full((4,), float(step) + (0.5 if owner == "run-b" else 0.0))}


def save(ckpt: CheckpointManager, step: int) -> None:
    ckpt.save(step, {"model": weights(step, ckpt.owner)}, record={"by": ckpt.owner}, blocking=True)


def loaded(store, prefix: str, step: int) -> torch.Tensor:
    """Step `step` loaded with a fresh reader (checks every byte against its commit record)."""
    reader = manager(store, prefix, "reader")
    record = complete_record(reader.store, reader.prefix, step, objects_by_step(reader.store, reader.prefix))
    assert record is not None
    state = {"model": {"w": torch.zeros(4)}}
    reader.load(record, state)
    reader.close()
    return state["model"]["w"]


def assert_intact(store, prefix: str, owner: str, steps: list[int]) -> None:
    for step in steps:
        torch.testing.assert_close(loaded(store, prefix, step), weights(step, owner)["w"])


@pytest.fixture
def prefix(tmp_path) -> str:
    return str(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("first", "second", "resume", "refusal"),
    [
        # A new run, resume: false, on a prefix an earlier run owns: refused, naming the owner.
        ("run-a", "run-b", False, "belongs to run 'run-a'"),
        # The same run again (a retried step, --run-id) with resume: false would overwrite its steps.
        ("run-a", "run-a", False, "already holds committed steps [2, 3] of this run ('run-a')"),
        # The same run again resuming, or another run taking over deliberately: no refusal.
        ("run-a", "run-a", True, None),
        ("run-a", "run-b", True, None),
    ],
)
def test_a_second_run_on_a_prefix_refuses_or_continues_and_the_first_loses_nothing(
    prefix, first, second, resume, refusal
):
    store = LocalStore()
    a = manager(store, prefix, first)
    a.claim(resume=False)
    for step in (1, 2, 3):
        save(a, step)
    a.close()
    assert a.committed_steps() == [2, 3]  # keep_last 2 of its own

    b = manager(store, prefix, second)
    if refusal:
        with pytest.raises(CheckpointError, match=re.escape(refusal)):
            b.claim(resume=resume)
        assert current_owner(store, prefix)["owner"] == first
    else:
        b.claim(resume=resume)
        assert b.latest()["step"] == 3
    assert_intact(store, prefix, first, [2, 3])


def test_a_refusal_names_the_owner_host_and_how_to_proceed_in_one_line(prefix):
    store = LocalStore()
    claim_prefix(store, prefix, "run-a", resume=False)
    with pytest.raises(CheckpointError) as err:
        claim_prefix(store, prefix, "run-b", resume=False)
    message = str(err.value)
    assert "\n" not in message
    assert "belongs to run 'run-a' (claimed " in message and " on host " in message
    assert "point checkpoint.uri at a new prefix, or set checkpoint.resume: true" in message


def test_a_takeover_keeps_the_earlier_runs_steps_and_stops_the_earlier_run_at_its_next_save(prefix):
    store = LocalStore()
    a = manager(store, prefix, "run-a")
    a.claim(resume=True)
    save(a, 1)
    save(a, 2)

    b = manager(store, prefix, "run-b")
    b.claim(resume=True)  # resume: true takes the prefix over, from run-a's latest step
    assert b.latest()["step"] == 2
    for step in (3, 4, 5, 6):
        save(b, step)

    # run-a, still running, must neither write beside run-b nor prune its steps.
    with pytest.raises(CheckpointError, match="now belongs to run 'run-b'.*the steps it committed are kept"):
        save(a, 7)
    assert not store.list(step_dir(prefix, 7))
    # run-b pruned only its own steps (keep_last 2): run-a's are kept, never its to delete.
    assert b.committed_steps() == [1, 2, 5, 6]
    assert_intact(store, prefix, "run-a", [1, 2])
    assert_intact(store, prefix, "run-b", [5, 6])
    owner = current_owner(store, prefix)
    assert (owner["owner"], owner["generation"], owner["previous_owner"]) == ("run-b", 2, "run-a")


@pytest.mark.parametrize(
    ("pid", "written_after_it_started", "taken_over"),
    [
        ("parent", True, False),  # another process of this machine, still running: refused
        ("parent", False, True),  # its pid, given to a process that started after the record: the owner is gone
        ("gone", True, True),  # no such process
    ],
)
def test_a_takeover_of_a_prefix_whose_owner_still_runs_here_is_refused(
    prefix, pid, written_after_it_started, taken_over
):
    """Was: taken over with a warning while the other run trained: it failed at its next save,
    and its own later `--run-id` took the prefix back with the other run's weights."""
    import json
    import os
    import socket
    import time

    from trainer.checkpoint_owner import claim_prefix, current_owner, owner_uri

    store = LocalStore()
    record = {
        "owner": "run-a",
        "generation": 1,
        "host": socket.gethostname(),
        "pid": os.getppid() if pid == "parent" else 2**22 + 7,  # above the kernel's largest pid
        "created_unix_time": time.time() if written_after_it_started else 1.0,
    }
    store.put_bytes(owner_uri(prefix, 1), json.dumps(record).encode())
    if taken_over:
        assert claim_prefix(store, prefix, "run-b", resume=True)["owner"] == "run-b"
        return
    with pytest.raises(CheckpointError) as err:
        claim_prefix(store, prefix, "run-b", resume=True)
    assert "belongs to run 'run-a' (claimed" in str(err.value) and "which is still running on this machine" in str(
        err.value
    )
    assert current_owner(store, prefix)["owner"] == "run-a"


@pytest.mark.parametrize("b_committed", [True, False])
def test_a_run_may_not_take_back_a_prefix_whose_newest_step_another_run_committed(prefix, b_committed):
    """Run a committed step 10; run b took the prefix over and committed step 20; a's `--run-id`
    took it back and resumed from b's step 20, finishing with b's weights as its own. Refused now,
    naming a's own newest step; taken back where b committed nothing."""
    store = LocalStore()
    claim_prefix(store, prefix, "run-a", resume=True)
    a = manager(store, prefix, "run-a")
    save(a, 10)
    a.close()
    claim_prefix(store, prefix, "run-b", resume=True)
    if b_committed:
        b = manager(store, prefix, "run-b")
        save(b, 20)
        b.close()
    if not b_committed:
        assert claim_prefix(store, prefix, "run-a", resume=True)["owner"] == "run-a"
        return
    with pytest.raises(CheckpointError) as err:
        claim_prefix(store, prefix, "run-a", resume=True)
    message = str(err.value)
    assert "was taken over from this run ('run-a') by run 'run-b'" in message, message
    assert "its newest step, 20, is run 'run-b''s" in message and "(its newest, step 10)" in message, message
    assert "checkpoint.resume_from: run-a" in message and current_owner(store, prefix)["owner"] == "run-b"
    assert claim_prefix(store, prefix, "run-c", resume=True)["owner"] == "run-c"  # a new run continues b's


def test_a_takeover_that_could_not_continue_the_checkpoint_claims_nothing(prefix):
    """A new run whose config cannot continue the prefix's checkpoint took it over in the
    pre-flight, then failed in the train step, after data prep, leaving the prefix claimed."""
    store = LocalStore()
    claim_prefix(store, prefix, "run-a", resume=True)
    a = manager(store, prefix, "run-a")
    save(a, 10)
    a.close()
    seen = []

    def refuse(record):
        seen.append(record["step"])
        raise CheckpointError("train.batch_size differs")

    with pytest.raises(CheckpointError, match="batch_size differs"):
        claim_prefix(store, prefix, "run-b", resume=True, can_continue=refuse)
    assert seen == [10] and current_owner(store, prefix)["owner"] == "run-a"


def test_two_runs_racing_for_one_prefix_exactly_one_wins_and_the_other_names_it(prefix):
    store = LocalStore()
    start = threading.Barrier(8)
    outcome: dict[str, str] = {}

    def run(owner: str) -> None:
        start.wait()
        try:
            claim_prefix(store, prefix, owner, resume=False)
            outcome[owner] = "owner"
        except CheckpointError as exc:
            outcome[owner] = str(exc)

    threads = [threading.Thread(target=run, args=(f"run-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o, result in outcome.items() if result == "owner"]
    assert len(winners) == 1
    assert current_owner(store, prefix)["owner"] == winners[0]
    for o, result in outcome.items():
        if o != winners[0]:
            assert f"belongs to run {winners[0]!r}" in result


def test_two_writers_on_one_prefix_never_overwrite_or_prune_each_others_steps(prefix):
    """Interleaved saves: run-b takes over while run-a runs; each step is written once, by its owner."""
    store = LocalStore()
    a = manager(store, prefix, "run-a", keep_last=1)
    a.claim(resume=True)
    save(a, 1)
    save(a, 2)
    b = manager(store, prefix, "run-b", keep_last=1)
    b.claim(resume=True)
    with pytest.raises(CheckpointError, match="now belongs to run 'run-b'"):
        save(a, 3)
    save(b, 3)
    save(b, 4)
    assert b.committed_steps() == [2, 4]  # run-a's latest survives run-b's pruning (keep_last 1)
    assert_intact(store, prefix, "run-a", [2])
    assert_intact(store, prefix, "run-b", [4])


def test_a_committed_step_is_never_overwritten(prefix):
    store = LocalStore()
    a = manager(store, prefix, "run-a")
    a.claim(resume=True)
    save(a, 2)
    commit = store.get_bytes(join_uri(step_dir(prefix, 2), COMMIT))
    with pytest.raises(CheckpointError, match="step 2 is already committed .* never overwritten"):
        a.save(2, {"model": {"w": torch.zeros(4)}}, blocking=True)
    assert store.get_bytes(join_uri(step_dir(prefix, 2), COMMIT)) == commit
    assert_intact(store, prefix, "run-a", [2])


@pytest.mark.parametrize("lost", [".metadata", "__0_0.distcp"])
def test_a_damaged_step_of_the_run_s_own_is_written_again_when_training_comes_back_to_it(prefix, lost):
    """Was: a resume skipped the incomplete step, trained back to it and stopped there ("already
    committed ... never overwritten"), and --run-id could not get past it. Another run's damaged
    step stays refused: it is not this run's to delete."""
    store = LocalStore()
    a = manager(store, prefix, "run-a", keep_last=5)
    a.claim(resume=True)
    save(a, 1)
    save(a, 2)
    store.delete(join_uri(step_dir(prefix, 2), lost))
    assert complete_record(store, prefix, 2, objects_by_step(store, prefix)) is None
    save(a, 2)  # the run resumed at step 1 and came back to step 2
    assert_intact(store, prefix, "run-a", [1, 2])
    b = manager(store, prefix, "run-b", keep_last=5)
    b.claim(resume=True)
    store.delete(join_uri(step_dir(prefix, 2), lost))
    with pytest.raises(CheckpointError, match="step 2 is already committed .* never overwritten"):
        save(b, 2)
    assert_intact(store, prefix, "run-a", [1])


@pytest.mark.parametrize("record", [b'{"step": 2, "par', b"", b"[]"])
def test_a_step_whose_commit_record_cannot_be_read_is_refused_as_no_checkpoint_not_as_committed(prefix, record):
    """A commit record cut short (a full disk, a hand edit): resume skips the step, and training
    back at it is refused saying the record cannot be read (was: "already committed"), its
    parts left for whoever deletes the folder."""
    store = LocalStore()
    a = manager(store, prefix, "run-a", keep_last=5)
    a.claim(resume=True)
    save(a, 1)
    save(a, 2)
    store.put_bytes(join_uri(step_dir(prefix, 2), COMMIT), record)
    assert complete_record(store, prefix, 2, objects_by_step(store, prefix)) is None
    with pytest.raises(CheckpointError, match="step 2 has a commit record at .* that cannot be read, so it is no ch"):
        save(a, 2)
    assert store.get_bytes(join_uri(step_dir(prefix, 2), COMMIT)) == record
    assert_intact(store, prefix, "run-a", [1])


def test_a_complete_step_a_short_listing_hides_a_part_of_is_not_written_again(prefix):
    """A store may list short (a page lost, a slow index): each part is asked for itself before
    the step is taken for damaged and deleted."""

    class ShortListing(LocalStore):
        def list(self, uri):
            return [u for u in super().list(uri) if not u.endswith("/.metadata")]

    store = ShortListing()
    a = manager(store, prefix, "run-a", keep_last=5)
    a.claim(resume=True)
    save(a, 1)
    with pytest.raises(CheckpointError, match="step 1 is already committed .* never overwritten"):
        save(a, 1)
    assert_intact(LocalStore(), prefix, "run-a", [1])


def test_steps_written_before_owner_records_are_kept_by_pruning_and_refused_without_resume(prefix):
    store = LocalStore()
    legacy = manager(store, prefix, "")  # no owner, no claim: as checkpoints were written before
    save(legacy, 1)
    with pytest.raises(CheckpointError, match=r"holds committed steps \[1\] of an earlier run"):
        claim_prefix(store, prefix, "run-a", resume=False)
    a = manager(store, prefix, "run-a", keep_last=1)
    a.claim(resume=True)
    save(a, 2)
    save(a, 3)
    assert a.committed_steps() == [1, 3]


def assert_pruning_stays_in_its_folder(store, root: str) -> None:
    """Run A on `<root>/exp1` prunes its own steps only: not those of run B on `<root>/exp10` (a
    name that extends A's, with the same step numbers) nor a copy nested in `<root>/exp1/archive`.
    Called on a local folder here and on the S3 servers by tests/integration/test_checkpoint.py."""
    a_prefix, b_prefix, nested = join_uri(root, "exp1"), join_uri(root, "exp10"), join_uri(root, "exp1/archive")
    for other, owner in ((b_prefix, "run-b"), (nested, "run-b")):
        b = manager(store, other, owner, keep_last=0)
        b.claim(resume=False)
        for step in (1, 2, 3):
            save(b, step)
    a = manager(store, a_prefix, "run-a", keep_last=1)
    a.claim(resume=False)  # the neighbours' steps are not A's: no refusal
    for step in (1, 2, 3):
        save(a, step)
    assert a.committed_steps() == [3]
    assert_intact(store, a_prefix, "run-a", [3])
    for other in (b_prefix, nested):
        assert manager(store, other, "reader").committed_steps() == [1, 2, 3], other
        assert_intact(store, other, "run-b", [1, 2, 3])


def test_pruning_and_claims_stay_in_the_prefix_s_own_folder(tmp_path):
    assert_pruning_stays_in_its_folder(LocalStore(), str(tmp_path))


@pytest.mark.parametrize("kind", ["new", "same bytes (a retried attempt)", "other bytes"])
def test_create_only_writes_on_a_local_directory(tmp_path, kind):
    store, uri = LocalStore(), str(tmp_path / "x" / "owner.json")
    if kind != "new":
        assert store.put_bytes_if_absent(uri, b"first")
    data = b"other" if kind == "other bytes" else b"first"
    assert store.put_bytes_if_absent(uri, data) is (kind != "other bytes")
    assert store.get_bytes(uri) == b"first"
    assert store.list(str(tmp_path / "x")) == [uri]  # no temporary file left behind


def test_the_training_step_claims_the_prefix_for_its_task_before_the_job_starts(tmp_path):
    """The KFP path: the step's task identity owns `<model URI>/checkpoints`; a retry (the same
    identity) goes on, another task with resume: false is refused naming it."""
    from trainer.config import load_config
    from trainer.pipeline_steps import claim_checkpoints

    model_uri = str(tmp_path / "model")
    cfg = claim_checkpoints(load_config(None, {}), model_uri, owner="run-1/train")
    assert cfg.checkpoint.owner == "run-1/train"
    assert current_owner(LocalStore(), join_uri(model_uri, "checkpoints"))["owner"] == "run-1/train"
    claim_checkpoints(load_config(None, {}), model_uri, owner="run-1/train")  # a retried step
    other = load_config(None, {"checkpoint.resume": False})
    with pytest.raises(CheckpointError, match="belongs to run 'run-1/train'"):
        claim_checkpoints(other, model_uri, owner="run-2/train")


@pytest.mark.parametrize(
    "foreign",
    [
        "step-00000001/NOTES.txt",  # beside a pruned step's own objects
        "step-00000001/eval/results.json",  # in a folder below it
        "step-00000001/rank-1.pt",  # a name near a rank part's
        "step-00000002/weights.safetensors",  # a step folder a user made by hand, without a commit
    ],
)
def test_pruning_deletes_only_what_a_checkpoint_writer_wrote(prefix, foreign):
    """A pruned step's folder goes whole when the writer made all of it; anything a user put in
    the checkpoint prefix by hand stays, and so does the folder that holds it."""
    store = LocalStore()
    a = manager(store, prefix, "run-a", keep_last=1)
    a.claim(resume=False)
    save(a, 1)
    store.put_bytes(join_uri(prefix, foreign), b"the user's")
    for step in (3, 4):
        save(a, step)
    by_step = objects_by_step(store, prefix)
    assert sorted(by_step) == sorted({4, int(foreign[5:13])})
    assert by_step[int(foreign[5:13])] == [join_uri(prefix, foreign)]
    assert store.get_bytes(join_uri(prefix, foreign)) == b"the user's"
    assert_intact(store, prefix, "run-a", [4])


# Each reader of a prefix's steps as the run owning it reads them: its resume, the best step export
# takes, the newest step of one owner (the local pre-flight's and `kftrain runs`'); each a step or None.
OWNERS_READERS = {
    "resume (latest)": lambda store, prefix: (manager(store, prefix, "run-a").latest() or {}).get("step"),
    "export's best": lambda store, prefix: (
        CheckpointManager(store, prefix, owner="run-a", keep_best=("min", "val_loss")).best() or {}
    ).get("step"),
    "one owner's newest": lambda store, prefix: (latest_complete(store, prefix, owner="run-a") or (None,))[0],
}


def copied_in(tmp_path) -> tuple[LocalStore, str]:
    """Run-a's prefix (step 2), and run-b's step 9, committed in run-b's own prefix, copied into it."""
    import shutil

    store, a_prefix, b_prefix = LocalStore(), str(tmp_path / "a"), str(tmp_path / "b")
    for prefix, owner, step, loss in ((a_prefix, "run-a", 2, 0.5), (b_prefix, "run-b", 9, 0.1)):
        ckpt = manager(store, prefix, owner)
        ckpt.claim(resume=True)
        ckpt.save(step, {"model": weights(step, owner)}, record={"metrics": {"val_loss": loss}}, blocking=True)
    shutil.copytree(step_dir(b_prefix, 9), step_dir(a_prefix, 9))
    return store, a_prefix


@pytest.mark.parametrize("reader", list(OWNERS_READERS))
def test_a_step_copied_in_from_another_runs_prefix_is_not_the_owners(tmp_path, reader, caplog):
    """Run-b's step 9 copied by hand into run-a's prefix was resumed as run-a's own (the pre-flight
    had checked run-a's step 2) and could be exported as its best: two runs' training mixed in
    silence. The owner's readers skip it, saying so; a takeover's steps (a run that owned the
    prefix) still count."""
    store, prefix = copied_in(tmp_path)
    assert 9 in manager(store, prefix, "run-a").committed_steps()  # complete: only its committer tells it apart
    with caplog.at_level("WARNING", logger="kftrain.checkpoint"):
        assert OWNERS_READERS[reader](store, prefix) == 2
    assert "run 'run-b' committed it, and that run never owned" in caplog.text
    # Once run-b takes the prefix over, its steps there are the prefix's: a later one counts.
    c = manager(store, prefix, "run-b")
    c.claim(resume=True)
    c.save(10, {"model": weights(10, "run-b")}, record={"metrics": {"val_loss": 0.05}}, blocking=True)
    assert OWNERS_READERS[reader](store, prefix) == (2 if reader == "one owner's newest" else 10)


def test_a_prefix_holding_a_strangers_step_is_refused_before_a_run_starts_and_the_step_stays_readable(tmp_path):
    """The owner skipped the copied step, then failed on reaching its step number (a committed step
    is never overwritten), at every retry: its claim (a continuation's, a takeover's, a first one
    on a prefix whose owner records are gone) is refused naming the step. A run that only reads the
    prefix (checkpoint.resume_from) takes the step, as the refusal advises."""
    import shutil

    store, prefix = copied_in(tmp_path)
    said = r"holds committed steps of runs that never owned it: 9 \(run 'run-b'\) \(copied in"
    with pytest.raises(CheckpointError, match=said):
        manager(store, prefix, "run-a").claim(resume=True)  # run-a's own continuation
    with pytest.raises(CheckpointError, match=said):
        manager(store, prefix, "run-c").claim(resume=True)  # a takeover
    shutil.rmtree(str(tmp_path / "a" / "owner"))  # the owner records deleted: run-a's step is nobody's stranger
    with pytest.raises(CheckpointError, match=r"steps of runs that never owned it: 2 \(run 'run-a'\), 9"):
        manager(store, prefix, "run-c").claim(resume=True)
    with pytest.raises(CheckpointError, match=r"never owned it: 9 \(run 'run-b'\) \("):
        manager(store, prefix, "run-a").claim(resume=True)  # its own steps are its, run-b's are not
    # A reader (what resume_from resolves) takes any complete step: the copied one is whole.
    assert latest_complete(store, prefix)[0] == 9 and latest_complete(store, prefix, only=9)[1]["owner"] == "run-b"


def test_a_reader_of_a_prefix_takes_a_copied_in_step_only_when_it_names_it(tmp_path):
    """A run reading another's prefix (checkpoint.resume_from, export_best's lineage) got the copied
    step as that prefix's newest or best (review: another run's weights exported as the best).
    Named, it is taken, as the claim's refusal advises."""
    store, prefix = copied_in(tmp_path)
    reader = CheckpointManager(store, prefix, keep_best=("min", "val_loss"))
    assert reader.latest()["step"] == 2 and reader.latest(only=9)["step"] == 9
    assert reader.best()["step"] == 2  # run-b's 0.1 is the lowest, and not the prefix's
    assert reader.best(up_to=9)["step"] == 9  # a lineage that began at the copied step: that step
    assert reader.best(up_to=2)["step"] == 2


def test_resume_from_a_prefix_holding_a_copied_in_step_takes_the_prefixs_newest_and_the_step_only_named(tmp_path):
    from trainer.config import load_config
    from trainer.runs import resolve_resume_from

    store, prefix = copied_in(tmp_path)

    def resolved(value: str) -> str:
        return resolve_resume_from(load_config(overrides={"checkpoint.resume_from": value}), "")[0]

    assert resolved(prefix) == step_dir(prefix, 2)
    assert resolved(step_dir(prefix, 9)) == step_dir(prefix, 9)
