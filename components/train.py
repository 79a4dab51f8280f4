"""KFP component: launch the distributed training job and wait for it.

Where the installed KFP SDK has `dsl.TaskConfig` (kfp >= 2.15), the component declares
`task_config_passthroughs`: the resources, environment, tolerations, node selector, affinity and
volumes set on its task reach the training replicas (`trainer.launch.taskconfig`; precedence in
docs/components.md, "Task settings"). With an older SDK it compiles without them.

The bodies only import `components.runtime`: at run time KFP's executor sets `_KFP_RUNTIME=true`,
under which `kfp.dsl` leaves out `component` and `TaskConfigPassthrough` (kfp/dsl/__init__.py,
"compile-time only dependencies"), so this module cannot be imported there.
"""

from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.image import IMAGE

#: kfp >= 2.15: `dsl.TaskConfig` (the settings the driver hands the component) and
#: `dsl.TaskConfigPassthrough` (which of them it receives).
TASK_CONFIG_SUPPORTED = hasattr(dsl, "TaskConfig") and hasattr(dsl, "TaskConfigPassthrough")


def passthroughs() -> list[Any]:
    """The task settings the component takes over. `apply_to_task` keeps one on the launcher's own pod
    too (the KFP driver's `getTaskConfigOptions`: a field passed through is left off the task pod
    unless so): the environment stays, since the launcher reads the object store with the task's
    Secret and names its own pod as the job's owner (`launcher_task_options`); resources, scheduling
    and volumes go to the replicas only: the launcher needs no GPU, and a ReadWriteOnce volume
    cannot be attached on the launcher's node and a replica's at once."""
    field, through = dsl.TaskConfigField, dsl.TaskConfigPassthrough
    return [
        through(field=field.RESOURCES, apply_to_task=False),
        through(field=field.ENV, apply_to_task=True),
        through(field=field.KUBERNETES_TOLERATIONS, apply_to_task=False),
        through(field=field.KUBERNETES_NODE_SELECTOR, apply_to_task=False),
        through(field=field.KUBERNETES_AFFINITY, apply_to_task=False),
        through(field=field.KUBERNETES_VOLUMES, apply_to_task=False),
    ]


TRAIN_DOC = """Run distributed data-parallel training as a PyTorchJob (1 Master + `job.replicas - 1`
    Workers, `job.nproc_per_node` processes each) and wait for it to finish.

    The replicas read the dataset from and write the model to the object store themselves.
    Disable caching on this task: a cached step would skip the job and report a stale model.
    Resources, environment (Secrets included), tolerations, node selector, affinity and volumes set
    on this task go to the replicas; a `kubernetes.*` config field set too wins (docs/components.md).

    Args:
        dataset: The prepared dataset.
        model: The trained model (weights, `model.json`, `training.json`, checkpoints).
        metrics: Training metrics (final loss, validation accuracy, throughput).
        task_config: Filled by KFP with this task's pod settings (never set it yourself).
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
        launcher: `auto` (Kubernetes in a pod, else local processes), `kubernetes` or `local`.
        run_id: `dsl.PIPELINE_JOB_ID_PLACEHOLDER`; with the next two it names the job, the same
            for a retry of this task and different for any other task (see docs/pipeline.md, "Job names").
        task_name: `dsl.PIPELINE_TASK_NAME_PLACEHOLDER`.
        dag_execution_id: `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (KFP resolves it to the enclosing
            DAG's execution id). Without these three, the model artifact's URI names the job.
    """

if TASK_CONFIG_SUPPORTED:

    def train(
        dataset: Input[Dataset],
        model: Output[Model],
        metrics: Output[Metrics],
        task_config: dsl.TaskConfig,
        config: str = "",
        launcher: str = "auto",
        run_id: str = "",
        task_name: str = "",
        dag_execution_id: str = "",
    ) -> None:
        from components.runtime import task_settings, train_step

        settings = task_settings(task_config)
        train_step(dataset, model, metrics, config, launcher, run_id, task_name, dag_execution_id, settings)

    train.__doc__ = TRAIN_DOC
    train = dsl.component(base_image=IMAGE, install_kfp_package=False, task_config_passthroughs=passthroughs())(train)
else:

    def train(
        dataset: Input[Dataset],
        model: Output[Model],
        metrics: Output[Metrics],
        config: str = "",
        launcher: str = "auto",
        run_id: str = "",
        task_name: str = "",
        dag_execution_id: str = "",
    ) -> None:
        from components.runtime import train_step

        train_step(dataset, model, metrics, config, launcher, run_id, task_name, dag_execution_id, {})

    train.__doc__ = TRAIN_DOC.replace(
        "        task_config: Filled by KFP with this task's pod settings (never set it yourself).\n", ""
    )
    train = dsl.component(base_image=IMAGE, install_kfp_package=False)(train)
