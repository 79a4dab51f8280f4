"""components.loading: kftrain's component YAMLs loaded with what kfp's own loader drops."""

# No `from __future__ import annotations`: kfp reads the pipeline function's annotations as types.

import tempfile
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl
from kfp import components as kfp_components

from components.loading import load_component

COMPILED = Path(__file__).resolve().parents[2] / "compiled" / "components"


def _compiled_train_task(train) -> dict:
    """The `train` component's spec in a user's pipeline that gives the task a GPU and a toleration."""

    @dsl.pipeline
    def user_pipeline(config: str = ""):
        data = dsl.importer(artifact_uri="s3://bucket/dataset", artifact_class=dsl.Dataset)
        task = train(dataset=data.output, config=config)
        task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.yaml"
        compiler.Compiler().compile(user_pipeline, str(out))
        return yaml.safe_load(out.read_text())["components"]["comp-train"]


def test_the_train_component_keeps_its_task_settings_for_the_replicas():
    """Was: loaded with kfp's loader (as docs/components.md showed), the task's GPU, resources,
    tolerations, ... went to the launcher pod alone, and nothing said so."""
    declared = yaml.safe_load((COMPILED / "train.yaml").read_text())["root"]["taskConfigPassthroughs"]
    assert _compiled_train_task(load_component(COMPILED / "train.yaml"))["taskConfigPassthroughs"] == declared
    # What kfp 2.17's own loader does, and why this loader exists: if it ever keeps them, this fails.
    assert "taskConfigPassthroughs" not in _compiled_train_task(
        kfp_components.load_component_from_file(str(COMPILED / "train.yaml"))
    )


YAMLS = sorted([*COMPILED.glob("*.yaml"), *COMPILED.parent.glob("*.yaml")])


@pytest.mark.parametrize("path", YAMLS, ids=[f"{p.parent.name}/{p.name}" for p in YAMLS])
def test_every_compiled_yaml_loads_as_kfp_loads_it_otherwise(path):
    """The components and the whole pipeline (two YAML documents: was refused by the loader)."""
    ours, theirs = load_component(path), kfp_components.load_component_from_file(str(path))
    assert ours.component_spec.inputs == theirs.component_spec.inputs
    assert ours.component_spec.outputs == theirs.component_spec.outputs
    declared = next(yaml.safe_load_all(path.read_text()))["root"].get("taskConfigPassthroughs")
    assert bool(ours.component_spec.task_config_passthroughs) == bool(declared)
