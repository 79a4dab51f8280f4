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
    store: str = "",
    s3_endpoint: str = "",
    run_id: str = "",
) -> None:
    """Write TorchScript, safetensors and a JSON model card (inputs, classes, metrics, training
    config, source dataset) for serving.

    Args:
        model: The trained model.
        metrics: The evaluation metrics (its `metrics.json` goes into the model card).
        exported: The export folder.
        config: The full kftrain config as YAML/JSON.
        store: Artifact root; empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint URL of the store.
        run_id: The KFP run id.
    """
    import json

    from components.params import config_from_params
    from components.runtime import output_uri
    from trainer.evaluate import EVAL_RECORD
    from trainer.steps import export as export_step
    from trainer.steps import store_for
    from trainer.storage import join_uri

    cfg = config_from_params(config, store=store, s3_endpoint=s3_endpoint)
    report = json.loads(store_for(cfg, metrics.uri).get_bytes(join_uri(metrics.uri, EVAL_RECORD)))
    summary = {k: v for k, v in report.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    card = export_step(cfg, model.uri, output_uri(exported, store, run_id, "exported"), summary)
    exported.metadata["files"] = card["files"]
