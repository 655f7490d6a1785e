"""Memory and step time at reasoning lengths and a real vocabulary: one GRPO update and one SFT step against TRL.

    python benchmarks/long_context.py                         # 2k, 8k and 16k tokens a row, every side
    python benchmarks/long_context.py --lengths 2048 --repeats 2
    python benchmarks/long_context.py --device cuda           # on a GPU (peak CUDA memory beside the RSS)
    python benchmarks/long_context.py --record                # also write the table into docs/results.md

The model is a Qwen2ForCausalLM with random weights at a real vocabulary (V = 151,936, Qwen2.5's), hidden 256,
4 layers, gradient checkpointing on (what the reasoning presets run). Its weights are 0.2 GB; what the step holds
beyond them is the point. Each row is a 256-token prompt and then

- grpo: G = 8 completions of `length` tokens each (one group; beta 0, so no reference forward on either side);
  one update: the loss over every completion, its backward, one AdamW step.
- sft:  one example of `length` tokens (loss on everything after the prompt); one step.

Sides, each in its own process so its peak RSS (ru_maxrss) is its own:

- ours:  training.rl.update.policy_update / training.stages.sft.response_loss with the chunked head
         (logprob_chunk_tokens 256), token-budget micro-batches of one row (max_tokens_per_micro_batch), and
         rows attended by segments (packed_attention auto: training.modeling.packed_attention, no (T, T) mask,
         SDPA's causal kernel), as the stages run a switched model.
- today: the path before this work: the same micro-batches, the full (tokens, V) log-softmax
         (logprob_chunk_tokens 0), GRPO rows padded and SFT's row under its (T, T) block mask.
- trl:   TRL's own loss on the same model and rows. GRPO: GRPOTrainer._compute_loss, one completion per
         micro-batch (its smallest), loss "bnpo" (token mean); SFT: SFTTrainer.compute_loss on the labelled row.
         TRL's generation is not run: both sides update on the same given completions.

Every side uses the stages' AdamW (training.modeling.optimizers: fused where torch has the kernel, so on CPU).
Ours also runs as a stage process does with freed host memory returned (training.modeling.host_memory: glibc's
mmap threshold fixed at 1 MiB); today's and TRL's keep glibc's default, as a TRL process has it.
`--same-allocator` gives every side the stages' setting, for an A/B. Beside the peak, each side's RSS when its
step starts (the libraries, the model, TRL's trainer) is recorded, and the last column compares what the steps
added above it.

A side that runs out of memory reports it: every worker runs under an address-space limit (--memory-limit-gb,
default 22 of the machine's 24) rather than waking the kernel's OOM killer. Step times on a shared machine
wander: `--repeats` runs the sides interleaved and each side's best run counts; every run is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CONFIG = dict(
    vocab_size=151_936,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32_768,
)
PROMPT = 256
GROUP = 8
CHUNK = 256
SIDES = ("ours", "today", "trl")
RESULT = "RESULT "
MMAP_ENV = "POSTTRAIN_MMAP_THRESHOLD"  # training.modeling.host_memory's: 0 turns ours' setting off, for an A/B


def build_model(device: str) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="sdpa"))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).train()


def tokens(n: int, seed: int) -> list[int]:
    import torch

    return torch.randint(10, CONFIG["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ----- workers: one side of one part at one length, in its own process ----------------------------------------
def grpo(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.modeling import packed_attention
    from training.modeling.optimizers import adamw
    from training.rl.config import GRPOConfig
    from training.rl.grpo_batches import micro_batches
    from training.rl.update import policy_update
    from training.rollout import Completion

    model = build_model(a.device)
    prompt = tokens(PROMPT, 0)
    group = [Completion(text="", token_ids=tokens(a.length, 1 + i), finish_reason="length") for i in range(GROUP)]
    adv = torch.linspace(-1, 1, GROUP)
    opt = adamw(model, 1e-6, [0.9, 0.99], 0.0)
    if a.side == "trl":
        return grpo_trl(a, model, opt, prompt, group, adv)
    cfg = GRPOConfig(
        beta=0.0,
        samples_per_prompt=GROUP,
        max_new_tokens=a.length,
        logprob_chunk_tokens=a.chunk if a.side == "ours" else 0,
        max_tokens_per_micro_batch=PROMPT + a.length,
    )
    segments = a.side == "ours" and not a.dense_mask and packed_attention.enable(model)

    class Tok:
        pad_token_id = 0

    mark_start()
    t0 = time.perf_counter()
    chunks = micro_batches(
        Tok(),
        [prompt],
        [group],
        adv,
        torch.device(a.device),
        0,
        packed=segments,  # by segments a row of one completion needs no mask at all
        max_tokens=cfg.max_tokens_per_micro_batch,
        attention="segments" if segments else "dense",
    )
    stats = policy_update(model, None, opt, chunks, cfg)
    sync(a)
    return {"seconds": time.perf_counter() - t0, "loss": stats["loss"], "micro_batches": len(chunks)}


def grpo_trl(a: argparse.Namespace, model: Any, opt: Any, prompt: list[int], group: list[Any], adv: Any) -> dict:
    import tempfile

    import torch
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as out:
        args = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=GROUP,
            num_generations=GROUP,
            max_completion_length=a.length,
            beta=0.0,
            loss_type="bnpo",
            use_vllm=False,
            use_cpu=a.device == "cpu",
            bf16=False,
            report_to="none",
            gradient_checkpointing=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * GROUP}),
            processing_class=_tokenizer(),
        )
        trainer.current_gradient_accumulation_steps = 1  # one completion per micro-batch, summed below
        dev = torch.device(a.device)
        n_tokens = GROUP * a.length
        mark_start()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, c in enumerate(group):
            inputs = {
                "prompt_ids": torch.tensor([prompt], device=dev),
                "prompt_mask": torch.ones(1, PROMPT, dtype=torch.long, device=dev),
                "completion_ids": torch.tensor([c.token_ids], device=dev),
                "completion_mask": torch.ones(1, a.length, dtype=torch.long, device=dev),
                "advantages": adv[i : i + 1].to(dev),
            }
            loss = trainer._compute_loss(trainer.model, inputs) * (a.length / n_tokens)  # token mean over the group
            loss.backward()
            total += float(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(a)
        return {"seconds": time.perf_counter() - t0, "loss": total, "micro_batches": GROUP}


def _tokenizer() -> Any:
    from training.modeling.synthetic_models import build_chatml_tokenizer

    return build_chatml_tokenizer(["a b c d e f g"], vocab_size=300)


def sft(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.modeling import packed_attention
    from training.modeling.optimizers import adamw
    from training.stages.sft import Example, collate, response_loss

    model = build_model(a.device)
    opt = adamw(model, 1e-5, [0.9, 0.95], 0.0)
    ids = tokens(a.length, 0)
    example = Example(ids, [0] * PROMPT + [1] * (a.length - PROMPT))
    segments = a.side == "ours" and not a.dense_mask and packed_attention.enable(model)
    batch = collate([[example]], a.length, 0, "segments" if segments else "dense").to(torch.device(a.device))
    trl_loss = sft_trl(a, model, batch) if a.side == "trl" else None  # the trainer is built before the clock
    mark_start()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    if trl_loss is not None:
        loss = trl_loss()
    else:
        loss, _ = response_loss(model, batch, a.chunk if a.side == "ours" else 0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sync(a)
    return {"seconds": time.perf_counter() - t0, "loss": float(loss)}


def sft_trl(a: argparse.Namespace, model: Any, batch: Any) -> Any:
    """TRL's SFT loss on the labelled row (SFTTrainer.compute_loss), as a closure over a ready trainer."""
    import tempfile

    import torch
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig, SFTTrainer

    labels = batch.input_ids.masked_fill(batch.loss_mask == 0, -100)
    out = tempfile.mkdtemp()
    args = TRLConfig(
        output_dir=out,
        max_length=a.length,
        use_cpu=a.device == "cpu",
        bf16=False,
        report_to="none",
        gradient_checkpointing=True,
        completion_only_loss=False,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": [[1, 2, 3]]}),
        processing_class=_tokenizer(),
    )
    inputs = {"input_ids": batch.input_ids, "attention_mask": torch.ones_like(batch.input_ids), "labels": labels}
    return lambda: trainer.compute_loss(trainer.model, inputs)


START: dict[str, float] = {}


def mark_start() -> None:
    """The RSS now, as the step starts: the libraries, the model and (TRL) the trainer are in it."""
    with open("/proc/self/statm") as f:
        START["rss_mb"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def sync(a: argparse.Namespace) -> None:
    if a.device != "cpu":
        import torch

        torch.cuda.synchronize()


def worker(a: argparse.Namespace) -> None:
    import logging
    import warnings

    if a.side == "ours" or a.same_allocator:
        from training.modeling import host_memory

        host_memory.return_freed_memory()  # as training.stage.run_stage does, before anything is allocated

    import torch
    import transformers

    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    logging.getLogger("posttrain").setLevel(logging.WARNING)
    limit = int(a.memory_limit_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))  # an allocation past it fails instead of the OOM killer
    try:
        out = (grpo if a.part == "grpo" else sft)(a)
    except (MemoryError, RuntimeError) as e:
        if "memory" not in str(e).lower() and not isinstance(e, MemoryError):
            raise
        out = {"error": "out of memory"}
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if "rss_mb" in START:
        out["start_rss_mb"] = START["rss_mb"]
    if a.device != "cpu":
        out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(RESULT + json.dumps(out), flush=True)


# ----- the driver -------------------------------------------------------------------------------------------------
def run_side(a: argparse.Namespace, part: str, side: str, length: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", "--part", part, "--side", side, "--length", str(length)]
    cmd += ["--device", a.device, "--memory-limit-gb", str(a.memory_limit_gb), "--chunk", str(a.chunk)]
    cmd += ["--dense-mask"] if a.dense_mask else []
    cmd += ["--same-allocator"] if a.same_allocator else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}


def table(results: dict[tuple[str, int, str], list[dict[str, Any]]], a: argparse.Namespace) -> str:
    def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in runs if "error" not in r]
        return min(ok, key=lambda r: r["seconds"]) if ok else runs[0]

    def cell(r: dict[str, Any]) -> str:
        if "error" in r:
            return r["error"]
        mem = f"{r['peak_rss_mb']:,.0f} MB" + (f" ({r['peak_cuda_mb']:,.0f} MB CUDA)" if "peak_cuda_mb" in r else "")
        return f"{mem}, {r['seconds']:.1f} s (start {r['start_rss_mb']:,.0f} MB)"

    lines = [
        "| part | tokens a row | ours | today's path | TRL | ours / TRL peak | ours / today's step time "
        "| ours / TRL above the start |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for part in a.parts:
        for length in a.lengths:
            b = {s: best(results[(part, length, s)]) for s in a.sides}
            mem = time_ratio = added = "-"
            if "ours" in b and "trl" in b and "error" not in b["ours"] and "error" not in b["trl"]:
                ours, trl = b["ours"], b["trl"]
                mem = f"{ours['peak_rss_mb'] / trl['peak_rss_mb']:.2f}"
                grown = [r["peak_rss_mb"] - r["start_rss_mb"] for r in (ours, trl)]
                added = f"{grown[0] / grown[1]:.2f}"
            if "ours" in b and "today" in b and "error" not in b["ours"] and "error" not in b["today"]:
                time_ratio = f"{b['ours']['seconds'] / b['today']['seconds']:.2f}"
            cells = [cell(b[s]) if s in b else "not run" for s in SIDES]
            row = f"| {part} | {PROMPT} + {length:,} | {' | '.join(cells)} | {mem} | {time_ratio} | {added} |"
            lines.append(row)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["grpo", "sft"], choices=["grpo", "sft"])
    p.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192, 16384])
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory-limit-gb", type=float, default=22.0)
    p.add_argument("--record", action="store_true", help="write the table into docs/results.md")
    p.add_argument("--chunk", type=int, default=CHUNK, help="ours: logprob_chunk_tokens (default %(default)s)")
    p.add_argument("--dense-mask", action="store_true", help="ours: keep the dense mask (no segments), for an A/B")
    p.add_argument("--same-allocator", action="store_true", help="every side returns freed memory as ours does (A/B)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", help=argparse.SUPPRESS)
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    results: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for part in a.parts:
        for length in a.lengths:
            for r in range(a.repeats):
                for side in a.sides:  # interleaved: ours, today, trl, ours, ...
                    out = run_side(a, part, side, length)
                    results.setdefault((part, length, side), []).append(out)
                    print(f"{part} {length} {side} run {r + 1}: {json.dumps(out)}", flush=True)
    body = table(results, a)
    print(body)
    if a.record:
        from benchmarks.results import record

        note = (
            f"`python benchmarks/long_context.py {' '.join(sys.argv[1:])}`"
            f"{' with POSTTRAIN_MMAP_THRESHOLD=' + os.environ[MMAP_ENV] if MMAP_ENV in os.environ else ''}"
            f" ({a.device}): Qwen2 with random weights, V = 151,936, hidden 256, 4 layers, gradient "
            f"checkpointing; GRPO: one update of {GROUP} completions of the row's length after a {PROMPT}-token "
            f"prompt; SFT: one step of one row. Peak RSS of the whole process (the model, its gradients and AdamW's "
            f"moments are 1.2 GB of it, the libraries 0.4 GB), the RSS as the step starts, and the step's time, "
            f"best of {a.repeats}" + ("; every side with the stages' host-memory setting." if a.same_allocator else ".")
        )
        lengths = ", ".join(f"{n:,}" for n in a.lengths)
        same = "; every side returning freed memory" if a.same_allocator else ""
        same += f"; POSTTRAIN_MMAP_THRESHOLD={os.environ[MMAP_ENV]}" if MMAP_ENV in os.environ else ""
        title = f"Long context at a real vocabulary ({a.device}; {lengths} tokens a row{same})"
        record(title, note + "\n\n" + body)


if __name__ == "__main__":
    main()
