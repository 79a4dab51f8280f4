"""KFP component: the run's plan (memory per rank, step time, ETA, scaling, cost) before training."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan(
    dataset: Input[Dataset],
    markdown: Output[Markdown],
    page: Output[HTML],
    metrics: Output[Metrics],
    config: str = "",
    run_id: str = "",
    task_name: str = "",
    dag_execution_id: str = "",
) -> None:
    """Predict what the run will take before it starts (`plan.enabled`; off, the step only says so):
    memory per rank against the GPU's, step time, ETA, scaling over `plan.nodes` and cost, with
    the verdicts and the assumptions behind them. With `plan.strict`, fail (the training step
    never starts) when the run cannot fit or cannot finish within `job.timeout_seconds`, the
    step's last line saying why. A config the planner cannot plan (a custom task it cannot
    build) fails the step only with `plan.strict`; otherwise the plan says why there is none.

    Args:
        dataset: The prepared dataset: its manifest gives the model's real shape and the epoch's length (the ETA).
        markdown: The plan as Markdown (the KFP UI shows it).
        page: The same plan as an HTML page.
        metrics: The plan's numbers for the KFP UI (`memory_total_gib`, `capacity_gib`, `fits`, and per
            node count `nodes<N>_step_seconds`, `_eta_seconds`, `_efficiency`, ...).
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
        run_id: `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (with the next two, names the output folder
            under `store.uri`, where the plan's Markdown and HTML go when it is set; without them
            the artifact's URI does).
        task_name: `dsl.PIPELINE_TASK_NAME_PLACEHOLDER`.
        dag_execution_id: `dsl.PIPELINE_TASK_ID_PLACEHOLDER`.
    """
    from components.params import config_from_params
    from components.runtime import end_with_one_line, log_scalars, output_uri, task_identity
    from trainer.report import markdown_html

    end_with_one_line("plan")
    cfg = config_from_params(config)
    if not cfg.plan.enabled:
        text = "## No plan\n\nThe plan step is off: set `plan.enabled: true` in the config to predict this run.\n"
        result = None
    else:
        from trainer.errors import KftrainError
        from trainer.pipeline_steps import plan_run

        try:
            result = plan_run(cfg, dataset_uri=dataset.uri, probe_cpu=cfg.kubernetes.gpus_per_node == 0)
            text = result.markdown()
        except KftrainError as exc:
            if cfg.plan.strict:  # no plan, no run: strict asked for one
                raise
            # A plan is advice: without one the run goes on, and the step says why there is none.
            result, text = None, f"## No plan\n\nThe planner cannot plan this run: {exc}\n"
    print(text)
    identity = task_identity(run_id, task_name, dag_execution_id, markdown.uri)
    for artifact, name, content in ((markdown, "plan.md", text), (page, "plan.html", markdown_html(text))):
        if cfg.store.uri:  # beside the run's other outputs, as every step's with a store set
            from trainer.pipeline_steps import store_for

            uri = output_uri(artifact, cfg.store.uri, identity, name)
            store_for(cfg, uri).put_bytes(uri, content.encode())
        else:
            with open(artifact.path, "w", encoding="utf-8") as f:
                f.write(content)
    if result is not None:
        from trainer.pipeline_steps import refuse_if_strict

        log_scalars(metrics, result.metrics())
        refuse_if_strict(cfg, result, cfg.plan.strict)
