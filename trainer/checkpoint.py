"""Checkpoints in the object store that become visible only when complete.

Layout under the checkpoint prefix::

    step-00000120/state.pt      model, optimizer, LR scheduler, position, RNG states, config
    step-00000120/COMMIT.json   written last: step, and size + sha256 of every part

A checkpoint without a valid COMMIT.json (a writer killed mid-upload) is never chosen as
latest. Saving stages the state to host memory on the calling thread (the only part that
stalls training) and uploads it on a background thread, one upload in flight at a time.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import logging
import re
import threading
import time
from typing import Any

import torch

from trainer.storage import CorruptObject, ObjectNotFound, ObjectStore, join_uri, read_json

STATE = "state.pt"
COMMIT = "COMMIT.json"
_STEP_DIR = re.compile(r"/step-(\d{8})/")
log = logging.getLogger("kftrain.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and why."""


def step_dir(prefix: str, step: int) -> str:
    """The folder of the checkpoint taken after optimizer step `step`."""
    return join_uri(prefix, f"step-{step:08d}")


class CheckpointManager:
    """Save (asynchronously), find the latest complete checkpoint, load it, prune old ones."""

    def __init__(self, store: ObjectStore, prefix: str, keep_last: int = 2) -> None:
        self.store, self.prefix, self.keep_last = store, prefix.rstrip("/"), keep_last
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_stage_seconds = 0.0
        self.last_upload_seconds = 0.0
        self.last_bytes = 0

    # -- writing ------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any], blocking: bool = False) -> None:
        """Stage `state` to host memory now; upload it in the background (or now, if `blocking`)."""
        self.wait()  # at most one upload in flight, and its failure surfaces here
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save(state, buf)  # copies device tensors to host memory: training may go on afterwards
        payload = buf.getvalue()
        self.last_stage_seconds = time.perf_counter() - t0
        self.last_bytes = len(payload)
        if blocking:
            self._upload(step, payload)
            return
        self._thread = threading.Thread(
            target=self._upload_guarded, args=(step, payload), name="ckpt-upload", daemon=True
        )
        self._thread.start()

    def wait(self) -> None:
        """Block until the upload in flight is committed; re-raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise CheckpointError(f"checkpoint upload to {self.prefix} failed: {err}") from err

    def _upload_guarded(self, step: int, payload: bytes) -> None:
        try:
            self._upload(step, payload)
        except BaseException as exc:  # surfaced by the next save() or wait()
            self._error = exc

    def _upload(self, step: int, payload: bytes) -> None:
        t0 = time.perf_counter()
        folder = step_dir(self.prefix, step)
        # Hash while the bytes go out: hashlib releases the GIL, so the checksum costs no upload time.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            digest = pool.submit(lambda: hashlib.sha256(payload).hexdigest())
            self.store.put_bytes(join_uri(folder, STATE), payload)
            sha256 = digest.result()
        record = {
            "step": step,
            "parts": {STATE: {"bytes": len(payload), "sha256": sha256}},
            "committed_unix_time": time.time(),
        }
        self.store.put_bytes(join_uri(folder, COMMIT), json.dumps(record).encode())
        self.last_upload_seconds = time.perf_counter() - t0
        log.info("checkpoint step %d committed to %s (%.1f MB)", step, folder, len(payload) / 1e6)
        self._prune()

    def _objects_by_step(self) -> dict[int, list[str]]:
        by_step: dict[int, list[str]] = {}
        for uri in self.store.list(self.prefix):
            m = _STEP_DIR.search(uri[len(self.prefix) :])
            if m:
                by_step.setdefault(int(m.group(1)), []).append(uri)
        return by_step

    @staticmethod
    def _committed(by_step: dict[int, list[str]]) -> list[int]:
        return sorted(s for s, uris in by_step.items() if any(u.endswith(f"/{COMMIT}") for u in uris))

    def _prune(self) -> None:
        by_step = self._objects_by_step()
        committed = self._committed(by_step)
        keep = set(committed[-self.keep_last :])
        for step, uris in by_step.items():
            # Older than the newest kept: committed ones past keep_last, and partials of killed writers.
            if step in keep or step > committed[-1]:
                continue
            # The commit record goes first: a half-deleted checkpoint never looks complete.
            for uri in sorted(uris, key=lambda u: not u.endswith(f"/{COMMIT}")):
                self.store.delete(uri)

    # -- reading ------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        """Steps that have a commit record, ascending (parts not yet verified)."""
        return self._committed(self._objects_by_step())

    def load_latest(self) -> dict[str, Any] | None:
        """The newest complete, verified checkpoint's state, or None when there is none."""
        for step in reversed(self.committed_steps()):
            folder = step_dir(self.prefix, step)
            try:
                record = read_json(self.store, join_uri(folder, COMMIT))
                part = _committed_part(record, STATE)
                payload = self.store.get_bytes(join_uri(folder, STATE))
            except (ObjectNotFound, CorruptObject) as exc:
                log.warning("skipping checkpoint %s (incomplete): %s", folder, exc)
                continue
            if len(payload) != part["bytes"] or hashlib.sha256(payload).hexdigest() != part["sha256"]:
                log.warning("skipping checkpoint %s: %s does not match its commit record", folder, STATE)
                continue
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
            log.info("resuming from checkpoint %s", folder)
            return state
        return None


def _committed_part(record: Any, name: str) -> dict[str, Any]:
    """The size and hash a commit record holds for part `name`; CorruptObject when it has none."""
    part = record.get("parts", {}).get(name) if isinstance(record, dict) else None
    if not (isinstance(part, dict) and isinstance(part.get("bytes"), int) and isinstance(part.get("sha256"), str)):
        raise CorruptObject(f"{COMMIT} has no size and sha256 for {name} under 'parts'")
    return part
