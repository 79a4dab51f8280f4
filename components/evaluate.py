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
    run_id: str = "",
    task_name: str = "",
    dag_execution_id: str = "",
    min_accuracy: float = 0.0,
    max_perplexity: float = 0.0,
) -> NamedTuple("EvaluationOutputs", [("passed", bool), ("reason", str)]):  # noqa: UP014 (KFP reads this form)
    """Test metrics for the KFP UI (`test_accuracy`, `test_loss`, `test_macro_f1`, per class
    `test_class_<name>_precision/_recall/_f1`, and the confusion matrix; `test_loss` and
    `test_perplexity` for a language model, with `test_base_loss` and `test_base_perplexity` for a
    fine-tuned one), an HTML report (run header, loss/validation/throughput
    charts, confusion heatmap, tables), and the quality gate in front of export.

    Args:
        dataset: The prepared dataset (its test split is used).
        model: The trained model.
        metrics: Scalar metrics for the KFP UI (`test_*` names); `metrics.json` with the full report in the store.
        confusion: The confusion matrix for the KFP UI (classification).
        report: HTML page: run header, loss (log axis), validation and throughput charts, confusion
            heatmap, evaluation tables.
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
        run_id: `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (with the next two, names the output folder
            under `store.uri`; without them the artifact's URI does).
        task_name: `dsl.PIPELINE_TASK_NAME_PLACEHOLDER`.
        dag_execution_id: `dsl.PIPELINE_TASK_ID_PLACEHOLDER`.
        min_accuracy: Classification: export only at or above this test accuracy (0: no bar).
        max_perplexity: Language model: export only at or below this test perplexity (0: no bar).

    Returns:
        passed: Whether the model passed the quality gate.
        reason: Why, in one sentence.
    """
    from collections import namedtuple

    from components.params import config_from_params
    from components.runtime import end_with_one_line, log_scalars, output_uri, task_identity
    from trainer.evaluate import ui_scalars
    from trainer.pipeline_steps import evaluate as evaluate_step

    end_with_one_line("evaluate")
    cfg = config_from_params(config)
    identity = task_identity(run_id, task_name, dag_execution_id, metrics.uri)
    result, passed, reason = evaluate_step(
        cfg,
        model.uri,
        dataset.uri,
        output_uri(metrics, cfg.store.uri, identity, "evaluation"),
        output_uri(report, cfg.store.uri, identity, "report.html"),
        min_accuracy=min_accuracy,
        max_perplexity=max_perplexity,
        run_id=identity,
    )
    log_scalars(metrics, ui_scalars(result))
    if "confusion_matrix" in result:
        confusion.log_confusion_matrix(result["classes"], result["confusion_matrix"])
    print(f"quality gate {'passed' if passed else 'FAILED'}: {reason}")
    return namedtuple("EvaluationOutputs", ["passed", "reason"])(passed, reason)
