"""Resume across runs (`checkpoint.resume_from`, trainer/runs.py) and `kftrain runs`, in one process:
a run cut short is continued by a new run, bitwise equal to an uninterrupted one; what names
nothing resumable, or an incompatible config, is one clear line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pipelines.cli import main as cli
from trainer.checkpoint import COMMIT, CheckpointError, CheckpointManager
from trainer.checks import check_resume_from
from trainer.config import ConfigError, load_config
from trainer.distributed import DistEnv
from trainer.runs import list_runs, resolve_resume_from
from trainer.storage import LocalStore, join_uri
from trainer.train import run_training

pytestmark = pytest.mark.timeout(240)

STEPS_PER_EPOCH = 19  # digits: 1,259 train rows // global batch 64
CUT_AT = 25  # mid epoch 1, on a checkpoint (every 5 steps)


def config(root, ckpt: str, **overrides):
    return load_config(
        overrides={
            "job.replicas": 1,
            "model.dropout": 0.1,  # the RNG stream a resume must carry over
            "train.epochs": 2,
            "train.deterministic": True,
            "train.log_interval_steps": 1000,
            "store.uri": str(root),
            "checkpoint.uri": ckpt,
            "checkpoint.interval_steps": 5,
            "checkpoint.keep_last": 5,
            **overrides,
        }
    )


def weights(model_uri) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(LocalStore().get_bytes(join_uri(str(model_uri), "model.safetensors")))


def record(model_uri) -> dict:
    return json.loads(LocalStore().get_bytes(join_uri(str(model_uri), "training.json")))


@pytest.fixture(scope="module")
def runs(digits, tmp_path_factory):
    """A store root with an uninterrupted reference run and an `old` run cut at step 25 (local
    layout, `runs/old/checkpoints`), both in the local run layout."""
    root = tmp_path_factory.mktemp("store")
    ref = root / "kfprun" / "train-1" / "model"  # a KFP task's folder: its checkpoints beside the model
    run_training(config(root, ""), digits, str(ref), DistEnv())
    old_ckpt = str(root / "runs" / "old" / "checkpoints")
    run_training(config(root, old_ckpt, **{"train.max_steps": CUT_AT}), digits, str(root / "old-model"), DistEnv())
    return root, ref, old_ckpt


@pytest.mark.parametrize("how", ["run id", "checkpoint prefix", "step folder", "model URI"])
def test_a_new_run_continues_a_cut_run_bitwise_equal_to_an_uninterrupted_one(runs, digits, tmp_path, how):
    root, ref, old_ckpt = runs
    value = {
        "run id": "old",
        "checkpoint prefix": old_ckpt,
        "step folder": join_uri(old_ckpt, f"step-{CUT_AT:08d}"),
        "model URI": str(tmp_path / "model-of-old"),
    }[how]
    if how == "model URI":  # a model whose checkpoints are at <model>/checkpoints
        shutil.copytree(old_ckpt, tmp_path / "model-of-old" / "checkpoints")
    before = sorted(p.relative_to(old_ckpt) for p in (root / "runs" / "old").rglob("*"))
    new_ckpt = str(tmp_path / "new-ckpt")
    cfg = check_resume_from(config(root, new_ckpt, **{"checkpoint.resume_from": value}), str(root))
    assert cfg.checkpoint.resume_from.endswith(f"step-{CUT_AT:08d}")  # pinned to the checkpoint
    metrics = run_training(cfg, digits, str(tmp_path / "new"), DistEnv())

    assert metrics["resumed_from_step"] == CUT_AT and metrics["steps"] == 2 * STEPS_PER_EPOCH
    ref_w, got_w = weights(ref), weights(tmp_path / "new")
    assert ref_w.keys() == got_w.keys()
    for name in ref_w:
        assert torch.equal(ref_w[name], got_w[name]), name  # bitwise
    assert record(tmp_path / "new")["history"] == record(ref)["history"]
    # The old run is only read; the new one wrote under its own prefix, as its own owner.
    assert sorted(p.relative_to(old_ckpt) for p in (root / "runs" / "old").rglob("*")) == before
    assert CheckpointManager(LocalStore(), new_ckpt).committed_steps()[-1] == 2 * STEPS_PER_EPOCH


def test_its_own_checkpoints_come_before_resume_from(runs, digits, tmp_path):
    """A restarted new run goes on from where it got, not from the old run again."""
    root, _, old_ckpt = runs
    new_ckpt = str(tmp_path / "new-ckpt")
    new = {"checkpoint.resume_from": "old", "checkpoint.owner": "new"}
    run_training(config(root, new_ckpt, **new, **{"train.max_steps": 30}), digits, str(tmp_path / "m1"), DistEnv())
    again = run_training(config(root, new_ckpt, **new), digits, str(tmp_path / "m2"), DistEnv())
    assert again["resumed_from_step"] == 30


def test_an_incompatible_config_is_refused_naming_the_field(runs, digits, tmp_path):
    root, _, old_ckpt = runs
    cfg = config(root, str(tmp_path / "new"), **{"checkpoint.resume_from": "old", "model.hidden_sizes": [32]})
    with pytest.raises(ConfigError, match=r"resume_from 'old'.*model\.hidden_sizes \(\[128, 64\], now \[32\]\)"):
        check_resume_from(cfg, str(root))  # the pre-flight, before any step
    with pytest.raises(CheckpointError, match=r"resume_from 'old'.*model\.hidden_sizes.*without resume_from$"):
        run_training(cfg, digits, str(tmp_path / "m"), DistEnv())  # and the trainer itself
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("value", "root", "error"),
    [
        ("nosuchrun", "ROOT", r"'nosuchrun': no committed checkpoint for run nosuchrun under .*kftrain runs --store"),
        ("old", "", r"'old': a run id is looked up under store.uri, which is empty"),
        ("EMPTY", "ROOT", r"no committed checkpoint at or under .*empty"),
        # Also what a run still training pruned after the pre-flight pinned it (was: "not complete").
        ("OLD/step-00000003", "ROOT", r"step 3 of .*checkpoints has no commit record \(never written, or deleted"),
        ("OLD/step-LAST", "ROOT", r"step \d+ of .*lost is not complete \(a commit record whose parts"),
        ("kfprun/nosuchtask", "ROOT", r"no committed checkpoint for run kfprun/nosuchtask"),
        ("TWO", "ROOT", r"2 checkpoint prefixes at or under .*name one: RUN/TASK, or its checkpoint URI"),
        # A run id names that run's own prefix in one layout, never another run's or a folder's:
        ("runs", "ROOT", r"no committed checkpoint for run runs under"),  # the local runs' folder
        ("old/nosuchtask", "ROOT", r"no committed checkpoint for run old/nosuchtask"),  # a local run has no task
        ("kfprun/model", "ROOT", r"no committed checkpoint for run kfprun/model"),  # a folder, not a task
        ("old-model", "ROOT", r"no committed checkpoint for run old-model"),  # a model folder, not a run
    ],
    ids=[
        "unknown-run",
        "run-id-without-store",
        "uri-without-checkpoint",
        "uncommitted-step",
        "step-with-a-part-lost",
        "unknown-task",
        "ambiguous",
        "the-runs-folder",
        "a-task-of-a-local-run",
        "a-folder-of-a-kfp-run",
        "a-model-folder",
    ],
)
def test_what_names_nothing_resumable_is_one_line(runs, tmp_path, value, root, error):
    store_root, _, old_ckpt = runs
    (tmp_path / "empty").mkdir()
    two = tmp_path / "two"
    for name in ("a", "b"):
        shutil.copytree(old_ckpt, two / name / "checkpoints")
    if "step-LAST" in value:  # its newest step, with a part lost
        lost = tmp_path / "lost"
        shutil.copytree(old_ckpt, lost)
        last = sorted(p.name for p in lost.glob("step-*"))[-1]
        (lost / last / ".metadata").unlink()
        value = f"{lost}/{last}"
    value = value.replace("OLD", old_ckpt).replace("EMPTY", str(tmp_path / "empty")).replace("TWO", str(two))
    cfg = config(store_root, "", **{"checkpoint.resume_from": value})
    with pytest.raises(ConfigError, match=error) as err:
        resolve_resume_from(cfg, root.replace("ROOT", str(store_root)))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["two words", "a/b/c", "http://host/x"])
def test_a_resume_from_that_is_neither_a_run_id_nor_a_uri_is_a_config_error(value):
    with pytest.raises(ConfigError, match="checkpoint.resume_from"):
        load_config(overrides={"checkpoint.resume_from": value})


@pytest.mark.parametrize(
    "record", ["as written", "its job folder", "damaged", "none", "checkpoints elsewhere are gone", "two models"]
)
def test_a_model_whose_checkpoints_went_elsewhere_resumes_from_where_its_training_record_puts_them(
    runs, tmp_path, record
):
    """A local run's model (`.../train/model`, the URI `kftrain run --local` prints) has no
    checkpoints beside it: they are under its run's folder. Was: "no committed checkpoint at or
    under" the model; its training record says where they are."""
    root, _, old_ckpt = runs
    model = tmp_path / "model"
    shutil.copytree(root / "old-model", model)
    if record == "damaged":
        (model / "training.json").write_text("{not json")
    elif record == "none":
        (model / "training.json").unlink()
    elif record == "two models":  # which of them: nothing to follow
        shutil.copytree(root / "old-model", model / "again")
    elif record == "checkpoints elsewhere are gone":
        moved = json.loads((model / "training.json").read_text())
        moved["config"]["checkpoint"]["uri"] = str(tmp_path / "gone")
        (model / "training.json").write_text(json.dumps(moved))
    given = tmp_path if record == "its job folder" else model
    cfg = config(root, "", **{"checkpoint.resume_from": str(given)})
    if record in ("as written", "its job folder"):
        folder, chosen = resolve_resume_from(cfg, "")
        assert folder == join_uri(old_ckpt, f"step-{CUT_AT:08d}") and chosen["step"] == CUT_AT
    else:  # the folder as it is: nothing to resume there
        with pytest.raises(ConfigError, match=rf"no committed checkpoint at or under {given}; name a run"):
            resolve_resume_from(cfg, "")


def test_a_checkpoint_missing_a_part_is_not_resumed(runs, tmp_path):
    _, _, old_ckpt = runs
    broken = tmp_path / "broken"
    shutil.copytree(old_ckpt, broken)
    steps = sorted(p.name for p in broken.glob("step-*"))
    (broken / steps[-1] / ".metadata").unlink()  # the newest is incomplete: the one before is chosen
    folder, chosen = resolve_resume_from(config(tmp_path, "", **{"checkpoint.resume_from": str(broken)}), "")
    assert folder == str(broken / steps[-2]) and chosen["step"] == int(steps[-2][5:])


def test_runs_lists_each_runs_state_step_and_latest_checkpoint(runs, tmp_path, capsys, monkeypatch):
    root, ref, old_ckpt = runs
    (root / "runs" / "done").mkdir(exist_ok=True)  # a local run that finished, with no checkpoint left
    (root / "runs" / "done" / "run.json").write_text(json.dumps({"status": "finished"}))
    (root / "runs" / "fresh").mkdir(exist_ok=True)  # a local run that started: only its log
    (root / "runs" / "fresh" / "log-20261201-000000.txt").write_text("...")
    found = {r.name: r for r in list_runs(LocalStore(), str(root))}
    assert {n: (r.state, r.last_step) for n, r in found.items()} == {
        "done": ("finished", None),
        "fresh": ("started", None),
        "kfprun/train-1": ("finished", 2 * STEPS_PER_EPOCH),
        "old": ("partial", CUT_AT),
    }
    assert found["old"].checkpoint == join_uri(old_ckpt, f"step-{CUT_AT:08d}")
    commit = json.loads((root / "runs" / "old" / "checkpoints" / f"step-{CUT_AT:08d}" / COMMIT).read_text())
    assert found["old"].committed_unix_time == commit["committed_unix_time"]
    assert found["kfprun/train-1"].checkpoint == join_uri(str(ref), "checkpoints", f"step-{2 * STEPS_PER_EPOCH:08d}")

    assert cli(["runs", "--store", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "STATE", "STEP", "COMMITTED", "(UTC)", "LATEST", "CHECKPOINT"]
    old_line = next(line for line in lines if line.startswith("old "))
    assert old_line.split()[:3] == ["old", "partial", str(CUT_AT)] and old_line.endswith(found["old"].checkpoint)
    assert cli(["runs", "--store", str(root), "--json"]) == 0
    listed = {r["run"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["old"]["state"] == "partial" and listed["old"]["checkpoint"] == found["old"].checkpoint
    # A relative --store lists absolute checkpoints: what checkpoint.resume_from takes as written.
    monkeypatch.chdir(root.parent)
    assert cli(["runs", "--store", root.name, "--json"]) == 0
    assert {r["run"]: r for r in json.loads(capsys.readouterr().out)}["old"]["checkpoint"] == found["old"].checkpoint


def test_a_run_with_its_own_checkpoint_uri_is_listed_with_its_checkpoints_there(runs, tmp_path):
    """A local run whose `checkpoint.uri` is elsewhere (its started.json says where) shows its
    checkpoints (was: `started`, no step, no checkpoint); one stopped in its pre-flight, with only
    its started.json, is `started` (was: not listed, though `--run-id` continues it)."""
    _, _, old_ckpt = runs
    root, elsewhere = tmp_path / "store", tmp_path / "elsewhere" / "ck"
    shutil.copytree(old_ckpt, elsewhere)
    for run_id, prefix in (("moved", elsewhere), ("born", tmp_path / "nothing-yet"), ("odd", "s3://")):
        (root / "runs" / run_id).mkdir(parents=True)
        (root / "runs" / run_id / "started.json").write_text(json.dumps({"checkpoint_uri": str(prefix)}))
    (root / "runs" / "damaged").mkdir()
    (root / "runs" / "damaged" / "started.json").write_text("[not a record")
    found = {r.name: r for r in list_runs(LocalStore(), str(root))}
    assert {n: (r.state, r.last_step) for n, r in found.items()} == {
        "moved": ("partial", CUT_AT),
        "born": ("started", None),
        "odd": ("started", None),  # a record it cannot use: the run as its folder shows it
        "damaged": ("started", None),
    }
    assert found["moved"].checkpoint == join_uri(str(elsewhere), f"step-{CUT_AT:08d}")


def test_a_run_whose_prefix_another_run_took_over_keeps_its_own_steps(runs, tmp_path):
    """Run `b` committed steps up to 25 at its own prefix; run `d` (`checkpoint.uri` set to that
    prefix) took it over and committed step 30. `kftrain runs` and `resume_from` gave `b` the
    step 30 of `d`, so a run resuming from `b` loaded `d`'s weights; `resume_from d` was refused
    while `kftrain runs` listed `d` with its checkpoint."""
    from trainer.checkpoint_owner import claim_prefix

    _, _, old_ckpt = runs
    root = tmp_path / "store"
    prefix = root / "runs" / "b" / "checkpoints"
    shutil.copytree(old_ckpt, prefix, ignore=shutil.ignore_patterns("owner"))

    def commit_as(folder, owner):
        record = json.loads((folder / COMMIT).read_text())
        (folder / COMMIT).write_text(json.dumps({**record, "owner": owner, "step": int(folder.name[5:])}))

    for folder in prefix.glob("step-*"):
        commit_as(folder, "b")
    store = LocalStore()
    claim_prefix(store, str(prefix), "b", resume=True)
    claim_prefix(store, str(prefix), "d", resume=True)  # the takeover: `b` has ended
    shutil.copytree(prefix / f"step-{CUT_AT:08d}", prefix / "step-00000030")
    commit_as(prefix / "step-00000030", "d")
    (root / "runs" / "d").mkdir()
    (root / "runs" / "d" / "started.json").write_text(json.dumps({"checkpoint_uri": str(prefix)}))

    found = {r.name: (r.last_step, r.checkpoint) for r in list_runs(store, str(root))}
    assert found == {
        "b": (CUT_AT, join_uri(str(prefix), f"step-{CUT_AT:08d}")),
        "d": (30, join_uri(str(prefix), "step-00000030")),
    }
    for run, step in (("b", CUT_AT), ("d", 30)):
        folder, record = resolve_resume_from(config(root, "", **{"checkpoint.resume_from": run}), str(root))
        assert (folder, record["step"], record["owner"]) == (join_uri(str(prefix), f"step-{step:08d}"), step, run)
    # A place, not a run: its newest checkpoint, whoever wrote it.
    folder, _ = resolve_resume_from(config(root, "", **{"checkpoint.resume_from": str(prefix)}), "")
    assert folder == join_uri(str(prefix), "step-00000030")
    # Run `e` took the prefix over and committed nothing (was: "no checkpoint ... is complete"); the
    # message says whose the newest is, not who continued from whom (was: "d, which continued from
    # it", d being the earlier run; and a doubled quote, 'd''s).
    claim_prefix(store, str(prefix), "e", resume=True)
    (root / "runs" / "e").mkdir()
    (root / "runs" / "e" / "started.json").write_text(json.dumps({"checkpoint_uri": str(prefix)}))
    with pytest.raises(ConfigError) as refused:
        resolve_resume_from(config(root, "", **{"checkpoint.resume_from": "e"}), str(root))
    assert "run e committed no checkpoint of its own at" in str(refused.value)
    assert "step 30, was committed by run d, which shares the prefix with it); name that run" in str(refused.value)


def test_a_parent_of_stores_lists_no_runs_and_names_the_stores(runs, tmp_path, capsys):
    """Two stores in one folder: their `runs/` folder and their KFP runs' task folders are not runs
    of the parent (was: `exp/runs` listed as a run's task, and finished runs as partial)."""
    root, _, _ = runs
    for name in ("exp", "x"):
        shutil.copytree(root, tmp_path / "parent" / name, ignore=shutil.ignore_patterns("old-model"))
    (tmp_path / "parent" / "notes" / "a" / "b").mkdir(parents=True)
    (tmp_path / "parent" / "notes" / "a" / "b" / "c.txt").write_text("no run")
    assert list_runs(LocalStore(), str(tmp_path / "parent")) == []
    assert cli(["runs", "--store", str(tmp_path / "parent")]) == 0
    out = capsys.readouterr().out.strip()
    assert out == (
        f"no runs under {tmp_path / 'parent'}; it holds stores with runs: pass one as --store: "
        f"{tmp_path / 'parent' / 'exp'}, {tmp_path / 'parent' / 'x'}"
    )
    assert {"old", "kfprun/train-1"} <= {r.name for r in list_runs(LocalStore(), str(tmp_path / "parent" / "exp"))}
    # One level too deep, in the store's own runs/ folder: the hint names the store.
    assert cli(["runs", "--store", str(tmp_path / "parent" / "exp" / "runs")]) == 0
    assert capsys.readouterr().out.strip().endswith(f"holds runs/: pass --store {tmp_path / 'parent' / 'exp'}")


def test_a_parent_names_only_the_stores_whose_runs_kftrain_runs_lists(tmp_path, capsys):
    """A folder of someone's models (`proj/exp1/bert/model/weights.bin`) has a run's shape and
    no run's records: was named as a store with runs, whose `kftrain runs` then said none."""
    parent = tmp_path / "par"
    (parent / "proj" / "exp1" / "bert" / "model").mkdir(parents=True)
    (parent / "proj" / "exp1" / "bert" / "model" / "weights.bin").write_text("w")
    (parent / "real" / "runs" / "r1").mkdir(parents=True)
    (parent / "real" / "runs" / "r1" / "log-1.txt").write_text("")
    assert cli(["runs", "--store", str(parent)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"no runs under {parent}; it holds stores with runs: pass one as --store: {parent / 'real'}"
    )
    assert [r.name for r in list_runs(LocalStore(), str(parent / "real"))] == ["r1"]


@pytest.mark.parametrize(("stores", "more"), [(1, ""), (5, ""), (6, ", and 1 more"), (9, ", and 4 more")])
def test_the_stores_a_parent_holds_are_named_up_to_five_then_counted(tmp_path, capsys, stores, more):
    """The hint names at most five stores, and says how many it leaves out (was: silently five)."""
    parent = tmp_path / "parent"
    for i in range(stores):  # a store with one local run's log: enough to be listed
        (parent / f"s{i}" / "runs" / "r1").mkdir(parents=True)
        (parent / f"s{i}" / "runs" / "r1" / "log-1.txt").write_text("")
    assert cli(["runs", "--store", str(parent)]) == 0
    named = ", ".join(str(parent / f"s{i}") for i in range(min(stores, 5)))
    assert capsys.readouterr().out.strip() == (
        f"no runs under {parent}; it holds stores with runs: pass one as --store: {named}{more}"
    )


def test_runs_lists_complete_checkpoints_only_and_shows_what_a_record_holds_safely(runs, tmp_path, capsys):
    """The latest checkpoint `kftrain runs` shows is one `resume_from` can load; a foreign or
    damaged commit time or a run name with control characters does not break the listing."""
    _, _, old_ckpt = runs
    steps = sorted(p.name for p in Path(old_ckpt).glob("step-*"))
    for name, when in (("\x1b[31mred", 1e300), ("nan", float("nan")), ("text", "yesterday"), ("past", -1e18)):
        ckpt = tmp_path / "runs" / name / "checkpoints"
        shutil.copytree(old_ckpt, ckpt)
        (ckpt / steps[-1] / ".metadata").unlink()  # the newest is incomplete: the one before is the latest
        commit = ckpt / steps[-2] / COMMIT
        commit.write_text(json.dumps({**json.loads(commit.read_text()), "committed_unix_time": when}))
    found = {r.run_id: r for r in list_runs(LocalStore(), str(tmp_path))}
    for name, info in found.items():
        assert info.checkpoint == str(tmp_path / "runs" / name / "checkpoints" / steps[-2]), name
        assert info.state == "partial" and info.last_step == int(steps[-2][5:]) and info.committed_unix_time is None
    assert cli(["runs", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31mred" in out
    assert cli(["runs", "--store", str(tmp_path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"finished"'], ids=["not-json", "a-list", "a-string"])
@pytest.mark.parametrize("layout", ["local", "kfp"])
def test_a_damaged_run_record_is_said_and_the_run_shown_by_its_checkpoints(runs, tmp_path, capsys, content, layout):
    """A run record that is no JSON object (run.json of a local run, training.json of a KFP task)
    is named in a warning, and the run listed as its checkpoints show it (was: silently partial)."""
    _, _, old_ckpt = runs
    if layout == "local":
        folder, name = tmp_path / "runs" / "r1", "r1"
        shutil.copytree(old_ckpt, folder / "checkpoints")
        (folder / "run.json").write_text(content)
    else:
        folder, name = tmp_path / "kfp1" / "train-7" / "model", "kfp1/train-7"
        shutil.copytree(old_ckpt, folder / "checkpoints")
        (folder / "training.json").write_text(content)
    assert cli(["runs", "--store", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].split()[:3] == [name, "partial", str(CUT_AT)]
    warning = captured.err.strip()
    assert warning.startswith("kftrain: warning: ") and "\n" not in warning, warning
    assert f"run {name} is shown as its checkpoints show it" in warning and str(folder) in warning, warning


S = "s3://b/runs/{}/checkpoints/step-{:08d}".format


@pytest.mark.parametrize(
    ("record", "began", "chain"),
    [
        ({}, [], []),
        ({}, [S("a", 5)], [S("a", 5)]),
        ({"resumed_from": S("a", 5)}, [], [S("a", 5)]),  # a record of kftrain before `lineage`
        ({"resumed_from": S("b", 9), "lineage": [S("b", 9), S("a", 5)]}, [], [S("b", 9), S("a", 5)]),
        (
            {"resumed_from": S("b", 9), "lineage": [S("b", 9), S("a", 5)]},
            [S("c", 12)],
            [S("c", 12), S("b", 9), S("a", 5)],
        ),
        # Back to this run's own checkpoints, or to a run met already: the newest entry of each counts.
        ({"lineage": [S("me", 4), S("a", 5)]}, [], [S("a", 5)]),
        ({"lineage": [S("a", 7), S("b", 3), S("a", 2)]}, [], [S("a", 7), S("b", 3)]),
        # A damaged record: what names no step folder is left out.
        ({"lineage": [None, 3, "s3://b/x", S("a", 5)]}, [], [S("a", 5)]),
        ({"lineage": "s3://b/x", "resumed_from": S("a", 5)}, [], [S("a", 5)]),
        ({"lineage": [S(f"r{i}", 1) for i in range(40)]}, [], [S(f"r{i}", 1) for i in range(32)]),
    ],
    ids=[
        "none",
        "begins",
        "old-record",
        "recorded",
        "begins-again",
        "own",
        "met-again",
        "damaged",
        "not-a-list",
        "long",
    ],
)
def test_the_lineage_lists_each_earlier_run_once_newest_first(record, began, chain):
    from trainer.runs import lineage_of

    assert lineage_of(record, began, "s3://b/runs/me/checkpoints/") == chain


def _unreadable(store, root):
    # What listing `/` as root meets in /proc (a permission no chmod gives root here).
    raise PermissionError(13, "Permission denied", f"{root}/proc/1/cwd")


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: None, "no such folder; pass --store with the store the runs wrote to"),
        (lambda p: p.write_text("x"), "a file, not a folder; pass --store with the store the runs wrote to"),
        (lambda p: p.mkdir(), "/proc/1/cwd (Permission denied); pass --store with the store the runs wrote to"),
    ],
    ids=["missing", "a-file", "unreadable-below"],
)
def test_runs_of_a_store_that_is_no_readable_folder_is_one_line(tmp_path, monkeypatch, capsys, make, said):
    make(tmp_path / "store")
    monkeypatch.setattr("trainer.runs.list_runs", _unreadable)
    assert cli(["runs", "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kftrain: error: --store {tmp_path / 'store'}: ") and said in err, err
    assert "\n" not in err


def test_the_pre_flights_pin_resume_from_to_the_checkpoint_it_names(runs, monkeypatch):
    """`kftrain run --local` looks a run id up under its output folder; the pipeline's configure
    step under `store`; both hand on the step folder, so every later step reads the same one."""
    import sys

    from components.configure import configure
    from pipelines.local_run import preflight

    root, _, old_ckpt = runs
    pinned = join_uri(old_ckpt, f"step-{CUT_AT:08d}")
    cfg = preflight(load_config(overrides={"checkpoint.resume_from": "old"}), local_root=str(root))
    assert cfg.checkpoint.resume_from == pinned
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # configure installs its one-line hook
    text = configure.python_func(config="", store=str(root), resume_from="old")
    assert json.loads(text)["checkpoint"]["resume_from"] == pinned
    with pytest.raises(ConfigError, match="'nosuchrun': no committed checkpoint for run nosuchrun"):
        configure.python_func(config="", store=str(root), resume_from="nosuchrun")


@pytest.mark.parametrize("spelled", ["relative", "with ~"])
def test_a_resume_from_path_is_pinned_absolute(runs, tmp_path, monkeypatch, spelled):
    """Was: kept as written, so a `--run-id` continuation from another working directory read
    another place (export_best then chose another checkpoint, with no word)."""
    from trainer.checks import check_resume_from

    root, _, old_ckpt = runs
    if spelled == "relative":
        monkeypatch.chdir(Path(old_ckpt).parent)
        given = "./checkpoints"
    else:
        monkeypatch.setenv("HOME", str(Path(old_ckpt).parent))
        given = "~/checkpoints"
    cfg = check_resume_from(config(root, "", **{"checkpoint.resume_from": given}), "")
    assert cfg.checkpoint.resume_from == join_uri(old_ckpt, f"step-{CUT_AT:08d}")


def test_the_attempts_kfp_local_makes_of_a_local_run_are_not_listed_as_runs(tmp_path):
    """`kftrain run --local` without a store: kfp.local's folder for each start
    (`kftrain-training-<time>/train/model/training.json`) has a KFP run's layout, but is an attempt
    of the run under runs/ (was: one extra `finished` row per start, Ctrl-C'd ones included)."""
    import datetime

    from pipelines.training import training_pipeline
    from trainer.runs import KFP_LOCAL_ATTEMPT

    when = datetime.datetime(2026, 12, 4, 10, 46, 46, 329880).strftime("%Y-%m-%d-%H-%M-%S-%f")
    attempt = f"{training_pipeline.name}-{when}"  # how kfp.local names a run's folder
    assert KFP_LOCAL_ATTEMPT.fullmatch(attempt)
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "run.json").write_text(json.dumps({"status": "finished"}))
    for run in (attempt, "kftrain-training-2026-12-04-10-47-24-019175", "kfp-run-1"):
        (tmp_path / run / "train" / "model").mkdir(parents=True)
        (tmp_path / run / "train" / "model" / "training.json").write_text(json.dumps({"metrics": {"steps": 3}}))
    assert sorted(r.name for r in list_runs(LocalStore(), str(tmp_path))) == ["kfp-run-1/train", "r1"]


def test_the_training_step_of_a_local_run_on_a_store_is_shown_as_that_run_only(tmp_path):
    """`kftrain run --local --store`: kfp.local's training step writes its model in a KFP run's
    layout (`<id>/train-<id>/model/training.json`), the run id owning the checkpoints under runs/
    (was: an extra `finished` row, also for a run killed before its export, whose id no
    resume_from took). A KFP run's own training task stays listed."""
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "run.json").write_text(json.dumps({"status": "started"}))
    for run, owner in (("89619849", "r1"), ("52", "r9"), ("kfp-run-1", "kfp-run-1/train-7")):
        model = tmp_path / run / "train-84826831" / "model"
        model.mkdir(parents=True)
        record = {"metrics": {"steps": 3}, "config": {"checkpoint": {"owner": owner}}}
        (model / "training.json").write_text(json.dumps(record))
    runs = {r.name: r.state for r in list_runs(LocalStore(), str(tmp_path))}
    assert runs == {"r1": "started", "52/train-84826831": "finished", "kfp-run-1/train-84826831": "finished"}


@pytest.mark.parametrize("how", ["run id", "step folder"])
def test_resume_from_a_run_still_running_on_this_machine_is_refused_before_any_step(runs, tmp_path, how):
    """Its pruning deleted the pinned step before the replicas read it (was: a failure in the train
    step, advising the run id the user had named). Any start of it counts (a restart too: the
    checkpoints' owner record names the first), in any phase; once it has ended it is read."""
    from pipelines.local_run import preflight, run_root, running_alone

    root, _, old_ckpt = runs
    store = tmp_path / "out"
    shutil.copytree(old_ckpt, store / "runs" / "other" / "checkpoints")
    value = {"run id": "other", "step folder": str(store / "runs" / "other" / "checkpoints" / f"step-{CUT_AT:08d}")}
    cfg = load_config(overrides={"checkpoint.resume_from": value[how]})
    with running_alone(run_root(cfg, "other", str(store)), "other"), pytest.raises(ConfigError) as info:
        preflight(cfg, local_root=str(store))
    said = str(info.value)
    assert said.startswith(
        f"checkpoint.resume_from {value[how]!r}: that run is still running on this machine (process "
    )
    assert said.endswith(
        "start from it once it has finished, or stop it (it commits a checkpoint as it stops) and start from it then"
    )
    assert preflight(cfg, local_root=str(store)).checkpoint.resume_from.endswith(f"step-{CUT_AT:08d}")
