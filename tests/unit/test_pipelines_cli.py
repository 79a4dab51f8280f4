"""The kftrain CLI (pipelines/cli.py), in-process: bad arguments and configs end in one clear line and exit 2."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
from pathlib import Path

import pytest

from pipelines.cli import GATE_FAILED, PLAN_FILE, SUMMARY_FILE, OutputError, build_parser, main, write_output

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


# (config text or None, extra CLI args, phrase the message must contain)
CLI_ROWS = [
    # non-finite floats, each named at load, for any float field
    ("train:\n  learning_rate: .inf\n", [], "train.learning_rate: must be a finite number"),
    ("train:\n  learning_rate: .nan\n", [], "train.learning_rate: must be a finite number"),
    ("train:\n  learning_rate: nan\n", [], "train.learning_rate: must be a number, got 'nan'"),  # text: YAML's is .nan
    ("train:\n  weight_decay: .nan\n", [], "train.weight_decay: must be a finite number"),
    ("train:\n  grad_clip_norm: .inf\n", [], "train.grad_clip_norm: must be a finite number"),
    ("train:\n  peak_tflops: -.inf\n", [], "train.peak_tflops: must be a finite number"),
    ("data:\n  val_fraction: .nan\n", [], "data.val_fraction: must be a finite number"),
    ("model:\n  dropout: .nan\n", [], "model.dropout: must be a finite number"),
    ("kubernetes:\n  poll_seconds: .nan\n", [], "kubernetes.poll_seconds: must be a finite number"),
    ("store:\n  retry_budget_seconds: .inf\n", [], "store.retry_budget_seconds: must be a finite number"),
    # the new fields' ranges
    ("store:\n  retry_budget_seconds: -1\n", [], "store.retry_budget_seconds: must be >= 0"),
    ("store:\n  read_timeout_seconds: 0\n", [], "store.read_timeout_seconds: must be > 0"),
    ("store:\n  connect_timeout_seconds: -2\n", [], "store.connect_timeout_seconds: must be > 0"),
    ("train:\n  max_consecutive_skips: 0\n", [], "train.max_consecutive_skips: must be >= 1"),
    # '.' and '..' in keys named by the field
    ("checkpoint:\n  uri: s3://bucket/a/../b\n", [], "checkpoint.uri: storage URI 's3://bucket/a/../b' has a"),
    ("store:\n  uri: s3://bucket/./x\n", [], "store.uri: storage URI 's3://bucket/./x' has a '.' or '..'"),
    ("data:\n  source: s3://bucket/../x.csv\n", [], "data.source: storage URI"),
    (None, ["--store", "s3://bucket/x/../y"], "store.uri: storage URI 's3://bucket/x/../y' has a"),
    (None, ["--store", "s3://bucket/x/.."], "'.' or '..' path segment"),
    # command-line arguments
    (None, ["--config", "missing.yaml"], "--config missing.yaml: cannot read the config file (No such file"),
    (None, ["--config", "."], "--config .: cannot read the config file (Is a directory)"),
    ("- a\n- list\n", [], "c.yaml: must hold a mapping"),
    ("", [], "--config c.yaml: the file is empty; write the fields to change, or leave out --config"),
    (" \n\n", [], "--config c.yaml: the file is empty"),
    # A file of comments, or `null`, is as empty (was: the built-in defaults ran).
    ("# train:\n#   epochs: 3\n", [], "c.yaml: holds no settings (only comments, or null); write the fields to change"),
    ("null\n", [], "c.yaml: holds no settings"),
    ("train: [unclosed\n", [], "c.yaml: not valid YAML"),
    ("train:\n  epochs: 2\n  learning_rat: 0.1\n", [], "train.learning_rat: unknown key"),
    (None, ["--s3-endpoint", "ftp://host:9000"], "store.endpoint: 'ftp://host:9000' must be a URL starting with"),
    (None, ["--s3-endpoint", "http://h:9000/some/path"], "store.endpoint: 'http://h:9000/some/path' has a path"),
    (None, ["--run-id", "../escape"], "--run-id: must be 1-63 letters"),
    (None, ["--run-id", "a/b"], "--run-id: must be 1-63 letters"),
    (None, ["--run-id", ""], "--run-id: must be 1-63 letters"),  # `--run-id "$UNSET"`: not a new run
    (None, ["--run-id", "x" * 64], "--run-id: must be 1-63 letters"),
    # a URI a slash short is no local folder; a store and a local output folder are not both used
    (
        None,
        ["--store", "s3:/my-bucket/prefix"],
        "store.uri: storage URI 's3:/my-bucket/prefix' lacks the '//' after 's3:' (write s3://bucket/key",
    ),
    ("store:\n  uri: minio:b/x\n", [], "store.uri: storage URI 'minio:b/x' lacks the '//' after 'minio:'"),
    ("checkpoint:\n  uri: s3:/b/ckpt\n", [], "checkpoint.uri: storage URI 's3:/b/ckpt' lacks the '//'"),
    (None, ["--max-perplexity", "5"], "--max-perplexity 5: task 'classification' reports no perplexity"),
    ("task: causal_lm\n", ["--min-accuracy", "0.5"], "--min-accuracy 0.5: task 'causal_lm' reports no accuracy"),
    (None, ["--store", "st", "--output-dir", "o"], "--output-dir o: not used when a store is set (--store st:"),
    ("store:\n  uri: st\n", ["--output-dir", "o"], "--output-dir o: not used when a store is set (store.uri st:"),
]


def call_cli(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(("config", "args", "phrase"), CLI_ROWS)
def test_bad_cli_input_is_one_clear_line(tmp_path, monkeypatch, capsys, config, args, phrase):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--local"]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        argv += ["--config", "c.yaml"]
    rc, out = call_cli(argv + args, capsys)
    assert rc == 2, out
    assert phrase in out, out
    assert "Traceback" not in out
    assert not (tmp_path / "kftrain-outputs").exists()  # stopped before anything was written


def test_run_without_local_is_exit_2(capsys):
    rc, out = call_cli(["run"], capsys)
    assert rc == 2 and "only --local is supported" in out


def test_job_status_prints_the_progress_line_of_a_job_on_a_fake_cluster(monkeypatch, capsys):
    """`kftrain job status NAME` against a FAKE API (tests/fake_kube.py) in the kubeconfig
    context's namespace: the job's state and the line rank 0 logged."""
    from tests.fake_kube import FakeCluster, launcher
    from trainer.config import load_config
    from trainer.launch.job import training_job
    from trainer.progress import PROGRESS_ANNOTATION, Snapshot

    cluster = FakeCluster(namespace="team")
    spec = training_job(load_config(), "kftrain-run", "s3://bucket/d", "s3://bucket/m")
    launcher(cluster).submit(spec)
    snapshot = Snapshot(step=30, total_steps=120, epoch=1, loss=1.25, eta_seconds=600, time=1_767_225_600)
    cluster.jobs["kftrain-run"]["metadata"]["annotations"] = {PROGRESS_ANNOTATION: snapshot.annotation()}
    monkeypatch.setattr("trainer.launch.kubernetes._clients", lambda: (cluster, "team"))
    assert main(["job", "status", "kftrain-run", "--kind", "pytorchjob"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "PyTorchJob team/kftrain-run: Created (PyTorchJobCreated)",
        f"progress: {snapshot.line()}",
    ]
    assert snapshot.line() == "step 30/120 (25%) epoch 1 loss 1.2500 eta 10m00s"
    assert out[2].startswith("reported: 2026-01-01T00:00:00Z (")

    assert main(["job", "status", "missing", "--namespace", "other"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kftrain: error: no TrainJob or PyTorchJob named 'missing' in namespace 'other': check the name "
                   "(the training step's log names its job) and --namespace"]  # fmt: skip


# -- kftrain plan ----------------------------------------------------------------------------------

# (config text or None, arguments after `kftrain plan`, phrase the one error line must hold)
PLAN_BAD_ROWS = [
    (
        None,
        ["--gpu", "H999"],
        "argument --gpu: unknown GPU type 'H999'; known: H100-80GB, H100-PCIe-80GB, H100-NVL-94GB, H200-141GB",
    ),
    (None, ["--gpu", ""], "argument --gpu: unknown GPU type ''"),
    (
        None,
        ["--nodes", "0"],
        "argument --nodes: must be positive whole numbers of nodes up to 100000 separated by commas",
    ),
    (None, ["--nodes", "1,,2"], "argument --nodes: must be positive whole numbers"),
    (None, ["--nodes", "two"], "argument --nodes: must be positive whole numbers"),
    (None, ["--nodes", "-1"], "argument --nodes: must be positive whole numbers"),
    (None, ["--nodes", "1.5"], "argument --nodes: must be positive whole numbers"),
    (None, ["--gpu-memory", "0"], "argument --gpu-memory: must be a positive number of GiB"),
    (None, ["--gpu-memory", "nan"], "argument --gpu-memory: must be a positive number of GiB"),
    (None, ["--gpu-memory", "lots"], "argument --gpu-memory: must be a number, got 'lots'"),
    (None, ["--price", "-1"], "argument --price: must be a price >= 0 per GPU-hour"),
    (None, ["--price", "inf"], "argument --price: must be a price >= 0 per GPU-hour"),
    (None, ["--price", "1e308"], "argument --price: must be a price >= 0 per GPU-hour, at most 1e+06"),
    # `--dataset "$DS"` with DS unset was ignored: the plan without the dataset, in silence.
    (None, ["--dataset", ""], "argument --dataset: must not be empty"),
    (None, ["--nodes", "1,100000000"], "argument --nodes: must be positive whole numbers of nodes up to 100000"),
    (None, ["--probe-steps", "0"], "argument --probe-steps: must be a whole number of steps from 1 to 1000"),
    (None, ["--probe-steps", str(2**70)], "argument --probe-steps: must be a whole number of steps from 1 to 1000"),
    (None, ["--gpu-memory", "1e-320"], "argument --gpu-memory: must be a positive number of GiB"),
    (None, ["--gpu-memory", "1e9"], "argument --gpu-memory: must be a positive number of GiB, at most 100000"),
    (None, ["--output", " "], "argument --output: must not be empty"),
    # A MIG slice (was: "unknown GPU type", which a known H100 is not, with no size to give).
    (
        None,
        ["--gpu", "NVIDIA H100 80GB HBM3 MIG 1g.10gb"],
        "slice of a GPU, which the plan has no figures for (a part of the GPU's memory and compute, no NVLink); give "
        "its memory with --gpu-memory instead, e.g. --gpu-memory 9.3",
    ),
    (None, ["--gpu", "H100 MIG"], "no NVLink); give its memory with --gpu-memory instead"),
]
# Bad values that argparse passes, refused by the config or the checks: `kftrain: error: <field>: ...`.
PLAN_CONFIG_ROWS = [
    ("plan:\n  gpu: H999\n", [], "plan.gpu: not a GPU type the plan knows, got 'H999'; use one of H100-80GB"),
    ("plan:\n  nodes: [0, 2]\n", [], "plan.nodes: must be a list of positive node counts"),
    ("plan:\n  price_per_gpu_hour: -2\n", [], "plan.price_per_gpu_hour: must be >= 0"),
    ("plan:\n  price_per_gpu_hour: 1.0e+300\n", [], "plan.price_per_gpu_hour: must be >= 0 and <= 1e+06"),
    ("plan:\n  nodes: [1, 1000000]\n", [], "plan.nodes: must be a list of positive node counts up to 100000"),
    # A count given twice (was: dropped in silence, the table one row short).
    ("plan:\n  nodes: [1, 1, 2]\n", [], "up to 100000, each given once"),
    (
        None,
        ["--nodes", "1,2,2"],
        "--nodes: plan.nodes: must be a list of positive node counts up to 100000, each given once",
    ),
    (
        "plan:\n  gpu: H100 MIG 3g.40gb\n",
        [],
        "plan.gpu: 'H100 MIG 3g.40gb' is a MIG slice of a GPU, which the plan has no figures for (a part of the GPU's "
        "memory and compute, no NVLink); leave plan.gpu empty and set kubernetes.gpu_memory_gb to its memory "
        "(e.g. 37.3)",
    ),
    ("plan:\n  strict: maybe\n", [], "plan.strict: must be"),
    ("plan:\n  strict: true\n", [], "plan.strict: needs plan.enabled: true"),
    # A memory the named GPU does not have (less is a share of it: a MIG slice).
    ("plan:\n  gpu: A100-40GB\nkubernetes:\n  gpu_memory_gb: 80\n", [], "kubernetes.gpu_memory_gb: 80 GiB is more"),
    ("plan:\n  gpu: H200\nkubernetes:\n  gpu_memory_gb: 144\n", [], "kubernetes.gpu_memory_gb: 144 GiB is more"),
    (None, ["--gpu", "A100-40GB", "--gpu-memory", "80"], "--gpu-memory: kubernetes.gpu_memory_gb: 80 GiB is more than"),
    (None, ["--config", "missing.yaml"], "--config missing.yaml: cannot read the config file"),
    (None, ["--dataset", "s3://"], "--dataset: invalid bucket name '' in 's3://'"),  # was: naming no flag
]


#: Flags given as empty text (an unset shell variable) or a name no cluster could hold: refused
#: before anything runs or any cluster is asked (were: read as left out, the run going on with the
#: config's value or the default; or a connection attempt answering a bad namespace).
EMPTY_OR_BAD_FLAGS = [
    (["run", "--local", "--store", ""], "argument --store: must not be empty; give a value, or leave the flag out"),
    (["run", "--local", "--s3-endpoint", " "], "argument --s3-endpoint: must not be empty"),
    (["job", "manifest", "-n", ""], "argument -n/--namespace: must not be empty"),
    (["plan", "--gpu", ""], "argument --gpu: unknown GPU type ''"),
    (["runs", "--s3-endpoint", ""], "argument --s3-endpoint: must not be empty"),
    (["submit", "--host", "http://127.0.0.1:9", "-n", ""], "argument -n/--namespace: '' is not a namespace"),
    (["submit", "--host", "http://127.0.0.1:9", "-n", "Bad_NS"], "'Bad_NS' is not a namespace"),
    (["submit", "--host", "http://127.0.0.1:9", "--experiment", ""], "argument --experiment: must not be empty"),
    (["submit", "--host", "http://127.0.0.1:9", "--run-name", ""], "argument --run-name: must not be empty"),
    (["submit", "--host", "http://127.0.0.1:9", "--pipeline-name", ""], "argument --pipeline-name: must not be"),
    # `--package "$PKG"` unset: was a compile of the pipeline now, not the user's package.
    (["submit", "--host", "http://127.0.0.1:9", "--package", " "], "argument --package: must not be empty"),
    (["job", "status", "MyJob"], "argument name: 'MyJob' is not a job's name"),
    (["job", "status", "x", "-n", "Bad"], "argument -n/--namespace: 'Bad' is not a namespace"),
    # A URI where a folder on this machine goes (was: a local folder `s3:/bucket/x`, exit 0).
    (["example-model", "s3://bucket/x"], "argument out_dir: 's3://bucket/x' is a URI: this takes a path on this"),
    (["run", "--local", "--output-dir", "s3://b/x"], "argument --output-dir: 's3://b/x' is a URI"),
    (["compile", "--output-dir", "file:///tmp/x"], "argument --output-dir: 'file:///tmp/x' is a URI"),
    (
        ["run", "--local", "--summary", "s3://b/s.json"],
        "argument --summary: 's3://b/s.json' is a URI: this takes a path",
    ),
    # A flag for another that is left out (were: accepted and unused, exit 0).
    (["plan", "--probe-steps", "50"], "--probe-steps: given without --probe, which it is for"),
    # Another store's URI (was: "use ... file:///path or a plain path", which the flag then refuses).
    (["job", "manifest", "--model-uri", "gs://b/x"], "--model-uri 'gs://b/x': not an object store kftrain writes"),
    # A pasted space (was: " s3://" called no object store; "s3://b/x " accepted into the manifest).
    (
        ["job", "manifest", "--model-uri", " s3://b/x"],
        "--model-uri: storage URI ' s3://b/x' starts or ends with whitespace",
    ),
    (["job", "manifest", "--dataset-uri", "s3://b/x "], "--dataset-uri: storage URI 's3://b/x ' starts or ends with"),
    (["runs", "--s3-endpoint", "http://127.0.0.1:1"], "--s3-endpoint: --store kftrain-outputs is a folder on this"),
    # A path that names another place than it shows, or one no file system takes (were: folders
    # made with control characters in their names, a bare "File name too long").
    (["compile", "--output-dir", "out\x1b[2Jx"], "argument --output-dir: 'out\\x1b[2Jx' holds the control or"),
    (["compile", "--output-dir", "\u202eout"], "holds the control or invisible character '\\u202e'"),
    (["run", "--local", "--output-dir", "d" * 300], "has a folder or file name of 300 bytes"),
    (["run", "--local", "--summary", "/d" * 2000 + ".json"], "bytes long; a local path may be at most 3072"),
]


@pytest.mark.parametrize(("argv", "phrase"), EMPTY_OR_BAD_FLAGS, ids=[" ".join(a) for a, _ in EMPTY_OR_BAD_FLAGS])
def test_an_empty_or_impossible_flag_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, argv, phrase):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert phrase in err.strip().splitlines()[-1], err
    assert not list(tmp_path.iterdir())  # nothing ran


@pytest.mark.parametrize(
    ("args", "dataset", "note"),
    [
        (["--set", "store.uri=s3://mlx/kftrain"], "s3://mlx/kftrain/dataset", "under store.uri"),
        ([], "s3://kftrain/dataset", "under a placeholder store"),
        (["--dataset-uri", "s3://dsx/ds", "--model-uri", "s3://dsx/m"], "s3://dsx/ds", ""),
    ],
    ids=["store", "placeholder", "given"],
)
def test_job_manifest_says_which_uris_it_filled_in(capsys, args, dataset, note):
    """Left out, --dataset-uri and --model-uri are under the config's store, and said (was: a fixed
    s3://kftrain/... in silence, whatever store.uri held)."""
    assert main(["job", "manifest", "--kind", "pytorchjob", *args]) == 0
    out, err = capsys.readouterr()
    assert f"- {dataset}\n" in out
    if note:
        assert err.startswith(f"kftrain: note: the job reads the dataset at {dataset} ") and note in err, err
    else:
        assert not err


@pytest.mark.parametrize(("config", "args", "phrase"), PLAN_BAD_ROWS)
def test_a_bad_plan_flag_is_one_line_naming_it(tmp_path, monkeypatch, capsys, config, args, phrase):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["plan", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    (line,) = err.strip().splitlines()  # was: argparse's usage block above it
    assert phrase in line and line.endswith("(`kftrain plan --help` lists the options)"), err


@pytest.mark.parametrize(("config", "args", "phrase"), PLAN_CONFIG_ROWS)
def test_a_bad_plan_config_is_one_line_naming_the_field(tmp_path, monkeypatch, capsys, config, args, phrase):
    monkeypatch.chdir(tmp_path)
    argv = ["plan", *args]
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        argv += ["--config", "c.yaml"]
    rc, out = call_cli(argv, capsys)
    assert rc == 2, out
    (line,) = out.strip().splitlines()
    assert line.startswith("kftrain: error: ") and phrase in line, out


GPT = (
    "task: causal_lm\ndata:\n  source: python-stdlib\n"
    "model:\n  n_layer: 2\n  n_head: 2\n  n_embd: 64\n  block_size: 64\n"
)


def test_plan_prints_the_markdown_plan_for_the_gpu_and_nodes_asked(tmp_path, monkeypatch, capsys):
    from trainer.plan import Plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(GPT + "train:\n  batch_size: 16\n  max_steps: 1000\n")
    args = ["plan", "--config", "c.yaml", "--gpu", "h200", "--nodes", "1,2,4", "--price", "3.5"]
    rc, out = call_cli([*args, "--output", "plan.md"], capsys)
    assert rc == 0, out
    assert out.startswith("# Training plan") and "device H200-141GB" in out
    assert (tmp_path / "plan.md").read_text() in out  # the file holds what was printed
    rc, text = call_cli([*args, "--json"], capsys)
    assert rc == 0, text
    plan = Plan.from_dict(json.loads(text))
    assert [p.nodes for p in plan.scaling] == [1, 2, 4] and plan.fits is True
    # At 3.5 per GPU-hour, the cost column is the GPU-hours priced.
    for point in plan.scaling:
        assert point.cost == pytest.approx(point.gpu_hours * 3.5)
    assert plan.point(2).eta_seconds is not None  # the config's own job.replicas, with an ETA (max_steps)


def test_plan_strict_refuses_a_run_that_cannot_fit_and_says_what_would(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(GPT + "train:\n  batch_size: 16\n")
    rc, out = call_cli(["plan", "--config", "c.yaml", "--gpu-memory", "0.001"], capsys)
    assert rc == 0 and "does not fit" in out, out  # without --strict the verdict only
    rc, out = call_cli(["plan", "--config", "c.yaml", "--gpu-memory", "0.001", "--strict"], capsys)
    assert rc == 1, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("kftrain: the plan refuses this run (--strict): predicted peak memory per rank"), out
    assert "exceeds the device's" in last
    (tmp_path / "s.yaml").write_text(GPT + "train:\n  batch_size: 16\nplan:\n  enabled: true\n  strict: true\n")
    rc, out = call_cli(["plan", "--config", "s.yaml", "--gpu-memory", "0.001"], capsys)
    assert rc == 1 and "(plan.strict)" in out.strip().splitlines()[-1], out


def test_plan_with_a_prepared_dataset_has_the_real_shape_and_the_runs_steps(tmp_path, monkeypatch, capsys, dataset):
    """--dataset: the manifest gives the classifier's features and classes, and the epoch's
    length, so the run's steps without train.max_steps (the ETA's other factor)."""
    from trainer.plan import Plan

    monkeypatch.chdir(tmp_path)
    rc, out = call_cli(["plan", "--json"], capsys)
    assert rc == 0, out
    guessed = Plan.from_dict(json.loads(out))
    assert guessed.point(2).eta_seconds is None
    assert any("no dataset yet" in a for a in guessed.assumptions), guessed.assumptions
    rc, out = call_cli(["plan", "--json", "--dataset", dataset], capsys)
    assert rc == 0, out
    plan = Plan.from_dict(json.loads(out))
    assert "model built from the prepared dataset's manifest" in plan.assumptions
    rows = json.loads((Path(dataset) / "manifest.json").read_text())["splits"]["train"]["rows"]
    assert plan.total_steps == 20 * (rows // 64)  # train.epochs x the train split's full batches
    assert plan.point(2).eta_seconds is None  # on the CPU without a probe: no step time to multiply
    rc, out = call_cli(["plan", "--dataset", str(tmp_path / "nowhere")], capsys)
    assert rc == 2 and out.startswith("kftrain: error: ") and "Traceback" not in out, out


SECRET = "SEKRETzz9911"
CREDENTIAL_URI = f"s3://akid:{SECRET}@bucket/prefix"


@pytest.mark.parametrize(
    ("config", "args"),
    [
        ("", ["run", "--local", "--store", CREDENTIAL_URI]),
        (f"store:\n  uri: {CREDENTIAL_URI}\n", ["run", "--local"]),
        (f"checkpoint:\n  uri: {CREDENTIAL_URI}\n", ["run", "--local"]),
        (f"checkpoint:\n  resume_from: {CREDENTIAL_URI}\n", ["run", "--local"]),
        (f"data:\n  source: {CREDENTIAL_URI}/d.csv\n", ["run", "--local"]),
        ("", ["runs", "--store", CREDENTIAL_URI]),
        ("", ["run", "--local", "--no-such-flag", CREDENTIAL_URI]),  # argparse repeats what it did not take
    ],
    ids=["--store", "store.uri", "checkpoint.uri", "checkpoint.resume_from", "data.source", "runs --store", "usage"],
)
def test_a_uri_holding_credentials_is_refused_without_printing_them(tmp_path, monkeypatch, capsys, config, args):
    monkeypatch.chdir(tmp_path)
    if config:
        (tmp_path / "c.yaml").write_text(config)
        args = [*args, "--config", "c.yaml"]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage error
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert SECRET not in out + err and "akid" not in out + err
    (line,) = err.strip().splitlines()
    assert line.startswith("kftrain: error: ") or line.startswith("kftrain run: error: ")
    assert not (tmp_path / "kftrain-outputs").exists()


@pytest.mark.parametrize(
    ("args", "start", "command"),
    [
        ([], "kftrain: error: the following arguments are required: command", "kftrain"),
        (["bogus"], "kftrain: error: argument command: invalid choice: 'bogus'", "kftrain"),
        # Arguments no subcommand took are argparse's top parser's error: the help named is the subcommand's.
        (["run", "--local", "--epochs", "3"], "kftrain: error: unrecognized arguments: --epochs 3", "kftrain run"),
        (["job", "manifest", "--bad"], "kftrain: error: unrecognized arguments: --bad", "kftrain job manifest"),
        (["job"], "kftrain job: error: the following arguments are required: job_command", "kftrain job"),
        (["runs", "--json", "x"], "kftrain: error: unrecognized arguments: x", "kftrain runs"),
        (["plan", "--probe-steps", "x"], "kftrain plan: error: argument --probe-steps:", "kftrain plan"),
        (["submit", "--wait", "--timeout", "-1"], "kftrain submit: error: argument --timeout:", "kftrain submit"),
        (["run", "--config", "run", "--bogus"], "kftrain: error: unrecognized arguments: --bogus", "kftrain run"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_of_its_command(capsys, args, start, command):
    """Was: argparse's usage block above the error, four lines and more, where every other error is one."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(start) and line.endswith(f"(`{command} --help` lists the options)"), err


@pytest.mark.parametrize(
    "flag", [["run", "--local", "--summary"], ["plan", "--output"]], ids=["run --summary", "plan --output"]
)
@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("afile/x.json", "afile is a file, so afile/x.json cannot be made"),
        (".", ". is a folder; name a file"),
        # A loop of links (was: passed, then "cannot write loopA: File exists" after the run; a
        # Python traceback as --output-dir).
        ("loopA/x.json", "loopA/x.json: its symbolic links form a loop, so it names no file or folder"),
    ],
    ids=["under-a-file", "a-folder", "a-link-loop"],
)
def test_an_output_file_that_cannot_be_written_is_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys, flag, path, error
):
    """Checked as the command starts, naming the flag: not after the run whose summary it is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "loopA").symlink_to("loopB")
    (tmp_path / "loopB").symlink_to("loopA")
    with pytest.raises(SystemExit) as exit_:
        main([*flag, path])
    assert exit_.value.code == 2
    assert f"argument {flag[-1]}: {error}" in capsys.readouterr().err
    assert main(["plan", "--output", "new/folders/plan.md", "--json"]) == 0  # missing folders are made
    assert (tmp_path / "new" / "folders" / "plan.md").exists()
    (tmp_path / "dangling").symlink_to("not-yet")  # through a link to a folder not made yet: it is made
    assert main(["plan", "--output", "dangling/plan.md", "--json"]) == 0
    assert (tmp_path / "not-yet" / "plan.md").exists()


@pytest.mark.parametrize("flag", ["--output-dir", "--summary"])
def test_a_loop_of_links_given_as_a_path_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loopA").symlink_to("loopB")
    (tmp_path / "loopB").symlink_to("loopA")
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--local", flag, "loopA"])
    assert exit_.value.code == 2
    assert f"argument {flag}: loopA: its symbolic links form a loop" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("files", "found"),
    [
        (["trainer/__init__.py"], "trainer"),  # a project's own package (was: run in place of kftrain's, silently)
        (["components/__init__.py"], "components"),
        (["pipelines.py"], "pipelines.py"),
        (["trainer/train.py"], ""),  # no __init__.py: a namespace folder, which a regular package wins over
        (["mytrainer/__init__.py", "train.py"], ""),
        (["trainer/__init__.py", "trainer/launch/local.py"], "trainer"),  # another copy of kftrain
    ],
)
def test_a_package_of_the_current_folder_named_like_kftrains_is_refused_before_processes_start(
    tmp_path, monkeypatch, capsys, files, found
):
    from trainer.launch.local import local_start_problem

    monkeypatch.chdir(tmp_path)
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("print('the user project')\n")
    problem = local_start_problem()
    copy = "trainer/launch/local.py" in files
    said = f"another copy of kftrain's source (./{found})" if copy else f"./{found}, named like kftrain's own"
    assert problem.startswith(f"the current folder holds {said}") if found else problem == ""
    assert local_start_problem(str(REPO)) == ""  # kftrain's own checkout
    if found:
        for command in (["run", "--local"], ["plan", "--probe"]):
            assert main(command) == 2
            err = capsys.readouterr().err
            assert f"kftrain: error: the current folder holds {said}" in err
            assert not (tmp_path / "kftrain-outputs").exists()


@pytest.mark.parametrize(
    ("limits", "raised_to", "refused"),
    [
        ((14, 14), None, True),  # was: the rendezvous waited silently until job.timeout_seconds
        ((14, 20000), (1024, 20000), False),  # a soft limit is raised, for the processes started here
        ((14, 100), (100, 100), False),
        ((1024, 4096), None, False),
    ],
)
def test_an_open_file_limit_too_low_for_local_processes_is_raised_or_refused(monkeypatch, limits, raised_to, refused):
    import resource

    from trainer.launch.local import local_start_problem

    raised = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits)
    monkeypatch.setattr(resource, "setrlimit", lambda which, value: raised.append(value))
    problem = local_start_problem(str(REPO))
    assert problem.startswith("this shell allows 14 open files per process (`ulimit -Hn`)") if refused else not problem
    assert raised == ([raised_to] if raised_to else [])


@pytest.mark.parametrize(
    "flag", [["run", "--local", "--summary"], ["plan", "--output"]], ids=["run --summary", "plan --output"]
)
def test_an_output_file_inside_the_data_source_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, flag):
    """Was: `--summary` written into the source folder, read by the next run's data prep as data."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("some text\n" * 100)
    (tmp_path / "c.yaml").write_text("task: causal_lm\ndata:\n  source: corpus\n")
    assert main([*flag, "corpus/out.json", "--config", "c.yaml"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip().splitlines()[-1].startswith(f"kftrain: error: {flag[-1]} 'corpus/out.json' is inside data.source")
    )
    assert sorted(p.name for p in (tmp_path / "corpus").iterdir()) == ["a.txt"]
    assert not (tmp_path / "kftrain-outputs").exists()


@pytest.mark.parametrize(
    ("flag", "earlier"),
    [
        (
            ["run", "--local", "--summary"],
            '{"artifacts": {}, "metrics": {}, "exported": false, "quality_gate": "test accuracy 0.5"}',
        ),
        (["plan", "--output"], "# Training plan\n\n1 rank(s)\n"),
    ],
    ids=["run --summary", "plan --output"],
)
@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("my.yaml", "train:\n  epochs: 2\n"),  # the config the same command reads
        ("notes.json", '{"mine": true}'),
        ("partial.json", '{"artifacts": {}, "metrics": {}}'),
        ("blob.bin", "\udcff".encode("utf-8", "surrogateescape").decode("latin-1")),
    ],
)
def test_an_output_file_overwrites_only_an_earlier_output_of_its_kind(
    tmp_path, monkeypatch, capsys, flag, earlier, name, content
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text(content)
    with pytest.raises(SystemExit) as exit_:
        main([*flag, name, "--config", name] if flag[0] == "run" else [*flag, name])
    assert exit_.value.code == 2
    assert f"argument {flag[-1]}: {name} exists and is not a " in capsys.readouterr().err
    assert (tmp_path / name).read_text() == content
    (tmp_path / "earlier").write_text(earlier)  # the same command's earlier output: it may be replaced
    (tmp_path / "empty").write_text("")  # an empty file (`mktemp`'s) holds nothing to lose
    for target in ("earlier", "empty", os.devnull):  # a device is written to, never read
        assert build_parser().parse_args([*flag, target])
    # A stream the shell redirected to a file that holds the command's lines: appended to, at the
    # end too (was: refused there, "made while the command ran", or truncated before that).
    fd = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"the command's lines\n")
        stream = f"/proc/self/fd/{fd}"
        assert build_parser().parse_args([*flag, stream])
        write_output("--flag", stream, "OUT\n", "x", lambda text: False)
    finally:
        os.close(fd)
    assert (tmp_path / "log").read_text() == "the command's lines\nOUT\n"


@pytest.mark.parametrize(("what", "earlier"), [SUMMARY_FILE, PLAN_FILE], ids=["run --summary", "plan --output"])
@pytest.mark.parametrize(
    ("at_start", "meanwhile", "kept"),
    [
        (None, None, ""),  # still absent: created
        ("", None, ""),  # an empty file (`mktemp`'s): written
        ("earlier", None, ""),  # the command's earlier output, there as it started: replaced
        (None, '{"my": "thesis data"}', "was made while the command ran and is not {what}"),  # the user's: kept
        # Another run's, given the same file (was: overwritten, both runs saying they wrote it).
        (None, "earlier", "was made while the command ran by another command"),
        ("earlier", "earlier", "was rewritten while the command ran by another command"),
    ],
    ids=["absent", "empty", "earlier", "user's", "another run's", "rewritten by another run"],
)
def test_an_output_written_at_the_end_keeps_a_file_another_made_meanwhile(
    tmp_path, what, earlier, at_start, meanwhile, kept
):
    """Checked as the command starts and again as it writes, which may be hours later (was: a file
    made there meanwhile was overwritten in silence)."""
    import time

    from pipelines.cli import _output_file

    target = tmp_path / "sub" / "out.json"
    target.parent.mkdir()

    def contents(which: str) -> str:
        if which != "earlier":
            return which
        return (
            '{"artifacts": {}, "metrics": {}, "exported": true, "quality_gate": "x"}'
            if what == "a run summary"
            else "# Training plan\n"
        )

    if at_start is not None:
        target.write_text(contents(at_start))
    _output_file(what, earlier)(str(target))  # as the command starts
    if meanwhile is not None:
        time.sleep(0.01)  # a later modification time, where the file system's clock is coarse
        target.write_text(contents(meanwhile) + " ")
    if kept:
        with pytest.raises(OutputError, match=rf"--flag: {target} {kept.format(what=what)}"):
            write_output("--flag", str(target), "NEW\n", what, earlier)
        assert target.read_text() == contents(meanwhile) + " "
    else:
        write_output("--flag", str(target), "NEW\n", what, earlier)
        assert target.read_text() == "NEW\n"


MAKES_THAT_FOLDER, INSIDE_THE_RUN = "the run makes that folder", "inside the run's own folder "


@pytest.mark.parametrize(
    ("summary", "store", "said"),
    [
        ("od", "", MAKES_THAT_FOLDER),  # the output folder the run makes
        ("od/runs", "", MAKES_THAT_FOLDER),
        ("od/runs/r1", "", MAKES_THAT_FOLDER),  # the run's own folder
        ("st/runs", "./st/", MAKES_THAT_FOLDER),  # a local store's
        ("st", "st", MAKES_THAT_FOLDER),
        ("st", "st/x", MAKES_THAT_FOLDER),  # a folder above the store
        # Was: accepted, the whole run, then "was made while the command ran and is not a run summary".
        ("od/runs/r1/run.json", "", INSIDE_THE_RUN),  # the run's own record
        ("od/runs/r1/started.json", "", INSIDE_THE_RUN),
        ("od/runs/r1/logs/mine.json", "", INSIDE_THE_RUN),
        ("st/runs/r1/run.json", "st", INSIDE_THE_RUN),
    ],
)
def test_a_summary_path_the_run_makes_or_writes_in_is_refused_before_any_step(
    tmp_path, monkeypatch, capsys, summary, store, said
):
    """Was: the whole run, then `--summary: cannot write od: Is a directory`, exit 1."""
    monkeypatch.chdir(tmp_path)
    where = ["--store", store] if store else ["--output-dir", "od"]
    assert main(["run", "--local", *where, "--run-id", "r1", "--summary", summary]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"kftrain: error: --summary {summary}: {said}"), err
    assert not list(tmp_path.iterdir())  # nothing ran


def test_submit_names_the_config_file_whose_yaml_is_broken(tmp_path, capsys):
    """Was: `the run's parameters are invalid: config: not valid YAML`, naming neither --config
    nor the file (`run` names it)."""
    (tmp_path / "tab.yaml").write_text("train:\n\tepochs: 2\n")
    assert main(["submit", "--host", "http://127.0.0.1:9", "--config", str(tmp_path / "tab.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kftrain: error: {tmp_path / 'tab.yaml'}: not valid YAML"), err


def test_job_manifest_says_nothing_but_the_error_when_it_refuses(capsys):
    """The placeholder-store note comes with a manifest, not before an error it has nothing to do with."""
    assert main(["job", "manifest", "--kind", "pytorchjob", "--name", "Bad_Name"]) == 2
    err = capsys.readouterr().err
    assert "note" not in err and err.startswith("kftrain: error: job name 'Bad_Name'"), err


def test_example_model_does_not_read_a_large_file_in_its_way(tmp_path, monkeypatch, capsys):
    """A user's model where the example goes was read whole to be hashed (1.9 GB for 1.5 GB)."""
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "ex" / "tiny-llama" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    with weights.open("wb") as f:
        f.truncate(1024**3)  # sparse: 1 GiB the check must not read
    read = []
    real_open = type(weights).open
    monkeypatch.setattr(type(weights), "open", lambda self, *a, **k: read.append(self) or real_open(self, *a, **k))
    assert main(["example-model", "ex"]) == 2
    assert "is not kftrain's example model: it is kept" in capsys.readouterr().err
    assert weights.resolve() not in {p.resolve() for p in read} and weights.stat().st_size == 1024**3


def test_example_model_keeps_what_is_not_its_example(tmp_path, monkeypatch, capsys):
    """Written twice into one folder: the same files, kept. Over the user's own chat data or
    model folder: refused, naming it, and nothing in the folder changes."""
    monkeypatch.chdir(tmp_path)
    assert main(["example-model", "ex"]) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "ex").rglob("*") if p.is_file()}
    # Every file readable as a download's are (was: model.safetensors 0600, as safetensors writes it).
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "ex" / "tiny-llama").iterdir()} == {0o644}
    assert main(["example-model", "ex"]) == 0
    assert {p: p.read_bytes() for p in (tmp_path / "ex").rglob("*") if p.is_file()} == before
    # A newer version writes other bytes: what the last one wrote, unchanged since, is replaced...
    import trainer.example_model as example

    real = example.chat_records
    monkeypatch.setattr(example, "chat_records", lambda n, seed=0: real(n, seed + 1))
    assert main(["example-model", "ex"]) == 0
    assert (tmp_path / "ex" / "chat.jsonl").read_bytes() != before[tmp_path / "ex" / "chat.jsonl"]
    # ... but not once the user changed it.
    with open(tmp_path / "ex" / "chat.jsonl", "a") as f:
        f.write('{"messages": []}\n')
    monkeypatch.setattr(example, "chat_records", real)
    capsys.readouterr()
    assert main(["example-model", "ex"]) == 2
    assert "ex/chat.jsonl exists and is not kftrain's example chat data" in capsys.readouterr().err
    for mine in ("chat.jsonl", "tiny-llama/config.json"):
        folder = tmp_path / mine.split("/")[0].replace(".", "-")
        (folder / mine).parent.mkdir(parents=True)
        (folder / mine).write_text("mine")
        capsys.readouterr()
        assert main(["example-model", str(folder)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{folder / mine.split('/')[0]} exists and is not kftrain's example" in err[0], err
        assert [p for p in folder.rglob("*") if p.is_file()] == [folder / mine]
        assert (folder / mine).read_text() == "mine"


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ({"userfile.txt": "hello"}, "userfile.txt is a file, not a folder: it is kept"),
        ({"ex/tiny-llama": "->../ex0/tiny-llama"}, "ex/tiny-llama is a link: it is kept"),
        ({"ex/chat.jsonl": "->../ex0/chat.jsonl"}, "ex/chat.jsonl is a link: it is kept"),
    ],
    ids=["a-file", "a-link-to-the-example-model", "a-link-to-the-example-chat"],
)
def test_example_model_refuses_a_file_or_a_link_in_its_way_naming_it(tmp_path, monkeypatch, capsys, layout, said):
    """Was: "cannot write userfile.txt: File exists"; and for a link to an example (whose digests
    match), rmtree's "Cannot call rmtree on a symbolic link", naming no path."""
    monkeypatch.chdir(tmp_path)
    assert main(["example-model", "ex0"]) == 0
    for name, content in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("->"):
            (tmp_path / name).symlink_to(content[2:])
        else:
            (tmp_path / name).write_text(content)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["example-model", next(iter(layout)).split("/")[0]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("out_dir", [None, "elsewhere"], ids=["default", "another-folder"])
def test_example_model_says_how_to_fine_tune_what_it_wrote(tmp_path, monkeypatch, capsys, out_dir):
    """The config the hint names reads the default folder: for another folder, the hint says
    which two fields point at what was written. (The writer is replaced: what it writes is
    tests/integration/test_pipeline_local.py's fine-tuning run.)"""
    import trainer.example_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(trainer.example_model, "write_example", lambda d: (f"{d}/tiny-llama", f"{d}/chat.jsonl"))
    assert main(["example-model", *([out_dir] if out_dir else [])]) == 0
    out = capsys.readouterr().out
    assert "fine-tune it: kftrain run --local --config configs/finetune-tiny.yaml" in out
    if out_dir:
        assert "set model.init_from: elsewhere/tiny-llama" in out and "data.source: elsewhere/chat.jsonl" in out
    else:
        assert "model.init_from" not in out


@pytest.mark.parametrize(
    ("config", "dataset", "error"),
    [
        ("", "missing", "--dataset missing: no prepared dataset there (no manifest.json)"),
        ("", "afile", "--dataset afile: no prepared dataset there (no manifest.json)"),  # a file, not a folder
        ("task: causal_lm\n", "tabular", "holds a 'kftrain.tabular.v2' dataset, not 'kftrain.tokens.v2'"),
        ("", "tokens", "holds a 'kftrain.tokens.v2' dataset, not 'kftrain.tabular.v2'"),
        ("", "tabular/manifest.json", "names the dataset's manifest.json; pass its folder: --dataset tabular"),
        ("", "manifest.json", "names the dataset's manifest.json; pass its folder: --dataset ."),
    ],
    ids=["missing", "a-file", "another-tasks", "another-tasks-too", "its-manifest", "a-manifest-here"],
)
def test_plan_dataset_that_is_not_this_tasks_prepared_dataset_is_named(
    tmp_path, monkeypatch, capsys, config, dataset, error
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    (tmp_path / "c.yaml").write_text(config)
    for name, fmt in (("tabular", "kftrain.tabular.v2"), ("tokens", "kftrain.tokens.v2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"format": fmt, "splits": {}}))
    assert main(["plan", *(["--config", "c.yaml"] if config else []), "--dataset", dataset]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kftrain: error: --dataset") and error in last


@pytest.mark.parametrize(
    ("host", "error"),
    [
        ("http://user:hunter2@127.0.0.1:9", "a user or password in the URL is not used (and would be printed)"),
        ("localhost:8080", "must be a URL starting with http:// or https://, got 'localhost:8080'"),
        ("http://", "must be a URL starting with http:// or https://"),
        ("http://127.0.0.1:abc", "'http://127.0.0.1:abc': the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:99999", "'http://127.0.0.1:99999': the port must be a number"),
        ("http:// 127.0.0.1:9", "'http:// 127.0.0.1:9' holds a space or a control character"),
        ("http://u:hunter2/x@127.0.0.1:9", "a user or password in the URL is not used"),
        ("http://[::1:8888", "'http://[::1:8888': the port must be a number from 1 to 65535 (an IPv6 host"),
        ("http:///u:hunter2@127.0.0.1:9", "a user or password in the URL is not used"),
    ],
    ids=[
        "credentials",
        "no-scheme",
        "no-host",
        "port-not-a-number",
        "port-too-large",
        "space",
        "slash-in-password",
        "ipv6-unclosed",
        "three-slashes",
    ],
)
def test_submit_host_must_be_a_plain_http_url(capsys, host, error):
    with pytest.raises(SystemExit) as exit_:
        main(["submit", "--host", host])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument --host: {error}" in err and "hunter2" not in err


@pytest.mark.parametrize("flag", ["--timeout", "--poll-seconds"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e20", "31622401"])
def test_submit_durations_are_positive_and_at_most_a_year(capsys, flag, value):
    """A duration past a year would overflow sleep and datetime on first use, as a traceback."""
    with pytest.raises(SystemExit) as exit_:
        main(["submit", "--host", "http://127.0.0.1:9", flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be a positive number of seconds, at most 31622400" in err


def test_ctrl_c_ends_any_command_with_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("pipelines.cli._cmd_plan", interrupted)
    rc = main(["plan"])
    err = capsys.readouterr().err
    assert rc == 130 and err.strip() == "kftrain: interrupted; what it started on this machine has stopped"


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["submit", "--host", "http://127.0.0.1:9", "--timeout", "60"], "--timeout: limits how long --wait follows"),
        (
            ["submit", "--host", "http://127.0.0.1:9", "--param", "epochs=2", "--param", "epochs=3"],
            "--param epochs: given twice; give each parameter once",
        ),
        (["horovod-run", "nonexist.py"], "kftrain horovod-run: nonexist.py: no such file; name the Horovod script"),
        (["horovod-run", "."], "kftrain horovod-run: .: a folder without __main__.py"),
        # horovodrun's flags and the interpreter where the script goes (was: argparse's usage of
        # every kftrain command, "unrecognized arguments: -np"; "python: no such file").
        (["horovod-run", "-np", "2", "train.py"], "kftrain horovod-run: -np: a horovodrun flag; this runner starts"),
        (["horovod-run", "-H", "localhost:2", "train.py"], "-H: a horovodrun flag"),
        (["horovod-run", "--gloo", "train.py"], "start the processes with torchrun (`python -m torch.distributed.run"),
        (["horovod-run", "python", "train.py"], "python: name the script itself, without the interpreter"),
        (["horovod-run", "/usr/bin/python3.11", "train.py"], "without the interpreter (kftrain horovod-run train.py"),
    ],
)
def test_a_flag_that_would_be_ignored_or_a_missing_script_is_one_line(tmp_path, monkeypatch, capsys, argv, phrase):
    monkeypatch.chdir(tmp_path)
    rc, out = call_cli(argv, capsys)
    assert rc == 2, out
    assert phrase in out and "Traceback" not in out, out


@pytest.mark.parametrize("script", ["train.py", "horovod-run", "-x.py"])
def test_a_script_named_as_the_subcommand_gets_only_its_own_arguments(tmp_path, monkeypatch, script):
    """A script named as the subcommand got its own name as an extra argument (a probe)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / script).write_text("import json, sys\nopen('argv.json', 'w').write(json.dumps(sys.argv))\n")
    assert main(["horovod-run", script, "x", "--", "-y"]) == 0
    assert json.loads((tmp_path / "argv.json").read_text()) == [script, "x", "--", "-y"]


def test_horovod_run_without_a_script_asks_for_the_script_alone(capsys):
    """Was: "required: script, script_args" (argparse's reading of the arguments after it)."""
    with pytest.raises(SystemExit) as exit_:
        main(["horovod-run"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.endswith(
        "kftrain horovod-run: error: the following arguments are required: script (`kftrain horovod-run --help` lists "
        "the options)\n"
    )


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    """`kftrain compile | head -0`: a real pipe whose reader closed; no error line, the status of
    a command SIGPIPE ended. A broken pipe that is not standard output's stays an error."""
    monkeypatch.chdir(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed:
        monkeypatch.setattr("sys.stdout", closed)
        assert main(["compile", "--output-dir", "out"]) == 141
        monkeypatch.undo()
    assert capsys.readouterr().err == ""
    assert list((tmp_path / "out").glob("*.yaml"))  # the work was done; only its report had no reader

    def broken(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe (a subprocess's)")

    monkeypatch.setattr("pipelines.compile.compile_all", broken)
    assert main(["compile", "--output-dir", "out"]) == 2
    assert "kftrain: error: " in capsys.readouterr().err


class _FullDisk(io.StringIO):
    """Standard output redirected to a file on a full disk (`> run.log`, `> /dev/full`)."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize(
    ("command", "stdout", "code", "said"),
    [
        # A run's lines are a view of it: its own outcome stands (was: 141 for a finished run, a
        # failed gate's 3 lost; a full disk's error stopped the run half-way, exit 2).
        ("run", "closed-pipe", 3, ""),
        (
            "run",
            "full-disk",
            3,
            "kftrain: warning: standard output could not be written (No space left on device); the",
        ),
        # And when standard error fails too (a hung-up terminal): no traceback, the outcome stands.
        ("run", "both-full", 3, None),
        # Another command's output is its product: not written, it failed, and it stops there (a
        # `submit --wait` following a run went on polling its reader-less pipe for hours).
        ("manifest", "closed-pipe", 141, ""),
        ("manifest", "full-disk", 1, "kftrain: error: cannot write standard output: No space left on device"),
        ("follow", "closed-pipe", 141, ""),
        ("follow", "full-disk", 1, "kftrain: error: cannot write standard output: No space left on device"),
    ],
)
def test_standard_output_that_cannot_be_written_is_said_once_and_a_run_keeps_its_outcome(
    tmp_path, monkeypatch, capsys, command, stdout, code, said
):
    printed = []

    def printing(args):
        for _ in range(200):
            print("a line " * 40, flush=True)
            printed.append(1)
        return GATE_FAILED if command == "run" else 0

    monkeypatch.setattr("pipelines.cli._cmd_run", printing)
    monkeypatch.setattr("pipelines.cli._cmd_runs", lambda args: printing(args))  # a command of its own
    argv = {"run": ["run", "--local"], "follow": ["runs"], "manifest": ["job", "manifest", "--kind", "pytorchjob"]}
    argv = argv[command]
    if stdout == "closed-pipe":
        read_end, write_end = os.pipe()
        os.close(read_end)
        out = os.fdopen(write_end, "w")
    else:
        out = _FullDisk()
    with out:
        monkeypatch.setattr("sys.stdout", out)
        if stdout == "both-full":
            monkeypatch.setattr("sys.stderr", _FullDisk())
        assert main(argv) == code
        monkeypatch.undo()
    if command == "follow":
        assert len(printed) <= 1  # stopped at the first line that had nowhere to go
    if said is None:
        return
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert last.startswith(said) if said else "error" not in err and "standard output" not in err, err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["job", "manifest", "--namespace", "My_NS"], "--namespace: kubernetes.namespace: 'My_NS' is not a namespace"),
        (["job", "manifest", "--set", "kubernetes.backoff_limit=-3"], "--set kubernetes.backoff_limit: must be"),
        # A mapping's entry: the field once (was: `--set kubernetes.max_restarts_by_cause: kubernetes.max_...oom:`).
        (
            ["job", "manifest", "--set", "kubernetes.max_restarts_by_cause={oom: 1.5}"],
            "--set kubernetes.max_restarts_by_cause.oom: must be an integer, got 1.5",
        ),
        (
            ["job", "manifest", "--set", "kubernetes.queue="],
            "--set kubernetes.queue: must be a string",
        ),
        (["job", "manifest", "--set", "job.kind=auto"], "job.kind: 'auto' is resolved by the cluster"),  # no --kind
        # One field set twice: refused, as a repeated --param or YAML key (was: the last won in silence).
        (
            ["job", "manifest", "--set", "job.replicas=4", "--set", "job.replicas=1"],
            "--set job.replicas: job.replicas is also set by --set job.replicas; give each field once",
        ),
        (
            ["job", "manifest", "--set", "job.replicas=4", "--set", "job={replicas: 1}"],
            "--set job: job.replicas is also set by --set job.replicas",
        ),
        (["job", "manifest", "--set", "job.kind=trainjob", "--kind", "pytorchjob"], "--set job.kind: job.kind is also"),
        (
            ["job", "manifest", "--set", "kubernetes={namespace: a}", "--namespace", "b"],
            "--set kubernetes: kubernetes.namespace is also set by --namespace",
        ),
        # An unknown key is refused at the section above it: still named by its --set.
        (["job", "manifest", "--set", "job..replicas=2"], "--set job..replicas: job.: unknown key"),
        (["job", "manifest", "--set", "nosuch.x=1"], "--set nosuch.x: nosuch: unknown key"),
        (["run", "--local", "--store", "s3:/x"], "--store: store.uri: storage URI 's3:/x' lacks the '//'"),
        (
            ["run", "--local", "--s3-endpoint", "minio:9000"],
            "--s3-endpoint: store.endpoint: 'minio:9000' must be a URL",
        ),
    ],
)
def test_a_flag_s_bad_value_is_named_by_the_flag(tmp_path, monkeypatch, capsys, argv, named):
    """The user typed the flag, not the config field it sets: the error names both."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"kftrain: error: {named}"), last


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        # An unquoted value with spaces, split by the shell: the whole of it, quoted, is the fix.
        (["job", "manifest", "--set", "kubernetes.node_selector={a:", "b}"], "--set 'kubernetes.node_selector={a: b}'"),
        (
            [
                "job",
                "manifest",
                "--set",
                "kubernetes.tolerations=[{key:",
                "a,",
                "operator:",
                "Exists}]",
                "--set",
                "x=1",
            ],
            "--set 'kubernetes.tolerations=[{key: a, operator: Exists}]'",
        ),
        (["job", "manifest", "--set", "job.image=my", "image"], "--set 'job.image=my image'"),
        (["submit", "--host", "http://h", "--param", "store=s3://b/my", "data"], "--param 'store=s3://b/my data'"),
        # A value that may be a credential is not shown: its first word was never echoed before.
        (
            ["job", "manifest", "--set", "kubernetes.env.DB_PASSWORD=correct", "horse", "battery"],
            "--set 'kubernetes.env.DB_PASSWORD=...' (the whole value inside the quotes)",
        ),
        (
            ["job", "manifest", "--set", "data.source=hf_abcdefghijklmnopqrstuvwxyz0123456789", "x"],
            "--set 'data.source=...' (the whole value inside the quotes)",
        ),
        # The value's own YAML quotes, which the shell took away: not put back wrong (was: a "fix" that
        # failed as YAML).
        (
            ["job", "manifest", "--set", "kubernetes.annotations={note:", "a:", "b}"],
            "--set 'kubernetes.annotations=...' with the whole value inside the quotes (and any YAML quotes of its own"
            ' kept inside them: `{note: "a: b"}`)',
        ),
        # A pipeline parameter's text is taken as written, not as YAML: quoted whole.
        (
            ["submit", "--host", "http://h", "--param", "data_source=@team/my", "data"],
            "--param 'data_source=@team/my data'",
        ),
        # Not a split value: no hint.
        (["job", "manifest", "--set", "job.image=x", "--bogus"], ""),
        (["job", "manifest", "stray"], ""),
    ],
)
def test_a_value_the_shell_split_at_its_spaces_is_shown_quoted(capsys, argv, hint):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kftrain") and "unrecognized arguments" in last, last
    if hint:
        assert last.endswith(f"; the shell split a value at its spaces: quote the whole of it, {hint}"), last
        assert "correct" not in last and "hf_abc" not in last
    else:
        assert "the shell split" not in last, last


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "kubernetes={queue: a}", "--namespace", "ns"],
        ["--set", "kubernetes={queue: a}", "--set", "kubernetes.namespace=ns"],
    ],
    ids=["--namespace", "--set"],
)
def test_a_section_mapping_and_another_field_of_that_section_both_apply(capsys, argv):
    """A mapping for a section sets only its own fields (was: refused beside any other field of the section)."""
    assert main(["job", "manifest", "--kind", "pytorchjob", *argv]) == 0
    out = capsys.readouterr().out
    assert "kueue.x-k8s.io/queue-name: a" in out and "namespace: ns" in out


@pytest.mark.parametrize("args", [["--", "--lr", "1"], ["--lr", "1", "x"], []])
def test_horovod_run_passes_the_script_its_arguments_as_python_would(tmp_path, monkeypatch, capsys, args):
    """`kftrain horovod-run s.py ARGS` and `python -m trainer.horovod.run s.py ARGS` give the script
    the same argv, a `--` among them included (was: the CLI's parser dropped it)."""
    from trainer.horovod.run import main as module_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("import sys\nprint('ARGS', sys.argv[1:])\n")
    assert main(["horovod-run", "s.py", *args]) == 0
    assert module_main(["s.py", *args]) == 0
    assert capsys.readouterr().out.splitlines() == [f"ARGS {args}"] * 2


SUBMIT = ["submit", "--host", "http://127.0.0.1:9", "--package", str(REPO / "compiled" / "training_pipeline.yaml")]


@pytest.mark.parametrize(
    ("text", "extra", "phrase"),
    [
        ("train:\n  epochs: 2\n", [], None),
        ("train:\n  epochs: 2\n", ["--param", "config=train: {epochs: 1}"], "--config and --param config= both give"),
        (None, [], "--config c.yaml: cannot read the config file (No such file or directory)"),
        ("", [], "--config c.yaml: the file is empty"),
        ("task: causal_lm\nmodel: {init_from: s3://models/x, n_layer: 3}\n", [], "model.n_layer: is defined by the"),
    ],
    ids=["its-text-is-the-parameter", "twice", "missing", "empty", "invalid"],
)
def test_submit_takes_a_config_file_as_run_and_plan_do(tmp_path, monkeypatch, capsys, text, extra, phrase):
    """`kftrain submit --config FILE` sends the file's text as the `config` parameter (the pods cannot
    read this machine's files), checked as `--param config=` is, before anything is uploaded."""
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / "c.yaml").write_text(text)
    sent = {}

    def submit(client, host, package, pipeline, experiment, run_name, params, **kwargs):
        sent.update(params)
        return type("Result", (), {"version_name": "v", "run_id": "r", "run_url": "u"})()

    monkeypatch.setattr("pipelines.submit.make_client", lambda host, namespace, ca=None: object())
    monkeypatch.setattr("pipelines.submit.submit", submit)
    rc, out = call_cli([*SUBMIT, "--config", "c.yaml", *extra], capsys)
    if phrase is None:
        assert rc == 0 and sent == {"config": text}, out
        return
    assert rc == 2 and phrase in out and "Traceback" not in out and not sent, out


@pytest.mark.parametrize(
    "argv", [["job", "status", "x", "-n", "team-a"], ["job", "manifest", "-n", "team-a"], [*SUBMIT, "-n", "team-a"]]
)
def test_every_namespace_flag_takes_kubectl_s_short_form(argv):
    assert build_parser().parse_args(argv).namespace == "team-a"


def test_a_stopped_run_whose_store_cannot_be_read_says_so_not_that_nothing_was_committed(monkeypatch):
    """(was: "no checkpoint committed yet" of a run with six committed, its store gone away)"""
    from pipelines.cli import _stopped
    from trainer.config import load_config
    from trainer.storage import StoreError

    def unreachable(cfg, run, root, strict=False):
        if not strict:
            return None
        raise StoreError("cannot reach the object store at http://127.0.0.1:9 (connection refused)")

    monkeypatch.setattr("pipelines.local_run.newest_checkpoint", unreachable)
    args = build_parser().parse_args(["run", "--local"])
    said = _stopped(load_config(), args, "r1", True, existed=False)
    assert "no checkpoint committed" not in said
    assert said.endswith(
        "(its store could not be read for its newest checkpoint: cannot reach the object store at "
        "http://127.0.0.1:9 (connection refused))"
    )


@pytest.mark.parametrize(
    ("started", "run_id", "checkpoints", "said", "then"),
    [
        (
            False,
            None,
            True,
            "stopped before this start began, so nothing of it ran",
            "Start it again: kftrain run --local",
        ),
        (
            False,
            "r1",
            True,
            "stopped before this start began, so nothing of it ran (what its earlier starts",
            "Resume it: kftrain run --local --run-id r1",
        ),
        (
            True,
            None,
            True,
            "(its newest committed checkpoint is step 40)",
            "Resume it: kftrain run --local --run-id r1",
        ),
        (True, None, False, "(checkpoint.enabled is off: no training step was saved)", "training starts over"),
    ],
    ids=["before-start", "continued-run-before-start", "checkpointed", "checkpoints-off"],
)
def test_a_stopped_run_s_last_line_says_what_it_left_and_what_to_run(
    monkeypatch, started, run_id, checkpoints, said, then
):
    """A stop before the pre-flight passed offers the same command (not a --run-id nothing was
    written for); with checkpoints off the rerun is said to start training over."""
    from pipelines.cli import _stopped, _then
    from trainer.config import load_config

    monkeypatch.setattr("pipelines.local_run.newest_checkpoint", lambda cfg, run, root, strict=False: 40)
    cfg = load_config(overrides={"checkpoint.enabled": checkpoints})
    args = build_parser().parse_args(["run", "--local", *(["--run-id", run_id] if run_id else [])])
    args.argv = ["run", "--local", *(["--run-id", run_id] if run_id else [])]
    assert said in _stopped(cfg, args, "r1", started, existed=run_id is not None)
    if not started:  # a new run named with --run-id had no earlier start (was: said it had)
        assert "earlier starts" not in _stopped(cfg, args, "r1", started, existed=False)
    line = _then(cfg, args, "r1", started)
    assert then in line
    if not started and run_id is None:
        assert "--run-id" not in line


def test_submit_refuses_an_empty_config_flag_instead_of_ignoring_it(capsys):
    """`--config "$CFG"` with CFG unset would otherwise submit the pipeline's default config."""
    rc, out = call_cli([*SUBMIT, "--config", ""], capsys)
    assert rc == 2 and "--config : cannot read the config file" in out and "Traceback" not in out, out


@contextlib.contextmanager
def _scope_without_processes(run_id, on_stop, after=None):
    """`run_scope` with no watchdog process (the fake `run_local`s start none), which leaves the
    stop signals' handlers as the real one does."""
    import signal

    from pipelines.local_run import stop_signals

    try:
        yield
    finally:
        if after is not None:
            for sig in stop_signals():
                signal.signal(sig, after)


def _no_process_watch(monkeypatch, runs: bool = False) -> None:
    """No watchdog process for the run's processes. `runs`: `run_local` is a fake, which passes
    its pre-flight and finishes at once."""
    monkeypatch.setattr("pipelines.local_run.run_scope", _scope_without_processes)
    if runs:
        summary = {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": ""}
        monkeypatch.setattr("pipelines.local_run.run_local", lambda cfg, on_start, **kw: on_start() or summary)


# (config the run started with, gates it started with, what this start gives: --config text and
# flags; the task and epochs the run gets, its --min-accuracy and --max-perplexity)
STARTED_ROWS = {
    "no --config: the recorded config and gate": (
        {"train": {"epochs": 7}},
        {"min_accuracy": 0.5, "max_perplexity": 0.0},
        None,
        [],
        ("classification", 7, 0.5, 0.0),
    ),
    "a gate given now wins": (
        {"train": {"epochs": 7}},
        {"min_accuracy": 0.5, "max_perplexity": 0.0},
        None,
        ["--min-accuracy", "0.7"],
        ("classification", 7, 0.7, 0.0),
    ),
    "--config given: that config, the recorded gate": (
        {"train": {"epochs": 7}},
        {"min_accuracy": 0.5, "max_perplexity": 0.0},
        "train:\n  epochs: 2\n",
        [],
        ("classification", 2, 0.5, 0.0),
    ),
    "--config and a gate given": (
        {"train": {"epochs": 7}},
        {"min_accuracy": 0.5, "max_perplexity": 0.0},
        "train:\n  epochs: 2\n",
        ["--min-accuracy", "0.9"],
        ("classification", 2, 0.9, 0.0),
    ),
    "a language model: its gate, not the other task's default": (
        {"task": "causal_lm", "train": {"epochs": 4}},
        {"min_accuracy": 0.9, "max_perplexity": 50.0},
        None,
        [],
        ("causal_lm", 4, 0.9, 50.0),
    ),
}


@pytest.mark.parametrize(
    ("recorded", "gates", "config", "flags", "expected"), STARTED_ROWS.values(), ids=STARTED_ROWS.keys()
)
def test_run_id_without_config_continues_with_what_the_run_started_with(
    tmp_path, monkeypatch, capsys, recorded, gates, config, flags, expected
):
    """`--run-id` of a run stopped before its first checkpoint (data prep, say) continued with the
    built-in defaults when --config was left out: the demo trained in the run's name. `run_local`
    is replaced by a fake that records what it was given; the start record is the real one."""
    from pipelines.local_run import record_started, with_run_checkpoints
    from trainer.config import parse_config

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    first = parse_config(json.dumps(recorded))
    record_started(with_run_checkpoints(first, "r1", "out"), "r1", "out", first, gates)
    given: dict = {}

    def fake_run_local(cfg, local_root, min_accuracy, max_perplexity, run_id, on_start):
        given.update(cfg=cfg, gates=(min_accuracy, max_perplexity))
        on_start()
        return {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": "passed", "run_id": run_id}

    monkeypatch.setattr("pipelines.local_run.run_local", fake_run_local)
    if config is not None:
        Path("c.yaml").write_text(config)
    argv = ["run", "--local", "--output-dir", "out", "--run-id", "r1", *flags]
    assert main([*argv, *(["--config", "c.yaml"] if config else [])]) == 0
    task, epochs, min_accuracy, max_perplexity = expected
    assert (given["cfg"].task, given["cfg"].train.epochs) == (task, epochs)
    assert given["gates"] == (min_accuracy, max_perplexity)
    err = "".join(capsys.readouterr())  # its notes: stdout and stderr
    assert ("r1: with the config it was last started with" in err) == (config is None)
    # The gate: taken as started (said when not the default), or a change said.
    if not flags and min_accuracy != 0.9:
        assert f"kftrain: run r1: --min-accuracy {min_accuracy:g}, as it was last started with" in err
    if flags:
        assert f"kftrain: run r1: --min-accuracy {flags[1]} (it was last started with 0.5)" in err
    # Nothing was committed: said, not silent (as when its checkpoints were deleted).
    assert "kftrain: run r1 has no complete checkpoint in " in err
    assert "its training starts from step 0" in err


def test_a_run_id_with_a_checkpoint_or_never_started_gets_no_start_over_note(tmp_path, monkeypatch, capsys):
    from pipelines.local_run import record_started, with_run_checkpoints
    from tests.unit.test_pipelines_local_run import fake_checkpoint
    from trainer.config import load_config

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    assert main(["run", "--local", "--output-dir", "out", "--run-id", "new"]) == 0
    err = "".join(capsys.readouterr())  # its notes: stdout and stderr
    assert "no run new under --output-dir out yet: it starts from the beginning" in err
    assert "no complete checkpoint" not in err
    # One starting from another run's checkpoint says so (was: "from the beginning", then resumed).
    (tmp_path / "earlier").mkdir()
    (tmp_path / "c.yaml").write_text(f"checkpoint:\n  resume_from: {tmp_path / 'earlier'}\n")
    main(["run", "--local", "--output-dir", "out", "--run-id", "newer", "--config", "c.yaml"])
    assert "no run newer under --output-dir out yet: it starts from checkpoint.resume_from (" in capsys.readouterr().err
    started = with_run_checkpoints(load_config(), "r1", "out")
    record_started(started, "r1", "out")
    fake_checkpoint(Path(started.checkpoint.uri), 3)
    assert main(["run", "--local", "--output-dir", "out", "--run-id", "r1"]) == 0
    err = "".join(capsys.readouterr())  # its notes: stdout and stderr
    assert "no complete checkpoint" not in err and "with the config it was last started with" in err


@pytest.mark.parametrize(
    "record", ["{not json", '{"run_id": "r1", "checkpoint_uri": ""}', None], ids=["damaged", "old", "gone"]
)
def test_a_start_record_without_a_config_says_the_defaults_apply(tmp_path, monkeypatch, capsys, record):
    """A damaged start record, one from before kftrain kept the config, or none left in a run's
    folder that holds other things (its log): the defaults are said to apply (was: applied in
    silence, as the record was taken for none; a run whose store lost it trained the demo)."""
    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    started = tmp_path / "out" / "runs" / "r1" / "started.json"
    started.parent.mkdir(parents=True)
    if record is None:
        (started.parent / "log-20261207-120000.txt").write_text("an earlier start's log\n")
    else:
        started.write_text(record)
    assert main(["run", "--local", "--output-dir", "out", "--run-id", "r1"]) == 0
    err = capsys.readouterr().err
    said = f"no start record ({started}: deleted" if record is None else f"its start record ({started}) holds no config"
    assert f"kftrain: run r1: {said}" in err
    assert "the built-in defaults apply; give --config with the config it ran with" in err


def test_a_summary_that_cannot_be_written_at_the_end_fails_the_run_after_its_lines(tmp_path, monkeypatch, capsys):
    """The run finished, then --summary's folder could not be written (was: exit 2, which says
    refused before any step, and no artifacts or metrics on the terminal)."""
    import errno

    def full_disk(path, *args, **kwargs):
        if Path(path).name != "s.json":
            return open(path, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", "s.json")

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    monkeypatch.setattr("pipelines.cli.open", full_disk, raising=False)  # the module's own `open` only
    rc = main(["run", "--local", "--output-dir", "out", "--run-id", "r1", "--summary", "s.json"])
    out, err = capsys.readouterr()
    assert rc == 1, err
    assert "kftrain: run finished. Artifacts:" in out and "Quality gate passed" in out
    assert "summary written to" not in out
    assert err.strip().splitlines()[-1] == (
        "kftrain: error: --summary: cannot write s.json: No space left on device; name a folder you can write (the run "
        f"finished; its summary is kept with it: `kftrain run --local --output-dir {tmp_path}/out --run-id r1 "
        "--summary PATH` writes it again)"
    )


@pytest.mark.parametrize(
    ("argv", "resumed"),
    [
        (
            ["run", "--local", "--output-dir", "out", "--config", "c.yaml"],
            "--output-dir {cwd}/out --config {cwd}/c.yaml",
        ),
        (["run", "--local", "--output-dir=out", "--summary=s.json"], "--output-dir={cwd}/out --summary={cwd}/s.json"),
        (["run", "--local", "--store", "st"], "--store {cwd}/st"),
        (["run", "--local", "--store", "s3://bkt/x"], "--store s3://bkt/x"),
        (["run", "--local", "--store", "/abs/st", "--min-accuracy", "0.5"], "--store /abs/st --min-accuracy 0.5"),
    ],
)
def test_the_printed_resume_command_works_from_any_folder(tmp_path, monkeypatch, argv, resumed):
    """Its paths absolute (was: as typed, so run from another folder it found no run)."""
    from pipelines.cli import _resume_command

    monkeypatch.chdir(tmp_path)
    assert _resume_command(argv, "r1") == f"kftrain {' '.join(argv[:2])} {resumed.format(cwd=tmp_path)} --run-id r1"


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (FileNotFoundError(2, "No such file or directory", "/proc/x"), "/proc/x: No such file or directory"),
        (PermissionError(1, "Operation not permitted", "/sys/x"), "/sys/x: Operation not permitted"),
        (OSError(18, "Invalid cross-device link", "a", None, "b"), "a: Invalid cross-device link (-> b)"),
        (OSError("no errno"), "no errno"),
        (ValueError("a value"), "a value"),
    ],
)
def test_an_os_error_reaching_the_command_line_is_its_file_and_what_the_system_said(error, line):
    """Was: Python's `[Errno 2] No such file or directory: '/proc/x'`."""
    from pipelines.cli import _said

    assert _said(error) == line


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--s3-endpoint", "http://127.0.0.1:9000"], True),  # was: accepted and unused, in silence
        (["--s3-endpoint", "http://127.0.0.1:9000", "--store", "s3://bkt/runs"], False),
        ([], False),
    ],
)
def test_a_local_run_says_an_endpoint_it_reads_nothing_with(tmp_path, monkeypatch, capsys, argv, said):
    """Only `kftrain run --local`: on a cluster the steps' files are in KFP's pipeline root, an
    object store read with store.endpoint, whatever the config's URIs."""
    from trainer.checks import ignored_settings
    from trainer.config import load_config

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    monkeypatch.setattr("pipelines.local_run.run_started", lambda *a: False)
    out_dir = [] if "--store" in argv else ["--output-dir", "out"]
    assert main(["run", "--local", *out_dir, *argv]) == 0
    err = capsys.readouterr().err
    assert ("kftrain: warning: store.endpoint (--s3-endpoint) is set, but this local run" in err) is said, err
    assert ignored_settings(load_config(overrides={"store.endpoint": "http://minio-service.kubeflow:9000"})) == []


@pytest.mark.parametrize(
    ("error", "first"),
    [
        ("data.source 'x': no object there", "did not finish; after fixing the cause, resume it: kftrain run"),
        # Its rank stopped from outside after its checkpoint (a SIGTERM to it alone): nothing to fix.
        (
            "training job kftrain-1 failed: replica master-0 exited with code 1; its training process stopped on a "
            "SIGTERM after committing a checkpoint (nothing to fix: resume it)",
            "did not finish; resume it: kftrain run",
        ),
    ],
    ids=["a cause to fix", "stopped from outside"],
)
def test_a_failed_run_says_to_fix_the_cause_only_where_there_is_one(tmp_path, monkeypatch, capsys, error, first):
    from pipelines.local_run import PipelineFailed
    from trainer.errors import error_line

    def failing(cfg, on_start, **kw):
        on_start()
        print("00:00:00.000 - INFO - Executing task 'train'")
        print(f"    {error_line('train', RuntimeError(error))}")
        print("00:00:01.000 - ERROR - Task 'train' finished with status FAILURE")
        raise PipelineFailed("Task train failed")

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    monkeypatch.setattr("pipelines.local_run.run_local", failing)
    assert main(["run", "--local", "--output-dir", "out", "--run-id", "r1"]) == 1
    err = capsys.readouterr().err
    assert f"kftrain: run r1 {first}" in err, err
    assert err.strip().splitlines()[-1] == f"kftrain: error: step train: {error}"


def test_plan_names_dataset_when_its_store_refuses(tmp_path, monkeypatch, capsys):
    """The store's answer for --dataset names the flag (was: "no object-store credentials" alone)."""
    monkeypatch.chdir(tmp_path)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MINIO_ACCESS_KEY", "MINIO_SECRET_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert main(["plan", "--dataset", "s3://kfbkt/x"]) == 2
    assert capsys.readouterr().err.startswith("kftrain: error: --dataset: no object-store credentials")


@pytest.mark.parametrize(
    ("path", "stream"),
    [("/dev/stdout", True), ("/dev/fd/1", True), ("/proc/self/fd/1", True), (os.devnull, True)]
    + [("/dev/shm/kftrain-summary.json", False), ("out/summary.json", False)],
)
def test_only_a_stream_or_device_is_appended_to_unchecked(path, stream):
    """`/dev/shm/x` is a file like any other: checked, and replaced whole (was: any path under /dev)."""
    from pipelines.cli import _a_stream

    assert _a_stream(Path(path)) is stream


@pytest.mark.parametrize(
    "argv",
    [
        ["job", "manifest", "--config", "~/c.yaml"],
        ["run", "--local", "--config", "~/c.yaml", "--output-dir", "od"],
        ["plan", "--config", "~/c.yaml"],
    ],
    ids=["job-manifest", "run", "plan"],
)
def test_a_quoted_tilde_in_a_file_flag_is_the_home_folder(tmp_path, monkeypatch, capsys, argv):
    """`--config=~/c.yaml` reaches kftrain with its `~` (the shell expands none after `=`): was
    "cannot read the config file", where every folder flag already read `~` as home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("train:\n  epoch: 3\n")  # its own error shows that it was read
    with contextlib.suppress(SystemExit):
        main(argv)
    err = capsys.readouterr().err
    assert "train.epoch: unknown key" in err and "cannot read" not in err, err


@pytest.mark.parametrize("flag", ["--dataset-uri", "--model-uri"])
def test_an_empty_job_uri_is_refused_not_replaced_by_the_placeholder(capsys, flag):
    """`--dataset-uri "$UNSET"`: was the placeholder s3://kftrain/dataset, exit 0."""
    with pytest.raises(SystemExit) as exit_:
        main(["job", "manifest", flag, ""])
    assert exit_.value.code == 2
    assert f"argument {flag}: must not be empty" in capsys.readouterr().err


def test_the_summary_shows_a_count_as_a_whole_number(tmp_path, monkeypatch, capsys):
    """KFP's metrics hand counts back as floats (was: `test_rows 360.0000`)."""
    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    metrics = {"test_accuracy": 0.975, "test_loss": 1.0, "test_rows": 360.0, "test_tokens": 59648.0}
    summary = {"artifacts": {}, "metrics": metrics, "exported": True, "quality_gate": ""}
    monkeypatch.setattr("pipelines.local_run.run_local", lambda cfg, on_start, **kw: on_start() or summary)
    assert main(["run", "--local", "--output-dir", "out"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split() for line in lines if line.startswith("  test_")] == [
        ["test_accuracy", "0.9750"],
        ["test_loss", "1.0000"],
        ["test_rows", "360"],
        ["test_tokens", "59648"],
    ]


def test_a_local_run_gets_its_relative_paths_pinned_absolute(tmp_path, monkeypatch, capsys):
    """What the run records (its config, the model card) names the same files from any folder (was:
    `data.source: data.csv` recorded as written, and a `--run-id` continuation from another folder
    refused with "no object there")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("a,b,label\n1,2,x\n3,4,y\n" * 20)
    (tmp_path / "c.yaml").write_text("data:\n  source: data.csv\n")
    _no_process_watch(monkeypatch)
    seen = []
    summary = {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": ""}
    monkeypatch.setattr(
        "pipelines.local_run.run_local", lambda cfg, on_start, **kw: seen.append(cfg) or on_start() or summary
    )
    assert main(["run", "--local", "--config", "c.yaml", "--output-dir", "out"]) == 0, capsys.readouterr().err
    assert seen[0].data.source == str(tmp_path / "data.csv")


def test_runs_refuses_a_file_uri_it_would_not_read_as_meant(capsys):
    """(was: `--store file:///tmp/o%20x` looked for a folder named `o%20x`: "no such folder")"""
    assert main(["runs", "--store", "file:///tmp/o%20x"]) == 2
    assert "kftrain: error: --store 'file:///tmp/o%20x' holds a percent-escape" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "prints_its_result"),
    [
        (["runs"], True),
        (["job", "manifest"], True),
        (["plan"], True),
        (["plan", "--output", "p.md"], False),  # a file is its result
        (["compile"], False),
        (["run", "--local"], False),  # a view of the run
        (["example-model"], False),
    ],
)
def test_only_a_command_whose_result_is_what_it_prints_refuses_a_closed_standard_output(argv, prints_its_result):
    from pipelines.cli import _prints_its_result

    assert _prints_its_result(build_parser().parse_args(argv)) is prints_its_result


@pytest.mark.parametrize(("free_mib", "refused"), [(15.5, True), (16, False), (50_000, False)])
def test_a_temporary_folder_too_full_for_a_local_run_to_start_is_named(tmp_path, monkeypatch, free_mib, refused):
    """The disk's free space is played here (a real one: tests/integration/test_cli_bad_inputs.py)."""
    import shutil
    import tempfile

    from trainer.launch.local import temporary_folder_problem

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=int(free_mib * 2**20)))
    problem = temporary_folder_problem()
    assert (
        problem.startswith(f"the temporary folder {tmp_path} has {free_mib:.1f} MiB free") if refused else not problem
    )


@pytest.mark.parametrize("ends", ["finished", "failed", "stopped"])
def test_the_full_log_ends_as_the_terminal_did(tmp_path, monkeypatch, capsys, ends):
    """How the run ended (its error, or its artifacts, metrics and gate) is at the end of its full
    log too (was: on the terminal alone, so a log read later did not say how the run ended)."""
    import signal

    from pipelines.local_run import PipelineFailed, RunStopped
    from trainer.errors import error_line

    summary = {"artifacts": {"model": "out/m"}, "metrics": {"test_accuracy": 0.5}, "exported": False}

    def run(cfg, on_start, **kw):
        on_start()
        print("00:00:00.000 - INFO - Executing task 'train'")
        if ends == "failed":
            print(f"    {error_line('train', RuntimeError('data.source: no object there'))}")
            print("00:00:01.000 - ERROR - Task 'train' finished with status FAILURE")
            raise PipelineFailed("Task train failed")
        if ends == "stopped":
            raise RunStopped(signal.SIGTERM)
        return {**summary, "quality_gate": "test_accuracy 0.5000 is below the minimum 0.9000 (min_accuracy)"}

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    monkeypatch.setattr("pipelines.local_run.run_local", run)
    main(["run", "--local", "--output-dir", "out", "--run-id", "r1"])
    said = capsys.readouterr()
    [log] = (tmp_path / "out" / "runs" / "r1").glob("log-*.txt")
    text = said.out if ends == "finished" else said.err
    first = {
        "finished": "kftrain: run finished.",
        "failed": "kftrain: run r1 did not",
        "stopped": "kftrain: run r1 stopped",
    }
    last = text[text.index(first[ends]) :].strip().splitlines()
    assert len(last) >= 3 if ends != "stopped" else len(last) == 1
    assert log.read_text().strip().splitlines()[-len(last) :] == last
    assert ("Quality gate FAILED" in log.read_text()) is (ends == "finished")


def test_a_full_log_that_cannot_be_opened_again_leaves_the_run_s_last_lines_to_the_terminal(tmp_path, capsys):
    from pipelines.cli import _logged_too

    with _logged_too(tmp_path / "gone" / "log.txt"):
        print("Quality gate passed")
    assert capsys.readouterr().out == "Quality gate passed\n"


@pytest.mark.parametrize("name", ["/proc/self/fd/{fd}", "/dev/fd/{fd}"])
def test_a_summary_sent_to_the_commands_own_output_file_goes_through_it_in_order(tmp_path, monkeypatch, name):
    """`--summary /dev/stdout > out`: written through a second handle, then overwritten by the
    lines printed after it (was: a corrupted summary in `out`)."""
    import sys

    with open(tmp_path / "out", "w", encoding="utf-8") as out:
        monkeypatch.setattr(sys, "stdout", out)
        print("kftrain: run finished. Artifacts:")
        write_output("--summary", name.format(fd=out.fileno()), '{"run_id": "r1"}\n', *SUMMARY_FILE)
        print("summary written to /dev/stdout")
    assert (tmp_path / "out").read_text() == (
        'kftrain: run finished. Artifacts:\n{"run_id": "r1"}\nsummary written to /dev/stdout\n'
    )


def test_a_store_runs_log_whose_last_upload_fails_says_where_the_whole_log_is(tmp_path, monkeypatch, capsys):
    """(was: said nowhere: the store's copy ends before the run's closing lines, the whole log sat
    in the temporary folder unnamed). The store is stood in for: its second upload is refused."""
    import re

    from pipelines import local_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")  # nothing is sent to a store here
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    _no_process_watch(monkeypatch, runs=True)
    uploads = []

    def keep_log(cfg, uri, path, keep_here=False):
        uploads.append(keep_here)
        return uri if keep_here else str(path)  # the first upload goes through, the second is refused

    monkeypatch.setattr(local_run, "keep_log", keep_log)

    def run(cfg, on_start, **kw):
        on_start()
        print("00:00:00.000 - INFO - Executing task 'train'")
        return {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": ""}

    monkeypatch.setattr(local_run, "run_local", run)
    assert main(["run", "--local", "--store", "s3://kfbkt/runs"]) == 0
    err = capsys.readouterr().err
    assert uploads == [True, False]
    [line] = [line for line in err.splitlines() if "last lines could not be uploaded" in line]
    assert re.match(
        r"kftrain: the full log's last lines could not be uploaded to s3://kfbkt/runs/runs/[-\w]+/log-", line
    )
    [left] = tmp_path.glob("kftrain-*.log")
    assert line.endswith(f"the whole log is at {left}, which the run's next start uploads in its place")
    assert "\nQuality gate passed ()\nfull log: s3://kfbkt/runs/runs/" in left.read_text()  # its closing lines


def test_a_stop_signal_while_the_closing_lines_print_stops_nothing(tmp_path, monkeypatch, capsys):
    """Every process of the run has ended: it exits as it ended, its lines and log whole (was:
    SIGTERM's default action cut them short; SIGINT said "interrupted" for a finished run, 130)."""
    import signal

    class SignalledWhileShown(dict):
        def items(self):
            os.kill(os.getpid(), signal.SIGINT)  # as the artifacts are listed
            return super().items()

    summary = {"artifacts": SignalledWhileShown(model="out/m"), "metrics": {}, "exported": True, "quality_gate": "ok"}
    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    monkeypatch.setattr(
        "pipelines.local_run.run_local", lambda cfg, on_start, **kw: on_start() or print("x") or summary
    )
    assert main(["run", "--local", "--output-dir", "out"]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-2:-1] == ["Quality gate passed (ok)"] and said[-1].startswith("full log: ")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as it was before


@pytest.mark.parametrize(
    "name",
    ["ckpt:v2@node1", "s3:cache", "file:out", "\u062f\u0627\u062f\u0647\u200c\u0647\u0627", "out-\udcff\udcfe"],
    ids=["colon-at", "scheme-like", "file-like", "persian-zwnj", "not-utf8"],
)
def test_a_path_flag_takes_any_folder_name_a_file_system_does(tmp_path, monkeypatch, name):
    """A path flag is a path, not a store URI: a colon, an `@`, a script's joiners and bytes that
    are not UTF-8 are a folder's name (were refused as a URI with credentials, as 'invisible', or
    as a control character)."""
    from pipelines.cli import _path

    monkeypatch.chdir(tmp_path)
    assert _path(name) == name


@pytest.mark.parametrize("ends", ["finished", "stopped"])
def test_a_stopped_run_asks_its_store_at_its_end_within_seconds(tmp_path, monkeypatch, ends):
    """What a stopped run still asks of its store (its log's uploads) gives up within
    STOPPED_STORE_BUDGET_S, a hung store too (was: the store's full read timeout and retries,
    over two minutes after Ctrl-C); a run that ends otherwise keeps the store's own policy."""
    import signal

    from pipelines import local_run
    from pipelines.local_run import STOPPED_STORE_BUDGET_S, RunStopped
    from trainer import storage

    def run(cfg, on_start, **kw):
        on_start()
        print("00:00:00.000 - INFO - Executing task 'train'")  # the log opens at its first line
        if ends == "stopped":
            raise RunStopped(signal.SIGTERM)
        return {"artifacts": {}, "metrics": {}, "exported": True, "quality_gate": ""}

    left = []

    def keep_log(cfg, uri, path, keep_here=False):
        left.append(storage._time_left())
        return uri

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch)
    monkeypatch.setattr(local_run, "run_local", run)
    monkeypatch.setattr(local_run, "keep_log", keep_log)
    main(["run", "--local", "--output-dir", "out", "--run-id", "r1"])
    assert len(left) == 2
    if ends == "stopped":
        assert all(t is not None and 0 < t <= STOPPED_STORE_BUDGET_S for t in left), left
    else:
        assert left == [None, None]


def test_a_continuation_takes_up_the_logs_its_earlier_starts_left_here_even_where_its_folder_is_gone(
    tmp_path, monkeypatch, capsys
):
    """`--run-id` of a run whose folder the store lost (its bucket deleted and made again) still
    uploads the logs its earlier starts left in this machine's temporary folder (was: only for a
    run the store still held, so they stayed here for good); a new run looks for none."""
    from pipelines import local_run

    asked = []
    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    monkeypatch.setattr(local_run, "keep_left_logs", lambda cfg, run_id, root: asked.append(run_id) or ["s3://b/log"])
    assert main(["run", "--local", "--output-dir", "out", "--run-id", "gone"]) == 0
    assert asked == ["gone"]
    assert "an earlier start of run gone left on this machine is now at s3://b/log" in capsys.readouterr().err
    assert main(["run", "--local", "--output-dir", "out"]) == 0
    assert asked == ["gone"]


@pytest.mark.parametrize(
    ("own_steps", "finished", "config"),
    [(True, False, True), (False, False, True), (True, True, True), (True, False, False)],
    ids=["own-checkpoint", "none-yet", "finished", "no-config"],
)
def test_resume_from_on_a_continuation_with_checkpoints_of_its_own_is_said_to_be_unread(
    tmp_path, monkeypatch, capsys, own_steps, finished, config
):
    """`--run-id` of a run with a checkpoint of its own goes on from that; a `checkpoint.resume_from`
    in the config given is not read, and says so (was: dropped without a word). Nothing said
    before the run has one (resume_from is what it starts from), for a finished run (nothing goes
    on), or without `--config` (the run's own start record's resume_from: not news)."""
    import torch

    from trainer.checkpoint import CheckpointManager
    from trainer.config import load_config, to_dict
    from trainer.storage import LocalStore

    monkeypatch.chdir(tmp_path)
    _no_process_watch(monkeypatch, runs=True)
    run = tmp_path / "out" / "runs" / "r1"
    ckpt = CheckpointManager(LocalStore(), str(run / "checkpoints"), owner="r1")
    ckpt.claim(resume=True)
    if own_steps:
        ckpt.save(38, {"model": {"w": torch.zeros(2)}}, record={}, blocking=True)
    if finished:
        (run / "run.json").write_text(json.dumps({"status": "finished"}))
    (tmp_path / "other").mkdir()
    (tmp_path / "c.yaml").write_text(f"checkpoint:\n  resume_from: {tmp_path / 'other'}\n")
    # The run started with that config (its start record's, which a continuation without --config takes).
    started = to_dict(load_config(overrides={"checkpoint.resume_from": str(tmp_path / "other")}))
    (run / "started.json").write_text(json.dumps({"checkpoint_uri": "", "run_id": "r1", "config": started}))
    given = ["--config", "c.yaml"] if config else []
    main(["run", "--local", "--output-dir", "out", "--run-id", "r1", *given])
    said = [line for line in capsys.readouterr().err.splitlines() if "is not read" in line]
    expected = (
        f"kftrain: note: checkpoint.resume_from '{tmp_path / 'other'}' is not read: run r1 goes on from its own "
        "newest checkpoint, step 38 (resume_from starts a run only)"
    )
    assert said == ([expected] if own_steps and not finished and config else [])
