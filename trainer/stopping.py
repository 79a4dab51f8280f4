"""Stopping a run at an optimizer-step boundary when the process is told to stop.

A preempted or evicted pod gets SIGTERM, then SIGKILL after its grace period
(`kubernetes.termination_grace_seconds`); Ctrl-C locally is SIGINT. The handler only records
the signal: the training loop asks :meth:`StopSignal.agreed` at each step boundary, every rank
learns whether any rank was signalled (one all-reduce of one integer, MAX, on a gloo group of
its own), so all of them stop after the same step, commit a checkpoint of it and exit with
:data:`trainer.exit_codes.TERMINATED_CHECKPOINTED`.

The agreement is one asynchronous CPU all-reduce per step, started at one step boundary and read
at the next, so its latency (about 0.3 ms on one loaded machine, a network round trip across
nodes) hides behind the step, and it never waits for the GPU; the price is that the ranks stop
one step after the signal. It runs on a gloo group of its own because the checkpoint upload
thread uses the checkpoint group at the same time.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

from trainer.exit_codes import TERMINATED_CHECKPOINTED

#: How a rank names what stopped it when another rank received the signal (the local launcher
#: tells such a rank from the one signalled: trainer/launch/local.py).
STOPPED_BY_PEER = "a signal to another rank"

if TYPE_CHECKING:  # the launcher reads GRACE_ENV from here without importing torch
    import torch.distributed as dist

#: The signals that stop a run at the next step boundary: the kubelet's (and torchrun's) SIGTERM,
#: and Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: The variable through which the launcher tells the trainer the pod's grace period (seconds).
GRACE_ENV = "KFTRAIN_TERMINATION_GRACE_SECONDS"


class Terminated(BaseException):
    """The run stopped on a signal; `exit_code` is what the process exits with. A BaseException,
    as KeyboardInterrupt is: raised by a signal anywhere (:func:`stop_while_starting`), it must
    not be caught and wrapped by an `except Exception` of the code it interrupts (a store
    request's retry, a download) and come out as a failure of that code."""

    def __init__(self, message: str, exit_code: int = TERMINATED_CHECKPOINTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopSignal:
    """Records the first stop signal this process receives, and agrees with the other ranks on it.

    `group` is the process group of :meth:`agreed` (None for one process); the handlers are
    installed only while :meth:`installed` is active (the training loop, the final model's
    writing included); before it :func:`stop_while_starting` ends the process at once, and after
    it a signal is ignored.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.group = group
        self.signals = signals
        #: The first signal received (None: none yet).
        self.signum: int | None = None
        #: `time.monotonic()` when it came, or when this rank learnt another rank had one.
        self.since: float | None = None
        self._pending: tuple[Any, Any] | None = None

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        """The signal handler: record the first signal and its time, nothing else (it may run
        between any two bytecodes of the training step)."""
        if self.signum is None:
            self.signum, self.since = signum, time.monotonic()

    @property
    def requested(self) -> bool:
        """Whether this process received a stop signal."""
        return self.signum is not None

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Install the handlers for the duration of the block, then restore the previous ones.
        Python lets only the main thread install handlers: elsewhere this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self.handle) for sig in self.signals}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                if isinstance(handler, _OutsideTheLoop):
                    # The loop is over (finished, stopped or failed): a signal now (a later copy
                    # of the one it stopped on: torchrun passes the pod's on to each rank) must
                    # not break the group's teardown or replace the loop's own outcome.
                    handler.stopping = True
                signal.signal(sig, handler)

    def agreed(self) -> bool:
        """Whether any rank had received a stop signal by the previous call: every rank calls it at
        each step boundary (a collective) and gets the same answer at the same call.

        The all-reduce started here is read at the next call, so it runs while the step does and
        the call hardly ever waits; a stop comes one step later than the signal for it.
        """
        if self.group is None:
            return self.requested
        import torch
        import torch.distributed as dist

        stop = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = bool(flag.item())
            self._pending = None
        if stop:
            if self.since is None:
                self.since = time.monotonic()  # another rank got the signal
            return True
        flag = torch.tensor([int(self.requested)], dtype=torch.int32)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag)
        return False

    def drain(self) -> None:
        """Wait for the all-reduce in flight (every rank has one when none stopped), so the group
        can be torn down."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None

    def name(self) -> str:
        """The signal's name (`SIGTERM`), or what stopped this rank when another rank got it."""
        return signal.Signals(self.signum).name if self.signum is not None else STOPPED_BY_PEER

    def seconds_since(self) -> float:
        """Seconds since the signal (0 before any)."""
        return time.monotonic() - self.since if self.since is not None else 0.0


class _OutsideTheLoop:
    """:func:`stop_while_starting`'s handler: the first stop signal raises :class:`Terminated`,
    until the training loop has run (`stopping`: what follows it is its outcome's teardown)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.stopping = False

    def __call__(self, signum: int, frame: FrameType | None = None) -> None:
        if self.received or self.stopping:
            return
        self.received.append(signum)
        raise Terminated(f"stopped by {signal.Signals(signum).name} outside the training loop")


@contextlib.contextmanager
def stop_while_starting(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[list[int]]:
    """For the block, a stop signal before the training loop (which takes the signals over with
    :meth:`StopSignal.installed`, and ignores them after it) ends this process at once by
    :class:`Terminated` (exit 143, one line): while the process group forms, a checkpoint
    downloads, the data opens. SIGTERM's default death there left the peers a collective's
    traceback. Nothing of the start is lost: a rerun resumes from the newest committed
    checkpoint. Yields the signals received (the first one); only the main thread can install
    handlers (elsewhere: none)."""
    handle = _OutsideTheLoop()
    if threading.current_thread() is not threading.main_thread():
        yield handle.received
        return
    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield handle.received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def grace_warning(grace_s: float, stage_s: float, commit_s: float) -> str:
    """The warning rank 0 logs when a checkpoint measured at `stage_s` + `commit_s` seconds would
    not be committed within a grace period of `grace_s` seconds ("" when it fits or no grace is
    known)."""
    needed = stage_s + commit_s
    if grace_s <= 0 or needed <= grace_s:
        return ""
    return (
        f"the last checkpoint took {needed:.1f}s to stage and commit ({stage_s:.1f}s + {commit_s:.1f}s), more than "
        f"the pod's termination grace period of {grace_s:.0f}s: a preempted pod would be killed before its "
        "checkpoint commits and lose the steps since the previous one; raise kubernetes.termination_grace_seconds"
    )
