"""trainer/generations.py: which prompts the evaluation continues, how they are rendered and cut,
and which tokens stop a continuation. tests/integration/test_generations.py generates with real
models through `evaluate_model`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from trainer import generations, pretrained
from trainer.example_model import tiny_llama_folder
from trainer.generations import GenerationError, GenerationSettings
from trainer.storage import LocalStore

SYSTEM = {"role": "system", "content": "You answer with one colour."}
USER = {"role": "user", "content": "What comes after red?"}
ANSWER = {"role": "assistant", "content": "After red comes green."}
USER_2 = {"role": "user", "content": "And after green?"}
ANSWER_2 = {"role": "assistant", "content": "Blue."}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return tiny_llama_folder(tmp_path_factory.mktemp("base") / "tiny-llama")


@pytest.fixture(scope="module")
def tokenizer(folder):
    return generations.load_hf_tokenizer(pretrained.resolve(folder))


def chatml(*messages: dict) -> str:
    """What the tiny model's ChatML template renders, with the generation prompt."""
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + (
        "<|im_start|>assistant\n"
    )


def no_test_prompts(count: int) -> list[str]:
    raise AssertionError("the test split was read although prompts were configured")


# -- which prompts -----------------------------------------------------------------------------


def test_configured_prompts_come_first_at_most_count_of_them_and_the_rest_are_named(tokenizer, caplog):
    settings = GenerationSettings(prompts=("a", "b", "c", "d"), count=2)
    with caplog.at_level(logging.WARNING, logger="kftrain.generations"):
        assert generations.select_prompts(settings, tokenizer, False, no_test_prompts) == ["a", "b"]
        generations.select_prompts(GenerationSettings(prompts=("a", "b"), count=2), tokenizer, False, no_test_prompts)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "generations: data.eval_prompts lists 4 prompts and data.eval_generations is 2: the first 2 are generated "
        "for; raise data.eval_generations for all of them"
    ]


def test_with_chat_data_a_configured_prompt_is_one_user_message(tokenizer):
    settings = GenerationSettings(prompts=("What comes after red?",), count=3)
    assert generations.select_prompts(settings, tokenizer, True, no_test_prompts) == [chatml(USER)]


def test_without_configured_prompts_the_test_split_gives_the_first_count():
    asked: list[int] = []

    def from_test(count: int) -> list[str]:
        asked.append(count)
        return ["first", "second", "third"]

    assert generations.select_prompts(GenerationSettings(count=2), None, False, from_test) == ["first", "second"]
    assert asked == [2]


def test_a_count_of_zero_generates_nothing_and_reads_nothing(folder):
    settings = GenerationSettings(prompts=("a",), count=0)
    assert generations.select_prompts(settings, None, False, no_test_prompts) == []
    # Not even the tokenizer or the model is touched.
    assert generations.prompted({}, pretrained.resolve(folder), settings, lambda tok, n: no_test_prompts(n)) is None


@pytest.mark.parametrize(("chat", "start", "fed"), [(False, "<|endoftext|>", "<|endoftext|>the cat"), (True, "", None)])
def test_a_configured_prompt_begins_as_the_models_documents_did(folder, monkeypatch, chat, start, fed):
    """Text data whose documents began with the tokenizer's beginning-of-text token: a configured
    prompt begins with it too, as transformers' tokenizer and vLLM give it (was: without it, and
    the report's continuation differed from the served model's); the row shows the prompt as
    configured. Chat prompts carry the template's own."""

    seen = []
    monkeypatch.setattr(
        generations.Generator, "complete", lambda self, model, prompt, start="": seen.append(start + prompt) or "x"
    )
    settings = GenerationSettings(prompts=("the cat",), count=1)
    meta = {"hf_config": json.loads((Path(folder) / "config.json").read_text())}
    prompted = generations.prompted(
        meta, pretrained.resolve(folder), settings, no_test_prompts, chat=chat, document_start=start
    )
    rows = prompted.rows(prompted.continue_with(object()), prompted.continue_with(object()))
    assert seen == [fed or chatml({"role": "user", "content": "the cat"})] * 2  # after, then before
    assert rows[0]["prompt"] == (fed or seen[0]).removeprefix(start)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([SYSTEM, USER, ANSWER], chatml(SYSTEM, USER)),
        ([USER, ANSWER], chatml(USER)),
        ([SYSTEM, USER, ANSWER, USER_2, ANSWER_2], chatml(SYSTEM, USER, ANSWER, USER_2)),  # up to the last answer
        ([SYSTEM, USER, ANSWER, USER_2], chatml(SYSTEM, USER)),  # a trailing question has no answer to compare
        ([SYSTEM, USER], None),  # no assistant turn
        ([ANSWER, USER], None),  # nothing before the only answer
        ([], None),
    ],
    ids=["single-turn", "no-system", "multi-turn", "trailing-user", "no-answer", "answer-first", "empty"],
)
def test_a_conversation_prompts_with_what_comes_before_its_last_answer(tokenizer, messages, expected):
    assert generations.chat_prompt(messages, tokenizer) == expected


def test_conversation_prompts_skip_those_without_an_answer_and_stop_at_count(tokenizer):
    conversations = [[SYSTEM, USER], [USER, ANSWER], [SYSTEM], [USER_2, ANSWER_2], [USER, ANSWER]]
    assert generations.conversation_prompts(conversations, tokenizer, 2) == [chatml(USER), chatml(USER_2)]


def test_chat_prompts_need_a_chat_template(tmp_path):
    plain = generations.load_hf_tokenizer(
        pretrained.resolve(tiny_llama_folder(tmp_path / "plain", chat_template=False))
    )
    with pytest.raises(GenerationError, match="no chat template"):
        generations.chat_prompt([USER, ANSWER], plain)


def test_text_prompts_are_the_first_tokens_of_the_first_windows(tokenizer):
    texts = ["What comes after red? After red comes green.", "You answer with one colour. blue"]
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = min(map(len, rows))
    windows = torch.tensor([r[:width] for r in rows] * 2)
    prompts = generations.window_prompts(windows, tokenizer, 2, length=5)
    assert prompts == [tokenizer.decode(r[:5]) for r in rows]
    assert texts[0].startswith(prompts[0]) and texts[1].startswith(prompts[1])


def test_a_format_without_a_prompt_source_gives_none_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="kftrain.generations"):
        assert generations.split_prompts(LocalStore(), "/nowhere", {"format": "some.v1"}, {}, None, 3) == []
    assert "set data.eval_prompts" in caplog.text


# -- tokens in and out -------------------------------------------------------------------------


def test_a_long_prompt_is_cut_from_the_left_to_leave_room_for_the_new_tokens(tokenizer, caplog):
    gen = generations.Generator(tokenizer, 2, 0, new_tokens=4, context=16)
    text = " ".join(["red green blue"] * 20)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    with caplog.at_level(logging.WARNING, logger="kftrain.generations"):
        assert gen.ids(text)[0].tolist() == full[-12:] and gen.continuation(12) == 4
        assert gen.ids("red")[0].tolist() == tokenizer("red", add_special_tokens=False)["input_ids"]
        gen.ids(text)  # encoded again for the base model: not said again
    # Said once, for the prompt that was cut (was: silent).
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"is {len(full)} tokens of the model's context of 16" in said[0]
    assert said[0].endswith(f"of the model's context of 16: its first {len(full) - 12} tokens are left out")
    assert generations.Generator(tokenizer, 2, 0, new_tokens=32).config.max_new_tokens == 32  # context unknown


def test_a_prompt_cut_from_the_left_keeps_the_document_start_before_it(tokenizer):
    """Was: the start mark written before the prompt's text and cut with it, so a long prompt
    lost the beginning-of-text token its model was fine-tuned to read first."""
    gen = generations.Generator(tokenizer, 2, 0, new_tokens=4, context=16)
    text = " ".join(["red green blue"] * 20)
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = tokenizer("<|endoftext|>", add_special_tokens=False)["input_ids"]
    assert len(start) == 1
    assert gen.ids(text, "<|endoftext|>")[0].tolist() == start + full[-11:]
    assert (
        gen.ids("red", "<|endoftext|>")[0].tolist() == start + tokenizer("red", add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize(
    ("prompt_tokens", "kept", "new"),
    [
        (3, 3, 13),  # a short prompt kept whole, the rest of the context new (was: cut to 1 token)
        (8, 8, 8),
        (12, 8, 8),  # a long one keeps what leaves half the context to the continuation
    ],
)
def test_more_new_tokens_than_the_context_holds_keep_the_prompt_and_say_how_many(
    tokenizer, caplog, prompt_tokens, kept, new
):
    """data.eval_new_tokens of the context's length or more: the prompt is not cut to one token
    to make room (its continuation was of that token alone, the same for every prompt); the
    warning says how many new tokens it got (was: 255 where 512 were asked)."""
    tight = generations.Generator(tokenizer, 2, 0, new_tokens=32, context=16)
    text = " ".join(["red green blue"] * 20)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:prompt_tokens]
    prompt = tokenizer.decode(ids)
    with caplog.at_level(logging.WARNING, logger="kftrain.generations"):
        got = tight.ids(prompt)
    assert got.shape[1] == kept and tight.continuation(got.shape[1]) == new
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"it continues for {new} new tokens, not data.eval_new_tokens 32" in said


def test_special_tokens_in_a_prompt_are_parsed_and_none_are_added(tokenizer):
    gen = generations.Generator(tokenizer, 2, 0, new_tokens=4)
    ids = gen.ids(chatml(USER))[0].tolist()
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_end|>")) == 1


def test_a_prompt_of_no_tokens_is_refused(tokenizer):
    with pytest.raises(GenerationError, match="encodes to no tokens"):
        generations.Generator(tokenizer, 2, 0, new_tokens=4).ids("")


@pytest.mark.parametrize(
    ("generation_config", "hf_config", "expected"),
    [
        ({"eos_token_id": [7, 8], "pad_token_id": 9}, {"eos_token_id": 5, "pad_token_id": 6}, ([7, 8], 9)),
        (None, {"eos_token_id": 5, "pad_token_id": 6}, (5, 6)),
        ({"eos_token_id": [7, 8]}, {}, ([7, 8], 0)),  # pad: the tokenizer's (<|endoftext|>)
        ({}, {}, (2, 0)),  # both from the tokenizer (<|im_end|>, <|endoftext|>)
    ],
    ids=["generation-config", "config", "pad-from-tokenizer", "tokenizer"],
)
def test_stop_and_pad_ids_come_from_the_folder_as_transformers_takes_them(
    tmp_path, tokenizer, generation_config, hf_config, expected
):
    if generation_config is not None:
        (tmp_path / pretrained.GENERATION_CONFIG).write_text(json.dumps(generation_config))
    assert generations._stop_ids(pretrained.resolve(str(tmp_path)), hf_config, tokenizer) == expected


def test_pad_falls_back_to_the_first_stop_id(tmp_path):
    class NoPad:
        eos_token_id = None
        pad_token_id = None

    (tmp_path / pretrained.GENERATION_CONFIG).write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert generations._stop_ids(pretrained.resolve(str(tmp_path)), {}, NoPad()) == ([7, 8], 7)


def test_a_broken_generation_config_is_named(tmp_path, tokenizer):
    (tmp_path / pretrained.GENERATION_CONFIG).write_text("{not json")
    with pytest.raises(GenerationError, match="generation_config.json: not valid JSON"):
        generations._stop_ids(pretrained.resolve(str(tmp_path)), {}, tokenizer)


def test_a_folder_without_a_tokenizer_is_named(tmp_path, folder):
    (tmp_path / "config.json").write_bytes((Path(folder) / "config.json").read_bytes())
    with pytest.raises(GenerationError, match="cannot load the folder's tokenizer") as err:
        generations.load_hf_tokenizer(pretrained.resolve(str(tmp_path)))
    assert str(tmp_path) in str(err.value)


def test_settings_come_from_the_config():
    from trainer.config import load_config

    cfg = load_config(
        overrides={"data.eval_prompts": ["Hello", "Bye"], "data.eval_generations": 1, "data.eval_new_tokens": 7}
    )
    assert GenerationSettings.from_config(cfg) == GenerationSettings(prompts=("Hello", "Bye"), count=1, new_tokens=7)


def test_a_model_with_dropout_gives_the_same_greedy_text_in_either_mode_and_keeps_its_mode(tmp_path, tokenizer):
    """Greedy generation and held-out scoring run without dropout, and leave the model's mode as
    it was (was: scoring ended in train mode, and the report's generations of a model with
    dropout, every GPT-2, were random: other text each run than the exported model writes)."""
    from transformers import AutoModelForCausalLM

    from trainer.tasks.pretrained_lm import PretrainedLMTask

    folder = tiny_llama_folder(tmp_path / "dropout")
    config = json.loads(Path(folder, "config.json").read_text())
    Path(folder, "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gen = generations.Generator(tokenizer, tokenizer.eos_token_id, tokenizer.pad_token_id, 12)
    greedy = gen.complete(model, chatml(USER))
    x = torch.arange(40).reshape(2, 20) % config["vocab_size"]
    data = torch.utils.data.TensorDataset(x, x)
    scores = {PretrainedLMTask()._mean_loss(model, data, torch.device("cpu"), 2) for _ in range(2)}
    assert not model.training and len(scores) == 1  # scored without dropout, and left in eval mode
    model.train()
    assert [gen.complete(model, chatml(USER)) for _ in range(3)] == [greedy] * 3
    assert model.training  # its mode is the caller's
