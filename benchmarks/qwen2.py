"""Speed at realistic sizes: GRPO step, rollouts and SFT on the Qwen2 architecture, against TRL and transformers.

    python benchmarks/qwen2.py                                  # every part, sizes 5m,30m, lengths 128,512
    python benchmarks/qwen2.py --quick                          # 5m only, 128 and 512, fewer steps
    python benchmarks/qwen2.py --parts grpo --sizes 30m --lengths 512 --repeats 2
    python benchmarks/qwen2.py --device cuda --quick              # on a GPU (infra/gpu-check.sh runs this)

The models are ChatML Qwen2ForCausalLM with random weights (training/modeling/synthetic_models.py: nothing is
downloaded; speed does not depend on what the weights know) at two sizes, about 5M and 30M parameters, and the
prompts are the tiny task generators' (math, code, extraction), chat-rendered. Three comparisons, each against a
baseline measured in the same run on the same model, prompts, lengths and batch:

- grpo:    samples/s and completion tokens/s of our GRPO step (training.stages.rl_round.Round) against TRL's
           GRPOTrainer (use_vllm=False), rewards from training.rewards.score_tasks on both sides, beta > 0 (a
           reference forward on both), one optimizer step per generation batch; every group trained (our
           dynamic sampling off). Each side runs in its own process, so its peak RSS is its own; ours also
           prints where the step's time goes (training.phases: rollout, reward, prepare, reference, policy
           forward+backward, optimizer, weight sync).
- rollout: tokens/s of our rollout engine (training.rollout.hf, sampling, G samples per prompt) against
           `model.generate(do_sample=True, num_return_sequences=G)` on the same prompts, same batch.
- sft:     trained-sequence tokens/s of our SFT step (training.stages.sft: packed rows, block-diagonal mask) against
           TRL's SFTTrainer with packing, on the same tokenised examples (prompt + reference, loss on the answer).

With random weights a completion rarely draws an end token, so completions run (almost) to the length cap:
the "128" and "512" are the completion lengths. Timings on a shared machine wander, so the sides run
`--repeats` times interleaved (ours, baseline, ours, ...) and each side's best run counts (as `timeit` does:
noise only ever slows a run down); every run's figure is printed too. The first step of every run is a warm-up
and not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Qwen2 shapes (GQA as Qwen2.5 has it: 2 key/value heads); the parameter counts are printed.
SIZES: dict[str, dict[str, int]] = {
    "5m": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
    "30m": dict(
        vocab_size=2048,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=10,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
}
# prompts per step x samples per prompt, and timed steps, per size: 2 CPU cores take ~1 min per 30M/512 step
BATCH = {"5m": (4, 8), "30m": (2, 8)}
GOALS = {"grpo": 3.0, "rollout": 1.5, "sft": 1.2}
RESULT = "RESULT "


def tasks(seed: int = 0) -> list[Any]:
    from training.tasksets.generators import generate

    return (
        generate("math", 600, seed, (1, 2))
        + generate("code", 150, seed, (1, 2))
        + generate("extraction", 150, seed, (1, 2))
    )


def build_models(root: Path, sizes: list[str], max_len: int) -> dict[str, Path]:
    from training.modeling.synthetic_models import build_chatml_qwen2
    from training.stages.sft import corpus

    text = corpus(tasks())
    return {s: build_chatml_qwen2(root / s, text, max_position_embeddings=max_len, **SIZES[s]) for s in sizes}


def quiet() -> None:
    import logging
    import warnings

    import transformers

    warnings.filterwarnings("ignore")  # deprecations inside transformers/TRL
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("posttrain").setLevel(logging.WARNING)


# ----- workers: one side of one comparison, in its own process -----------------------------------------------
def rendered_prompts(fmt: Any, all_tasks: list[Any], n: int, seed: int) -> list[Any]:
    import random

    rng = random.Random(seed)
    return [all_tasks[rng.randrange(len(all_tasks))] for _ in range(n)]


def grpo_ours(a: argparse.Namespace) -> dict[str, Any]:
    import copy

    import torch

    from training.modeling import models
    from training.phases import merge
    from training.rl.config import GRPOConfig
    from training.rl.round import Round

    model, tok = models.load_model(a.folder)
    dev = torch.device(a.device)
    # rollout_engine "auto": the transformers engine on a CPU, vLLM on a GPU where it is installed
    cfg = GRPOConfig(
        prompts_per_step=a.prompts,
        samples_per_prompt=a.k,
        max_new_tokens=a.length,
        temperature=1.0,
        beta=a.beta,
        lr=1e-6,
        dynamic_sampling=False,
        curriculum=False,
        warmup_steps=0,
        device=a.device,
        seed=a.seed,
        checkpoint_every=0,
    )
    ref = copy.deepcopy(model).eval().requires_grad_(False).to(dev)
    rnd = Round.build(cfg, 1, model.to(dev).train(), tok, ref, tasks(a.seed), dev)
    tokens = [0]
    generate = rnd.engine.generate

    def counted(*args: Any, **kw: Any) -> Any:
        groups = generate(*args, **kw)
        tokens[0] += sum(len(c.token_ids) for g in groups for c in g)
        return groups

    rnd.engine.generate = counted
    rnd.step(0)  # warm-up
    seen0, tokens[0], phases = rnd.samples_seen, 0, []
    t0 = time.perf_counter()
    for s in range(1, a.steps + 1):
        rnd.step(s)
        phases.append(dict(rnd.timer.seconds))
    elapsed = time.perf_counter() - t0
    return {
        "samples_s": (rnd.samples_seen - seen0) / elapsed,
        "tokens_s": tokens[0] / elapsed,
        "phases": merge(phases),
        "params": models.count_parameters(model),
        **gpu_peak(a),
    }


def grpo_trl(a: argparse.Namespace) -> dict[str, Any]:
    import random

    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig, GRPOTrainer

    from training.modeling import models
    from training.modeling.chat import PromptFormat
    from training.rewards import score_tasks

    _, tok = models.load_model(a.folder)
    all_tasks = tasks(a.seed)
    fmt = PromptFormat(tok, getattr(tok, "chat_settings", None))

    def reward(prompts: Any, completions: Any, task_index: Any, **_: Any) -> list[float]:
        return score_tasks([all_tasks[i] for i in task_index], list(completions))

    rng = random.Random(a.seed)
    idx = [rng.randrange(len(all_tasks)) for _ in range(a.prompts * (a.steps + 2))]
    # the exact prompt ids ours samples from (chat-rendered), as text: TRL tokenises them back to the same ids
    text = [tok.decode(fmt.prompt_ids(all_tasks[i]), skip_special_tokens=False) for i in idx]
    data = Dataset.from_dict({"prompt": text, "task_index": idx})
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args: Any, **kw: Any) -> None:
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        config = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=a.prompts * a.k,
            num_generations=a.k,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=a.length,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=a.beta,
            learning_rate=1e-6,
            max_steps=a.steps + 1,
            use_vllm=False,
            use_cpu=a.device == "cpu",
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            seed=a.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
            log_completions=False,
        )
        trainer = GRPOTrainer(
            model=a.folder,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h][
            1:
        ]
    elapsed = stamps[-1] - stamps[0]
    timed = len(stamps) - 1  # step 1 is the warm-up
    mean_len = sum(lengths) / max(1, len(lengths))
    return {
        "samples_s": timed * a.prompts * a.k / elapsed,
        "tokens_s": timed * a.prompts * a.k * mean_len / elapsed,
        **gpu_peak(a),
    }


def rollout_pair(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.modeling import models
    from training.modeling.chat import PromptFormat
    from training.rollout.base import left_pad
    from training.rollout.hf import HFRolloutEngine

    model, tok = models.load_model(a.folder)
    model.to(a.device).eval()
    fmt = PromptFormat(tok, getattr(tok, "chat_settings", None), model.generation_config)
    engine = HFRolloutEngine(model, tok, batch_size=a.prompts * a.k, stop_ids=fmt.stop_ids)
    prompts = [fmt.prompt_ids(t) for t in rendered_prompts(fmt, tasks(a.seed), a.prompts * (a.steps + 1), a.seed)]
    batches = [prompts[i * a.prompts : (i + 1) * a.prompts] for i in range(a.steps + 1)]
    stops = set(fmt.stop_ids)

    def ours(batch: list[list[int]], seed: int) -> int:
        groups = engine.generate(batch, a.k, a.length, temperature=1.0, seed=seed)
        return sum(len(c.token_ids) for g in groups for c in g)

    @torch.no_grad()
    def baseline(batch: list[list[int]], seed: int) -> int:
        torch.manual_seed(seed)
        ids, attn = left_pad(batch, tok.pad_token_id)
        ids, attn = ids.to(a.device), attn.to(a.device)
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            num_return_sequences=a.k,
            max_new_tokens=a.length,
            eos_token_id=fmt.stop_ids,
            pad_token_id=tok.pad_token_id,
        )
        n = 0
        for row in out[:, ids.shape[1] :].tolist():  # tokens up to and including the first stop id
            n += next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        return n

    runs: dict[str, list[float]] = {"ours": [], "generate": []}
    for r in range(a.repeats):
        for name, fn in (("ours", ours), ("generate", baseline)):
            fn(batches[0], a.seed)  # warm-up
            t0, n = time.perf_counter(), 0
            for i, b in enumerate(batches[1:]):
                n += fn(b, a.seed + 1000 * r + i)
            runs[name].append(n / (time.perf_counter() - t0))
    return runs


def sft_examples(a: argparse.Namespace, tok: Any) -> list[Any]:
    from training.modeling.chat import PromptFormat
    from training.stages.sft import encode_examples

    # examples up to the row length; several examples fill a packed row (they are ~60-200 tokens each)
    examples, _ = encode_examples(
        PromptFormat(tok, getattr(tok, "chat_settings", None)), [t for t in tasks(a.seed) if t.reference], a.length, 1.0
    )
    return examples


def sft_ours(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.modeling import models
    from training.modeling.optimizers import adamw
    from training.stages.sft import Batch, collate, pack, response_loss

    model, tok = models.load_model(a.folder)
    model.to(a.device).train()
    rows = pack(sft_examples(a, tok), a.length, tok.pad_token_id)
    opt = adamw(model, 1e-5, [0.9, 0.95], 0.01)
    tokens, t0 = 0, 0.0
    for step in range(a.steps + 1):
        if step == 1:  # step 0 is the warm-up
            t0 = time.perf_counter()
        batch = collate(rows[step * a.batch : (step + 1) * a.batch], a.length, tok.pad_token_id)
        batch = Batch(
            *(x.to(a.device) for x in (batch.input_ids, batch.loss_mask, batch.position_ids, batch.attention_mask))
        )
        loss, _ = response_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 0 and a.device != "cpu":
            torch.cuda.synchronize()  # the warm-up's kernels finish before the clock starts
        if step:
            tokens += sum(len(e.input_ids) for row in rows[step * a.batch : (step + 1) * a.batch] for e in row)
    if a.device != "cpu":
        torch.cuda.synchronize()
    return {"tokens_s": tokens / (time.perf_counter() - t0), **gpu_peak(a)}


def sft_trl(a: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig as TRLConfig, SFTTrainer

    from training.modeling import models

    _, tok = models.load_model(a.folder)
    examples = sft_examples(a, tok)
    # already tokenised: TRL trains the very ids ours does, loss on the answer (completion_mask) only
    data = Dataset.from_dict(
        {"input_ids": [e.input_ids for e in examples], "completion_mask": [e.loss_mask for e in examples]}
    )
    stamps: list[tuple[float, int]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, *rest: Any, **kw: Any) -> None:
            stamps.append((time.perf_counter(), int(state.num_input_tokens_seen)))

    with tempfile.TemporaryDirectory() as out:
        config = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=a.batch,
            gradient_accumulation_steps=1,
            packing=True,
            max_length=a.length,
            completion_only_loss=True,
            learning_rate=1e-5,
            max_steps=a.steps + 1,
            use_cpu=a.device == "cpu",
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1000,
            seed=a.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
            include_num_input_tokens_seen="non_padding",
            max_grad_norm=1.0,
            weight_decay=0.01,
            adam_beta2=0.95,
        )
        trainer = SFTTrainer(model=a.folder, args=config, train_dataset=data, processing_class=tok, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    (t0, n0), (t1, n1) = stamps[0], stamps[-1]
    return {"tokens_s": (n1 - n0) / (t1 - t0), **gpu_peak(a)}


def gpu_peak(a: argparse.Namespace) -> dict[str, float]:
    """On a GPU: the side's peak memory through this process's torch allocator, MiB (what a vLLM engine holds in
    a process of its own is not counted); on a CPU, nothing (the driver reads the process's peak RSS)."""
    if a.device == "cpu":
        return {}
    import torch

    return {"gpu_peak_mib": torch.cuda.max_memory_allocated() / 2**20}


WORKERS = {
    "grpo-ours": grpo_ours,
    "grpo-trl": grpo_trl,
    "rollout": rollout_pair,
    "sft-ours": sft_ours,
    "sft-trl": sft_trl,
}


def worker(a: argparse.Namespace) -> int:
    import torch

    quiet()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    print(RESULT + json.dumps(WORKERS[a.worker](a)), flush=True)
    return 0


# ----- the driver ----------------------------------------------------------------------------------------------
def spawn(name: str, folder: Path, length: int, a: argparse.Namespace, **extra: Any) -> tuple[dict[str, Any], float]:
    """Run one worker in a fresh process; (its result, its peak RSS in MiB)."""
    opts = {
        "folder": str(folder),
        "length": length,
        "seed": a.seed,
        "beta": a.beta,
        "threads": a.threads,
        "device": a.device,
        **extra,
    }
    cmd = [sys.executable, __file__, "--worker", name] + [
        x for k, v in opts.items() for x in (f"--{k.replace('_', '-')}", str(v))
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak RSS
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{name} ({folder.name}, {length}) failed with exit {proc.returncode}:\n{out[-3000:]}")
    line = next(x for x in out.splitlines() if x.startswith(RESULT))
    return json.loads(line[len(RESULT) :]), usage.ru_maxrss / 1024  # KiB on Linux


def gpu_note(runs: list[tuple[dict[str, Any], float]]) -> str:
    peaks = [res["gpu_peak_mib"] for res, _ in runs if "gpu_peak_mib" in res]
    return f"  peak GPU {max(peaks):6.0f} MiB" if peaks else ""


def each(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" if v >= 100 else f"{v:.3g}" for v in values)  # 0.47 samples/s, not "0"


def verdict(ratio: float, part: str) -> str:
    return f"goal >= {GOALS[part]:g}x: {'holds' if ratio >= GOALS[part] else 'BELOW GOAL'}"


def bench_grpo(size: str, folder: Path, length: int, a: argparse.Namespace) -> float:
    from training.phases import format_breakdown

    prompts, k = BATCH[size]
    steps = a.steps or (2 if size == "30m" or length > 128 else 4)
    runs: dict[str, list[tuple[dict[str, Any], float]]] = {"ours": [], "trl": []}
    for _ in range(a.repeats):
        runs["ours"].append(spawn("grpo-ours", folder, length, a, prompts=prompts, k=k, steps=steps))
        runs["trl"].append(spawn("grpo-trl", folder, length, a, prompts=prompts, k=k, steps=steps))
    best = {s: max(runs[s], key=lambda r: r[0]["samples_s"]) for s in runs}
    ratio = best["ours"][0]["samples_s"] / best["trl"][0]["samples_s"]
    print(
        f"  grpo  {prompts}x{k} samples/step, {steps} timed steps, beta {a.beta}; samples/s each run: ours "
        f"{each([r[0]['samples_s'] for r in runs['ours']])} | TRL {each([r[0]['samples_s'] for r in runs['trl']])}"
    )
    for side, label in (("ours", "ours (Round.step)      "), ("trl", "TRL GRPOTrainer        ")):
        res, rss = best[side]
        print(
            f"    {label} {res['samples_s']:7.2f} samples/s  {res['tokens_s']:8.0f} tokens/s  "
            f"peak RSS {max(r for _, r in runs[side]):6.0f} MiB{gpu_note(runs[side])}"
        )
    print(f"    ours, where a step goes: {format_breakdown(best['ours'][0]['phases'])}")
    print(f"    ratio grpo ours/TRL: {ratio:.2f}x ({verdict(ratio, 'grpo')})")
    return ratio


def bench_rollout(size: str, folder: Path, length: int, a: argparse.Namespace) -> float:
    prompts, k = BATCH[size]
    steps = a.steps or 2
    runs, _ = spawn("rollout", folder, length, a, prompts=prompts, k=k, steps=steps, repeats=a.repeats)
    ours, gen = max(runs["ours"]), max(runs["generate"])
    print(
        f"  rollout {prompts} prompts x {k} samples, {steps} timed batches; tokens/s each run: ours "
        f"{each(runs['ours'])} | generate {each(runs['generate'])}"
    )
    print(f"    ours (HFRolloutEngine) {ours:8.0f} tokens/s   model.generate {gen:8.0f} tokens/s")
    print(f"    ratio rollout ours/generate: {ours / gen:.2f}x ({verdict(ours / gen, 'rollout')})")
    return ours / gen


def bench_sft(size: str, folder: Path, length: int, a: argparse.Namespace) -> float:
    batch = max(1, 4096 // length)  # ~4k tokens per step at either row length
    steps = a.steps or 4
    runs: dict[str, list[tuple[dict[str, Any], float]]] = {"ours": [], "trl": []}
    for _ in range(a.repeats):
        runs["ours"].append(spawn("sft-ours", folder, length, a, batch=batch, steps=steps))
        runs["trl"].append(spawn("sft-trl", folder, length, a, batch=batch, steps=steps))
    ours, trl = (max(r[0]["tokens_s"] for r in runs[s]) for s in ("ours", "trl"))
    print(
        f"  sft   {batch} packed rows of {length} per step, {steps} timed steps; tokens/s each run: ours "
        f"{each([r[0]['tokens_s'] for r in runs['ours']])} | TRL {each([r[0]['tokens_s'] for r in runs['trl']])}"
    )
    print(
        f"    ours (sft stage step)  {ours:8.0f} tokens/s  peak RSS {max(r for _, r in runs['ours']):6.0f} MiB"
        f"{gpu_note(runs['ours'])}   TRL SFTTrainer (packing) {trl:8.0f} tokens/s  peak RSS "
        f"{max(r for _, r in runs['trl']):6.0f} MiB{gpu_note(runs['trl'])}"
    )
    print(f"    ratio sft ours/TRL: {ours / trl:.2f}x ({verdict(ours / trl, 'sft')})")
    return ours / trl


PARTS = {"grpo": bench_grpo, "rollout": bench_rollout, "sft": bench_sft}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="grpo,rollout,sft", help="comma-separated: grpo, rollout, sft")
    parser.add_argument("--sizes", default="5m,30m", help=f"comma-separated: {', '.join(SIZES)}")
    parser.add_argument("--lengths", default="128,512", help="completion lengths (SFT: packed row lengths)")
    parser.add_argument("--quick", action="store_true", help="5m only, one repeat fewer")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved runs per side; the best counts")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per run (0 = by size and length)")
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--seed", type=int, default=0)
    # On a 2-core machine shared with other work, torch's 2 intra-op threads spin-wait for each other on every
    # small decode op: measured 22 vs 710 rollout tokens/s (5m, 128) at load 8. Both sides get the same setting.
    parser.add_argument("--threads", type=int, default=1, help="torch threads per side (0 = torch's default)")
    # On a GPU ours rolls out with vLLM where it is installed (rollout_engine "auto"); TRL's GRPOTrainer keeps
    # model.generate (use_vllm=False), and the rollout part compares the transformers engine with generate.
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both sides run")
    # worker mode (one side of one comparison, in its own process; used by the driver)
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    for name in ("folder", "length", "prompts", "k", "batch"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        for name in ("length", "prompts", "k", "batch"):
            setattr(a, name, int(getattr(a, name) or 0))
        return worker(a)

    import torch

    sizes, lengths = a.sizes.split(","), [int(x) for x in a.lengths.split(",")]
    if a.quick:
        sizes, a.repeats = ["5m"], max(1, a.repeats - 1)
    parts = a.parts.split(",")
    import trl

    where = torch.cuda.get_device_name(0) if a.device == "cuda" else "CPU"
    print(
        f"Qwen2 random-weight models, {where}, torch threads {a.threads or torch.get_num_threads()} per side, "
        f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}), TRL {trl.__version__}, "
        f"best of {a.repeats} interleaved runs"
    )
    ratios: dict[tuple[str, str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-qwen2-") as root:
        folders = build_models(Path(root), sizes, max(lengths) + 512)
        for size in sizes:
            from transformers import AutoConfig

            c = AutoConfig.from_pretrained(folders[size])
            n = c.vocab_size * c.hidden_size + c.num_hidden_layers * (
                2 * c.hidden_size * c.hidden_size
                + 2 * c.hidden_size * c.hidden_size * c.num_key_value_heads // c.num_attention_heads
                + 3 * c.hidden_size * c.intermediate_size
            )
            print(
                f"== {size}: ~{n / 1e6:.1f}M parameters (hidden {c.hidden_size}, {c.num_hidden_layers} layers, "
                f"vocab {c.vocab_size}, tied embeddings)"
            )
            for length in lengths:
                print(f" -- completion length {length}")
                for part in parts:
                    ratios[(part, size, length)] = PARTS[part](size, folders[size], length, a)
    print("summary (ours / baseline, best of interleaved runs):")
    for (part, size, length), r in ratios.items():
        print(f"  {part:8s} {size:4s} {length:4d}: {r:5.2f}x  ({verdict(r, part)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
