"""causal_lm data in one process: bad sources and a missing tokenizer file are named, and a trained
BPE tokenizer goes all the way from data prep to the Hugging Face export."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import load_config
from trainer.distributed import DistEnv
from trainer.export import export_model
from trainer.model_io import load_model
from trainer.shards import DataError, read_shard, split_shards
from trainer.storage import LocalStore, join_uri
from trainer.tasks import get_task
from trainer.tokenizer import tokenizer_from_json
from trainer.train import run_training

pytestmark = pytest.mark.timeout(240)
TINY = {
    "task": "causal_lm",
    "model.n_layer": 1,
    "model.n_head": 2,
    "model.n_embd": 32,
    "model.block_size": 32,
    "train.batch_size": 8,
    "train.max_steps": 6,
    "job.replicas": 1,
    "checkpoint.enabled": False,
    "data.shard_rows": 8,  # 8 KiB-token shards: many shards from a little text
}


def all_tokens(store, ds: str, manifest: dict, split: str) -> np.ndarray:
    return np.concatenate([read_shard(store, ds, info) for info in split_shards(manifest, split, ds)])


def prepare(store, ds: str, **overrides):
    cfg = load_config(overrides={**TINY, **overrides})
    return cfg, get_task("causal_lm").prepare(cfg, store, ds)


@pytest.mark.parametrize(
    ("objects", "source", "message"),
    [
        ({}, "corpus/", "no object there and none below it"),
        # A wildcard is no source (was: "check the URI" alone).
        ({"corpus/a.txt": b"text\n"}, "corpus/*.txt", "none below it; check the URI; data.source takes no wildcard"),
        (
            {"corpus/a.jsonl": b'{"body": "x"}\n'},
            "corpus/",
            r"a.jsonl line 1: the record has no text field 'text'",
        ),
        # A user's source is data, not an artifact of kftrain's to delete and write again.
        ({"corpus/a.jsonl": b'\n\n{"text": "x"\n'}, "corpus/", r"a.jsonl line 3 is not JSON \(Expecting ',' delimiter"),
        # Fewer tokens than a window: larger shards would not help (was: advised a larger data.shard_rows).
        ({"tiny.txt": b"too short"}, "tiny.txt", r"no shard of which .* \(data.max_bytes, data.source\) or a shorter"),
        # Past the pre-flight's first objects, all empty (was: "0 tokens", advising a larger data.shard_rows).
        ({f"corpus/{i:02d}.txt": b"" for i in range(20)}, "corpus/", "no text read from it"),
    ],
)
def test_bad_sources_are_named(tmp_path, objects, source, message):
    store = LocalStore()
    for name, data in objects.items():
        store.put_bytes(str(tmp_path / name), data)
    with pytest.raises(DataError, match=message):
        prepare(store, str(tmp_path / "ds"), **{"data.source": str(tmp_path / source)})


def test_a_missing_tokenizer_file_is_named(tmp_path):
    with pytest.raises(DataError, match=r"nope.json: no such object"):
        prepare(LocalStore(), str(tmp_path / "ds"), **{"data.tokenizer": str(tmp_path / "nope.json")})


def test_a_trained_bpe_goes_from_data_prep_to_the_hugging_face_export(tmp_path):
    transformers = pytest.importorskip("transformers")
    store = LocalStore()
    ds, model_uri, out = str(tmp_path / "ds"), str(tmp_path / "model"), str(tmp_path / "export")
    cfg, manifest = prepare(store, ds, **{"data.tokenizer": "bpe:400", "data.max_bytes": 400_000})
    tok = tokenizer_from_json(store.get_bytes(join_uri(ds, "tokenizer.json")), "test")
    assert manifest["vocab_size"] == tok.vocab_size <= 400 and manifest["dtype"] == "uint16"
    # The shards hold exactly the tokenizer's ids of the text.
    text = all_tokens(store, ds, manifest, "val")
    assert tok.encode(tok.decode(text)).tolist() == text.tolist()
    run_training(cfg, ds, model_uri, DistEnv())
    model, meta = load_model(store, model_uri)
    assert model.config.vocab_size == tok.vocab_size and meta["tokenizer"]["kind"] == "bpe"
    export_model(store, model_uri, out)
    folder = Path(out) / "huggingface"
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    sample = "def answer():\n    return 42  # naïve\n"
    ids = tok.encode(sample.encode()).tolist()
    assert hf_tok.encode(sample) == ids and hf_tok.decode(ids) == sample
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.tensor([ids[:32]])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("name", "fmt"), [("t.txt", "text"), ("d.jsonl", "jsonl"), ("c.jsonl", "auto")])
def test_a_byte_order_mark_is_not_text_the_model_learns(tmp_path, name, fmt):
    """Windows Notepad starts a UTF-8 file with EF BB BF (was: trained on, in text objects)."""
    from trainer.tasks.causal_lm import _object_pieces

    content = b'{"text": "doc 0"}\n{"text": "doc 1"}\n' if name.endswith(".jsonl") else b"line one\nline two\n"
    plain, marked = tmp_path / name, tmp_path / f"bom-{name}"
    plain.write_bytes(content)
    marked.write_bytes(b"\xef\xbb\xbf" + content)
    read = [b"".join(_object_pieces(LocalStore(), str(p), "text", fmt)) for p in (plain, marked)]
    assert read[0] == read[1] and b"\xef" not in read[1]


@pytest.mark.parametrize(
    ("name", "fmt", "expected"),
    [
        ("t.txt", "jsonl", b"doc 0\ndoc 1\n"),  # the format says JSON Lines: the suffix does not decide
        ("t.txt", "auto", b'{"text": "doc 0", "id": 0}\n{"text": "doc 1", "id": 1}\n'),
        ("d.jsonl", "text", b'{"text": "doc 0", "id": 0}\n{"text": "doc 1", "id": 1}\n'),
        ("d.jsonl", "auto", b"doc 0\ndoc 1\n"),
    ],
)
def test_data_format_decides_how_an_object_reads(tmp_path, name, fmt, expected):
    """`data.format: text` or `jsonl` is what the object is read as (was: its suffix decided, and
    a `.txt` of records trained on the raw JSON without a word)."""
    from trainer.tasks.causal_lm import _object_pieces

    path = tmp_path / name
    path.write_bytes(b'{"text": "doc 0", "id": 0}\n{"text": "doc 1", "id": 1}\n')
    assert b"".join(_object_pieces(LocalStore(), str(path), "text", fmt)) == expected


@pytest.mark.parametrize(
    ("content", "fmt", "end", "expected"),
    [
        (b"no line end", "text", b"", b"no line end\n"),  # the next object's first line stays its own
        (b"ends in one\n", "text", b"", b"ends in one\n"),
        (b"", "text", b"", b""),
        (b"no line end", "text", b"<eos>", b"<s>no line end<eos>\n"),
        (b"line 1\nline 2\n", "text", b"<eos>", b"<s>line 1\nline 2\n<eos>\n"),  # one document
        (b"", "text", b"<eos>", b""),  # an empty object is no document
        (b'{"text": "a"}\n\n{"text": "b\\nc"}', "jsonl", b"<eos>", b"<s>a<eos>\n<s>b\nc<eos>\n"),  # each record
    ],
)
def test_each_document_is_marked_and_ends_in_a_line_end(tmp_path, content, fmt, end, expected):
    """A text object and each JSON Lines record is one document: in a pretrained model's marks
    (here `<s>`, and `end` for its end-of-text token), then a line end (was: text objects were
    joined as they were, the last line of one running into the first of the next, and no mark)."""
    from trainer.tasks.causal_lm import Marks, _object_pieces

    path = tmp_path / "d"
    path.write_bytes(content)
    marks = Marks(start=b"<s>", end=end) if end else Marks()
    assert b"".join(_object_pieces(LocalStore(), str(path), "text", fmt, marks)) == expected


@pytest.mark.parametrize(
    "first_line, fmt, says",
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}', "text", "set data.format: chat"),
        ('{"text": "doc", "id": 0}', "text", "set data.format: jsonl"),
        ('{"text": "doc", "id": 0}', "auto", "set data.format: jsonl"),  # a .txt of records
        ("plain prose, the usual case", "text", None),
        ("{not json at all", "text", None),
        ('["a", "list"]', "text", None),
    ],
)
def test_records_read_as_plain_text_get_one_warning_naming_the_format(tmp_path, caplog, first_line, fmt, says):
    """A source of JSON records read as plain text trains on their keys and quotes: a warning
    says which format reads them (was: nothing)."""
    from trainer.tasks.causal_lm import _object_pieces

    path = tmp_path / "d.txt"
    path.write_text(f"{first_line}\n{first_line}\n")
    with caplog.at_level("WARNING", logger="kftrain.data"):
        list(_object_pieces(LocalStore(), str(path), "text", fmt))
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if says is None:
        assert warned == []
    else:
        assert len(warned) == 1 and says in warned[0] and f"(data.format: {fmt})" in warned[0], warned


def test_chat_records_read_as_text_records_point_at_the_chat_format(tmp_path):
    from trainer.tasks.causal_lm import _object_pieces

    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(DataError, match="records of `messages` are chat data: set data.format: chat"):
        list(_object_pieces(LocalStore(), str(path), "text", "auto"))


@pytest.mark.parametrize("sizes", [(80_000, 90_000), (20_000, 20_000, 20_000), (300_000,)])
def test_every_split_samples_every_file_of_a_small_corpus(sizes):
    """The source's files one after another in one block: each split holds lines of each (was:
    val and test only from the block's tail, the last file's), in the fractions asked for."""
    from trainer.tasks.causal_lm import split_block

    files = [b"".join(b"file %d line %06d\n" % (f, i) for i in range(size // 20)) for f, size in enumerate(sizes)]
    parts = split_block(b"".join(files), 0.1, 0.2)
    assert b"".join(sorted(b"".join(parts.values()).splitlines(keepends=True))) == b"".join(
        sorted(b"".join(files).splitlines(keepends=True))
    )  # every line once, none cut
    total = sum(len(f.splitlines()) for f in files)
    for split, share in (("train", 0.7), ("val", 0.1), ("test", 0.2)):
        assert len(parts[split].splitlines()) / total == pytest.approx(share, abs=0.02), split
        for f in range(len(files)):  # a piece that straddles two files shares out between them
            lines = parts[split].count(b"file %d " % f)
            assert lines / len(files[f].splitlines()) == pytest.approx(share, abs=0.1), (split, f)


@pytest.mark.parametrize(
    "text",
    [
        b"word " * 2378 + b"\n",  # one paragraph of 11,891 bytes (was: all train, val and test empty)
        b"word " * 6000 + b"\n",  # one line over two pieces (was: 84/5.5/11%)
        (b"word " * 1000 + b"\n") * 6,  # lines of 5 KB
        b"word " * 1000 + b"\n" + b"word " * 1400 + b"\n",  # two paragraphs
    ],
    ids=["one-paragraph", "one-long-line", "long-lines", "two-paragraphs"],
)
def test_a_text_of_long_lines_is_split_in_the_fractions_asked_for(text):
    """A cut moves to a line end only short of the next cut's target; every byte lands once."""
    from trainer.tasks.causal_lm import split_block

    parts = split_block(text, 0.1, 0.2)
    assert sorted(b"".join(parts.values())) == sorted(text)  # each piece's shares, piece by piece
    for split, share in (("train", 0.7), ("val", 0.1), ("test", 0.2)):
        assert len(parts[split]) / len(text) == pytest.approx(share, abs=0.06), (split, len(parts[split]))


@pytest.mark.parametrize(("size", "warned"), [(999, False), (1000, False), (1001, True)])
def test_a_text_source_cut_at_max_bytes_says_so(tmp_path, caplog, size, warned):
    """data.max_bytes (4 MB by default) leaving part of the user's text unread is said (was: only
    the progress line's percentage); a source that fits is not."""
    from trainer.tasks.causal_lm import source_pieces

    (tmp_path / "t.txt").write_bytes(b"x" * (size - 1) + b"\n")
    cfg = load_config(overrides={"task": "causal_lm", "data.source": str(tmp_path / "t.txt"), "data.max_bytes": 1000})
    with caplog.at_level(logging.WARNING, logger="kftrain.data"):
        assert len(b"".join(source_pieces(cfg, "data prep"))) == min(size, 1000)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == (
        [
            f"data.max_bytes 1000 reached: the rest of data.source {tmp_path / 't.txt'} is not used; set "
            "data.max_bytes: 0 to take all of it, or a larger limit"
        ]
        if warned
        else []
    )


@pytest.mark.parametrize(
    ("line", "end"),
    [("line 0001 the quick brown fox!", "\n"), ("行 0001 敏捷的棕色狐狸跳过懒狗", "\n"), ("line 0001 old mac", "\r")],
    ids=["ascii", "cjk", "cr-only"],
)
def test_no_line_of_a_text_object_is_split_between_the_splits(tmp_path, line, end):
    """A text object was read in pieces of a MiB cut anywhere, and a block ended where a piece
    did: at every MiB a line (and a character) was cut, its head ending the test split glued to
    another line, its tail starting the train split. A CR-only file was cut mid-line everywhere."""
    from trainer.tasks.causal_lm import blocks, source_pieces, split_block

    lines = [line.replace("0001", f"{i:06d}") for i in range(40_000)]
    path = tmp_path / "t.txt"
    path.write_bytes(end.join(lines).encode() + end.encode())
    cfg = load_config(overrides={"task": "causal_lm", "data.source": str(path), "data.max_bytes": 0})
    read = [split_block(b, 0.1, 0.2) for b in blocks(source_pieces(cfg), 1 << 18)]
    for split in ("train", "val", "test"):
        text = b"".join(parts[split] for parts in read).decode()  # whole characters: it decodes
        got = [x for x in text.split(end) if x.strip("\n")]  # an object ends in a line end (a LF added to a CR file)
        assert set(got) <= set(lines) and text.endswith(("\n", "\r")), (split, [x for x in got if x not in lines][:3])
    assert sum(len(parts[s]) for parts in read for s in parts) == path.stat().st_size + (end == "\r")


@pytest.mark.parametrize("record", ["x" * 5425, "é" * 3000, "word " * 1500], ids=["ascii", "two-byte", "words"])
@pytest.mark.parametrize("fractions", [(0.1, 0.2), (0.05, 0.05), (0.3, 0.3)])
def test_a_split_of_long_lines_never_cuts_a_mark_or_a_character(record, fractions):
    """Lines of more than 4 KiB (JSON Lines web text) are cut inside the text where no line end is
    near: never inside a document's mark (was: `<|be` in one split, `gin|>` in the next, as text
    tokens) nor inside a UTF-8 character."""
    from trainer.tasks.causal_lm import Marks, split_block

    marks = Marks(start=b"<|begin_of_text|>", end=b"<|end_of_text|>")
    block = b"".join(marks.around(record.encode()) for _ in range(40))
    parts = split_block(block, *fractions, marks)
    assert sum(len(p) for p in parts.values()) == len(block)
    for part in parts.values():
        part.decode("utf-8")  # whole characters
        bare = part.replace(marks.start, b"").replace(marks.end, b"")
        assert b"<|" not in bare and b"|>" not in bare and b"_text" not in bare
    assert sum(p.count(marks.start) for p in parts.values()) == 40 == sum(p.count(marks.end) for p in parts.values())


def test_max_bytes_never_cuts_a_text_object_inside_a_mark_and_keeps_a_whole_ones_end(tmp_path):
    """data.format: text: a text object is cut between its pieces; one that fits whole keeps its
    end mark even where it ends exactly at the limit (the marks are not the source's text)."""
    from trainer.tasks.causal_lm import Marks, source_pieces

    (tmp_path / "a.txt").write_bytes(b"x" * 99 + b"\n")
    (tmp_path / "b.txt").write_bytes(b"y" * 50 + b"\n")
    marks = Marks(start=b"<s>", end=b"</s>")
    for max_bytes, expected in ((103, b"<s>" + b"x" * 99 + b"\n</s>\n"), (500, None)):
        cfg = load_config(
            overrides={
                "task": "causal_lm",
                "data.source": str(tmp_path),
                "data.format": "text",
                "data.max_bytes": max_bytes,
            }
        )
        text = b"".join(source_pieces(cfg, marks=marks))
        if expected is not None:
            assert text == expected, max_bytes
        else:
            assert text.count(b"<s>") == 2 == text.count(b"</s>")


@pytest.mark.parametrize(
    ("name", "content", "fmt", "size"),
    [
        ("a.txt", b"x" * 99 + b"\n", "text", 103),
        ("d.jsonl", b'{"text": "' + b"y" * 90 + b'"}\n', "jsonl", 98),
    ],
)
def test_a_first_document_larger_than_max_bytes_is_named_with_both_sizes(tmp_path, name, content, fmt, size):
    """Was: "no text read from it (its objects are empty...)", of a source that is not empty."""
    from trainer.shards import DataError
    from trainer.tasks.causal_lm import Marks, source_pieces

    (tmp_path / name).write_bytes(content)
    cfg = load_config(
        overrides={"task": "causal_lm", "data.source": str(tmp_path), "data.format": fmt, "data.max_bytes": 50}
    )
    with pytest.raises(DataError) as err:
        b"".join(source_pieces(cfg, marks=Marks(start=b"<s>", end=b"</s>")))
    assert str(err.value) == (
        f"data.max_bytes 50: the first document of data.source {tmp_path} is larger ({size} bytes or more, with its "
        "special tokens); raise data.max_bytes, or set it to 0 to take the whole source"
    )


def test_max_bytes_takes_whole_documents_in_marks(tmp_path):
    """(was: the last document cut at data.max_bytes, inside its end mark: `<|end` as text)"""
    import json

    from trainer.tasks.causal_lm import Marks, source_pieces

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 5}) + "\n" for i in range(50)))
    marks = Marks(start=b"<s>", end=b"</s>")
    for max_bytes in range(300, 420, 7):
        cfg = load_config(
            overrides={"task": "causal_lm", "data.source": str(tmp_path / "d.jsonl"), "data.max_bytes": max_bytes}
        )
        text = b"".join(source_pieces(cfg, marks=marks))
        assert len(text) <= max_bytes and text.endswith(b"</s>\n") and text.count(b"<s>") == text.count(b"</s>")


@pytest.mark.parametrize(("block_size", "warned"), [(600, True), (32, False)])
def test_shards_that_leave_much_of_the_split_in_no_window_are_said(tmp_path, caplog, block_size, warned):
    """1,024-token shards and a 600-token context: each shard's 423-token tail is never read, 41%
    of the split (was: said nowhere)."""
    from trainer.training_data import check_an_epoch_has_a_step

    store, ds = LocalStore(), str(tmp_path / "ds")
    overrides = {"data.shard_rows": 1, "data.max_bytes": 60_000, "model.block_size": block_size}
    cfg, manifest = prepare(store, ds, **overrides)
    with caplog.at_level("WARNING", logger="kftrain.data"):
        check_an_epoch_has_a_step(cfg, get_task("causal_lm"), manifest, ds)
    said = [r.getMessage() for r in caplog.records if "in no window" in r.getMessage()]
    assert bool(said) == warned, said
    if warned:
        assert said[0].endswith("tokens each, at most): a larger data.shard_rows loses less")


def test_lines_shorter_than_a_share_stay_whole():
    """Lines of 1,200 bytes (a val share of a 16 KiB piece is 1,638): every line in one split."""
    from trainer.tasks.causal_lm import split_block

    lines = [b"%06d " % i + b"w" * 1192 + b"\n" for i in range(200)]
    parts = split_block(b"".join(lines), 0.1, 0.2)
    assert sorted(line for part in parts.values() for line in part.splitlines(keepends=True)) == sorted(lines)


# (the lines of each object of the source, data.format, data.max_bytes; the total the progress line
# counts against, or None for the source's size)
PROGRESS_TOTALS = {
    "text, a limit past its size": ({"a.txt": 60, "b.txt": 20}, "text", 10**8, None),
    "text, a limit short of it": ({"a.txt": 60}, "text", 1000, 1000),
    "text, no limit": ({"a.txt": 60}, "text", 0, None),
    # A record's text is less than its object's bytes: no percent, rather than a wrong one.
    "jsonl records": ({"a.jsonl": 60}, "jsonl", 10**8, 0),
    "chat lines": ({"a.jsonl": 60}, "chat", 10**8, None),
    # The built-in corpus, cut at data.max_bytes by design (review: its percent was lost).
    "python-stdlib": ({}, "text", 300_000, 300_000),
}


@pytest.mark.parametrize(("objects", "fmt", "max_bytes", "total"), PROGRESS_TOTALS.values(), ids=PROGRESS_TOTALS.keys())
def test_data_prep_progress_counts_against_what_it_will_read(tmp_path, monkeypatch, objects, fmt, max_bytes, total):
    """Was: against data.max_bytes, whatever the source's size ("16% ... eta 54s" of a 20 MB source
    read in full 3 s later; no percent at all with max_bytes 0)."""
    import json

    import trainer.chat_data as chat_data
    import trainer.tasks.causal_lm as causal_lm
    from trainer.progress import ProgressLine

    totals = []

    class Recorded(ProgressLine):
        def __init__(self, what, **kw):
            totals.append(kw.get("total", 0))
            super().__init__(what, **kw)

    monkeypatch.setattr(causal_lm, "ProgressLine", Recorded)
    monkeypatch.setattr(chat_data, "ProgressLine", Recorded)
    line = {
        "text": "some plain text, one line of it\n",
        "jsonl": json.dumps({"text": "some text"}) + "\n",
        "chat": json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
        + "\n",
    }[fmt]
    (tmp_path / "src").mkdir()
    for name, lines in objects.items():
        (tmp_path / "src" / name).write_text(line * lines)
    size = sum(f.stat().st_size for f in (tmp_path / "src").iterdir())
    base = {"model.init_from": str(tmp_path / "model")} if fmt == "chat" else {}  # not read here
    where = f"{tmp_path / 'src'}/" if objects else "python-stdlib"
    source = {"data.source": where, "data.max_bytes": max_bytes, "data.format": fmt}
    cfg = load_config(overrides={"task": "causal_lm", **base, **source})
    if fmt == "chat":
        list(chat_data.chat_records(cfg, chat_data._Reading()))
    else:
        list(causal_lm.source_pieces(cfg, "data prep"))
    assert totals == [size if total is None else total]
