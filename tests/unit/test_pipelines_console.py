"""StepConsole: kfp.local's output in, a line per step start and end out (the rest to the full log)."""

import errno
import io

import pytest

from pipelines.console import StepConsole, plain

# What kfp.local writes for a step that succeeds and one that fails (colours as it sends them).
CYAN, GREEN, RED, RESET = "\x1b[96m", "\x1b[92m", "\x1b[91m", "\x1b[0m"
KFP_OUTPUT = f"""\
15:00:00.001 - INFO - Running pipeline: 'kftrain-training'
--------------------------------------------------------------------------------
15:00:00.002 - INFO - Executing task {CYAN}'train'{RESET}
15:00:00.003 - INFO - Streamed logs:

    [KFP Executor 2026-12-01 15:00:00,100 INFO]: Looking for component `train` in --component_module_path `x.py`
    [KFP Executor 2026-12-01 15:00:00,101 INFO]: Got executor_input:
    {{
        "inputs": {{
            "parameterValues": {{"config": "{{}}"}}
        }}
    }}
    kftrain: training job kftrain-1 for task r/train
    [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5 lr 3.00e-03 6,067 samples/s eta 4s
    [worker-0] [rank 1] 15:00:02 final parameter digest 5feb
    [KFP Executor 2026-12-01 15:00:03,000 WARNING]: store slow, retrying
    [KFP Executor 2026-12-01 15:00:03,500 INFO]: export to /m: 5 files, 228.1 kB in 2.7s (85.7 kB/s)
    [KFP Executor 2026-12-01 15:00:04,000 INFO]: Wrote executor output file to /o/executor_output.json.


15:00:04.100 - INFO - Task {CYAN}'train'{RESET} finished with status {GREEN}SUCCESS{RESET}
15:00:04.101 - INFO - Task {CYAN}'train'{RESET} outputs:
    model: Model( name='model',
                  uri='/o/model' )
--------------------------------------------------------------------------------
15:00:04.200 - INFO - Executing task {CYAN}'evaluate'{RESET}
15:00:04.201 - INFO - Streamed logs:

    [KFP Executor 2026-12-01 15:00:04,300 INFO]: Got executor_input:
    {{
    }}
    Traceback (most recent call last):
      File "x.py", line 3, in evaluate
        raise ObjectNotFound("no file at /m/model.json")
    trainer.storage.ObjectNotFound: no file at /m/model.json


15:00:05.000 - ERROR - Task {CYAN}'evaluate'{RESET} finished with status {RED}FAILURE{RESET}
"""


def run(text: str, verbose: bool = False, stopping: bool = False) -> tuple[StepConsole, str, str, str]:
    log, out, err = io.StringIO(), io.StringIO(), io.StringIO()
    console = StepConsole(lambda: log, out, err, verbose=verbose)
    if stopping:
        console.stopping(15)
    for piece in text.splitlines(keepends=True):  # kfp.local prints the indent and the line apart
        if piece.startswith("    "):
            console.write("    ")
            piece = piece[4:]
        console.write(piece)
    return console, log.getvalue(), out.getvalue(), err.getvalue()


def test_the_terminal_gets_step_lines_replica_lines_and_step_records_the_log_everything():
    console, log, out, err = run(KFP_OUTPUT)
    lines = out.splitlines()
    assert [line.split(" ", 1)[1] for line in lines if not line.startswith("  ")] == [
        "train started",
        "train done in 0.0s",
        "evaluate started",
    ]
    assert [line for line in lines if line.startswith("  ")] == [
        "  [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5 lr 3.00e-03 6,067 samples/s eta 4s",
        "  [worker-0] [rank 1] 15:00:02 final parameter digest 5feb",
        "  warning: store slow, retrying",
        "  export to /m: 5 files, 228.1 kB in 2.7s (85.7 kB/s)",
    ]
    assert "parameterValues" not in out + err and "kftrain: training job" not in out
    # The full log has every line as kfp.local wrote it, without the colours.
    assert log.count("\n") == KFP_OUTPUT.count("\n")
    assert "Task 'train' finished with status SUCCESS" in log and "\x1b[" not in log


def test_a_failed_step_names_itself_and_its_error_not_the_traceback_frames():
    console, log, out, err = run(KFP_OUTPUT)
    assert console.failed_step == "evaluate"
    assert console.failure_tail == ["trainer.storage.ObjectNotFound: no file at /m/model.json"]
    assert err.splitlines()[0].endswith(" evaluate FAILED after 0.0s")
    assert err.splitlines()[1:] == ["  trainer.storage.ObjectNotFound: no file at /m/model.json"]


@pytest.mark.parametrize(
    ("last", "kind"),
    [
        ("FileExistsError: [Errno 17] File exists: '/o/run/export'", "file"),  # kfp's executor, a file in the way
        ("PermissionError: [Errno 13] Permission denied: '/o/run'", "file"),
        ("OSError: [Errno 28] No space left on device", "file"),
        # A path too long, a link loop, a failing disk, a file size limit (was: "a bug in kftrain").
        ("OSError: [Errno 36] File name too long: '/o/aaaa'", "file"),
        ("OSError: [Errno 40] Too many levels of symbolic links: '/o/loop'", "file"),
        ("OSError: [Errno 5] Input/output error", "file"),
        ("OSError: [Errno 27] File too large", "file"),
        ("OSError: [Errno 98] Address already in use", ""),
        ("trainer.storage.ObjectNotFound: no file at /m/model.json", ""),
        ("ValueError: [Errno 17] not an OS error", ""),
        # The machine's resources or a limit on them (was: "an unexpected error ... a bug in kftrain")
        ("OSError: [Errno 24] Too many open files", "resource"),
        ("MemoryError", "resource"),
        ("RuntimeError: can't start new thread", "resource"),
        ("BlockingIOError: [Errno 11] Resource temporarily unavailable", ""),  # a busy lock's or pipe's too
        ("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8.00 GiB for an array", "resource"),
        ("OSError: [Errno 12] Cannot allocate memory", "resource"),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", ""),
        ("MemoryErrorLike: a custom task's own", ""),
    ],
)
def test_a_step_that_failed_on_this_machine_says_what_of_it(last, kind):
    """A file of this machine, or one of its resources (was: a file in the way of kfp's output
    folder, or a MemoryError under `ulimit -v`, read "an unexpected error ... a bug in kftrain")."""
    console, *_ = run(KFP_OUTPUT.replace("trainer.storage.ObjectNotFound: no file at /m/model.json", last))
    assert console.failure_tail[-1] == last
    assert (console.os_error, console.resource_error) == (
        last if kind == "file" else "",
        last if kind == "resource" else "",
    )


STOPPED_STEP = f"""\
15:00:00.002 - INFO - Executing task {CYAN}'train'{RESET}
15:00:00.003 - INFO - Streamed logs:

    [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5 lr 3.00e-03 6,067 samples/s eta 4s
    [master-0] W1204 15:00:02.386000 9515 /v/torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal
    [master-0] [rank 0] 15:00:02 stopped by SIGTERM at step 21: checkpoint committed 0.05s after the signal
    Traceback (most recent call last):
      File "x.py", line 3, in train
    trainer.launch.backend.JobCancelled: job kftrain-1 was cancelled


15:00:05.000 - ERROR - Task {CYAN}'train'{RESET} finished with status {RED}FAILURE{RESET}
"""


def test_a_step_that_ends_while_the_run_stops_shows_its_last_lines_and_was_stopped_not_failed():
    console, log, out, err = run(STOPPED_STEP, stopping=True)
    assert [line for line in out.splitlines() if line.startswith("  ")] == [
        "  [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5 lr 3.00e-03 6,067 samples/s eta 4s",
        "  [master-0] [rank 0] 15:00:02 stopped by SIGTERM at step 21: checkpoint committed 0.05s after the signal",
    ]
    assert [line.split(" ", 1)[1] for line in err.splitlines()] == ["train stopped after 0.0s"]
    assert console.failed_step == "" and "Received 15 death signal" in log
    # Not stopping, the same end is a failure with its error (torchrun's records stay on the terminal).
    console, log, out, err = run(STOPPED_STEP)
    assert console.failed_step == "train" and "FAILED after" in err and "Received 15 death signal" in out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("tty", "env", "coloured"),
    [(True, {}, True), (False, {}, False), (True, {"NO_COLOR": "1"}, False), (True, {"TERM": "dumb"}, False)],
)
def test_verbose_passes_everything_through_coloured_only_on_a_terminal_that_wants_it(monkeypatch, tty, env, coloured):
    """(was: kfp.local's colour codes written into `> file` and under NO_COLOR)"""
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = _Terminal() if tty else io.StringIO()
    console = StepConsole(io.StringIO, out, io.StringIO(), verbose=True)
    for piece in KFP_OUTPUT.splitlines(keepends=True):
        console.write(piece)
    assert out.getvalue() == (KFP_OUTPUT if coloured else plain(KFP_OUTPUT))
    assert "\x1b[" in KFP_OUTPUT
    assert console.failed_step == "evaluate"  # still known, for the last line


def test_nothing_written_opens_no_log():
    opened = []
    console = StepConsole(lambda: opened.append(1) or io.StringIO(), io.StringIO(), io.StringIO())
    console.close()
    assert console.log is None and not opened


# A training step whose rank 1 hit a bug: its traceback, then torchrun's own (ChildFailedError)
# and report, each line prefixed with its replica as the local backend streams them.
TRAINING_BUG = """\
15:00:00.002 - INFO - Executing task 'train'
15:00:00.003 - INFO - Streamed logs:

    [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5
    [worker-0] Traceback (most recent call last):
    [worker-0]   File "/app/trainer/train.py", line 820, in main
    [worker-0]     run_training(cfg, args.dataset_uri, args.model_uri, env)
    [worker-0]     ~~~~~~~~~~~~^^^^^
    [worker-0] KeyError: 'label'
    [worker-0]
    [worker-0] During handling of the above exception, another exception occurred:
    [worker-0]
    [worker-0] Traceback (most recent call last):
    [worker-0]   File "/app/trainer/tasks/classification.py", line 40, in loss
    [worker-0] ValueError: label 11 is not one of the task's 10 classes
    [master-0] [rank 0] 15:00:02 a collective failed or timed out
    [worker-0] Traceback (most recent call last):
    [worker-0]   File "/app/trainer/torchrun.py", line 25, in main
    [worker-0]     torchrun(argv)
    [worker-0] torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    [worker-0] ============================================================
    [worker-0] trainer.train FAILED
    [worker-0] ------------------------------------------------------------
    [worker-0] Root Cause (first observed failure):
    [worker-0]   exitcode  : 1 (pid: 42)
    [worker-0] ============================================================
    [worker-0] a line after the report
    [master-0] [rank0]: Traceback (most recent call last):
    [master-0] [rank1]: Traceback (most recent call last):
    [master-0] [rank0]:   File "/app/trainer/train.py", line 820, in main
    [master-0] [rank1]:   File "/app/trainer/train.py", line 820, in main
    [master-0] [rank0]: RuntimeError: DefaultCPUAllocator: can't allocate memory
    [master-0] [rank1]:     run_training(cfg)
    [master-0] [rank1]: RuntimeError: DefaultCPUAllocator: can't allocate memory

15:00:05.000 - ERROR - Task 'train' finished with status FAILURE
"""


# Two processes of one replica without torch's rank prefix: their tracebacks interleave, and a
# third process's line falls between the frames.
INTERLEAVED = """\
15:00:00.002 - INFO - Executing task 'train'
15:00:00.003 - INFO - Streamed logs:

    [node-0-0] Traceback (most recent call last):
    [node-0-0] Traceback (most recent call last):
    [node-0-0]   File "/app/trainer/train.py", line 820, in main
    [node-0-0] 15:00:03 rank 2 waits for its peers
    [node-0-0]   File "/app/trainer/train.py", line 820, in main
    [node-0-0] OSError: [Errno 28] No space left on device
    [node-0-0]     run_training(cfg)
    [node-0-0]     ~~~~~~~~~~~~^^^^^
    [node-0-0] KeyboardInterrupt
    [node-0-0] 15:00:04 rank 2 stops

15:00:05.000 - ERROR - Task 'train' finished with status FAILURE
"""


@pytest.mark.parametrize(
    ("text", "shown", "in_log"),
    [
        (
            TRAINING_BUG,
            [
                "  [master-0] [rank 0] 15:00:01 step 20/40 epoch 1 loss 1.5",
                "  [worker-0] KeyError: 'label'",
                "  [worker-0] ValueError: label 11 is not one of the task's 10 classes",
                "  [master-0] [rank 0] 15:00:02 a collective failed or timed out",
                # torch's `[rankN]:` prefix on two workers' interleaved tracebacks: each shows its error only
                "  [master-0] [rank0]: RuntimeError: DefaultCPUAllocator: can't allocate memory",
                "  [master-0] [rank1]: RuntimeError: DefaultCPUAllocator: can't allocate memory",
            ],
            ["ChildFailedError", "File ", "Root Cause"],
        ),
        (
            INTERLEAVED,
            [
                "  [node-0-0] 15:00:03 rank 2 waits for its peers",
                "  [node-0-0] OSError: [Errno 28] No space left on device",
                "  [node-0-0] KeyboardInterrupt",
                "  [node-0-0] 15:00:04 rank 2 stops",
            ],
            ['File "/app/trainer/train.py"', "~~~~~~~~~~~~^^^^^"],
        ),
    ],
    ids=["torchrun-report", "interleaved-without-prefix"],
)
def test_replicas_tracebacks_show_their_error_lines_only_and_the_log_keeps_everything(text, shown, in_log):
    console, log, out, err = run(text)
    assert [line for line in out.splitlines() if line.startswith("  [")] == shown
    assert all(part in log for part in in_log)  # all of it in the full log


class ClosedAfter(io.StringIO):
    """A terminal that fails after `n` writes with `error`: its reader closed (`kftrain run
    --local | head`), its disk full (`> run.log`), its terminal hung up."""

    def __init__(self, n: int, error: OSError | None = None) -> None:
        super().__init__()
        self.n, self.error = n, error or BrokenPipeError(32, "Broken pipe")

    def write(self, s: str) -> int:
        self.n -= 1
        if self.n < 0:
            raise self.error
        return super().write(s)


@pytest.mark.parametrize(
    "error",
    [BrokenPipeError(32, "Broken pipe"), OSError(errno.ENOSPC, "No space left on device"), OSError(errno.EIO, "I/O")],
)
def test_a_terminal_that_closes_leaves_the_run_and_its_log_whole(error):
    """(was: a full disk's or a hung-up terminal's error stopped the run half-way)"""
    log, out, err = io.StringIO(), ClosedAfter(2, error), io.StringIO()
    console = StepConsole(lambda: log, out, err)
    console.say("kftrain: run r1 (stopped or killed, it continues with: ...)")  # before the log opens
    for line in KFP_OUTPUT.splitlines(keepends=True):
        console.write(line)
    console.flush()
    assert log.getvalue().count("\n") == KFP_OUTPUT.count("\n") + 1
    assert log.getvalue().startswith("kftrain: run r1 (stopped or killed")  # the run id too (was: not in the log)
    assert console.failed_step == "evaluate"  # still followed: the CLI's last line names it
    assert len(out.getvalue().splitlines()) == 2


def test_a_warning_is_shown_once_whether_the_pre_flight_or_any_step_gives_it_again():
    """The CLI's pre-flight and the configure step run the same checks (evaluation and export read
    the same base model): the terminal shows each warning once, the full log every time."""
    import logging

    from pipelines.console import capturing

    step = "    [KFP Executor 2026-12-01 15:00:00,100 WARNING]: {}\n"
    log, out, err = io.StringIO(), io.StringIO(), io.StringIO()
    console = StepConsole(lambda: log, out, err)
    with capturing(console):
        logging.getLogger("kftrain.checks").warning("model.init_from 'm': config.json ties 'lm_head.weight'")
        for task in ("configure", "evaluate"):
            console.write(f"15:00:00.001 - INFO - Executing task '{task}'\n")
            console.write(step.format("model.init_from 'm': config.json ties 'lm_head.weight'"))
            console.write(step.format(f"{task}'s own warning"))
            console.write(step.format(f"{task}'s own warning"))
        full_log = log.getvalue()  # the console closes it on the way out
    assert [line for line in out.getvalue().splitlines() if "warning:" in line] == [
        "  warning: model.init_from 'm': config.json ties 'lm_head.weight'",
        "  warning: configure's own warning",
        "  warning: evaluate's own warning",
    ]
    assert full_log.count("config.json ties") == 3 and not err.getvalue()
    assert full_log.startswith("warning: model.init_from")  # given before the log opened, kept at its start


def test_a_warning_alone_opens_no_log():
    """A run refused in its pre-flight (an unreachable store, which warns as it retries) keeps no
    log: the CLI would upload it to that store, waiting out the store's whole retry budget."""
    import logging

    from pipelines.console import capturing

    opened = []
    console = StepConsole(lambda: opened.append(1) or io.StringIO(), io.StringIO(), io.StringIO())
    with capturing(console):
        logging.getLogger("kftrain.storage").warning("GET s3://b/x failed; retry 1 in 0.5s")
    assert console.log is None and not opened
    assert logging.getLogger("kftrain").handlers == [] and logging.getLogger("kftrain").propagate


def test_a_command_s_warnings_are_redacted_lines_on_stderr_and_a_run_s_console_takes_them_over(capsys):
    """Every command's own warnings (a store request retried before a run's console exists, `kftrain
    runs` on a slow store) show as `kftrain: warning:` lines, redacted; while a run's console holds
    them they go to it alone, and back to stderr after."""
    import logging

    from pipelines.console import capturing, warnings_on_stderr

    logger = logging.getLogger("kftrain.storage")
    console = StepConsole(io.StringIO, io.StringIO(), io.StringIO())
    with warnings_on_stderr():
        logger.warning("GET s3://b/x at http://admin:hunter2@minio:9000 failed; retry 1 in 0.5s")
        with capturing(console):
            logger.warning("LIST s3://b/y failed; retry 1 in 0.5s")
        logger.warning("PUT s3://b/z failed; retry 1 in 0.5s")
    logger.warning("after the command: not ours to show")
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        "kftrain: warning: GET s3://b/x at http://***@minio:9000 failed; retry 1 in 0.5s",
        "kftrain: warning: PUT s3://b/z failed; retry 1 in 0.5s",
    ]
    assert "LIST" not in "\n".join(err) and "LIST s3://b/y" in console.out.getvalue()
    assert logging.getLogger("kftrain").handlers == []


def test_a_command_s_warning_is_printed_once_when_the_root_logger_has_a_handler(capsys):
    """A library's `logging.warning()` gives the root logger `basicConfig`'s handler: a retried
    store request was then printed twice, the second time unredacted (`WARNING:kftrain.storage:`)."""
    import logging

    from pipelines.console import warnings_on_stderr

    root = logging.getLogger()
    handler = logging.StreamHandler()  # stderr, as basicConfig's; made now, so capsys holds it
    root.addHandler(handler)
    try:
        with warnings_on_stderr():
            logging.getLogger("kftrain.storage").warning("PUT s3://b/z at http://admin:hunter2@minio:9000 failed")
    finally:
        root.removeHandler(handler)
    assert capsys.readouterr().err.splitlines() == ["kftrain: warning: PUT s3://b/z at http://***@minio:9000 failed"]
