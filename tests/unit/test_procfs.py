"""trainer/procfs.py: this machine's processes as /proc tells them."""

from __future__ import annotations

import os

from trainer import procfs


def test_this_process_is_running_and_its_parent_is_named():
    name, parent = procfs.parent_of(os.getpid())
    assert parent == os.getppid() and name  # the command name, e.g. `python`
    assert isinstance(procfs.started_ticks(os.getpid()), int)


def test_no_such_process_is_none():
    assert procfs.stat_of(2**22 + 7) is None  # past Linux's largest pid
    assert procfs.started_ticks(2**22 + 7) is None and procfs.parent_of(2**22 + 7) is None


def test_a_name_holding_spaces_and_parentheses_is_read_whole(monkeypatch, tmp_path):
    """The name ends at the last ')': a process may call itself anything (`prctl`, `exec -a`)."""
    fields = ["Z", "42", *(["0"] * 17), "12345", "0"]  # state, parent pid, ..., start time at 19
    stat = tmp_path / "stat"
    stat.write_text(f"7 (my (odd) name) {' '.join(fields)}\n")
    real_open = open
    monkeypatch.setattr(
        "builtins.open", lambda path, *a, **k: real_open(stat if path == "/proc/7/stat" else path, *a, **k)
    )
    assert procfs.stat_of(7) == ("my (odd) name", fields)
    assert procfs.parent_of(7) == ("my (odd) name", 42)
    assert procfs.started_ticks(7) is None  # a zombie has ended: its parent has not reaped it yet


def test_this_process_s_threads_are_each_named_with_their_state():
    import threading

    asleep = threading.Event()
    waiter = threading.Thread(target=asleep.wait, name="waits")
    waiter.start()
    try:
        states = procfs.thread_states()
        assert len(states) >= 2 and all(len(state) == 1 for _, state in states)
        assert "S" in {state for _, state in states}  # the waiting thread
    finally:
        asleep.set()
        waiter.join()
