"""The components' runtime in one process: a task's identity differs between tasks and stays the same
when the task is retried, and each of two training tasks reattaches to its own job. The pipelines
run end to end through kfp.local in tests/integration/test_component_yamls.py."""

from __future__ import annotations

import pytest

from components.runtime import task_identity
from tests.fake_kube import FakeCluster, launcher
from trainer.config import load_config
from trainer.launch.job import training_job
from trainer.launch.spec import job_name


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("run-1", "train", "7"), ("run-1", "train-2", "7")),  # two training tasks in one DAG
        (("run-1", "train", "7"), ("run-1", "train", "8")),  # two ParallelFor iterations
        (("run-1", "train", "7"), ("run-2", "train", "7")),  # two runs
        (("", "", ""), ("", "", "")),  # unwired: two tasks' artifact URIs differ
    ],
)
def test_task_identities_differ_between_tasks(a, b):
    assert task_identity(*a, "minio://mlpipeline/v2/artifacts/p/r/train/uuid-a/model") != task_identity(
        *b, "minio://mlpipeline/v2/artifacts/p/r/train/uuid-b/model"
    )


def test_a_retried_task_has_the_same_identity():
    args = ("run-1", "train", "7", "minio://x/uuid-a/model")
    assert task_identity(*args) == task_identity(*args)


def test_each_of_two_training_tasks_reattaches_to_its_own_job():
    """Against the FAKE Kubernetes API (tests/fake_kube.py): no API server runs here."""
    cluster = FakeCluster()
    cfg = load_config()

    def launch(identity: str, uid: str):
        backend = launcher(cluster, uid)
        return backend, training_job(cfg, job_name(identity), "s3://bkt/d", f"s3://bkt/{identity}/model")

    identities = [task_identity("run-1", name, "7", "") for name in ("train", "train-2")]
    for i, identity in enumerate(identities):
        backend, spec = launch(identity, f"uid-{i}")
        backend.submit(spec)
    assert len(cluster.jobs) == 2
    # The launcher pod of the second task is retried: it finds its own job, not the first one.
    backend, spec = launch(identities[1], "uid-retry")
    backend.submit(spec)
    assert len(cluster.jobs) == 2
    owners = {name: [o["uid"] for o in job["metadata"]["ownerReferences"]] for name, job in cluster.jobs.items()}
    assert owners == {job_name(identities[0]): ["uid-0"], job_name(identities[1]): ["uid-1", "uid-retry"]}


def test_a_metric_that_is_not_finite_is_left_out_of_kfp_s_and_said(capsys):
    """KFP's executor output cannot hold NaN or inf: a run whose training loss was NaN failed its
    train step after the training was done, and every resume the same (a probe)."""
    from components.runtime import log_scalars

    class Metrics:
        logged: dict = {}

        def log_metric(self, key, value):
            self.logged[key] = value

    metrics = Metrics()
    log_scalars(metrics, {"train_loss": float("nan"), "test_loss": float("inf"), "steps": 7, "ok": True, "a": 0.5})
    assert metrics.logged == {"steps": 7.0, "a": 0.5}
    out = capsys.readouterr().out
    assert "metric train_loss is nan: not shown in the KFP UI" in out and "metric test_loss is inf" in out
