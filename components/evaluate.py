"""KFP component: evaluate the trained model on the test split."""

from kfp import dsl
from kfp.dsl import ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    config: str = "",
    store: str = "",
    s3_endpoint: str = "",
    run_id: str = "",
) -> float:
    """Test accuracy, loss, per-class precision/recall and the confusion matrix.

    Args:
        dataset: The prepared dataset (its test split is used).
        model: The trained model.
        metrics: Scalar metrics for the KFP UI; `metrics.json` with the full report in the store.
        confusion: The confusion matrix for the KFP UI.
        config: The full kftrain config as YAML/JSON.
        store: Artifact root; empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint URL of the store.
        run_id: The KFP run id.

    Returns:
        The test accuracy.
    """
    from components.params import config_from_params
    from components.runtime import log_scalars, output_uri
    from trainer.steps import evaluate as evaluate_step

    cfg = config_from_params(config, store=store, s3_endpoint=s3_endpoint)
    report = evaluate_step(cfg, model.uri, dataset.uri, output_uri(metrics, store, run_id, "evaluation"))
    log_scalars(metrics, {"accuracy": report["accuracy"], "loss": report["loss"], "macro_f1": report["macro_f1"]})
    for cls, scores in report["per_class"].items():
        log_scalars(metrics, {f"precision_{cls}": scores["precision"], f"recall_{cls}": scores["recall"]})
    confusion.log_confusion_matrix(report["classes"], report["confusion_matrix"])
    return report["accuracy"]
