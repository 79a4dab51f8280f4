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
    import json

    from components.params import config_from_params
    from components.runtime import end_with_one_line, output_uri, task_identity
    from trainer.config import ConfigError
    from trainer.evaluate import EVAL_RECORD
    from trainer.pipeline_steps import export as export_step
    from trainer.pipeline_steps import same_artifact, store_for
    from trainer.storage import join_uri

    end_with_one_line("export")
    cfg = config_from_params(config)
    identity = task_identity(run_id, task_name, dag_execution_id, exported.uri)
    store, record = store_for(cfg, metrics.uri), join_uri(metrics.uri, EVAL_RECORD)
    if not store.exists(record):  # another step's Metrics (training's, a user's own component)
        raise ConfigError(
            f"metrics: no {EVAL_RECORD} at {metrics.uri}: pass the evaluate step's `metrics` output, whose "
            "record export reads (a training step's metrics are not one)"
        )
    report = json.loads(store.get_bytes(record))
    scored = report.get("model_uri")
    if isinstance(scored, str) and scored and not same_artifact(scored, model.uri):
        raise ConfigError(
            f"metrics: the evaluation at {metrics.uri} scored the model at {scored}, not {model.uri}: its numbers "
            "would go into this model's card; pass the evaluate step's `metrics` of this model"
        )
    summary = {k: v for k, v in report.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    card = export_step(cfg, model.uri, output_uri(exported, cfg.store.uri, identity, "exported"), summary)
    exported.metadata["files"] = card["files"]
