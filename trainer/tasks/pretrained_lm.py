"""causal_lm from a pretrained Hugging Face model (`model.init_from`): full fine-tuning or LoRA.

The model comes from transformers' Auto classes, built with its parameters on the meta device
and filled by :meth:`PretrainedLMTask.materialize` after sharding, each rank reading only its
own rows (`trainer/pretrained.py`). Data prep tokenizes with the model's own tokenizer: plain
text and JSON Lines as causal_lm does (packed windows, loss on every token), chat data with
the model's chat template (`trainer/chat_data.py`: one conversation per row, the loss on the
assistant's tokens only). The saved model is Hugging Face's own state dict (full), or only the
adapters (LoRA), with the base model's URI in its metadata. Its evaluation adds, to the test
loss, the base model's on the same data and a few prompts continued by the base model and by the
fine-tuned one (`trainer/generations.py`).
"""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer import generations, pretrained
from trainer.chat_data import CHAT_FORMAT, IGNORE, chat_stream, evaluation_rows, load_model_tokenizer, prepare_chat
from trainer.config import Config, LoraConfig
from trainer.pretrained import source_for
from trainer.shards import read_manifest
from trainer.storage import ObjectStore
from trainer.tasks.causal_lm import CausalLMTask, Marks
from trainer.tokenizer import HFTokenizer, Tokenizer

log = logging.getLogger("kftrain.pretrained")


def source_from_meta(meta: dict[str, Any]) -> pretrained.ModelSource:
    """The base model's folder as a saved model's metadata records it. A Hub model is fetched
    again at the commit training used (the training pod's cache is not this pod's; where it is,
    nothing is downloaded)."""
    base = meta["base_model"]
    origin = base["origin"]
    if origin.startswith(pretrained.HF_SCHEME) and base.get("revision"):
        repo, _revision = pretrained.parse_hf_uri(origin)
        origin = f"{pretrained.HF_SCHEME}{repo}@{base['revision']}"
    return pretrained.resolve_saved_base(origin)


def apply_lora(model: nn.Module, lora: dict[str, Any]) -> nn.Module:
    """`model` wrapped by peft with LoRA adapters (built on the meta device like the base): only
    the adapters train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["target_modules"] or None,
        task_type="CAUSAL_LM",
    )
    try:
        # The meta device as the default too: peft makes each adapter's layers with plain
        # `nn.Linear(...)`, which would allocate them for real before they move to meta (a lora.rank
        # of 10**9 asked the pre-flight for 256 GB before its rank check could refuse it).
        with pretrained.parameters_on_meta(), torch.device("meta"), warnings.catch_warnings():
            # peft reads transformers' deprecated alias: a FutureWarning no user can act on.
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            # Notes on what peft settles itself (GPT-2's Conv1D layers) or kftrain already refuses by
            # name (merging an adapter of a tied weight, export.merge_lora): nothing to act on.
            warnings.filterwarnings("ignore", "fan_in_fan_out is set to False", UserWarning)
            warnings.filterwarnings("ignore", "Model has `tie_word_embeddings=True` and a tied layer", UserWarning)
            return get_peft_model(model, peft_config)
    except ValueError as exc:  # peft names the modules it did not find
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # peft may print a module tree below
        raise pretrained.PretrainedError(f"lora.target_modules {lora['target_modules']}: {first}") from None


def adapter_init(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of a LoRA weight, the same on every rank and at every world size: B is
    zero (the adapted model starts as the base), A uniform in +-1/sqrt(fan_in) (peft's
    Kaiming-uniform default), from a generator seeded by the train seed and the name."""
    if ".lora_B." in name or ".lora_embedding_B" in name:
        return torch.zeros(shape)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    bound = 1.0 / max(1, shape[-1]) ** 0.5
    return (torch.rand(shape, generator=gen) * 2 - 1) * bound


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's decoder layers: the longest ModuleList anywhere in it."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


class PretrainedLMTask(CausalLMTask):
    """causal_lm starting from a pretrained Hugging Face model."""

    serving_dynamic_dims = (0, 1)
    #: What the evaluation generates before and after fine-tuning (`data.eval_*`;
    #: `trainer.evaluate.evaluate_model` sets it from the config).
    generation = generations.GenerationSettings()

    def __init__(self) -> None:
        self._pending: tuple[pretrained.ModelSource, dict[str, torch.Tensor], int] | None = None
        self._data_source: pretrained.ModelSource | None = None  # the folder data prep tokenizes with

    # -- data ---------------------------------------------------------------------------------
    def tokenizer(self, cfg: Config) -> Tokenizer:
        source = self._data_source = source_for(cfg, weights=False)
        # The Rust tokenizer transformers builds for the folder, not tokenizer.json as it is:
        # transformers replaces parts of it by the model's type (a qwen2 folder gets Qwen's own
        # pre-tokenizer), and the exported folder is tokenized as transformers loads it.
        with tempfile.TemporaryDirectory(prefix="kftrain-tokenizer-") as tmp:
            backend = load_model_tokenizer(source, Path(tmp), cfg.model.trust_remote_code).backend_tokenizer
        return HFTokenizer(backend, "file", raw=backend.to_str().encode())

    def tokenizer_record(self, cfg: Config, tokenizer: Tokenizer) -> dict[str, Any]:
        # The model's tokenizer files travel with the model (its folder), not in the manifest.
        source = self._data_source or source_for(cfg, weights=False)  # the one `tokenizer` read, when it ran
        return pretrained.tokenizer_record(source, tokenizer.vocab_size)

    def document_marks(self, cfg: Config, tokenizer: Tokenizer) -> Marks:
        """Each document as the model's tokenizer makes one text (transformers' `tokenizer(text)`:
        a Llama tokenizer's beginning-of-text token first), ending in the model's end-of-text
        token (:func:`pretrained.end_token`), so that the model learns where a document ends and
        stops there, as a chat template's end of turn teaches. No end, with a warning, where the
        folder names no such token (or, with a tokenizer of its own code, one it splits: transformers
        adds a declared token tokenizer.json lacks, which the pre-flight refuses)."""
        source = self._data_source or source_for(cfg, weights=False)

        def one_token(text: str) -> bool:
            # Written as text, a mark must read back as its one token (a tokenizer that splits
            # its own special token's text would train on its pieces).
            return len(tokenizer.encode(text.encode())) == 1

        before = tokenizer.specials_before_text()
        if not all(map(one_token, before)):
            log.warning(
                "model.init_from %r: its tokenizer does not read its beginning-of-text %s back as one token; documents "
                "are not begun with it",
                source.origin,
                before,
            )
            before = []
        token = pretrained.end_token(source)
        if not (token and one_token(token)):
            log.warning(
                "model.init_from %r: %s; documents are joined by a line end alone, and the model does not learn "
                "where one ends",
                source.origin,
                f"its end-of-text token {token!r} is not one token of its tokenizer"
                if token
                else "names no end-of-text token (tokenizer_config.json eos_token, config.json eos_token_id)",
            )
            token = ""
        marks = Marks(start="".join(before).encode(), end=token.encode())
        if marks.start or marks.end:
            log.info("each document is tokenized as %s<text>%s, the model's own special tokens", "".join(before), token)
        return marks

    def prepare(self, cfg: Config, store: ObjectStore, dataset_uri: str) -> dict[str, Any]:
        if cfg.data.format == "chat":
            return prepare_chat(cfg, store, dataset_uri, source_for(cfg, weights=False))
        return super().prepare(cfg, store, dataset_uri)

    def stream(self, cfg, manifest):
        if manifest.get("format") == CHAT_FORMAT:
            return chat_stream(cfg, manifest)
        return super().stream(cfg, manifest)

    # -- model --------------------------------------------------------------------------------
    def build_model(self, cfg, manifest):
        source = source_for(cfg, pinned=manifest.get("tokenizer", {}).get("revision", ""))
        config = pretrained.read_config(source, cfg.model.trust_remote_code)
        limit = pretrained.context_length(config)
        if limit and cfg.model.block_size > limit:
            raise pretrained.PretrainedError(
                f"model.block_size {cfg.model.block_size} is longer than the pretrained model's context "
                f"({limit} tokens, config.json); use at most {limit}"
            )
        if manifest["vocab_size"] > config.get("vocab_size", 0):
            raise pretrained.PretrainedError(
                f"the dataset's tokenizer has {manifest['vocab_size']} tokens, the model {config.get('vocab_size')}; "
                "prepare the data again with this model (model.init_from)"
            )
        meta = {
            "architecture": {"block_size": cfg.model.block_size},
            "hf_config": config,
            "base_model": {
                "origin": source.origin,
                "folder": source.uri,
                "revision": source.revision,
                "fingerprint": pretrained.weights_fingerprint(source),
            },
            "method": cfg.train.method,
            # The evaluation loads the base's tokenizer (and its own code, where it has some) again.
            "trust_remote_code": cfg.model.trust_remote_code,
            "tokenizer": manifest.get("tokenizer", {}),
            "vocab_size": config["vocab_size"],
            "data_format": manifest.get("format"),
        }
        if cfg.train.method == "lora":
            meta["lora"] = _lora_dict(cfg.lora)
        model = self._build(meta, _dtype(cfg), source)
        self._pending = (source, pretrained.buffers_of(model), cfg.train.seed)
        return model, meta

    def _build(self, meta: dict[str, Any], dtype: torch.dtype, source: pretrained.ModelSource) -> nn.Module:
        model = pretrained.build_on_meta(meta["hf_config"], dtype, source)
        model.config.use_cache = False  # training and scoring need no KV cache
        if meta.get("method") == "lora":
            model = apply_lora(model, meta["lora"])
        return model

    def materialize(self, model, device):
        if self._pending is None:
            raise RuntimeError("materialize() before build_model()")
        source, buffers, seed = self._pending
        pretrained.give_storage(model, device, buffers)
        index = pretrained.tensor_index(source)
        left = pretrained.load_base_weights(model, source, index)
        init_adapters(model, left, seed, source.origin)

    def model_from_meta(self, meta):
        source = source_from_meta(meta)
        if meta.get("method") == "lora":  # the adapters are only the difference to the base they trained on
            pretrained.check_same_weights(
                source, meta["base_model"].get("fingerprint", ""), "the adapters were trained"
            )
        model = self._build(meta, torch.float32, source)
        self._pending = (source, pretrained.buffers_of(model), 0)
        return model

    def load_weights(self, model, meta, store, weights_uri):
        source, buffers, _seed = self._pending
        pretrained.give_storage(model, torch.device("cpu"), buffers)
        if meta.get("method") == "lora":
            left = pretrained.load_base_weights(model, source, pretrained.tensor_index(source))
            saved = pretrained.ModelSource(weights_uri.rsplit("/", 1)[0], store, weights_uri)
            left = pretrained.load_base_weights(
                model, saved, pretrained.file_index(store, weights_uri), key=lambda name: name, only=set(left)
            )
        else:
            left = pretrained.load_base_weights(
                model, pretrained.ModelSource("", store, weights_uri), pretrained.file_index(store, weights_uri)
            )
        if left:
            raise ValueError(f"{weights_uri}: weights do not match the architecture (missing {sorted(left)[:5]})")

    def shard_units(self, model):
        return decoder_layers(model)

    def loss(self, model, batch):
        summed, tokens = self._token_loss(model, batch)
        return summed / tokens

    def summed_loss(self, model, batch):
        # The tokens the loss counts (chat data's assistant tokens) differ from row to row.
        if type(self).loss is not PretrainedLMTask.loss:  # a subclass's own loss: training uses it
            return None
        return self._token_loss(model, batch)

    def _token_loss(self, model, batch):
        x, y = batch
        logits = model(input_ids=x).logits
        summed = nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=IGNORE, reduction="sum"
        )
        return summed, (y != IGNORE).sum()

    def held_out_loss(self, model, meta, store, dataset_uri, max_items) -> dict[str, Any]:
        """Loss and perplexity on the test split: every token of text data (causal_lm's own), the
        assistant's tokens of chat data."""
        if meta.get("data_format") != CHAT_FORMAT:
            return super().evaluate(model, meta, store, dataset_uri, max_items)
        from torch.utils.data import TensorDataset

        x, y = evaluation_rows(store, dataset_uri, max_items)
        loss = self._mean_loss(model, TensorDataset(x, y), torch.device("cpu"), 8)
        # Loss and perplexity of the assistant's tokens only, as in training.
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "test_tokens": int((y != IGNORE).sum()),
            "test_rows": len(x),
        }

    def flops_per_item(self, model, cfg):
        # 6N per token for a full update (2N forward, 4N backward) over the weights that multiply:
        # an input embedding is a lookup, unless it is tied to the output layer, which multiplies;
        # LoRA skips the weight gradients of the frozen base (about 2N). Plus attention's
        # 12 * layers * width * context, its width the heads' (heads * head_dim, which Qwen3's
        # and Gemma's configs set apart from hidden_size).
        total = sum(p.numel() for p in model.parameters())
        embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
        if embedding is not None and (output is None or output.weight is not embedding.weight):
            total -= embedding.weight.numel()
        hf = getattr(model, "config", None)
        layers = getattr(hf, "num_hidden_layers", 0) or getattr(hf, "n_layer", 0)
        heads = getattr(hf, "num_attention_heads", 0) or getattr(hf, "n_head", 0)
        head_dim = getattr(hf, "head_dim", 0)
        width = heads * head_dim if heads and head_dim else getattr(hf, "hidden_size", 0) or getattr(hf, "n_embd", 0)
        per_param = 4 if cfg.train.method == "lora" else 6
        return float(per_param * total + 12 * layers * width * cfg.model.block_size)

    def evaluate(self, model, meta, store, dataset_uri, max_items):
        """The test loss and perplexity of the fine-tuned model and of its base, on the same rows,
        and the generations before and after. The base is the same model with its adapters off
        (LoRA), or the base folder's weights in a second model (full): built for the generations,
        so a full fine-tune with `data.eval_generations: 0` reports no base measures and holds
        one model, not two."""
        report = self.held_out_loss(model, meta, store, dataset_uri, max_items)
        manifest = read_manifest(store, dataset_uri)
        source = source_from_meta(meta)
        prompted = generations.prompted(
            meta,
            source,
            self.generation,
            lambda tokenizer, count: generations.split_prompts(store, dataset_uri, manifest, meta, tokenizer, count),
            chat=manifest.get("format") == CHAT_FORMAT,
            document_start=(manifest.get("document_marks") or {}).get("start", ""),
        )
        if prompted is None and meta.get("method") != "lora":
            return report
        after = prompted.continue_with(model) if prompted else []
        with generations.base_model(model, meta, source) as base:
            log.info("evaluation: scoring the base model on the same test data, for the report's comparison")
            before_tuning = self.held_out_loss(base, meta, store, dataset_uri, max_items)
            report.update(base_loss=before_tuning["loss"], base_perplexity=before_tuning["perplexity"])
            before = prompted.continue_with(base) if prompted else []
        if prompted:
            report["generations"] = prompted.rows(before, after)
        return report

    def serving_module(self, model, meta):
        return None

    def extra_exports(self, model, meta):
        return {}


def init_adapters(model: nn.Module, names: list[str], seed: int, origin: str) -> None:
    """Initialise the parameters the base folder does not hold: LoRA adapters; anything else is
    a base-model weight missing from the files (an error naming it)."""
    state = model.state_dict(keep_vars=True)
    missing = [n for n in names if ".lora_" not in n]
    if missing:
        raise pretrained.PretrainedError(
            f"model.init_from {origin!r}: the folder's weights lack {len(missing)} tensor(s) the model needs "
            f"(e.g. {pretrained.base_name(missing[0])!r}); the folder is incomplete or of another architecture"
        )
    for name in names:
        tensor = state[name]
        full = adapter_init(name, tuple(tensor.shape), seed).to(tensor.dtype)
        pretrained.fill_tensor(tensor, lambda start, count, f=full: f[start : start + count] if f.dim() else f)


def _lora_dict(lora: LoraConfig) -> dict[str, Any]:
    return {
        "rank": lora.rank,
        "alpha": lora.alpha,
        "dropout": lora.dropout,
        "target_modules": list(lora.target_modules),
    }


def _dtype(cfg: Config) -> torch.dtype:
    """The base weights' dtype: bf16 for a LoRA run on GPUs (the frozen base needs no fp32 master
    copy), else fp32 (mixed precision casts for compute)."""
    if cfg.train.method == "lora" and torch.cuda.is_available() and cfg.train.precision in ("auto", "bf16"):
        return torch.bfloat16
    return torch.float32
