"""The runs a store holds (`kftrain runs`), and the checkpoint `checkpoint.resume_from` names.

Nothing here writes: what a store holds per run is read from what the runs wrote anyway. Two
layouts put a run's checkpoints under a store root:

    runs/<run id>/checkpoints/step-N/COMMIT.json      `kftrain run --local` (pipelines/local_run.py),
    runs/<run id>/run.json                              and its record once the run finished
    <run id>/<task>-<DAG execution id>/model/checkpoints/step-N/COMMIT.json
    <run id>/<task>-<DAG execution id>/model/training.json
                                                      a KFP run with `store` set (docs/pipeline.md,
                                                      "Job names"); training.json once training ended

A local run whose checkpoints are elsewhere (`checkpoint.uri`; its `runs/<run id>/started.json`
says where) is listed with the checkpoints there, in a store of the root's kind; a KFP run's is
named by that URI instead.
Whether an unfinished run failed, was stopped or is still running, the store does not say: it is
`partial` (committed checkpoints) or `started` (none yet).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from typing import Any

from trainer.checkpoint_owner import COMMIT, claimants, latest_complete, step_dir
from trainer.config import Config, ConfigError, is_uri
from trainer.storage import (
    CorruptObject,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    join_uri,
    open_store,
    parse_uri,
    read_json,
    under_setting,
)

#: The folder of `kftrain run --local`'s runs under a store root (pipelines/local_run.py).
LOCAL_RUNS = "runs"
#: What marks a local run finished, and a KFP task's training ended.
RUN_RECORD, TRAINING_RECORD = "run.json", "training.json"
#: What a local run's first start records (where its checkpoints go: pipelines/local_run.py).
STARTED_RECORD = "started.json"
_COMMIT = re.compile(r"^(?P<prefix>.+)/step-(?P<step>\d{8})/COMMIT\.json$")
#: The folder kfp.local gives each start of `kftrain run --local` under its output folder
#: (`<pipeline name>-<start time>`, pipelines/training.py's name): an attempt of the run listed
#: under `runs/<run id>`, not a KFP run of its own.
KFP_LOCAL_ATTEMPT = re.compile(r"kftrain-training-\d{4}(-\d\d){5}-\d{6}")
_STEP_FOLDER = re.compile(r"/step-(\d{8})$")

log = logging.getLogger("kftrain.runs")


@dataclasses.dataclass(slots=True)
class RunInfo:
    """One run (one training task of it, for a KFP run) as the store shows it."""

    run_id: str
    """The run id: `kftrain run --local`'s, or the KFP run's."""
    task: str = ""
    """The task's folder in a KFP run (`train-<DAG execution id>`); empty for a local run."""
    state: str = "started"
    """`finished`, `partial` (committed checkpoints, not finished) or `started` (neither)."""
    last_step: int | None = None
    """The newest step the store records: of its latest checkpoint, or of the finished training."""
    checkpoint: str = ""
    """The folder of the latest committed checkpoint (`.../step-N`), empty when none."""
    committed_unix_time: float | None = None
    """When that checkpoint was committed (None when its record does not say, or says nonsense)."""
    steps: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Steps with a commit record (complete or not) by checkpoint prefix."""
    finished: bool = False
    elsewhere: bool = False
    """Its steps are at a `checkpoint.uri` of its own (a local run's), which it owns as its run id."""

    @property
    def name(self) -> str:
        """What `checkpoint.resume_from` takes to name this run: `RUN` or `RUN/TASK`."""
        return f"{self.run_id}/{self.task}" if self.task else self.run_id


def _where(rel: str) -> tuple[str, str] | None:
    """(run id, task folder) of an object at `rel` under a store root, None outside both layouts."""
    parts = rel.split("/")
    if parts[0] == LOCAL_RUNS and len(parts) >= 3:
        return parts[1], ""
    if len(parts) >= 4 and parts[2] == "model" and not KFP_LOCAL_ATTEMPT.fullmatch(parts[0]):
        return parts[0], parts[1]  # what a run of a store holds of its training: the model's
    return None


def _run_object(rel: str) -> tuple[tuple[str, str], str] | None:
    """(run key, what it is) of an object :func:`list_runs` reads at `rel` under a store root:
    `commit` (a checkpoint's commit record), `finish` (a local run's record, a task's training
    record), `log` or `started` (a local run's); None for anything else (a model's files)."""
    key = _where(rel)
    if key is None:
        return None
    run_folder = f"{LOCAL_RUNS}/{key[0]}/"
    local = not key[1]
    if _COMMIT.match(rel):
        return key, "commit"
    if rel == run_folder + RUN_RECORD if local else rel.rsplit("/", 1)[-1] == TRAINING_RECORD:
        return key, "finish"
    if local and rel.startswith(run_folder + "log-"):
        return key, "log"
    if local and rel == run_folder + STARTED_RECORD:
        return key, "started"
    return None


def stores_under(store: ObjectStore, root: str) -> list[str]:
    """The store roots one folder below `root` that hold runs (`root` is a parent of stores:
    `kftrain runs` of it lists nothing, and names these instead)."""
    root = root.rstrip("/")
    found = set()
    for uri in store.list(root + "/"):
        first, _, rel = uri[len(root) + 1 :].partition("/")
        if rel and _run_object(rel) is not None:  # what `kftrain runs` of that root lists
            found.add(join_uri(root, first))
    return sorted(found)


def _run_of_prefix(rel: str) -> tuple[str, str] | None:
    """(run id, task folder) of the run whose own checkpoint prefix is `rel` (relative to a store
    root) in either layout above, else None."""
    parts = rel.split("/")
    if len(parts) == 3 and parts[0] == LOCAL_RUNS and parts[2] == "checkpoints":
        return parts[1], ""
    if len(parts) == 4 and parts[0] != LOCAL_RUNS and parts[2:] == ["model", "checkpoints"]:
        return parts[0], parts[1]
    return None


def list_runs(store: ObjectStore, root: str) -> list[RunInfo]:
    """The runs under store root `root`, oldest id first, with their state, last step and latest
    committed checkpoint (one listing of the root, then one read per run of a record)."""
    root = root.rstrip("/")
    runs: dict[tuple[str, str], RunInfo] = {}
    finish: dict[tuple[str, str], str] = {}
    started: dict[tuple[str, str], str] = {}
    for uri in store.list(root + "/"):
        found = _run_object(uri[len(root) + 1 :])
        if found is None:
            continue
        key, what = found
        if what == "commit":
            m = _COMMIT.match(uri)
            info = runs.setdefault(key, RunInfo(*key))
            info.steps.setdefault(m.group("prefix"), []).append(int(m.group("step")))
        elif what == "finish":
            finish[key] = uri
        else:
            runs.setdefault(key, RunInfo(*key))  # a log; or started, before its first log or checkpoint
            if what == "started":
                started[key] = uri
    for key, uri in started.items():
        if not runs[key].steps:
            runs[key].steps.update(_steps_elsewhere(store, root, uri))
            runs[key].elsewhere = bool(runs[key].steps)
    local_runs = {run_id for run_id, task in (*runs, *finish) if not task}
    for key, uri in finish.items():
        info = runs.setdefault(key, RunInfo(*key))
        try:
            record = read_json(store, uri)
        except ObjectNotFound:
            continue  # deleted since the listing
        except CorruptObject:  # not JSON; a store that fails is the listing's error, not the run's damage
            record = None
        if not isinstance(record, dict):
            log.warning(
                f"{uri} is damaged (not a JSON object); run {info.name} is shown as its checkpoints show it "
                "(a finished run as partial)"
            )
            continue
        if key[1]:
            if _step_of_a_local_run(record, info, local_runs):
                del runs[key]
                continue
            info.finished = True
            steps = record.get("metrics", {}).get("steps")
            if isinstance(steps, int):
                info.last_step = steps
        else:
            info.finished = record.get("status") == "finished"
    for info in runs.values():
        _describe(store, info)
    return sorted(runs.values(), key=lambda r: (r.run_id, r.task))


def _steps_elsewhere(store: ObjectStore, root: str, started_uri: str) -> dict[str, list[int]]:
    """The commit records (steps by prefix) of a local run whose first start put its checkpoints
    at a `checkpoint.uri` of its own (its record at `started_uri` says where), when that is in a
    store of the root's kind (a local folder, or the same endpoint's buckets); else none."""
    steps: dict[str, list[int]] = {}
    try:
        prefix = read_json(store, started_uri).get("checkpoint_uri")
        if not isinstance(prefix, str) or not prefix or parse_uri(prefix).is_remote != parse_uri(root).is_remote:
            return {}
        for uri in store.list(prefix.rstrip("/") + "/"):
            if m := _COMMIT.match(uri):
                steps.setdefault(m.group("prefix"), []).append(int(m.group("step")))
    # A record or a prefix it cannot read: the run as its folder shows it.
    except (StoreError, OSError, ValueError, AttributeError):
        return {}
    return steps


def _step_of_a_local_run(record: dict[str, Any], info: RunInfo, local_runs: set[str]) -> bool:
    """Whether the training task `info` found in the KFP layout is the training step of one of the
    `local_runs` listed (`kftrain run --local --store`: kfp.local's steps write there, and the run id
    owns the checkpoints, which it keeps under its own folder): shown as that run, not again as a
    run of its own (was: finished whatever the run was, and no resume_from takes its id)."""
    config = record.get("config")
    checkpoint = config.get("checkpoint") if isinstance(config, dict) else None
    owner = checkpoint.get("owner") if isinstance(checkpoint, dict) else None
    return isinstance(owner, str) and owner in local_runs and not info.steps


def _model_checkpoints(store: ObjectStore, model: str) -> dict[str, str | None]:
    """The checkpoint prefixes, each with its owner (:func:`_run_prefixes`), of the run that trained
    the model at `model` (or the one model below it: a step's or a local run's job folder), where its
    training record names them (`checkpoint.uri`, `checkpoint.owner`) in a store of the model's
    kind; else none."""
    try:
        records = [uri for uri in store.list(model + "/") if uri.rsplit("/", 1)[-1] == TRAINING_RECORD]
        if len(records) != 1:
            return {}
        checkpoint = read_json(store, records[0])["config"]["checkpoint"]
        uri, owner = checkpoint["uri"], checkpoint.get("owner") or ""
        if not isinstance(uri, str) or not uri or parse_uri(uri).is_remote != parse_uri(model).is_remote:
            return {}
        return {prefix: _own_steps_owner(store, prefix, owner) for prefix in _prefixes_under(store, uri)}
    # No record (not a model folder), or one it cannot read: the folder as it is.
    except (StoreError, OSError, ValueError, TypeError, KeyError):
        return {}


def _own_steps_owner(store: ObjectStore, prefix: str, run_id: str = "") -> str | None:
    """The owner the commit records of a run's own steps under checkpoint prefix `prefix` name,
    from its owner records: `run_id` where that run claimed it (a local run's `checkpoint.uri` of
    its own), else whoever claimed it first (the run whose own prefix it is: a run that took it
    over later commits newer steps there as itself). None where they do not say (nobody claimed
    it: written before owner records, or by a trainer run by hand; a record it cannot read):
    every step there counts."""
    try:
        owners = claimants(store, prefix)
    except StoreError:
        return None
    if run_id:
        return run_id if run_id in owners else None
    return owners[0] if owners else None


def _describe(store: ObjectStore, info: RunInfo) -> None:
    """Fill in the state, latest complete checkpoint and its commit time of `info` from its own
    steps (a commit record whose parts are not all in the store is no checkpoint to resume from;
    a newer step of a run that took the prefix over is that run's)."""
    owner = info.run_id if info.elsewhere else ""
    complete = [
        (found, prefix)
        for prefix in info.steps
        if (found := latest_complete(store, prefix, owner=_own_steps_owner(store, prefix, owner)))
    ]
    if complete:
        (step, record), prefix = max(complete, key=lambda c: c[0][0])
        info.checkpoint = join_uri(prefix, f"step-{step:08d}")
        info.last_step = max(step, info.last_step or 0)
        info.committed_unix_time = _unix_time(record.get("committed_unix_time"))
    info.state = "finished" if info.finished else "partial" if complete else "started"


def _unix_time(value: Any) -> float | None:
    """`value` as a time to show, None unless it is a number the calendar can write (a foreign or
    damaged record may hold anything)."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return None
    try:
        time.gmtime(value)
    except (OverflowError, OSError, ValueError):
        return None
    return float(value)


def _shown(text: str) -> str:
    """`text` safe to print on a terminal: a store key may hold control characters."""
    return text if text.isprintable() else repr(text)[1:-1]


def runs_as_json(runs: list[RunInfo]) -> list[dict[str, Any]]:
    """`kftrain runs --json`: one object per run."""
    return [
        {
            "run": r.name,
            "run_id": r.run_id,
            "task": r.task,
            "state": r.state,
            "last_step": r.last_step,
            "checkpoint": r.checkpoint,
            "committed_unix_time": r.committed_unix_time,
        }
        for r in runs
    ]


def runs_table(runs: list[RunInfo]) -> str:
    """`kftrain runs`: a plain table, a header and one line per run."""
    rows = [("RUN", "STATE", "STEP", "COMMITTED (UTC)", "LATEST CHECKPOINT")]
    for r in runs:
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.committed_unix_time))
            if r.committed_unix_time is not None
            else "-"
        )
        step = "-" if r.last_step is None else str(r.last_step)
        rows.append((_shown(r.name), r.state, step, when, _shown(r.checkpoint) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]]).rstrip()
        for row in rows
    )


def _prefixes_under(store: ObjectStore, base: str) -> dict[str, list[int]]:
    """Committed steps by checkpoint prefix at or under `base`."""
    found: dict[str, list[int]] = {}
    for uri in store.list(base.rstrip("/") + "/"):
        if m := _COMMIT.match(uri):
            found.setdefault(m.group("prefix"), []).append(int(m.group("step")))
    return found


def _open(cfg: Config, uri: str) -> ObjectStore:
    return open_store(uri, cfg.store.endpoint, cfg.store.region, cfg.store.policy())


def check_run_id_has_a_store(cfg: Config) -> None:
    """ConfigError when `checkpoint.resume_from` names a run id and `store.uri`, under which run
    ids are looked up on a cluster, is empty: known before anything runs (`kftrain submit`)."""
    value = cfg.checkpoint.resume_from
    if value and not is_uri(value) and not cfg.store.uri:
        raise ConfigError(_NO_STORE_FOR_A_RUN_ID.format(value=value))


_NO_STORE_FOR_A_RUN_ID = (
    "checkpoint.resume_from {value!r}: a run id is looked up under store.uri, which is empty; set store.uri (the "
    "`store` parameter, or --store) to the store the run wrote to, or give its model or checkpoint URI"
)


def resolve_resume_from(cfg: Config, root: str) -> tuple[str, dict[str, Any]]:
    """The checkpoint `checkpoint.resume_from` names: its step folder and commit record.

    A URI: that `step-N` folder, else the one checkpoint prefix at or under it (a checkpoint
    prefix, a model URI, a run's folder). A run id (`RUN` or `RUN/TASK`): the one checkpoint
    prefix of that run under store root `root` (either layout above). The latest checkpoint of
    the prefix whose every part is in the store is chosen. ConfigError in one line naming the
    value and what to do when it names no such checkpoint, or several prefixes.
    """
    value = cfg.checkpoint.resume_from
    field = f"checkpoint.resume_from {value!r}"
    only = None
    try:
        if is_uri(value):
            base = value.rstrip("/")
            store = _open(cfg, base)
            # A place, not a run: its newest checkpoint, whichever run wrote it.
            if m := _STEP_FOLDER.search(base):
                found = {base[: m.start()]: None}
                only = int(m.group(1))
            else:
                found = dict.fromkeys(_prefixes_under(store, base))
            where = f"at or under {base}"
            if not found and (recorded := _model_checkpoints(store, base)):
                # A model whose checkpoints went elsewhere (a local run keeps them under its run's folder).
                found, where = recorded, f"where the training record of the model at {base} puts its checkpoints"
        else:
            if not root:
                raise ConfigError(_NO_STORE_FOR_A_RUN_ID.format(value=value))
            root = root.rstrip("/")
            store = _open(cfg, root)
            run_id, _, task = value.partition("/")
            found = _run_prefixes(store, root, run_id, task)
            where = f"for run {value} under {root} (`kftrain runs --store {root}` lists the runs there)"
        if not found:
            raise ConfigError(f"{field}: no committed checkpoint {where}; name a run or checkpoint that has one")
        if len(found) > 1:
            raise ConfigError(
                f"{field}: {len(found)} checkpoint prefixes {where} ({', '.join(sorted(found))}); name one: "
                "RUN/TASK, or its checkpoint URI"
            )
        ((prefix, owner),) = found.items()
        # A named step is taken whoever committed it; the newest of a prefix is its own runs'.
        latest = latest_complete(store, prefix, only, owner, strangers=only is not None)
        gone = latest is None and only is not None and not store.exists(join_uri(step_dir(prefix, only), COMMIT))
        others = latest_complete(store, prefix, only) if latest is None and owner is not None else None
    except StoreError as exc:
        raise under_setting(field, exc) from None
    if latest is None:
        if gone:  # pinned by the pre-flight (or named) while its run trained on and pruned it
            raise ConfigError(
                f"{field}: step {only} of {prefix} has no commit record (never written, or deleted since: a run "
                "still training deletes its older checkpoints as it commits new ones, checkpoint.keep_last); start "
                "from a run once it has finished or stopped, or name a step it keeps"
            )
        if others is not None:  # complete, but another run's
            # Either run may have taken the prefix over from the other: which one, the records do not say.
            raise ConfigError(
                f"{field}: run {value} committed no checkpoint of its own at {prefix} (the newest complete one "
                f"there, step {others[0]}, was committed by {_whose(others[1])}, which shares the prefix with it); "
                "name that run, or a checkpoint URI"
            )
        what = f"step {only} of {prefix} is not" if only is not None else f"no checkpoint of {prefix} is"
        raise ConfigError(
            f"{field}: {what} complete (a commit record whose parts are all in the store); name another checkpoint"
        )
    step, record = latest
    return join_uri(prefix, f"step-{step:08d}"), record


def _whose(record: dict[str, Any]) -> str:
    """The run a commit record names as its owner, as a message says it."""
    owner = record.get("owner")
    return f"run {owner}" if owner else "a run that did not record its id"


def _run_prefixes(store: ObjectStore, root: str, run_id: str, task: str) -> dict[str, str | None]:
    """The checkpoint prefixes of run `run_id` under store root `root`, each with the owner its
    own commit records name (None: any, :func:`_own_steps_owner`): its own prefix in either layout,
    only a KFP run's with a `task` (`train` names `train-<id>`); for a local run with none, the
    `checkpoint.uri` of its own that its started record names, as `kftrain runs` shows it."""
    found = {}
    for base in (join_uri(root, LOCAL_RUNS, run_id), join_uri(root, run_id)):
        for prefix in _prefixes_under(store, base):
            owner = _run_of_prefix(prefix[len(root) + 1 :])
            if owner is None or owner[0] != run_id:
                continue  # another run's, or a prefix of neither layout
            folder = owner[1]
            if (not folder and not task) or (folder and (not task or folder == task or folder.startswith(f"{task}-"))):
                found[prefix] = _own_steps_owner(store, prefix)
    if not found and not task:
        elsewhere = _steps_elsewhere(store, root, join_uri(root, LOCAL_RUNS, run_id, STARTED_RECORD))
        found = {prefix: _own_steps_owner(store, prefix, run_id) for prefix in elsewhere}
    return found


def split_step_folder(folder: str) -> tuple[str, int]:
    """(prefix, step) of a checkpoint's `.../step-N` folder."""
    m = _STEP_FOLDER.search(folder)
    if m is None:
        raise ValueError(f"{folder} is not a checkpoint step folder (.../step-NNNNNNNN)")
    return folder[: m.start()], int(m.group(1))


#: How many runs back a run's commit records trace where its weights came from (`lineage_of`).
MAX_LINEAGE = 32


def lineage_of(record: dict[str, Any], began: list[str], own_prefix: str) -> list[str]:
    """The step folders of the other runs' checkpoints a run's weights came through, newest first:
    `began` (the checkpoint it starts from now, when another run's), then what `record`, the commit
    record it resumes from, lists (`lineage`; `resumed_from` alone in records of kftrain before it).
    Each checkpoint prefix once (its newest entry) and never the run's own (`own_prefix`), so a
    chain that loops back ends; at most :data:`MAX_LINEAGE`. What a damaged record holds that
    names no step folder is left out."""
    recorded = record.get("lineage")
    if not isinstance(recorded, list):
        recorded = [record.get("resumed_from")]
    chain, seen = [], {own_prefix.rstrip("/")}
    for folder in [*began, *recorded]:
        if not isinstance(folder, str) or not _STEP_FOLDER.search(folder):
            continue
        prefix = split_step_folder(folder)[0].rstrip("/")
        if prefix not in seen:
            seen.add(prefix)
            chain.append(folder)
    return chain[:MAX_LINEAGE]
