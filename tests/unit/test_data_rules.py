"""The pure rules of what data prep accepts (trainer/data_rules.py): label normalisation, class
order, case-blind suffixes, text-vs-binary sniffing and the float32 range of features."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data_rules import (
    HEAD_BYTES,
    bad_feature,
    binary_reason,
    canonical_label,
    class_order,
    json_line,
    missing_label,
    source_format_problem,
    text_chunks,
)
from trainer.shards import DataError
from trainer.storage import has_suffix
from trainer.tokenizer import parse_spec

LABELS = [
    ("1", "1"),
    ("1.0", "1"),
    (" 1", "1"),
    ("1 ", "1"),
    ("\t1\r", "1"),
    ("+1", "1"),
    ("01", "1"),
    ("1e0", "1"),
    ("1E3", "1000"),
    ("10", "10"),
    ("0.50", "0.5"),
    (".5", "0.5"),
    ("5.", "5"),
    ("-0", "0"),
    ("-0.0", "0"),
    ("-1.5e-3", "-0.0015"),
    ("12345678901234567890.0", "12345678901234567890"),  # exact: no float rounding merges two ids
    ("12345678901234567891", "12345678901234567891"),
    ("1e999999", "1E+999999"),  # no million-digit class name
    ("cat", "cat"),
    ("  cat ", "cat"),
    ("Cat", "Cat"),  # case is kept: Cat and cat are two classes
    ("nan", "nan"),  # text, not a number
    ("inf", "inf"),
    ("1_000", "1_000"),
    ("0x10", "0x10"),
    ("1,5", "1,5"),
    ("", ""),
    ("   ", ""),
]


@pytest.mark.parametrize(("raw", "canonical"), LABELS)
def test_a_label_names_one_class_per_value(raw, canonical):
    assert canonical_label(raw) == canonical


@pytest.mark.parametrize(
    ("label", "missing"),
    [("", True), ("NaN", True), ("nan", True), ("-NaN", True), ("NA", True), ("n/a", True), ("#N/A", True)]
    + [("<NA>", True), ("Null", True), ("#N/A N/A", True), ("1.#QNAN", True), ("None", False), ("nano", False)]
    + [("NAB", False), ("0", False)],
)
def test_a_label_that_marks_a_missing_value_is_no_class(label, missing):
    """`None` stays a class: a common name for "no defect"."""
    assert missing_label(label) is missing


@pytest.mark.parametrize(
    ("labels", "order"),
    [
        (["10", "2", "1"], ["1", "2", "10"]),
        (["1", "-1", "0", "-10"], ["-10", "-1", "0", "1"]),
        (["0.5", "0.25", "1"], ["0.25", "0.5", "1"]),
        ([str(d) for d in range(9, -1, -1)], [str(d) for d in range(10)]),  # digits as before
        (["dog", "cat", "emu", "cat"], ["cat", "dog", "emu"]),
        (["b", "10", "a", "2"], ["2", "a", "b", "10"]),  # mixed: shorter first, then alphabetical
    ],
)
def test_classes_are_ordered_by_value_when_all_are_numbers(labels, order):
    assert class_order(labels) == order


@pytest.mark.parametrize(
    ("uri", "suffixes", "expected"),
    [
        ("s3://b/corpus.jsonl", (".jsonl",), True),
        ("s3://b/UPPER.JSONL", (".jsonl",), True),
        ("/data/Mixed.JsonL", (".jsonl", ".json"), True),
        ("/data/TOKENIZER.JSON", (".json",), True),
        ("/data/a.jsonl.txt", (".jsonl",), False),
        ("/data/jsonl/a.txt", (".jsonl",), False),  # the name, not a folder
        ("/data/a.NPZ", (".npz",), True),
        ("/data/a.npz", (".NPZ",), True),
        ("/data/a.csv", (".jsonl", ".json"), False),
    ],
)
def test_suffixes_compare_case_blind(uri, suffixes, expected):
    assert has_suffix(uri, *suffixes) is expected


def test_a_tokenizer_file_spec_is_recognised_whatever_its_case():
    assert parse_spec("s3://bucket/TOKENIZER.JSON").kind == "file"


@pytest.mark.parametrize(
    ("head", "complete", "phrase"),
    [
        (b"a,label\n1,x\n", True, None),
        ("naïve,€,日本\n".encode(), True, None),
        (b"\xef\xbb\xbfa,label\n", True, None),  # a UTF-8 byte-order mark is text
        ("ok é".encode()[:-1], False, None),  # a character cut at the chunk's end
        ("ok é".encode()[:-1], True, "is not UTF-8 text"),  # ... or at the object's end
        (b"", True, None),
        (b"\x7fELF\x02\x01\x01\x00\x00", False, "is an ELF executable"),
        (b"\xcf\xfa\xed\xfe\x07\x00\x00\x01", False, "is a Mach-O executable"),
        (b"MZ\x90\x00\x03\x00", False, "is a Windows executable"),
        (b"\x1f\x8b\x08\x00\x00\x00", False, "is gzip-compressed, not UTF-8 text (decompress it first)"),
        (b"PK\x03\x04\x14\x00\x00\x00", False, "is a zip archive"),
        (b"PAR1\x15\x04\x15\x00\x00", False, "is a Parquet file"),
        (b"\x93NUMPY\x01\x00v\x00", False, "is a numpy array"),
        ("a,label\n".encode("utf-16"), True, "is UTF-16 text, not UTF-8 text (save it as UTF-8)"),
        (b"text\x00more", True, "is binary, not UTF-8 text (a NUL byte at offset 4, line 1)"),
        (b"a,label\n1,x\n2,\xff\n", True, r"is not UTF-8 text (line 3: byte 0xff at offset 14"),
        ("caf\xe9\n".encode("latin-1"), True, "is not UTF-8 text (line 1: byte 0xe9 at offset 3"),
        (b"MZ is a fine word\n", True, None),  # a magic number alone does not make binary
    ],
)
def test_binary_or_non_utf8_starts_are_named(head, complete, phrase):
    reason = binary_reason(head, complete)
    if phrase is None:
        assert reason is None
    else:
        assert reason is not None and phrase in reason, reason


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ([[1.0, 2.0], [-3.5e38 / 2, 0.0]], None),
        ([[3.4028234e38, -3.4028234e38]], None),  # float32's largest still fits
        ([[1.0, np.nan]], (0, 1, "is NaN")),
        ([[1.0, 2.0], [np.inf, 0.0]], (1, 0, "is infinite")),
        ([[-np.inf]], (0, 0, "is infinite")),
        ([[0.0, 1e308]], (0, 1, "overflows float32")),
        ([[0.0, 0.0], [0.0, -1e39]], (1, 1, "overflows float32")),
        ([[1e39, np.nan]], (0, 0, "overflows float32")),  # the first bad cell in row order
    ],
)
def test_features_must_be_finite_float32_values(cells, expected):
    found = bad_feature(np.array(cells, dtype=np.float64))
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[:2] == expected[:2] and expected[2] in found[2], found


@pytest.mark.parametrize(
    ("task", "uri", "phrase"),
    [
        ("classification", "s3://b/table.csv", None),
        ("classification", "s3://b/TABLE.CSV", None),
        ("classification", "/data/table.txt", None),
        ("classification", "/data/rows.JSONL", "is a JSON Lines file (.jsonl)"),
        ("classification", "/data/rows.json", "is a JSON file"),
        ("classification", "/data/rows.Parquet", "is a Parquet file"),
        ("causal_lm", "/data/corpus.JSONL", None),
        ("causal_lm", "/data/corpus.parquet", None),  # its bytes decide (binary_reason)
    ],
)
def test_a_source_suffix_its_task_does_not_read_is_named(task, uri, phrase):
    problem = source_format_problem(task, uri)
    if phrase is None:
        assert problem is None
    else:
        assert problem is not None and phrase in problem, problem


@pytest.mark.parametrize("files", [{"x.txt": "", "y.jsonl": ""}, {"x.txt": "", "y.txt": "some text"}])
def test_a_prefix_of_empty_objects_is_refused_before_any_step(tmp_path, files):
    """Was: passed, then data prep said "the train split has 0 tokens" and advised a larger
    data.shard_rows or a shorter context."""
    from trainer.config import load_config
    from trainer.data_rules import check_source
    from trainer.shards import DataError

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cfg = load_config(overrides={"task": "causal_lm", "data.source": f"{tmp_path}/"})
    if all(not text for text in files.values()):
        with pytest.raises(DataError, match=r"its 2 objects are all empty \(0 bytes\)"):
            check_source(cfg)
    else:
        check_source(cfg)  # one with text is enough


@pytest.mark.parametrize(
    ("task", "source", "hint"),
    [
        ("classification", "Digits", "'digits'"),
        ("causal_lm", "Python-Stdlib", "'python-stdlib'"),
        ("classification", "digitz", None),
        # A wildcard pattern, which no source is (was: "check the URI" alone).
        ("classification", "data/*.csv", "wildcard"),
        ("causal_lm", "texts/doc?.txt", "wildcard"),
        ("causal_lm", "texts/*/", "wildcard"),
    ],
)
def test_a_missing_source_spelled_like_a_built_in_one_or_a_pattern_says_so(tmp_path, monkeypatch, task, source, hint):
    from trainer.config import load_config
    from trainer.data_rules import check_source
    from trainer.shards import DataError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        check_source(load_config(overrides={"task": task, "data.source": source}))
    message = str(err.value)
    assert message.startswith(f"data.source {source}")
    if hint == "wildcard":
        assert message.endswith(
            "; data.source takes no wildcard patterns: name the folder, and every object below it is read"
        ), message
    else:
        assert f"the built-in source is {hint}, in lower case" in message if hint else "built-in" not in message


CHAT_LINE = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
LONG_TEXT = "x" * (HEAD_BYTES + 10)

# (data.format, the object's name and text, what the error says; None: passes, left to data prep)
FIRST_RECORD_CASES = {
    "auto on chat records": ("auto", "c.jsonl", CHAT_LINE + "\n", "set data.format: chat"),
    "jsonl without the text field": ("jsonl", "c.txt", '{"body": "x"}\n', "no text field 'text' (data.text_field)"),
    "jsonl, the text field a list": (
        "jsonl",
        "c.jsonl",
        CHAT_LINE.replace('"messages"', '"text"') + "\n",
        "its 'text' (data.text_field) is a JSON array, not text",
    ),
    "jsonl, a record that is no object": ("jsonl", "c.jsonl", '["x"]\n', "its keys: none: it is a JSON array"),
    "jsonl, not JSON": ("jsonl", "c.jsonl", "\n{oops\n", "c.jsonl line 2 is not JSON (Expecting property name"),
    # Where on the line (was: "(Unterminated string starting at)", the sentence cut off).
    "jsonl, a string cut": (
        "jsonl",
        "c.jsonl",
        '{"text": "abc\n',
        "c.jsonl line 1 is not JSON (Unterminated string starting at, column 10)",
    ),
    "chat without an assistant": (
        "chat",
        "c.jsonl",
        '\n{"messages": [{"role": "user", "content": "x"}]}\n',
        "line 2: ",
    ),
    "chat as text records": ("chat", "c.jsonl", '{"text": "x"}\n', "no 'messages' field"),
    "auto on jsonl text": ("auto", "c.jsonl", '{"text": "x"}\n' + CHAT_LINE, None),
    "text format": ("text", "c.jsonl", CHAT_LINE + "\n", None),
    "a chat first line past the head": ("chat", "c.jsonl", '{"messages": "' + LONG_TEXT + '"}\n', None),
    # A whole .json file of records, its array on one line past the head (was: passed, refused in data prep).
    "an array on one long line": (
        "auto",
        "c.json",
        '[{"text": "' + LONG_TEXT + '"}]',
        "line 1 opens a JSON array, not a record; is the file one JSON array of records?",
    ),
    "a pretty-printed array": (
        "chat",
        "c.json",
        '[\n  {"messages": []}\n]\n',
        "line 1 is not JSON (Expecting value, column 2)",
    ),
    "good chat": ("chat", "c.jsonl", CHAT_LINE + "\n" + CHAT_LINE, None),
}


@pytest.mark.parametrize(("fmt", "name", "text", "said"), FIRST_RECORD_CASES.values(), ids=FIRST_RECORD_CASES.keys())
def test_the_first_record_is_read_as_data_prep_reads_it_before_any_step(tmp_path, fmt, name, text, said):
    """Records of another form than `data.format` says (chat read as text records, a missing
    `data.text_field`, a bad first conversation) were found in data prep, after the run began."""
    from trainer.config import load_config
    from trainer.data_rules import check_source
    from trainer.shards import DataError

    source = tmp_path / name
    source.write_text(text)
    chat = {"model.init_from": "/models/base"} if fmt == "chat" else {}  # chat data needs a base model
    cfg = load_config(overrides={"task": "causal_lm", "data.source": str(source), "data.format": fmt, **chat})
    if said is None:
        check_source(cfg)
        return
    with pytest.raises(DataError) as err:
        check_source(cfg)
    assert str(err.value).startswith(f"data.source {source}") and said in str(err.value), err.value


#: A first chunk as store reads give it: a whole head (shorter, it would be the whole object).
HEAD = b"head line\n" * (HEAD_BYTES // 10 + 1)
HEAD_LINES = HEAD.count(b"\n")

# (the object's chunks after HEAD, the line and offset named (counted after HEAD); None: it reads whole)
LATE_UTF8_CASES = {
    "valid throughout": ([b"caf\xc3\xa9\n" * 3, b"na\xc3\xafve\n"], None),
    "a character split between chunks": ([b"line\ncaf\xc3", b"\xa9\nmore\n"], None),
    "latin-1 in a later chunk": ([b"a\nb\n", b"c\ncaf\xe9\n"], (4, 9)),
    "a bad continuation across chunks": ([b"a\n\xc3", b"(b\n"], (2, 2)),
    "cut inside its last character": ([b"a\nb\xe2\x82"], "ends inside a character"),
}


@pytest.mark.parametrize(("chunks", "named"), LATE_UTF8_CASES.values(), ids=LATE_UTF8_CASES.keys())
def test_text_that_stops_being_utf8_after_its_head_is_refused_where_it_does(chunks, named):
    """Was: only the head was checked; a bad byte further on was replaced by the tokenizer."""
    from trainer.data_rules import text_chunks

    read = text_chunks(iter([HEAD, *chunks]), "s3://b/corpus.txt", "text or JSON Lines")
    if named is None:
        assert b"".join(read) == HEAD + b"".join(chunks)
        return
    with pytest.raises(DataError) as err:
        list(read)
    message = str(err.value)
    assert message.startswith("data.source s3://b/corpus.txt is not UTF-8 text (")
    if isinstance(named, tuple):
        line, offset = named
        assert f"(line {HEAD_LINES + line}: byte 0x" in message, message
        assert f"at offset {len(HEAD) + offset};" in message, message
    else:
        assert named in message


def test_the_source_version_changes_with_what_data_prep_reads_and_only_then(tmp_path):
    """configure records it in the effective config, data prep's input: KFP's cache reuses a
    prepared dataset only for the same data (was: a source changed in place kept its old dataset)."""
    import os

    from trainer.config import load_config
    from trainer.data_rules import source_version

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n")
    (corpus / "b.txt").write_text("more text\n")
    (tmp_path / "tok.json").write_text("{}")
    cfg = load_config(overrides={"task": "causal_lm", "data.source": str(corpus)})
    first = source_version(cfg)
    assert len(first) == 16 and source_version(cfg) == first  # the same data: the same version
    (corpus / "a.txt").write_text("hello world\n")  # rewritten in place, the same bytes: a new mtime
    os.utime(corpus / "a.txt", ns=(1, 1))
    assert source_version(cfg) != first
    second = source_version(cfg)
    (corpus / "c.txt").write_text("a new file\n")  # a new object under the prefix
    assert source_version(cfg) != second
    tokenizer = load_config(
        overrides={"task": "causal_lm", "data.source": str(corpus), "data.tokenizer": str(tmp_path / "tok.json")}
    )
    assert source_version(tokenizer) != source_version(cfg)  # the tokenizer file is read too
    assert source_version(load_config()) == ""  # the built-in digits: nothing from a store
    # The built-in text: no object, but how data prep makes its tokens (KFP's cache key; was "").
    stdlib = source_version(load_config(overrides={"task": "causal_lm", "data.source": "python-stdlib"}))
    assert len(stdlib) == 16
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("trainer.data_rules.TEXT_PREP_VERSION", 1)  # data prep's tokens changed: the key too
        assert source_version(load_config(overrides={"task": "causal_lm", "data.source": "python-stdlib"})) != stdlib


def test_the_source_version_follows_a_base_model_s_tokenizer(tmp_path):
    """A tokenizer.json changed in place (two ids swapped) kept the old version: KFP's cache
    handed training a dataset of the old ids, the export the new tokenizer. An hf:// base is not
    asked for (no network in the configure step): its revision is in the config."""
    import os

    from trainer.config import load_config
    from trainer.data_rules import source_version

    (tmp_path / "chat.jsonl").write_text('{"messages": []}\n')
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer.json").write_text("{}")
    fields = {"task": "causal_lm", "data.source": str(tmp_path / "chat.jsonl"), "data.format": "jsonl"}
    cfg = load_config(overrides={**fields, "model.init_from": str(base)})
    first = source_version(cfg)
    assert source_version(cfg) == first
    os.utime(base / "tokenizer.json", ns=(1, 1))  # rewritten in place
    assert source_version(cfg) != first
    second = source_version(cfg)
    (base / "chat_template.jinja").write_text("{{ messages }}")  # a file it reads when there
    assert source_version(cfg) != second
    hub = load_config(overrides={**fields, "model.init_from": "hf://org/model@abc"})
    assert len(source_version(hub)) == 16


#: A source folder as people's folders are: a user's `.tmp` file, a git clone's and a notebook's
#: hidden folders, a hidden file, a deeper hidden folder, and a neighbour sharing its first letters.
SOURCE_TREE = (
    "data/a.txt",
    "data/notes.tmp",
    "data/sub/b.txt",
    "data/.git/objects/ab",
    "data/.ipynb_checkpoints/a-checkpoint.txt",
    "data/.hidden",
    "data/sub/.cache/c.txt",
    "datax/z.txt",
)
SOURCE_LISTINGS = [
    ("data", ["data/a.txt", "data/notes.tmp", "data/sub/b.txt"]),
    ("data/", ["data/a.txt", "data/notes.tmp", "data/sub/b.txt"]),
    ("data/a.txt", ["data/a.txt"]),
    ("", ["data/a.txt", "data/notes.tmp", "data/sub/b.txt", "datax/z.txt"]),  # a bucket's root: a folder
]


def assert_source_objects(store, root: str) -> None:
    """The objects each source of :data:`SOURCE_LISTINGS` under `root` names, with the versions
    `store.version` gives them, the same in every store (also run on the S3 servers): hidden
    files and folders are not data, a user's `.tmp` file is (was: local stores dropped every
    `.tmp`, S3 kept it; hidden folders were read; a bucket's root was refused)."""
    from trainer.data_rules import source_listing, source_objects
    from trainer.storage import join_uri

    for key in SOURCE_TREE:
        store.put_bytes(join_uri(root, key), key.encode())
    for source, expected in SOURCE_LISTINGS:
        uri = join_uri(root, source) + ("/" if source.endswith("/") or not source else "")
        uris = [join_uri(root, k) for k in expected]
        assert source_objects(store, uri) == uris, source
        assert source_listing(store, uri) == {u: store.version(u) for u in uris}, source


def test_a_local_source_lists_as_a_store_does(tmp_path):
    from trainer.storage import LocalStore

    assert_source_objects(LocalStore(), str(tmp_path))


def test_a_linked_folder_is_read_through_once_under_one_name_and_a_link_loop_ends(tmp_path):
    """(was: a folder linked into the source was skipped in silence) A link back into the source
    (`latest -> v2`, a hidden `.alias -> data`) is not followed: its folder is read under its own
    name (a hidden alias walked first had hidden the folder's data, on some machines); a folder
    two links lead to is read once, under the first name in order."""
    from trainer.data_rules import source_objects
    from trainer.storage import LocalStore

    for folder in ("elsewhere", "src/sub", "src/data", "src/v2"):
        (tmp_path / folder).mkdir(parents=True)
    for path in ("elsewhere/c.txt", "src/a.txt", "src/data/d.txt", "src/v2/e.txt"):
        (tmp_path / path).write_text(path)
    (tmp_path / "src" / "linked").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "src" / "sub" / "again").symlink_to(tmp_path / "elsewhere")  # the same folder: once
    (tmp_path / "src" / "sub" / "loop").symlink_to(tmp_path / "src")
    (tmp_path / "src" / ".alias").symlink_to(tmp_path / "src" / "data")
    (tmp_path / "src" / "latest").symlink_to(tmp_path / "src" / "v2")
    (tmp_path / "src" / "broken").symlink_to(tmp_path / "gone")
    (tmp_path / "src" / ".kftrain-0a1b.tmp").write_text("a write in progress")
    src = str(tmp_path / "src")
    expected = [f"{src}/{p}" for p in ("a.txt", "data/d.txt", "linked/c.txt", "v2/e.txt")]
    assert source_objects(LocalStore(), src) == expected


@pytest.mark.parametrize("how", ["symlink", "hardlink", "symlink-into-a-subfolder"])
def test_a_file_two_paths_lead_to_is_read_once_under_the_first(tmp_path, caplog, how):
    """(was: read twice: a split of both copies put its test lines into training, without a word)"""
    import os

    from trainer.data_rules import source_listing, source_objects
    from trainer.storage import LocalStore

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("the text\n")
    second = src / ("sub/latest.txt" if how.endswith("subfolder") else "latest.txt")
    if how == "hardlink":
        os.link(src / "a.txt", second)
    else:
        second.symlink_to(src / "a.txt")
    with caplog.at_level("WARNING", logger="kftrain.data"):
        assert source_objects(LocalStore(), str(src)) == [f"{src}/a.txt"]
    assert f"{second} is {src}/a.txt again (a link): read once" in caplog.text
    assert list(source_listing(LocalStore(), str(src))) == [f"{src}/a.txt"]


def test_a_file_name_that_is_not_utf8_is_named_with_its_fix(tmp_path):
    """(was: a UnicodeEncodeError in the pre-flight, reported as a bug in kftrain)"""
    import os

    from trainer.data_rules import source_objects
    from trainer.storage import LocalStore

    (tmp_path / "ok.txt").write_text("x")
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), "w") as f:
        f.write("x")
    with pytest.raises(DataError, match=r"the file name b'caf\\xe9.txt' below it is not UTF-8.*rename it"):
        source_objects(LocalStore(), str(tmp_path))


@pytest.mark.parametrize(("key", "why"), [("d//e.txt", "empty path segment")])
def test_an_s3_key_no_uri_can_name_is_refused_naming_data_source(key, why):
    """S3 holds such keys (was: refused naming the object only, not data.source or the fix). A
    key's `?` and `#` are its own characters: read (tests/integration/test_storage.py)."""
    from trainer.data_rules import source_objects
    from trainer.storage import LocalStore

    class Listing(LocalStore):  # a bucket's listing, as an S3 server gives it
        def versions(self, prefix):
            return {f"{prefix}ok.txt": "3:e1", f"{prefix}{key}": "3:e2"}

    with pytest.raises(DataError) as err:
        source_objects(Listing(), "s3://bucket/corpus/")
    message = str(err.value)
    assert message.startswith(f"data.source s3://bucket/corpus/: the object {key!r} below it has a name kftrain")
    assert why in message and message.endswith("rename it, or move it out of this prefix")


@pytest.mark.parametrize("check", ["source_version", "check_source"])
def test_only_the_stores_first_answer_is_held_to_the_checks_seconds(tmp_path, monkeypatch, check):
    """An unreachable store fails the pre-flight in seconds by its first request; the listing of
    a prefix of many objects that follows takes the time it takes (was: all of it under 5 s)."""
    import trainer.data_rules as data_rules
    from trainer.config import load_config
    from trainer.storage import _time_left

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("some text\n")
    calls = []
    real = data_rules.source_listing

    def listing(store, source, versions=True):
        calls.append(_time_left())
        return real(store, source, versions)

    monkeypatch.setattr(data_rules, "source_listing", listing)
    answered = []
    monkeypatch.setattr(data_rules, "answer_within", lambda store, uri, seconds=5.0: answered.append(uri))
    cfg = load_config(overrides={"task": "causal_lm", "data.source": str(tmp_path / "src")})
    getattr(data_rules, check)(cfg)
    assert answered == [str(tmp_path / "src")] and calls and all(left is None for left in calls)


def test_a_nul_byte_after_the_head_is_refused_as_at_the_start():
    """Valid UTF-8 and no text: refused within the head, trained on as token 0 after it (was)."""
    from trainer.data_rules import text_chunks

    read = text_chunks(iter([HEAD, b"a\nb\n", b"c\nd\x00e\n"]), "s3://b/corpus.txt", "text or JSON Lines")
    with pytest.raises(DataError) as err:
        list(read)
    offset, line = len(HEAD) + 7, HEAD_LINES + 4
    assert str(err.value) == (
        f"data.source s3://b/corpus.txt is binary, not UTF-8 text (a NUL byte at offset {offset}, line {line}): "
        "data prep reads text or JSON Lines"
    )


# (a JSON Lines line, as its bytes; what the error names, or None where what the task reads is text)
SURROGATE_LINES = {
    "lone high, a text field": (
        rb'{"text": "broken \ud83d here"}',
        "text holds a lone surrogate \\ud83d at character 7",
    ),
    "lone low": (rb'{"text": "\udc00"}', "text holds a lone surrogate \\udc00 at character 0"),
    "high then a non-surrogate": (rb'{"text": "\ud83d\u0041"}', "text holds a lone surrogate \\ud83d at character 0"),
    "in a chat message": (
        rb'{"messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "hi \uDE00"}]}',
        "messages[1].content holds a lone surrogate \\ude00 at character 3",
    ),
    "in a message's key": (
        rb'{"messages": [{"role": "user", "content": "ok", "n\ud83d": 1}, {"role": "assistant", "content": "a"}]}',
        "a key of messages[0] holds a lone surrogate \\ud83d at character 1",
    ),
    "a whole pair (an emoji)": (rb'{"text": "smile \ud83d\ude00"}', None),
    "the escape's text, escaped": (rb'{"text": "\\ud83d is how JSON writes half an emoji"}', None),
    # Fields no task reads may hold one (review: a scraped export's cut title stopped data prep).
    "in a field not read": (rb'{"text": "fine", "title": "cut \ud83d"}', None),
    "in a key not read": (rb'{"text": "fine", "\udc00meta": 1}', None),
    "in a chat record's other field": (
        rb'{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "src": "\ud83d"}',
        None,
    ),
}


@pytest.mark.parametrize(("line", "named"), SURROGATE_LINES.values(), ids=SURROGATE_LINES.keys())
def test_a_json_lines_string_a_task_reads_that_is_not_text_is_named_with_its_line_and_place(line, named):
    """JSON may escape half of a UTF-16 pair (a truncated export's emoji); no encoder or tokenizer
    takes it (was: a bare "'utf-8' codec can't encode" error, or "a bug in kftrain" from the chat
    tokenizer)."""
    from trainer.chat_data import chat_record
    from trainer.tasks.causal_lm import record_text

    def read():
        if b'"messages"' in line:
            return chat_record(line, "messages", "x.jsonl line 3")
        return record_text(line, "x.jsonl line 3", "text")

    if named is None:
        read()
        return
    with pytest.raises(DataError) as err:
        read()
    assert str(err.value).startswith(f"x.jsonl line 3: {named} (half of a character"), err.value
    assert str(err.value).endswith("fix or drop the record")


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r", b"\n "], ids=["LF", "CRLF", "CR", "LF, stray CRs"])
@pytest.mark.parametrize("bad", [b"\xe9", b"\0"], ids=["latin-1", "NUL"])
@pytest.mark.parametrize("where", ["head", "a later chunk"])
def test_a_bad_byte_is_named_at_its_line_whatever_the_line_ends(end, bad, where):
    """Was: line ends counted as LF alone, so a file of CR line ends (which data prep reads) had
    every bad byte on "line 1"; a NUL at the start was named by its offset only. A CR inside a
    line of an LF file (a terminal's progress captured) is no line end."""
    lines = [b"row %d,a,b" % i for i in range(60)]
    if end == b"\n ":
        end, lines[2] = b"\n", b"downloading 10%\r50%\r100%"
    lines[41] += bad  # line 42
    data = end.join(lines) + end
    if where == "head":
        reason, line = binary_reason(data, complete=True), 42
    else:
        # Cut in chunks of 7 bytes after a clean first one (a line more): CRLFs split between two.
        chunks = [b"x" * HEAD_BYTES + end] + [data[i : i + 7] for i in range(0, len(data), 7)]
        split = any(a.endswith(b"\r") and b.startswith(b"\n") for a, b in zip(chunks, chunks[1:], strict=False))
        assert split == (end == b"\r\n")
        with pytest.raises(DataError) as err:
            list(text_chunks(chunks, "s3://b/t.csv", "CSV"))
        reason, line = str(err.value), 43
    assert reason is not None and f"line {line}" in reason, reason


@pytest.mark.parametrize(
    ("line", "hint"),
    [
        (b"{", "indented"),
        (b'  "text": "a",', "indented"),
        (b"\t}", "indented"),
        (b"[", "array"),
        (b'[{"text": "a"},', "array"),
        (b'{"text": "a"', None),  # a record cut short: no hint to give
    ],
)
def test_a_json_lines_line_of_a_pretty_printed_file_says_how_to_rewrite_it(line, hint):
    """Was: "Expecting property name enclosed in double quotes, column 2" for an indented file's `{`."""
    from trainer.data_rules import ARRAY_HINT, INDENTED_HINT

    with pytest.raises(DataError) as err:
        json_line(line, "x.jsonl line 1", "JSON Lines")
    message = str(err.value)
    assert (INDENTED_HINT in message) == (hint == "indented") and (ARRAY_HINT in message) == (hint == "array")
