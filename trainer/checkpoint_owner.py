"""Who owns a checkpoint prefix, and which of its steps are complete (no torch here: the CLI
claims a run's prefixes, lists runs and finds the checkpoint `checkpoint.resume_from` names
before any step starts).

Ownership: a prefix belongs to one run at a time. Before anything is written the run claims it
(:func:`claim_prefix`): it creates the next ``owner/NNNNNNNN.json`` only if absent (S3
``If-None-Match: *``, a local hard link), so of two runs racing for one generation exactly one
wins. The newest generation is the owner. A run whose identity is the owner's (a retried step,
a restarted pod, ``kftrain run --run-id``) goes on; another run refuses, naming the owner,
unless ``checkpoint.resume`` is true, which takes the prefix over and continues from its latest
checkpoint. Before it uploads a step and again before it commits one, a writer checks that it
still owns the prefix (a run taken over stops instead of writing beside the new owner), and
``COMMIT.json`` is created only if absent: a committed step is never overwritten. Pruning
deletes only steps whose commit record names this run as owner (and partial ones), and of
those only the objects a checkpoint writer makes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import KftrainError
from trainer.storage import CorruptObject, ObjectNotFound, ObjectStore, join_uri, read_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from trainer.config import Config

#: The commit record of a checkpoint step, written last (trainer.checkpoint).
COMMIT = "COMMIT.json"
#: The layout of a commit record and of what it points at, written into each (`format`; absent:
#: 1, a kftrain from before the key). Raised whenever a field changes its shape or meaning, so a
#: kftrain that reads an older record knows it and one that meets a newer one refuses it in a line
#: (was: an older kftrain met a per-rank `position.epoch_loss` as a shape error in its ranks).
CHECKPOINT_FORMAT = 2
#: DCP's index of the checkpoint, written by rank 0; every checkpoint has one.
METADATA = ".metadata"
#: The folder of the owner records under a checkpoint prefix, one per generation.
OWNER_FOLDER = "owner"
_OWNER_RECORD = re.compile(r"/owner/(\d{8})\.json$")
#: A step's folder: the first folder below the prefix (matched at the start of what follows it).
STEP_DIR = re.compile(r"/step-(\d{8})/")
#: What a checkpoint writer puts in a step folder: DCP's index and data files, each rank's own
#: part and the commit record. Pruning deletes these and leaves anything else a user put there.
_WRITTEN_NAME = re.compile(r"(COMMIT\.json|(__\d+)?\.metadata|__\d+_\d+\.distcp|rank-\d{5,}\.pt)")
_HEX64 = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger("kftrain.checkpoint")


class CheckpointError(KftrainError, RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


def step_dir(prefix: str, step: int) -> str:
    """The folder of the checkpoint taken after optimizer step `step`."""
    return join_uri(prefix, f"step-{step:08d}")


def checkpoint_prefix(cfg: Config, model_uri: str) -> str:
    """Where the run's checkpoints go: checkpoint.uri, else `<model URI>/checkpoints`."""
    return cfg.checkpoint.uri or join_uri(model_uri, "checkpoints")


def checkpoint_owner(cfg: Config, model_uri: str) -> str:
    """Who owns the checkpoint prefix: checkpoint.owner (the training step sets it to its task
    identity), else the model URI, which names one run and stays the same when it restarts."""
    return cfg.checkpoint.owner or model_uri


def owner_uri(prefix: str, generation: int) -> str:
    """The owner record of generation `generation` under `prefix`."""
    return join_uri(prefix, OWNER_FOLDER, f"{generation:08d}.json")


def _generations(store: ObjectStore, prefix: str) -> list[int]:
    """The generations of owner records under `prefix`, oldest first."""
    return sorted(
        int(m.group(1))
        for uri in store.list(join_uri(prefix.rstrip("/"), OWNER_FOLDER))
        if (m := _OWNER_RECORD.search(uri))
    )


def current_owner(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """The owner record of the newest generation under `prefix`, or None when nobody claimed it."""
    generations = _generations(store, prefix)
    if not generations:
        return None
    return read_json(store, owner_uri(prefix.rstrip("/"), generations[-1]))


def claimants(store: ObjectStore, prefix: str) -> list[str]:
    """The runs that claimed `prefix`, the first claim first (a run that took it over later, or
    took it back, is listed again)."""
    records = [read_json(store, owner_uri(prefix.rstrip("/"), g)) for g in _generations(store, prefix)]
    return [r["owner"] for r in records if isinstance(r, dict) and isinstance(r.get("owner"), str) and r["owner"]]


def describe_owner(record: dict[str, Any]) -> str:
    """An owner record in words: the run, when and where it claimed the prefix."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("created_unix_time", 0))))
    return f"run {record.get('owner')!r} (claimed {when} on host {record.get('host')}, pid {record.get('pid')})"


def committed_steps_in(store: ObjectStore, prefix: str) -> list[int]:
    """The steps under `prefix` that have a commit record (complete or not, by its presence only)."""
    return committed(objects_by_step(store, prefix))


def objects_by_step(store: ObjectStore, prefix: str) -> dict[int, list[str]]:
    """Every object under `prefix` by the step folder it is in (one listing)."""
    by_step: dict[int, list[str]] = {}
    for uri in store.list(prefix):
        if m := STEP_DIR.match(uri[len(prefix.rstrip("/")) :]):
            by_step.setdefault(int(m.group(1)), []).append(uri)
    return by_step


def written_by_a_checkpoint(prefix: str, uri: str) -> bool:
    """Whether `uri` (in a step folder under `prefix`) is an object a checkpoint writer creates."""
    rel = uri[len(prefix.rstrip("/")) :]
    m = STEP_DIR.match(rel)
    return m is not None and _WRITTEN_NAME.fullmatch(rel[m.end() :]) is not None


def committed(by_step: dict[int, list[str]]) -> list[int]:
    """The steps of :func:`objects_by_step` that have a commit record, ascending."""
    return sorted(s for s, uris in by_step.items() if any(u.endswith(f"/{COMMIT}") for u in uris))


def committed_parts(record: Any) -> dict[str, dict[str, Any]]:
    """The parts a commit record lists (name -> bytes, sha256, and optionally block_bytes with
    the blocks' sha256s); CorruptObject when malformed."""
    parts = record.get("parts") if isinstance(record, dict) else None
    if not isinstance(parts, dict) or METADATA not in parts:
        raise CorruptObject(f"{COMMIT} lists no parts (or no {METADATA}) under 'parts'")
    for name, part in parts.items():
        if not (isinstance(part, dict) and isinstance(part.get("bytes"), int) and isinstance(part.get("sha256"), str)):
            raise CorruptObject(f"{COMMIT} has no size and sha256 for {name} under 'parts'")
        if "blocks" not in part and "block_bytes" not in part:
            continue  # written before block hashes: read whole
        block_bytes, blocks = part.get("block_bytes"), part.get("blocks")
        if not (isinstance(block_bytes, int) and block_bytes > 0 and isinstance(blocks, list)):
            raise CorruptObject(f"{COMMIT} has block hashes for {name} without a positive block_bytes and a list")
        expected = -(-part["bytes"] // block_bytes)
        if len(blocks) != expected or not all(isinstance(h, str) and _HEX64.fullmatch(h) for h in blocks):
            raise CorruptObject(
                f"{COMMIT} lists {len(blocks)} block hashes for {name}, expected {expected} sha256 hex digests "
                f"({part['bytes']} bytes in blocks of {block_bytes})"
            )
    return parts


def check_format(record: dict[str, Any], where: str) -> None:
    """CheckpointError when the commit record `record` (of checkpoint `where`) is of a newer
    :data:`CHECKPOINT_FORMAT` than this kftrain reads."""
    written = record.get("format", 1)
    if not isinstance(written, int) or written > CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"checkpoint {where} was written by a newer kftrain (checkpoint format {written!r}; this one reads up to "
            f"{CHECKPOINT_FORMAT}): continue it with that kftrain, or upgrade this one"
        )


def complete_record(store: ObjectStore, prefix: str, step: int, by_step: dict[int, list[str]]) -> dict[str, Any] | None:
    """The commit record of `step` under `prefix` when it and every part it lists are in the
    store with the sizes it records, else None (logged): the one test of a complete checkpoint."""
    folder = step_dir(prefix, step)
    try:
        record = read_json(store, join_uri(folder, COMMIT))
        parts = committed_parts(record)
        if record.get("step") != step:  # a step folder copied or renamed by hand: its parts are another step's
            raise CorruptObject(
                f"its {COMMIT} is step {record.get('step')!r}'s, not step {step}'s (copied or renamed?)"
            )
        present = {uri.rsplit("/", 1)[-1] for uri in by_step.get(step, [])}
        missing = sorted(set(parts) - present)
        if missing:
            raise ObjectNotFound(f"parts {missing} listed in {COMMIT} are not in the store")
        for name, part in parts.items():
            size = store.size(join_uri(folder, name))
            if size != part["bytes"]:
                raise CorruptObject(f"{name} has {size} bytes, its commit record says {part['bytes']}")
    except (ObjectNotFound, CorruptObject) as exc:
        log.warning("skipping checkpoint %s (incomplete): %s", folder, exc)
        return None
    return record


def latest_complete(
    store: ObjectStore, prefix: str, only: int | None = None, owner: str | None = None, strangers: bool | None = None
) -> tuple[int, dict[str, Any]] | None:
    """(step, commit record) of the newest complete checkpoint under `prefix` (of step `only`,
    with `only`), or None; without `strangers` (the default with an `owner`: a run's own reads),
    of the prefix's own runs only (:func:`prefix_steps`). With `owner`, only a step that run
    committed (or a record that names no owner): a prefix another run took over holds both runs'
    steps, and the newest is the other's."""
    strangers = owner is None if strangers is None else strangers
    for step, record in prefix_steps(store, prefix, newest_first=True, strangers=strangers):
        if (only is None or step == only) and (owner is None or record.get("owner") in (None, "", owner)):
            return step, record
    return None


def prefix_steps(
    store: ObjectStore, prefix: str, up_to: int | None = None, newest_first: bool = False, strangers: bool = True
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, commit record) of each complete checkpoint under `prefix` (at step `up_to` or
    before), ascending or newest first, checked as they are asked for. Without `strangers`
    (what the run owning the prefix reads), only those committed by a run that owned the prefix
    (or naming no owner): a step another run committed elsewhere and someone copied in is
    skipped, said (was: resumed, or exported as the best, as this run's own, mixing two runs'
    training in silence); :func:`claim_prefix` refuses such a prefix before a run starts."""
    by_step = objects_by_step(store, prefix)
    runs = set() if strangers else set(claimants(store, prefix))
    steps = committed(by_step)
    for step in reversed(steps) if newest_first else steps:
        if up_to is not None and step > up_to:
            continue
        record = complete_record(store, prefix, step, by_step)
        if record is None:
            continue
        if runs and (by := _committed_outside(record, runs)):
            log.warning(
                "skipping checkpoint %s: run %r committed it, and that run never owned %s (copied in from its "
                "checkpoints?); to start from it, name it in checkpoint.resume_from of a new run",
                step_dir(prefix, step),
                by,
                prefix.rstrip("/"),
            )
            continue
        yield step, record


def _committed_outside(record: Any, runs: set[str]) -> str:
    """The run a commit record names when it is none of `runs`, else '' (one naming no run too)."""
    by = record.get("owner") if isinstance(record, dict) else None
    return by if isinstance(by, str) and by and by not in runs else ""


def _refuse_strangers(store: ObjectStore, prefix: str, owner: str) -> None:
    """CheckpointError when `prefix` holds committed steps of a run that never owned it (nor is
    `owner`): copied in by hand, or the owner records deleted. The run owning the prefix skips
    them, and would fail on reaching a step number one of them holds (a committed step is never
    overwritten): refused before it starts, naming them."""
    runs = {*claimants(store, prefix), owner}
    found: dict[int, str] = {}
    for step in committed_steps_in(store, prefix):
        try:
            record = read_json(store, join_uri(step_dir(prefix, step), COMMIT))
        except (ObjectNotFound, CorruptObject):
            continue  # no checkpoint, nobody's: the run's own save of that step says what is wrong
        if by := _committed_outside(record, runs):
            found[step] = by
    if found:
        steps = ", ".join(f"{s} (run {by!r})" for s, by in sorted(found.items()))
        raise CheckpointError(
            f"checkpoint prefix {prefix} holds committed steps of runs that never owned it: {steps} (copied in "
            f"from their checkpoints, or the prefix's owner records deleted?); run {owner!r} would not resume from "
            "them and could not write those step numbers: move them out of the prefix; to start from one, name "
            "it in checkpoint.resume_from of a run with another checkpoint prefix"
        )


def _process_started(pid: int) -> float | None:
    """When process `pid` of this machine started (Unix time), None where it is not running or
    this machine does not say (no /proc)."""
    from trainer.procfs import started_ticks

    ticks = started_ticks(pid)
    if ticks is None:
        return None
    try:
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def still_running(record: dict[str, Any]) -> bool:
    """Whether the owner `record` names is another process of this machine that is still running:
    its pid is alive and started before the record was written (not a later process given its
    pid). An owner on another machine (a pod) cannot be told, and this process's own earlier run
    has ended: False."""
    pid = record.get("pid")
    if record.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    started = _process_started(pid)
    claimed = record.get("created_unix_time")
    return started is not None and isinstance(claimed, int | float) and started <= claimed + 1


def _taken_back(store: ObjectStore, prefix: str, owner: str, current: dict[str, Any]) -> str:
    """Why run `owner` may not take back `prefix`, which it had before another run (`current`'s)
    took it over, or '': the newest complete step is another run's, so continuing there would
    load that run's weights as this run's and mix the two runs' steps (a run that committed
    nothing since leaves the prefix to be taken back)."""
    if owner not in claimants(store, prefix):
        return ""
    latest = latest_complete(store, prefix)
    if latest is None or latest[1].get("owner") in (None, "", owner):
        return ""
    own = latest_complete(store, prefix, owner=owner)
    newest_own = f" (its newest, step {own[0]})" if own else ""
    return (
        f"checkpoint prefix {prefix} was taken over from this run ({owner!r}) by {describe_owner(current)}, and "
        f"its newest step, {latest[0]}, is run {latest[1].get('owner')!r}'s: continuing there would continue that "
        f"run's weights as this run's. Continue it from its own checkpoint{newest_own} as a new run under a new "
        f"prefix: a new checkpoint.uri and checkpoint.resume_from: {owner} (locally: without --run-id)"
    )


def claim_prefix(
    store: ObjectStore,
    prefix: str,
    owner: str,
    *,
    resume: bool,
    can_continue: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Make run `owner` the owner of checkpoint prefix `prefix` before it writes there; return
    the owner record. CheckpointError, in one line naming the owner and what to do, when the
    prefix is another run's and `resume` is false, or holds committed steps and `resume` is false.

    Same owner: nothing to do (a retry or restart of this run). Another owner and `resume`: the
    next generation's record takes the prefix over; that run stops at its next save. Refused
    while that owner still runs on this machine (:func:`still_running`), and where `owner` had
    the prefix before and another run committed the newest step since (:func:`_taken_back`).
    `can_continue`, given the newest complete checkpoint's commit record before a takeover,
    raises where this run could not continue it: refused before anything is claimed.
    """
    prefix = prefix.rstrip("/")
    if not owner:
        raise ValueError("a checkpoint owner must be named")
    _refuse_strangers(store, prefix, owner)
    for _ in range(8):  # each lost race means another run claimed in between: look again
        current = current_owner(store, prefix)
        if current is not None and current.get("owner") == owner:
            steps = [] if resume else committed_steps_in(store, prefix)
            if steps:
                raise CheckpointError(
                    f"checkpoint prefix {prefix} already holds committed steps {steps} of this run ({owner!r}) "
                    "and checkpoint.resume is false, so they would be overwritten: set checkpoint.resume: true "
                    "to continue from them, or point checkpoint.uri at a new prefix"
                )
            return current
        if not resume:
            if current is not None:
                raise CheckpointError(
                    f"checkpoint prefix {prefix} belongs to {describe_owner(current)}; this run ({owner!r}) has "
                    "checkpoint.resume: false and will neither overwrite nor prune that run's checkpoints: point "
                    "checkpoint.uri at a new prefix, or set checkpoint.resume: true to continue from them"
                )
            steps = committed_steps_in(store, prefix)
            if steps:
                raise CheckpointError(
                    f"checkpoint prefix {prefix} holds committed steps {steps} of an earlier run (written before "
                    f"owner records) and this run ({owner!r}) has checkpoint.resume: false: point checkpoint.uri "
                    "at a new prefix, or set checkpoint.resume: true to continue from them"
                )
        if current is not None and (problem := _taken_back(store, prefix, owner, current)):
            raise CheckpointError(problem)
        latest = latest_complete(store, prefix) if can_continue is not None else None
        if latest is not None:
            can_continue(latest[1])
        if current is not None and still_running(current):
            raise CheckpointError(
                f"checkpoint prefix {prefix} belongs to {describe_owner(current)}, which is still running on this "
                f"machine: taking it over would stop that run at its next save; wait for it or stop it, or point "
                "checkpoint.uri at a new prefix"
            )
        generation = int(current["generation"]) + 1 if current is not None else 1
        record = {
            "owner": owner,
            "generation": generation,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "created_unix_time": time.time(),
            "previous_owner": current.get("owner") if current is not None else None,
        }
        if store.put_bytes_if_absent(owner_uri(prefix, generation), json.dumps(record).encode()):
            if current is not None:
                log.warning(
                    "checkpoint prefix %s taken over from %s (checkpoint.resume: true): continuing from its "
                    "checkpoints; its steps are kept, never pruned by this run",
                    prefix,
                    describe_owner(current),
                )
            return record
    raise CheckpointError(f"could not claim checkpoint prefix {prefix}: other runs kept claiming it at the same time")
