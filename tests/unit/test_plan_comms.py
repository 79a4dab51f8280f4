"""The alpha-beta collective costs against values computed by hand."""

from __future__ import annotations

import pytest

from trainer.plan import comms
from trainer.plan.hardware import Interconnect

GB = 1e9


@pytest.mark.parametrize(
    ("nbytes", "ranks", "gbps", "latency_us", "seconds"),
    [
        # 2 ranks: 2 steps of latency, 2*(1)/2 = 1x the bytes: 1 GB at 1 GB/s = 1 s + 20 us.
        (1 * GB, 2, 1.0, 10.0, 1.0 + 2 * 10e-6),
        # 4 ranks: 6 steps, 2*3/4 = 1.5x: 0.8 GB at 2 GB/s * 1.5 = 0.6 s + 60 us.
        (0.8 * GB, 4, 2.0, 10.0, 0.6 + 6 * 10e-6),
        # 8 ranks, no latency: 2*7/8 = 1.75x of 100 MB at 450 GB/s.
        (100e6, 8, 450.0, 0.0, 1.75 * 100e6 / 450e9),
        (1 * GB, 1, 1.0, 10.0, 0.0),  # one rank: nothing to reduce
    ],
)
def test_ring_all_reduce(nbytes, ranks, gbps, latency_us, seconds):
    assert comms.ring_all_reduce(nbytes, ranks, gbps, latency_us) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("nbytes", "ranks", "gbps", "latency_us", "seconds"),
    [
        (1 * GB, 2, 1.0, 10.0, 0.5 + 10e-6),  # (p-1)/p = 1/2 of the bytes, 1 step
        (0.8 * GB, 4, 2.0, 5.0, 0.3 + 3 * 5e-6),  # 3/4 of 0.8 GB at 2 GB/s, 3 steps
        (1 * GB, 1, 1.0, 10.0, 0.0),
    ],
)
def test_ring_all_gather_and_reduce_scatter(nbytes, ranks, gbps, latency_us, seconds):
    assert comms.ring_all_gather(nbytes, ranks, gbps, latency_us) == pytest.approx(seconds)
    assert comms.ring_reduce_scatter(nbytes, ranks, gbps, latency_us) == pytest.approx(seconds)


def test_hierarchical_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_all_gather():
    link = Interconnect(intra_node_gbps=100.0, inter_node_gbps=10.0, latency_us=0.0)
    n = 8e9
    # 2 nodes x 4 GPUs: within the node 2 x 3/4 x 8 GB at 100 GB/s = 0.12 s; across the 2
    # nodes the node's link carries 2 x 1/2 x 8 GB at 10 GB/s = 0.8 s.
    assert comms.all_reduce(n, 2, 4, link) == pytest.approx(0.12 + 0.8)
    # One node: only NVLink, the same as a flat ring's bandwidth term.
    assert comms.all_reduce(n, 1, 4, link) == pytest.approx(comms.ring_all_reduce(n, 4, 100.0, 0.0))
    # Several nodes of one GPU each: only the network.
    assert comms.all_reduce(n, 4, 1, link) == pytest.approx(comms.ring_all_reduce(n, 4, 10.0, 0.0))


def test_hierarchical_all_gather_and_a_slower_gather_bandwidth():
    link = Interconnect(intra_node_gbps=100.0, inter_node_gbps=10.0, latency_us=0.0)
    n = 8e9
    # Across 2 nodes: 1/2 of 8 GB at 10 GB/s = 0.4 s; then each GPU receives the 3/4 of the whole
    # 8 GB its 3 node peers hold, over NVLink: 3/4 x 8 / 100 (was: 1/nodes of that).
    assert comms.all_gather(n, 2, 4, link) == pytest.approx(0.4 + 0.06)
    slow = Interconnect(intra_node_gbps=100.0, inter_node_gbps=10.0, latency_us=0.0, gather_gbps=1.0)
    assert comms.all_gather(n, 1, 2, slow) == pytest.approx(4.0)  # 1/2 of 8 GB at 1 GB/s
    assert comms.all_reduce(n, 1, 2, slow) == comms.all_reduce(n, 1, 2, link)  # all-reduce keeps its own


@pytest.mark.parametrize(
    ("nbytes", "cap", "sizes"),
    [
        (10 << 20, 4 << 20, [1 << 20, 4 << 20, 4 << 20, 1 << 20]),  # 1 MiB first, then the cap
        (512 << 10, 25 << 20, [512 << 10]),
        (0, 25 << 20, []),
    ],
)
def test_ddp_buckets(nbytes, cap, sizes):
    assert comms.buckets(nbytes, cap) == sizes
    assert sum(sizes) == nbytes
