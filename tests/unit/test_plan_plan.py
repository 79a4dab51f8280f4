"""make_plan: memory per rank by strategy and method, verdicts and refusals, records."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from trainer.config import Config
from trainer.example_model import tiny_llama_folder
from trainer.plan import Interconnect, Plan, ProbeResult, make_plan
from trainer.plan.plan import GPU_OVERHEAD_BYTES, GiB
from trainer.tasks import Task

MiB = 2**20


@pytest.fixture
def no_launch_floor(monkeypatch):
    """The FLOP-rate path alone, for the tests of it on the small models here (whose steps on a
    GPU the kernel launches bound: test_a_small_models_gpu_step_is_bound_by_its_kernel_launches)."""
    monkeypatch.setattr("trainer.plan.plan.KERNEL_LAUNCH_S", 0.0)
    monkeypatch.setattr("trainer.plan.plan.STEP_OVERHEAD_S", 0.0)


def gpt(strategy: str = "ddp", replicas: int = 2, **train) -> Config:
    cfg = Config(task="causal_lm")
    m = cfg.model
    m.n_layer, m.n_embd, m.n_head, m.block_size = 4, 64, 4, 32
    cfg.train.batch_size, cfg.train.max_steps, cfg.train.strategy = 8, 100, strategy
    for k, v in train.items():
        setattr(cfg.train, k, v)
    cfg.job.replicas, cfg.job.nproc_per_node = replicas, 1
    return cfg


def test_ddp_keeps_a_full_replica_and_fsdp_a_shard_plus_gather_buffers():
    ddp, fsdp = make_plan(gpt("ddp", 4)), make_plan(gpt("fsdp", 4))
    p = ddp.shape["trainable"]
    assert ddp.memory.parameters == ddp.memory.gradients == 4 * p  # fp32, gradients in the buckets
    assert ddp.memory.optimizer == 8 * p  # AdamW: exp_avg + exp_avg_sq
    assert ddp.memory.communication == 0 and ddp.memory.other == 0  # CPU: no CUDA context
    assert fsdp.memory.parameters == pytest.approx(4 * p / 4, abs=1)
    assert fsdp.memory.optimizer == pytest.approx(8 * p / 4, abs=1)
    unit = max(fsdp.shape["unit_params"])
    root = fsdp.shape["root_params"]
    # The root's weights, two units' (running + prefetched) and one unit's unsharded gradient.
    assert fsdp.memory.communication == 4 * root + 2 * 4 * unit + 4 * unit
    assert fsdp.memory.activations == ddp.memory.activations
    assert fsdp.memory.total < ddp.memory.total


def test_on_a_gpu_the_weights_gather_in_bf16_and_the_context_counts():
    plan = make_plan(gpt("fsdp", 2), gpu="H100")
    unit, root = max(plan.shape["unit_params"]), plan.shape["root_params"]
    assert plan.memory.communication == 2 * root + 2 * 2 * unit + 4 * unit
    assert plan.memory.other == GPU_OVERHEAD_BYTES
    assert plan.memory.tensors == plan.memory.total - GPU_OVERHEAD_BYTES
    assert plan.capacity_bytes == int(79.6 * 2**30) and plan.fits is True
    # The same card through --gpu-memory (GiB, as kubernetes.gpu_memory_gb) is the same capacity.
    assert make_plan(gpt("fsdp", 2), gpu_memory_gb=79.6).capacity_bytes == plan.capacity_bytes
    # bf16 autocast saves smaller activations than fp32 on the CPU.
    assert plan.memory.activations < make_plan(gpt("fsdp", 2)).memory.activations


def test_fsdp_on_one_rank_is_planned_as_the_unwrapped_model_it_trains():
    """One rank trains the model unwrapped (no FSDP, no bf16 policy), as DDP does: the same
    activations (was: FSDP's bf16 weights assumed, 10% fewer), in the one-rank row of a scaling
    table too; with more ranks FSDP's own."""
    ddp, fsdp = make_plan(gpt("ddp", 1), gpu="H100"), make_plan(gpt("fsdp", 1), gpu="H100", nodes=(1, 2))
    assert fsdp.memory.activations == ddp.memory.activations
    two = make_plan(gpt("fsdp", 2), gpu="H100", nodes=(1, 2))
    assert fsdp.point(1).memory_total == make_plan(gpt("fsdp", 1), gpu="H100").memory.total
    assert two.memory.activations < make_plan(gpt("ddp", 2), gpu="H100").memory.activations
    assert two.point(1).memory_total == fsdp.memory.total


@pytest.mark.parametrize("gpu", [None, "H100"])
def test_fsdp_accumulating_micro_steps_holds_every_whole_gradient_in_fp32(gpu):
    """Micro-steps skip the reduce-scatter (set_requires_gradient_sync(False)): FSDP2 keeps each
    trainable parameter's whole fp32 gradient until the last one (was: planned as a shard, and
    "more accumulation steps" suggested as lowering memory)."""
    one, two = make_plan(gpt("fsdp", 4), gpu=gpu), make_plan(gpt("fsdp", 4, grad_accum_steps=2), gpu=gpu)
    p = one.shape["trainable"]
    assert one.memory.gradients == pytest.approx(4 * p / 4, abs=1)
    assert two.memory.gradients == pytest.approx(4 * p / 4 + 4 * p, abs=1)
    ddp_one, ddp_two = make_plan(gpt("ddp", 4), gpu=gpu), make_plan(gpt("ddp", 4, grad_accum_steps=2), gpu=gpu)
    assert ddp_two.memory.gradients == ddp_one.memory.gradients == 4 * p  # DDP's buckets hold them anyway


def test_activation_checkpointing_and_a_smaller_micro_batch_lower_activations():
    plain = make_plan(gpt()).memory.activations
    assert make_plan(gpt(activation_checkpointing=True)).memory.activations < plain
    assert make_plan(gpt(grad_accum_steps=2)).memory.activations < plain


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama", tie=True)


def test_lora_has_no_gradients_or_optimizer_state_for_the_frozen_base(llama):
    cfg = Config(task="causal_lm")
    cfg.model.init_from, cfg.model.block_size = llama, 64
    cfg.train.batch_size, cfg.job.replicas = 4, 1
    full = make_plan(cfg)
    cfg.train.method = "lora"
    lora = make_plan(cfg)
    assert full.shape["frozen"] == 0 and lora.shape["frozen"] > 0
    assert lora.memory.gradients == 4 * lora.shape["trainable"] < full.memory.gradients / 10
    assert lora.memory.optimizer == 8 * lora.shape["trainable"]
    assert lora.memory.parameters == pytest.approx(full.memory.parameters, rel=0.1)


def test_fsdp_reduce_scatters_only_what_trains(llama, no_launch_floor):
    """FSDP gathers every weight but reduce-scatters gradients only: under LoRA the adapters', so
    neither the step's communication time nor the unsharded-gradient buffer counts the frozen base."""
    plans = {}
    for method in ("full", "lora"):
        cfg = Config(task="causal_lm")
        cfg.model.init_from, cfg.model.block_size = llama, 64
        cfg.train.batch_size, cfg.train.strategy, cfg.train.method = 8, "fsdp", method
        cfg.job.replicas = 2
        plans[method] = make_plan(cfg, gpu="H100", nodes=(2,))
    full, lora = plans["full"], plans["lora"]
    assert full.shape["unit_trainable"] == full.shape["unit_params"] and full.shape["root_trainable"] > 0
    assert 0 < max(lora.shape["unit_trainable"]) < max(lora.shape["unit_params"]) / 10
    assert lora.shape["root_trainable"] == 0  # embeddings and head are frozen
    unit, root = max(lora.shape["unit_params"]), lora.shape["root_params"]
    assert lora.memory.communication == 2 * root + 2 * 2 * unit + 4 * max(lora.shape["unit_trainable"])
    # LoRA gathers slightly more (the adapters) but reduce-scatters far less than full fine-tuning.
    assert sum(lora.shape["unit_params"]) > sum(full.shape["unit_params"])
    assert lora.point(2).comm_seconds < full.point(2).comm_seconds


def test_full_fine_tuning_that_does_not_fit_is_offered_lora(llama):
    cfg = Config(task="causal_lm")
    cfg.model.init_from, cfg.model.block_size = llama, 64
    cfg.train.batch_size, cfg.job.replicas = 4, 1
    need = make_plan(cfg, gpu_memory_gb=1000).memory.total
    lora = make_plan(cfg, gpu_memory_gb=0).alternatives  # never fits: every option listed
    assert [a.change for a in lora][-2].startswith("train.method: lora")
    plan = make_plan(cfg, gpu_memory_gb=(need - 1) / GiB)
    assert plan.fits is False
    assert any(a.fits and a.change.startswith("train.method: lora") for a in plan.alternatives)


def test_a_tiny_gpu_gets_a_does_not_fit_verdict_with_each_alternative_predicted():
    cfg = gpt("ddp", 2, batch_size=64)
    need = make_plan(cfg, gpu_memory_gb=1000).memory
    # Room for everything but a quarter of the activations.
    room = (need.total - need.activations // 4) / GiB
    plan = make_plan(cfg, gpu_memory_gb=room)
    assert plan.fits is False
    changes = {a.change.split(" ")[0]: a for a in plan.alternatives}
    assert set(changes) == {"train.strategy:", "half", "train.activation_checkpointing:"}
    assert all(a.memory.total < plan.memory.total for a in plan.alternatives)
    assert changes["half"].fits and changes["train.activation_checkpointing:"].fits
    assert plan.verdicts[0].startswith("does not fit:") and "would fit with:" in plan.verdicts[0]
    assert "does not fit" not in make_plan(cfg, gpu_memory_gb=1000).verdicts[0]
    refusal = plan.refusal(cfg)
    assert refusal.startswith("predicted peak memory per rank") and "train.activation_checkpointing" in refusal


def probe(compute: float, world: int = 1) -> ProbeResult:
    return ProbeResult(
        world_size=world,
        steps=3,
        step_seconds=compute,
        compute_seconds=compute,
        data_wait_seconds=0.0,
        comm_seconds=0.0,
        peak_memory_bytes=0,
    )


def test_time_scales_compute_by_the_share_of_the_batch_and_adds_the_all_reduce():
    link = Interconnect(intra_node_gbps=1.0, inter_node_gbps=1.0, latency_us=100.0, overlap=0.0)
    cfg = gpt("ddp", 1)
    plan = make_plan(cfg, probe=probe(1.0), interconnect=link, nodes=(1, 2))
    one, two = plan.point(1), plan.point(2)
    assert one.step_seconds == pytest.approx(1.0) and one.comm_seconds == 0
    grads = 4 * plan.shape["trainable"]  # one bucket: under the first 1 MiB
    assert grads < MiB
    expected = grads / 1e9 + 2 * 100e-6  # 2 ranks: 2 x 1/2 of the bytes, 2 latency steps
    assert two.comm_seconds == pytest.approx(expected)
    assert two.compute_seconds == pytest.approx(0.5)  # half the batch; the other node has its own cores
    assert two.efficiency == pytest.approx(two.items_per_second / (2 * one.items_per_second))
    assert one.eta_seconds == pytest.approx(100 * 1.0)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_probe_s_own_size_is_planned_as_it_measured_and_other_sizes_add_the_modelled_difference(strategy):
    """Under FSDP the probe's compute holds the all-gathers, and the plan added the modelled
    communication again: 2-3.5x the step the probe had just measured at that very size."""
    link = Interconnect(intra_node_gbps=1.0, inter_node_gbps=1.0, latency_us=100.0, overlap=0.0)
    cfg = gpt(strategy, 2)
    measured = dataclasses.replace(probe(0.03, world=2), comm_seconds=0.002, step_seconds=0.032)
    calibrated = make_plan(cfg, probe=measured, interconnect=link, nodes=(2, 4))
    two, four = calibrated.point(2), calibrated.point(4)
    assert two.step_seconds == pytest.approx(0.032) and two.comm_seconds == pytest.approx(0.002)
    raw = make_plan(cfg, probe=dataclasses.replace(measured, world_size=1), interconnect=link, nodes=(2, 4))
    modelled = raw.point(4).comm_seconds - raw.point(2).comm_seconds
    assert four.comm_seconds == pytest.approx(max(0.0, 0.002 + modelled))
    assert any("calibrated to the probe" in a for a in calibrated.assumptions)


def test_cpu_ranks_of_one_machine_share_its_cores():
    cores = os.cpu_count() or 1
    cfg = gpt("ddp", 1)
    cfg.job.nproc_per_node = 2 * cores
    plan = make_plan(cfg, probe=probe(1.0))
    # 1/(2 cores) of the batch each, at half speed: as long as one process alone.
    assert plan.point(1).compute_seconds == pytest.approx(1.0 / (2 * cores) * 2)


def test_a_gpu_type_predicts_compute_from_flops_and_scaling_sentences_with_cost(no_launch_floor):
    cfg = gpt("ddp", 2, batch_size=64)
    plan = make_plan(cfg, gpu="H200", nodes=(2, 4), price_per_gpu_hour=2.0)
    assert [p.nodes for p in plan.scaling] == [2, 4]
    two, four = plan.scaling
    flops = plan.shape["flops_per_item"] * 32 * 64 / 2  # per rank, per step
    assert two.compute_seconds == pytest.approx(flops / (989e12 * 0.4))
    assert two.cost == pytest.approx(two.gpu_hours * 2.0)
    assert any(v.startswith("N=4 gives") and "x the cost" in v for v in plan.verdicts)


def test_an_eta_beyond_the_job_timeout_is_refused():
    cfg = gpt("ddp", 1, max_steps=10_000)
    cfg.job.timeout_seconds = 60
    plan = make_plan(cfg, probe=probe(0.5))
    assert plan.point(1).eta_seconds == pytest.approx(5000)
    assert "exceeds job.timeout_seconds 60" in plan.refusal(cfg)
    cfg.job.timeout_seconds = 6000
    assert make_plan(cfg, probe=probe(0.5)).refusal(cfg) is None


def test_a_batch_that_does_not_divide_by_the_ranks_is_refused():
    cfg = gpt("ddp", 3, batch_size=8)
    plan = make_plan(cfg)
    assert plan.verdicts[0].startswith("train.batch_size 8 does not divide by 3 ranks")
    assert "the trainer would refuse it" in plan.refusal(cfg)


def test_without_gpu_or_probe_no_time_is_claimed():
    plan = make_plan(gpt())
    assert all(p.step_seconds is None and p.eta_seconds is None for p in plan.scaling)
    assert any("not predicted" in a for a in plan.assumptions)


def test_the_plan_round_trips_and_reports():
    cfg = gpt("fsdp", 2)
    plan = make_plan(cfg, gpu="A100-40GB", nodes=(1, 2), price_per_gpu_hour=1.5)
    again = Plan.from_dict(plan.to_dict())
    assert again.to_dict() == plan.to_dict()
    metrics = plan.metrics()
    assert metrics["memory_total_gib"] == pytest.approx(plan.memory.total / GiB)
    assert metrics["fits"] == 1.0 and "nodes2_step_seconds" in metrics
    assert all(isinstance(v, float) for v in metrics.values())
    text = plan.markdown()
    for heading in ("## Verdicts", "## Memory per rank", "## Scaling", "## Assumptions"):
        assert heading in text
    assert "Thakur" in text


class PlannedOnly(Task):
    """A task whose methods the plan never calls are stubs: complete to the task loader."""

    def _unused(self, *args):
        raise AssertionError("the plan called a method it has no use for")

    prepare = datasets = model_from_meta = validate = evaluate = serving_module = _unused


class TwoLayerTask(PlannedOnly):
    """A user's task (`task: tests.unit.test_plan_plan:TwoLayerTask`): the plan sees its model,
    whatever it calls itself (was: a task named like a built-in one planned as that one's guess)."""

    name = "classification"

    def build_model(self, cfg, manifest):
        return torch.nn.Sequential(torch.nn.Linear(32, 100), torch.nn.ReLU(), torch.nn.Linear(100, 3)), {}

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    def synthetic_batch(self, cfg, manifest, size):
        return torch.randn(size, 32), torch.randint(0, 3, (size,))


def test_a_custom_task_is_planned_from_the_model_it_builds():
    cfg = gpt("ddp", 1)
    cfg.task = "tests.unit.test_plan_plan:TwoLayerTask"
    plan = make_plan(cfg)
    assert plan.shape["trainable"] == 32 * 100 + 100 + 100 * 3 + 3
    assert plan.shape["unit_params"] == []  # no ModuleList: sharded as one unit
    # Saved for backward per item: the input (32), the hidden pre- and post-ReLU (100 + 100),
    # the logits' log-softmax (3), fp32; plus the batch's labels.
    assert plan.memory.activations >= 8 * (32 + 100 + 3) * 4
    assert any("empty manifest" in a for a in plan.assumptions)


@pytest.mark.parametrize(("method", "factor"), [("full", 4 / 3), ("lora", 3 / 2)])
def test_activation_checkpointing_costs_a_second_forward_on_a_gpu(llama, no_launch_floor, method, factor):
    """The forward (2 FLOPs a weight) again: 8/6 of a full update's step, 6/4 of LoRA's, which
    computes no gradients of the frozen weights (was: 4/3 for both, LoRA's ETA and cost 11% low)."""
    points = []
    for recompute in (False, True):
        cfg = Config(task="causal_lm")
        cfg.model.init_from, cfg.model.block_size = llama, 64
        cfg.train.batch_size, cfg.job.replicas = 4, 1
        cfg.train.method, cfg.train.activation_checkpointing = method, recompute
        points.append(make_plan(cfg, gpu="H100").point(1))
    assert points[1].compute_seconds == pytest.approx(points[0].compute_seconds * factor)


@pytest.mark.parametrize("gpu", ["H100", "A100-40GB", "L4"])
def test_an_fp32_run_computes_at_the_gpu_s_fp32_rate(gpu, no_launch_floor):
    """kftrain never turns TF32 on: an fp32 run's matmuls run at the plain fp32 peak (was: timed at bf16's)."""
    from trainer.plan.hardware import gpu_spec

    plans = {p: make_plan(gpt(precision=p), gpu=gpu) for p in ("bf16", "fp32")}
    bf16, fp32 = (plans[p].scaling[0].compute_seconds for p in ("bf16", "fp32"))
    spec = gpu_spec(gpu)
    assert fp32 / bf16 == pytest.approx(spec.bf16_tflops / spec.fp32_tflops)
    assert any("fp32 (no TF32) peak" in a for a in plans["fp32"].assumptions)
    assert make_plan(gpt(precision="auto"), gpu=gpu).scaling[0].compute_seconds == bf16  # auto on a GPU: bf16


def test_a_probe_on_another_device_is_not_mixed_into_a_gpu_plan():
    """A CPU probe's compute and data wait say nothing of an H100 (was: its data wait was added
    to the FLOPs-based step, which then was not compute + communication)."""
    cpu = dataclasses.replace(probe(1.0), data_wait_seconds=0.5, device="cpu")
    plan = make_plan(gpt("ddp", 1), gpu="H100", probe=cpu)
    assert plan.scaling[0].step_seconds == pytest.approx(plan.scaling[0].compute_seconds)
    assert any("the probe ran on cpu, not the H100-80GB: its times are not used" in a for a in plan.assumptions)
    assert plan.scaling[0].compute_seconds == make_plan(gpt("ddp", 1), gpu="H100").scaling[0].compute_seconds


@pytest.mark.parametrize(
    ("device", "gpu", "used"),
    [
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("NVIDIA H100 PCIe", "H100", False),  # was: used, an H100 all the same
        ("NVIDIA L40S", "L4", False),
        ("NVIDIA L40", "L4", False),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB", True),
        ("NVIDIA A100-SXM4-40GB", "A100-80GB", False),  # its memory bandwidth is another: another type
    ],
)
def test_a_probe_s_times_are_used_only_for_its_own_gpu_type(device, gpu, used):
    measured = dataclasses.replace(probe(1.0), device=device)
    plan = make_plan(gpt("ddp", 1), gpu=gpu, probe=measured)
    assert any(f"measured by the probe on {device}" in a for a in plan.assumptions) is used, plan.assumptions


def test_strict_says_what_it_could_not_check(capsys):
    """A strict plan without a device memory or a step time passes, saying which checks it could
    not make (was: a silent pass, read in CI as checked)."""
    from trainer.pipeline_steps import refuse_if_strict

    cfg = gpt()
    refuse_if_strict(cfg, make_plan(cfg), True, switch="--strict")
    err = capsys.readouterr().err
    assert err.startswith("kftrain: --strict could not check memory") and "time against job.timeout_seconds" in err
    refuse_if_strict(cfg, make_plan(cfg, gpu="H100"), True)
    assert capsys.readouterr().err == ""  # a GPU type: both predicted
    refuse_if_strict(cfg, make_plan(cfg), False)
    assert capsys.readouterr().err == ""  # not strict: nothing to say


@pytest.mark.parametrize(
    ("device", "gpu", "used"),
    [
        ("NVIDIA L40S", "L4", False),  # an L40S is no L4
        ("NVIDIA L4", "L4", True),
        ("NVIDIA H100 80GB HBM3", "H100", True),
        ("cpu", None, False),  # a GPU plan by its memory alone: a CPU probe is not one
    ],
)
def test_a_probe_counts_only_on_the_gpu_it_ran_on(device, gpu, used):
    run = dataclasses.replace(probe(1.0), device=device)
    plan = make_plan(gpt("ddp", 1), gpu=gpu, gpu_memory_gb=None if gpu else 40.0, probe=run)
    assert any("its times are not used" in a for a in plan.assumptions) is not used


def test_efficiency_is_against_the_first_row_shown_and_a_row_that_does_not_fit_says_so():
    plan = make_plan(gpt("ddp", 2), gpu="H200", nodes=[2, 4])
    assert [p.nodes for p in plan.scaling] == [2, 4]
    assert plan.scaling[0].efficiency == pytest.approx(1.0)  # was: against a hidden N=1
    four = plan.scaling[1]
    assert f"(efficiency {four.efficiency:.0%} of linear from N=2)" in "\n".join(plan.verdicts)
    tight = make_plan(gpt("fsdp", 2), gpu_memory_gb=plan.memory.total / GiB * 0.9, nodes=[1, 2])
    said = [line for line in tight.verdicts if "its row only compares" in line]
    assert said and said[0].startswith("N=1 does not fit: ")


def test_more_network_per_node_shortens_the_multi_node_step():
    cfg = gpt("ddp", 1)
    slow = make_plan(cfg, gpu="H100", nodes=[4])
    cfg.plan.network_gbits = 3200.0
    fast = make_plan(cfg, gpu="H100", nodes=[4])
    assert fast.point(4).comm_seconds < slow.point(4).comm_seconds
    assert fast.point(1).comm_seconds == slow.point(1).comm_seconds  # within a node: NVLink either way


def test_a_small_models_gpu_step_is_bound_by_its_kernel_launches():
    """A step takes at least its kernel launches (was: the FLOP rate alone, a 0.02 us step and
    millions of samples per second for the demo's MLP); a large model's FLOPs still decide."""
    from trainer.plan.plan import KERNEL_LAUNCH_S, KERNELS_PER_TENSOR, STEP_OVERHEAD_S

    small = make_plan(gpt(replicas=1), gpu="H100")
    floor = KERNELS_PER_TENSOR * small.shape["param_tensors"] * KERNEL_LAUNCH_S + STEP_OVERHEAD_S
    assert small.point(1).compute_seconds == pytest.approx(floor) and floor > 1e-4
    assert any("kernel launches" in a for a in small.assumptions)
    accumulating = make_plan(gpt(replicas=1, grad_accum_steps=4), gpu="H100").point(1).compute_seconds
    assert accumulating == pytest.approx(4 * (floor - STEP_OVERHEAD_S) + STEP_OVERHEAD_S)  # per micro-step
    large = gpt(replicas=1, batch_size=64)
    large.model.n_layer, large.model.n_embd, large.model.n_head, large.model.block_size = 12, 768, 12, 1024
    plan = make_plan(large, gpu="H100")
    flops = plan.shape["flops_per_item"] * 1024 * 64
    assert plan.point(1).compute_seconds == pytest.approx(flops / (989e12 * 0.4))


def test_when_no_single_change_fits_the_fewest_that_do_together_are_named():
    """Was: "all of them together (fsdp, activation checkpointing, micro-batch 1)", though fsdp and
    activation checkpointing alone fitted, with less memory and no smaller micro-batch."""
    cfg = gpt("ddp", 2, batch_size=64)
    pair = make_plan(
        dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, strategy="fsdp", activation_checkpointing=True)),
        gpu="H100",
    )
    plan = make_plan(cfg, gpu_memory_gb=(pair.memory.total + 1024) / GiB)
    singles = [a for a in plan.alternatives if " with " not in a.change]
    assert plan.fits is False and singles and not any(a.fits for a in singles)
    together = {a.change: a for a in plan.alternatives if " with " in a.change}
    assert all(a.fits and a.change.count(" with ") == 1 for a in together.values())  # pairs, each fitting
    fsdp_ac = together["train.strategy: fsdp (shards over 2 ranks) with train.activation_checkpointing: true"]
    assert fsdp_ac.memory.total == pair.memory.total  # as that config's own plan predicts it
    assert not any("all of them together" in a.change for a in plan.alternatives)
    assert plan.verdicts[0].endswith("would fit with: " + "; ".join(together))


# (ranks, batch size, the last alternative's name when nothing fits, grad_accum_steps): every setting it names is one
# it applies (was: "fsdp" for one rank, where it changes nothing, and "micro-batch 1" whatever the batch).
ALL_TOGETHER = [
    (1, 8, "all of them together: train.activation_checkpointing: true with train.grad_accum_steps 8 (micro-batch 1)",
     1),
    (2, 8, "all of them together: train.strategy: fsdp (shards over 2 ranks) with "
           "train.activation_checkpointing: true with train.grad_accum_steps 4 (micro-batch 1)", 1),
    # at micro-batch 1 already: no micro-batch to name
    (2, 8, "all of them together: train.strategy: fsdp (shards over 2 ranks) with "
           "train.activation_checkpointing: true", 4),
]  # fmt: skip


def test_an_odd_micro_batch_is_not_offered_halved():
    """Was: `train.grad_accum_steps 2` offered, and the plan failing on the config it built (a micro-batch
    of 3 does not halve), naming a field the user never set."""
    plan = make_plan(gpt("ddp", 2, batch_size=6), gpu_memory_gb=0.01)
    assert plan.fits is False and plan.alternatives
    assert not any("micro-batch" in a.change and "(micro-batch 1)" not in a.change for a in plan.alternatives)


@pytest.mark.parametrize(("ranks", "batch", "named", "accum"), ALL_TOGETHER)
def test_all_of_them_together_names_the_settings_it_applies(ranks, batch, named, accum):
    plan = make_plan(gpt("ddp", ranks, batch_size=batch, grad_accum_steps=accum), gpu_memory_gb=0.01)
    assert plan.fits is False and plan.alternatives[-1].change == named
    assert not plan.alternatives[-1].fits


@pytest.mark.parametrize(("share", "said"), [(0.5, False), (0.95, True)])
def test_a_plan_that_fits_with_little_room_says_so(share, said):
    used = make_plan(gpt(), gpu="H100").memory.total
    verdict = make_plan(gpt(), gpu_memory_gb=used / share / GiB).verdicts[0]
    assert verdict.startswith("fits: ") and ("little headroom" in verdict) == said


def test_a_share_of_a_gpus_memory_is_named_beside_the_gpu():
    """`--gpu H200` with kubernetes.gpu_memory_gb 40 plans for 40 GiB and says so (was: the header
    named the H200 alone)."""
    plan = make_plan(gpt(), gpu="H200", gpu_memory_gb=40)
    assert plan.capacity_bytes == 40 * GiB
    assert plan.device == "H200-141GB"  # the name, as --json gives it
    head = "device H200-141GB (40 GiB of it, kubernetes.gpu_memory_gb or --gpu-memory)."
    assert head in plan.markdown().splitlines()[2]
    assert make_plan(gpt(), gpu="H200").markdown().splitlines()[2].endswith("device H200-141GB.")


def test_a_cpu_plan_counts_processes_and_a_gpu_plan_gpus():
    """A plan of this machine's CPU (a probe here) said "GPUs" and "GPU-hours"."""
    cpu = make_plan(gpt("ddp", 1), probe=probe(1.0), nodes=(1, 2), price_per_gpu_hour=2.0)
    gpu = make_plan(gpt("ddp", 1), gpu="H100", nodes=(1, 2), price_per_gpu_hour=2.0)
    assert any("for 2x the processes" in v for v in cpu.verdicts) and "process-hours" in cpu.markdown()
    assert "GPU" not in "".join(cpu.verdicts) + cpu.markdown().split("## Scaling")[1]
    assert any("for 2x the GPUs" in v for v in gpu.verdicts) and "| GPU-hours |" in gpu.markdown()
