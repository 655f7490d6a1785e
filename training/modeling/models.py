"""Causal LMs and tokenizers: load one from anywhere, or build the tiny profile's from scratch.

    model, tok = load_model("gpt2")                                  # hub id (from_pretrained)
    model, tok = load_model("/models/my-sft")                        # local folder
    model, tok = load_model("s3://posttrain/runs/r1/sft", "model")   # manifested folder (verified fetch)

    tok = build_tiny_tokenizer(texts, vocab_size=512)   # byte-level BPE trained on the task corpus
    model = build_tiny_model(TinyModelConfig(), tok)    # GPT-2 style, ~0.4M params at the defaults

The tiny tokenizer has a chat template (training/modeling/chat.py, TINY_CHAT_TEMPLATE) and role tokens, so the tiny
profile runs the same chat-rendered code path as a pretrained chat model. Each saved model folder carries the
chat settings it was trained with (`chat.json`: system prompt and per-domain instructions), attached to the
loaded tokenizer as `tokenizer.chat_settings`, so every later stage renders prompts the way SFT did.

The tiny tokenizer splits every digit into its own token (a digit pre-tokenizer in front of the byte-level
one): BPE merges of digit strings ("123" as one token) make column arithmetic much harder to learn for a small
model (Nogueira et al. 2021, "Investigating the Limitations of Transformers with Simple Arithmetic Tasks";
LLaMA splits digits for the same reason).
"""

from __future__ import annotations

import atexit
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training import storage
from training.modeling.chat import TINY_CHAT_TEMPLATE, TINY_ROLE_TOKENS, ChatSettings

log = logging.getLogger(__name__)

PAD, EOS = "<pad>", "<eos>"


@dataclass(frozen=True)
class TinyModelConfig:
    """The tiny profile's GPT-2: n_layer/n_head/n_embd as in GPT2Config; n_positions bounds prompt+completion."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    n_positions: int = 128
    dropout: float = 0.0


def build_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `texts`, wrapped as a transformers PreTrainedTokenizerFast.

    `<pad>` is id 0 and `<eos>` id 1; padding side is left (decoder-only batched generation).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, *TINY_ROLE_TOKENS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=None,
        extra_special_tokens=list(TINY_ROLE_TOKENS),
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


CHAT_FILE = "chat.json"


def save_tokenizer(tokenizer: Any, dest: str | Path) -> None:
    """The tokenizer and its chat settings (chat.json) into a local folder."""
    tokenizer.save_pretrained(str(dest))
    settings = getattr(tokenizer, "chat_settings", None)
    if settings is not None:
        (Path(dest) / CHAT_FILE).write_text(json.dumps(asdict(settings), sort_keys=True))


def load_tokenizer(path: str | Path) -> Any:
    """A tokenizer saved by `save_tokenizer` (or any HF tokenizer folder), its chat settings attached."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    _attach_chat_settings(tokenizer, Path(path))
    return tokenizer


def _attach_chat_settings(tokenizer: Any, folder: Path) -> None:
    chat_file = folder / CHAT_FILE
    if chat_file.is_file():
        data = json.loads(chat_file.read_text())
        tokenizer.chat_settings = ChatSettings(
            system_prompt=data.get("system_prompt", ""), instructions=dict(data.get("instructions", {}))
        )


def build_tiny_model(config: TinyModelConfig, tokenizer) -> Any:
    """A randomly initialised GPT2LMHeadModel sized by `config`, vocabulary from `tokenizer`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # GPT-2's tanh-approximated GELU as one fused kernel; "gelu_new" computes the same with five
        # elementwise ops, ~7% of a tiny-model training step on CPU.
        activation_function="gelu_pytorch_tanh",
    )
    model = GPT2LMHeadModel(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def _load_local(path: Path, dtype: Any = None) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(path)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    _fix_special_tokens(model, tokenizer)
    return model, tokenizer


def _fix_special_tokens(model: Any, tokenizer: Any) -> None:
    if tokenizer.pad_token is None:  # most hub causal LMs ship without one
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config.eos_token_id is None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id


def load_model(spec: str, subdir: str = "", dtype: Any = None, cache_dir: str | Path | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a hub id, a local folder, or an `s3://` / `file://` manifested folder.

    For a manifested folder, `subdir` selects the part holding the model (e.g. "model" in a stage output);
    files are fetched with checksum verification into `cache_dir` (by default a temporary folder, kept while
    the process runs because from_pretrained may read lazily, and removed when it exits).
    """
    if spec.startswith(("s3://", "file://")):
        manifest = storage.require_manifest(spec, "model")
        if cache_dir:
            dest = Path(cache_dir)
        else:
            # kept for the process (from_pretrained may read lazily), removed when it exits: a stage loads a
            # model or two per run, and each left behind would be the model's size on the machine's disk
            dest = Path(tempfile.mkdtemp(prefix="posttrain-model-"))
            atexit.register(shutil.rmtree, dest, ignore_errors=True)
        storage.fetch_dir(manifest, subdir, dest)
        log.info("fetched model %s/%s to %s", spec, subdir, dest)
        return _load_local(dest, dtype)
    path = Path(spec)
    if path.exists():
        return _load_local(path / subdir if subdir else path, dtype)
    # A hub id: network access (and HF_TOKEN for gated models) is the caller's business.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec)
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(spec, **kwargs)
    _fix_special_tokens(model, tokenizer)
    return model, tokenizer


def save_pretrained(model: Any, tokenizer: Any, dest: str | Path) -> Path:
    """model + tokenizer into a local folder (safetensors). A peft model is merged first."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(str(dest), safe_serialization=True)
    save_tokenizer(tokenizer, dest)
    return dest


def save_checkpoint(
    model: Any, tokenizer: Any, target: storage.ManifestWriter | str | Path, rel: str = "model"
) -> None:
    """Save to a local folder (`target` a path) or into a manifested folder under `rel` (`target` a writer)."""
    if isinstance(target, storage.ManifestWriter):
        with tempfile.TemporaryDirectory(prefix="posttrain-save-") as tmp:
            save_pretrained(model, tokenizer, tmp)
            target.put_dir(tmp, rel)
    else:
        save_pretrained(model, tokenizer, target)


def count_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def context_limit(model_or_config: Any) -> int | None:
    """The model's position limit (GPT-2's n_positions, max_position_embeddings elsewhere), from a model or its
    config; None when it names none."""
    cfg = getattr(model_or_config, "config", model_or_config)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def prompt_limit(cfg_limit: int, model: Any, max_new_tokens: int) -> int:
    """max_prompt_tokens, or the model's context minus the completion budget when 0."""
    if cfg_limit:
        return cfg_limit
    context = context_limit(model)
    return max(1, int(context) - max_new_tokens) if context else 1 << 30
