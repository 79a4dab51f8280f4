"""KFP component: say, in the run, why the model was not exported."""

from kfp import dsl
from kfp.dsl import Markdown, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def quality_gate_failed(reason: str, explanation: Output[Markdown]) -> None:
    """Runs instead of export when the model misses the quality bar; its Markdown output (shown
    in the KFP UI) and its log say why.

    Args:
        reason: The evaluation step's verdict.
        explanation: A short Markdown note with the reason and what to change.
    """
    text = (
        "## Model not exported\n\n"
        f"The quality gate stopped this run: {reason}.\n\n"
        "Train longer or differently, or change the bar (`min_accuracy` / `max_perplexity`).\n"
    )
    print(text)
    with open(explanation.path, "w") as f:
        f.write(text)
