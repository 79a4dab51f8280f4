"""Every thread's Python stack of a running process, on demand: where a hung job waits.

A job stuck in a collective on a lost peer, or on a store that never answers, shows in its log
only that it stopped logging. Every kftrain rank and torchrun agent calls
:func:`print_stacks_on_signals` first thing, so that a fatal signal (a C++ abort, a segfault)
prints every thread's stack before the process dies, and :data:`STACKS_SIGNAL` prints them and
the process goes on. On a cluster, for each pod of the job::

    kubectl exec POD -- python -m trainer.stacks
    kubectl logs POD

The stacks are printed by the interpreter's fault handler, in C, when the signal arrives: a main
thread blocked inside a collective or a socket read prints its stack too.

Only processes that catch the signal are sent it (:func:`catches`): its default action ends a
process, so a rank still importing torch, or a command of the user's, is left alone.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Iterable

#: The signal on which a process prints every thread's stack and goes on.
STACKS_SIGNAL = signal.SIGUSR1


def print_stacks_on_signals() -> None:
    """Make this process print every thread's Python stack to the real stderr (which the
    launcher collects) when a fatal signal kills it, and on :data:`STACKS_SIGNAL`, after which
    it goes on. Without it a rank killed by a C++ abort leaves only C++'s last line ("terminate
    called ...") and its exit code."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=sys.__stderr__, all_threads=True)


def catches(pid: int, sig: int = STACKS_SIGNAL) -> bool:
    """Whether process `pid` has a handler for `sig` (Linux's `SigCgt` mask; False where it cannot
    be read: the process is gone, or this is not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def ask_for_stacks(pids: Iterable[int], gap_s: float = 0.3) -> list[int]:
    """Send :data:`STACKS_SIGNAL` to each of `pids` that catches it, one at a time, `gap_s` apart:
    a torchrun agent and its ranks share one output, and dumps written at once would interleave
    within lines. Return those signalled (not one that is gone, or another user's)."""
    asked = []
    for pid in pids:
        if not catches(pid):
            continue
        if asked:
            time.sleep(gap_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, STACKS_SIGNAL)
            asked.append(pid)
    return asked


#: The entry points that call :func:`print_stacks_on_signals` first thing (a test holds them to it).
ENTRY_MODULES = ("trainer.train", "trainer.torchrun", "trainer.local_probe")


def runs_a_kftrain_module(cmdline: bytes) -> bool:
    """Whether a process's command line (`/proc/PID/cmdline`: NUL-separated) is Python running one
    of :data:`ENTRY_MODULES` (`python [options] -m trainer.train ...`); a script, `-c` code, an
    argument of theirs, or a user's own `trainer` package (`python -m trainer.task`) is not."""
    args = cmdline.rstrip(b"\0").split(b"\0")[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == b"-m" or (arg.startswith(b"-m") and len(arg) > 2):
            module = args[i + 1] if arg == b"-m" and i + 1 < len(args) else arg[2:]
            return module.decode(errors="replace") in ENTRY_MODULES
        if arg in (b"-X", b"-W", b"--check-hash-based-pycs"):
            i += 2  # an option with its value
            continue
        if arg == b"-c" or not arg.startswith(b"-"):
            return False  # `-c` code or a script: whatever follows is its own argument
        i += 1
    return False


def _kftrain_processes() -> list[int]:
    """This machine's (this container's) other processes running a kftrain module."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if runs_a_kftrain_module(f.read()):
                found.append(int(entry))
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.stacks`: ask every kftrain process here for its stacks."""
    import argparse

    argparse.ArgumentParser(
        prog="python -m trainer.stacks",
        description="Ask every kftrain rank and torchrun agent on this machine (in a pod: of this pod) to print its "
        "threads' Python stacks into its log, and go on (SIGUSR1 to each that catches it).",
    ).parse_args(argv)
    if not os.path.isdir("/proc"):
        print("kftrain: error: python -m trainer.stacks needs Linux's /proc", file=sys.stderr)
        return 2
    asked = ask_for_stacks(_kftrain_processes())
    if not asked:
        print(
            "kftrain: no kftrain process here prints its stacks on SIGUSR1 (none is running, or none has started yet)"
        )
        return 1
    print(
        f"kftrain: asked {len(asked)} process(es) ({', '.join(map(str, asked))}) to print their stacks into their log"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
