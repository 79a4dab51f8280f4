"""GPU types by name, and the interconnect's checks and defaults."""

from __future__ import annotations

import pytest

from trainer.plan.hardware import GPUS, HardwareError, Interconnect, default_interconnect, gpu_spec


@pytest.mark.parametrize(
    ("name", "memory_gib", "tflops"),
    [
        ("H200", 140.4, 989.0),
        ("h100", 79.6, 989.0),
        ("A100-40GB", 40.0, 312.0),
        ("a100-80gb", 80.0, 312.0),
        ("L4", 22.5, 121.0),
        # As nvidia-smi and torch.cuda.get_device_name print them.
        ("NVIDIA H100 80GB HBM3", 79.6, 989.0),
        ("NVIDIA H200", 140.4, 989.0),
        ("NVIDIA A100-SXM4-40GB", 40.0, 312.0),
        ("NVIDIA A100-SXM4-80GB", 80.0, 312.0),
        ("NVIDIA A100-PCIE-40GB", 40.0, 312.0),
        ("NVIDIA A100 80GB PCIe", 80.0, 312.0),
        ("NVIDIA H100 PCIe", 79.6, 756.0),
        ("NVIDIA H100 NVL", 93.6, 835.0),
        ("NVIDIA H200 NVL", 140.4, 835.0),
        ("h100 pcie", 79.6, 756.0),
        ("NVIDIA L40S", 45.0, 362.0),
        ("NVIDIA L4", 22.5, 121.0),
        ("NVIDIA A10G", 22.5, 125.0),
        ("l40s", 45.0, 362.0),
        ("A10G", 22.5, 125.0),
        # A type of one size, named with its datasheet GB (was: unknown).
        ("L4 24GB", 22.5, 121.0),
        ("NVIDIA L40S 48GB", 45.0, 362.0),
        ("A10G 24GB", 22.5, 125.0),
    ],
)
def test_gpu_types_by_name(name, memory_gib, tflops):
    spec = gpu_spec(name)
    assert (spec.memory_gib, spec.bf16_tflops) == (memory_gib, tflops)
    assert spec in GPUS.values()


@pytest.mark.parametrize(
    ("name", "link"),
    [
        ("NVIDIA H100 80GB HBM3", 900.0),
        ("NVIDIA A100-SXM4-80GB", 600.0),
        # A card's NVLink bridge joins two (or four) cards, not the node: a ring crosses PCIe.
        ("NVIDIA H100 PCIe", 128.0),
        ("NVIDIA H100 NVL", 128.0),
        ("NVIDIA H200 NVL", 128.0),
        ("NVIDIA A100-PCIE-40GB", 64.0),
        ("NVIDIA A100 80GB PCIe", 64.0),
    ],
)
def test_a_card_is_planned_with_its_own_link_not_the_sxm_module_s(name, link):
    """Was: an A100 PCIe planned with the SXM module's 600 GB/s NVLink, an H200 NVL as the SXM
    H200 (989 TFLOP/s and NVLink), an H100 PCIe or NVL refused."""
    assert gpu_spec(name).nvlink_gbps == link


@pytest.mark.parametrize(
    "name", ["V100", "Tesla T4", "NVIDIA GeForce RTX 4090", "L40", "NVIDIA GH200 480GB", "H100 94GB", "L4 48GB"]
)
def test_an_unknown_gpu_names_the_known_ones_and_the_way_out(name):
    """Also a model whose other words name no product of it (an H100 with 94 GB is the NVL card)."""
    with pytest.raises(HardwareError, match=rf"--gpu '{name}'.*H200-141GB.*--gpu-memory"):
        gpu_spec(name)


@pytest.mark.parametrize(
    ("name", "memory"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "9.3"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "4.7"),
        ("NVIDIA H200 MIG 3g.71gb", "66.1"),
        ("mig-3g.40gb", "37.3"),  # the GPU operator's resource name
        ("H100 MIG", None),
    ],
)
def test_a_mig_slice_is_refused_not_planned_as_the_whole_gpu(name, memory):
    """Was: planned as the whole H100 (80 GiB, 989 TFLOP/s) from the words the lookup knew; the
    same lookup gives a run's MFU peak and which GPU a probe ran on."""
    with pytest.raises(HardwareError) as err:
        gpu_spec(name)
    assert str(err.value) == (
        f"{name!r} is a MIG slice of a GPU, which the plan has no figures for (a part of the GPU's memory and compute, "
        "no NVLink)"
    )
    assert err.value.gib == memory


@pytest.mark.parametrize(
    ("name", "sizes"),
    [
        ("A100", "A100-80GB and A100-40GB"),
        ("a100", "A100-80GB and A100-40GB"),
        ("NVIDIA A100", "A100-80GB and A100-40GB"),
        ("A100 PCIe", "A100-PCIe-80GB and A100-PCIe-40GB"),
    ],
)
def test_a_gpu_that_comes_in_two_sizes_is_named_whole(name, sizes):
    """Was: an A100 planned as the 80 GB one without a word."""
    with pytest.raises(HardwareError, match=rf"the A100( PCIe)? comes as {sizes}; name one"):
        gpu_spec(name)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"intra_node_gbps": 0.0}, "intra_node_gbps: must be > 0"),
        ({"inter_node_gbps": -1.0}, "inter_node_gbps: must be > 0"),
        ({"overlap": 1.5}, "overlap in"),
        ({"latency_us": -1.0}, "latency_us must be >= 0"),
    ],
)
def test_bad_interconnect_figures_are_refused(fields, message):
    with pytest.raises(HardwareError, match=message):
        Interconnect(**fields)


def test_defaults_discount_nvlink_to_its_bus_bandwidth_and_do_not_overlap_on_the_cpu():
    h200 = default_interconnect(gpu_spec("H200"))
    assert h200.intra_node_gbps == pytest.approx(450.0)
    assert h200.inter_node_gbps == pytest.approx(45.0)  # one 400 Gb/s NIC at 90%
    assert h200.overlap == 1.0
    assert default_interconnect(None).overlap == 0.0


def test_the_network_between_nodes_is_the_config_s_not_one_nic():
    one, eight = default_interconnect(gpu_spec("H100")), default_interconnect(gpu_spec("H100"), 3200)
    assert eight.inter_node_gbps == pytest.approx(8 * one.inter_node_gbps)
    assert eight.intra_node_gbps == one.intra_node_gbps


@pytest.mark.parametrize(("gbits", "between"), [(1, 0.1125), (4, 0.45), (400, 0.6), (100_000, 0.6)])
def test_without_a_gpu_type_the_network_still_bounds_the_link_between_nodes(gbits, between):
    """Was: gloo's loopback figure between nodes whatever `--network` said (1 or 100000 Gb/s
    predicted the same communication); gloo's own speed stays the bound above it."""
    link = default_interconnect(None, gbits)
    assert link.inter_node_gbps == pytest.approx(between)
    assert link.intra_node_gbps == 0.6
