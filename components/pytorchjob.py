"""KFP component: bring your own image (BYO): run any image and command as a PyTorchJob or a
TrainJob (`kind`), and wait for it.

The published name `pytorchjob` (this file, `compiled/components/pytorchjob.yaml`) predates
TrainJob support and is kept so pipelines that load the component keep working; in code this
launcher is `byo` (`trainer/launch/byo.py` documents the replicas' contract). The replicas
need not contain kftrain: they get the Training Operator's (or Trainer v2's) environment plus
the artifact URIs and store credentials. Use it with caching off and the launcher pod's identity
exposed (`components.task_options.launcher_task_options`).
"""

from kfp import dsl
from kfp.dsl import Artifact, Input, Model, Output

from components.image import IMAGE


# The defaults below are KFP parameter defaults read from the signature, never mutated.
@dsl.component(base_image=IMAGE, install_kfp_package=False)
def pytorchjob(
    image: str,
    command: list,
    model: Output[Model],
    input_data: Input[Artifact] = None,
    replicas: int = 2,
    nproc_per_node: int = 1,
    gpus_per_node: int = 0,
    env: dict = {},  # noqa: B006
    node_selector: dict = {},  # noqa: B006
    tolerations: list = [],  # noqa: B006
    volumes: list = [],  # noqa: B006
    volume_mounts: list = [],  # noqa: B006
    namespace: str = "",
    queue: str = "",
    timeout_seconds: int = 3600,
    store_secret: str = "mlpipeline-minio-artifact",
    store_secret_keys: dict = {},  # noqa: B006
    s3_endpoint: str = "",
    launcher: str = "auto",
    kind: str = "pytorchjob",
    run_id: str = "",
    task_name: str = "",
    dag_execution_id: str = "",
) -> None:
    """Run `command` in `image` as a PyTorchJob (1 Master + `replicas - 1` Workers) or a TrainJob (`kind`), and wait.

    Every replica gets the Training Operator's environment (MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, PET_*), KFTRAIN_OUTPUT_URI (the `model` artifact: rank 0 writes there),
    KFTRAIN_INPUT_URI (the `input_data` artifact, when given), AWS_ENDPOINT_URL (when
    `s3_endpoint` is set) and the store keys from `store_secret` via secretKeyRef. The job is
    validated before it is submitted, named from the run and task (a retry re-attaches),
    deleted when the step fails, times out or is cancelled, and its replicas' logs stream into
    this step's log. Turn caching off on the task (`set_caching_options(False)`).

    Args:
        image: Container image of every replica; it need not contain kftrain.
        command: The replicas' command, e.g. ["python", "train.py"]; with nproc_per_node > 1 a
            torchrun invocation (RANK is then a node rank).
        model: The output artifact; the replicas write it at KFTRAIN_OUTPUT_URI (rank 0).
        input_data: An optional input artifact, given to the replicas as KFTRAIN_INPUT_URI.
        replicas: Replicas in total, the Master included.
        nproc_per_node: Processes per replica (PET_NPROC_PER_NODE; WORLD_SIZE = replicas x this).
        gpus_per_node: `nvidia.com/gpu` limit of each replica; 0: CPU only.
        env: Extra plain environment of the replicas; credential-looking names (*SECRET*,
            *_TOKEN, *_PASSWORD, ...) or values are refused: use store_secret/store_secret_keys.
        node_selector: nodeSelector labels of the replica pods.
        tolerations: Tolerations of the replica pods, as in a pod spec.
        volumes: Extra volumes of the replica pods, as in a pod spec (e.g. a persistentVolumeClaim).
        volume_mounts: Mounts of those volumes in the training container, as in a pod spec.
        namespace: Namespace of the PyTorchJob; empty: this step's own namespace.
        queue: Kueue LocalQueue of the job (the `kueue.x-k8s.io/queue-name` label); empty: none.
        timeout_seconds: Wall-clock limit of the job; past it the job is deleted and the step fails.
        store_secret: Secret holding the object-store keys; empty: no keys are injected.
        store_secret_keys: Key in store_secret -> environment variable; empty: accesskey ->
            AWS_ACCESS_KEY_ID, secretkey -> AWS_SECRET_ACCESS_KEY.
        s3_endpoint: S3 endpoint URL given to the replicas as AWS_ENDPOINT_URL; empty: not set.
        launcher: `auto` (Kubernetes inside a pod, else local processes), `kubernetes` or `local`.
        kind: `pytorchjob` (Training Operator v1), `trainjob` (Kubeflow Trainer v2: the replicas
            get only PET_* variables) or `auto` (what the cluster serves, TrainJob first).
        run_id: The KFP run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER): names the job.
        task_name: The task's name (dsl.PIPELINE_TASK_NAME_PLACEHOLDER): names the job.
        dag_execution_id: The enclosing DAG's execution (dsl.PIPELINE_TASK_ID_PLACEHOLDER): names the job.
    """
    from components.params import as_text, plain_values
    from components.runtime import end_with_one_line, task_identity
    from trainer.launch.backend import run_job
    from trainer.launch.byo import byo_job, check_output_written
    from trainer.launch.spec import job_name
    from trainer.pipeline_steps import resolve_launcher, say_where_gpus_are_not, select_backend

    end_with_one_line("pytorchjob")
    where = resolve_launcher(launcher)
    # KFP hands numbers inside list/dict parameters over as floats (300.0): undo that first; a JSON
    # scalar where text goes is its JSON text (`true`, `5`), as a pod spec's YAML would be written.
    spec = byo_job(
        name=job_name(task_identity(run_id, task_name, dag_execution_id, model.uri)),
        image=image,
        command=[as_text(c) for c in command],
        output_uri=model.uri,
        input_uri=input_data.uri if input_data is not None else "",
        replicas=replicas,
        nproc_per_node=nproc_per_node,
        gpus_per_node=gpus_per_node,
        env={k: as_text(v) for k, v in env.items()},
        node_selector={k: as_text(v) for k, v in node_selector.items()},
        tolerations=plain_values(tolerations),
        volumes=plain_values(volumes),
        volume_mounts=plain_values(volume_mounts),
        namespace=namespace,
        queue=queue,
        timeout_s=timeout_seconds,
        store_secret=store_secret,
        store_secret_keys=store_secret_keys,
        s3_endpoint=s3_endpoint,
        cluster=where == "kubernetes",
        kind=kind,
    )
    backend = select_backend(where)
    say_where_gpus_are_not(gpus_per_node, backend, "gpus_per_node")
    run_job(backend, spec)
    if note := check_output_written(spec.name, model.uri, s3_endpoint):
        print(f"kftrain: note: {note}", flush=True)
    model.metadata["job_name"] = spec.name
    model.metadata["image"] = image
