import json
import re

import pytest

from trainer.config import Config, ConfigError, config_from_json, config_to_json, load_config, parse_config


def test_defaults_are_valid_and_round_trip_through_json():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert config_from_json(config_to_json(cfg)) == cfg


def test_yaml_file_maps_onto_the_tree(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("job:\n  replicas: 4\ntrain:\n  batch_size: 128\n  learning_rate: 1e-3\n")
    cfg = load_config(path)
    assert cfg.job.replicas == 4
    assert cfg.train.batch_size == 128
    assert cfg.train.learning_rate == pytest.approx(1e-3)
    for text, value in ((".5e-3", 5e-4), ("1.e-3", 1e-3), ("2E+0", 2.0)):  # YAML 1.1 reads these as text too
        assert load_config(overrides={"train.learning_rate": text}).train.learning_rate == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trian:\n  epochs: 3\n", "trian: unknown key; did you mean train? (valid keys in the top level:"),
        # What an unknown key was likely meant as: a key of its section spelt alike, or the same
        # key of another section (was: only the list of the section's keys).
        ("Train:\n  epochs: 3\n", "Train: unknown key; did you mean train?"),
        ("train:\n  learing_rate: 3\n", "train.learing_rate: unknown key; did you mean learning_rate?"),
        ("train:\n  'epochs ': 3\n", "train.epochs : unknown key; did you mean epochs (no spaces around it)?"),
        ("learning_rate: 0.1\n", "learning_rate: unknown key; learning_rate is a key of train: write it there"),
        ("kubernetes:\n  replicas: 2\n", "kubernetes.replicas: unknown key; replicas is a key of job: write it"),
        ("job:\n  min_replicas: 2\n", "min_replicas is a key of kubernetes.elastic: write it there"),
        ("train:\n  zzz: 1\n", "train.zzz: unknown key (valid keys in train:"),
        ("data:\n  batchsize: 3\n", "data.batchsize: unknown key; did you mean train.batch_size?"),
        # Cut short: its own section's first (was: `kubernetes.gpus` told plan.gpu, a GPU type's name).
        ("kubernetes:\n  gpus: 1\n", "kubernetes.gpus: unknown key; did you mean gpus_per_node?"),
        ("checkpoint:\n  keep: 1\n", "checkpoint.keep: unknown key; did you mean keep_best or keep_last?"),
        ("data:\n  eval: 1\n", "did you mean eval_generations or eval_items or eval_new_tokens or eval_prompts?"),
        # Not cut at a word's end: another section's key spelt alike wins (not max_restarts_by_cause, a mapping).
        (
            "kubernetes:\n  max_restart: 3\n",
            "kubernetes.max_restart: unknown key; did you mean kubernetes.elastic.max_",
        ),
        ("train:\n  dropuot: 0.1\n", "train.dropuot: unknown key; did you mean model.dropout or lora.dropout?"),
        ("train.epochs: 3\n", "train.epochs: unknown key; a dotted key is not nested in YAML: write train: and under"),
        ("train:\n  lr.x: 3\n", "train.lr.x: unknown key (valid keys in train:"),
        ("kubernetes:\n  extra_env: [{name: A}]\n", "kubernetes.extra_env[0]: must be a mapping with `name` and"),
        ("kubernetes:\n  env: {A: x}\n  extra_env: [{name: A, value: y}]\n", "'A' is also set by kubernetes.env"),
        # The entry's own field named, and the name shown (was: blamed on kubernetes.env.A, or the name hidden).
        ("kubernetes:\n  extra_env: [{name: A, value: 8}]\n", "kubernetes.extra_env[0].value: must be text"),
        (
            "kubernetes:\n  extra_env: [{name: A, value: x}, {name: A, value: y}]\n",
            "kubernetes.extra_env[1].name: 'A' is also set earlier in kubernetes.extra_env",
        ),
        ("kubernetes:\n  extra_env: [{name: DB_PASSWORD, value: y}]\n", "kubernetes.extra_env.DB_PASSWORD: its name"),
        (
            "kubernetes:\n  extra_env: [{name: X, valueFrom: {secretKeyRef: {name: Bad_Name, key: k}}}]\n",
            "kubernetes.extra_env[0].valueFrom.secretKeyRef.name: 'Bad_Name' is not a Secret's name",
        ),
        ("kubernetes:\n  extra_env: [{name: WORLD_SIZE, value: '2'}]\n", "kubernetes.extra_env[0]: WORLD_SIZE is set"),
        # An unknown key in an entry (was: blamed on kubernetes.store_secret_keys or kubernetes.env.<name>).
        (
            "kubernetes:\n  extra_env: [{name: X, valueFrom: {configMapKeyRef: {name: c, key: k, bogus: 1}}}]\n",
            "kubernetes.extra_env[0].valueFrom.configMapKeyRef: Additional properties are not allowed ('bogus'",
        ),
        ("kubernetes:\n  extra_env: [{name: X, value: x, extra: 1}]\n", "kubernetes.extra_env[0]: Additional prop"),
        ("train:\n  epoch: 3\n", "train.epoch: unknown key"),
        ("train:\n  epochs: three\n", "train.epochs: must be an integer, got 'three'"),
        ("train:\n  epochs: 0\n", "train.epochs: must be positive, got 0"),
        # A model no one could build: was accepted, and `kftrain plan` ran for hours.
        ("model:\n  n_layer: 100000\n", "model.n_layer: must be 1 to 1,024 (the largest models have about 130"),
        ("model:\n  n_embd: 0\n", "model.n_embd: must be 1 to 65,536"),
        ("model:\n  block_size: 2097152\n", "model.block_size: must be 1 to 1,048,576"),
        ("model:\n  hidden_sizes: [10000000]\n", "model.hidden_sizes: must be a non-empty list of at most 1,024"),
        ("train:\n  learning_rate: fast\n", "train.learning_rate: must be a number"),
        # Values torch takes in float32, refused before any step (was: "value cannot be converted
        # to type float without overflow" from AdamW, mid-run), and a decay that zeroes the weights.
        ("train:\n  learning_rate: 1.0e38\n", "train.learning_rate: must be positive and at most 1e37 (AdamW"),
        ("train:\n  grad_clip_norm: 1.0e39\n", "train.grad_clip_norm: must be >= 0 and at most 3.4e38 (a float32"),
        ("train:\n  weight_decay: 1.0e39\n", "train.weight_decay: must be >= 0 and at most 3.4e38"),
        ("lora:\n  alpha: 1.0e39\n", "lora.alpha: must be positive and at most 3.4e38"),
        (
            "train:\n  learning_rate: 0.5\n  weight_decay: 2\n",
            "train.weight_decay: times train.learning_rate (0.5) must be below 1: AdamW multiplies every weight by",
        ),
        (
            "kubernetes:\n  labels: {day: 2024-01-01}\n",
            "kubernetes.labels.day: must be a string (unquoted, YAML and JSON read it as a date",
        ),
        # Text Python's float() would take: only YAML's exponent notation is read as a number.
        ("train:\n  learning_rate: 010\n", "train.learning_rate: must be a number, got '010'"),
        ("train:\n  learning_rate: 1_0\n", "train.learning_rate: must be a number, got '1_0'"),
        ("train:\n  learning_rate: '  7  '\n", "train.learning_rate: must be a number, got '  7  '"),
        ("train:\n  learning_rate: 'nan'\n", "train.learning_rate: must be a number, got 'nan'"),
        ("job:\n  replicas: true\n", "job.replicas: must be an integer, got True"),
        # Found by probes: each named what was wrong badly, or was accepted and failed on the cluster.
        ("job:\n  replicas: 4294967296\n", "job.replicas: must be from 1 (the Master) to 2147483647"),
        ("job:\n  nproc_per_node: 4294967296\n", "job.nproc_per_node: must be from 1 to 2147483647"),
        ("kubernetes:\n  priority_class:\n", "priority_class: must be a string (YAML reads an empty value as null"),
        (
            "kubernetes:\n  node_selector: {kubernetes: {io/arch: amd64}}\n",
            "a key with dots ('kubernetes.io/arch') is one key: in YAML write `kubernetes.io/arch: amd64` under "
            "`node_selector:`, or with --set give the whole mapping, which replaces the config's: "
            "--set 'kubernetes.node_selector={kubernetes.io/arch: amd64}'",
        ),
        ("kubernetes:\n  queue: Team_A\n", "kubernetes.queue: 'Team_A' is not a Kueue LocalQueue's name"),
        ("store:\n  uri: 's3://b/x '\n", "starts or ends with whitespace: remove it"),
        ("model:\n  hidden_sizes: 64\n", "model.hidden_sizes: must be a list"),
        ("data:\n  test_fraction: 0.7\n", "data.test_fraction: must be above 0 and below 0.5"),
        ("data:\n  val_fraction: 0\n", "data.val_fraction: must be above 0 and below 0.5 (each split holds some rows)"),
        ("data:\n  val_fraction: 0.5\n", "data.val_fraction: must be above 0 and below 0.5"),
        ("store:\n  uri: gs://bucket/x\n", "store.uri: unsupported storage URI scheme 'gs'"),
        ("store:\n  endpoint: minio:9000\n", "store.endpoint: 'minio:9000' must be a URL"),
        ("store:\n  region: not a region\n", "store.region: 'not a region' is not a region name"),
        ("store:\n  endpoint: http://h:9000/bucket\n", "store.endpoint: 'http://h:9000/bucket' has a path"),
        ("job:\n  replicas: 3\n", "train.batch_size: must divide by the world size 3"),
        ("data:\n  partitions: 3\n", "data.partitions: is not a multiple of the 2 readers"),
        (
            "data:\n  partitions: 4\ntrain:\n  batch_size: 6\n",
            "micro-batch of 3 items (train.batch_size / (world size x train.grad_accum_steps)) does not divide by: "
            "2, 6 fit at this world size, or 0 (one per reader), got 4",
        ),
        (
            "kubernetes:\n  elastic: {enabled: true, min_replicas: 2, max_replicas: 3}\n"
            "train:\n  batch_size: 60\ndata:\n  partitions: 4\n",
            "data.partitions: is not a multiple of the 3 readers",
        ),
        ("job:\n  nccl_debug: LOUD\n", "job.nccl_debug: must be one of ('', 'VERSION', 'WARN', 'INFO', 'ABORT'"),
        # Was: cut to the timeout on the cluster, printed as given by `job manifest` and the no-owner warning.
        (
            "kubernetes:\n  active_deadline_seconds: 5000\n",
            "kubernetes.active_deadline_seconds: must be at most job.timeout_seconds (3600)",
        ),
        # Fields that pass alone and conflict together (each was accepted, then silently without effect).
        ("train:\n  max_steps: 5\n  warmup_steps: 5\n", "train.warmup_steps: must be below train.max_steps (5)"),
        (
            "checkpoint:\n  at_epoch_end: false\n  keep_best: val_accuracy\n",
            "checkpoint.keep_best: ranks the checkpoints taken at epoch ends",
        ),
        ("task: causal_lm\ndata:\n  format: jsonl\n", "data.format: reads JSON Lines records, and the built-in"),
        # An elastic range no batch fits: one short line (was: minutes of CPU, or 12,000 characters).
        (
            "kubernetes:\n  elastic: {enabled: true, min_replicas: 2, max_replicas: 2147483647}\n",
            "(2..2147483647 ranks), but not by 3, 5, 6, 7, 9, ...: no batch size divides by them all: narrow",
        ),
        (
            "kubernetes:\n  elastic: {enabled: true, min_replicas: 2, max_replicas: 4}\n",
            "(2, 3, 4 ranks), but not by 3: use a multiple of 12, got 64",
        ),
        (
            "kubernetes:\n  elastic: {enabled: true, max_replicas: 2147483648}\n",
            "kubernetes.elastic.max_replicas: must be at most 2147483647",
        ),
        ("data:\n  eval_prompts: hello\n", "data.eval_prompts: must be a list, got 'hello'"),
        ("data:\n  eval_prompts: ['hi', ' ']\n", "data.eval_prompts: must list non-empty prompts"),
        ("data:\n  eval_generations: 17\n", "data.eval_generations: must be between 0 and 16, got 17"),
        ("data:\n  eval_new_tokens: 0\n", "data.eval_new_tokens: must be between 1 and 512, got 0"),
        (
            "kubernetes:\n  min_available: 3\n",
            "kubernetes.min_available: must be at most the job's pods (job.replicas: 2)",
        ),
        (
            "job:\n  kind: trainjob\nkubernetes:\n  volumes: [{name: d, emptyDir: {}}]\n"
            "  volume_mounts: [{name: d, mountPath: /a, subPath: a}, {name: d, mountPath: /b, subPath: b}]\n",
            "kubernetes.volume_mounts[1].name: mounts a volume a second time, which a TrainJob's runtime patch cannot",
        ),
        ("job:\n  kind: podjob\n", "job.kind: must be one of ('pytorchjob', 'trainjob', 'auto'), got 'podjob'"),
        ("export:\n  max_shard_bytes: 0\n", "export.max_shard_bytes: must be positive, got 0"),
        (
            "kubernetes:\n  gpu_memory_gb: -1\n",
            "kubernetes.gpu_memory_gb: must be from 0 (unknown, no memory check) to 100000 GiB",
        ),
        ("kubernetes:\n  gpu_memory_gb: .nan\n", "kubernetes.gpu_memory_gb: must be a finite number"),
        (
            "kubernetes:\n  hf_token_secret: hf\n  store_secret_keys: {accesskey: HF_TOKEN}\n",
            "kubernetes.store_secret_keys: must not fill HF_TOKEN, which kubernetes.hf_token_secret gives",
        ),
        ("kubernetes:\n  env: {HF_TOKEN: hf_abc}\n", "kubernetes.hf_token_secret gives HF_TOKEN"),
        ("train:\n  straggler_factor: 1.0\n", "train.straggler_factor: must be 0 (off) or above 1"),
        ("train:\n  divergence_check_steps: -1\n", "train.divergence_check_steps: must be >= 0"),
        ("checkpoint:\n  keep_best: val_bleu\n", "checkpoint.keep_best: the direction of 'val_bleu' is unknown"),
        ("checkpoint:\n  keep_best: best:val_loss\n", "checkpoint.keep_best: the prefix must be `min:` or `max:`"),
        ("checkpoint:\n  keep_best: 'min: '\n", "checkpoint.keep_best: name a validation metric"),
        ("checkpoint:\n  export_best: true\n", "checkpoint.export_best: needs checkpoint.keep_best"),
        ("checkpoint:\n  keep_best: val_loss\n  enabled: false\n", "checkpoint.keep_best: needs checkpoint.enabled"),
        ("train:\n  seed: 1733100000000000000\n", "train.seed: must be from 0 to 4294967295"),  # a timestamp in ns
        ("data:\n  seed: 4294967296\n", "data.seed: must be from 0 to 4294967295"),
        ("train:\n  seed: -1\n", "train.seed: must be from 0 to 4294967295"),
        (
            "train:\n  num_workers: 1000\n",
            "train.num_workers: must be from 0 to 128 worker processes per rank, got 1000",
        ),
        # Counts that fork processes or size memory have an upper bound (was: `num_proc` forked any
        # number, a huge `bucket_cap_mb` killed every rank in DDP's reducer, a huge `lora.rank` was
        # allocated before it could be compared with the layers).
        ("data:\n  num_proc: 10000\n", "data.num_proc: must be from 1 to 1024 data-prep processes, got 10000"),
        ("train:\n  bucket_cap_mb: 8796093022208\n", "train.bucket_cap_mb: must be from 1 to 65536 MiB"),
        ("lora:\n  rank: 1000000000\n", "lora.rank: must be from 1 to 65536"),
        ("kubernetes:\n  gpu_memory_gb: 1.0e+9\n", "kubernetes.gpu_memory_gb: must be from 0"),
        # A float too small to hold exactly, in any float field (was: 1e-320 GiB overflowed a division).
        ("kubernetes:\n  gpu_memory_gb: 1.0e-320\n", "line 2: 1.0e-320 is too small for a float to hold exactly"),
        ("train:\n  learning_rate: 1e-310\n", "line 2: 1e-310 is too small for a float to hold exactly"),
        ("checkpoint:\n  keep_best: val_loss\n", "checkpoint.keep_best: task 'classification' reports no metric"),
        (
            "task: causal_lm\ncheckpoint:\n  keep_best: max:val_accuracy\n",
            "name one of train_loss, val_loss, val_perplexity",
        ),
        (
            "checkpoint:\n  resume_from: 12345\n",
            'must be a string (unquoted, YAML and JSON read it as a number: write "12345")',
        ),
        (
            "kubernetes:\n  namespace: true\n",
            'must be a string (unquoted, YAML and JSON read it as a boolean: write "true")',
        ),
        ("checkpoint:\n  keep_best: {max: }\n", "must be a string (YAML reads `max:` as a mapping: quote it)"),
        ("data:\n  label_column: ''\n", "data.label_column: must not be empty"),
        ("- a\n- b\n", "must hold a mapping"),
        # A finished job deleted before the launcher's next status check fails the step, a success included.
        ("kubernetes:\n  ttl_seconds_after_finished: 0\n", "ttl_seconds_after_finished: must be >= 60 (the launcher"),
        ("kubernetes:\n  ttl_seconds_after_finished: 59\n", "poll_seconds=5s; a finished job the operator deletes"),
        (
            "kubernetes:\n  poll_seconds: 30\n  ttl_seconds_after_finished: 60\n",
            "must be >= 90, or kubernetes.poll_seconds lower",
        ),
        ("train: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_field(text, message):
    with pytest.raises(ConfigError, match=None) as info:
        parse_config(text)
    assert message in str(info.value)


def test_the_ttl_bound_holds_only_where_the_job_has_a_ttl():
    """A TrainJob has no ttlSecondsAfterFinished (the field must stay at its default there): a long
    poll_seconds is no reason to refuse it (was: no value passed for a TrainJob polled every 8 h)."""
    slow = {"kubernetes.poll_seconds": 40000}
    parse_config("", {**slow, "job.kind": "trainjob"})
    for kind in ("pytorchjob", "auto"):
        with pytest.raises(ConfigError, match="ttl_seconds_after_finished: must be >= 120000, or kubernetes.poll"):
            parse_config("", {**slow, "job.kind": kind})


def test_nccl_debug_takes_nccl_levels_in_any_case():
    assert parse_config("job:\n  nccl_debug: info\n").job.nccl_debug == "info"
    assert parse_config("").job.nccl_debug == ""


def test_overrides_win_over_the_text():
    cfg = parse_config("job:\n  replicas: 4\n", {"job.replicas": 2, "train.epochs": 1})
    assert (cfg.job.replicas, cfg.train.epochs) == (2, 1)


SECTIONS_TEXT = (
    "job: {replicas: 2, nproc_per_node: 8}\n"
    "train: {epochs: 7, batch_size: 192}\n"
    "kubernetes:\n  queue: a\n  gpus_per_node: 8\n  node_selector: {pool: gpu}\n"
    "  elastic: {enabled: true, min_replicas: 2, max_replicas: 2}\n"
)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # A mapping for a section sets the fields it names; the file's others stay (was: all back at defaults).
        ({"kubernetes": {"queue": "b"}}, {"kubernetes.queue": "b", "kubernetes.gpus_per_node": 8}),
        ({"train": {"epochs": 2}}, {"train.epochs": 2, "train.batch_size": 192}),
        # Nested sections too, at any depth the override starts from.
        ({"kubernetes": {"elastic": {"max_replicas": 4}}}, {"kubernetes.elastic.enabled": True}),
        (
            {"kubernetes.elastic": {"max_replicas": 4}},
            {"kubernetes.elastic.max_replicas": 4, "kubernetes.elastic.enabled": True},
        ),
        # A field whose value is a mapping is replaced, as any value is.
        ({"kubernetes.node_selector": {"zone": "b"}}, {"kubernetes.node_selector": {"zone": "b"}}),
        ({"kubernetes": {"node_selector": {"zone": "b"}}}, {"kubernetes.node_selector": {"zone": "b"}}),
    ],
)
def test_a_mapping_given_for_a_section_merges_into_the_configs(overrides, expected):
    cfg = parse_config(SECTIONS_TEXT, overrides)
    for dotted, value in expected.items():
        node = cfg
        for name in dotted.split("."):
            node = getattr(node, name)
        assert node == value, dotted


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kubernetes": {"nope": 1}}, "kubernetes.nope: unknown key"),
        ({"kubernetes": {"elastic": {"nope": 1}}}, "kubernetes.elastic.nope: unknown key"),
        ({"kubernetes": 3}, "kubernetes: must be a mapping, got 3"),
    ],
)
def test_a_section_override_is_checked_as_the_file_is(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(SECTIONS_TEXT, overrides)


@pytest.mark.parametrize("section", ["labels", "annotations"])
@pytest.mark.parametrize("value", ["Bearer 4f9a8b7c6d5e4f3a2b1c", "AKIAIOSFODNN7EXAMPLE"])
def test_a_credential_in_a_label_or_annotation_is_refused_without_showing_it(section, value):
    with pytest.raises(ConfigError) as raised:
        parse_config(f"kubernetes:\n  {section}:\n    note: {value}\n")
    assert str(raised.value).startswith(f"kubernetes.{section}.note: its value looks like a credential")
    assert value not in str(raised.value)
    # Names alone are not judged: Vault's injector annotations name secrets by design.
    assert parse_config("kubernetes:\n  annotations:\n    vault.hashicorp.com/agent-inject-secret-db: kv/db\n")


#: Tokens a user may paste where a name goes: a random one, a known format, an AWS secret key.
TOKENS = ["Ab3xY9kLm2Qw8ErT5yUi7OpAs4DfGh6JkL", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "ghp_" + "a1B2" * 9]


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize(
    "text",
    [
        # Keys that reach the job object (were: accepted, only their values were checked).
        "kubernetes:\n  env:\n    {t}: '1'\n",
        "kubernetes:\n  labels:\n    {t}: x\n",
        "kubernetes:\n  annotations:\n    {t}: x\n",
        "kubernetes:\n  node_selector:\n    {t}: x\n",
        "kubernetes:\n  node_selector:\n    disk: {t}\n",
        # Keys an error names (were: printed in the field path).
        "kubernetes:\n  max_restarts_by_cause:\n    {t}: 1\n",
        "{t}: 1\n",
        "train:\n  {t}: 1\n",
        "train.{t}: 1\n",
        "train.x.{t}: 1\n",
    ],
)
def test_a_token_written_as_a_key_is_refused_and_never_shown(text, token):
    with pytest.raises(ConfigError) as raised:
        parse_config(text.format(t=token))
    message = str(raised.value)
    assert token not in message and ("***" in message or "looks like a credential" in message), message


@pytest.mark.parametrize(
    ("section", "value", "where"),
    [
        # The pod spec's pass-through fields reach the job object as written (were: accepted).
        ("tolerations", [{"key": "a", "operator": "Equal", "value": "{t}", "effect": "NoSchedule"}], "[0].value"),
        ("tolerations", [{"key": "{t}", "operator": "Exists"}], "[0].key"),
        (
            "affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["{t}"]}]}
                        ]
                    }
                }
            },
            ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
            ".matchExpressions[0].values[0]",
        ),
        (
            "volumes",
            [{"name": "v", "nfs": {"server": "u:hunter2probe@nfs.example.com", "path": "/x"}}],
            "[0].nfs.server",
        ),
        # A CSI driver's attributes are judged by name too (its secrets go in nodePublishSecretRef).
        (
            "volumes",
            [{"name": "v", "csi": {"driver": "x.csi.io", "volumeAttributes": {"password": "hunter2"}}}],
            "[0].csi.volumeAttributes.password",
        ),
        ("labels", {"{t}": "x"}, ".***"),
    ],
)
def test_a_credential_anywhere_in_the_job_objects_fields_is_refused_naming_where(section, value, where):
    token = TOKENS[0]
    text = json.dumps({"kubernetes": {section: value}}).replace("{t}", token)
    with pytest.raises(ConfigError) as raised:
        parse_config(text)
    message = str(raised.value)
    assert message.startswith(f"kubernetes.{section}{where}: its "), message
    assert token not in message and "hunter2" not in message and "looks like a credential" in message


@pytest.mark.parametrize(
    "overrides",
    [
        {"data.label_column": "{t}"},
        {"data.text_field": "{t}"},
        {"data.source_version": "{t}"},
        {"lora.target_modules": ["q_proj", "{t}"]},
        {"checkpoint.owner": "{t}"},
        {"plan.gpu": "{t}"},
        # Fields whose own checks showed the value before this one ran (a review).
        {"data.tokenizer": "{t}"},
        {"checkpoint.keep_best": "{t}"},
    ],
)
def test_a_credential_in_any_field_is_refused_naming_the_field(overrides):
    """Free-text fields took a pasted token into the run's records and the job object (a probe)."""
    token = TOKENS[1]
    filled = {
        k: [x.replace("{t}", token) for x in v] if isinstance(v, list) else v.replace("{t}", token)
        for k, v in overrides.items()
    }
    with pytest.raises(ConfigError) as raised:
        load_config(overrides=filled)
    message = str(raised.value)
    assert message.startswith(f"{next(iter(overrides))}") and "looks like a credential" in message, message
    assert token not in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # A URL with a password in a field that takes no URL (a review: left to a check it has not).
        ("data.label_column", "https://bob:hunter2probe@example.com/x"),
        ("checkpoint.owner", "https://bob:hunter2probe@example.com/x"),
        # Refusals of these fields' own showed the value (a review).
        ("checkpoint.keep_best", "https://bob:hunter2probe@h/x"),
        ("checkpoint.keep_best", "tok:ghp_" + "a1B2" * 9),
        ("checkpoint.resume_from", "host=db password = hunter2probe"),
        ("store.endpoint", "http://h:9000/;password=hunter2probe"),
    ],
)
def test_a_password_anywhere_is_refused_and_never_shown(field, value):
    with pytest.raises(ConfigError) as raised:
        load_config(overrides={field: value})
    message = str(raised.value)
    assert message.startswith(field) and "hunter2probe" not in message and "ghp_" not in message, message


def test_ordinary_values_are_no_credential():
    """A review found these refused by the config-wide check: a column name of an AWS key's
    length, a name starting like a GitHub or OpenAI token, prompts of code and JSON."""
    cfg = load_config(
        overrides={
            "data.label_column": "AvgTransactionAmountLast90DaysNormalized",
            "data.text_field": "gho_customer_lifetime_value_total",
            "checkpoint.owner": "sk-hynix-memory-ml-platform",
            "data.eval_prompts": ["pwd = os.getcwd()", 'cfg = {"api_key": "abc"}', "email:bob@example.com"],
        }
    )
    assert cfg.checkpoint.owner == "sk-hynix-memory-ml-platform"


def test_the_job_objects_fields_keep_what_is_no_credential():
    """A Secret's name, a secret volume, a CSI driver's secret reference are names, not secrets."""
    volumes = [
        {"name": "creds", "secret": {"secretName": "gcp-key"}},
        {
            "name": "c",
            "csi": {"driver": "x.csi.io", "nodePublishSecretRef": {"name": "s"}, "volumeAttributes": {"bucket": "b"}},
        },
    ]
    cfg = parse_config(
        json.dumps({"kubernetes": {"volumes": volumes, "tolerations": [{"key": "secret-zone", "operator": "Exists"}]}})
    )
    assert cfg.kubernetes.volumes == volumes


@pytest.mark.parametrize(
    ("key", "message"),
    [
        # Was: the job queued in kubernetes.queue's LocalQueue, its pod templates labelled with another.
        ("kueue.x-k8s.io/queue-name", "is set from kubernetes.queue, on the job where Kueue reads it"),
        ("app.kubernetes.io/managed-by", "marks the jobs kftrain made"),
        ("training.kubeflow.org/replica-type", "is the operator's"),
        ("trainer.kubeflow.org/trainjob-name", "is the operator's"),
        ("jobset.sigs.k8s.io/jobset-name", "is the operator's"),
    ],
)
def test_a_label_kftrain_or_an_operator_sets_is_refused_naming_what_sets_it(key, message):
    with pytest.raises(ConfigError, match=re.escape(f"kubernetes.labels: key {key!r} {message}")):
        parse_config(f"kubernetes:\n  queue: q1\n  labels:\n    {key}: q2\n")
    assert parse_config(
        "kubernetes:\n  labels:\n    kueue.x-k8s.io/priority-class: high\n"
    )  # Kueue's other labels are the user's


@pytest.mark.parametrize("key", ["kftrain.io/restarts", "kftrain.io/deadline", "kftrain.io/progress", "KFTRAIN.io/x"])
def test_an_annotation_kftrain_keeps_its_state_in_is_refused(key):
    """A retried launcher read a user's `kftrain.io/restarts` as its own re-creations (was: accepted)."""
    from trainer.launch.kubernetes import DEADLINE_ANNOTATION, RESTARTS_ANNOTATION
    from trainer.progress import PROGRESS_ANNOTATION

    assert all(k.startswith("kftrain.io/") for k in (DEADLINE_ANNOTATION, RESTARTS_ANNOTATION, PROGRESS_ANNOTATION))
    with pytest.raises(ConfigError, match=re.escape(f"kubernetes.annotations: key {key!r} is kftrain's own")):
        parse_config(f"kubernetes:\n  annotations:\n    {key}: '{{}}'\n")
    assert parse_config("kubernetes:\n  annotations:\n    team.example.com/owner: ml\n")


def test_every_config_field_is_documented_in_the_configuration_reference():
    """docs/configuration.md lists every field (it is the user's manual; tests/unit/test_config_docs.py
    holds it to the docstrings exactly)."""
    import dataclasses
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()

    def fields(cls, prefix):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type) or (isinstance(f.type, str) and f.type.endswith("Config")):
                sub = type(getattr(cls(), f.name))
                yield from fields(sub, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}"

    missing = [name for name in fields(Config, "") if f"`{name}`" not in readme]
    assert not missing


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", None),
        ("val_loss", ("min", "val_loss")),
        ("val_perplexity", ("min", "val_perplexity")),
        ("val_accuracy", ("max", "val_accuracy")),
        ("max:val_bleu", ("max", "val_bleu")),
        ("min:val_accuracy", ("min", "val_accuracy")),
    ],
)
def test_keep_best_takes_a_direction_prefix_or_knows_it_from_the_name(spec, expected):
    from trainer.config import best_metric

    assert best_metric(spec) == expected


# -- every field of a kind at once: numbers that would overflow far away, values never shown ------


def leaf_fields(cls: type = Config, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted path, annotation) of every scalar field of the config tree."""
    import dataclasses
    import typing

    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += leaf_fields(tp, f"{prefix}{f.name}.")
        elif tp in (int, float):
            out.append((f"{prefix}{f.name}", tp))
    return out


NUMBER_FIELDS = leaf_fields()


def override_error(dotted: str, value) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config("", {dotted: value})
    return str(info.value)


@pytest.mark.parametrize(("dotted", "tp"), NUMBER_FIELDS, ids=[d for d, _ in NUMBER_FIELDS])
def test_every_number_field_refuses_what_would_overflow_later_naming_itself(dotted, tp):
    """Past int64 (Kubernetes, torch), past a float (10**400), or past a year of seconds (datetime,
    sleep and the operators' deadlines overflow) is refused at load, naming the field, not met
    as an OverflowError traceback at the first use."""
    message = override_error(dotted, 10**400)
    assert message.startswith(f"{dotted}: must "), message
    assert len(message) < 300  # the 400 digits are not echoed whole
    if tp is int:
        assert "must fit in an int64" in override_error(dotted, 2**63)
    if dotted.endswith("_seconds"):
        assert "must be at most 31622400 seconds (366 days)" in override_error(dotted, 31622401)


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (f"kubernetes:\n  extra_env: [{{Name: AWS_SECRET_ACCESS_KEY, value: {SECRET}}}]\n", "kubernetes.extra_env[0]"),
        (f"kubernetes:\n  extra_env: [{{name: TOKEN, valeu: {SECRET}}}]\n", "kubernetes.extra_env[0]"),
        (f"kubernetes:\n  extra_env: [{{name: '', value: {SECRET}}}]\n", "kubernetes.extra_env[0]"),
        (f"kubernetes:\n  extra_env: {SECRET}\n", "kubernetes.extra_env"),
        (f"kubernetes:\n  extra_env: [{SECRET}]\n", "kubernetes.extra_env[0]"),
        (f"kubernetes:\n  env: [AWS_SECRET_ACCESS_KEY={SECRET}]\n", "kubernetes.env"),
        (f"kubernetes:\n  env: AWS_SECRET_ACCESS_KEY={SECRET}\n", "kubernetes.env"),
        (f"kubernetes:\n  env: {{DB_PASSWORD: {{value: {SECRET}}}}}\n", "kubernetes.env.DB_PASSWORD"),
        ("kubernetes:\n  env: {DB_PASSWORD: 827364519}\n", "kubernetes.env.DB_PASSWORD"),
    ],
)
def test_a_malformed_environment_entry_is_named_without_its_value(text, field):
    """Values under kubernetes.env and kubernetes.extra_env may be credentials: an error about
    their shape names the entry and what it should be, never the value (it reaches logs and UIs)."""
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    message = str(info.value)
    assert message.startswith(f"{field}: "), message
    assert SECRET not in message and "827364519" not in message, message


def test_an_override_through_a_non_mapping_names_the_whole_path():
    with pytest.raises(ConfigError, match=r"^train: must be a mapping, got 3$"):
        parse_config("train: 3", {"train.epochs": 2})
    with pytest.raises(ConfigError, match=r"^train\.lr\.x: must be a mapping"):
        parse_config("train:\n  lr: {x: 3}\n", {"train.lr.x.y": 2})


@pytest.mark.parametrize(
    "field", ["store.uri", "checkpoint.uri", "checkpoint.resume_from", "data.source", "model.init_from"]
)
@pytest.mark.parametrize(
    "value", ["s3://kftrain-runs/runs ", " /tmp/runs", "/tmp/runs\t", "\ns3://kftrain-runs/x", "hf://org/name@main "]
)
def test_a_uri_with_whitespace_around_it_is_refused_naming_the_field(field, value):
    # A space pasted along (the KFP UI's text box) put a whole run under 'runs /', or in a
    # relative folder named ' ', while the run succeeded.
    with pytest.raises(ConfigError, match=f"^{re.escape(field)}: .* starts or ends with whitespace: remove it$"):
        load_config(overrides={field: value})


@pytest.mark.parametrize("field", ["store.uri", "checkpoint.uri", "checkpoint.resume_from", "data.source"])
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("file:///tmp/o%20%C3%BC", "holds a percent-escape, which kftrain does not decode"),  # Path.as_uri()'s
        ("file:///tmp/o ü:1", ""),
        ("/tmp/100%20done", ""),  # a plain path is read as written
    ],
)
def test_a_file_uri_is_read_as_written_and_what_would_change_it_is_refused(field, value, said):
    if not said:
        load_config(overrides={field: value})
        return
    with pytest.raises(ConfigError, match=f"^{re.escape(field)} {re.escape(repr(value))} {re.escape(said)}"):
        load_config(overrides={field: value})


@pytest.mark.parametrize(
    "field",
    ["store.uri", "checkpoint.uri", "checkpoint.resume_from", "data.source", "model.init_from", "data.tokenizer"],
)
@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("/tmp/a\x00b", "holds the control or invisible character '\\x00' at position 6"),  # was: "embedded null byte"
        ("/tmp/a\x1b[2Jb", "holds the control or invisible character '\\x1b'"),  # was: cleared the terminal
        ("s3://bucket/a\nb", "holds the control or invisible character '\\n'"),  # was: a message in two lines
        ("/tmp/\u202eevil", "holds the control or invisible character '\\u202e'"),  # shows another name
        ("s3://bucket/a\u200bb", "holds the control or invisible character '\\u200b'"),
        ("/tmp/" + "x" * 300, "has a folder or file name of 300 bytes"),  # was: "File name too long"
        ("/tmp" + "/d" * 2000, "bytes long; a local path may be at most 3072"),
        ("s3://bucket/" + "k/" * 600, "bytes; S3 takes keys of at most 1024"),
    ],
    ids=["nul", "escape", "newline", "rtl-override", "zero-width", "long-name", "long-path", "long-key"],
)
def test_a_location_no_store_takes_as_typed_is_refused_naming_the_field(field, value, said):
    """Every location a config names (one check, `storage.typed_location_problem`) refuses a
    character that would name another place than the one shown, and a name past what a file
    system or S3 takes, before anything is made (was: local folders named with control
    characters, bare OS errors naming no field, raw escapes on the terminal)."""
    if field == "data.tokenizer":
        value = value.rstrip("/") + "/tokenizer.json"
    with pytest.raises(ConfigError) as info:
        load_config(overrides={field: value})
    message = str(info.value)
    assert message.startswith(field) and said in message, message
    assert "\n" not in message and "\x1b" not in message and "\x00" not in message, message


@pytest.mark.parametrize(
    "value",
    [
        "/tmp/\u062f\u0627\u062f\u0647\u200c\u0647\u0627",  # Persian: a zero-width non-joiner is spelling
        "s3://bucket/\u0915\u094d\u200d\u0937/ckpt",  # Devanagari with a zero-width joiner
        "s3://bucket/\U0001f468\u200d\U0001f469\u200d\U0001f467/runs",  # an emoji family sequence
        "/tmp/co\u00adop",  # a soft hyphen
        "/tmp/" + "x" * 255,  # the longest name a file system takes
        "s3://bucket/" + "k" * 1024,
    ],
    ids=["persian-zwnj", "devanagari-zwj", "emoji-zwj", "soft-hyphen", "name-255", "key-1024"],
)
def test_a_location_in_any_script_is_taken_as_typed(value):
    """The check of typed locations refuses what misleads, not spelling (was: Persian, Indic and
    emoji names refused as 'invisible')."""
    for field in ("store.uri", "data.source", "checkpoint.uri"):
        load_config(overrides={field: value})


@pytest.mark.parametrize(
    ("task", "refused"),
    [
        ("classification", False),
        ("my_pkg.tasks:Regression", False),
        ("mod:Cls", False),
        ("a b:c", True),  # was: accepted by `job manifest`, a name no import could find
        ("x:", True),
        ("a:b:c", True),
        ("pkg.mod.Cls", True),  # a dot where the colon goes
        ("9pkg:Cls", True),
        ("regression", True),
    ],
)
def test_a_task_is_a_built_in_one_or_an_import_path_of_python_names(task, refused):
    if not refused:
        assert load_config(overrides={"task": task}).task == task
        return
    with pytest.raises(ConfigError, match=r"task: must be one of .* import path `package.module:TaskClass`"):
        load_config(overrides={"task": task})


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"train:\n  # caf\xe9\n  epochs: 2\n", "line 2: byte 0xe9 is not UTF-8 text"),  # Latin-1
        ("train:\n  epochs: 2\n".encode("utf-16"), "line 1: byte 0xff is not UTF-8 text"),
    ],
)
def test_a_config_file_in_another_encoding_names_the_line_and_the_fix(tmp_path, raw, said):
    """Was: "cannot read the config file ('utf-8' codec can't decode byte 0xe9 in position 16: ...);
    pass a YAML file" of a YAML file."""
    from trainer.config import read_config_file

    (tmp_path / "c.yaml").write_bytes(raw)
    with pytest.raises(ConfigError, match=rf"--config .*c.yaml: {said} .*; save it as UTF-8$"):
        read_config_file(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    ("field", "old", "new", "same"),
    [
        ("store.uri", "st3", "st3/", True),  # was: "that run finished with other settings: store.uri"
        ("store.uri", "st3", "./st3", True),
        ("store.uri", "st3", "{tmp}/st3", True),
        ("store.uri", "s3://bkt/x", "s3://bkt/x/", True),
        ("store.uri", "s3://bkt/x", "s3://bkt/y", False),
        ("checkpoint.uri", "st3/runs/r3/checkpoints", "{tmp}/st3/runs/r3/checkpoints/", True),
        ("checkpoint.uri", "st3/runs/r3/checkpoints", "st3/runs/r4/checkpoints", False),
        ("store.endpoint", "http://127.0.0.1:9000", "http://127.0.0.1:9000/", True),
        ("store.endpoint", "http://127.0.0.1:9000", "http://127.0.0.1:9001", False),
        ("data.source", "corpus.txt", "./corpus.txt", True),
        ("data.source", "digits", "./digits", False),  # the built-in set, or a folder of that name
        ("model.init_from", "hf://org/m", "hf://org/m@main", False),
        # A run recorded before relative paths were pinned, continued after (was: "a different data.tokenizer").
        ("data.tokenizer", "tok/tokenizer.json", "{tmp}/tok/tokenizer.json", True),
        ("data.tokenizer", "bpe:512", "./bpe:512", False),  # a built-in tokenizer, or a file of that name
        ("data.tokenizer", "bytes", "bytes", True),
        ("lora.target_modules", ["q_proj", "v_proj"], ["v_proj", "q_proj"], True),
        ("train.epochs", 2, 3, False),
        ("job.image", "img", "./img", False),  # not a place
    ],
)
def test_a_setting_written_another_way_for_the_same_place_is_the_same_setting(
    tmp_path, monkeypatch, field, old, new, same
):
    """What `--run-id` and a resume compare: one place, or server, however written."""
    from trainer.config import same_setting

    monkeypatch.chdir(tmp_path)
    old, new = (v.format(tmp=tmp_path) if isinstance(v, str) else v for v in (old, new))
    assert same_setting(field, old, new) is same
    assert same_setting(field, new, old) is same
