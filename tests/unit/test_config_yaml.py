"""The config loader is bounded: anchors and aliases, duplicate keys, oversize files and deep
nesting are refused at once with one line naming the file, the key and the line."""

from __future__ import annotations

import time

import pytest

from trainer.config import MAX_CONFIG_BYTES, ConfigError, load_config, load_yaml, parse_config

pytestmark = pytest.mark.timeout(30)


def alias_bomb(levels: int = 9) -> str:
    """The billion-laughs shape: each level holds nine aliases of the one below (9**9 leaves)."""
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    lines.append(f"kubernetes:\n  annotations:\n    bomb: *l{levels}")
    return "\n".join(lines) + "\n"


# (config text, phrases the one-line error must contain)
ROWS = [
    # The anchor's or alias's name is not shown: an unquoted `*Summer2024` or `&Summer2024` is a password.
    pytest.param(alias_bomb(), ["line 1:", "anchors and aliases (a value starting with '&') are not"], id="alias-bomb"),
    pytest.param("job:\n  image: &img repo/x:1\n", ["line 2:", "starting with '&'", "or quote it"], id="anchor"),
    pytest.param("job: {image: *nowhere}\n", ["starting with '*'"], id="alias-without-anchor"),
    pytest.param("kubernetes:\n  env:\n    DB_PASSWORD: *SECRETPART\n", ["line 3:", "'*'"], id="alias-password"),
    pytest.param("kubernetes:\n  env:\n    DB_PASSWORD: &SECRETPART x\n", ["line 3:", "'&'"], id="anchor-password"),
    pytest.param(
        "base: &b {replicas: 2}\njob:\n  <<: *b\n", ["anchors and aliases (a value"], id="merge-key-needs-an-anchor"
    ),
    # Merge keys without an anchor (was: past every check; the last mapping won, against YAML 1.1's rule).
    pytest.param(
        "train:\n  <<: [{epochs: 2}, {epochs: 5}]\n", ["line 2:", "merge keys (<<) are not allowed"], id="merge-list"
    ),
    pytest.param("train: {<<: {epochs: 2}, epochs: 3}\n", ["merge keys (<<)"], id="merge-beside-its-field"),
    pytest.param(
        "job:\n  replicas: 2\n  image: x\n  replicas: 3\n",
        ["job.replicas: duplicate key, on lines 2 and 4", "keep one"],
        id="duplicate-nested",
    ),
    pytest.param("task: a\ntask: b\n", ["task: duplicate key, on lines 1 and 2"], id="duplicate-top"),
    pytest.param(
        "kubernetes:\n  tolerations:\n  - key: a\n    key: b\n",
        ["kubernetes.tolerations[0].key: duplicate key, on lines 3 and 4"],
        id="duplicate-in-list-item",
    ),
    pytest.param('"a\\nb": 1\n"a\\nb": 2\n', ["'a\\nb': duplicate key, on lines 1 and 2"], id="duplicate-odd-key"),
    pytest.param('{"job": {"replicas": 1, "replicas": 2}}', ["job.replicas: duplicate key"], id="duplicate-json"),
    pytest.param("a: " + "[" * 200 + "]" * 200 + "\n", ["nested deeper than 64 levels"], id="too-deep"),
    pytest.param(
        "job:\n  replicas: " + "9" * 5000 + "\n",
        ["line 2: a value that reads as !!int is not one", "digits"],
        id="huge-integer",
    ),
    pytest.param("job: [unclosed\n", ["not valid YAML"], id="not-yaml"),
    # An explicit tag whose value it cannot make (was: PyYAML's KeyError or AttributeError, a
    # traceback from every command), or takes as YAML 1.1 does (was: 010 read as 8, 1:30 as 90).
    pytest.param("train:\n  compile: !!bool SECRETPART\n", ["line 2: !!bool takes true or false"], id="tag-bool"),
    pytest.param("train:\n  compile: !!bool yes\n", ["line 2: !!bool takes true or false"], id="tag-bool-yes"),
    pytest.param("train:\n  epochs: !!int 1:30\n", ["line 2: !!int takes an integer"], id="tag-int-base60"),
    pytest.param("train:\n  epochs: !!int 1_0\n", ["line 2: !!int takes an integer"], id="tag-int-underscore"),
    pytest.param("train:\n  epochs: !!int SECRETPART\n", ["line 2: !!int takes an integer"], id="tag-int-text"),
    pytest.param("train:\n  epochs: !!int 010\n", ["line 2: !!int takes an integer", "no octal"], id="tag-int-octal"),
    pytest.param(  # a PIN under kubernetes.env is not shown
        "kubernetes:\n  env:\n    PIN: !!int 0123\n", ["line 3: !!int takes an integer"], id="tag-int-pin"
    ),
    pytest.param(
        "kubernetes:\n  env:\n    DB_PASSWORD: !!float SECRETPART\n",
        ["line 3: !!float takes a number"],
        id="tag-float-secret",
    ),
    pytest.param("train:\n  learning_rate: !!float 1:30\n", ["line 2: !!float takes a number"], id="tag-float-base60"),
    pytest.param(
        "train:\n  learning_rate: !!float 1_0.5\n", ["line 2: !!float takes a number"], id="tag-float-underscore"
    ),
    pytest.param(
        "job:\n  image: !!timestamp SECRETPART\n", ["line 2: a value that reads as a date (YAML's"], id="tag-timestamp"
    ),
    # Date-like text that is no date (was: "not a usable value: month must be in 1..12", no line).
    pytest.param("checkpoint:\n  owner: 2024-13-45\n", ["line 2:", "(month must be in 1..12)"], id="not-a-date"),
    # Below a float's range (was: read as 0.0, then "must be positive, got 0.0").
    pytest.param("train:\n  learning_rate: 1e-400\n", ["line 2: 1e-400 is too small for a float"], id="underflow"),
]


@pytest.mark.parametrize(("text", "phrases"), ROWS)
def test_refused_at_once_in_one_line(text, phrases):
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        parse_config(text, origin="c.yaml")
    assert time.monotonic() - start < 2  # a bomb is refused, never expanded
    message = str(err.value)
    assert message.startswith("c.yaml: ") and "\n" not in message and "SECRETPART" not in message, message
    for phrase in phrases:
        assert phrase in message, message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('kubernetes:\n  env:\n    DB_PASSWORD: "SECRETPART\n', "while scanning a quoted scalar (line 3, column 18)"),
        ("kubernetes:\n  env: {API_TOKEN: SECRETPART\n", "while parsing a flow mapping (line 2, column 8)"),
        ("a: b: SECRETPART\n", "mapping values are not allowed here (line 1, column 5)"),
        ("x: 'SECRETPART\n\tq'\n]", "(line 3, column 1)"),
        # A control character (was: a ReaderError traceback).
        ("x: SECRETPART\x07\n", "unacceptable character #x0007: special characters are not allowed"),
        # A password unquoted after `!` is read as a tag, which the parser's message quotes (was: printed).
        ("kubernetes:\n  env:\n    DB_PASSWORD: !SECRETPART\n", "(line 3, column 18): a value starting with '!'"),
        ("kubernetes:\n  env:\n    DB_PASSWORD: !<SECRETPART> x\n", "is read as a YAML tag: quote it"),
        ("train:\n\tepochs: 1 # SECRETPART\n", "found character '\\t' that cannot start any token"),  # kept
        ("a: [1, SECRETPART\n", "expected ',' or ']', but got '<stream end>'"),  # the parser's own words: kept
    ],
)
def test_a_yaml_error_says_where_without_the_lines_around_it(text, where):
    """PyYAML's message quotes the lines around the error, a password's among them (was: printed
    by every command, and unredacted in a cluster step's traceback)."""
    with pytest.raises(ConfigError) as err:
        parse_config(text, origin="c.yaml")
    message = str(err.value)
    assert message.startswith("c.yaml: not valid YAML: ") and where in message, message
    assert "SECRETPART" not in message, message


def test_a_plain_config_still_loads():
    text = "job:\n  replicas: 2\nkubernetes:\n  node_selector: {pool: gpu}\n  tolerations:\n  - {key: a}\n"
    cfg = parse_config(text)
    assert cfg.job.replicas == 2 and cfg.kubernetes.node_selector == {"pool": "gpu"}
    # Explicit tags take YAML 1.2's values, a float's leading zeros included (no octal there).
    tagged = parse_config("train:\n  learning_rate: !!float 01.5e-3\n  epochs: !!int 0x10\n  compile: !!bool TRUE\n")
    assert (tagged.train.learning_rate, tagged.train.epochs, tagged.train.compile) == (1.5e-3, 16, True)


def test_the_same_key_in_different_mappings_is_fine():
    assert load_yaml("a: {x: 1}\nb: {x: 2}\nc: [{x: 1}, {x: 2}]\n") == {
        "a": {"x": 1},
        "b": {"x": 2},
        "c": [{"x": 1}, {"x": 2}],
    }


@pytest.mark.parametrize(
    ("size", "refused"),
    [(MAX_CONFIG_BYTES, False), (MAX_CONFIG_BYTES + 1, True), (5 * MAX_CONFIG_BYTES, True)],
)
def test_config_file_size_is_bounded(tmp_path, size, refused):
    path = tmp_path / "c.yaml"
    path.write_text("job:\n  replicas: 1\n#" + "x" * (size - len("job:\n  replicas: 1\n#")))
    assert path.stat().st_size == size
    if not refused:
        assert load_config(path).job.replicas == 1
        return
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"--config {path}: larger than a config may be (1048576 bytes = 1 MiB); is it the right file?"
    )


def test_config_text_size_is_bounded():
    """The pipeline's `config` parameter is text, not a file: the same bound, named by its origin."""
    with pytest.raises(ConfigError, match=r"^config: 1048577 bytes is larger than a config may be \(1048576"):
        parse_config("#" * (MAX_CONFIG_BYTES + 1))


@pytest.mark.parametrize(
    ("scalar", "value"),
    [
        ("true", True), ("False", False), ("yes", "yes"), ("no", "no"), ("on", "on"), ("Off", "Off"),
        ("10", 10), ("-3", -3), ("0", 0), ("0x1f", 31), ("0o400", 256), ("010", "010"), ("1:30", "1:30"),
        ("1_000", "1_000"),
        ("0.5", 0.5), (".5", 0.5), ("1e-3", 0.001), ("-2.5E2", -250.0), ("00.5", "00.5"), ("0123", "0123"),
    ],
)  # fmt: skip
def test_plain_scalars_are_read_by_yaml_1_2_s_core_schema(scalar, value):
    """What YAML 1.1 (PyYAML's default) reads as another type or another number stays the text
    written, which a field's type check then refuses by name: `010` is not silently 8."""
    got = load_yaml(f"k: {scalar}\n")["k"]
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("train:\n  epochs: 010\n", "train.epochs: must be an integer, got '010'"),
        ("train:\n  epochs: 1:30\n", "train.epochs: must be an integer, got '1:30'"),
        ("checkpoint:\n  enabled: yes\n", "checkpoint.enabled: must be true or false, got 'yes'"),
        ("checkpoint:\n  on: true\n", "checkpoint.on: unknown key"),
        ("train:\n  1: 2\n  epoch: 3\n", "train.epoch: unknown key"),
        ("train:\n  1: 2\n", "train.1 (not text): unknown key"),
        ("kubernetes:\n  node_selector:\n    zone: 0123\n", None),
    ],
    ids=["octal-looking", "base-60-looking", "yes", "on-as-a-key", "keys-of-two-types", "a-number-key", "text-kept"],
)
def test_what_yaml_1_1_would_change_is_refused_by_name_or_kept_as_written(text, error):
    if error is None:
        assert parse_config(text).kubernetes.node_selector == {"zone": "0123"}
        return
    with pytest.raises(ConfigError) as err:
        parse_config(text)
    assert error in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("train:\n  epochs: !!int 12\n", "epochs", 12),
        ("train:\n  epochs: !!int 0x10\n", "epochs", 16),
        ("train:\n  compile: !!bool true\n", "compile", True),
        ("train:\n  epochs: !!int +12\n", "epochs", 12),
    ],
)
def test_explicit_tags_read_as_yaml_1_2_does(text, field, value):
    assert getattr(parse_config(text).train, field) == value


@pytest.mark.parametrize(
    ("text", "said"),
    [
        # A tab YAML refuses, in YAML or in JSON (was: no word of what to do).
        ("train:\n\tepochs: 3\n", "(YAML takes no tab between tokens, a JSON config's too: use spaces)"),
        ('{\n\t"train": {"epochs": 3}\n}\n', "(YAML takes no tab between tokens, a JSON config's too: use spaces)"),
        ("train:\n", "train: has no value (nothing after `train:`, which YAML reads as null)"),
        ("train:\n  max_steps:\n", "train.max_steps: has no value (nothing after `max_steps:`"),
        # A quoted exponent below a float's range (was: read as 0.0 and accepted, or blamed on 0.0).
        ('train:\n  weight_decay: "1e-400"\n', "train.weight_decay: 1e-400 is too small for a float"),
    ],
)
def test_tabs_empty_keys_and_a_quoted_underflow_are_one_line(text, said):
    with pytest.raises(ConfigError) as err:
        parse_config(text, origin="c.yaml")
    assert said in str(err.value) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize(("given", "kind"), [(1.0, "float"), ({"train": {"epochs": 3}}, "dict"), (None, "NoneType")])
def test_a_config_that_is_no_text_is_refused_naming_what_it_is(given, kind):
    """A KFP step's `config` parameter wired to something else (kfp.local 2.17 hands a
    `dsl.ParallelFor` item on in its place): was an AttributeError naming nothing."""
    with pytest.raises(ConfigError, match=rf"^config: must be the config's YAML or JSON text, not a {kind}$"):
        parse_config(given, origin="config")


@pytest.mark.parametrize(
    "overrides",
    [
        {"data.eval_prompts": ["after red? 🙂"]},
        {"data.source": "data/chat🙂.jsonl", "task": "causal_lm"},
        {"task": "causal_lm", "model.init_from": "models/llama🙂"},
        {"data.eval_prompts": ["ünïcödé"]},
    ],
    ids=["prompt", "source", "base-model", "bmp"],
)
def test_text_past_u_ffff_reaches_the_steps_as_written(overrides):
    """The steps read the effective config's JSON as YAML (was: an emoji came back as two lone
    surrogates: a prompt the tokenizer refused after training, a source or model "not there")."""
    from trainer.config import config_to_json, to_dict

    cfg = load_config(overrides=overrides)
    assert to_dict(parse_config(config_to_json(cfg))) == to_dict(cfg)


@pytest.mark.parametrize(
    ("text", "got"),
    [
        ('data:\n  eval_prompts: ["a \\ud83d\\ude42"]\n', "a 🙂"),  # an escaped pair, as JSON writes it
        ('data:\n  eval_prompts: ["a \\U0001F642"]\n', "a 🙂"),
        ('data:\n  eval_prompts: ["a \\ud83d"]\n', None),
        ('data:\n  eval_prompts: ["a \\ude42 b"]\n', None),
    ],
)
def test_an_escaped_surrogate_pair_is_its_character_and_a_lone_one_is_refused(text, got):
    if got is not None:
        assert parse_config(text).data.eval_prompts == [got]
        return
    with pytest.raises(ConfigError, match=r"^config: line 2: a lone UTF-16 surrogate escape"):
        parse_config(text)
