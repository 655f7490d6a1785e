"""Real-architecture chat models built from config, with random weights, for tests, benchmarks and GPU checks.

    folder = build_chatml_qwen2(Path("/tmp/qwen2-chat"), corpus, hidden_size=96, num_hidden_layers=2)
    model, tok = training.modeling.models.load_model(str(folder))      # exactly as a user's base_model folder

The folder is what a pretrained chat model's folder looks like: a Qwen2 model, a byte-level BPE tokenizer with
the ChatML template (<|im_start|>role\\n...<|im_end|>\\n), a pad token, and two eos ids in generation_config
(<|im_end|> and <|endoftext|>, as Qwen2.5-Instruct ships). The tokenizer is trained on `corpus`, so nothing is
downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def build_chatml_tokenizer(corpus: Iterable[str], vocab_size: int = 700):
    """A byte-level BPE tokenizer trained on `corpus`, with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        list(corpus),
        trainer=trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(CHATML_SPECIALS),
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", extra_special_tokens=["<|im_start|>"]
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_chatml_qwen2(
    folder: Path,
    corpus: Iterable[str],
    vocab_size: int = 700,
    hidden_size: int = 96,
    intermediate_size: int = 256,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised Qwen2ForCausalLM and its ChatML tokenizer to `folder` (a plain HF folder)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_chatml_tokenizer(corpus, vocab_size)
    im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=endoftext,
        eos_token_id=[im_end, endoftext],
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [im_end, endoftext]
    model.generation_config.pad_token_id = endoftext
    folder = Path(folder)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder
