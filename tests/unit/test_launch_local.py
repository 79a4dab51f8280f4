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


def _aged(path, seconds: float = 3600) -> None:
    """Set `path`'s times `seconds` in the past (past the sweep's grace for a new folder)."""
    import os
    import time

    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _abandoned(parent, name: str):
    """A folder as a SIGKILLed run leaves it: its lock file there, held by nobody."""
    from trainer.launch.local import SCRATCH_LOCK

    folder = parent / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    (folder / SCRATCH_LOCK).touch()
    _aged(folder / SCRATCH_LOCK)
    return folder


def _unlocked_link(parent, name: str):
    """A link named like a run's folder, to a folder with an unheld lock file: never followed."""

    target = _abandoned(parent, "elsewhere")
    (parent / name).symlink_to(target, target_is_directory=True)
    return parent / name


def _linked_lock(parent, name: str):
    """A folder whose lock file is a link (to an unheld lock elsewhere): not one of ours."""
    from trainer.launch.local import SCRATCH_LOCK

    folder = _abandoned(parent, name)
    (folder / SCRATCH_LOCK).unlink()
    (folder / SCRATCH_LOCK).symlink_to(_abandoned(parent, "other") / SCRATCH_LOCK)
    return folder


def _young(parent, name: str):
    """Abandoned, or its maker has not locked it yet: under the grace period, so kept."""
    from trainer.launch.local import SCRATCH_LOCK

    folder = _abandoned(parent, name)
    (folder / SCRATCH_LOCK).touch()
    return folder


def _without_lock(parent, name: str):
    folder = parent / name
    folder.mkdir()
    return folder


SWEEP_CASES = {
    "abandoned by a killed run": (_abandoned, "kftrain-run1-abcd", True),
    "abandoned by a killed probe": (_abandoned, "kftrain-probe-abcd", True),
    "not kftrain's name": (_abandoned, "other-run1-abcd", False),
    "no lock file (another kftrain folder)": (_without_lock, "kftrain-kfp-abcd", False),
    "under a minute old": (_young, "kftrain-run2-abcd", False),
    "a link to a folder": (_unlocked_link, "kftrain-run3-abcd", False),
    "a lock file that is a link": (_linked_lock, "kftrain-run4-abcd", False),
}


@pytest.mark.parametrize(("make", "name", "swept"), SWEEP_CASES.values(), ids=SWEEP_CASES.keys())
def test_the_sweep_removes_only_scratch_folders_nobody_holds(tmp_path, make, name, swept):
    from trainer.launch.local import sweep_abandoned_scratch

    path = make(tmp_path, name)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sweep_abandoned_scratch(str(tmp_path)) == ([str(path)] if swept else [])
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert after == ([p for p in before if not str(p).startswith(name)] if swept else before)


def test_a_held_scratch_folder_is_kept_by_the_sweep_and_removed_when_its_block_ends(tmp_path, monkeypatch):
    """flock locks of two opens conflict within one process too: the sweep's open stands for
    another process's, and closing the holder's descriptor for its death."""
    import tempfile

    from trainer.launch.local import SCRATCH_LOCK, owned_scratch, sweep_abandoned_scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with owned_scratch("kftrain-live-") as folder:
        _aged(f"{folder}/{SCRATCH_LOCK}")
        assert sweep_abandoned_scratch() == []
        assert (tmp_path / folder).is_dir()
        abandoned = _abandoned(tmp_path, "kftrain-dead-abcd")
    assert not (tmp_path / folder).exists()
    assert abandoned.is_dir()  # the next block's start sweeps it
    with owned_scratch("kftrain-next-"):
        assert not abandoned.exists()
