"""Replica logs followed into the step's log, one thread per container instance.

Each line is written whole with the replica's key as a prefix (`[master-0] ...`,
`[node-0-1] ...`). A container restarted by its restartPolicy, or a pod recreated under the same
name (a new uid), is a new instance and gets a new stream: the old one ended with the old
container. A stream that breaks is reported on one line and never fails the launcher; one that
ends while its container still runs (a load balancer's idle timeout during a quiet evaluation, an
API server restart) is opened again at the next poll, from where it stopped: streams ask for the
kubelet's timestamp on every line, so a re-opened stream skips what was already written.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.launch.retry import describe

#: A line longer than this is written as it comes, in pieces of about this size: output without newlines
#: (a progress bar redrawn with `\r`) was held back whole, and split again on every chunk (quadratic).
MAX_LINE_BYTES = 64 * 1024
#: The kubelet's timestamp before each line of a `timestamps=true` log (RFC 3339, up to nanoseconds).
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")
#: Extra seconds a re-opened stream reaches back (`sinceSeconds`), for the clocks of this launcher
#: and of the node being apart; what it sends twice is skipped by its timestamp.
SINCE_MARGIN_S = 60


@dataclass
class _Instance:
    """One container instance's stream: its current thread, and where it got to."""

    thread: threading.Thread | None = None
    last: tuple[str, int] = ("", 0)  # the last line's timestamp (sortable), and how many lines had it


def _sortable(date: bytes, fraction: bytes | None) -> str:
    """A timestamp that sorts as time does (the kubelet drops a fraction's trailing zeros)."""
    return f"{date.decode()}.{(fraction or b'').decode():0<9}"


class LogStreams:
    """The log streams of one launcher, keyed by container instance (pod uid, restarts)."""

    def __init__(self, log: Callable[[str], None], tail_lines: int = 400) -> None:
        self._log = log
        self._instances: dict[tuple[str, int], _Instance] = {}
        #: The last lines streamed from each pod, by pod name: the evidence of a pod the operator
        #: deleted before the launcher could read its log (cleanPodPolicy Running on Failed).
        self._tails: dict[str, collections.deque[str]] = {}
        self._tail_lines = tail_lines

    def tail(self, pod_name: str) -> list[str]:
        """The last lines streamed from `pod_name` (any of its container instances), oldest first."""
        return list(self._tails.get(pod_name, ()))

    def follow(self, pod: Any, key: str, open_stream: Callable[[int | None], Any]) -> None:
        """Stream `pod`'s current container unless it is streamed already, or again when its stream
        ended while the container runs. `open_stream(since_seconds)` returns the API's unread,
        following log response with timestamps (`stream(n)` chunks, `release_conn()`), from
        `since_seconds` ago when not None; `key` is the replica's name in the prefix."""
        statuses = pod.status.container_statuses or []
        restarts = sum(cs.restart_count or 0 for cs in statuses)
        instance = self._instances.setdefault((pod.metadata.uid or pod.metadata.name, restarts), _Instance())
        since = None
        if instance.thread is not None:
            running = any(cs.state is not None and cs.state.running is not None for cs in statuses)
            if instance.thread.is_alive() or not running:
                return
            if instance.last[0]:
                written = dt.datetime.fromisoformat(instance.last[0][:26]).replace(tzinfo=dt.timezone.utc)
                since = max(1, math.ceil(time.time() - written.timestamp()) + SINCE_MARGIN_S)
        tail = self._tails.setdefault(pod.metadata.name, collections.deque(maxlen=self._tail_lines))

        # What this instance's earlier streams wrote, which a re-opened one sends again: lines
        # stamped before the last one written, and as many stamped the same as were written.
        skip_before, skip_at = instance.last
        skipped_at = 0

        def emit(raw: bytes) -> None:
            nonlocal skipped_at
            stamp = _STAMP.match(raw)
            if stamp:
                raw, when = raw[stamp.end() :], _sortable(stamp[1], stamp[2])
                if when < skip_before or (when == skip_before and skipped_at < skip_at):
                    skipped_at += when == skip_before
                    return
                last, count = instance.last
                instance.last = (when, count + 1 if when == last else 1)
            line = raw.decode("utf-8", "replace")
            tail.append(line)
            self._log(f"[{key}] {line}")

        def run() -> None:
            try:
                resp = open_stream(since)
                buf = b""
                for chunk in resp.stream(4096):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    if len(buf) > MAX_LINE_BYTES:  # output without newlines (a `\r` progress bar)
                        lines.append(buf)
                        buf = b""
                    for raw in lines:
                        emit(raw)
                if buf:
                    emit(buf)
                resp.release_conn()
            except Exception as exc:  # a log stream must never fail the launcher
                self._log(f"[{key}] (log stream ended: {describe(exc)}; it is re-opened while the container runs)")

        instance.thread = threading.Thread(target=run, name=f"logs-{key}", daemon=True)
        instance.thread.start()

    def finish(self, timeout_s: float = 10) -> None:
        """Let the streams drain the ended containers' last lines, for at most `timeout_s` in all."""
        end = time.monotonic() + timeout_s  # real time: threads join in real time, not the API clock
        for instance in list(self._instances.values()):
            if instance.thread is not None:
                instance.thread.join(timeout=max(0.0, end - time.monotonic()))
