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


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (-9, "; its training process was killed by SIGKILL (most likely the kernel's out-of-memory killer"),
        (-11, "; its training process was killed by SIGSEGV"),
        (3, ""),  # its own exit code: the trainer's line says why
        (143, "; its training process stopped on a SIGTERM after committing a checkpoint (nothing to fix"),
        (None, ""),
    ],
)
def test_a_replica_whose_process_a_signal_ended_says_so(code, said):
    """torchrun exits 1 whatever ended its process: the local backend reads the signal from
    torchrun's summary (was: 'exited with code 1' for a rank the OOM killer took)."""
    from tests.unit.test_launch_failures import torchrun_summary
    from trainer.launch.local import how_it_ended

    found = how_it_ended(torchrun_summary(code) if code is not None else ["[rank 0] step 3"])
    assert found.startswith(said) and bool(found) == bool(said), found


@pytest.mark.parametrize(("returncode", "nothing_to_fix"), [(143, True), (1, False), (-15, False), (None, False)])
def test_a_replica_whose_agent_stopped_on_a_signal_has_nothing_to_fix(returncode, nothing_to_fix):
    """A SIGTERM to a replica's torchrun agent (as the kubelet sends a pod's) leaves no summary and
    exits 143 (was: "after fixing the cause", as for a failure)."""
    from trainer.launch.local import NOTHING_TO_FIX, how_it_ended

    assert (NOTHING_TO_FIX in how_it_ended(["[rank 0] stopped by SIGTERM at step 30"], returncode)) == nothing_to_fix


@pytest.mark.parametrize(
    ("returncode", "oom_kills", "said"),
    [
        (-9, None, "; it was killed by SIGKILL (most likely the kernel's out-of-memory killer"),
        (-9, 0, "; it was killed by SIGKILL (not the out-of-memory killer"),
        (-9, 1, "; it was killed by SIGKILL (the kernel's out-of-memory killer, which killed 1 process(es)"),
        (-11, 0, "; it was killed by SIGSEGV"),
    ],
)
def test_a_replica_whose_own_process_a_signal_ended_says_so(returncode, oom_kills, said):
    """No torchrun summary, the replica's process itself killed (was: "exited with code -9" and
    "after fixing the cause", naming no signal); the out-of-memory killer's count says who sent a SIGKILL."""
    from trainer.launch.local import how_it_ended

    assert how_it_ended(["[rank 0] step 3"], returncode, oom_kills).startswith(said)


@pytest.mark.parametrize(
    ("replicas", "named"),
    [
        # (log lines or a torchrun summary's root-cause code, the replica's own exit code) per replica.
        # A peer SIGKILLed: its rank's collective fails first, and was the one named.
        ({"master-0": (4, 1), "worker-0": (-9, 1)}, "worker-0"),
        ({"master-0": (None, 1), "worker-0": (None, -9)}, "worker-0"),  # the agent itself killed
        # SIGTERM to one replica: every rank stops with a checkpoint; the one signalled is named.
        ({"master-0": ("peer", 1), "worker-0": (143, 1)}, "worker-0"),
        ({"master-0": ("peer", 143), "worker-0": (None, 143)}, "worker-0"),
        ({"master-0": (3, 1), "worker-0": (4, 1)}, "master-0"),  # its own error (non-finite), the peer's casualty
        ({"master-0": (4, 1), "worker-0": (4, 1)}, "master-0"),  # nothing tells them apart: the first
    ],
)
def test_the_replica_named_is_the_likeliest_cause_not_the_first_to_end(replicas, named):
    from tests.unit.test_launch_failures import torchrun_summary
    from trainer.launch.local import blame

    def log(what):
        if what == "peer":
            return ["[rank 0] stopped by a signal to another rank at step 105: checkpoint committed"]
        return torchrun_summary(what) if what is not None else ["[rank 1] step 3"]

    scores = {key: blame(log(what), code) for key, (what, code) in replicas.items()}
    assert min(scores, key=scores.get) == named


@pytest.mark.parametrize("run_id", ["20261205-231129-33a364", "victim", "my-run-2"])
def test_a_local_run_s_processes_know_its_run_id(monkeypatch, run_id):
    """The evaluation report names the run by the id `--run-id` and `kftrain runs` take (was:
    kfp.local's job id, which the user can do nothing with)."""
    from trainer.launch.local import RUN_MARKER_ENV, local_run_id, run_marker

    monkeypatch.delenv(RUN_MARKER_ENV, raising=False)
    assert local_run_id() == ""
    marker = run_marker(run_id)
    assert marker != run_marker(run_id)  # two starts of one run id are told apart
    monkeypatch.setenv(RUN_MARKER_ENV, marker)
    assert local_run_id() == run_id
