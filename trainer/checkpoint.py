"""Checkpoints in the object store: every rank writes its own shards; visible only when complete.

Layout under the checkpoint prefix (``torch.distributed.checkpoint``, DCP, for the tensors)::

    step-00000120/.metadata          DCP's index: where every tensor (and shard of one) lives
    step-00000120/__0_0.distcp       rank 0's tensors: its model and optimizer shards (DDP: the
    step-00000120/__1_0.distcp         replicated tensors are spread over the ranks, once each)
    step-00000120/rank-00000.pt      rank 0's own small state (RNG streams)
    step-00000120/rank-00001.pt      ...
    step-00000120/COMMIT.json        written last, by rank 0, only if absent: every part (name,
                                     bytes, sha256; for a .distcp also the sha256 of each
                                     BLOCK_BYTES block), the world size, the owner, and what the
                                     trainer records (position, LR schedule, config, history)
    owner/00000001.json              who owns the prefix: the run's identity, host, pid, time;
    owner/00000002.json              a later generation is a deliberate takeover (resume: true)

Ownership (a prefix belongs to one run at a time): :mod:`trainer.checkpoint_owner`.

Saving: DCP writes this rank's files into a local staging folder on the calling thread (the
only part that stalls training), then a background thread uploads them (one checkpoint in
flight; the next save waits for it), the ranks exchange what they made durable on a separate
gloo group, and rank 0 writes ``COMMIT.json`` last. A checkpoint without a valid commit
record, or one of whose listed parts is missing from the store, is never chosen.

Loading reads only what each rank needs: ``.metadata`` first (whole), then, of each ``.distcp``,
only the blocks that hold the byte ranges DCP's load plan reads (ranged GETs, each block checked
against its sha256 in the commit record, written at its offset into a sparse local copy), and
DCP reshards to the loading world size. Integrity is checked for every byte that is read; a
block nobody reads is never fetched, so a change to it goes unnoticed and does not matter.
Parts recorded without block hashes (checkpoints written before them), ``.metadata`` and the
``rank-XXXXX.pt`` parts are fetched whole and checked against the whole file's sha256.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from trainer.checkpoint_owner import (
    CHECKPOINT_FORMAT,
    COMMIT,
    METADATA,
    CheckpointError,
    claim_prefix,
    committed,
    committed_parts,
    committed_steps_in,
    complete_record,
    current_owner,
    describe_owner,
    latest_complete,
    objects_by_step,
    prefix_steps,
    step_dir,
    written_by_a_checkpoint,
)
from trainer.errors import redact
from trainer.progress import ProgressLine, format_memory
from trainer.storage import (
    CorruptObject,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    drop_empty_folders,
    join_uri,
    read_json,
)

#: The unit of a ranged read of a ``.distcp`` part, each with its own sha256 in COMMIT.json. A
#: trade-off: smaller blocks waste less on the edges of what a reader needs (on average one
#: block per range read) but lengthen COMMIT.json, which every rank reads and rank 0 broadcasts
#: (~70 bytes of hex per block: 96 GB of shards -> ~3,000 blocks, ~200 KB).
BLOCK_BYTES = 32 * 2**20
#: The largest ranged GET of a block: large enough for an object store's full per-request
#: throughput (S3's guidance: 8-16 MB), small enough not to raise a reader's memory peak.
_GET_BYTES = 8 * 2**20
_DISTCP = ".distcp"
log = logging.getLogger("kftrain.checkpoint")


def quiet_no_process_group() -> None:
    """DCP without a process group (one process: `job.replicas: 1`, consolidation) warns at every
    save and load that it assumes a single process, which is what `no_dist` told it: one filter
    for the process (a `warnings.catch_warnings()` around each call is process-wide, not
    thread-safe, and resets the once-per-place record of every other warning)."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def rank_part(rank: int) -> str:
    """The name of rank `rank`'s own small part (its RNG streams)."""
    return f"rank-{rank:05d}.pt"


def _sha256(path: Path) -> str:
    return _digests(path, 0)[0]


def _digests(path: Path, block_bytes: int = 0) -> tuple[str, list[str]]:
    """The sha256 of the file at `path` and, when `block_bytes` > 0, of each of its consecutive
    `block_bytes` blocks (the last may be shorter), in one pass over the file."""
    whole, blocks = hashlib.sha256(), []
    block, in_block = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            whole.update(chunk)
            view = memoryview(chunk)
            while block_bytes and view:
                take = view[: block_bytes - in_block]
                block.update(take)
                in_block, view = in_block + len(take), view[len(take) :]
                if in_block == block_bytes:
                    blocks.append(block.hexdigest())
                    block, in_block = hashlib.sha256(), 0
    if in_block:
        blocks.append(block.hexdigest())
    return whole.hexdigest(), blocks


#: Free bytes below which a staging folder's disk counts as full after a failed write: DCP's and
#: torch's writers report running out of room in their own words ("unexpected pos ...").
_FULL_BELOW = 1 << 20


def _staging_full(folder: Path, exc: BaseException, rank: int) -> str:
    """Why rank `rank`'s staging into `folder` failed when its disk filled (told by the OS's
    error in `exc`'s chain, or in this rank's entry of DCP's CheckpointException: another rank's
    full disk is not this one's; or by under :data:`_FULL_BELOW` left), else ""."""
    seen, todo, said = set(), [exc], False
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        said |= isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        todo += [x for x in (e.__cause__, e.__context__, *e.args) if isinstance(x, BaseException)]
        if isinstance(e, CheckpointException):  # each rank's failure as (exception, its traceback)
            own = e.failures.get(rank)
            todo += [own[0]] if isinstance(own, tuple) and isinstance(own[0], BaseException) else []
    try:
        usage = shutil.disk_usage(folder.parent)
        staged = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0
    except OSError:
        return ""
    if not said and usage.free >= _FULL_BELOW:
        return ""
    return (
        f"the disk of its staging folder {folder.parent} is full ({format_memory(staged)} of this rank's part "
        f"written, {format_memory(usage.free)} free): point TMPDIR at a folder with room for a checkpoint's share "
        "of each rank on this machine, or free space there"
    )


def _block_span(offset: int, length: int, block_bytes: int) -> range:
    """The indices of the blocks that hold bytes ``offset .. offset + length``."""
    if length <= 0:
        return range(0)
    return range(offset // block_bytes, (offset + length - 1) // block_bytes + 1)


class CheckpointManager:
    """Save (asynchronously, from every rank), find the latest complete checkpoint, load it, prune.

    Every rank of the job creates one with the same `group` (see
    :func:`trainer.distributed.checkpoint_group`; None for one process) and calls
    :meth:`save`, :meth:`latest` and :meth:`load` together: they are collectives.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        keep_last: int = 2,
        *,
        rank: int = 0,
        world_size: int = 1,
        group: dist.ProcessGroup | None = None,
        block_bytes: int = BLOCK_BYTES,
        owner: str = "",
        keep_best: tuple[str, str] | None = None,
    ) -> None:
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        self.store, self.prefix, self.keep_last = store, prefix.rstrip("/"), keep_last
        #: The block size of the per-block sha256s recorded for each ``.distcp`` part it saves.
        self.block_bytes = block_bytes
        self.rank, self.world_size, self.group = rank, world_size, group
        if group is None:
            quiet_no_process_group()
        #: The run this manager writes for: recorded in every COMMIT.json, checked before every
        #: upload and commit once :meth:`claim` made it the prefix's owner, and the only steps
        #: pruning deletes. Empty: no owner (steps committed without one are pruned).
        self.owner = owner
        #: `(direction, metric)` (`min`/`max`, a key of the ``metrics`` a commit record holds):
        #: pruning also keeps this run's step with the best value (:func:`best_step`).
        self.keep_best = keep_best
        self._claimed = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_stage_seconds = 0.0
        self.last_upload_seconds = 0.0
        self.last_bytes = 0
        #: Parts this rank downloaded (some blocks of, or whole) in its last :meth:`load`.
        self.last_fetched: list[str] = []
        #: Bytes this rank downloaded in its last :meth:`load` (each rank reads only what it needs).
        self.last_fetched_bytes = 0
        #: The step of the checkpoint this manager last saved or loaded (None: neither yet).
        self.last_step: int | None = None

    # -- ownership ----------------------------------------------------------------------------

    def claim(self, *, resume: bool) -> dict[str, Any]:
        """Claim the prefix for :attr:`owner` (:func:`claim_prefix`; a collective: rank 0
        claims, and every rank raises the same CheckpointError when it is refused)."""
        result: tuple[dict[str, Any] | None, str] = (None, "")
        if self.rank == 0:
            try:
                result = (claim_prefix(self.store, self.prefix, self.owner, resume=resume), "")
            except (CheckpointError, StoreError) as exc:
                result = (None, str(exc))
        if self.group is not None:
            box = [result]
            dist.broadcast_object_list(box, src=0, group=self.group)
            result = box[0]
        record, error = result
        if error:
            raise CheckpointError(error)
        self._claimed = True
        return record

    def _may_write(self, step: int) -> str:
        """Why this run must not write step `step` now ("" when it may): the prefix has another
        owner since, or the step is committed already (a committed step is never overwritten)."""
        if self._claimed:
            current = current_owner(self.store, self.prefix)
            if current is None or current.get("owner") != self.owner:
                taken = describe_owner(current) if current is not None else "nobody (its owner records are gone)"
                return (
                    f"checkpoint prefix {self.prefix} now belongs to {taken}, not to this run ({self.owner!r}): "
                    "it stops rather than write beside it; the steps it committed are kept"
                )
        commit = join_uri(step_dir(self.prefix, step), COMMIT)
        if not self.store.exists(commit):
            return ""
        by_step = objects_by_step(self.store, self.prefix)
        owner = self._commit_owner(step)
        if owner is None:  # damaged by hand or a full disk: no checkpoint, but nobody can say whose
            return (
                f"checkpoint step {step} has a commit record at {commit} that cannot be read, so it is no "
                "checkpoint, and whose it was cannot be told: delete that step folder to let this run write "
                "the step, or point checkpoint.uri at a new prefix"
            )
        if owner == self.owner and self._lost_a_part(step):
            # This run's own step, damaged (a part lost): a resume skipped it, and training came
            # back to it; nothing can load it, so it is written again rather than block the run.
            log.warning("checkpoint step %d of this run at %s is incomplete: written again", step, redact(commit))
            self._delete_step(step, by_step.get(step, []))
            return ""
        return (
            f"checkpoint step {step} is already committed at {commit} and is never overwritten: "
            "point checkpoint.uri at a new prefix, or delete that step folder if it is unwanted"
        )

    def _agree(self, problem: str) -> str:
        """Rank 0's `problem` on every rank (a collective on the checkpoint group)."""
        if self.group is None:
            return problem
        box = [problem]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    # -- writing ------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        record: dict[str, Any] | None = None,
        local: Callable[[], Any] | None = None,
        blocking: bool = False,
    ) -> None:
        """Stage this rank's share of `state` (a DCP state dict) on local disk now, upload it in
        the background (or now, if `blocking`); rank 0 commits with `record` added to COMMIT.json.

        `local()` is this rank's own small state, taken after DCP wrote (so whatever DCP did to
        the RNGs is already in it) and stored as this rank's `rank-XXXXX.pt`.
        """
        self.wait()  # at most one checkpoint in flight, and its failure surfaces here
        t0 = time.perf_counter()
        # A folder per checkpoint, gone once it is uploaded (or fails): nothing outlives a manager
        # that is never closed.
        folder = Path(tempfile.mkdtemp(prefix=f"kftrain-ckpt-rank{self.rank}-step{step:08d}-"))
        try:
            # DCP copies device tensors to these files before it returns: training may go on afterwards.
            dcp.save(
                state,
                storage_writer=FileSystemWriter(str(folder)),
                process_group=self.group,
                no_dist=self.group is None,
            )
            if local is not None:
                torch.save(local(), folder / rank_part(self.rank))
        except BaseException as exc:
            # (Not a stop: Ctrl-C or an exit on a nearly full disk is still what it is.)
            full = "" if isinstance(exc, KeyboardInterrupt | SystemExit) else _staging_full(folder, exc, self.rank)
            shutil.rmtree(folder, ignore_errors=True)
            if full:
                raise CheckpointError(f"checkpoint step {step} not staged: {full}") from exc
            raise
        self.last_step = step
        files = sorted(p for p in folder.iterdir() if p.is_file())
        self.last_stage_seconds = time.perf_counter() - t0
        self.last_bytes = sum(p.stat().st_size for p in files)
        if blocking:
            self._upload(step, folder, files, record)
            return
        self._thread = threading.Thread(
            target=self._upload_guarded, args=(step, folder, files, record), name="ckpt-upload", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the checkpoint in flight is committed (or failed); re-raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"checkpoint upload to {self.prefix} failed: {err}") from err

    def close(self) -> None:
        """Wait for the upload in flight (its local staging folder goes with it)."""
        self.wait()

    def _upload_guarded(self, step: int, folder: Path, files: list[Path], record: dict[str, Any] | None) -> None:
        try:
            self._upload(step, folder, files, record)
        except BaseException as exc:  # surfaced by the next save() or wait()
            self._error = exc

    def _upload(self, step: int, folder: Path, files: list[Path], record: dict[str, Any] | None) -> None:
        t0 = time.perf_counter()
        remote = step_dir(self.prefix, step)
        parts: dict[str, dict[str, Any]] = {}
        error = ""
        problem = ""
        if self.rank == 0:
            try:
                problem = self._may_write(step)
            except StoreError as exc:  # told to every rank below, so none waits for rank 0
                problem = f"cannot check the prefix's owner: {exc}"
        try:
            problem = self._agree(problem)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if problem:
            shutil.rmtree(folder, ignore_errors=True)
            raise CheckpointError(f"checkpoint step {step} not written: {problem}")
        try:
            for path in files:
                ranged = path.name.endswith(_DISTCP)  # the only parts read in ranges
                sha256, blocks = _digests(path, self.block_bytes if ranged else 0)
                self.store.put_file(join_uri(remote, path.name), path)
                parts[path.name] = {"bytes": path.stat().st_size, "sha256": sha256}
                if ranged:
                    parts[path.name].update(block_bytes=self.block_bytes, blocks=blocks)
        except Exception as exc:  # reported to every rank below, so none waits forever
            error = f"rank {self.rank}: {exc}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        reports: list[Any] = [(parts, error)]
        if self.group is not None:
            reports = [None] * self.world_size
            dist.all_gather_object(reports, (parts, error), group=self.group)
        errors = [e for _, e in reports if e]
        if errors:
            raise CheckpointError(f"checkpoint step {step} not committed: {'; '.join(errors)}")
        self.last_upload_seconds = time.perf_counter() - t0
        if self.rank != 0:
            return
        every: dict[str, dict[str, Any]] = {}
        for rank_parts, _ in reports:
            every.update(rank_parts)
        commit = {
            **(record or {}),
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "world_size": self.world_size,
            "owner": self.owner,
            "parts": every,
            "committed_unix_time": time.time(),
        }
        # Ownership again: the prefix may have been taken over while the parts uploaded.
        problem = self._may_write(step)
        if problem or not self.store.put_bytes_if_absent(join_uri(remote, COMMIT), json.dumps(commit).encode()):
            raise CheckpointError(
                f"checkpoint step {step} not committed: {problem or f'another writer committed {remote} first'}"
            )
        log.info("checkpoint step %d committed to %s (%d parts)", step, remote, len(every))
        self._prune()

    def _prune(self) -> None:
        by_step = objects_by_step(self.store, self.prefix)
        complete, others = [], set()
        for s in committed(by_step):
            if self._commit_owner(s) != self.owner:
                others.add(s)  # another run's (an earlier owner's) step: never deleted
            elif complete_record(self.store, self.prefix, s, by_step) is not None:
                complete.append(s)
        if not complete:
            return
        keep = set(complete[-self.keep_last :])
        if self.keep_best is not None:
            # Read from the commit records every time: the best survives restarts of the run.
            best = best_step({s: self._metrics(s) for s in complete}, *self.keep_best)
            if best is not None:
                keep.add(best)
        for step, uris in by_step.items():
            # Older than the newest kept: own complete ones past keep_last, and partials of killed writers.
            if step in keep or step in others or step > complete[-1]:
                continue
            self._delete_step(step, uris)

    def _lost_a_part(self, step: int) -> bool:
        """Whether a part the commit record of `step` lists is absent or of another size, asked of
        each part itself (not of a listing, which a store may return short)."""
        folder = step_dir(self.prefix, step)
        try:
            parts = committed_parts(read_json(self.store, join_uri(folder, COMMIT)))
        except (ObjectNotFound, CorruptObject):
            return False  # no record to trust: not this run's to delete
        for name, part in parts.items():
            try:
                if self.store.size(join_uri(folder, name)) != part["bytes"]:
                    return True
            except ObjectNotFound:
                return True
        return False

    def _delete_step(self, step: int, uris: list[str]) -> None:
        """Delete what a checkpoint wrote of step `step` among its objects `uris`, the commit
        record first (a half-deleted checkpoint never looks complete); anything else stays."""
        ours = [u for u in uris if written_by_a_checkpoint(self.prefix, u)]
        if len(ours) < len(uris):
            kept = sorted(set(uris) - set(ours))
            if ours:  # said once: the step's own objects are gone after this
                log.warning("deleting step %d keeps %d objects no checkpoint writes: %s", step, len(kept), kept[:3])
        for uri in sorted(ours, key=lambda u: not u.endswith(f"/{COMMIT}")):
            self.store.delete(uri)
        drop_empty_folders(self.store, step_dir(self.prefix, step))

    def _metrics(self, step: int) -> dict[str, Any]:
        """The validation metrics a step's commit record holds ({} for none or unreadable)."""
        try:
            record = read_json(self.store, join_uri(step_dir(self.prefix, step), COMMIT))
        except (ObjectNotFound, CorruptObject):
            return {}
        metrics = record.get("metrics") if isinstance(record, dict) else None
        return metrics if isinstance(metrics, dict) else {}

    def best(self, up_to: int | None = None) -> dict[str, Any] | None:
        """The commit record of the complete checkpoint with the best :attr:`keep_best` metric
        (of any run that owned the prefix; at step `up_to` or before when given, or step `up_to`
        alone where a run that never owned the prefix committed it), or None (a collective like
        :meth:`latest`).
        A store that fails rank 0's listing raises :class:`StoreError` on every rank, not on rank 0
        alone while the others wait in the broadcast."""
        choice: dict[str, Any] | None = None
        error = ""
        if self.rank == 0 and self.keep_best is not None:
            try:
                records = dict(prefix_steps(self.store, self.prefix, up_to, strangers=False))
                if (
                    up_to is not None
                    and up_to not in records
                    and (named := latest_complete(self.store, self.prefix, up_to, strangers=True))
                ):  # a lineage that began at a step copied in: that step alone is of it, not the prefix's
                    records = {up_to: named[1]}
            except StoreError as exc:
                error, records = str(exc), {}
            metrics = {s: r.get("metrics") or {} for s, r in records.items()}
            step = best_step(metrics, *self.keep_best)
            choice = None if step is None else records[step]
        if self.group is not None:
            box = [(choice, error)]
            dist.broadcast_object_list(box, src=0, group=self.group)
            choice, error = box[0]
        if error:
            raise StoreError(error)
        return choice

    def _commit_owner(self, step: int) -> str | None:
        """The owner a step's commit record names ("" for none), or None when it cannot be read."""
        try:
            record = read_json(self.store, join_uri(step_dir(self.prefix, step), COMMIT))
        except (ObjectNotFound, CorruptObject):
            return None
        return record.get("owner", "") if isinstance(record, dict) else None

    # -- reading ------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps that have a commit record, ascending (parts not yet verified)."""
        return committed_steps_in(self.store, self.prefix)

    def latest(self, only: int | None = None) -> dict[str, Any] | None:
        """The newest complete checkpoint's commit record, or None (a collective: rank 0 chooses,
        so every rank loads the same one). With `only`, step `only`'s record if it is complete."""
        # The prefix's own runs' steps, but for a reader's named step (resume_from naming a copied one).
        strangers = only is not None and not self.owner
        found = latest_complete(self.store, self.prefix, only, strangers=strangers) if self.rank == 0 else None
        choice = found[1] if found else None
        if self.group is not None:
            box = [choice]
            dist.broadcast_object_list(box, src=0, group=self.group)
            choice = box[0]
        return choice

    def load(self, record: dict[str, Any], state: dict[str, Any]) -> Any | None:
        """Load the checkpoint of `record` into `state` (a DCP state dict, in place; DCP reshards
        to this world size) and return this rank's own part, or None when the checkpoint was
        written by fewer ranks than this one's rank (a collective)."""
        folder = step_dir(self.prefix, int(record["step"]))
        cache = Path(tempfile.mkdtemp(prefix=f"kftrain-resume-rank{self.rank}-"))
        try:
            # Every rank reads what its load plan needs: how much that is, only DCP knows.
            line = ProgressLine(f"resuming: downloading checkpoint {folder}")
            reader = StoreReader(self.store, folder, cache, record["parts"], progress=line)
            dcp.load(state, storage_reader=reader, process_group=self.group, no_dist=self.group is None)
            own = None
            if rank_part(self.rank) in record["parts"]:
                own = torch.load(reader.fetch(rank_part(self.rank)), map_location="cpu", weights_only=True)
            self.last_fetched = list(reader.fetched)
            self.last_fetched_bytes = reader.fetched_bytes
            self.last_step = int(record["step"])
        except StoreError as exc:
            raise CheckpointError(f"cannot read checkpoint {folder}: {exc}") from exc
        except CheckpointException as exc:
            # DCP wraps what read_data raised, with every failed rank's traceback; the reader's
            # own error (this rank's or another's) says in one line which object is wrong.
            ours = [e for e, _ in exc.failures.values() if isinstance(e, (CheckpointError, StoreError))]
            if ours:
                raise CheckpointError(f"cannot read checkpoint {folder}: {ours[0]}") from exc
            # DCP's planner names a tensor of `state` the checkpoint lacks: another model (a
            # changed setting that adds or removes a layer), found only once the load began.
            missing = [m.group(1) for e, _ in exc.failures.values() if (m := _MISSING_KEY.match(str(e)))]
            if not missing:
                raise
            raise CheckpointError(
                "cannot resume: the model built from this config has a tensor the checkpoint lacks "
                f"({missing[0]}), so it is another model (a model.* setting changed that adds or removes a layer; "
                "the 'resuming with a changed' lines name the changes): resume with the settings it was written "
                "with, or start a new run"
            ) from None
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        line.done(f"loaded, this rank read {len(self.last_fetched)} of its parts")
        return own


#: How DCP's default planner names a tensor to load that the checkpoint does not hold.
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (.+?)\.?$")


class StoreReader(FileSystemReader):
    """DCP reader over a local cache that fetches from the store what DCP asks for, the first
    time it asks: ``.metadata`` whole, then of each ``.distcp`` only the blocks this rank's load
    plan reads, each checked against its sha256 in the commit record (whole files against
    their size and sha256)."""

    def __init__(
        self,
        store: ObjectStore,
        folder: str,
        cache: Path,
        parts: dict[str, dict[str, Any]],
        progress: ProgressLine | None = None,
    ) -> None:
        super().__init__(str(cache))
        self._progress = progress  # told of every byte downloaded
        self._store, self._folder, self._cache, self._parts = store, folder, cache, parts
        self._lock = threading.Lock()  # DCP may read from several threads
        self._metadata = None
        self._whole: set[str] = set()  # parts whose local copy is complete and verified
        self._blocks: dict[str, set[int]] = {}  # verified blocks of partly fetched parts
        #: Parts this reader downloaded (whole, or some of their blocks), in that order.
        self.fetched: list[str] = []
        #: Bytes this reader downloaded from the store, whole files and blocks together.
        self.fetched_bytes = 0

    def fetch(self, name: str, ranges: Iterable[tuple[int, int]] | None = None) -> Path:
        """The local copy of part `name`, downloaded and verified on first use.

        With `ranges` ((offset, length) pairs) and block hashes for `name` in the commit record,
        only the blocks holding those ranges are fetched (those not local yet) and the rest of
        the local copy is a hole: read only within the ranges asked for. Otherwise, or without
        `ranges`, the whole file."""
        with self._lock:
            part = self._parts.get(name)
            if part is None:
                raise CheckpointError(f"{join_uri(self._folder, name)} is not listed in the checkpoint's {COMMIT}")
            if name in self._whole:
                return self._cache / name
            if ranges is not None and "blocks" in part:
                return self._fetch_blocks(name, part, ranges)
            return self._fetch_whole(name, part)

    def _fetch_whole(self, name: str, part: dict[str, Any]) -> Path:
        path, tmp = self._cache / name, self._cache / f"{name}.download"
        self._store.get_file(join_uri(self._folder, name), tmp)
        size = tmp.stat().st_size
        self.fetched_bytes += size
        if self._progress is not None:
            self._progress.add(size)
        if size != part["bytes"] or _sha256(tmp) != part["sha256"]:
            raise self._changed(f"{join_uri(self._folder, name)} does not match its size and sha256")
        tmp.rename(path)  # over a partial copy, if any
        self._blocks.pop(name, None)
        self._whole.add(name)
        self._note(name)
        return path

    def _fetch_blocks(self, name: str, part: dict[str, Any], ranges: Iterable[tuple[int, int]]) -> Path:
        path, uri = self._cache / name, join_uri(self._folder, name)
        size, block_bytes, hashes = part["bytes"], part["block_bytes"], part["blocks"]
        have = self._blocks.setdefault(name, set())
        wanted = {i for offset, length in ranges for i in _block_span(offset, length, block_bytes)}
        if max(wanted, default=-1) >= len(hashes):
            raise CheckpointError(f"DCP's index reads past the end of {uri} ({size} bytes in {COMMIT})")
        missing = sorted(wanted - have)
        if not missing and path.exists():
            return path
        with open(path, "r+b" if path.exists() else "w+b") as f:
            f.truncate(size)  # sparse: blocks never fetched take no disk
            for i in missing:
                start, end = i * block_bytes, min((i + 1) * block_bytes, size)
                digest, got = hashlib.sha256(), 0
                # In GETs of at most _GET_BYTES, each written out at once: a reader holds that
                # much of a block, not the block (consolidation's peak is about one tensor).
                for at in range(start, end, _GET_BYTES):
                    data = self._store.get_bytes(uri, at, min(_GET_BYTES, end - at))
                    self.fetched_bytes += len(data)
                    if self._progress is not None:
                        self._progress.add(len(data))
                    digest.update(data)
                    got += len(data)
                    os.pwrite(f.fileno(), data, at)
                    del data  # before the next GET allocates its piece
                    if start + got < min(at + _GET_BYTES, end):
                        break  # the object is shorter than committed
                # A block that fails stays out of `have`: its bytes are never read, only refetched.
                if got != end - start or digest.hexdigest() != hashes[i]:
                    raise self._changed(f"{uri} block {i} (bytes {start}..{end}) does not match its sha256")
                have.add(i)
        if len(have) == len(hashes):
            self._whole.add(name)
            del self._blocks[name]
        self._note(name)
        return path

    def _changed(self, what: str) -> CheckpointError:
        """A part whose bytes are not the committed ones: the step is damaged for good (a retry
        reads the same bytes), so the error says how to go back to the step before it."""
        return CheckpointError(
            f"{what} in {COMMIT}: the checkpoint was changed after it was committed, and is damaged for good; delete "
            f"{self._folder}, and a resume starts from the complete checkpoint before it (from the start where "
            "there is none)"
        )

    def _note(self, name: str) -> None:
        if name not in self.fetched:
            self.fetched.append(name)

    def release(self, name: str) -> None:
        """Delete the local copy of part `name`, whole or partial (fetched again if asked for later)."""
        with self._lock:
            self._whole.discard(name)
            self._blocks.pop(name, None)
            (self._cache / name).unlink(missing_ok=True)

    def read_metadata(self, *args: Any, **kwargs: Any):
        """DCP's index, fetched from the store first and parsed once (every dcp.load asks for it:
        consolidation calls dcp.load once per tensor)."""
        if self._metadata is None:
            self.fetch(METADATA)
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata

    def read_data(self, plan, planner):
        """Fetch the blocks holding what this rank's load plan reads, then read them as
        FileSystemReader does.

        FileSystemReader (torch 2.13) opens each file and, per item, reads through a view of
        ``offset .. offset + length`` of it (``_ReaderView``; stream transforms, when a writer
        used any, apply to that slice only), so the blocks holding those ranges are all it
        needs. Its buffered file object may read ahead past a range into a hole (zeros), but
        the view never hands those bytes on."""
        ranges: dict[str, list[tuple[int, int]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
        for name in sorted(ranges):
            self.fetch(name, ranges[name])
        return super().read_data(plan, planner)


def best_step(metrics: dict[int, dict[str, Any]], direction: str, name: str) -> int | None:
    """The step whose `metrics` hold the best finite value of `name` (`direction` `min` or `max`;
    the earliest of equal ones), or None when no step has it."""
    scored = []
    for step, values in metrics.items():
        value = values.get(name) if isinstance(values, dict) else None
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value == value
            and abs(value) != float("inf")
        ):
            scored.append((value if direction == "min" else -value, step))
    return min(scored)[1] if scored else None


def commit_record(store: ObjectStore, folder: str) -> dict[str, Any]:
    """The commit record of the checkpoint in `folder`; CheckpointError naming it when it is
    missing or lists no parts (the checkpoint was never committed, or the record is damaged)."""
    uri = join_uri(folder, COMMIT)
    try:
        record = read_json(store, uri)
        committed_parts(record)
    except (ObjectNotFound, CorruptObject) as exc:
        raise CheckpointError(f"checkpoint {folder} is not committed ({uri}): {exc}") from exc
    return record
