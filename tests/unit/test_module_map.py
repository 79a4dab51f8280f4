"""The map from a module to its tests: `trainer/launch/local.py` is tested in
`tests/{unit,integration}/test_launch_local.py`, `components/params.py` in
`test_components_params.py`, `pipelines/cli.py` in `test_pipelines_cli.py`. A module without a
file of its own name says here where it is tested, so a maintainer changing it knows what to run.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = (REPO / "tests" / "unit", REPO / "tests" / "integration")

#: Module -> the test files that cover it, where no test file carries its name.
TESTED_IN = {
    "trainer/example_model.py": ["test_pipeline_local.py", "test_tasks_pretrained_lm.py", "test_chat_data.py"],
    "trainer/credentials.py": ["test_config.py", "test_launch_byo.py"],
    "trainer/evaluate.py": ["test_evaluate_export.py", "test_report.py"],
    "trainer/export.py": ["test_evaluate_export.py", "test_train.py", "test_export_pretrained.py"],
    "trainer/gpt.py": ["test_train.py", "test_tokenizer.py"],
    "trainer/hf_export.py": ["test_train.py", "test_tasks_causal_lm.py", "test_launch_inferenceservice.py"],
    "trainer/horovod/run.py": ["test_horovod.py"],
    "trainer/horovod/sync_batch_norm.py": ["test_horovod_collectives.py"],
    "trainer/horovod/timeline.py": ["test_horovod_collectives.py"],
    "trainer/horovod/shim/horovod/torch/elastic.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/common/exceptions.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/common/process_sets.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/torch/compression.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/torch/functions.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/torch/mpi_ops.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/torch/optimizer.py": ["test_horovod_api.py"],
    "trainer/horovod/shim/horovod/torch/sync_batch_norm.py": ["test_horovod_api.py"],
    "trainer/launch/backend.py": ["test_launch_local.py", "test_launch_kubernetes.py"],
    "trainer/launch/job.py": ["test_launch_pytorchjob.py", "test_launch_trainjob.py", "test_launch_fieldrules.py"],
    "trainer/launch/logstream.py": ["test_launch_kubernetes.py", "test_launch_kubernetes_trainjob.py"],
    "trainer/launch/preflight.py": [
        "test_launch_pytorchjob.py",
        "test_launch_trainjob.py",
        "test_launch_fieldrules.py",
    ],
    "trainer/model_io.py": ["test_evaluate_export.py", "test_train.py"],
    "trainer/partitions.py": ["test_streaming.py", "test_config.py"],
    "trainer/rng.py": ["test_checkpoint.py"],
    "trainer/safetensors_file.py": ["test_consolidate.py"],
    "trainer/tasks/base.py": ["test_train.py", "test_layering.py"],
    "trainer/tasks/classification/model.py": ["test_evaluate_export.py", "test_train.py"],
    "trainer/tasks/classification/report.py": ["test_report.py", "test_report_browser.py"],
    "trainer/tasks/classification/task.py": ["test_train.py", "test_evaluate_export.py", "test_plan_probe.py"],
    "components/configure.py": ["test_components_params.py", "test_component_yamls.py"],
    "components/data_prep.py": ["test_pipeline_local.py", "test_component_yamls.py"],
    "components/evaluate.py": ["test_pipeline_local.py", "test_component_yamls.py"],
    "components/gate.py": ["test_pipeline_local.py", "test_pipelines_compile.py"],
    "components/plan.py": ["test_pipeline_local.py", "test_pipelines_compile.py"],
    "components/pytorchjob.py": ["test_launch_byo.py", "test_byo_pipeline.py"],
    "components/task_options.py": ["test_pipelines_compile.py", "test_byo_pipeline.py"],
    "pipelines/registry.py": ["test_pipelines_compile.py"],
    "pipelines/training.py": ["test_pipelines_compile.py", "test_pipeline_local.py"],
}


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for top in ("trainer", "components", "pipelines")
        for p in (REPO / top).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    )


def own_test_name(module: str) -> str:
    """`trainer/launch/local.py` -> `test_launch_local.py`; `components/x.py` -> `test_components_x.py`."""
    top, *rest = Path(module).with_suffix("").parts
    return "test_" + "_".join(rest if top == "trainer" else [top, *rest]) + ".py"


def test_every_module_has_tests_named_after_it_or_listed_here():
    exists = {p.name for tier in TIERS for p in tier.glob("test_*.py")}
    unmapped = [m for m in modules() if own_test_name(m) not in exists and m not in TESTED_IN]
    assert not unmapped, f"add tests/unit/{own_test_name(unmapped[0])} or list {unmapped} in TESTED_IN"
    stale = [m for m in TESTED_IN if m not in modules() or own_test_name(m) in exists]
    assert not stale, f"TESTED_IN lists modules that are gone or have their own test file: {stale}"
    missing = {f for files in TESTED_IN.values() for f in files} - exists
    assert not missing, f"TESTED_IN names test files that do not exist: {sorted(missing)}"
