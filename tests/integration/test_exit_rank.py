"""How a rank's process ends: trainer.distributed.exit_rank, in a real child process.

A torch communication thread that takes the GIL as the interpreter's teardown begins aborts the
process ("terminate called without an active exception"): a probe rank whose work was done
failed `kftrain plan --probe` in CI that way. The race is torch's and too narrow to provoke on
demand, so what is tested is the mechanism that leaves no window: the teardown does not run,
and what it would have done that matters is done before the process ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ENDING = """
import atexit, sys, threading, time
from trainer.distributed import exit_rank


class Teardown:
    def __del__(self):  # the interpreter's teardown deletes module globals
        print("teardown ran", flush=True)


keep = Teardown()
atexit.register(print, "atexit handler ran")
log = open(sys.argv[1], "w")  # a custom task's file, left open
log.write("a line left in the buffer")


def late():
    time.sleep(0.3)
    print("thread joined")


threading.Thread(target=late).start()
sys.stdout.write("unflushed line")  # stdout is a pipe here: held in its buffer
exit_rank(7)
"""


@pytest.mark.timeout(90)
def test_a_rank_ends_with_its_code_and_no_teardown_after_doing_what_teardown_does_first(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", ENDING, str(tmp_path / "task.log")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 7, done
    assert "teardown" not in done.stdout, done.stdout
    # A thread that is no daemon is waited for, then atexit handlers run, then the streams flush.
    assert done.stdout.index("thread joined") < done.stdout.index("atexit handler ran"), done.stdout
    assert "unflushed line" in done.stdout, done.stdout
    assert (tmp_path / "task.log").read_text() == "a line left in the buffer"
