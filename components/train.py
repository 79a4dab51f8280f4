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
    replicas: int = 2,
    nproc_per_node: int = 1,
    epochs: int = 20,
    batch_size: int = 64,
    learning_rate: float = 0.003,
    image: str = "ghcr.io/kftrain/kftrain:0.1.0",
    timeout_seconds: int = 3600,
    gpus_per_node: int = 0,
    queue: str = "",
    store: str = "",
    s3_endpoint: str = "",
    launcher: str = "auto",
    run_id: str = "",
    task_id: str = "",
) -> None:
    """Run distributed data-parallel training as a PyTorchJob-shaped job (1 Master +
    `replicas - 1` Workers, `nproc_per_node` processes each) and wait for it to finish.

    The replicas read the dataset from and write the model to the object store themselves.

    Args:
        dataset: The prepared dataset.
        model: The trained model (weights, `model.json`, `training.json`).
        metrics: Training metrics (final loss, validation accuracy, throughput).
        config: The full kftrain config as YAML/JSON; the parameters below override it.
        replicas: Replicas in total, the Master included.
        nproc_per_node: Training processes (GPUs) per replica.
        epochs: Passes over the training split.
        batch_size: Global batch size; must divide by replicas x nproc_per_node.
        learning_rate: AdamW learning rate.
        image: Image of the training replicas.
        timeout_seconds: Wall-clock limit of the job; past it the job is cancelled.
        gpus_per_node: `nvidia.com/gpu` per replica (0: CPU); must equal nproc_per_node when set.
        queue: Kueue LocalQueue of the job (the `kueue.x-k8s.io/queue-name` label).
        store: Artifact root (`s3://bucket/prefix` or a path); empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint URL of the store.
        launcher: `auto` (Kubernetes in a pod, else local processes), `kubernetes` or `local`.
        run_id: The KFP run id (with task_id, it names the job deterministically).
        task_id: The KFP task id.
    """
    from components.params import config_from_params
    from components.runtime import log_scalars, output_uri
    from trainer.steps import select_backend, train_model

    cfg = config_from_params(
        config,
        replicas=replicas,
        nproc_per_node=nproc_per_node,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        image=image,
        timeout_seconds=timeout_seconds,
        gpus_per_node=gpus_per_node,
        queue=queue,
        store=store,
        s3_endpoint=s3_endpoint,
    )
    record = train_model(
        cfg,
        dataset.uri,
        output_uri(model, store, run_id, "model"),
        select_backend(launcher),
        run_id=run_id,
        task_id=task_id,
    )
    log_scalars(metrics, record["metrics"])
    model.metadata["framework"] = "pytorch"
    model.metadata["parameter_digest"] = record["parameter_digest"]
