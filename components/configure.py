"""KFP component: the run's one effective config, from the config text and the UI's knobs."""

from kfp import dsl

from components.image import IMAGE
from components.params import with_knob_docs


@dsl.component(base_image=IMAGE, install_kfp_package=False)
@with_knob_docs
def configure(
    config: str = "",
    *,
    data_source: str = "",
    replicas: int = -1,
    nproc_per_node: int = -1,
    epochs: int = -1,
    batch_size: int = -1,
    learning_rate: float = -1.0,
    image: str = "",
    timeout_seconds: int = -1,
    job_kind: str = "",
    gpus_per_node: int = -1,
    queue: str = "",
    node_selector: dict = {},  # noqa: B006 (KFP reads the default from the signature; never mutated)
    tolerations: list = [],  # noqa: B006
    base_model: str = "",
    train_method: str = "",
    store: str = "",
    s3_endpoint: str = "",
    resume_from: str = "",
    store_secret: str = "mlpipeline-minio-artifact",
    hf_token_secret: str = "hf-token",
    launcher: str = "auto",
    min_accuracy: float = 0.0,
    max_perplexity: float = 0.0,
) -> str:
    """Validate the whole config once, before any work starts, and hand every later step the
    same effective config (as JSON text; the step's output shows it), with `data.source_version`
    set to the version of the data data prep will read. Also checks what can be checked now: the
    store and checkpoint prefixes are writable, checkpoint.resume_from names a checkpoint this
    config can continue (pinned to it), a custom task imports, data.source is readable, and a base
    model's folder is one kftrain can train within the configured memory. Never cached.

    Args:
        config: The kftrain config as YAML/JSON text: the base of the run.
        {knobs}
        store_secret: The Secret with the store keys that the step pods mount; the training
            replicas get the same one.
        hf_token_secret: The Secret with the Hugging Face token (key `HF_TOKEN`) that the later
            step pods mount; the training replicas get the same one.
        launcher: The training step's launcher (`auto`, `kubernetes`, `local`), checked here.
        min_accuracy: The evaluation's quality gate (classification), checked here.
        max_perplexity: The evaluation's quality gate (causal_lm), checked here.

    Returns:
        The effective config as JSON text.
    """
    knobs = dict(locals())  # the parameters, first thing: what config_from_params maps onto the config
    for name in ("config", "store_secret", "hf_token_secret"):
        del knobs[name]
    run_settings = {name: knobs.pop(name) for name in ("launcher", "min_accuracy", "max_perplexity")}
    from components.runtime import end_with_one_line

    end_with_one_line("configure")
    import os

    from components.params import BY_NAME, SECRET_PARAMS, config_from_params, parameter_named_by
    from trainer.checks import check_before_steps
    from trainer.config import ConfigError, config_to_json
    from trainer.launch.local import RUN_MARKER_ENV

    # `kftrain run --local` (kfp.local) mounts no Secret in pods it never starts.
    pods = RUN_MARKER_ENV not in os.environ
    from trainer.checks import check_run_settings, checked_before
    from trainer.errors import KftrainError

    given = [name for name, value in knobs.items() if value != BY_NAME[name].unset] + list(SECRET_PARAMS)
    try:
        cfg = config_from_params(
            config, store_secret=store_secret, hf_token_secret=hf_token_secret, step_pods=pods, **knobs
        )
        check_run_settings(cfg, **run_settings)
        if checked_before(cfg):
            print("pre-flight checks: done by `kftrain run` before this step, on this very config")
        else:
            # Whatever can be checked before any step is checked now: the job a cluster would refuse, the
            # store and checkpoint prefixes, a custom task, data.source, a base model.
            cfg = check_before_steps(cfg)  # checkpoint.resume_from pinned to the checkpoint it names now
    except KftrainError as exc:
        # The message names the config field; the user set a parameter in the UI.
        if named := parameter_named_by(str(exc), given):  # the step log's traceback keeps where it came from
            raise ConfigError(f"parameter {named[0]}: {exc}{named[1]}") from exc
        raise
    import dataclasses
    import logging

    from trainer.data_rules import source_version

    # The version of the data data prep reads, in its input: KFP's cache reuses a prepared dataset
    # only for the same data (this step is never cached: it reads the store anew each run).
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source_version=source_version(cfg)))

    from trainer.checks import ignored_settings

    for line in ignored_settings(cfg):
        logging.getLogger("kftrain").warning(line)
    text = config_to_json(cfg)
    from trainer.errors import redact

    print(f"effective config: {redact(text)}")
    return text
