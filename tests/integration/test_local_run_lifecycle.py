"""`kftrain run --local` is a unit: killing the CLI stops every process of the run, and
`--run-id` resumes it from its latest checkpoint to the same model as an uninterrupted run."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_group
from tests.jobs import record_of, shared_digits, train
from trainer.config import load_config
from trainer.launch.local import RUN_MARKER_ENV

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
KFTRAIN = [sys.executable, "-m", "pipelines.cli"]
CONFIG = """\
model:
  dropout: 0.1
train:
  epochs: 8
  deterministic: true
  log_interval_steps: 1000
checkpoint:
  interval_steps: 5
"""
CHECKPOINT_INTERVAL = 5


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def run_procs(marker_prefix: str) -> list[int]:
    """Live processes whose run marker starts with `marker_prefix` (the run id)."""
    needle = f"{RUN_MARKER_ENV}={marker_prefix}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


def start(tmp_path: Path, run_id: str) -> subprocess.Popen:
    """The CLI in its own session (so the test can kill it alone, not its group)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [*KFTRAIN, "run", "--local", "--config", "c.yaml", "--min-accuracy", "0.1", "--run-id", run_id],
        cwd=tmp_path,
        env={**env(), "TMPDIR": str(tmp_path / "tmp")},  # where the run's temporary files go, and leave
        stdout=open(tmp_path / f"{run_id}.log", "ab"),  # noqa: SIM115 (the child owns it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def commits(tmp_path: Path, run_id: str) -> dict[int, float]:
    """The run's committed checkpoints: step -> when its commit marker was written."""
    found = {}
    for marker in (tmp_path / "kftrain-outputs" / "runs" / run_id / "checkpoints").glob("step-*/COMMIT.json"):
        with contextlib.suppress(FileNotFoundError):  # a checkpoint the run retires meanwhile
            found[int(marker.parent.name.removeprefix("step-"))] = marker.stat().st_mtime
    return found


def wait_for_checkpoint(
    tmp_path: Path, run_id: str, proc: subprocess.Popen, after_step: int = 0, timeout: float = 240
) -> int:
    """Wait for a checkpoint of a step past `after_step`; return the newest committed step."""
    deadline = time.monotonic() + timeout
    while max(commits(tmp_path, run_id), default=0) <= after_step:
        assert proc.poll() is None, (tmp_path / f"{run_id}.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    return max(commits(tmp_path, run_id))


def assert_all_stopped(run_id: str, within: float = 20.0) -> float:
    t0 = time.monotonic()
    while run_procs(run_id):
        if time.monotonic() - t0 > within:
            left = run_procs(run_id)
            for pid in left:  # leave the machine clean before failing
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"processes of run {run_id} still alive {within}s after the CLI died: {left}")
        time.sleep(0.1)
    return time.monotonic() - t0


def training_record(tmp_path: Path, summary: dict) -> dict:
    return json.loads((Path(summary["artifacts"]["model"]) / "training.json").read_text())


@pytest.fixture(scope="module")
def reference(shared, tmp_path_factory) -> dict:
    """The training record of the same config run uninterrupted, as a training job alone on the
    same data (tests/jobs.py's shared digits are what the pipeline's data prep writes for this
    config): what the resumed run must end equal to, without a whole pipeline run of its own."""
    config = tmp_path_factory.mktemp("reference") / "c.yaml"
    config.write_text(CONFIG)
    digits = shared_digits(shared)

    def build(folder: Path) -> None:
        cfg = load_config(config, overrides={"checkpoint.uri": str(folder / "ckpt")})
        train(cfg, "reference", digits, str(folder / "model"))

    return record_of(str(shared("lifecycle-reference", build) / "model"))


def finish(tmp_path: Path, run_id: str, name: str) -> tuple[dict, str]:
    rc, out = run_group(
        [*KFTRAIN, "run", "--local", "--config", "c.yaml", "--min-accuracy", "0.1", "--run-id", run_id]
        + ["--summary", name],
        timeout=300,
        env=env(),
        cwd=str(tmp_path),
    )
    assert rc == 0, out[-4000:]
    return json.loads((tmp_path / name).read_text()), out


def test_killing_the_cli_stops_the_run_and_run_id_resumes_it_bitwise(tmp_path, reference):
    """One run through both signals (each resume is a pipeline run, so they share them): SIGTERM
    anywhere during training, `--run-id` resumes it, SIGKILL anywhere during the resumed training,
    `--run-id` resumes it again to the uninterrupted run's model, bitwise."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    run_id = "victim"
    newest = 0  # the newest committed step when the CLI was last killed
    for sig in (signal.SIGTERM, signal.SIGKILL):
        started = time.time()
        proc = start(tmp_path, run_id)
        try:
            # Anywhere in the first 60 steps after the last kill (of 152: 8 epochs of 19), chosen by
            # the step, not by a sleep: on a fast machine a sleep let the first run reach the end,
            # leaving the resumed one nothing to be killed in.
            target = newest + random.randrange(0, 60, CHECKPOINT_INTERVAL)
            step = wait_for_checkpoint(tmp_path, run_id, proc, after_step=target)
            time.sleep(random.uniform(0.0, 0.2))  # mid-step, not only at a commit
            assert run_procs(run_id), "the run has no marked processes"
            os.kill(proc.pid, sig)  # the CLI alone, not its process group
            proc.wait(timeout=60)
            stopped_in = assert_all_stopped(run_id)
            deadline = time.monotonic() + 10  # the watchdog removes them once it stopped the processes
            while list((tmp_path / "tmp").iterdir()) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not list((tmp_path / "tmp").iterdir()), f"{sig.name} left temporary files behind"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        if newest:  # the rerun resumed: each checkpoint it committed is past the one it resumed
            fresh = [s for s, at in commits(tmp_path, run_id).items() if at >= started]
            assert fresh and min(fresh) > newest, (newest, commits(tmp_path, run_id))
        newest = max(commits(tmp_path, run_id), default=step)
        log = (tmp_path / f"{run_id}.log").read_text()
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM
            assert f"run {run_id} stopped by SIGTERM" in log and f"--run-id {run_id}" in log
            assert f"(its newest committed checkpoint is step {newest})" in log  # what the resume continues from
            assert "Traceback" not in log.split("kftrain: SIGTERM")[-1]
            # The ranks' own last lines reach the terminal, and the step reads as stopped, not failed.
            assert f"stopped by SIGTERM at step {newest}: checkpoint committed" in log, log[-3000:]
            assert " train stopped after " in log and " FAILED " not in log
        print(f"{sig.name}: every process of the run gone {stopped_in:.1f}s after the CLI died")

    summary, out = finish(tmp_path, run_id, "resumed.json")
    record = training_record(tmp_path, summary)
    assert record["metrics"]["resumed_from_step"] >= newest > 0, "the rerun did not resume from the last kill"
    assert summary["run_id"] == run_id

    # The reference: the same config as an uninterrupted run.
    assert reference["metrics"]["resumed_from_step"] == 0
    assert record["parameter_digest"] == reference["parameter_digest"]

    # Rerunning a finished run does nothing and says so.
    again, out = finish(tmp_path, run_id, "again.json")
    assert "had already finished; nothing to do" in out and "configure started" not in out  # no step ran
    assert again["artifacts"] == summary["artifacts"]


# Its handler only notes the signal, as the trainer's does: one that printed could land while
# print("ready") was still in the stream's flush, and die of a "reentrant call" with no last line.
STOPPABLE_STEP = """
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
print("ready", flush=True)
while not got:
    time.sleep(0.01)
print("last line: stopped cleanly", flush=True)
sys.exit(143)
"""


@pytest.mark.timeout(60)
def test_a_stop_while_a_step_runs_lets_its_last_lines_through_then_ends_in_run_stopped():
    """The step's processes are stopped, the step's output is read to its end (a raise in the
    signal handler had dropped it), a process started after the stop is killed at once, and the
    block ends in RunStopped whatever the pipeline made of its stopped step."""
    from pipelines.local_run import RunStopped, _steps_read_to_the_end, run_scope

    with pytest.raises(RunStopped) as stopped, run_scope("r-drain", grace_s=10), _steps_read_to_the_end():
        step = subprocess.Popen([sys.executable, "-c", STOPPABLE_STEP], stdout=subprocess.PIPE, text=True)
        try:
            assert step.stdout.readline() == "ready\n"
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, stopping the step, and returns
            rest = step.stdout.read()
            late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            late_rc = late.wait(timeout=10)
        finally:
            step.kill()
        raise RuntimeError("how kfp.local reports the failed task")
    assert stopped.value.signum == signal.SIGTERM
    assert rest == "last line: stopped cleanly\n" and step.wait() == 143
    assert late_rc == -signal.SIGKILL

    # A signal after the last step's processes ended stops nothing: a pipeline that finishes all
    # the same finished (the CLI then reports the run done, with its summary).
    with run_scope("r-late", grace_s=1), _steps_read_to_the_end():
        os.kill(os.getpid(), signal.SIGTERM)


# `kftrain run --local` whose steps (one line, then kfp.local returning as after its last step: no
# process left) are faked, and which sends itself a stop signal at the moment argv[2] names: as the
# pipeline's outputs are read ("outputs"), as a failed step's error goes up ("failed"), or as the
# function of pipelines.local_run so named is entered.
LATE_SIGNAL = """\
import os, signal, sys
import pipelines.local_run as lr
from pipelines.cli import main

where, sig = sys.argv[2], signal.Signals[sys.argv[3]]

def pipeline(*args):
    with lr._steps_read_to_the_end():
        print("a step's line", flush=True)  # which opens the run's full log
    if where in ("outputs", "failed"):
        os.kill(os.getpid(), sig)
    if where == "failed":
        raise lr.PipelineFailed("Task train-model finished with status FAILURE")
    return {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": ""}

if where not in ("outputs", "failed"):
    real = getattr(lr, where)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    setattr(lr, where, signalled)
lr._run_pipeline = pipeline
sys.exit(main(["run", "--local", "--output-dir", sys.argv[1], "--run-id", "late"]))
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "where, sig",
    [
        ("outputs", "SIGTERM"),  # while the finished pipeline's outputs are read
        ("record_finished", "SIGTERM"),  # while the finished run writes its record
        ("record_finished", "SIGINT"),
        ("keep_log", "SIGTERM"),  # after the run's scope, while its log is kept and its summary prints
        ("keep_log", "SIGHUP"),
        ("failed", "SIGTERM"),  # as a failed step's error goes up: the run failed, it was not stopped
    ],
)
def test_a_stop_signal_after_the_last_step_stops_nothing_and_the_run_ends_as_it_did(tmp_path, where, sig):
    """A signal once every step has ended: the run records and reports its end, exit 0, or 1 for a
    failed step (was: "stopped by SIGTERM", exit 143 and no record of a finished run, or of a failed
    one's failure; or the summary and log cut short by the signal's default action)."""
    rc, out = run_group([sys.executable, "-c", LATE_SIGNAL, str(tmp_path), where, sig], timeout=90, env=env())
    assert f"{sig} once the run's steps have ended: nothing left to stop" in out, out
    assert "stopping every process" not in out, out
    (log,) = (tmp_path / "runs" / "late").glob("log-*.txt")
    if where == "failed":
        assert rc == 1 and "Task train-model finished with status FAILURE" in out, out
        return
    assert rc == 0 and "kftrain: run finished" in out, out
    assert json.loads((tmp_path / "runs" / "late" / "run.json").read_text())["status"] == "finished"
    assert "a step's line" in log.read_text() and "Quality gate passed" in log.read_text()


@pytest.mark.parametrize("nohup", [False, True])
def test_a_hangup_stops_the_run_as_sigterm_does_unless_it_is_ignored(nohup):
    """The terminal or SSH session closing (was: SIGHUP's default, the run killed at once: no
    checkpoint of the step it was at, no resume command); under `nohup` the run outlives it."""
    from pipelines.local_run import RunStopped, run_scope

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else signal.SIG_DFL)
    try:
        with run_scope("r-hangup", grace_s=0.1):
            handler = signal.getsignal(signal.SIGHUP)
            if nohup:
                assert handler is signal.SIG_IGN
            else:
                with pytest.raises(RunStopped) as stopped:
                    handler(signal.SIGHUP, None)
                assert stopped.value.signum == signal.SIGHUP and str(stopped.value) == "SIGHUP"
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_second_signal_of_either_kind_does_not_interrupt_the_stop():
    """SIGTERM, then Ctrl-C while the run's processes stop: the second is ignored (was: a second
    stop banner, and the run ended 'stopped by SIGINT')."""
    from pipelines.local_run import RunStopped, run_scope

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    with pytest.raises(RunStopped) as stopped, run_scope("r-signals", grace_s=0.1):
        try:
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        finally:
            during = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    assert stopped.value.signum == signal.SIGTERM
    assert during == (signal.SIG_IGN, signal.SIG_IGN)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # restored after


class _SignalledWhileWriting(io.RawIOBase):
    """A stream's file that receives SIGTERM in the middle of a write, while the buffered writer
    above it holds its lock: as a signal that comes while the run prints a step's FAILED line."""

    def __init__(self) -> None:
        self.sent = False

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode, in here
        return len(b)


def test_a_signal_while_the_run_writes_to_stderr_still_stops_the_run(monkeypatch, capfd):
    """The stop banner does not go through the stream the interrupted code was writing to (was:
    "RuntimeError: reentrant call inside <_io.BufferedWriter>" from the handler, and no stop)."""
    from pipelines.local_run import RunStopped, run_scope

    interrupted = io.TextIOWrapper(io.BufferedWriter(_SignalledWhileWriting()), line_buffering=True)
    with pytest.raises(RunStopped), run_scope("r-writing", grace_s=0.1):
        monkeypatch.setattr(sys, "stderr", interrupted)
        print("a step's FAILED line", file=sys.stderr)
    assert "SIGTERM: stopping every process of run r-writing" in capfd.readouterr().err


HOLD_THE_RUN = """
import sys, time
from pipelines.local_run import running_alone
with running_alone(sys.argv[1], "r1"):
    print("holding", flush=True)
    time.sleep(60)
"""


@pytest.mark.timeout(60)
def test_a_second_start_of_a_running_run_is_refused_until_the_first_is_gone_however_it_ended(tmp_path, mounts):
    """Was: two starts of one --run-id at once, both training into its one checkpoint prefix, each
    pruning the other's steps, both failing. The lock goes with the process, SIGKILL included."""
    from pipelines.local_run import running_alone
    from trainer.config import ConfigError

    root = str(tmp_path / "out" / "runs" / "r1")
    first = subprocess.Popen([sys.executable, "-c", HOLD_THE_RUN, root], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline() == "holding\n"
        refused = rf"--run-id r1: the run is running already on this machine \(process {first.pid}, started [0-9:]+\)"
        # However the store is written: with a '/' after it, relative, through a link (was: each
        # spelling its own lock, and two starts trained into one prefix at once).
        (tmp_path / "link").symlink_to(tmp_path / "out")
        spellings = [root, f"{root}/", os.path.relpath(root), str(tmp_path / "link" / "runs" / "r1")]
        # And through a bind mount of its store, where this machine allows one (was: its own real
        # path, its own lock); the folder need not exist yet.
        (tmp_path / "out").mkdir()
        if mounts.bind(tmp_path / "out", tmp_path / "view", need=False):
            spellings.append(str(tmp_path / "view" / "runs" / "r1"))
        for spelling in spellings:
            with pytest.raises(ConfigError, match=refused), running_alone(spelling, "r1"):
                pass
        with running_alone(str(tmp_path / "out" / "runs" / "r2"), "r2"):  # another run: its own lock
            pass
    finally:
        first.kill()
        first.wait(timeout=10)
    with running_alone(root, "r1"):  # the killed holder's lock went with it
        pass
