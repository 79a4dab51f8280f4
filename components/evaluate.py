"""KFP component: evaluate the trained model on the test split and decide the quality gate."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(
    dataset: Input[Dataset],
    model: Input[Model],
    metrics: Output[Metrics],
    confusion: Output[ClassificationMetrics],
    report: Output[HTML],
    config: str = "",
    store: str = "",
    s3_endpoint: str = "",
    run_id: str = "",
    min_accuracy: float = 0.0,
    max_perplexity: float = 0.0,
) -> NamedTuple("EvaluationOutputs", [("passed", bool), ("reason", str)]):  # noqa: UP014 (KFP reads this form)
    """Test metrics for the KFP UI (accuracy, loss, per-class precision/recall and the confusion
    matrix; loss and perplexity for a language model), an HTML report with the training loss
    curve, and the quality gate in front of export.

    Args:
        dataset: The prepared dataset (its test split is used).
        model: The trained model.
        metrics: Scalar metrics for the KFP UI; `metrics.json` with the full report in the store.
        confusion: The confusion matrix for the KFP UI (classification).
        report: HTML page: training loss curve, validation curve, evaluation tables.
        config: The full kftrain config as YAML/JSON.
        store: Artifact root; empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint URL of the store.
        run_id: The KFP run id.
        min_accuracy: Classification: export only at or above this test accuracy (0: no bar).
        max_perplexity: Language model: export only at or below this test perplexity (0: no bar).

    Returns:
        passed: Whether the model passed the quality gate.
        reason: Why, in one sentence.
    """
    from collections import namedtuple

    from components.params import config_from_params
    from components.runtime import log_scalars, output_uri
    from trainer.steps import evaluate as evaluate_step

    cfg = config_from_params(config, store=store, s3_endpoint=s3_endpoint)
    result, passed, reason = evaluate_step(
        cfg,
        model.uri,
        dataset.uri,
        output_uri(metrics, store, run_id, "evaluation"),
        output_uri(report, store, run_id, "report.html"),
        min_accuracy=min_accuracy,
        max_perplexity=max_perplexity,
    )
    log_scalars(metrics, result)
    for cls, scores in result.get("per_class", {}).items():
        log_scalars(metrics, {f"precision_{cls}": scores["precision"], f"recall_{cls}": scores["recall"]})
    if "confusion_matrix" in result:
        confusion.log_confusion_matrix(result["classes"], result["confusion_matrix"])
    print(f"quality gate {'passed' if passed else 'FAILED'}: {reason}")
    return namedtuple("EvaluationOutputs", ["passed", "reason"])(passed, reason)
