"""The training component's task-config passthroughs: what the compiled YAML declares, the
component run the way the KFP runtime runs it with the task's settings, and the component
without them where the KFP SDK has no `dsl.TaskConfig`."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl
from kfp.dsl.executor import Executor

import components.train as train_module
import trainer.pipeline_steps
from components.runtime import task_settings
from tests.unit.test_launch_taskconfig import DRIVER_TASK_CONFIG, SECRET_ENV, TOLERATION
from trainer.launch.job import training_job
from trainer.launch.jobkind import BY_NAME
from trainer.launch.spec import job_name

REPO = Path(__file__).resolve().parents[2]
#: What `train` declares (kfp's `TaskConfigField` names) and whether each also stays on the launcher pod.
PASSTHROUGHS = {
    "RESOURCES": False,
    "ENV": True,
    "KUBERNETES_TOLERATIONS": False,
    "KUBERNETES_NODE_SELECTOR": False,
    "KUBERNETES_AFFINITY": False,
    "KUBERNETES_VOLUMES": False,
}


def declared(component_spec: dict) -> dict[str, bool]:
    return {p["field"]: p.get("applyToTask", False) for p in component_spec.get("taskConfigPassthroughs", [])}


@pytest.mark.parametrize("path", ["compiled/components/train.yaml", "compiled/training_pipeline.yaml"])
def test_the_compiled_train_component_declares_the_passthroughs(path):
    spec = next(yaml.safe_load_all((REPO / path).read_text()))
    comp = spec["components"]["comp-train"]
    assert declared(comp) == PASSTHROUGHS
    assert comp["inputDefinitions"]["parameters"]["task_config"] == {
        "description": "Filled by KFP with this task's pod settings (never set it yourself).",
        "isOptional": True,
        "parameterType": "TASK_CONFIG",
    }


def test_the_component_run_by_the_kfp_executor_gives_the_task_settings_to_the_replicas(tmp_path, monkeypatch):
    """`kfp.local` does not fill a TaskConfig input (its runner has no passthrough support), so this
    runs the component's function through kfp's own `Executor` with the executor input the KFP
    driver hands the launcher: the driver's TaskConfig JSON under the `task_config` parameter
    (kubeflow/pipelines `backend/src/v2/driver/container.go` replaces that input with it). Only the
    cluster run is left out: `train_model` builds the job the Kubernetes backend would create,
    from the config the component hands it, and checks it against the CRD schemas."""
    built = {}

    def build_job(cfg, dataset_uri, model_uri, backend, identity):
        kind = BY_NAME[cfg.job.kind]
        manifest = kind.build(training_job(cfg, job_name(identity), dataset_uri, model_uri), "team-a", None)
        kind.validate(manifest)
        built.update(manifest=manifest, model_uri=model_uri)
        return {"metrics": {"final_loss": 0.5}, "parameter_digest": "abc"}

    monkeypatch.setattr(trainer.pipeline_steps, "train_model", build_job)
    monkeypatch.setattr("sys.excepthook", __import__("sys").excepthook)  # end_with_one_line sets one
    config = {"store": {"uri": "s3://kftrain"}, "kubernetes": {"cpu": "16", "node_selector": {"pool": "gpu"}}}

    def artifact(name, kind, uri):
        return {"artifacts": [{"name": name, "type": {"schemaTitle": kind}, "uri": uri, "metadata": {}}]}

    executor_input = {
        "inputs": {
            "parameterValues": {
                "config": json.dumps(config),
                "launcher": "local",
                "run_id": "run-1",
                "task_name": "train",
                "dag_execution_id": "7",
                "task_config": DRIVER_TASK_CONFIG,
            },
            "artifacts": {"dataset": artifact("dataset", "system.Dataset", "s3://kftrain/run-1/dataset")},
        },
        "outputs": {
            "artifacts": {
                "model": artifact("model", "system.Model", "s3://kfp/model"),
                "metrics": artifact("metrics", "system.Metrics", "s3://kfp/metrics"),
            },
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }
    Executor(executor_input, train_module.train).execute()

    assert built["model_uri"] == "s3://kftrain/run-1/train-7/model"
    for template in built["manifest"]["spec"]["pytorchReplicaSpecs"].values():
        pod = template["template"]["spec"]
        (container,) = pod["containers"]
        assert container["resources"]["limits"] == {"cpu": "16", "memory": "32Gi", "nvidia.com/gpu": "1"}
        assert SECRET_ENV in container["env"] and {"name": "WANDB_PROJECT", "value": "digits"} in container["env"]
        assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
        assert {"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}} in pod["volumes"]
        assert pod["tolerations"] == [TOLERATION]
        assert pod["nodeSelector"] == {"accelerator": "h100", "pool": "gpu"}
    output = json.loads((tmp_path / "executor_output.json").read_text())
    assert output["artifacts"]["model"]["artifacts"][0]["metadata"]["parameter_digest"] == "abc"


def test_task_settings_reads_back_the_driver_json():
    task_config = dsl.TaskConfig(
        tolerations=[TOLERATION], node_selector={"a": "b"}, volume_mounts=[{"name": "d", "mountPath": "/d"}]
    )
    assert task_settings(task_config) == {
        "tolerations": [TOLERATION],
        "nodeSelector": {"a": "b"},
        "volumeMounts": [{"name": "d", "mountPath": "/d"}],
    }


def test_without_dsl_task_config_the_component_compiles_without_passthroughs(tmp_path, monkeypatch):
    """An SDK older than kfp 2.15 has neither `dsl.TaskConfig` nor `dsl.TaskConfigPassthrough`."""
    monkeypatch.delattr(dsl, "TaskConfig")
    monkeypatch.delattr(dsl, "TaskConfigPassthrough")
    try:
        old = importlib.reload(train_module)
        assert not old.TASK_CONFIG_SUPPORTED
        compiler.Compiler().compile(old.train, str(tmp_path / "train.yaml"))
        comp = next(yaml.safe_load_all((tmp_path / "train.yaml").read_text()))["components"]["comp-train"]
        assert "taskConfigPassthroughs" not in comp
        assert "task_config" not in comp["inputDefinitions"]["parameters"]
        assert "task_config" not in old.train.component_spec.description
        assert set(comp["inputDefinitions"]["parameters"]) == {
            "config",
            "launcher",
            "run_id",
            "task_name",
            "dag_execution_id",
        }
    finally:
        monkeypatch.undo()
        assert importlib.reload(train_module).TASK_CONFIG_SUPPORTED
