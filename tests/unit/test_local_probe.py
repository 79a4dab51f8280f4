"""How `kftrain plan --probe` combines its ranks' measurements (trainer/local_probe.py); the probe's
processes themselves run in tests/integration/test_local_probe.py."""

from trainer.local_probe import combine, probe_failure


def rank(step: float, compute: float, wait: float, comm: float, peak: int) -> dict:
    return {
        "world_size": 3,
        "steps": 5,
        "step_seconds": step,
        "compute_seconds": compute,
        "data_wait_seconds": wait,
        "comm_seconds": comm,
        "peak_memory_bytes": peak,
        "device": "cpu",
        "micro_batch": 8,
        "memory_method": "VmHWM",
    }


def test_the_slowest_rank_sets_each_time_and_the_largest_peak_the_memory():
    ranks = [rank(0.10, 0.07, 0.01, 0.02, 500), rank(0.12, 0.06, 0.03, 0.01, 700), rank(0.11, 0.08, 0.00, 0.03, 600)]
    assert combine(ranks) == {
        **ranks[0],
        "step_seconds": 0.12,
        "compute_seconds": 0.08,
        "data_wait_seconds": 0.03,
        "comm_seconds": 0.03,
        "peak_memory_bytes": 700,
    }
    assert combine(ranks[:1]) == ranks[0]


#: The end of torchrun's output when a rank died of a signal: what the rank printed, then torchrun's summary.
TORCHRUN_OUT = [
    "kftrain: probing",
    "terminate called after throwing an instance of 'gloo::IoException'",
    "  what():  Connection reset by peer",
    "Traceback (most recent call last):",  # torchrun's own, of the ChildFailedError it raises
    '  File ".../torch/distributed/run.py", line 1019, in run',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "=" * 55,
    "trainer.local_probe FAILED",
    "-" * 55,
    "Failures:",
    "[1]:",
    "  exitcode  : -15 (pid: 7)",
    "-" * 55,
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -6 (pid: 8)",
    "  traceback : Signal 6 (SIGABRT) received by PID 8",
    "=" * 55,
]


def test_a_failed_probe_shows_what_the_ranks_printed_not_torchrun_s_summary():
    message = probe_failure(1, TORCHRUN_OUT)
    assert message.startswith("the probe failed (exit code 1); its last lines:")
    assert message.endswith("torchrun: the first process to fail exited with -6")
    assert "gloo::IoException" in message and "Connection reset by peer" in message
    assert "Failures:" not in message and "trainer.local_probe FAILED" not in message
    assert "Traceback" not in message and "ChildFailedError" not in message
    # Output without torchrun's summary is shown as it is.
    assert probe_failure(2, ["boom"]) == "the probe failed (exit code 2); its last lines:\n  boom"
