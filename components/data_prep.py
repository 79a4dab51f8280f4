"""KFP component: prepare the dataset (split, normalise, shard) into the object store."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def data_prep(dataset: Output[Dataset], config: str = "") -> None:
    """Read `data.source` into train/val/test splits with a fixed seed and write them as shards
    plus a manifest: a table (classification) split stratified and normalised with statistics
    from train only; text, JSON Lines or chat (causal_lm) tokenized with the run's tokenizer (a
    base model's, when fine-tuning).

    It takes no run or task id, so KFP's cache can reuse a prepared dataset across runs.

    Args:
        dataset: The prepared dataset (a folder of shards and `manifest.json`); under
            `<store.uri>/task-<digest>/dataset` when the config sets `store.uri`.
        config: The kftrain config as YAML/JSON text (`configure`'s output in the pipeline).
    """
    from components.params import config_from_params
    from components.runtime import end_with_one_line, output_uri, task_identity
    from trainer.pipeline_steps import prepare_data

    end_with_one_line("data-prep")
    cfg = config_from_params(config)
    identity = task_identity("", "", "", dataset.uri)
    manifest = prepare_data(cfg, output_uri(dataset, cfg.store.uri, identity, "dataset"))
    for key in ("format", "source", "classes", "num_features", "vocab_size"):
        if key in manifest:
            dataset.metadata[key] = manifest[key]
    for split, info in manifest["splits"].items():
        for key, value in info.items():
            if key != "shards":  # rows or tokens per split
                dataset.metadata[f"{split}_{key}"] = value
