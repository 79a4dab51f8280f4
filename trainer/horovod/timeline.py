"""`hvd.start_timeline` / `hvd.stop_timeline`: a Chrome trace of the collectives, from torch.profiler.

Horovod's timeline is a Chrome-trace file of its operations that the coordinator (rank 0) writes.
Here torch.profiler records this process's ops, the collectives among them (`gloo:all_reduce`,
`nccl:all_reduce`, `c10d::allreduce_`, ...), and rank 0 writes the trace when the timeline stops;
open it in chrome://tracing or Perfetto. Recording costs memory for every op until then.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from trainer.horovod import api


class _Recording:
    profiler: profile | None = None
    path: str = ""


_recording = _Recording()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording a timeline that `stop_timeline` writes to `file_path` (on rank 0).

    Starting again while recording only changes the file. `mark_cycles` is accepted and has no
    effect (there are no negotiation cycles here)."""
    api.rank()  # Horovod's ValueError before hvd.init()
    _recording.path = str(file_path)
    if _recording.profiler is None:
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        _recording.profiler = profile(activities=activities)
        _recording.profiler.start()


def stop_timeline() -> None:
    """Stop recording and write the timeline (rank 0); without a recording, nothing happens."""
    api.rank()
    prof, _recording.profiler = _recording.profiler, None
    if prof is None:
        return
    prof.stop()
    if api.rank() == 0:
        prof.export_chrome_trace(_recording.path)
