"""Stacks on demand: a process of a job prints where each of its threads is, and goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from trainer import stacks
from trainer.launch.backend import JobTimeout
from trainer.launch.local import LocalBackend
from trainer.launch.spec import JobSpec

REPO = Path(__file__).resolve().parents[2]

#: A rank that registers the handlers, says so, and waits in a function of its own.
WAITING_RANK = """
    import os, time
    from trainer.stacks import print_stacks_on_signals
    print_stacks_on_signals()
    def wait_for_a_lost_peer():
        print("ready", os.environ["RANK"], flush=True)
        while True:
            time.sleep(0.05)
    wait_for_a_lost_peer()
"""


def start(code: str) -> subprocess.Popen:
    """`code` in a process of its own (its own group), stderr captured."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": str(REPO), "RANK": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.timeout(60)
def test_only_a_process_that_catches_the_signal_is_asked_and_it_goes_on():
    with_handler, without = start(WAITING_RANK), start("import time; print('ready', flush=True); time.sleep(60)")
    try:
        for proc in (with_handler, without):
            assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        assert stacks.catches(with_handler.pid) and not stacks.catches(without.pid)
        assert not stacks.catches(2**22 + 1)  # no such process

        assert stacks.ask_for_stacks([with_handler.pid, without.pid, 2**22 + 1]) == [with_handler.pid]
        time.sleep(0.5)
        # Both still run: one printed its stacks and went on, the other never got the signal.
        assert with_handler.poll() is None and without.poll() is None
    finally:
        for proc in (with_handler, without):
            os.killpg(proc.pid, signal.SIGKILL)
    assert "in wait_for_a_lost_peer" in with_handler.communicate(timeout=10)[1]


@pytest.mark.timeout(60)
def test_the_command_asks_every_kftrain_process_here(monkeypatch, capsys):
    rank = start(WAITING_RANK)
    try:
        assert rank.stdout is not None and rank.stdout.readline().startswith("ready")
        # Only this test's process: the real scan would also find the ranks of tests running beside it.
        monkeypatch.setattr(stacks, "_kftrain_processes", lambda: [rank.pid])
        assert stacks.main([]) == 0
        assert f"kftrain: asked 1 process(es) ({rank.pid})" in capsys.readouterr().out
        time.sleep(0.5)
        assert rank.poll() is None
    finally:
        os.killpg(rank.pid, signal.SIGKILL)
    assert "in wait_for_a_lost_peer" in rank.communicate(timeout=10)[1]

    monkeypatch.setattr(stacks, "_kftrain_processes", lambda: [])
    assert stacks.main([]) == 1
    assert "kftrain: no kftrain process here prints its stacks" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("cmdline", "matched"),
    [
        ([sys.executable, "-m", "trainer.torchrun", "-m", "trainer.train", "--config-json", "{}"], True),
        ([sys.executable, "-u", "-m", "trainer.train", "--dataset-uri", "s3://b/d"], True),  # a rank under torchrun
        ([sys.executable, "-X", "importtime", "-mtrainer.local_probe"], True),
        ([sys.executable, "my_trainer.py"], False),
        ([sys.executable, "my.py", "-m", "trainer.train"], False),  # the script's own argument
        ([sys.executable, "-c", "pass", "-m", "trainer.train"], False),
        ([sys.executable, "-m", "trainer.task"], False),  # a user's own `trainer` package (Vertex AI's convention)
        (["vim", "trainer.py"], False),
        ([sys.executable, "-m", "pytest", "tests/test_trainer.py"], False),
    ],
)
def test_only_a_kftrain_entry_point_s_process_is_one_to_ask(cmdline, matched):
    assert stacks.runs_a_kftrain_module(b"\0".join(a.encode() for a in cmdline) + b"\0") is matched


@pytest.mark.parametrize("module", stacks.ENTRY_MODULES)
def test_every_entry_point_asked_registers_its_handlers(module):
    source = (REPO / (module.replace(".", "/") + ".py")).read_text()
    assert "print_stacks_on_signals()" in source, module


def test_the_scan_finds_a_running_entry_point_and_not_itself(tmp_path):
    # A `trainer` package of its own first on the path: the command line is exactly a rank's.
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("")
    (tmp_path / "trainer" / "train.py").write_text("import time\nprint('ready', flush=True)\ntime.sleep(30)\n")
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "trainer.train"],  # -S: no site, so not the installed kftrain's finder
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,  # `-m` puts the working directory first on the path
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")  # its own command line now
        found = stacks._kftrain_processes()
        assert proc.pid in found and os.getpid() not in found
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_command_has_help_and_asks_no_one_for_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        stacks.main(["--help"])
    assert exit_.value.code == 0 and "SIGUSR1" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_a_local_job_that_times_out_shows_where_each_rank_and_agent_waited(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(WAITING_RANK))
    spec = JobSpec(
        name="waits",
        image="local",
        command=("python", "-m", "trainer.torchrun", str(script)),
        replicas=2,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        timeout_s=60,
    )
    lines: list[str] = []
    backend = LocalBackend(sink=lines.append)
    backend.submit(spec)
    try:
        deadline = time.monotonic() + 60
        while sum(line.endswith(("ready 0", "ready 1")) for line in lines) < 2:
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
        with pytest.raises(JobTimeout, match=r"within 1s \(job.timeout_seconds\) \(where each process waited"):
            backend.wait(replace(spec, timeout_s=1))
    finally:
        backend.cancel(spec)
    for key in ("master-0", "worker-0"):
        mine = [line for line in lines if line.startswith(f"[{key}]")]
        assert any("in wait_for_a_lost_peer" in line for line in mine), mine  # the rank's stack
        assert any("trainer/torchrun.py" in line for line in mine), mine  # its torchrun agent's
