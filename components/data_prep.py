"""KFP component: prepare the dataset (split, normalise, shard) into the object store."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def data_prep(
    dataset: Output[Dataset],
    config: str = "",
    data_source: str = "",
    store: str = "",
    s3_endpoint: str = "",
    run_id: str = "",
) -> None:
    """Split the source table (stratified, fixed seed) into train/val/test, normalise with
    statistics from train only, and write shards plus a manifest.

    Args:
        dataset: The prepared dataset (a folder of shards and `manifest.json`).
        config: The full kftrain config as YAML/JSON; the parameters below override it.
        data_source: `digits`/CSV URI (classification), `python-stdlib`/text URI (causal_lm); empty: default.
        store: Artifact root (`s3://bucket/prefix` or a path); empty: KFP's pipeline root.
        s3_endpoint: S3 endpoint URL of the store (`http://host:9000`).
        run_id: The KFP run id; names the run's folder under `store`.
    """
    from components.params import config_from_params
    from components.runtime import output_uri
    from trainer.steps import prepare_data

    cfg = config_from_params(config, data_source=data_source, store=store, s3_endpoint=s3_endpoint)
    manifest = prepare_data(cfg, output_uri(dataset, store, run_id, "dataset"))
    for key in ("format", "source", "classes", "num_features", "vocab_size"):
        if key in manifest:
            dataset.metadata[key] = manifest[key]
    for split, info in manifest["splits"].items():
        for key, value in info.items():
            if key != "shards":  # rows or tokens per split
                dataset.metadata[f"{split}_{key}"] = value
