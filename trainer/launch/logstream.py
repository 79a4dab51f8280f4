"""Replica logs followed into the step's log, one thread per container instance.

Each line is written whole with the replica's key as a prefix (`[master-0] ...`,
`[node-0-1] ...`). A container restarted by its restartPolicy, or a pod recreated under the same
name (a new uid), is a new instance and gets a new stream: the old one ended with the old
container. A stream that breaks is reported on one line and never fails the launcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from trainer.launch.retry import describe

#: A line longer than this is written as it comes, in pieces of about this size: output without newlines
#: (a progress bar redrawn with `\r`) was held back whole, and split again on every chunk (quadratic).
MAX_LINE_BYTES = 64 * 1024


class LogStreams:
    """The log streams of one launcher, keyed by container instance (pod uid, restarts)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._threads: dict[tuple[str, int], threading.Thread] = {}

    def follow(self, pod: Any, key: str, open_stream: Callable[[], Any]) -> None:
        """Stream `pod`'s current container unless it is streamed already. `open_stream()` returns
        the API's unread, following log response (`stream(n)` chunks, `release_conn()`); `key` is
        the replica's name in the prefix."""
        restarts = sum(cs.restart_count or 0 for cs in pod.status.container_statuses or [])
        instance = (pod.metadata.uid or pod.metadata.name, restarts)
        if instance in self._threads:
            return

        def run() -> None:
            try:
                resp = open_stream()
                buf = b""
                for chunk in resp.stream(4096):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    if len(buf) > MAX_LINE_BYTES:  # output without newlines (a `\r` progress bar)
                        lines.append(buf)
                        buf = b""
                    for raw in lines:
                        self._log(f"[{key}] {raw.decode('utf-8', 'replace')}")
                if buf:
                    self._log(f"[{key}] {buf.decode('utf-8', 'replace')}")
                resp.release_conn()
            except Exception as exc:  # a log stream must never fail the launcher
                self._log(f"[{key}] (log stream ended: {describe(exc)})")

        thread = threading.Thread(target=run, name=f"logs-{key}", daemon=True)
        self._threads[instance] = thread
        thread.start()

    def finish(self, timeout_s: float = 10) -> None:
        """Let the streams drain the ended containers' last lines, for at most `timeout_s` in all."""
        end = time.monotonic() + timeout_s  # real time: threads join in real time, not the API clock
        for thread in list(self._threads.values()):
            thread.join(timeout=max(0.0, end - time.monotonic()))
