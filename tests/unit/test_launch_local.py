"""The local backend in one process: log lines streamed from many threads stay whole."""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.timeout(120)


def test_log_lines_streamed_from_many_threads_stay_whole(capsys):
    """Each replica's log is pumped by its own thread (both backends' default sink): lines must
    never fuse, or a user's output parsing (and ours) sees two replicas' lines as one."""
    from trainer.launch.backend import print_line

    lines = {f"[replica-{t}] line {i} " + "x" * (i % 50) for t in range(8) for i in range(400)}
    by_thread = [sorted(line for line in lines if line.startswith(f"[replica-{t}]")) for t in range(8)]
    threads = [threading.Thread(target=lambda ls=ls: [print_line(line) for line in ls]) for ls in by_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(capsys.readouterr().out.splitlines()) == sorted(lines)
