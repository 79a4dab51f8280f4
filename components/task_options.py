"""Pipeline-side settings of the tasks that launch a training job (used when wiring, not at run time)."""

from kfp import dsl, kubernetes

from trainer.launch.spec import POD_NAME_ENV, POD_UID_ENV


def launcher_task_options(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """What every task that launches a job needs, which a component cannot set on itself:
    caching off (a cached step would skip the job and report a stale artifact), and the pod's
    name and uid as environment, so the job is owned by the pod and deleted with the run."""
    task.set_caching_options(False)
    kubernetes.use_field_path_as_env(task, env_name=POD_NAME_ENV, field_path="metadata.name")
    kubernetes.use_field_path_as_env(task, env_name=POD_UID_ENV, field_path="metadata.uid")
    return task
