"""`hvd.start_timeline` / `hvd.stop_timeline`: a Chrome trace of the collectives, from torch.profiler.

Horovod's timeline is a Chrome-trace file of its operations that the coordinator (rank 0) writes.
Here torch.profiler records this process's ops, the collectives among them (`gloo:all_reduce`,
`nccl:all_reduce`, `c10d::allreduce_`, ...), and rank 0 writes the trace when the timeline stops;
open it in chrome://tracing or Perfetto. Recording costs memory for every op until then.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.profiler import ProfilerActivity, profile

from trainer.horovod import api


class _Recording:
    profiler: profile | None = None
    path: str = ""
    writes: bool = False  # rank 0 writes the file


_recording = _Recording()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline that `stop_timeline` (or `hvd.shutdown`, which also runs at exit)
    writes to `file_path` (on rank 0, which creates the file now, as Horovod does: a path it
    cannot write is a ValueError here, not a trace lost at the end).

    Starting again while recording only changes the file (the first one, still empty, is removed).
    `mark_cycles` is accepted and has no effect (there are no negotiation cycles here)."""
    writes = api.rank() == 0  # Horovod's ValueError before hvd.init()
    path = str(file_path)
    if writes:
        try:
            with open(path, "w"):
                pass
        except OSError as exc:
            raise ValueError(
                f"start_timeline: cannot write {path!r} ({exc.strerror or exc}); give a file in a folder that "
                "exists and this process may write"
            ) from None
        earlier = _recording.path if _recording.profiler is not None and _recording.writes else ""
        with contextlib.suppress(OSError):  # the empty placeholder of a trace now written elsewhere
            if earlier and not os.path.samefile(earlier, path) and os.path.getsize(earlier) == 0:
                os.remove(earlier)
    _recording.path, _recording.writes = path, writes
    if _recording.profiler is None:
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        _recording.profiler = profile(activities=activities)
        _recording.profiler.start()
        api._ON_SHUTDOWN.append(_finish)


def stop_timeline() -> None:
    """Stop recording and write the timeline (rank 0); without a recording, nothing happens."""
    api.rank()
    if _finish in api._ON_SHUTDOWN:
        api._ON_SHUTDOWN.remove(_finish)
    _finish()


def _finish() -> None:
    prof, _recording.profiler = _recording.profiler, None
    if prof is None:
        return
    prof.stop()
    if _recording.writes:
        prof.export_chrome_trace(_recording.path)
