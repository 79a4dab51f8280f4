"""The alpha-beta cost of the collectives data-parallel training runs.

A message of `n` bytes costs ``alpha + n / beta`` (latency plus size over bandwidth; Thakur,
Rabenseifner & Gropp 2005, "Optimization of Collective Communication Operations in MPICH").
Over `p` ranks in a ring (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for
clusters of workstations"):

- all-reduce (reduce-scatter then all-gather): ``2 (p-1) alpha + 2 (p-1)/p * n / beta``
- all-gather or reduce-scatter of an `n`-byte result: ``(p-1) alpha + (p-1)/p * n / beta``

`beta` is the bus bandwidth in the sense of NCCL's nccl-tests (PERFORMANCE.md: the per-link
rate, which the (p-1)/p and 2(p-1)/p factors convert from the algorithm bandwidth). Across
nodes the reduction is hierarchical (the 2-D scheme NCCL's tree/ring over NVLink then network
approximates): a reduce-scatter within the node over NVLink, an all-reduce of each GPU's 1/g
slice across the N nodes over the network (all g GPUs of a node share its network bandwidth),
and an all-gather within the node.

Ignored: contention with other jobs, congestion and topology of the network, NCCL's protocol
choice (LL/LL128/Simple) and channel count, the tree algorithm's lower latency at scale,
message pipelining within a ring step, and stragglers.
"""

from __future__ import annotations

from trainer.plan.hardware import Interconnect


def _seconds(latency_us: float, steps: float, nbytes: float, gbps: float) -> float:
    return steps * latency_us * 1e-6 + nbytes / (gbps * 1e9)


def ring_all_reduce(nbytes: float, ranks: int, gbps: float, latency_us: float) -> float:
    """Seconds of a ring all-reduce of `nbytes` over `ranks` at `gbps` GB/s bus bandwidth."""
    if ranks <= 1:
        return 0.0
    return _seconds(latency_us, 2 * (ranks - 1), 2 * (ranks - 1) / ranks * nbytes, gbps)


def ring_all_gather(nbytes: float, ranks: int, gbps: float, latency_us: float) -> float:
    """Seconds of a ring all-gather (or reduce-scatter) whose full result is `nbytes`."""
    if ranks <= 1:
        return 0.0
    return _seconds(latency_us, ranks - 1, (ranks - 1) / ranks * nbytes, gbps)


ring_reduce_scatter = ring_all_gather


def all_reduce(nbytes: float, nodes: int, per_node: int, link: Interconnect) -> float:
    """Seconds of an all-reduce of `nbytes` over `nodes` x `per_node` ranks (hierarchical)."""
    intra = 2 * ring_all_gather(nbytes, per_node, link.intra_node_gbps, link.latency_us)
    # Each GPU all-reduces its 1/per_node slice across nodes; together they use the node's link.
    inter = ring_all_reduce(nbytes, nodes, link.inter_node_gbps, link.latency_us)
    return intra + inter


def all_gather(nbytes: float, nodes: int, per_node: int, link: Interconnect) -> float:
    """Seconds of an all-gather (or reduce-scatter) whose full result is `nbytes`, over
    `nodes` x `per_node` ranks: the inter-node part moves each node's share over its link."""
    ranks = nodes * per_node
    if ranks <= 1:
        return 0.0
    intra_gbps = min(link.intra_node_gbps, link.gather_gbps or link.intra_node_gbps)
    inter_gbps = min(link.inter_node_gbps, link.gather_gbps or link.inter_node_gbps)
    alpha = link.latency_us if link.gather_latency_us is None else link.gather_latency_us
    if nodes == 1:
        return ring_all_gather(nbytes, per_node, intra_gbps, alpha)
    # Each GPU gathers its 1/per_node slice from its peers on the other nodes (all of a node's
    # GPUs share its link: (nodes-1)/nodes of the result crosses it), then the node's GPUs gather
    # the whole result from each other over NVLink: each still receives (per_node-1)/per_node of it.
    inter = ring_all_gather(nbytes, nodes, inter_gbps, alpha)
    intra = ring_all_gather(nbytes, per_node, intra_gbps, alpha)
    return inter + intra


reduce_scatter = all_gather


def buckets(nbytes: int, cap_bytes: int, first_bytes: int = 1 << 20) -> list[int]:
    """The sizes of DDP's gradient buckets for `nbytes` of gradients: the first one small
    (torch's `_DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB, so the reduction starts early), then
    `train.bucket_cap_mb` each."""
    out: list[int] = []
    left = nbytes
    size = min(first_bytes, cap_bytes)
    while left > 0:
        out.append(min(size, left))
        left -= out[-1]
        size = cap_bytes
    return out
