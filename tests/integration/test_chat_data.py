"""trainer/chat_data.py with `data.num_proc` worker processes: the same dataset as one process."""

from __future__ import annotations

import pytest

from trainer import pretrained
from trainer.chat_data import GROUP, prepare_chat
from trainer.config import load_config
from trainer.example_model import tiny_tokenizer, write_chat_jsonl
from trainer.shards import DataError
from trainer.storage import LocalStore

pytestmark = pytest.mark.timeout(120)


def prepare(folder: str, source: str, ds: str, num_proc: int) -> dict:
    cfg = load_config(
        overrides={
            "task": "causal_lm",
            "data.format": "chat",
            "data.source": source,
            "data.num_proc": num_proc,
            "model.init_from": folder,
            "model.block_size": 64,
            "data.shard_rows": 40,
        }
    )
    return prepare_chat(cfg, LocalStore(), ds, pretrained.resolve(folder))


def test_worker_processes_write_the_same_dataset(tmp_path):
    folder = str(tmp_path / "tiny")
    tiny_tokenizer().save_pretrained(folder)
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 5 * GROUP + 7)  # groups in flight, a partial last one
    one = prepare(folder, source, str(tmp_path / "one"), 1)
    two = prepare(folder, source, str(tmp_path / "two"), 2)
    assert one == two  # every shard's name, size and sha256


def test_a_worker_s_error_names_the_record(tmp_path):
    folder = str(tmp_path / "tiny")
    tok = tiny_tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    tok.save_pretrained(folder)
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 3 * GROUP)
    with pytest.raises(DataError, match="chat.jsonl line 1: the model's chat template refused .*roles must alternate"):
        prepare(folder, source, str(tmp_path / "ds"), 2)
