"""KFP component: launch the distributed training job and wait for it."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
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
    """Run distributed data-parallel training as a PyTorchJob (1 Master + `job.replicas - 1`
    Workers, `job.nproc_per_node` processes each) and wait for it to finish.

    The replicas read the dataset from and write the model to the object store themselves.
    Disable caching on this task: a cached step would skip the job and report a stale model.

    Args:
        dataset: The prepared dataset.
        model: The trained model (weights, `model.json`, `training.json`, checkpoints).
        metrics: Training metrics (final loss, validation accuracy, throughput).
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
        launcher: `auto` (Kubernetes in a pod, else local processes), `kubernetes` or `local`.
        run_id: `dsl.PIPELINE_JOB_ID_PLACEHOLDER`; with the next two it names the job, the same
            for a retry of this task and different for any other task (see docs/pipeline.md, "Job names").
        task_name: `dsl.PIPELINE_TASK_NAME_PLACEHOLDER`.
        dag_execution_id: `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (KFP resolves it to the enclosing
            DAG's execution id). Without these three, the model artifact's URI names the job.
    """
    from components.params import config_from_params
    from components.runtime import end_with_one_line, log_scalars, output_uri, task_identity
    from trainer.pipeline_steps import select_backend, train_model

    end_with_one_line("train")
    cfg = config_from_params(config)
    identity = task_identity(run_id, task_name, dag_execution_id, model.uri)
    record = train_model(
        cfg,
        dataset.uri,
        output_uri(model, cfg.store.uri, identity, "model"),
        select_backend(launcher),
        identity=identity,
    )
    log_scalars(metrics, record["metrics"])
    model.metadata["framework"] = "pytorch"
    model.metadata["parameter_digest"] = record["parameter_digest"]
