"""The training pipeline: data prep -> distributed training -> evaluation -> export."""

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Dataset, Metrics, Model

from components.data_prep import data_prep
from components.evaluate import evaluate
from components.export import export
from components.gate import quality_gate_failed
from components.image import IMAGE
from components.train import train
from trainer.launch.spec import POD_NAME_ENV, POD_UID_ENV

#: The Secret holding the object-store keys (KFP's own by default) and the env it fills.
STORE_SECRET = "mlpipeline-minio-artifact"
STORE_SECRET_ENV = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}


class TrainingOutputs(NamedTuple):
    """What a run produces, for callers of the pipeline (the local runner reads these)."""

    dataset: Dataset
    model: Model
    metrics: Metrics
    report: HTML


def _with_store_credentials(task: dsl.PipelineTask) -> dsl.PipelineTask:
    kubernetes.use_secret_as_env(task, secret_name=STORE_SECRET, secret_key_to_env=STORE_SECRET_ENV)
    return task


@dsl.pipeline(
    name="kftrain-training",
    description="Data prep, distributed PyTorch training (PyTorchJob), evaluation and export.",
)
def training_pipeline(
    config: str = "",
    data_source: str = "",
    replicas: int = 2,
    nproc_per_node: int = 1,
    epochs: int = 20,
    batch_size: int = 64,
    learning_rate: float = 0.003,
    image: str = IMAGE,
    timeout_seconds: int = 3600,
    gpus_per_node: int = 0,
    queue: str = "",
    store: str = "",
    s3_endpoint: str = "http://seaweedfs.kubeflow:9000",
    launcher: str = "auto",
    min_accuracy: float = 0.9,
    max_perplexity: float = 0.0,
) -> TrainingOutputs:
    """Train a classifier with DDP across `replicas` x `nproc_per_node` processes.

    Args:
        config: The full kftrain config as YAML/JSON; the parameters below override it.
        data_source: `digits`/CSV URI (classification), `python-stdlib`/text URI (causal_lm); empty: the default.
        replicas: Training replicas in total: 1 Master + (replicas - 1) Workers.
        nproc_per_node: Training processes (GPUs) per replica.
        epochs: Passes over the training split.
        batch_size: Global batch size; must divide by replicas x nproc_per_node.
        learning_rate: AdamW learning rate.
        image: Image of the training replicas.
        timeout_seconds: Wall-clock limit of the training job.
        gpus_per_node: GPUs per replica (0: CPU); must equal nproc_per_node when set.
        queue: Kueue LocalQueue for the training job; empty: none.
        store: Artifact root (`s3://bucket/prefix`); empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint of the store (KFP's own store: seaweedfs, or minio-service before 2.16).
        launcher: `auto`, `kubernetes` or `local`.
        min_accuracy: Quality gate (classification): export only at or above this test accuracy.
        max_perplexity: Quality gate (causal_lm): export only at or below this perplexity; 0: no bar.
    """
    shared = {
        "config": config,
        "store": store,
        "s3_endpoint": s3_endpoint,
        "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    }
    prep = _with_store_credentials(data_prep(data_source=data_source, **shared))
    prep.set_display_name("data prep")
    fit = _with_store_credentials(
        train(
            dataset=prep.outputs["dataset"],
            replicas=replicas,
            nproc_per_node=nproc_per_node,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            image=image,
            timeout_seconds=timeout_seconds,
            gpus_per_node=gpus_per_node,
            queue=queue,
            launcher=launcher,
            task_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER,
            **shared,
        )
    )
    # A cached training step would skip the job yet report success with a stale model.
    fit.set_caching_options(False)
    # The job gets an ownerReference to this pod: cancelling the run deletes the job.
    kubernetes.use_field_path_as_env(fit, env_name=POD_NAME_ENV, field_path="metadata.name")
    kubernetes.use_field_path_as_env(fit, env_name=POD_UID_ENV, field_path="metadata.uid")
    fit.set_display_name("distributed training")
    ev = _with_store_credentials(
        evaluate(
            dataset=prep.outputs["dataset"],
            model=fit.outputs["model"],
            min_accuracy=min_accuracy,
            max_perplexity=max_perplexity,
            **shared,
        )
    )
    ev.set_display_name("evaluation")
    with dsl.If(ev.outputs["passed"] == True, name="quality-gate-passed"):  # noqa: E712 (a KFP condition)
        ex = _with_store_credentials(export(model=fit.outputs["model"], metrics=ev.outputs["metrics"], **shared))
        ex.set_display_name("model export")
    with dsl.Else(name="quality-gate-failed"):
        stop = quality_gate_failed(reason=ev.outputs["reason"])
        stop.set_display_name("quality gate failed")
    return TrainingOutputs(
        dataset=prep.outputs["dataset"],
        model=fit.outputs["model"],
        metrics=ev.outputs["metrics"],
        report=ev.outputs["report"],
    )
