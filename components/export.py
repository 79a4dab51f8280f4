"""KFP component: export the trained model for serving."""

from kfp import dsl
from kfp.dsl import Input, Metrics, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def export(
    model: Input[Model],
    metrics: Input[Metrics],
    exported: Output[Model],
    config: str = "",
    run_id: str = "",
    task_name: str = "",
    dag_execution_id: str = "",
) -> None:
    """Write TorchScript, safetensors and a JSON model card (inputs, classes, metrics, training
    config, source dataset) for serving.

    Args:
        model: The trained model.
        metrics: The evaluation metrics (its `metrics.json` goes into the model card).
        exported: The export folder.
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
        run_id: `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (with the next two, names the output folder
            under `store.uri`; without them the artifact's URI does).
        task_name: `dsl.PIPELINE_TASK_NAME_PLACEHOLDER`.
        dag_execution_id: `dsl.PIPELINE_TASK_ID_PLACEHOLDER`.
    """
    from components.params import config_from_params
    from components.runtime import end_with_one_line, output_uri, task_identity
    from trainer.pipeline_steps import evaluation_of
    from trainer.pipeline_steps import export as export_step

    end_with_one_line("export")
    cfg = config_from_params(config)
    identity = task_identity(run_id, task_name, dag_execution_id, exported.uri)
    summary = evaluation_of(cfg, metrics.uri, model.uri)
    card = export_step(cfg, model.uri, output_uri(exported, cfg.store.uri, identity, "exported"), summary)
    exported.metadata["files"] = card["files"]
