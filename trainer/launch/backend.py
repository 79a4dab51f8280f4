"""The job backend interface (submit / wait / logs / cancel) and the one way to run a job."""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Protocol

from trainer.errors import REPLICA_FAILURE, KftrainError, one_line
from trainer.launch.failures import before_torchrun_summary, root_cause_exit_code
from trainer.launch.spec import JobSpec

_stdout_lock = threading.Lock()


def print_line(line: str) -> None:
    """Write one log line to stdout whole. Backends stream every replica's log from its own
    thread; `print` writes the text and the newline separately, so two threads printing at once
    can fuse two replicas' lines into one."""
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class JobFailed(KftrainError, RuntimeError):
    """The job ended Failed, timed out or was cancelled; the message carries the evidence."""


class JobTimeout(JobFailed):
    """The job did not finish within its wall-clock deadline (it has been cancelled)."""


class JobCancelled(JobFailed):
    """The launcher was asked to stop (SIGTERM, Ctrl-C); the job has been cancelled."""


#: How the trainer reports a failure it understands (bad data, a store outage, a diverged run):
#: one line, where a traceback would bury the cause under torchrun's summary.
FAILURE_MARKER = REPLICA_FAILURE


def failure_excerpt(lines: list[str], tail: int = 15, traceback_lines: int = 25) -> list[str]:
    """What explains a failed replica: the trainer's own failure lines (:data:`FAILURE_MARKER`)
    or else the end of the last training-process traceback (torchrun prefixes those lines
    `[rankN]:`), followed by the replica's last log lines; or else the last lines the processes
    printed before torchrun's failure summary, and the exit code of the first to fail."""
    reported = list(dict.fromkeys(line for line in lines if FAILURE_MARKER in line))[-4:]
    if reported:
        return [*reported, "...", *[line for line in lines[-tail:] if line not in reported]]
    starts = [i for i, line in enumerate(lines) if re.match(r"^\[rank\d+\]:\s*Traceback", line)]
    if not starts:  # no Python traceback (a signal, a C++ abort): what the processes printed
        before = before_torchrun_summary(lines)
        if len(before) == len(lines):
            return lines[-tail:]
        code = root_cause_exit_code(lines)  # all torchrun's report says: which process died, and how
        return [
            *before[-tail:],
            "...",
            f"torchrun: {'a process failed' if code is None else f'the first process to fail exited with {code}'}",
        ]
    prefix = lines[starts[-1]].split(":", 1)[0] + ":"
    block = [line for line in lines[starts[-1] :] if line.startswith(prefix)]
    if len(block) > traceback_lines:
        block = [block[0], "  ...", *block[-traceback_lines:]]
    rest = [line for line in lines[-tail:] if line not in block]
    return [*block, "...", *rest]


class JobBackend(Protocol):
    """Runs a :class:`JobSpec` somewhere: local processes, or a PyTorchJob on Kubernetes."""

    def submit(self, spec: JobSpec) -> None:
        """Start the job (re-attach if a job of that name already runs)."""

    def wait(self, spec: JobSpec) -> None:
        """Block until the job succeeds; raise :class:`JobFailed`, or :class:`JobTimeout` past
        `spec.timeout_s`."""

    def logs(self, spec: JobSpec, tail: int = 50) -> dict[str, list[str]]:
        """The last `tail` log lines of each replica, keyed like ``master-0``, ``worker-1``."""

    def cancel(self, spec: JobSpec) -> None:
        """Stop the job and free its resources; safe to call more than once."""


class _Terminated(BaseException):
    """SIGTERM (or SIGHUP: a local run's terminal closing) reached the launcher. A BaseException,
    as KeyboardInterrupt is: the backends catch `Exception` where a failed API call is evidence,
    not the answer (events, a log tail), and a cancellation caught there was lost: the launcher
    re-created the job and went on waiting. :func:`run_job` turns it into :class:`JobCancelled`
    once the job is deleted."""


class _Cleanup:
    """Whether :func:`run_job` is deleting the job: a SIGTERM then must not interrupt it."""

    started = False


@contextlib.contextmanager
def _signals_raise() -> Iterator[_Cleanup]:
    """Turn SIGTERM (pod deletion, run cancel) into an exception so cleanup runs, and Ctrl-C into
    KeyboardInterrupt as Python does; once cleanup has started (`.started` of what it yields), a
    signal of either kind is left to it: the job is deleted and its last lines passed on. (A
    terminal's Ctrl-C reaches the whole process group, and `kftrain run --local` then stops the
    step too: the second signal interrupted the cancel, and the ranks' last lines were lost.)"""
    cleanup = _Cleanup()
    if threading.current_thread() is not threading.main_thread():
        yield cleanup
        return

    def handler(signum: int, frame: object) -> None:
        if not cleanup.started:
            cleanup.started = True
            raise KeyboardInterrupt if signum == signal.SIGINT else _Terminated(signum)

    signals = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
        signals.append(signal.SIGINT)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # a terminal closing, as SIGTERM (not under nohup)
        signals.append(signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield cleanup
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_job(backend: JobBackend, spec: JobSpec) -> None:
    """Submit, wait (at most `spec.timeout_s`), and cancel the job on any way out that is not success.

    The backend decides what is final: transient API errors are retried inside it, so whatever
    reaches this point fails the step. If cancelling fails too, the original error is still the
    one raised (the cancel failure is added as a note): it says why the step failed.
    """
    with _signals_raise() as cleanup:
        try:
            backend.submit(spec)
            backend.wait(spec)
        except BaseException as exc:
            cleanup.started = True
            try:
                backend.cancel(spec)
            except Exception as cancel_exc:
                exc.add_note(
                    f"cancelling the job failed too, so it may still run: delete it by hand ({one_line(cancel_exc)})"
                )
            if isinstance(exc, _Terminated):
                cancelled = JobCancelled(f"launcher received {signal.Signals(exc.args[0]).name}; job cancelled")
                cancelled.__notes__ = getattr(exc, "__notes__", [])
                raise cancelled from None
            raise
