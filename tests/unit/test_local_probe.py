"""How `kftrain plan --probe` combines its ranks' measurements (trainer/local_probe.py); the probe's
processes themselves run in tests/integration/test_local_probe.py."""

from trainer.local_probe import combine


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
