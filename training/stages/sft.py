"""Stage `sft` (`posttrain sft`): supervised fine-tuning on the task set's reference completions.

    posttrain sft --run file:///tmp/runs/r1 --config '{"max_steps": 400}' --set lora.enabled=true

Reads `<run>/taskset/train.parquet`; writes `<run>/sft/model/` (model + tokenizer, loadable with
`training.modeling.models.load_model("<run>/sft", "model")`) and numbered checkpoints under `<run>/sft/checkpoints/`.
Read top to bottom: config, data (tokenise, mask, pack), model, schedule, the training loop with
checkpoint/resume, and the stage entry point.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from training import checkpointing
from training.cli import stage_cli
from training.config import ConfigBase
from training.environments import CodeRepairEnv, step_all
from training.environments.code_repair import mirror_tasks, near_miss
from training.modeling import distributed, models, packed_attention
from training.modeling.chat import ChatSettings, PromptFormat
from training.modeling.chunked_logprobs import final_hidden, output_head, token_logprobs as chunked_token_logprobs
from training.modeling.devices import resolve_device
from training.modeling.lora import LoraSettings, apply_lora
from training.modeling.optimizers import adamw
from training.modeling.packed_attention import PackedSegments, build_segments
from training.modeling.precision import autocast, enable_gradient_checkpointing, resolve_precision
from training.rewards import get_verifier
from training.stage import StageContext
from training.tasksets.distractors import distractor_text
from training.tasksets.schema import Task

STAGE = "sft"


# ----- config -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SFTConfig(ConfigBase):
    """Supervised fine-tuning (stage `sft`).

    seed:              seeds init, data order and dropout; data order at step s is a function of (seed, epoch),
                       so a resumed run sees exactly the batches an uninterrupted one would.
    base_model:        hub id, local folder or s3:// / file:// manifested folder (with `base_model_subdir`);
                       "" = tiny profile: train a tokenizer on the task corpus and build a GPT-2 from `tiny`.
    base_model_subdir: sub-folder of a manifested base_model that holds the model ("model" for a stage output).
    vocab_size:        tiny profile tokenizer size (byte-level BPE, digits split one per token).
    tiny:              tiny profile model shape (training.modeling.models.TinyModelConfig).
    domains:           task domains to train on ([] = all in the train split).
    max_examples:      cap on training examples (0 = all), taken in file order.
    chat:              system prompt and per-domain answer-format instructions (training.modeling.chat.ChatSettings);
                       saved with the model, so RL rounds and evaluation render prompts the same way.
    max_seq_len:       packed row length in tokens. Examples are never cut: an example longer than this is
                       dropped and counted, and the stage fails when more than `max_overlong_share` of the
                       examples are (naming the longest), because a cut answer loses its final line and its EOS.
    max_overlong_share: share of examples allowed over max_seq_len (dropped) before the stage fails.
    long_context_share: extra examples, as a share of the task examples, that repeat a task behind distractor
                       text (other tasks' prompts and references), so the model learns to answer the last
                       question past filler, as evaluation's long-context sweep asks. 0 = none.
    long_context_fractions: distractor lengths of those examples, as fractions of max_seq_len, taken in turn
                       (short to long) and cut to what fits.
    repair_share:      extra examples, as a share of the code tasks, that show a wrong attempt and the code-repair
                       environment's real reply (its visible tests' failure), then the reference: the conversation
                       RL episodes and evaluation's self-repair hold, so the model has seen one before. 0 = none.
    repair_mirrors:    with repair_share, each repair example also gets its mirror: the same prompt with tests
                       that ask for the wrong attempt (its outputs, run in the sandbox), the reference as the
                       failed attempt and the wrong one as the fix. A repair turn then cannot be answered from the
                       prompt alone (a memorised answer is wrong in one of the two): only by reading the attempt
                       and the error, which is what a task specified by its tests asks of a repair.
    packing:           concatenate examples into full rows with a block-diagonal attention mask and positions
                       restarting per example, so no compute is spent on padding and examples never attend to
                       each other ("packing with attention masking", as in Krell et al. 2021, "Efficient
                       Sequence Packing without Cross-contamination").
    packed_attention:  how a packed row keeps its examples apart. "auto": by segments (each example's
                       attention gathered and run with SDPA's causal kernel, no (T, T) mask:
                       training.modeling.packed_attention) where the model takes it, an SDPA model whose probe
                       against the mask passes; else, and with "dense", the block-diagonal mask.
    batch_size:        rows per optimizer step.
    gradient_accumulation_steps: forward/backward passes per optimizer step, each over batch_size / k rows
                       (per rank); the loss is the token mean of the whole step, so k passes train exactly as one
                       does, with 1/k of the activation memory.
    max_steps:         optimizer steps. The tiny profile under-trains a little on purpose so that RL has headroom.
    lr, min_lr_ratio:  peak AdamW learning rate; cosine decay to lr * min_lr_ratio (Loshchilov & Hutter 2017,
                       SGDR) after `warmup_steps` of linear warm-up (Goyal et al. 2017). 1.0 = constant LR
                       (the tiny pipeline stops SFT early at constant LR and leaves the rest to RL).
    weight_decay:      AdamW decoupled weight decay (Loshchilov & Hutter 2019), not applied to biases/LayerNorm.
    betas:             AdamW betas.
    grad_clip:         max global gradient L2 norm (Pascanu et al. 2013); 0 disables.
    checkpoint_every:  save a resumable checkpoint every N steps (0 = only at the end).
    log_every:         step metrics to MLflow every N steps.
    lora:              LoraSettings; off by default (the tiny profile trains from scratch).
    precision:         "auto" (bf16 autocast on CUDA, fp32 on CPU), "fp32" or "bf16" (training.modeling.precision).
    gradient_checkpointing: recompute activations in the backward pass (less memory, ~1/3 more compute).
    logprob_chunk_tokens: the loss takes the output projection's log-softmax this many response tokens at a time
                       (training.modeling.chunked_logprobs), so no (tokens, vocabulary) fp32 logits are kept for
                       the backward; equal to the full path to float rounding. 0 = the full path (as does a head
                       that is not a plain Linear, or a logit transform after it).
    optimizer_offload: keep AdamW's state and an fp32 master copy of the weights in CPU memory
                       (training.modeling.optimizers.CPUOffloadAdamW): the device holds the weights and gradients
                       only, at the cost of a host round trip a step. For full fine-tuning of the 8B tier on one
                       GPU; the same updates as on the device.
    fused_optimizer:   AdamW's fused kernel where torch has one (CPU and CUDA tensors; not FSDP shards): no
                       per-parameter temporaries at the step. False: torch's per-parameter loop, the same updates
                       to float rounding (the tiny profile: its lift figures were measured with it).
    keep_checkpoints:  mid-stage checkpoints kept (the newest N; older ones are deleted once a newer one is
                       complete). The stage's final model is its output and is always kept.
    device:            "cpu", "cuda" or "auto".
    parallel:          under torchrun (N processes): DDP or FSDP, hybrid sharding, the memory check
                       (training.modeling.distributed.ParallelConfig). batch_size stays the global batch: each rank
                       trains on batch_size / N rows of it, so N ranks reach the loss one process does.
    """

    seed: int = 0
    base_model: str = ""
    base_model_subdir: str = ""
    vocab_size: int = 512
    tiny: models.TinyModelConfig = field(default_factory=models.TinyModelConfig)
    domains: list[str] = field(default_factory=list)
    max_examples: int = 0
    chat: ChatSettings = field(default_factory=ChatSettings)
    max_seq_len: int = 128
    max_overlong_share: float = 0.01
    long_context_share: float = 0.0
    long_context_fractions: list[float] = field(default_factory=lambda: [0.1, 0.25, 0.5])
    repair_share: float = 0.0
    repair_mirrors: bool = False
    packing: bool = True
    packed_attention: str = "auto"
    batch_size: int = 16
    gradient_accumulation_steps: int = 1
    max_steps: int = 300
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    log_every: int = 10
    lora: LoraSettings = field(default_factory=LoraSettings)
    precision: str = "auto"
    gradient_checkpointing: bool = False
    logprob_chunk_tokens: int = 256
    optimizer_offload: bool = False
    fused_optimizer: bool = True
    keep_checkpoints: int = 2
    device: str = "auto"
    parallel: distributed.ParallelConfig = field(default_factory=distributed.ParallelConfig)

    def __post_init__(self) -> None:
        if (
            self.long_context_share < 0
            or not self.long_context_fractions
            or any(not 0 < f <= 1 for f in self.long_context_fractions)
        ):
            raise ValueError(
                f"sft: long_context_share must be >= 0 and long_context_fractions in (0, 1], got "
                f"{self.long_context_share} and {self.long_context_fractions}"
            )
        if self.gradient_accumulation_steps < 1:
            raise ValueError(f"sft: gradient_accumulation_steps must be >= 1, got {self.gradient_accumulation_steps}")
        if self.repair_share < 0:
            raise ValueError(f"sft: repair_share must be >= 0, got {self.repair_share}")
        if self.packed_attention not in ("auto", "dense"):
            raise ValueError(f"sft: packed_attention must be 'auto' or 'dense', got {self.packed_attention!r}")


class ExamplesTooLong(ValueError):
    """More SFT examples than allowed do not fit max_seq_len (exit 2: raise max_seq_len or shorten the data)."""


# ----- data: tokenise with a response-only loss mask, then pack ---------------------------------------------
@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is part of the response (predicted and trained on)


def chat_for(settings: ChatSettings, tasks: Sequence[Task]) -> ChatSettings:
    """The chat settings the model is trained and saved with: with `from_verifiers`, each domain the settings
    do not instruct gets its first task's verifier's instruction (when it has one)."""
    if not settings.from_verifiers:
        return settings
    found: dict[str, str] = {}
    for task in tasks:
        if task.domain not in settings.instructions and task.domain not in found:
            found[task.domain] = get_verifier(task.verifier).instruction
    return replace(settings, instructions={**{d: t for d, t in found.items() if t}, **settings.instructions})


def tokenize_example(tokenizer: Any, prompt: str, response: str, max_len: int) -> Example:
    """prompt ids + response ids + EOS, loss on response and EOS only. Prompt and response are tokenised
    separately: that is exactly how generation sees them (prompt ids, then sampled ids)."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids, mask = (p + r)[:max_len], ([0] * len(p) + [1] * len(r))[:max_len]
    return Example(ids, mask)


@dataclass
class Batch:
    input_ids: torch.Tensor  # (N, T)
    loss_mask: torch.Tensor  # (N, T) 1 on tokens whose prediction is trained
    position_ids: torch.Tensor  # (N, T)
    # (N, 1, T, T) bool, block-diagonal causal; with segments the (N, 1, 1, 1) placeholder
    attention_mask: torch.Tensor
    segments: PackedSegments | None = None  # each example attends by itself (training.modeling.packed_attention)

    def to(self, device: torch.device) -> Batch:
        ids, loss, pos, attn = (
            x.to(device) for x in (self.input_ids, self.loss_mask, self.position_ids, self.attention_mask)
        )
        return Batch(ids, loss, pos, attn, None if self.segments is None else self.segments.to(device))


def pack(examples: list[Example], max_len: int, pad_id: int, packing: bool = True) -> list[list[Example]]:
    """Group examples into rows of at most max_len tokens (first fit, order kept); one per row if not packing."""
    if not packing:
        return [[e] for e in examples]
    rows: list[list[Example]] = []
    used = max_len + 1
    for ex in examples:
        if used + len(ex.input_ids) > max_len:
            rows.append([])
            used = 0
        rows[-1].append(ex)
        used += len(ex.input_ids)
    return rows


def collate(rows: list[list[Example]], max_len: int, pad_id: int, attention: str = "dense") -> Batch:
    """Rows of packed examples -> tensors. Padding is on the right with loss 0 and attends only to itself.
    attention "dense": the (N, 1, T, T) block-diagonal mask; "segments": none, each example a segment
    (training.modeling.packed_attention), for a model packed_attention.enable() switched."""
    if attention not in ("dense", "segments"):
        raise ValueError(f"attention must be 'dense' or 'segments', got {attention!r}")
    T = min(max_len, max(sum(len(e.input_ids) for e in row) for row in rows))
    N = len(rows)
    ids = torch.full((N, T), pad_id, dtype=torch.long)  # (N, T)
    loss = torch.zeros((N, T), dtype=torch.long)  # (N, T)
    pos = torch.zeros((N, T), dtype=torch.long)  # (N, T)
    seg = torch.full((N, T), -1, dtype=torch.long)  # (N, T) example index within the row; -1 = padding
    spans: list[list[tuple[list[int], list[int]]]] = []  # per row, each example's positions (attended, owned)
    for i, row in enumerate(rows):
        at, spans_i = 0, []
        for j, ex in enumerate(row):
            n = len(ex.input_ids)
            ids[i, at : at + n] = torch.tensor(ex.input_ids)
            loss[i, at : at + n] = torch.tensor(ex.loss_mask)
            pos[i, at : at + n] = torch.arange(n)
            seg[i, at : at + n] = j
            spans_i.append((list(range(at, at + n)),) * 2)
            at += n
        seg[i, at:] = torch.arange(len(row), len(row) + T - at)  # each pad token its own segment
        spans.append(spans_i)
    if attention == "segments":
        return Batch(ids, loss, pos, packed_attention.mask_placeholder(N, torch.bool), build_segments(spans, T))
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))  # (T, T)
    attn = (seg[:, :, None] == seg[:, None, :]) & causal  # (N, T, T)
    return Batch(ids, loss, pos, attn[:, None])


def response_loss(model: Any, batch: Batch, chunk_tokens: int = 0) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over response tokens. Returns (loss, number of trained tokens).
    With `chunk_tokens` > 0 and a plain output head, only the response positions go through the head, that many
    at a time (training.modeling.chunked_logprobs): no (T, V) logits exist. Equal to the full path to rounding."""
    inputs = packed_attention.forward_inputs(
        model, "an SFT batch", batch.input_ids, batch.position_ids, batch.attention_mask, batch.segments
    )
    targets = batch.input_ids[:, 1:]  # (N, T-1)
    mask = batch.loss_mask[:, 1:]  # (N, T-1) token t+1 is trained when it is a response token
    n = int(mask.sum())
    head = output_head(model) if chunk_tokens > 0 else None
    if head is not None:
        hidden, _ = final_hidden(model, **inputs)  # (N, T, h)
        m = mask.bool()
        logp = chunked_token_logprobs(hidden[:, :-1][m], targets[m], head, 1.0, chunk_tokens)  # (n,)
        return -logp.sum() / max(n, 1), n
    logits = model(**inputs).logits  # (N, T, V)
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none"
    ).view_as(mask)  # (N, T-1)
    return (nll * mask.float()).sum() / max(n, 1), n


# ----- model --------------------------------------------------------------------------------------------------
def build_model(
    cfg: SFTConfig, tasks: list[Task], tokenizer_dir: Path | None = None, dtype: torch.dtype | None = None
) -> tuple[Any, Any]:
    """The model to fine-tune: the tiny profile's (tokenizer trained on the corpus) or `base_model`, + LoRA.
    `dtype` is the storage dtype of the base weights (bf16 only for a frozen LoRA base)."""
    if cfg.base_model:
        model, tokenizer = models.load_model(cfg.base_model, cfg.base_model_subdir, dtype=dtype)
    else:
        tokenizer = None if tokenizer_dir else models.build_tiny_tokenizer(corpus(tasks), cfg.vocab_size)
    if tokenizer_dir is not None:  # resuming: the checkpoint's tokenizer, exactly
        tokenizer = models.load_tokenizer(tokenizer_dir)
    if not cfg.base_model:
        torch.manual_seed(cfg.seed)
        model = models.build_tiny_model(cfg.tiny, tokenizer)
    tokenizer.chat_settings = chat_for(cfg.chat, tasks)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if cfg.packed_attention == "auto":
        packed_attention.enable(model)  # before LoRA wraps it; every rank decides the same (the probe is seeded)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
    return model, tokenizer


def encode_examples(
    fmt: PromptFormat, tasks: list[Task], max_seq_len: int, max_overlong_share: float
) -> tuple[list[Example], list[tuple[str, int]]]:
    """Chat-rendered examples that fit `max_seq_len`, and (task id, length) of those that do not (dropped,
    never cut). Raises ExamplesTooLong, naming the longest, when more than `max_overlong_share` do not fit."""
    kept: list[Example] = []
    over: list[tuple[str, int]] = []
    for task in tasks:
        ex = fmt.sft_example(task)
        if len(ex.input_ids) > max_seq_len:
            over.append((task.id, len(ex.input_ids)))
        else:
            kept.append(Example(ex.input_ids, ex.loss_mask))
    if over and len(over) > max_overlong_share * len(tasks):
        longest = max(over, key=lambda item: item[1])
        raise ExamplesTooLong(
            f"sft: {len(over)} of {len(tasks)} examples ({len(over) / len(tasks):.1%}) are longer than "
            f"max_seq_len={max_seq_len} tokens (allowed: {max_overlong_share:.1%}); the longest is task "
            f"{longest[0]!r} at {longest[1]} tokens. Raise max_seq_len (or max_overlong_share to drop them); "
            f"examples are never truncated, since a cut answer loses its final answer line and its EOS."
        )
    return kept, over


def long_context_examples(
    fmt: PromptFormat, tasks: list[Task], share: float, fractions: list[float], max_seq_len: int, seed: int
) -> list[Example]:
    """round(share * len(tasks)) extra examples: a task (drawn by seed) behind distractors of other tasks, the
    distractor length cycling through `fractions` of max_seq_len, cut to what fits; loss on the answer only."""
    rng = random.Random(f"long-context:{seed}")
    n = min(len(tasks), round(share * len(tasks)))
    out = []
    for j, i in enumerate(rng.sample(range(len(tasks)), n) if n else []):
        base = fmt.sft_example(tasks[i])
        budget = min(int(fractions[j % len(fractions)] * max_seq_len), max_seq_len - len(base.input_ids))
        if budget <= 0:
            continue
        ex = fmt.sft_example(tasks[i], prefix=distractor_text(tasks, rng, fmt.tokenizer, budget))
        if len(ex.input_ids) <= max_seq_len:  # filler tokenized apart can merge differently: never cut, skip
            out.append(Example(ex.input_ids, ex.loss_mask))
    return out


def repair_examples(
    fmt: PromptFormat, tasks: list[Task], share: float, max_seq_len: int, seed: int, mirrors: bool = False
) -> list[Example]:
    """round(share * n) extra examples over the n code tasks (those with a repair environment): the task, a
    near-miss attempt, the code-repair environment's real reply (its visible tests' failure, exactly what RL
    episodes and evaluation's self-repair show) as the next user turn, then the reference; loss on the reference
    only. Attempts that pass the visible tests are skipped. `mirrors`: each also with its mirror (the same
    prompt, tests asking for the attempt, the reference as the failed attempt: SFTConfig.repair_mirrors)."""
    rng = random.Random(f"repair:{seed}")
    pool = [t for t in tasks if t.verifier == "code"]
    n = min(len(pool), round(share * len(pool)))
    chosen = rng.sample(pool, n) if n else []
    attempts = [near_miss(t.reference, rng) for t in chosen]
    if mirrors:
        mirrored = [(m, t.reference) for m, t in zip(mirror_tasks(chosen, attempts), chosen) if m is not None]
        chosen += [m for m, _ in mirrored]
        attempts += [a for _, a in mirrored]
    steps = step_all([CodeRepairEnv(t) for t in chosen], attempts)
    replies = {i: st.observation for i, st in enumerate(steps) if not st.done and st.observation}
    out = []
    for i, task in enumerate(chosen):
        if i not in replies:  # the attempt passed the visible tests: nothing to repair
            continue
        ex = fmt.sft_example(task, turns=[(attempts[i], replies[i])])
        if len(ex.input_ids) <= max_seq_len:  # never cut: a repair conversation that does not fit is skipped
            out.append(Example(ex.input_ids, ex.loss_mask))
    return out


def corpus(tasks: list[Task]) -> list[str]:
    return [t.prompt for t in tasks] + [t.reference for t in tasks if t.reference]


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up to cfg.lr, then cosine decay to cfg.lr * min_lr_ratio at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# ----- the stage ----------------------------------------------------------------------------------------------
def train(ctx: StageContext) -> dict[str, Any]:
    cfg: SFTConfig = ctx.config  # type: ignore[assignment]
    device = distributed.local_device(resolve_device(cfg.device))
    world = distributed.world_size()
    if cfg.batch_size % world:
        raise ValueError(f"sft: batch_size={cfg.batch_size} does not split over {world} ranks")
    if world > 1 and cfg.lora.enabled and cfg.parallel.strategy == "fsdp":
        raise ValueError("sft: LoRA with parallel.strategy=fsdp is not supported; use ddp (adapters are small)")
    tasks = [t for t in ctx.tasks("train") if t.reference and (not cfg.domains or t.domain in cfg.domains)]
    if cfg.max_examples:
        tasks = tasks[: cfg.max_examples]
    if not tasks:
        raise ValueError("sft: no training examples with a reference completion in the task set")

    # Resume: the last complete checkpoint carries the tokenizer, weights, optimizer, RNG and step.
    state, tok_dir = checkpointing.latest_state(ctx.stage_uri, ctx.workdir)
    compute_dtype = resolve_precision(cfg.precision, device)
    model, tokenizer = build_model(cfg, tasks, tok_dir, dtype=compute_dtype if cfg.lora.enabled else None)
    if state is not None and not state.get("sharded"):  # weights before .to(device): optimizer state beside them
        model.load_state_dict(state["model"])
    check_memory(model, cfg, device, world)
    model.to(device).train()
    trainer = distributed.wrap(model, cfg.parallel, device)  # model itself in a 1-process run
    optimizer = adamw(
        model, cfg.lr, cfg.betas, cfg.weight_decay, offload=cfg.optimizer_offload, fused=cfg.fused_optimizer
    )
    start_step = 0
    if state is not None:
        start_step = checkpointing.restore(state, model, optimizer)
        ctx.progress(f"resumed from checkpoint step {start_step}")
    else:
        checkpointing.seed_everything(cfg.seed)

    if world > 1:  # every rank trained the tiny tokenizer on the same corpus: it must be the same one
        vocab = hashlib.sha256(str(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()
        if len(set(distributed.all_gather(vocab))) != 1:
            raise RuntimeError("sft: the ranks built different tokenizers")
    fmt = PromptFormat(tokenizer, tokenizer.chat_settings, model.generation_config)
    examples, overlong = encode_examples(fmt, tasks, cfg.max_seq_len, cfg.max_overlong_share)
    long_context = (
        long_context_examples(fmt, tasks, cfg.long_context_share, cfg.long_context_fractions, cfg.max_seq_len, cfg.seed)
        if cfg.long_context_share > 0
        else []
    )
    repairs = (
        repair_examples(fmt, tasks, cfg.repair_share, cfg.max_seq_len, cfg.seed, cfg.repair_mirrors)
        if cfg.repair_share > 0
        else []
    )
    examples += long_context + repairs
    ctx.progress(
        f"{len(examples)} examples ({'chat template' if fmt.uses_template else 'plain text'}), "
        f"{len(overlong)} over max_seq_len={cfg.max_seq_len} dropped, "
        f"{len(long_context)} of them behind long-context distractors, {len(repairs)} repairing a "
        f"failed attempt, "
        f"{models.count_parameters(model):,} parameters, precision {compute_dtype}, "
        f"lora={cfg.lora.enabled}, gradient_checkpointing={cfg.gradient_checkpointing}, "
        f"{world} rank(s){' ' + cfg.parallel.strategy if world > 1 else ''}",
        step=start_step,
        examples_overlong=float(len(overlong)),
    )
    # What the model is trained on, as a person would check it: the rendered conversation, loss part marked.
    samples = [
        {
            "text": tokenizer.decode(ex.input_ids),
            "trained": tokenizer.decode([t for t, m in zip(ex.input_ids, ex.loss_mask) if m]),
        }
        for ex in examples[:8]
    ]
    ctx.writer.put_json(samples, "sample_examples.json")
    ctx.mlflow.log_table(samples, "sample_examples.json")

    @functools.lru_cache(maxsize=1)
    def rows_for_epoch(epoch: int) -> list[list[Example]]:
        order = list(range(len(examples)))
        random.Random(cfg.seed * 1_000_003 + epoch).shuffle(order)
        return pack([examples[i] for i in order], cfg.max_seq_len, tokenizer.pad_token_id, cfg.packing)

    steps_per_epoch = max(1, len(rows_for_epoch(0)) // cfg.batch_size)
    attention = "segments" if packed_attention.takes_segments(model) else "dense"

    def passes_at(step: int) -> list[Batch]:
        """The batch of step `step`, as `gradient_accumulation_steps` passes: a pure function of (seed, step),
        so a resumed run replays the same data. Under N ranks, this rank's share of it (rows rank, rank+N, ...)."""
        epoch, k = divmod(step, steps_per_epoch)
        rows = distributed.shard(rows_for_epoch(epoch)[k * cfg.batch_size : (k + 1) * cfg.batch_size])
        per = -(-len(rows) // cfg.gradient_accumulation_steps)
        return [
            collate(rows[i : i + per], cfg.max_seq_len, tokenizer.pad_token_id, attention)
            for i in range(0, len(rows), per)
        ]

    t0, tokens_seen, loss_sum, loss_n = time.monotonic(), 0, 0.0, 0
    last_loss = float("nan")
    for step in range(start_step, cfg.max_steps):
        passes = [b.to(device) for b in passes_at(step)]
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        # The step's loss is the token mean over all its passes (and ranks): each pass's mean is weighted by its
        # share of the step's tokens, so k passes give one big batch's gradient (tested). Under N ranks the
        # share is of all ranks' tokens, times N for DDP/FSDP's average.
        counts = [int(b.loss_mask[:, 1:].sum()) for b in passes]
        n_tok = int(distributed.sum_over_ranks(sum(counts))) if world > 1 else sum(counts)
        step_loss = 0.0
        for b, count in zip(passes, counts):
            with autocast(device, compute_dtype):
                loss, _ = response_loss(trainer, b, cfg.logprob_chunk_tokens)
            (loss * (count * world / max(n_tok, 1))).backward()
            step_loss += loss.item() * count
        if world > 1:
            step_loss = distributed.sum_over_ranks(step_loss)
        step_loss /= max(n_tok, 1)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in model.parameters() if p.requires_grad], cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        )
        optimizer.step()
        tokens_seen += n_tok
        loss_sum, loss_n, last_loss = loss_sum + step_loss, loss_n + 1, step_loss
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.max_steps:
            elapsed = time.monotonic() - t0
            # Peak memory is monotone, so logging it every log_every steps loses nothing between logs.
            ctx.progress(
                "train",
                step=done,
                loss=loss_sum / loss_n,
                lr=lr,
                grad_norm=distributed.scalar(grad_norm),
                response_tokens_per_s=tokens_seen / max(elapsed, 1e-9),
                **distributed.peak_memory_metrics(device),
            )
            loss_sum, loss_n = 0.0, 0
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.max_steps:
            checkpointing.save(ctx.stage_uri, done, trainer, optimizer, tokenizer, keep_last=cfg.keep_checkpoints)
            ctx.progress(f"checkpoint step {done}")

    model.eval()
    parameters = models.count_parameters(model)  # DTensor shards report their global size
    final = distributed.gathered_model(trainer, cfg.parallel.weight_sync_bucket_mb)  # None on ranks other than 0
    if final is not None:
        models.save_checkpoint(final, tokenizer, ctx.writer, "model")
    return {
        "steps": cfg.max_steps,
        "final_loss": last_loss,
        "examples": len(examples),
        "examples_overlong_dropped": len(overlong),
        "chat_template": fmt.uses_template,
        "parameters": parameters,
        "resumed_from": start_step,
        "world_size": world,
        "packed_attention": attention,  # "segments" (no (T, T) mask) or "dense"
    }


def check_memory(model: Any, cfg: SFTConfig, device: torch.device, world: int) -> None:
    """Refuse to start when weights, gradients and AdamW state cannot fit a rank (an estimate; no KV cache)."""
    if not cfg.parallel.memory_check:
        return
    params = list(model.parameters())
    estimate = distributed.estimate_memory(
        sum(p.numel() for p in params),
        sum(p.numel() for p in params if p.requires_grad),
        params[0].element_size(),
        world,
        cfg.parallel.strategy,
    )
    distributed.check_fits(estimate, distributed.device_capacity(device), cfg.parallel.memory_headroom, "sft")


def cli(argv: list[str], prog: str = "posttrain sft") -> int:
    return stage_cli(
        argv,
        prog,
        "Supervised fine-tuning on the task set's reference completions.",
        SFTConfig,
        STAGE,
        train,
        user_errors=(ExamplesTooLong,),
    )
