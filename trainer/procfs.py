"""This machine's processes as Linux's /proc tells them: whether one still runs, and who started
it. Where there is no /proc, nothing is known (None)."""

from __future__ import annotations

import os


def stat_of(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of /proc/PID/stat: state, parent pid, ..., start time
    at index 19; None where there is no such process."""
    return _stat(f"/proc/{pid}/stat")


def _stat(path: str) -> tuple[str, list[str]] | None:
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    name_end = stat.rindex(")")  # the name may hold ')' and spaces: it ends at the last one
    fields = stat[name_end + 1 :].split()
    return (stat[stat.index("(") + 1 : name_end], fields) if len(fields) > 19 else None


def thread_states() -> list[tuple[str, str]]:
    """(name, state) of each thread of this process (`S`: asleep, waiting; `R`: running or ready
    to; ...); [] where there is no /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    found = (_stat(f"/proc/self/task/{tid}/stat") for tid in tids)
    return [(name, fields[0]) for name, fields in filter(None, found)]  # a thread gone meanwhile: None


def started_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (which tells it from a later process
    given the same pid); None where it is not running: none such, or ended (a zombie its parent has
    not reaped yet)."""
    found = stat_of(pid)
    if found is None or found[1][0] in "ZX":
        return None
    return int(found[1][19])


def parent_of(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of process `pid`; None where there is no such process."""
    found = stat_of(pid)
    return None if found is None else (found[0], int(found[1][1]))
