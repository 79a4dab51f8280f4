"""What `kftrain run --local` shows on the terminal, and the full log it keeps of the run.

kfp.local writes everything to ``sys.stdout``: its own records (a root logging handler on
``sys.stdout``, set up afresh around each task by ``kfp.local.logging_utils.local_logger_context``)
and each step's subprocess output, printed line by line, indented by four spaces, including the
executor input (the whole config, once per step). So while the pipeline runs ``sys.stdout`` is a
:class:`StepConsole`: every line goes to the full log file, and the terminal gets one line when a
step starts and one when it ends (with its duration), the replicas' lines (a traceback's frames and
torchrun's report of a failed process only in the log), and the step's own log records except kfp's
bookkeeping (progress lines, warnings); with `verbose`, everything as kfp.local wrote it. A terminal
that closes (`| head`) is left alone: the run goes on, its full log complete. When a step fails
with a kftrain error, its one line (``kftrain-error: <step>: ...``,
:mod:`trainer.errors`) stays in :attr:`failure_line` for the CLI to end with, and its traceback only
in the log; when it fails otherwise (a bug), the last lines of its output that the terminal has not
shown (its error, without traceback frames) go to the terminal's stderr and stay in
:attr:`failure_tail`. Every line is redacted (:func:`trainer.errors.redact`) on its way to the log
and the terminal: kfp.local prints the whole config, endpoints included.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from trainer.errors import parse_error_line, redact
from trainer.progress import format_seconds

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: A record of kfp.local's own logger (MillisecondFormatter: `%H:%M:%S.mmm - LEVEL - message`).
_KFP_RECORD = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} - (?P<level>[A-Z]+) - (?P<msg>.*)$")
_STEP_START = re.compile(r"^Executing task '(?P<task>[^']+)'$")
_STEP_END = re.compile(r"^Task '(?P<task>[^']+)' finished with status (?P<status>[A-Z]+)$")
#: kfp.local records the terminal does not need: the run's own start and end lines say as much.
_KFP_QUIET = re.compile(r"^(Running pipeline|Streamed logs|Pipeline '|Task '[^']+' (outputs:|has no outputs))")
#: A log record inside a step (kfp's executor_main configures the root logger so).
_STEP_RECORD = re.compile(r"^\[KFP Executor [^\]]* (?P<level>[A-Z]+)\]: (?P<msg>.*)$")
_STEP_BOOKKEEPING = ("Looking for component", "Loading KFP component", "Got executor_input", "Wrote executor output")
#: A training replica's line: `[master-0] [rank 0] ...`, `[worker-1] ...`, `[node-0-0] ...`.
_REPLICA = re.compile(r"^\[[a-z][a-z0-9]*(?:-\d+)+\] ")
#: The prefix torch's elastic agent puts on a worker's stderr lines.
_TORCH_RANK = re.compile(r"^(\[rank\d+\]):\s?")
#: torchrun's own record (glog style), e.g. of the SIGTERM it passes on to its processes.
_TORCHRUN_RECORD = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \S*torch/distributed/")
#: The line that ends a traceback: the exception's (dotted) class name, then `: message` or nothing.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s|:?$)")
#: What joins two tracebacks of one chain of exceptions.
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
#: The exception torchrun's agent raises when a training process failed; its report follows.
_TORCHRUN_REPORT = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
#: kfp.local indents a step's output by this much.
_STEP_INDENT = "    "
TAIL_LINES = 8
#: A traceback's last line that is the operating system's answer about a file (`[Errno N]`): a
#: file in the way, a folder gone, a permission, a full disk, a path too long. Raised before a step's own code
#: runs (kfp's executor makes the output folders), it is this machine's to fix, not a bug.
_OS_ERROR = re.compile(
    r"^(?:FileExistsError|FileNotFoundError|PermissionError|NotADirectoryError|IsADirectoryError|OSError)"
    r": \[Errno (\d+)\] "
)
#: The errors of `_OS_ERROR` that are about files (not memory, descriptors or sockets).
_FILE_ERRNOS = frozenset(
    {errno.EEXIST, errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR, errno.ENOSPC}
    | {errno.EROFS, errno.EDQUOT, errno.ENAMETOOLONG, errno.ELOOP, errno.EIO, errno.EFBIG}
)
#: A step's last line when a resource of the machine ran out (memory, threads, processes, open
#: files), or a limit on it did: Python's own words for each.
#: (Not EAGAIN, which a busy non-blocking lock or pipe gives too: a bug's, as likely.)
_RESOURCE_ERROR = re.compile(
    r"^(?:MemoryError\b|numpy\.[\w.]*\._ArrayMemoryError\b|RuntimeError: can't start new thread"
    rf"|OSError: \[Errno (?:{errno.ENOMEM}|{errno.EMFILE}|{errno.ENFILE})\] )"
)
_TAIL_CHARS = 500


def _shows_colours(stream: TextIO) -> bool:
    """Whether `stream` is a terminal and colours are wanted (no `NO_COLOR`, `TERM` not dumb)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def plain(text: str) -> str:
    """`text` without terminal colour codes (kfp.local colours task names and statuses)."""
    return _ANSI.sub("", text)


class StepConsole(io.TextIOBase):
    """A stand-in for ``sys.stdout`` during a kfp.local run (see the module docstring).

    `open_log` opens the full log on the first line written (so a run stopped before its first
    step leaves no log); it receives every line, colour codes removed. `out` and `err` are the
    terminal."""

    def __init__(self, open_log: Callable[[], TextIO], out: TextIO, err: TextIO, verbose: bool = False) -> None:
        self._open_log, self.out, self.err, self.verbose = open_log, out, err, verbose
        #: The full log, once anything was written.
        self.log: TextIO | None = None
        self._lock = threading.RLock()  # a signal handler (run_scope) may print while a write holds it
        self._partial = ""
        self._step = ""  # the running step, if any
        self._t0 = 0.0
        self._in_json = False
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._closed: set[TextIO] = set()  # terminal streams that went away
        #: By replica (and torch's rank prefix): its tracebacks not yet ended by their exception
        #: line (processes without a prefix share one replica's lines), or -1 past torchrun's report.
        self._open_tracebacks: dict[str, int] = {}
        self._error = ""  # the running step's kftrain error line, if it printed one
        #: The step that failed, and the last lines of its output the terminal had not shown.
        self.failed_step = ""
        self.failure_tail: list[str] = []
        #: The failed step's own one-line error (its message, without the marker), if it printed one.
        self.failure_line = ""
        #: Warnings the terminal showed: the configure step runs the checks the CLI's pre-flight
        #: ran, and evaluation and export read the same base model; each warning is shown once.
        self._warned: set[str] = set()
        self._unlogged: list[str] = []  # kftrain's lines (the run id, warnings) before the log opened, for its start
        self._stopping = False  # the run was stopped (:meth:`stopping`): a step that ends now was stopped
        self._colours = _shows_colours(out)

    def stopping(self, signum: int) -> None:
        """The run is being stopped: the running step ends as stopped, not as failed."""
        self._stopping = True

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        with self._lock:
            if self.log is None:
                self.log = self._open_log()
                self.log.writelines(self._unlogged)
                self._unlogged.clear()
            if self.verbose:  # kfp.local's colours, only where a terminal shows them and they are wanted
                self._to_terminal(self.out, redact(s) if self._colours else redact(plain(s)))
            self._partial += s
            *lines, self._partial = self._partial.split("\n")
            for line in lines:
                line = redact(plain(line))
                self.log.write(line + "\n")
                self._route(line)
        return len(s)

    def flush(self) -> None:
        with self._lock:
            if self.log is not None:
                self.log.flush()
            self._to_terminal(self.out, "")

    def close(self) -> None:
        """Write out a last line that never got its line end, and close the log."""
        if self._partial:
            self.write("\n")
        super().close()  # flushes
        if self.log is not None:
            self.log.close()

    def _to_log(self, line: str) -> None:
        """A line of kftrain's own for the log; before the log opens with the first step (a run
        refused before it keeps none), for its start."""
        if self.log is None:
            self._unlogged.append(line)
        else:
            self.log.write(line)

    def say(self, line: str) -> None:
        """A line of kftrain's own for the terminal (and the log), verbose or not."""
        with self._lock:
            line = redact(line) + "\n"
            self._to_log(line)
            self._to_terminal(self.out, line)

    def warn(self, message: str) -> None:
        """A warning of kftrain's own in this process (the pre-flight's), as a step's are shown."""
        with self._lock:
            self._to_log(redact(f"warning: {message}") + "\n")
            if message not in self._warned:
                self._warned.add(message)
                self._to_terminal(self.out, redact(f"  warning: {message}") + "\n")

    def _show(self, line: str, stream: TextIO | None = None) -> None:
        if self.verbose:  # the terminal had the raw line already
            return
        self._to_terminal(stream or self.out, line + "\n")

    def _to_terminal(self, stream: TextIO, text: str) -> None:
        """The terminal is a view of the run: once it is closed (`| head`, a closed `less`), the
        run goes on without it, everything still in the full log."""
        if stream in self._closed:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # gone (`| head`), full, hung up; ValueError: a closed file
            self._closed.add(stream)

    def _route(self, line: str) -> None:
        record = _KFP_RECORD.match(line)
        if record:
            self._kfp_record(record["level"], record["msg"])
        elif self._step and line.startswith(_STEP_INDENT):
            self._step_line(line[len(_STEP_INDENT) :])
        # Anything else is kfp.local's layout (rules, blank lines, listings of outputs): log only.

    def _kfp_record(self, level: str, msg: str) -> None:
        now = time.strftime("%H:%M:%S")
        if m := _STEP_START.match(msg):
            self._step, self._t0, self._in_json, self._error = m["task"], time.monotonic(), False, ""
            self._tail.clear()
            self._open_tracebacks.clear()
            self._show(f"{now} {self._step} started")
        elif m := _STEP_END.match(msg):
            took = format_seconds(time.monotonic() - self._t0)
            if m["status"] == "SUCCESS":
                self._show(f"{now} {m['task']} done in {took}")
            elif self._stopping:
                self._show(f"{now} {m['task']} stopped after {took}", self.err)
            else:
                self.failed_step, self.failure_tail, self.failure_line = m["task"], list(self._tail), self._error
                self._show(f"{now} {m['task']} FAILED after {took}", self.err)
                for tail_line in [] if self._error else self.failure_tail:  # the CLI ends with the error line
                    self._show(f"  {tail_line}", self.err)
            self._step = ""
        elif not _KFP_QUIET.match(msg):
            self._show(f"kfp.local {level.lower()}: {msg}", self.err if level in ("WARNING", "ERROR") else self.out)

    def _step_line(self, line: str) -> None:
        if error := parse_error_line(line):
            self._error = error[1]
            return
        if self._in_json:
            self._in_json = line != "}"  # the executor input ends with a closing brace alone on a line
            return
        record = _STEP_RECORD.match(line)
        if record:
            if record["msg"].startswith(_STEP_BOOKKEEPING):
                self._in_json = record["msg"].startswith("Got executor_input")
                return
            level, message = record["level"], record["msg"]
            if level == "WARNING":
                if message in self._warned:
                    return  # shown once already (the full log has it again)
                self._warned.add(message)
            self._show("  " + (message if level == "INFO" else f"{level.lower()}: {message}"))
        elif m := _REPLICA.match(line):
            if self._stopping and _TORCHRUN_RECORD.match(line[m.end() :]):
                return  # how torchrun passed the stop on: the log has it, the terminal needs only the ranks' lines
            if self._replica_shows(m.group(0), line[m.end() :]):
                self._show("  " + line)
        elif line.strip() and not line[0].isspace() and line != "Traceback (most recent call last):":
            self._tail.append(line[:_TAIL_CHARS])

    @property
    def os_error(self) -> str:
        """The failed step's last line when it is the OS's answer about a file (:data:`_OS_ERROR`), else ""."""
        last = self.failure_tail[-1] if self.failure_tail else ""
        m = _OS_ERROR.match(last)
        return last if m and int(m.group(1)) in _FILE_ERRNOS else ""

    @property
    def resource_error(self) -> str:
        """The failed step's last line when it says the machine ran out of memory, threads or open
        files, or a limit on them did (:data:`_RESOURCE_ERROR`), else ""."""
        last = self.failure_tail[-1] if self.failure_tail else ""
        return last if _RESOURCE_ERROR.match(last) else ""

    def _replica_shows(self, replica: str, text: str) -> bool:
        """Whether the terminal shows this line of `replica`: a traceback's frames, and torchrun's
        report of a failed process after its `ChildFailedError` (the launcher names the cause in
        the step's error), stay in the full log; the exception a traceback ends with is shown."""
        # torch prefixes a worker's own stderr with `[rankN]:`: each rank's traceback is its own.
        if m := _TORCH_RANK.match(text):
            replica, text = replica + m.group(1), text[m.end() :]
        open_now = self._open_tracebacks.get(replica, 0)
        if open_now < 0:
            return False
        if text.startswith("Traceback (most recent call last):"):
            self._open_tracebacks[replica] = open_now + 1
            return False
        if text.startswith(_CHAINED):
            return False
        if not open_now:
            return True
        if not text.strip() or text[0].isspace():
            return False  # a frame: its file and line, the code, the markers under it
        if _EXCEPTION_LINE.match(text):  # ends the oldest open traceback (another process's line does not)
            self._open_tracebacks[replica] = -1 if text.startswith(_TORCHRUN_REPORT) else open_now - 1
            return not text.startswith(_TORCHRUN_REPORT)
        return True


class _Warnings(logging.Handler):
    """kftrain's own warnings in this process (the `kftrain` loggers, WARNING and above), each to `show`."""

    def __init__(self, show: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._show = show

    def emit(self, record: logging.LogRecord) -> None:
        self._show(record.getMessage())


@contextlib.contextmanager
def _warnings_to(show: Callable[[str], None], propagate: bool) -> Iterator[None]:
    """For the duration, kftrain's own warnings go to `show` alone (whatever handled them before
    takes them back after); with `propagate` false, not also through the root logger's handlers."""
    logger = logging.getLogger("kftrain")
    before = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [_Warnings(show)], propagate and before[1]
    try:
        yield
    finally:
        logger.handlers, logger.propagate = before


def warnings_on_stderr() -> contextlib.AbstractContextManager[None]:
    """A command's own warnings (a store request retried, a check's note) as redacted
    `kftrain: warning: ...` lines on ``sys.stderr`` for the duration (the CLI's whole command;
    a local run's console takes them over while it runs: :func:`capturing`). Without it they went
    out bare and unredacted through Python's last-resort handler; and not also through the root
    logger, where a library's `logging.warning()` leaves a handler of `basicConfig`'s (each warning
    was then printed twice, the second time unredacted)."""
    return _warnings_to(lambda message: print(f"kftrain: warning: {redact(message)}", file=sys.stderr), False)


@contextlib.contextmanager
def capturing(console: StepConsole) -> Iterator[StepConsole]:
    """`console` as the process's ``sys.stdout`` for the duration, and the place kftrain's own
    warnings in this process go (:meth:`StepConsole.warn`); closed (its log too) after."""
    previous, sys.stdout = sys.stdout, console
    try:
        # Not also through the root handler kfp.local sets up around a task.
        with _warnings_to(console.warn, propagate=False):
            yield console
    finally:
        sys.stdout = previous
        console.close()
