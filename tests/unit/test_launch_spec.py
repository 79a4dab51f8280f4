"""The job description and the Training Operator v1.9 environment contract (pure functions)."""

import pytest

from trainer.config import load_config
from trainer.launch.job import training_job
from trainer.launch.spec import JobSpec, job_name, replica_env, torchrun_command


def spec(**kw):
    base = {
        "name": "demo",
        "image": "img:1",
        "command": ("python", "-c", "pass"),
        "replicas": 3,
        "nproc_per_node": 2,
    }
    return JobSpec(**{**base, **kw})


def test_env_of_a_3_replica_2_process_job_follows_the_operator():
    s = spec()
    expected_ranks = {("master", 0): 0, ("worker", 0): 1, ("worker", 1): 2}
    assert s.replicas_by_rank() == list(expected_ranks)
    for (rtype, index), node_rank in expected_ranks.items():
        env = replica_env(s, rtype, index)
        assert env == {
            "PYTHONUNBUFFERED": "1",
            "MASTER_ADDR": "demo-master-0",
            "PET_MASTER_ADDR": "demo-master-0",
            "MASTER_PORT": "23456",
            "PET_MASTER_PORT": "23456",
            "RANK": str(node_rank),
            "PET_NODE_RANK": str(node_rank),
            "WORLD_SIZE": "6",  # (1 master + 2 workers) x nprocPerNode 2
            "PET_NPROC_PER_NODE": "2",
            "PET_NNODES": "3",
        }


def test_master_address_can_be_replaced_for_local_runs():
    env = replica_env(spec(), "worker", 1, master_addr="127.0.0.1")
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "127.0.0.1"


@pytest.mark.parametrize(("rtype", "index"), [("master", 1), ("worker", 2), ("worker", -1), ("chief", 0)])
def test_replica_out_of_range(rtype, index):
    with pytest.raises(ValueError):
        replica_env(spec(), rtype, index)


@pytest.mark.parametrize("name", ["Demo", "1job", "job-", "a" * 64, "job_x", ""])
def test_job_name_must_be_dns_1035(name):
    with pytest.raises(ValueError, match="DNS-1035"):
        spec(name=name)


def test_job_name_is_deterministic_per_task_identity():
    a = job_name("run-1/train-7")
    assert a == job_name("run-1/train-7")
    assert a != job_name("run-1/train-2-7")
    assert a != job_name("run-2/train-7")
    spec(name=a)  # valid


def test_training_job_runs_torchrun_on_the_trainer():
    cfg = load_config(overrides={"job.replicas": 3, "job.nproc_per_node": 2, "train.batch_size": 60})
    job = training_job(cfg, "kftrain-x", "s3://b/d", "s3://b/m")
    assert job.command[:5] == torchrun_command("trainer.train", [])[:5]
    assert job.command[job.command.index("--dataset-uri") + 1] == "s3://b/d"
    assert (job.replicas, job.nproc_per_node, job.world_size) == (3, 2, 6)
    assert job.env["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("command", "python train.py", "JobSpec.command: a list of arguments such as ['python', 'train.py']"),
        ("command", ("python", 3), "JobSpec.command: must be a list of text"),
        ("replicas", "2", "JobSpec.replicas: must be a whole number, got '2'"),
        ("replicas", True, "JobSpec.replicas: must be a whole number, got True"),
        ("nproc_per_node", 2.5, "JobSpec.nproc_per_node: must be a whole number, got 2.5"),
        ("timeout_s", 0, "JobSpec.timeout_s: must be a whole number of seconds above 0, got 0"),
        ("timeout_s", -5, "JobSpec.timeout_s: must be a whole number of seconds above 0, got -5"),
        ("port", 70000, "JobSpec.port: must be a port number, 1 to 65535, got 70000"),
        ("env", {"EPOCHS": 3}, "JobSpec.env['EPOCHS']: must be text, got int"),
        ("env", {"TOKEN": b"ghp_secret"}, "JobSpec.env['TOKEN']: must be text, got bytes"),
        ("env", {1: "x"}, "JobSpec.env: its names must be text, got 1 (int)"),
        ("command", ("",), "JobSpec.command: must be a list of text whose first is the program to run, got ('',)"),
        ("command", (), "JobSpec.command: must be a list of text whose first is the program to run, got ()"),
        ("kind", "tfjob", "JobSpec.kind: must be one of pytorchjob, trainjob, auto, got 'tfjob'"),
        ("kubernetes", {"gpus_per_node": 1}, "JobSpec.kubernetes: must be a KubernetesConfig"),
        ("image", None, "JobSpec.image: must be text, got None"),
        # Plain environment is visible in the job object (was: a token went into the manifest as written).
        ("env", {"GITHUB_TOKEN": "ghp_secret"}, "JobSpec.env.GITHUB_TOKEN: its name looks like a credential"),
    ],
)
def test_a_job_spec_built_in_python_names_the_field_of_a_wrong_type(field, value, said):
    """A spec built in Python is not read through the config's checks (was: a string command became
    one argument per letter, `nproc_per_node=2.5` the manifest's '2.5', `timeout_s=0` an instant
    timeout, `replicas="2"` a TypeError deep inside); a value of the env is not shown."""
    with pytest.raises(ValueError) as info:
        JobSpec(**{"name": "j", "image": "img", "command": ("python", "t.py"), field: value})
    assert str(info.value).startswith(said), str(info.value)
    assert "ghp_secret" not in str(info.value)
