"""Replica logs followed into the step's log, one thread per container instance.

Each line is written whole with the replica's key as a prefix (`[master-0] ...`,
`[node-0-1] ...`). A container restarted by its restartPolicy, or a pod recreated under the same
name (a new uid), is a new instance and gets a new stream: the old one ended with the old
container. A stream that breaks is reported on one line and never fails the launcher. One that
ends while its container still runs (a load balancer's idle timeout during a quiet evaluation, an
API server restart, or this side's own read timeout on a connection gone silent) is opened again
at the next poll, reaching back to a little before its last line: the streams carry the kubelet's
timestamp on every line, and a line already written (the same timestamp and text) is skipped.
"""

from __future__ import annotations

import collections
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.launch.retry import describe, http_status

try:  # what a stream read past its read timeout raises (the kubernetes client's transport)
    from urllib3.exceptions import TimeoutError as _Urllib3Timeout

    _TIMEOUTS: tuple[type[BaseException], ...] = (_Urllib3Timeout, TimeoutError)
except ImportError:  # pragma: no cover
    _TIMEOUTS = (TimeoutError,)

#: A line longer than this is written as it comes, in pieces of about this size: output without newlines
#: (a progress bar redrawn with `\r`) was held back whole, and split again on every chunk (quadratic).
MAX_LINE_BYTES = 64 * 1024
#: The timestamp the kubelet writes before each line of a `timestamps=true` log: RFC 3339 with
#: nanoseconds, in UTC or in the node's own offset (containerd and CRI-O stamp in local time).
STAMP = re.compile(rb"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) ")
#: The runtimes split a line longer than this into pieces, and the kubelet stamps each piece:
#: a long line carries a timestamp every this many bytes (kubernetes/kubernetes#77603).
RUNTIME_PIECE_BYTES = 16 * 1024
#: How far a re-opened stream reaches back before the last line it received (`sinceSeconds`,
#: on the kubelet's own clock): what it sends twice is skipped by its timestamp and text.
SINCE_MARGIN_S = 5
#: The lines of a container instance remembered (by hash) to skip when its stream is opened again.
SEEN_LINES = 2000
#: What a pod's remembered last lines keep of each line (its failure's evidence): 64 replicas
#: printing long lines must not hold gigabytes in the launcher.
TAIL_LINE_CHARS = 2000


@dataclass
class _Instance:
    """One container instance's stream: its current thread and what it has written."""

    thread: threading.Thread | None = None
    received_at: float | None = None  # time.monotonic() of the last line received
    seen: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=SEEN_LINES))  # hashes
    said_ended: bool = False  # an unexpected end was reported once; later ones are not
    final: bool = False  # access to the log refused (403 on pods/log): not opened again
    drained: bool = False  # read once more after the container ended: its stream may have ended first


def _without_stamps(line: bytes) -> tuple[bytes, bytes]:
    """(the leading timestamp, the line without it and without the stamps the kubelet put inside
    a long line at each runtime piece's start); no stamp: (b"", line)."""
    lead = STAMP.match(line)
    if not lead:
        return b"", line
    text, at = line[lead.end() :], RUNTIME_PIECE_BYTES
    while len(text) > at and (inner := STAMP.match(text, at)):
        text = text[:at] + text[inner.end() :]
        at += RUNTIME_PIECE_BYTES
    return lead[1], text


def _container_status(pod: Any, container: str) -> Any:
    return next((cs for cs in pod.status.container_statuses or [] if cs.name == container), None)


class LogStreams:
    """The log streams of one launcher, keyed by container instance (pod uid, restarts)."""

    def __init__(self, log: Callable[[str], None], tail_lines: int = 400) -> None:
        self._log = log
        self._instances: dict[tuple[str, int], _Instance] = {}
        #: The last lines streamed from each pod, by pod uid: the evidence of a pod the operator
        #: deleted before the launcher could read its log (cleanPodPolicy Running on Failed).
        self._tails: dict[str, collections.deque[str]] = {}
        self._tail_lines = tail_lines

    def tail(self, pod: Any) -> list[str]:
        """The last lines streamed from `pod` (any of its container instances), oldest first."""
        return list(self._tails.get(pod.metadata.uid or pod.metadata.name, ()))

    def follow(self, pod: Any, key: str, container: str, open_stream: Callable[[int | None], Any]) -> None:
        """Stream `pod`'s `container` unless it is streamed already, or again when its stream
        ended while the container runs. `open_stream(since_seconds)` returns the API's unread,
        following log response with timestamps (`stream(n)` chunks, `release_conn()`), from
        `since_seconds` ago when not None; `key` is the replica's name in the prefix."""
        status = _container_status(pod, container)
        restarts = (status.restart_count or 0) if status is not None else 0
        instance = self._instances.setdefault((pod.metadata.uid or pod.metadata.name, restarts), _Instance())
        since = None
        if instance.thread is not None:
            running = status is not None and status.state is not None and status.state.running is not None
            if instance.thread.is_alive() or instance.final or (instance.drained and not running):
                return
            # An ended container's stream is read once more, from its last line on: a stream cut
            # while it ran, the container then ending before the next poll, lost its last lines
            # (a quiet evaluation's results, the final digest); the lines already written are skipped.
            instance.drained = not running
            if instance.received_at is not None:
                since = math.ceil(time.monotonic() - instance.received_at) + SINCE_MARGIN_S
        tail = self._tails.setdefault(pod.metadata.uid or pod.metadata.name, collections.deque(maxlen=self._tail_lines))
        seen = set(instance.seen)  # what earlier streams of this instance wrote

        repeated = [False]  # the last stamped line was written already: so are its unstamped pieces

        def emit(raw: bytes) -> None:
            stamp, text = _without_stamps(raw)
            if stamp:
                instance.received_at = time.monotonic()
                written = hash((stamp, text))  # the line's identity, without keeping the line
                repeated[0] = written in seen
                if repeated[0]:
                    return
                instance.seen.append(written)
            elif repeated[0]:  # the rest of a long line cut into pieces, only the first stamped
                return
            line = text.decode("utf-8", "replace")
            tail.append(line[:TAIL_LINE_CHARS])
            self._log(f"[{key}] {line}")

        def run() -> None:
            try:
                resp = open_stream(since)
                try:
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
                finally:
                    resp.release_conn()
            except Exception as exc:  # a log stream must never fail the launcher
                self._ended(instance, key, exc)

        instance.thread = threading.Thread(target=run, name=f"logs-{key}", daemon=True)
        instance.thread.start()

    def _ended(self, instance: _Instance, key: str, exc: Exception) -> None:
        """Say once how a stream broke: a refusal of access (401, 403) ends it for good; a read
        timeout (a silent connection) is opened again without a word; anything else (a 400 for a
        container still starting, a reset) is opened again while the container runs."""
        if http_status(exc) in (401, 403):
            instance.final = True
            self._log(f"[{key}] (log stream refused: {describe(exc)}; the replica's log is not followed)")
        elif instance.drained and http_status(exc) in (400, 404):
            pass  # the last read of an ended container whose pod (or log) is gone already: nothing lost to say
        elif not isinstance(exc, _TIMEOUTS) and not instance.said_ended:
            instance.said_ended = True
            self._log(f"[{key}] (log stream ended: {describe(exc)}; it is opened again while the container runs)")

    def finish(self, timeout_s: float = 10) -> None:
        """Let the streams drain the ended containers' last lines, for at most `timeout_s` in all."""
        end = time.monotonic() + timeout_s  # real time: threads join in real time, not the API clock
        for instance in list(self._instances.values()):
            if instance.thread is not None:
                instance.thread.join(timeout=max(0.0, end - time.monotonic()))
