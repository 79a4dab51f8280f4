"""Who owns a checkpoint prefix: one run at a time (no torch here: the CLI claims a run's prefixes
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
deletes only steps whose commit record names this run as owner (and partial ones).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from typing import TYPE_CHECKING, Any

from trainer.errors import KftrainError
from trainer.storage import ObjectStore, join_uri, read_json

if TYPE_CHECKING:
    from trainer.config import Config

#: The commit record of a checkpoint step, written last (trainer.checkpoint).
COMMIT = "COMMIT.json"
#: The folder of the owner records under a checkpoint prefix, one per generation.
OWNER_FOLDER = "owner"
_OWNER_RECORD = re.compile(r"/owner/(\d{8})\.json$")
#: A step's folder in a URI below the prefix.
STEP_DIR = re.compile(r"/step-(\d{8})/")

log = logging.getLogger("kftrain.checkpoint")


class CheckpointError(KftrainError, RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


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


def current_owner(store: ObjectStore, prefix: str) -> dict[str, Any] | None:
    """The owner record of the newest generation under `prefix`, or None when nobody claimed it."""
    prefix = prefix.rstrip("/")
    generations = sorted(
        int(m.group(1)) for uri in store.list(join_uri(prefix, OWNER_FOLDER)) if (m := _OWNER_RECORD.search(uri))
    )
    if not generations:
        return None
    return read_json(store, owner_uri(prefix, generations[-1]))


def describe_owner(record: dict[str, Any]) -> str:
    """An owner record in words: the run, when and where it claimed the prefix."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("created_unix_time", 0))))
    return f"run {record.get('owner')!r} (claimed {when} on host {record.get('host')}, pid {record.get('pid')})"


def committed_steps_in(store: ObjectStore, prefix: str) -> list[int]:
    """The steps under `prefix` that have a commit record (complete or not, by its presence only)."""
    return sorted(
        int(m.group(1))
        for uri in store.list(prefix)
        if uri.endswith(f"/{COMMIT}") and (m := STEP_DIR.search(uri[len(prefix) :]))
    )


def claim_prefix(store: ObjectStore, prefix: str, owner: str, *, resume: bool) -> dict[str, Any]:
    """Make run `owner` the owner of checkpoint prefix `prefix` before it writes there; return
    the owner record. CheckpointError, in one line naming the owner and what to do, when the
    prefix is another run's and `resume` is false, or holds committed steps and `resume` is false.

    Same owner: nothing to do (a retry or restart of this run). Another owner and `resume`: the
    next generation's record takes the prefix over; that run stops at its next save.
    """
    prefix = prefix.rstrip("/")
    if not owner:
        raise ValueError("a checkpoint owner must be named")
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
