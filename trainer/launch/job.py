"""From a kftrain config to the one job description every backend runs."""

from __future__ import annotations

from trainer.config import Config, config_to_json
from trainer.launch.spec import JobSpec, torchrun_command

TRAIN_MODULE = "trainer.train"


def training_job(cfg: Config, name: str, dataset_uri: str, model_uri: str) -> JobSpec:
    """The PyTorchJob-shaped description of the training step of `cfg`."""
    args = [
        "--config-json",
        config_to_json(cfg),
        "--dataset-uri",
        dataset_uri,
        "--model-uri",
        model_uri,
    ]
    return JobSpec(
        name=name,
        image=cfg.job.image,
        command=torchrun_command(TRAIN_MODULE, args),
        replicas=cfg.job.replicas,
        nproc_per_node=cfg.job.nproc_per_node,
        env={"OMP_NUM_THREADS": str(cfg.job.omp_num_threads)},
    )
