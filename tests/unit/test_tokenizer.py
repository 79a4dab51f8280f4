"""data.tokenizer in one process: bytes, a trained byte-level BPE and a tokenizer.json file all
round-trip text exactly, and the Hugging Face export carries the tokenizer so transformers decodes
the same text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.config import ConfigError, load_config
from trainer.gpt import GPT, GPTConfig
from trainer.hf_export import hf_folder
from trainer.shards import DataError
from trainer.storage import LocalStore
from trainer.tokenizer import (
    EOS_TOKEN,
    MAX_BPE_VOCAB,
    MIN_BPE_VOCAB,
    ByteTokenizer,
    TokenizerSpec,
    byte_tokenizer_json,
    load_tokenizer,
    parse_spec,
    tokenizer_from_json,
    train_bpe,
)

#: Source code, non-ASCII text, the special token's text, and bytes that are not UTF-8.
TEXTS = [
    b"",
    b"def hello(world):\n    return world + 42\n\n\n",
    'class Caf\u00e9:\n    """na\u00efve \u2014 \u65e5\u672c\u8a9e \U0001f600"""\n'.encode(),
    f"a document{EOS_TOKEN}the next one".encode(),
    b"valid \xff\xfe invalid \xc3 cut \x00\x01 controls",
]


def assert_round_trip(tok) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids.dtype == np.dtype(np.uint8 if tok.vocab_size <= 256 else np.uint16)
        assert ids.size == 0 or int(ids.max()) < tok.vocab_size
        assert tok.decode(ids) == text
        assert tok.decode(iter(ids.tolist())) == text


def _export(model: GPT, tokenizer_json: bytes | None, folder: Path) -> None:
    folder.mkdir()
    for name, data in hf_folder(model, tokenizer_json).items():
        (folder / name).write_bytes(data)


def test_bytes_round_trip_is_the_bytes_themselves():
    tok = load_tokenizer("bytes", LocalStore())
    assert (tok.kind, tok.vocab_size, tok.eos_id) == ("bytes", 256, None)
    assert_round_trip(tok)
    assert tok.encode(b"AZ\xff").tolist() == [65, 90, 255]
    with pytest.raises(ValueError, match=r"\[0, 256\)"):
        tok.decode([256])


def test_bytes_tokenizer_json_is_the_same_tokenizer():
    """The tokenizer.json shipped for `bytes` gives id = byte value in the tokenizers library too."""
    as_file = tokenizer_from_json(ByteTokenizer().to_json(), "the byte tokenizer")
    assert (as_file.vocab_size, as_file.eos_id) == (256, None)
    for text in TEXTS:
        assert as_file.encode(text).tolist() == list(text)
        assert as_file.decode(list(text)) == text


def test_bpe_round_trip_and_vocabulary(bpe, sample):
    assert (bpe.kind, bpe.vocab_size) == ("bpe", 1000)
    assert bpe.eos_id is not None and bpe.decode([bpe.eos_id]) == EOS_TOKEN.encode()
    assert_round_trip(bpe)
    source = sample[0][:20_000]
    ids = bpe.encode(source)
    assert bpe.decode(ids) == source
    assert len(ids) < len(source) / 2  # merges learned from Python source compress Python source
    assert bpe.encode(EOS_TOKEN.encode()).tolist() == [bpe.eos_id]


def test_long_texts_encode_in_pieces_to_the_same_ids(bpe, sample, monkeypatch):
    """Long texts are encoded in parts cut at line starts; the ids are those of the whole text."""
    import trainer.tokenizer as tokenizer_module

    edges = f"x = 1\n\ndef f():\n  \n\n\n    pass\n \n{EOS_TOKEN}\n\nclass C:\n\t\n".encode()
    text = b"".join(sample)[:60_000] + edges * 200
    whole = bpe.encode(text)
    monkeypatch.setattr(tokenizer_module, "_PIECE_CHARS", 100)
    assert bpe.encode(text).tolist() == whole.tolist()
    assert bpe.decode(whole) == text


def test_bpe_is_deterministic_for_the_same_sample(bpe, sample):
    again = load_tokenizer("bpe:1000", None, iter(sample))
    assert again.to_json() == bpe.to_json()
    other = load_tokenizer("bpe:1000", None, iter(sample[1:]))
    assert other.to_json() != bpe.to_json()


def test_bpe_reads_at_most_max_sample_bytes(sample):
    limit = len(sample[0]) + len(sample[1]) // 2
    capped = train_bpe(iter(sample), 600, max_sample_bytes=limit)
    assert capped.to_json() == train_bpe(iter([sample[0], sample[1][: len(sample[1]) // 2]]), 600).to_json()


def test_a_bpe_smaller_than_asked_is_said(caplog):
    """Short text holds merges for fewer tokens than bpe:N asks (was: a smaller model, said nowhere)."""
    with caplog.at_level("WARNING", logger="kftrain.data"):
        small = train_bpe(iter([b"the cat sat on the mat " * 20]), 100_000)
    assert small.vocab_size < 1000
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        f"data.tokenizer bpe:100000: the 460 bytes of text it trained on hold merges for {small.vocab_size}"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="kftrain.data"):
        train_bpe(iter([b"the cat sat on the mat " * 20]), small.vocab_size)
    assert not caplog.records


def test_bpe_on_an_empty_sample_is_a_data_error():
    with pytest.raises(DataError, match="sample .* is empty"):
        load_tokenizer("bpe:300", None, iter([b"", b""]))
    with pytest.raises(ValueError, match="needs a sample"):
        load_tokenizer("bpe:300", None, None)


def test_file_round_trip_from_a_path(bpe, tmp_path):
    path = tmp_path / "tok" / "tokenizer.json"
    path.parent.mkdir()
    path.write_bytes(bpe.to_json())
    tok = load_tokenizer(str(path), LocalStore())
    assert (tok.kind, tok.vocab_size, tok.eos_id) == ("file", bpe.vocab_size, bpe.eos_id)
    assert tok.to_json() == bpe.to_json()
    assert_round_trip(tok)
    text = TEXTS[2]
    assert tok.encode(text).tolist() == bpe.encode(text).tolist()


def test_ids_use_the_smallest_dtype_that_holds_the_vocabulary(tmp_path):
    """A tokenizer.json whose largest id is 70000 (with holes below it) needs 32-bit ids."""
    spec = json.loads(byte_tokenizer_json())
    spec["added_tokens"] = [
        {
            "id": 70_000,
            "content": EOS_TOKEN,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    ]
    spec["model"]["vocab"][EOS_TOKEN] = 70_000
    path = tmp_path / "wide.json"
    path.write_text(json.dumps(spec))
    tok = load_tokenizer(str(path), LocalStore())
    assert (tok.vocab_size, tok.eos_id) == (70_001, 70_000)
    ids = tok.encode(b"ab" + EOS_TOKEN.encode())
    assert ids.dtype == np.uint32 and ids.tolist() == [97, 98, 70_000]
    assert tok.decode(ids) == b"ab" + EOS_TOKEN.encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such object; upload the tokenizer.json there"),
        (b"{not json", "is not JSON"),
        (b"\xff\xfe", "is not JSON"),
        (b'{"version": "1.0", "vocab": {"a": 0}}', "is JSON but not a tokenizer"),
        (b"[1, 2, 3]", "is JSON but not a tokenizer"),
    ],
)
def test_a_tokenizer_file_that_does_not_load_names_the_object(tmp_path, content, message):
    path = tmp_path / "broken" / "tokenizer.json"
    if content is not None:
        path.parent.mkdir()
        path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_tokenizer(str(path), LocalStore())
    assert str(path) in str(info.value) and message in str(info.value)
    if content is not None:
        assert "data.tokenizer must name a Hugging Face tokenizer.json" in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bytes", TokenizerSpec("bytes", vocab_size=256)),
        (f"bpe:{MIN_BPE_VOCAB}", TokenizerSpec("bpe", vocab_size=MIN_BPE_VOCAB)),
        (f"bpe:{MAX_BPE_VOCAB}", TokenizerSpec("bpe", vocab_size=MAX_BPE_VOCAB)),
        ("bpe:32000", TokenizerSpec("bpe", vocab_size=32000)),
        ("s3://data/tok/tokenizer.json", TokenizerSpec("file", uri="s3://data/tok/tokenizer.json")),
        ("minio://mlpipeline/t.json", TokenizerSpec("file", uri="minio://mlpipeline/t.json")),
        ("/abs/tokenizer.json", TokenizerSpec("file", uri="/abs/tokenizer.json")),
        ("rel/tokenizer.json", TokenizerSpec("file", uri="rel/tokenizer.json")),
    ],
)
def test_parse_spec_accepts_the_three_forms(value, expected):
    assert parse_spec(value) == expected
    assert load_config(overrides={"data.tokenizer": value}).data.tokenizer == value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.tokenizer": "bpe"}, "data.tokenizer: tokenizer 'bpe' is not a known form"),
        ({"data.tokenizer": "bpe:"}, "data.tokenizer: tokenizer 'bpe:': the BPE vocabulary size"),
        ({"data.tokenizer": "bpe:abc"}, "tokenizer 'bpe:abc': the BPE vocabulary size"),
        ({"data.tokenizer": "bpe:-5"}, "tokenizer 'bpe:-5': the BPE vocabulary size"),
        ({"data.tokenizer": f"bpe:{MIN_BPE_VOCAB - 1}"}, f"'bpe:{MIN_BPE_VOCAB - 1}': the BPE vocabulary size"),
        ({"data.tokenizer": f"bpe:{MAX_BPE_VOCAB + 1}"}, f"'bpe:{MAX_BPE_VOCAB + 1}': the BPE vocabulary size"),
        ({"data.tokenizer": "gpt2"}, "tokenizer 'gpt2' is not a known form"),
        ({"data.tokenizer": "s3://data/tok.txt"}, "tokenizer 's3://data/tok.txt' is not a known form"),
        ({"data.tokenizer": "gs://data/tok.json"}, "unsupported storage URI scheme 'gs'"),
        ({"data.tokenizer": "s3://ab/tok.json"}, "invalid bucket name 'ab'"),
        ({"data.tokenizer": ""}, "tokenizer '' is not a known form"),
        ({"data.tokenizer_sample_bytes": 0}, "data.tokenizer_sample_bytes: must be positive, got 0"),
        ({"data.tokenizer_sample_bytes": -1}, "data.tokenizer_sample_bytes: must be positive, got -1"),
    ],
)
def test_config_rejects_bad_tokenizer_values(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    text = str(info.value)
    assert message in text
    if "data.tokenizer" in overrides:
        assert text.startswith("data.tokenizer: ") and "`bytes`" in text and "`bpe:<vocab_size>`" in text


def test_config_defaults():
    data = load_config().data
    assert (data.tokenizer, data.tokenizer_sample_bytes) == ("bytes", 20_000_000)


@pytest.mark.parametrize("kind", ["bpe", "bytes"])
def test_hugging_face_export_carries_the_tokenizer(kind, bpe, tmp_path):
    """transformers loads the export, encodes and decodes as kftrain does, and gives the same logits."""
    transformers = pytest.importorskip("transformers")
    tok = bpe if kind == "bpe" else ByteTokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    folder = tmp_path / "hf"
    _export(model, tok.to_json() if kind == "bpe" else None, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == tok.vocab_size
    assert config.get("eos_token_id") == tok.eos_id and config.get("bos_token_id") == tok.eos_id

    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf_tok.eos_token_id == tok.eos_id and hf_tok.model_max_length == 32
    text = f'def caf\u00e9(x):\n    return x . y , "na\u00efve" {EOS_TOKEN} 42 \n'
    ids = tok.encode(text.encode()).tolist()
    assert hf_tok.encode(text) == ids
    assert hf_tok.decode(ids) == tok.decode(ids).decode() == text

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.tensor([ids[:32]])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(x).logits, model(x), rtol=1e-4, atol=1e-4)


def test_export_refuses_a_tokenizer_larger_than_the_model(bpe):
    model = GPT(GPTConfig(vocab_size=256, block_size=8, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(ValueError, match="the tokenizer has 1000 token ids but the model only 256"):
        hf_folder(model, bpe.to_json())
    with pytest.raises(DataError, match="of the Hugging Face export is not JSON"):
        hf_folder(model, b"nope")


@pytest.mark.parametrize(
    "setting",
    [
        {"truncation": {"max_length": 8, "stride": 0, "strategy": "LongestFirst", "direction": "Right"}},
        {
            "padding": {
                "strategy": {"Fixed": 4096},
                "direction": "Right",
                "pad_to_multiple_of": None,
                "pad_id": 0,
                "pad_type_id": 0,
                "pad_token": "[PAD]",
            }
        },
    ],
    ids=["truncation", "padding"],
)
def test_a_tokenizer_json_s_own_truncation_or_padding_does_not_cut_or_pad_documents(bpe, sample, setting):
    """A tokenizer.json saved with truncation or padding on (a `max_length` left from training) is
    read as transformers' `tokenizer(text)` reads it, whole (was: every document cut to 8 tokens,
    in silence)."""
    raw = json.loads(bpe.to_json())
    text = b"".join(sample)[:2000]
    expected = bpe.encode(text).tolist()
    assert len(expected) > 8
    ids = tokenizer_from_json(json.dumps({**raw, **setting}).encode(), "t.json").encode(text).tolist()
    assert ids == expected
