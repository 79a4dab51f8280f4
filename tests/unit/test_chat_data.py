"""trainer/chat_data.py: chat conversations rendered with a model's template, the loss on the
assistant's tokens only, one padded row per conversation; every bad record named with its line."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer import pretrained
from trainer.chat_data import (
    ROLES,
    ChatEncoder,
    assistant_spans,
    chat_stream,
    conversation,
    label_mask,
    layout_row,
    prepare_chat,
    split_of,
    take_rows,
)
from trainer.config import ConfigError, load_config
from trainer.example_model import CHAT_TEMPLATE, chat_records, tiny_tokenizer, write_chat_jsonl
from trainer.shards import DataError, read_shard, split_shards
from trainer.storage import LocalStore
from trainer.tasks.pretrained_lm import CHAT_FORMAT, IGNORE, PretrainedLMTask

pytestmark = pytest.mark.timeout(120)
END = "<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> str:
    """The tiny tokenizer's files as a model folder holds them (no weights: data prep needs none)."""
    path = tmp_path_factory.mktemp("model") / "tiny"
    tokenizer.save_pretrained(path)
    return str(path)


def chat_config(folder: str, source: str, **overrides):
    return load_config(
        overrides={
            "task": "causal_lm",
            "data.format": "chat",
            "data.source": source,
            "model.init_from": folder,
            "model.block_size": 64,
            **overrides,
        }
    )


def prepare(folder: str, source: str, ds: str, **overrides) -> dict:
    cfg = chat_config(folder, source, **overrides)
    return prepare_chat(cfg, LocalStore(), ds, pretrained.resolve(folder))


def labelled_text(tokenizer, tokens: np.ndarray, mask: np.ndarray) -> str:
    """What the loss is computed on, decoded: the labels of a row."""
    _, y = take_rows({"tokens": tokens[None], "mask": mask[None]}, np.array([0]))
    return tokenizer.decode(y[0][y[0] != IGNORE])


def test_an_assistant_turn_of_weight_0_is_context_not_learned(tokenizer):
    """OpenAI's fine-tuning `weight`: 0 keeps the turn out of the loss, 1 is as without one (was: the
    key ignored, every turn learned)."""
    first, second = MULTI_TURN[2], MULTI_TURN[5]
    messages = [*MULTI_TURN[:2], {**first, "weight": 0}, *MULTI_TURN[3:5], {**second, "weight": 1}]
    row = ChatEncoder(tokenizer, 96).encode([("rec", conversation({"messages": messages}, "messages", "rec"))])[0]
    assert labelled_text(tokenizer, row.tokens, row.mask) == second["content"] + END
    assert first["content"] in tokenizer.decode(row.tokens)  # still the later turn's prompt


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({2: {"weight": 2}}, "message 3 has 'weight' 2; as in OpenAI's fine-tuning files, an assistant message may"),
        ({2: {"weight": "0"}}, "message 3 has 'weight' '0'"),
        ({2: {"weight": True}}, "message 3 has 'weight' True"),
        ({1: {"weight": 0}}, "message 2 has 'weight' 0"),  # a user message
        ({2: {"weight": 0}, 5: {"weight": 0}}, "every assistant message has weight 0, so nothing to learn"),
    ],
    ids=["two", "text", "bool", "on-a-user-message", "all-zero"],
)
def test_a_weight_outside_openais_form_is_refused_naming_the_message(change, said):
    messages = [{**m, **change.get(i, {})} for i, m in enumerate(MULTI_TURN)]
    with pytest.raises(DataError, match=re.escape(f"rec: {said}")):
        conversation({"messages": messages}, "messages", "rec")


# -- masking ------------------------------------------------------------------------------------

MULTI_TURN = [
    {"role": "system", "content": "You answer with one colour."},
    {"role": "user", "content": "What comes after red?"},
    {"role": "assistant", "content": "After red comes green."},
    {"role": "user", "content": "And after blue?"},
    {"role": "tool", "content": "lookup: blue -> yellow"},
    {"role": "assistant", "content": "After blue comes yellow."},
]


@pytest.mark.parametrize(
    "messages",
    [
        chat_records(1)[0]["messages"],
        MULTI_TURN,
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
    ],
    ids=["one-turn", "two-turns-and-a-tool", "empty-answer"],
)
def test_the_labelled_tokens_are_exactly_the_assistant_turns_and_their_end_token(tokenizer, messages):
    row = ChatEncoder(tokenizer, 96).encode([("rec", messages)])[0]
    expected = "".join(m["content"] + END for m in messages if m["role"] == "assistant")
    assert labelled_text(tokenizer, row.tokens, row.mask) == expected
    # The whole conversation is in the row, as the template renders it, then padding.
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert tokenizer.decode(row.tokens[:n]) == text
    assert (row.tokens[n:] == tokenizer.pad_token_id).all() and not row.mask[n:].any() and not row.cut


def test_a_huge_message_is_tokenized_only_as_far_as_the_row_reaches(tokenizer, monkeypatch):
    """The row keeps its first block_size + 1 tokens: the tokenizer is given no more text than
    they can span (was: all 40 MB of a message, 17 GB in offsets), and the row is the same."""
    messages = [
        {"role": "user", "content": "What comes after red? " * 20 + "x " * 200_000},
        {"role": "assistant", "content": "After red comes green."},
    ]
    seen = []
    real = tokenizer.__call__

    def counting(texts, **kwargs):
        seen.extend(len(t) for t in texts)
        return real(texts, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, texts, **kw: counting(texts, **kw))
    row = ChatEncoder(tokenizer, 64).encode([("rec", messages)])[0]
    assert seen and max(seen) <= 65 * 64
    assert row.tokens is None and row.cut  # the answer lies past the row: dropped, as before
    short = [{"role": "user", "content": "What comes after red?"}, messages[1]]
    assert ChatEncoder(tokenizer, 64).encode([("rec", short)])[0].tokens is not None


#: The example's ChatML, rendering an assistant's tool calls after its (possibly null) content.
TOOL_TEMPLATE = CHAT_TEMPLATE.replace(
    "message['content'] + '<|im_end|>'",
    "(message['content'] or '') + tool_text(message) + '<|im_end|>'",
).replace(
    "{% for message in messages %}",
    "{% macro tool_text(m) %}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}"
    "{{ '<call>' + c.function.name + ' ' + (c.function.arguments | tojson) + '</call>' }}{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% for message in messages %}",
)
TOOL_TURN = [
    {"role": "user", "content": "What comes after blue?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "next_colour", "arguments": '{"c": "blue"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "yellow"},
    {"role": "assistant", "content": "Yellow."},
]


def test_null_or_empty_tool_calls_are_no_calls():
    """Exports write `"tool_calls": null` (or `[]`) on every message: no call, not an error."""
    messages = [
        {"role": "user", "content": "hi", "tool_calls": None},
        {"role": "assistant", "content": "yo", "tool_calls": []},
    ]
    assert conversation({"messages": messages}, "messages", "rec") == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
    ]


@pytest.mark.parametrize(
    ("template", "refused"),
    [
        (TOOL_TEMPLATE, None),
        (
            TOOL_TEMPLATE.replace("tool_text(message)", "''"),
            re.escape("does not render the tool calls of assistant turn 1 (message 2: the turn renders the same"),
        ),
        (CHAT_TEMPLATE, re.escape("the model's chat template refused the conversation (")),
    ],
    ids=["renders-calls", "drops-calls", "fails-on-null"],
)
def test_an_assistant_tool_call_is_learned_where_the_template_renders_it(template, refused):
    """OpenAI's tool-call turn (`content: null` beside `tool_calls`) was refused as a message
    without content. It is taken as the template renders it: its calls are the assistant's
    tokens; a template that drops them, or fails on the null, is named."""
    tok = tiny_tokenizer()
    tok.chat_template = template
    messages = conversation({"messages": TOOL_TURN}, "messages", "rec")  # as data prep reads them
    if refused is not None:
        with pytest.raises(DataError, match=f"^rec: .*{refused}"):
            ChatEncoder(tok, 128).encode([("rec", messages)])
        return
    row = ChatEncoder(tok, 128).encode([("rec", messages)])[0]
    # OpenAI's arguments (a JSON string) reach the template as the object they hold.
    assert labelled_text(tok, row.tokens, row.mask) == '<call>next_colour {"c": "blue"}</call>' + END + "Yellow." + END


def test_the_spans_come_from_the_rendering_not_the_record(folder, tmp_path, tokenizer):
    shouting = with_template(
        folder, tmp_path, CHAT_TEMPLATE.replace("message['content']", "message['content'] | upper")
    )
    from transformers import AutoTokenizer

    row = ChatEncoder(AutoTokenizer.from_pretrained(shouting), 400).encode([("rec", MULTI_TURN)])[0]
    assert labelled_text(tokenizer, row.tokens, row.mask) == f"AFTER RED COMES GREEN.{END}AFTER BLUE COMES YELLOW.{END}"


def test_the_loss_counts_only_the_assistant_tokens(tokenizer):
    row = ChatEncoder(tokenizer, 64).encode([("rec", MULTI_TURN)])[0]
    x, y = take_rows({"tokens": row.tokens[None], "mask": row.mask[None]}, np.array([0]))
    assert torch.equal(x[0], torch.from_numpy(row.tokens[:-1]))  # the input: the row but its last token
    counted = y[0] != IGNORE
    assert torch.equal(y[0][counted], torch.from_numpy(row.tokens[1:])[counted])  # the next tokens
    assert int(counted.sum()) == int(row.mask[1:].sum())


def render_with(turn: str, prompt: str, rewrite_past: bool = False):
    """A toy template: `<role>content` per message, `prompt` as the generation prompt, each
    assistant turn written `turn.format(content)`; `rewrite_past`: earlier assistant turns lose
    their content once later messages follow (as templates that drop past reasoning do)."""

    def render(messages, add_generation_prompt):
        out = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                past = rewrite_past and i < len(messages) - 1
                out.append(turn.format("" if past else m["content"]))
            else:
                out.append(f"<{m['role']}>{m['content']}")
        return "".join(out) + (prompt if add_generation_prompt else "")

    return render


TWO_TURNS = [
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "B"},
    {"role": "user", "content": "c"},
    {"role": "assistant", "content": "D"},
]


def test_assistant_spans_are_what_each_turn_adds_to_its_generation_prompt():
    text, spans = assistant_spans(render_with("<assistant>{}</s>\n", "<assistant>"), TWO_TURNS, "rec")
    assert text == "<user>a<assistant>B</s>\n<user>c<assistant>D</s>\n"
    assert [text[a:b] for a, b in spans] == ["B</s>", "D</s>"]  # the newline after the end token is not


@pytest.mark.parametrize(
    ("render", "message"),
    [
        (render_with("[assistant]{}</s>", "<assistant>"), "not a prefix of render\\(messages\\[:i\\+1\\]\\)"),
        (render_with("<assistant>{}</s>", "<assistant>", rewrite_past=True), "differently once later messages"),
    ],
    ids=["turn-does-not-extend-its-prompt", "past-turns-rewritten"],
)
def test_templates_that_break_the_prefix_property_are_refused(render, message):
    with pytest.raises(DataError, match=f"rec: the model's chat template .*{message}"):
        assistant_spans(render, TWO_TURNS, "rec")


@pytest.mark.parametrize(
    ("offsets", "spans", "expected"),
    [
        ([(0, 3), (3, 5), (5, 9), (9, 10)], [(3, 9)], [0, 1, 1, 0]),
        ([(0, 4), (4, 8)], [(3, 5)], [1, 1]),  # a token straddling the span's edge counts
        ([(0, 2), (2, 2), (2, 4)], [(2, 4)], [0, 1, 1]),  # an empty token counts where it stands
        ([(0, 2), (2, 4)], [], [0, 0]),
    ],
)
def test_label_mask_marks_the_tokens_overlapping_a_span(offsets, spans, expected):
    assert label_mask(np.array(offsets), spans, 10).tolist() == expected


# -- layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "mask", "tokens", "row_mask", "cut"),
    [
        ([5, 6, 7], [0, 1, 1], [5, 6, 7, 0, 0], [0, 1, 1, 0, 0], False),  # padded
        ([5, 6, 7, 8, 9], [0, 0, 1, 1, 0], [5, 6, 7, 8, 9], [0, 0, 1, 1, 0], False),  # exactly a row
        ([5, 6, 7, 8, 9, 10, 11], [0, 1, 0, 0, 0, 1, 1], [5, 6, 7, 8, 9], [0, 1, 0, 0, 0], True),  # cut
        ([5, 6, 7, 8, 9, 10], [0, 0, 0, 0, 0, 1], None, None, True),  # the answer is past the row: dropped
        ([5, 6], [1, 0], None, None, False),  # the only assistant token is first: never a label
    ],
    ids=["padded", "exact", "cut", "cut-and-dropped", "nothing-to-predict"],
)
def test_rows_are_padded_cut_or_dropped(ids, mask, tokens, row_mask, cut):
    row = layout_row(np.array(ids), np.array(mask, dtype=np.uint8), block_size=4, pad_id=0)
    assert row.cut == cut
    if tokens is None:
        assert row.tokens is None and row.mask is None
    else:
        assert row.tokens.tolist() == tokens and row.mask.tolist() == row_mask


def test_data_prep_counts_what_it_cut_and_dropped(folder, tmp_path, tokenizer):
    long_answer = {"role": "assistant", "content": "After red comes green. " * 12}
    long_question = {"role": "user", "content": "What comes after red? " * 12}
    records = [r for r in chat_records(60)]
    records += [{"messages": [{"role": "user", "content": "hi"}, long_answer]} for _ in range(20)]
    records += [{"messages": [long_question, {"role": "assistant", "content": "green"}]} for _ in range(20)]
    source = tmp_path / "chat.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    manifest = prepare(folder, str(source), str(tmp_path / "ds"), **{"data.val_fraction": 0.2})
    assert manifest["conversations"] == 100
    assert manifest["cut"] == 20 and manifest["dropped"] == 20  # long answers cut, answers past the row dropped
    assert manifest["rows"] == 80 == sum(s["rows"] for s in manifest["splits"].values())
    tokens, masks = [], []
    for split in ("train", "val", "test"):
        for info in split_shards(manifest, split, str(tmp_path / "ds")):
            arrays = read_shard(LocalStore(), str(tmp_path / "ds"), info)
            assert arrays["tokens"].dtype == np.uint16 and arrays["tokens"].shape[1] == 65
            tokens.append(arrays["tokens"])
            masks.append(arrays["mask"])
    mask = np.concatenate(masks)
    assert int(mask[:, 1:].sum()) == manifest["assistant_tokens"]
    assert mask[:, 1:].any(axis=1).all()  # every row has something to learn


# -- splits and the manifest --------------------------------------------------------------------


def test_splits_are_seeded_and_follow_the_fractions():
    names = [split_of(i, 0, 0.1, 0.2) for i in range(20_000)]
    assert names.count("val") / len(names) == pytest.approx(0.1, abs=0.01)
    assert names.count("test") / len(names) == pytest.approx(0.2, abs=0.01)
    assert names == [split_of(i, 0, 0.1, 0.2) for i in range(20_000)]
    assert names != [split_of(i, 1, 0.1, 0.2) for i in range(20_000)]


def test_data_prep_is_deterministic_and_streams_rows(folder, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 200)
    first = prepare(folder, source, str(tmp_path / "a"), **{"data.shard_rows": 32})
    again = prepare(folder, source, str(tmp_path / "b"), **{"data.shard_rows": 32})
    assert first["splits"] == again["splits"]  # names, sizes and sha256 of every shard
    assert first["format"] == CHAT_FORMAT and first["conversations"] == 200
    assert first["tokenizer"] == {"kind": "pretrained", "vocab_size": 400, "model": folder}
    train = first["splits"]["train"]
    assert [s["items"] for s in train["shards"]][:-1] == [32] * (len(train["shards"]) - 1)
    other_seed = prepare(folder, source, str(tmp_path / "c"), **{"data.seed": 1})
    assert other_seed["splits"]["val"]["rows"] != first["splits"]["val"]["rows"] or (
        other_seed["splits"]["val"]["shards"] != first["splits"]["val"]["shards"]
    )
    items_of, take = chat_stream(chat_config(folder, source), first)
    info = split_shards(first, "train", str(tmp_path / "a"))[0]
    x, y = take(read_shard(LocalStore(), str(tmp_path / "a"), info), np.array([2, 0, 1]))
    assert items_of(info) == 32 and x.shape == y.shape == (3, 64) and x.dtype == y.dtype == torch.int64


def test_the_examples_val_and_test_splits_hold_no_conversation_of_training(folder, tmp_path):
    """The example's conversations are each its own, so its held-out splits measure the rule, not
    conversations met in training (was: 600 records of 8 conversations, the same in every split)."""
    ds = str(tmp_path / "ds")
    manifest = prepare(folder, write_chat_jsonl(tmp_path / "chat.jsonl", 600), ds)
    rows = {}
    for split in ("train", "val", "test"):
        arrays = [read_shard(LocalStore(), ds, info)["tokens"] for info in split_shards(manifest, split, ds)]
        rows[split] = {row.tobytes() for row in np.concatenate(arrays)}
    assert all(rows.values()) and not (rows["train"] & rows["val"]) and not (rows["train"] & rows["test"])


def test_max_bytes_takes_whole_records_only_and_says_so(folder, tmp_path, caplog):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 200)
    lines = Path(source).read_bytes().splitlines(keepends=True)
    limit = sum(len(line) for line in lines[:150]) + 10
    with caplog.at_level(logging.WARNING, logger="kftrain.data"):
        manifest = prepare(folder, source, str(tmp_path / "ds"), **{"data.max_bytes": limit})
    assert manifest["conversations"] == 150
    # Said: the causal_lm default takes 4 MB, and a larger source lost the rest in silence.
    assert [r.getMessage() for r in caplog.records] == [
        f"data.max_bytes {limit} reached after 150 conversation(s): the rest of data.source {source} is not used; "
        "set data.max_bytes: 0 to take all of it, or a larger limit"
    ]


def test_a_stream_for_another_block_size_is_refused(folder, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 100)
    manifest = prepare(folder, source, str(tmp_path / "ds"))
    with pytest.raises(DataError, match="prepared with model.block_size 64 .* the training config has 32"):
        chat_stream(chat_config(folder, source, **{"model.block_size": 32}), manifest)


@pytest.mark.parametrize(
    ("records", "overrides", "message"),
    [
        (3, {}, r"the (val|test) split of its 3 conversation\(s\) is empty .*a larger data\.(val|test)_fraction"),
        (
            100,
            {"model.block_size": 8},
            r"the train split .* is empty \(\d+ conversation\(s\) of it were dropped .*model.block_size 8\).*"
            "a larger model.block_size",
        ),
    ],
    ids=["too-few-records", "all-dropped"],
)
def test_an_empty_split_names_the_source_and_the_fix(folder, tmp_path, records, overrides, message):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", records)
    with pytest.raises(DataError, match=f"data.source {source}: {message}"):
        prepare(folder, source, str(tmp_path / "ds"), **overrides)


# -- bad input ----------------------------------------------------------------------------------

GOOD = json.dumps(chat_records(1)[0])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"messages": [', "is not JSON .* one object with a 'messages' list per line"),
        ('["a list"]', "the record is a JSON array, not an object.*one JSON array of records.*jq -c"),
        ("[", r"is not JSON .*; is the file one JSON array of records\? JSON Lines holds one object per line"),
        (
            '{"messages": [{"from": "human", "value": "x"}]}',
            "message 1 has no string 'role' .*ShareGPT's form: write each message as OpenAI's .*'human' as 'user'",
        ),
        ('{"conversations": []}', "no 'messages' field .*; ShareGPT's `conversations` of from/value are written as"),
        ('"text"', "the record is a JSON string, not an object"),
        ('{"conversation": []}', r"no 'messages' field \(data.messages_field\); its keys: \['conversation'\]"),
        ('{"messages": "hello"}', "'messages' is a JSON string, not a list of messages"),
        ('{"messages": ["hello"]}', "message 1 is a JSON string, not an object"),
        ('{"messages": [{"content": "x"}]}', r"message 1 has no string 'role' \(missing\)"),
        (
            '{"messages": [{"role": "user", "content": null}]}',
            r"message 1 has no string 'content' \(a JSON null\); every message needs one \(or, on an assistant",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]}',
            r"message 2 has no string 'content' \(a JSON null\); .* null beside its 'tool_calls'",
        ),
        (
            '{"messages": [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}',
            "message 1: a user message has 'tool_calls'; only an assistant message calls tools",
        ),
        (  # an empty list is no call: the content must then be there
            '{"messages": [{"role": "user", "content": "x"}, '
            '{"role": "assistant", "content": null, "tool_calls": []}]}',
            r"message 2 has no string 'content' \(a JSON null\)",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, '
            '"tool_calls": {"function": {"name": "f"}}}]}',
            "message 2: 'tool_calls' is a JSON object, not a list of calls like",
        ),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null, '
            '"tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}]}',
            "message 2: tool call 1 has no 'function' with a string 'name'",
        ),
        ('{"messages": [{"role": "user", "content": ["x"]}]}', r"message 1 has no string 'content' \(a JSON array\)"),
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}]}',
            "message 2 has role 'bot'; data.format: chat allows " + ", ".join(ROLES),
        ),
        ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant message, so nothing to learn"),
        ('{"messages": []}', "'messages' is an empty list; every record needs its conversation's messages"),
        ('{"messages": [{"role": "assistant", "content": "y"}]}', "starts with an assistant message, answering no"),
        # Its only learned token the turn's end (was: trained in silence to answer nothing).
        (
            '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}',
            "message 2 is an assistant message with empty content, which would teach the model to answer nothing",
        ),
    ],
    ids=[
        "not-json",
        "array",
        "a-pretty-array",
        "sharegpt",
        "sharegpt-record",
        "string",
        "no-messages-field",
        "messages-not-a-list",
        "message-not-an-object",
        "no-role",
        "null-content",
        "null-assistant-content-without-calls",
        "tool-calls-on-a-user-message",
        "null-content-with-empty-tool-calls",
        "tool-calls-not-a-list",
        "tool-call-without-a-name",
        "list-content",
        "unknown-role",
        "no-assistant",
        "no-messages",
        "assistant-first",
        "empty-answer",
    ],
)
def test_a_bad_record_is_named_with_its_object_and_line(folder, tmp_path, line, message):
    source = tmp_path / "chat.jsonl"
    source.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the blank line still counts: the bad one is line 3
    with pytest.raises(DataError, match=f"{source} line 3\\b.*{message}"):
        prepare(folder, str(source), str(tmp_path / "ds"))


def with_template(folder: str, tmp_path: Path, template: str | None) -> str:
    """A copy of the tokenizer folder with another chat template (None: none)."""
    tok = tiny_tokenizer()
    tok.chat_template = template
    out = tmp_path / "other-template"
    tok.save_pretrained(out)
    if template is None:
        assert not (out / "chat_template.jinja").exists()
    return str(out)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda tmp, folder: (folder, "empty.jsonl", b""), "no conversation read .*empty or holds blank lines only"),
        (lambda tmp, folder: (folder, "blank.jsonl", b"\n \n"), "no conversation read"),
        (lambda tmp, folder: (folder, "nothing-here/", None), "no object there and none below it"),
        (
            lambda tmp, folder: (with_template(folder, tmp, None), "chat.jsonl", GOOD.encode()),
            "its tokenizer has no chat template .*data.format: chat needs one",
        ),
        (
            lambda tmp, folder: (str(tmp / "no-files"), "chat.jsonl", GOOD.encode()),
            r"the folder has no tokenizer file \(tokenizer.json",
        ),
        (
            lambda tmp, folder: (
                with_template(folder, tmp, "{{ raise_exception('roles must alternate') }}"),
                "chat.jsonl",
                GOOD.encode(),
            ),
            "line 1: the model's chat template refused the conversation .*roles must alternate",
        ),
    ],
    ids=["empty-object", "blank-lines", "empty-prefix", "no-chat-template", "no-tokenizer", "template-raises"],
)
def test_bad_sources_and_models_are_named(folder, tmp_path, setup, message):
    (tmp_path / "no-files").mkdir()
    model, name, data = setup(tmp_path, folder)
    if data is not None:
        (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=message):
        prepare(model, str(tmp_path / name), str(tmp_path / "ds"))


def test_a_first_record_past_max_bytes_says_so(folder, tmp_path):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 5)
    with pytest.raises(DataError, match="its first record is longer than data.max_bytes 20; raise data.max_bytes"):
        prepare(folder, source, str(tmp_path / "ds"), **{"data.max_bytes": 20})


# -- validation and evaluation --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def test_evaluation_scores_the_assistant_tokens_of_the_test_split(folder, tmp_path, tiny_model):
    source = write_chat_jsonl(tmp_path / "chat.jsonl", 200)
    ds = str(tmp_path / "ds")
    manifest = prepare(folder, source, ds)
    task = PretrainedLMTask()
    report = task.held_out_loss(tiny_model, {"data_format": CHAT_FORMAT}, LocalStore(), ds, 16)
    x, y = take_rows(read_shard(LocalStore(), ds, split_shards(manifest, "test", ds)[0]), np.arange(16))
    with torch.no_grad():
        logits = tiny_model(input_ids=x).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
    assert report["test_rows"] == 16 and report["test_tokens"] == int((y != IGNORE).sum())
    assert report["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert report["perplexity"] == pytest.approx(math.exp(report["loss"]))
    # Validation weighs every labelled token alike, whatever the batch size.
    val = torch.utils.data.TensorDataset(x, y)
    assert task.validate(tiny_model, val, torch.device("cpu"), 3)["val_loss"] == pytest.approx(report["loss"], rel=1e-5)


@pytest.mark.parametrize("source", ["", "python-stdlib"])
def test_chat_data_needs_a_source_of_its_own(folder, tmp_path, source):
    # The built-in plain-text source: refused with the config, before any step (was: in data prep).
    with pytest.raises(ConfigError, match="data.format: reads JSON Lines records, and the built-in 'python-stdlib'"):
        prepare(folder, source, str(tmp_path / "ds"))
