"""What a fine-tuned language model writes for a few fixed prompts, beside what its base model
writes for the same prompts: the evaluation report's side-by-side view of the fine-tune.

Both models continue each prompt greedily (the most likely token each step, no sampling), so
the text is the same on every run and a difference between the columns is the fine-tune's
doing. The base model costs no second copy for LoRA (the same peft model with its adapters
switched off); a full fine-tune's base is built again from the base folder recorded in the
model's metadata. Text is encoded and decoded with the base folder's own tokenizer
(transformers), the one data prep used.

The prompts are `data.eval_prompts` (with chat data, each one user message in the chat
template), or else the first ones of the test split, from the function `PROMPT_SOURCES` holds
for the dataset's format: for text, the first `PROMPT_TOKENS` tokens of a window. A
conversation's prompt is its messages up to its last assistant turn, rendered with the chat
template and a generation prompt (:func:`conversation_prompts`); chat data's entry in
`PROMPT_SOURCES` comes with a reader of its test split's conversations.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import pretrained
from trainer.chat_data import CHAT_FORMAT, IGNORE, evaluation_rows
from trainer.shards import TOKENS_FORMAT, split_shards
from trainer.storage import ObjectStore, join_uri
from trainer.streaming import first_items
from trainer.tasks.base import evaluating
from trainer.tasks.causal_lm import _window_batch, _windows

log = logging.getLogger("kftrain.generations")

#: Text data: a test prompt is this many tokens from the start of a window (at most the window).
PROMPT_TOKENS = 32
#: The fields of one generation in the evaluation report.
FIELDS = ("prompt", "before", "after")

Messages = Sequence[dict[str, Any]]


class GenerationError(pretrained.PretrainedError):
    """Generations cannot be made; the message names the object or field and the fix."""


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """What the evaluation generates: from `data.eval_prompts`, `data.eval_generations` and
    `data.eval_new_tokens`."""

    prompts: tuple[str, ...] = ()
    """Prompts to continue; empty: the first ones of the test split."""
    count: int = 3
    """At most this many prompts (0: no generations)."""
    new_tokens: int = 32
    """At most this many new tokens per continuation."""

    @classmethod
    def from_config(cls, cfg: Any) -> GenerationSettings:
        """The settings of a :class:`trainer.config.Config`."""
        d = cfg.data
        return cls(prompts=tuple(d.eval_prompts), count=d.eval_generations, new_tokens=d.eval_new_tokens)


# -- the tokenizer -------------------------------------------------------------------------------


def load_hf_tokenizer(source: pretrained.ModelSource, trust_remote_code: bool = False):
    """The base folder's tokenizer as transformers loads it, from its tokenizer files (and
    config.json, and its own code under `trust_remote_code`) copied out of the store into a
    temporary folder."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory(prefix="kftrain-tokenizer-") as tmp:
        folder, _ = pretrained.copy_tokenizer_files(source, Path(tmp))
        try:
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        except Exception as exc:  # transformers raises many kinds for a folder it cannot read
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            raise GenerationError(
                f"model.init_from {source.origin!r}: transformers cannot load the folder's tokenizer "
                f"({type(exc).__name__}: {first_line}); the folder needs tokenizer.json (and tokenizer_config.json)"
            ) from None


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _stop_ids(source: pretrained.ModelSource, hf_config: dict[str, Any], tokenizer) -> tuple[Any, int | None]:
    """The end-of-sequence id(s) and the padding id generation stops and pads with, as
    `from_pretrained(...).generate` would take them: generation_config.json first, then
    config.json, then the tokenizer."""
    generation: dict[str, Any] = {}
    uri = join_uri(source.uri, pretrained.GENERATION_CONFIG)
    if source.store.exists(uri):
        try:
            generation = json.loads(source.store.get_bytes(uri))
        except ValueError as exc:
            raise GenerationError(f"{uri}: not valid JSON ({exc})") from None
    eos = _first(generation.get("eos_token_id"), hf_config.get("eos_token_id"), tokenizer.eos_token_id)
    pad = _first(generation.get("pad_token_id"), hf_config.get("pad_token_id"), tokenizer.pad_token_id)
    if pad is None and eos is not None:
        pad = eos[0] if isinstance(eos, list) else eos
    return eos, pad


# -- prompts -------------------------------------------------------------------------------------


def render_chat(messages: Messages, tokenizer) -> str:
    """`messages` rendered with the tokenizer's chat template, ready for the assistant's turn."""
    if not getattr(tokenizer, "chat_template", None):
        raise GenerationError(
            "the base model's tokenizer has no chat template, so chat prompts cannot be rendered; use a model "
            "with one (tokenizer_config.json chat_template or chat_template.jinja)"
        )
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def chat_prompt(messages: Messages, tokenizer) -> str | None:
    """A conversation's prompt: its messages before the last assistant turn, rendered with the
    chat template and the generation prompt. None when no assistant turn follows a message."""
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        return None
    last = len(roles) - 1 - roles[::-1].index("assistant")
    return render_chat(messages[:last], tokenizer) if last > 0 else None


def conversation_prompts(conversations: Sequence[Messages], tokenizer, count: int) -> list[str]:
    """The prompts of the first `count` conversations that have one (:func:`chat_prompt`)."""
    out: list[str] = []
    for messages in conversations:
        if len(out) >= count:
            break
        prompt = chat_prompt(messages, tokenizer)
        if prompt is not None:
            out.append(prompt)
    return out


def window_prompts(windows: torch.Tensor, tokenizer, count: int, length: int = PROMPT_TOKENS) -> list[str]:
    """Text prompts: the first `length` tokens of each of the first `count` windows, decoded
    (special tokens kept: they are part of the text the model saw)."""
    return [tokenizer.decode(row[:length].tolist(), skip_special_tokens=False) for row in windows[:count]]


def configured_prompts(prompts: Sequence[str], tokenizer, chat: bool, count: int) -> list[str]:
    """The first `count` configured prompts; with chat data each is one user message rendered
    with the chat template, as the model was fine-tuned to read it."""
    chosen = list(prompts)[:count]
    return [render_chat([{"role": "user", "content": p}], tokenizer) for p in chosen] if chat else chosen


def _token_prompts(
    store: ObjectStore, dataset_uri: str, manifest: dict[str, Any], meta: dict[str, Any], tokenizer, count: int
) -> list[str]:
    """Text data (token windows): the first tokens of the first windows of the test split."""
    block = meta["architecture"]["block_size"]
    shards = split_shards(manifest, "test", dataset_uri)
    x, _y = first_items(
        store, dataset_uri, shards, lambda i: _windows(i, block), lambda t, i: _window_batch(t, i, block), count
    )
    return window_prompts(x, tokenizer, count, min(PROMPT_TOKENS, block))


def _chat_prompts(
    store: ObjectStore, dataset_uri: str, manifest: dict[str, Any], meta: dict[str, Any], tokenizer, count: int
) -> list[str]:
    """Chat data: each of the first test conversations up to its first assistant answer, i.e.
    the rendered prompt with the generation prompt, decoded from the row's own tokens."""
    x, y = evaluation_rows(store, dataset_uri, count)
    prompts = []
    for ids, labels in zip(x, y, strict=True):
        answer = (labels != IGNORE).nonzero()
        if len(answer):  # labels[i] is the token after ids[i]: the prompt is ids[: i + 1]
            prompts.append(tokenizer.decode(ids[: int(answer[0]) + 1].tolist(), skip_special_tokens=False))
    return prompts


#: A prompt source: (store, dataset URI, manifest, model meta, tokenizer, count) -> prompts.
PromptSource = Callable[[ObjectStore, str, dict[str, Any], dict[str, Any], Any, int], list[str]]
#: The test prompts of each dataset format (its manifest's `format`).
PROMPT_SOURCES: dict[str, PromptSource] = {TOKENS_FORMAT: _token_prompts, CHAT_FORMAT: _chat_prompts}


def split_prompts(
    store: ObjectStore, dataset_uri: str, manifest: dict[str, Any], meta: dict[str, Any], tokenizer, count: int
) -> list[str]:
    """The first `count` prompts of the dataset's test split; none (and a log line saying so)
    for a format without a prompt source."""
    source = PROMPT_SOURCES.get(manifest.get("format", ""))
    if source is None:
        log.info(
            "generations: no prompts are read from a %r test split; set data.eval_prompts to see some",
            manifest.get("format"),
        )
        return []
    return source(store, dataset_uri, manifest, meta, tokenizer, count)


def select_prompts(
    settings: GenerationSettings, tokenizer, chat: bool, from_test: Callable[[int], list[str]]
) -> list[str]:
    """The prompts to generate for: the configured ones when there are any, else the first of
    the test split (`from_test(count)`); at most `settings.count`."""
    if settings.count <= 0:
        return []
    if settings.prompts:
        if len(settings.prompts) > settings.count:
            log.warning(
                "generations: data.eval_prompts lists %d prompts and data.eval_generations is %d: the first %d "
                "are generated for; raise data.eval_generations for all of them",
                len(settings.prompts),
                settings.count,
                settings.count,
            )
        return configured_prompts(settings.prompts, tokenizer, chat, settings.count)
    return from_test(settings.count)[: settings.count]


# -- generation ----------------------------------------------------------------------------------


@contextmanager
def base_model(model: nn.Module, meta: dict[str, Any], source: pretrained.ModelSource) -> Iterator[nn.Module]:
    """The model before fine-tuning: a LoRA model with its adapters switched off (no copy), or
    for a full fine-tune the base folder's weights in a second model."""
    if meta.get("method") == "lora":
        with model.disable_adapter():
            yield model
        return
    base = pretrained.build_on_meta(meta["hf_config"], torch.float32, source)
    pretrained.give_storage(base, torch.device("cpu"), pretrained.buffers_of(base))
    left = pretrained.load_base_weights(base, source, pretrained.tensor_index(source))
    if left:
        raise GenerationError(
            f"model.init_from {source.origin!r}: the base folder lacks {len(left)} tensor(s) of the model "
            f"(e.g. {left[0]!r}); it changed since training"
        )
    yield base.eval()


class Generator:
    """Greedy continuations of text prompts with one tokenizer and one set of stop tokens."""

    def __init__(self, tokenizer, eos: Any, pad: int | None, new_tokens: int, context: int = 0) -> None:
        from transformers import GenerationConfig

        self.tokenizer = tokenizer
        self.warned: set[str] = set()  # the prompts whose cut was said (each is encoded once per model)
        self.new_tokens, self.context = new_tokens, context if context > 1 else 0
        # Prompt and continuation share the model's context: a prompt keeps all of it that leaves
        # room for the continuation, or for half the context where that is shorter (a
        # data.eval_new_tokens of the context's length or more would leave the prompt one token).
        self.room = context - min(new_tokens, context // 2) if self.context else 0
        self.config = GenerationConfig(
            max_new_tokens=self.new_tokens,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            eos_token_id=eos,
            pad_token_id=pad,
        )

    def ids(self, prompt: str, start: str = "") -> torch.Tensor:
        """The prompt's token ids (special tokens written in it are parsed, none are added: data
        prep writes a document's special tokens as text too), after `start`'s (a document's start
        mark, encoded on its own: the prompt is read from its own start, as `tokenizer(prompt)`
        reads it), the prompt cut from the left to fit the context (said once), `start` kept."""
        ids = self.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if ids.shape[1] == 0:
            raise GenerationError(f"the prompt {prompt!r} encodes to no tokens; give prompts with text in them")
        head = (
            self.tokenizer(start, add_special_tokens=False, return_tensors="pt")["input_ids"] if start else ids[:, :0]
        )
        room = self.room - head.shape[1] if self.room else 0
        kept = torch.cat([head, ids[:, -room:] if room and ids.shape[1] > room else ids], dim=1)
        ids = torch.cat([head, ids], dim=1)
        new = self.continuation(kept.shape[1])
        if (kept.shape[1] < ids.shape[1] or new < self.new_tokens) and prompt not in self.warned:
            self.warned.add(prompt)
            cut = ids.shape[1] - kept.shape[1]
            said = [f"its first {cut} tokens are left out"] if cut else []
            if new < self.new_tokens:
                said.append(f"it continues for {new} new tokens, not data.eval_new_tokens {self.new_tokens}")
            log.warning(
                "generations: the prompt %.40r... is %d tokens of the model's context of %d: %s",
                prompt,
                ids.shape[1],
                self.context,
                ", and ".join(said),
            )
        return kept

    def continuation(self, prompt_tokens: int) -> int:
        """How many new tokens a prompt of `prompt_tokens` tokens gets: data.eval_new_tokens, or
        what the model's context leaves."""
        return min(self.new_tokens, self.context - prompt_tokens) if self.context else self.new_tokens

    @torch.no_grad()
    def complete(self, model: nn.Module, prompt: str, start: str = "") -> str:
        """The model's greedy continuation of `prompt` after `start` (:meth:`ids`; new tokens only,
        special tokens dropped)."""
        ids = self.ids(prompt, start)
        with evaluating(model):  # greedy is the same text every time only without dropout
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=self.config,
                max_new_tokens=self.continuation(ids.shape[1]),
            )
        return self.tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


@dataclass(frozen=True)
class Prompted:
    """The prompts the evaluation continues and the generator that continues them, ready for
    each model in turn (the fine-tuned one, then its base)."""

    prompts: list[str]
    generator: Generator
    start: str = ""
    """A document's start mark given to each configured prompt of text data (see :func:`prompted`)."""

    def continue_with(self, model: nn.Module) -> list[str]:
        """`model`'s greedy continuation of each prompt."""
        return [self.generator.complete(model, p, self.start) for p in self.prompts]

    def rows(self, before: list[str], after: list[str]) -> list[dict[str, str]]:
        """`{prompt, before, after}` per prompt: the evaluation report's generations."""
        return [dict(zip(FIELDS, row, strict=True)) for row in zip(self.prompts, before, after, strict=True)]


def prompted(
    meta: dict[str, Any],
    source: pretrained.ModelSource,
    settings: GenerationSettings,
    from_test: Callable[[Any, int], list[str]],
    chat: bool = False,
    document_start: str = "",
) -> Prompted | None:
    """The prompts :func:`select_prompts` picks with the base folder's tokenizer and the
    generator that continues them; None where there are none (`data.eval_generations: 0`, or no
    prompt source). `meta` is what `trainer.model_io.load_model` returns beside the model;
    `from_test(tokenizer, count)`: the test split's first prompts; `chat`: the model was
    fine-tuned on chat data (configured prompts become user messages); `document_start`: the
    special tokens' text each document of text data began with (a Llama tokenizer's
    beginning-of-text, the manifest's `document_marks`), which a configured prompt is given
    too, as the model was fine-tuned to read a text and as transformers' tokenizer and vLLM
    give it."""
    if settings.count <= 0:
        return None
    tokenizer = load_hf_tokenizer(source, meta.get("trust_remote_code", False))
    prompts = select_prompts(settings, tokenizer, chat, lambda count: from_test(tokenizer, count))
    if not prompts:
        return None
    eos, pad = _stop_ids(source, meta["hf_config"], tokenizer)
    gen = Generator(tokenizer, eos, pad, settings.new_tokens, pretrained.context_length(meta["hf_config"]))
    return Prompted(prompts, gen, document_start if settings.prompts and not chat else "")
