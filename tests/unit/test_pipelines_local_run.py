"""A local run's summary reads its own kfp.local run folder, never the newest one in the root."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from pipelines.local_run import (
    PipelineFailed,
    _task_output,
    check_owner,
    finished_run,
    kfp_run_folder,
    open_log,
    own_checkpoints_first,
    run_local,
    run_started,
)
from trainer.config import ConfigError, load_config


def kfp_run(root: Path, name: str, *, exported: bool, reason: str, mtime: float) -> Path:
    """A kfp.local run folder as it leaves one: per task, its executor_output.json."""
    folder = root / name
    (folder / "train" / "model").mkdir(parents=True)
    (folder / "evaluate").mkdir()
    (folder / "evaluate" / "executor_output.json").write_text(json.dumps({"parameterValues": {"reason": reason}}))
    if exported:
        (folder / "export").mkdir()
        out = {"artifacts": {"exported": {"artifacts": [{"uri": str(folder / "export" / "exported")}]}}}
        (folder / "export" / "executor_output.json").write_text(json.dumps(out))
    for path in folder.rglob("*"):
        os.utime(path, (mtime, mtime))
    return folder


@pytest.mark.parametrize(
    ("this", "newer_other"),
    [
        # This run failed the gate; an earlier one passed but its files look newer (or are).
        ({"exported": False, "reason": "0.97 is below the minimum 0.999"}, {"exported": True, "reason": "passed"}),
        # This run passed; another run that failed left the newest files.
        ({"exported": True, "reason": "passed"}, {"exported": False, "reason": "0.5 is below the minimum 0.9"}),
    ],
)
def test_the_summary_reads_this_runs_folder_not_the_newest(tmp_path, this, newer_other):
    mine = kfp_run(tmp_path, "training-pipeline-2026-12-01-10-00-00-000001", mtime=1_000, **this)
    kfp_run(tmp_path, "training-pipeline-2026-12-01-09-00-00-000001", mtime=2_000, **newer_other)
    folder = kfp_run_folder(tmp_path, ["s3://elsewhere/dataset", str(mine / "train" / "model")])
    assert folder == mine.resolve()
    assert _task_output(folder, "evaluate", "reason", parameter=True) == this["reason"]
    exported = _task_output(folder, "export", "exported")
    assert (exported is not None) is this["exported"]


def test_with_every_output_in_a_store_the_private_root_must_hold_one_run(tmp_path):
    only = kfp_run(tmp_path, "training-pipeline-1", exported=False, reason="r", mtime=1_000)
    assert kfp_run_folder(tmp_path, ["s3://bucket/x/model"]) == only.resolve()
    kfp_run(tmp_path, "training-pipeline-2", exported=False, reason="r", mtime=1_000)
    with pytest.raises(PipelineFailed, match="holds 2 run folders"):
        kfp_run_folder(tmp_path, ["s3://bucket/x/model"])


SUMMARY = {"artifacts": {"model": "/m"}, "metrics": {"test_accuracy": 0.97}, "exported": True, "quality_gate": "ok"}


def write_record(root: Path, run_id: str, record) -> Path:
    path = root / "runs" / run_id / "run.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    return path


@pytest.mark.parametrize(
    "record",
    [
        {"status": "finished"},
        {"status": "finished", "summary": 5},
        {"status": "finished", "summary": {"artifacts": {}}},
        {"status": "finished", "summary": {**SUMMARY, "metrics": {"test_accuracy": "high"}}},
        {"status": "finished", "summary": {**SUMMARY, "artifacts": {"model": 3}}},
        {"status": "finished", "summary": {**SUMMARY, "exported": "yes"}},
    ],
    ids=["no-summary", "a-number", "no-metrics", "a-metric-as-text", "an-artifact-not-a-uri", "exported-as-text"],
)
def test_a_finished_record_without_a_summary_is_named_as_damaged(tmp_path, record):
    from trainer.config import load_config
    from trainer.storage import CorruptObject

    path = write_record(tmp_path, "r1", record)
    with pytest.raises(CorruptObject, match=f"{path} says run r1 finished but holds no summary") as err:
        finished_run(load_config(), "r1", str(tmp_path))
    assert "delete it" in str(err.value)


@pytest.mark.parametrize(
    ("record", "expected"),
    [({"status": "finished", "summary": SUMMARY}, SUMMARY), ({"status": "running"}, None), ([1, 2], None)],
    ids=["finished", "not-finished", "not-a-record"],
)
def test_a_finished_run_gives_its_summary_and_others_none(tmp_path, record, expected):
    from trainer.config import load_config

    write_record(tmp_path, "r1", record)
    assert finished_run(load_config(), "r1", str(tmp_path)) == expected
    assert finished_run(load_config(), "never-ran", str(tmp_path)) is None


def fake_checkpoint(prefix: Path, step: int, complete: bool = True, owner: str | None = None) -> None:
    """A committed step whose one part has the size its record says (or not), of `owner` (None:
    a record naming none): what trainer.checkpoint_owner.latest_complete tests, without torch."""
    folder = prefix / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"x" * (4 if complete else 3))
    record = {"step": step, "parts": {".metadata": {"bytes": 4, "sha256": "0" * 64}}}
    (folder / "COMMIT.json").write_text(json.dumps(record | ({"owner": owner} if owner is not None else {})))


def test_a_run_s_newest_checkpoint_is_its_own_not_a_run_s_that_took_its_prefix_over(tmp_path):
    """`--run-id` on a prefix another run took over checked the config against, and named, that
    run's newer step (its fix, a longer train.epochs, then met the takeover refusal: a probe)."""
    from pipelines.local_run import newest_checkpoint
    from trainer.config import load_config

    prefix = tmp_path / "runs" / "r1" / "checkpoints"
    fake_checkpoint(prefix, 2, owner="r1")
    fake_checkpoint(prefix, 4, owner="r2")
    assert newest_checkpoint(load_config(), "r1", str(tmp_path)) == 2
    # A run with no step of its own there goes on from what it first resumed from.
    fake_checkpoint(tmp_path / "runs" / "r3" / "checkpoints", 6, owner="r2")
    cfg = load_config(overrides={"checkpoint.resume_from": "/gone/run/checkpoints"})
    assert own_checkpoints_first(cfg, "r3", str(tmp_path)).checkpoint.resume_from == "/gone/run/checkpoints"


@pytest.mark.parametrize(
    ("own", "kept"), [(None, True), (False, True), (True, False)], ids=["none", "incomplete", "complete"]
)
def test_resume_from_gives_way_to_a_complete_checkpoint_of_the_runs_own(tmp_path, own, kept):
    from trainer.config import load_config

    if own is not None:
        fake_checkpoint(tmp_path / "runs" / "r1" / "checkpoints", 5, complete=own)
    cfg = load_config(overrides={"checkpoint.resume_from": "/gone/run/checkpoints"})
    assert own_checkpoints_first(cfg, "r1", str(tmp_path)).checkpoint.resume_from == (
        cfg.checkpoint.resume_from if kept else ""
    )


def test_a_run_has_started_once_anything_is_in_its_folder(tmp_path):
    """`--run-id` of a run that left nothing under this root starts afresh, and says so: a run of
    another --output-dir or store is not found by its id here."""
    from trainer.config import load_config

    cfg = load_config()
    assert not run_started(cfg, "r1", str(tmp_path))  # no folder at all
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    assert not run_started(cfg, "r1", str(tmp_path))  # an empty one
    (tmp_path / "runs" / "r10" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "r10" / "log.txt").write_text("a neighbour whose name starts alike")
    assert not run_started(cfg, "r1", str(tmp_path))
    (tmp_path / "runs" / "r1" / "log-20261204-000000.txt").write_text("started")
    assert run_started(cfg, "r1", str(tmp_path))
    # Its checkpoints elsewhere (checkpoint.uri), its log lost with a SIGKILLed CLI: started too.
    elsewhere = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, uri=str(tmp_path / "ck")))
    assert not run_started(elsewhere, "r2", str(tmp_path))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".kftrain-owner.json").write_text("{}")
    assert run_started(elsewhere, "r2", str(tmp_path))


def test_a_store_failing_the_first_request_is_named_by_the_setting_that_chose_it(tmp_path, monkeypatch):
    """The run folder's store is --output-dir's (or store.uri's); a checkpoint prefix of its own
    is checkpoint.uri's (was: its failure blamed on --output-dir)."""
    import trainer.storage
    from trainer.config import load_config
    from trainer.storage import StoreError

    monkeypatch.setattr(trainer.storage, "CHECK_BUDGET_S", 1.0)  # the refused port fails each retry at once
    unreachable = {"store.endpoint": "http://127.0.0.1:9", "checkpoint.uri": "s3://kftrain-ck/r"}
    with pytest.raises(StoreError, match=r"^checkpoint\.uri: "):
        run_started(load_config(overrides=unreachable), "r1", str(tmp_path))
    # Checkpoints off: that store is never used, so it cannot fail the run.
    assert not run_started(load_config(overrides={**unreachable, "checkpoint.enabled": False}), "r1", str(tmp_path))
    with pytest.raises(StoreError, match=r"^store\.uri: "):
        run_started(load_config(overrides={**unreachable, "store.uri": "s3://kftrain-runs/x"}), "r1", str(tmp_path))


def test_a_run_id_whose_checkpoint_this_config_cannot_continue_is_refused_before_any_step(tmp_path):
    """`--run-id` with another model (or no --config at all): refused with the run's checkpoint
    and the field named, before data prep (was: in the train step, after every step before it)."""
    from pipelines.local_run import check_own_checkpoint, with_run_checkpoints
    from trainer.config import ConfigError, load_config, to_dict

    cfg = load_config()
    prefix = Path(with_run_checkpoints(cfg, "r1", str(tmp_path)).checkpoint.uri)
    fake_checkpoint(prefix, 5)
    check_own_checkpoint(cfg, "r1", str(tmp_path))  # written under the same config: continues
    commit = prefix / "step-00000005" / "COMMIT.json"
    saved = to_dict(load_config(overrides={"model.hidden_sizes": [8]}))
    commit.write_text(json.dumps({**json.loads(commit.read_text()), "config": saved, "world_size": 2}))
    with pytest.raises(ConfigError) as info:
        check_own_checkpoint(cfg, "r1", str(tmp_path))
    message = str(info.value)
    assert message.startswith(f"--run-id r1: its checkpoint of step 5 ({prefix}): cannot resume: "), message
    assert "model.hidden_sizes ([8], now [" in message and "start a new run (without --run-id)" in message
    named = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, uri=str(prefix)))
    check_own_checkpoint(named, "r1", str(tmp_path))  # a prefix the user named is not the run's own
    for field in ("enabled", "resume"):  # a config that would not read the checkpoint: a silent fresh start
        off = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, **{field: False}))
        with pytest.raises(
            ConfigError, match=rf"--run-id r1: checkpoint.{field} is false, so its checkpoint of step 5"
        ):
            check_own_checkpoint(off, "r1", str(tmp_path))


GATES = {"min_accuracy": 0.9, "max_perplexity": 0.0}
SAME_RUN_CASES = {
    "the same config and gates": ({}, GATES, None),
    "another max_steps": ({"train.max_steps": 4}, GATES, r"train\.max_steps 0 \(now 4\)"),
    "another task": ({"task": "causal_lm"}, GATES, r"task 'classification' \(now 'causal_lm'\)"),
    "another gate": ({}, {**GATES, "min_accuracy": 0.99}, r"--min-accuracy 0\.9 \(now 0\.99\)"),
    "another endpoint": (
        {"store.endpoint": "http://host:9000"},
        GATES,
        r"store\.endpoint '' \(now 'http://host:9000'\)",
    ),
}


@pytest.mark.parametrize(("overrides", "gates", "refused"), SAME_RUN_CASES.values(), ids=SAME_RUN_CASES.keys())
def test_a_finished_run_asked_for_with_other_settings_is_refused_naming_them(tmp_path, overrides, gates, refused):
    """Its summary stands for the settings it ran with (was: printed under any config or gate)."""
    from pipelines.local_run import record_finished
    from trainer.config import ConfigError, load_config

    ran = load_config()
    record_finished(ran, "r1", SUMMARY, str(tmp_path), given=ran, gates=GATES)
    now = load_config(overrides=overrides)
    if refused is None:
        assert finished_run(now, "r1", str(tmp_path), gates) == SUMMARY
        return
    with pytest.raises(ConfigError, match=r"--run-id r1: that run finished with other settings: " + refused) as info:
        finished_run(now, "r1", str(tmp_path), gates)
    assert "start a new run (without --run-id" in str(info.value)


def test_a_finished_record_from_before_the_settings_were_kept_still_gives_its_summary(tmp_path):
    from trainer.config import load_config

    write_record(tmp_path, "r1", {"status": "finished", "summary": SUMMARY})
    assert finished_run(load_config(overrides={"train.max_steps": 4}), "r1", str(tmp_path), GATES) == SUMMARY


def _with_uri(cfg, uri: str):
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, uri=uri))


# (where the first start put its checkpoints: "own" or "a"; recorded in started.json; checkpoint.uri
# now: "" (the run folder), "a" or "b"; whether a checkpoint is there; refused naming this prefix)
PREFIX_CASES = {
    "own prefix, now elsewhere": ("own", False, "b", True, "own"),
    "own prefix, recorded, now elsewhere": ("own", True, "b", True, "own"),
    "a chosen prefix, now unset": ("a", True, "", True, "a"),
    "a chosen prefix, now another": ("a", True, "b", True, "a"),
    "a chosen prefix, now the same": ("a", True, "a", True, None),
    "own prefix, now the same": ("own", True, "", True, None),
    "nothing committed yet, now elsewhere": ("a", True, "b", False, None),
}


@pytest.mark.parametrize(
    ("first", "recorded", "now", "committed", "named"), PREFIX_CASES.values(), ids=PREFIX_CASES.keys()
)
def test_a_run_id_whose_checkpoints_are_elsewhere_is_refused_not_trained_from_the_start(
    tmp_path, first, recorded, now, committed, named
):
    from pipelines.local_run import check_own_checkpoint, record_started, with_run_checkpoints
    from trainer.config import ConfigError, load_config

    prefixes = {"own": "", "": "", "a": str(tmp_path / "ck-a"), "b": str(tmp_path / "ck-b")}
    started = with_run_checkpoints(_with_uri(load_config(), prefixes[first]), "r1", str(tmp_path))
    if recorded:
        record_started(started, "r1", str(tmp_path))
    if committed:
        fake_checkpoint(Path(started.checkpoint.uri), 5)
    cfg = _with_uri(load_config(), prefixes[now])
    if named is None:
        check_own_checkpoint(cfg, "r1", str(tmp_path))
        return
    with pytest.raises(ConfigError) as info:
        check_own_checkpoint(cfg, "r1", str(tmp_path))
    assert str(info.value).startswith(f"--run-id r1: its checkpoint of step 5 is in {started.checkpoint.uri}, ")
    assert f"set checkpoint.uri: {started.checkpoint.uri} to continue it" in str(info.value)


def test_the_started_record_keeps_the_first_starts_prefix(tmp_path):
    from pipelines.local_run import STARTED_RECORD, record_started
    from trainer.config import load_config

    record_started(_with_uri(load_config(), "/first"), "r1", str(tmp_path))
    record_started(_with_uri(load_config(), "/second"), "r1", str(tmp_path))
    assert json.loads((tmp_path / "runs" / "r1" / STARTED_RECORD).read_text())["checkpoint_uri"] == "/first"


@pytest.mark.parametrize("how", ["moved", "copied"])
def test_a_moved_or_copied_run_folder_continues_from_the_checkpoints_it_holds(tmp_path, how):
    """The run folder's own prefix was recorded as an absolute path: a moved folder was told it
    had no checkpoint (then resumed from its own), a copied one was refused, and the fix it gave
    trained the copy into the original's folder."""
    import shutil

    from pipelines.local_run import check_own_checkpoint, record_started, run_checkpoints, with_run_checkpoints
    from trainer.config import load_config

    first, second = tmp_path / "p1", tmp_path / "p2"
    given = load_config()
    started = with_run_checkpoints(given, "r1", str(first))
    record_started(started, "r1", str(first), given)
    fake_checkpoint(Path(started.checkpoint.uri), 5)
    (shutil.move if how == "moved" else shutil.copytree)(first, second)
    assert run_checkpoints(given, "r1", str(second)) == str(second / "runs" / "r1" / "checkpoints")
    check_own_checkpoint(given, "r1", str(second))  # its own checkpoints, where they are now


def test_a_relative_checkpoint_uri_is_recorded_where_it_is(tmp_path, monkeypatch):
    """`checkpoint.uri: ck` from one folder, `--run-id` from another: the record said `ck`, which
    the later start read as its own folder's, and trained from step 0 beside the run's checkpoints.
    Recorded absolute, the later start is refused naming where they are."""
    from pipelines.local_run import STARTED_RECORD, check_own_checkpoint, record_started, with_run_checkpoints
    from trainer.config import ConfigError, load_config

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    started = with_run_checkpoints(_with_uri(load_config(), "ck"), "r1", str(tmp_path / "out"))
    record_started(started, "r1", str(tmp_path / "out"))
    record = json.loads((tmp_path / "out" / "runs" / "r1" / STARTED_RECORD).read_text())
    assert record["checkpoint_uri"] == str(tmp_path / "ck")
    fake_checkpoint(tmp_path / "ck", 5)
    monkeypatch.chdir(tmp_path / "sub")
    with pytest.raises(ConfigError, match=f"its checkpoint of step 5 is in {tmp_path / 'ck'}"):
        check_own_checkpoint(_with_uri(load_config(), "ck"), "r1", str(tmp_path / "out"))


# (where the first start put its checkpoints: "own" or "a"; recorded in started.json; steps
# committed there, the last one incomplete when marked False; the step a stop names)
NEWEST_CASES = {
    "nothing committed": ("own", True, [], None),
    "own prefix": ("own", True, [2, 4], 4),
    "own prefix, before the record": ("own", False, [2], 2),
    "a chosen prefix": ("a", True, [3, 6], 6),
    "the newest incomplete": ("own", True, [2, (4, False)], 2),
}


@pytest.mark.parametrize(("first", "recorded", "steps", "newest"), NEWEST_CASES.values(), ids=NEWEST_CASES.keys())
def test_a_stopped_run_names_the_checkpoint_its_resume_continues_from(tmp_path, first, recorded, steps, newest):
    """What `--run-id` continues from, read where the run's first start put its checkpoints
    (the CLI's last line after a stop names it)."""
    from pipelines.local_run import newest_checkpoint, record_started, with_run_checkpoints
    from trainer.config import load_config

    chosen = {"own": "", "a": str(tmp_path / "ck-a")}[first]
    started = with_run_checkpoints(_with_uri(load_config(), chosen), "r1", str(tmp_path))
    if recorded:
        record_started(started, "r1", str(tmp_path))
    for step in steps:
        step, complete = step if isinstance(step, tuple) else (step, True)
        fake_checkpoint(Path(started.checkpoint.uri), step, complete)
    assert newest_checkpoint(load_config(), "r1", str(tmp_path)) == newest


@pytest.mark.parametrize(
    ("owner", "run_id", "refused"),
    [
        ("", "b", False),
        ("b", "b", False),  # its own records' config, continued with --run-id b
        ("a", "b", True),  # run a's records' config in a new run: it would prune a's checkpoints as a
        ("20261205-192255-528cf1", "20261205-200000-000000", True),
    ],
)
def test_a_local_run_owns_its_checkpoints_as_its_run_id_only(owner, run_id, refused):
    """Was: a config copied from a run's model card (checkpoint.owner and .uri of that run) made a
    new run that run, which continued in its checkpoint folder and pruned its final checkpoint."""
    cfg = load_config(overrides={"checkpoint.owner": owner})
    if not refused:
        check_owner(cfg, run_id)
        return
    with pytest.raises(ConfigError, match=rf"checkpoint.owner: '{owner}' is not this run's id .*--run-id {owner}"):
        check_owner(cfg, run_id)


def test_the_owner_is_checked_before_anything_is_written(tmp_path):
    cfg = load_config(overrides={"checkpoint.owner": "a"})
    with pytest.raises(ConfigError, match="checkpoint.owner"):
        run_local(cfg, local_root=str(tmp_path / "out"), run_id="b")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("uri", "private"), [("s3://bucket/runs/r1/log-1.txt", True), ("runs/r1/log-1.txt", False)])
def test_a_stores_log_waits_in_the_temporary_folder_for_this_user_alone(tmp_path, uri, private):
    """The log holds the effective config (was: 0644 in the shared /tmp until uploaded)."""
    old = os.umask(0o022)
    try:
        with open_log(uri, tmp_path / "sub" / "x.log") as f:
            f.write("line\n")
    finally:
        os.umask(old)
    assert (tmp_path / "sub" / "x.log").stat().st_mode & 0o777 == (0o600 if private else 0o644)


def test_a_start_removes_the_run_locks_no_process_holds_and_keeps_the_held_ones(tmp_path, monkeypatch):
    """A SIGKILLed start's lock file stayed in /tmp for good, one per killed start (was: only a
    start of that same run took it over)."""
    import fcntl

    from pipelines import local_run

    monkeypatch.setattr(local_run, "LOCK_FOLDER", str(tmp_path))
    for name in ("kftrain-run-stale.lock", "kftrain-run-held.lock", "not-a-lock.lock"):
        (tmp_path / name).write_text("process 1, started 04:00:00")
    holder = os.open(tmp_path / "kftrain-run-held.lock", os.O_RDWR)  # a running start's: locked by its open file
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        with local_run.running_alone(str(tmp_path / "out" / "runs" / "r"), "r"):
            during = {p.name for p in tmp_path.glob("*.lock")}
    finally:
        os.close(holder)
    assert "kftrain-run-stale.lock" not in during and {"kftrain-run-held.lock", "not-a-lock.lock"} < during
    assert len(during) == 3  # and this start's own, removed as it ends
    assert {p.name for p in tmp_path.glob("*.lock")} == {"kftrain-run-held.lock", "not-a-lock.lock"}


def test_a_lock_held_for_a_moment_by_another_start_s_sweep_does_not_refuse_the_run(tmp_path, monkeypatch):
    """Another start sweeping the unheld locks holds each for a moment: a start that meets it
    then waits for it (was: refused as "running already", naming a dead process)."""
    import fcntl
    import threading

    from pipelines import local_run

    monkeypatch.setattr(local_run, "LOCK_FOLDER", str(tmp_path))
    monkeypatch.setattr(local_run, "_remove_unheld_locks", lambda folder: None)  # only the other start sweeps
    root = str(tmp_path / "out" / "runs" / "r")
    with local_run.running_alone(root, "r"):
        (path,) = tmp_path.glob("kftrain-run-*.lock")
    path.write_text("process 999, started 01:02:03")  # as a SIGKILLed start leaves it
    sweeper = os.open(path, os.O_RDWR)
    fcntl.flock(sweeper, fcntl.LOCK_EX | fcntl.LOCK_NB)
    threading.Timer(0.3, os.close, (sweeper,)).start()
    with local_run.running_alone(root, "r"):
        pass


@pytest.mark.parametrize("planted", ["link", "dangling-link", "hard-link", "folder"])
def test_a_run_lock_path_another_user_planted_is_refused_and_nothing_is_written_through_it(
    tmp_path, monkeypatch, planted
):
    """/tmp is everyone's and a lock's name can be foreseen from the output folder (was: a link
    there made the start truncate and write the file it pointed at, root's included)."""
    from pipelines import local_run

    monkeypatch.setattr(local_run, "LOCK_FOLDER", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = str(tmp_path / "out" / "runs" / "r")
    with local_run.running_alone(root, "r"):
        (lock,) = (tmp_path / "tmp").glob("kftrain-run-*.lock")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    if planted == "link":
        lock.symlink_to(victim)
    elif planted == "dangling-link":
        lock.symlink_to(tmp_path / "made-through-the-link")
    elif planted == "hard-link":
        os.link(victim, lock)
    else:
        lock.mkdir()
    if planted == "hard-link":  # the sweep of unheld locks removes that name (not the file): a lock of its own
        with local_run.running_alone(root, "r"):
            assert victim.stat().st_nlink == 1
    else:
        refused = r"--run-id r: the run's lock .* is not a plain file of its own \(a link or a folder"
        with pytest.raises(ConfigError, match=refused), local_run.running_alone(root, "r"):
            pass
    assert victim.read_text() == "precious" and not (tmp_path / "made-through-the-link").exists()


def test_a_refusal_names_no_gone_process_as_the_lock_s_holder():
    """A start that could only open the lock read-only (another user's file) cannot write itself
    into it: the file still names the start that wrote it (was: named as the holder, long gone)."""
    from pipelines.local_run import _lock_holder

    gone = next(pid for pid in range(4_194_000, 1, -1) if not Path(f"/proc/{pid}").exists())
    assert _lock_holder(f"process {gone}, started 05:12:51") == "another start, maybe another user's"
    assert _lock_holder(f"process {os.getpid()}, started 05:12:51") == f"process {os.getpid()}, started 05:12:51"
    assert _lock_holder("") == "another process"


def test_a_lock_file_removed_just_after_it_was_opened_is_opened_again_not_refused(tmp_path, monkeypatch):
    """A holder leaving (or another start's sweep) removes the file between this start's open and
    its checks: it has no link left, and the start makes another (was: refused as "not a plain
    file of its own")."""
    from pipelines import local_run

    monkeypatch.setattr(local_run, "LOCK_FOLDER", str(tmp_path))
    real_open, removed = os.open, []

    def open_then_removed(path, flags, *args):
        fd = real_open(path, flags, *args)
        if os.path.basename(str(path)).startswith(local_run.LOCK_STEM) and not removed:
            os.unlink(path)
            removed.append(path)
        return fd

    monkeypatch.setattr(local_run.os, "open", open_then_removed)
    with local_run.running_alone(str(tmp_path / "out" / "runs" / "r"), "r"):
        assert removed and os.path.exists(removed[0])  # a new file at the same path, locked


def test_a_stop_signal_once_the_steps_have_ended_cuts_what_the_store_is_still_asked(capfd):
    """Ctrl-C while a finished or failed run uploads its log: the uploads give up within
    STOPPED_STORE_BUDGET_S (was: the note alone, and a hung store's timeouts and retries, minutes)."""
    import signal
    import threading

    from pipelines.local_run import STOPPED_STORE_BUDGET_S, nothing_left_to_stop
    from trainer import storage

    left = []

    def in_a_thread_of_its_own():  # the deadline is per thread: this test's own stays unset
        left.append(storage._time_left())
        nothing_left_to_stop(signal.SIGINT)
        left.append(storage._time_left())

    thread = threading.Thread(target=in_a_thread_of_its_own)
    thread.start()
    thread.join()
    assert left[0] is None and 0 < left[1] <= STOPPED_STORE_BUDGET_S, left
    assert "SIGINT once the run's steps have ended: nothing left to stop" in capfd.readouterr().err
