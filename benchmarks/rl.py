"""GRPO throughput: our round step vs TRL's GRPOTrainer, same tiny model, tasks, batch and machine, one run.

    python benchmarks/rl.py            # prints samples/s for both and the ratio (goal >= 2x)

Both sides: the same briefly SFT-trained tiny GPT-2 (so completions end and rewards are mixed), the same
prompts (math/code/extraction from the tiny generators), `samples_per_prompt` completions per prompt,
`prompts_per_step` prompts per step, the same max completion length, temperature, beta (KL to the frozen
reference) and one optimizer step per generation batch; rewards from `training.rewards.score_tasks` (code
through the sandbox in one batch). A "sample" is one completion generated, scored and trained on. The
headline ratio has our dynamic sampling off so that both sides train on every group; a second line shows our
default (zero-variance groups skipped by the update, more groups drawn). The first step of each side is a
warm-up and not timed.

Timings on a shared 2-core machine wander by +-25% from run to run, so the sides run `--repeats` times,
interleaved (ours, ours default, TRL, ours, ...), each from the same starting weights, and each side's best
run is compared (as `timeit` does: noise only ever slows a run down); every run's figure is printed too.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def tiny_policy(tasks, sft_steps: int, seed: int):
    import torch

    from training.modeling import models
    from training.modeling.optimizers import adamw
    from training.stages.sft import SFTConfig, collate, pack, response_loss, tokenize_example

    cfg = SFTConfig(seed=seed)
    tok = models.build_tiny_tokenizer([t.prompt for t in tasks] + [t.reference for t in tasks], cfg.vocab_size)
    torch.manual_seed(seed)
    model = models.build_tiny_model(cfg.tiny, tok)
    opt = adamw(model, cfg.lr, cfg.betas, cfg.weight_decay)
    rows = pack(
        [tokenize_example(tok, t.prompt, t.reference, cfg.max_seq_len) for t in tasks],
        cfg.max_seq_len,
        tok.pad_token_id,
    )
    for step in range(sft_steps):
        k = (step * cfg.batch_size) % max(1, len(rows) - cfg.batch_size)
        loss, _ = response_loss(model, collate(rows[k : k + cfg.batch_size], cfg.max_seq_len, tok.pad_token_id))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


def bench_ours(model, tok, tasks, args, dynamic_sampling: bool = False) -> float:
    import torch

    from training.rl.config import GRPOConfig
    from training.rl.round import Round

    cfg = GRPOConfig(
        prompts_per_step=args.prompts,
        samples_per_prompt=args.k,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        beta=args.beta,
        lr=1e-5,
        dynamic_sampling=dynamic_sampling,
        curriculum=False,
        warmup_steps=0,
        device="cpu",
        seed=args.seed,
    )
    policy = copy.deepcopy(model).train()
    ref = copy.deepcopy(model).eval().requires_grad_(False) if args.beta else None
    rnd = Round.build(cfg, 1, policy, tok, ref, tasks, torch.device("cpu"))
    rnd.step(0)  # warm-up
    seen0, t0 = rnd.samples_seen, time.perf_counter()
    for s in range(1, args.steps + 1):
        rnd.step(s)
    return (rnd.samples_seen - seen0) / (time.perf_counter() - t0)


def bench_trl(model, tok, tasks, args) -> float:
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig as TRLConfig, GRPOTrainer

    from training.rewards import score_tasks

    def reward(prompts, completions, task_index, **_):
        return score_tasks([tasks[i] for i in task_index], list(completions))

    rng = random.Random(args.seed)
    n_prompts = args.prompts * (args.steps + 2)
    idx = [rng.randrange(len(tasks)) for _ in range(n_prompts)]
    data = Dataset.from_dict({"prompt": [tasks[i].prompt for i in idx], "task_index": idx})

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        # TRL builds its reference model from a path, so both sides start from the same saved weights.
        model.save_pretrained(f"{out}/policy")
        tok.save_pretrained(f"{out}/policy")
        config = TRLConfig(
            output_dir=out,
            per_device_train_batch_size=args.prompts * args.k,
            num_generations=args.k,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=args.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=args.beta,
            learning_rate=1e-5,
            max_steps=args.steps + 1,
            use_vllm=False,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1000,
            seed=args.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
            log_completions=False,
        )
        trainer = GRPOTrainer(
            model=f"{out}/policy",
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # its end-of-training metrics dict is noise here
        trainer.train()
    timed = len(stamps) - 1  # step 1 is the warm-up
    return timed * args.prompts * args.k / (stamps[-1] - stamps[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per side (after one warm-up)")
    parser.add_argument("--beta", type=float, default=0.01)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per side; the best counts")
    args = parser.parse_args()

    import torch
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations inside transformers/TRL
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("posttrain").setLevel(logging.WARNING)
    from training.tasksets.generators import generate

    tasks = (
        generate("math", 600, args.seed, (1, 2))
        + generate("code", 150, args.seed, (1, 2))
        + generate("extraction", 150, args.seed, (1, 2))
    )
    t = time.perf_counter()
    model, tok = tiny_policy(tasks, args.sft_steps, args.seed)
    print(
        f"tiny policy: {sum(p.numel() for p in model.parameters()):,} params, {args.sft_steps} SFT steps "
        f"({time.perf_counter() - t:.1f}s); torch threads {torch.get_num_threads()}"
    )
    print(
        f"setup: {args.prompts} prompts x {args.k} samples/step, max_new_tokens {args.max_new_tokens}, "
        f"beta {args.beta}, {args.steps} timed steps each, CPU"
    )
    import trl as trl_mod

    runs: dict[str, list[float]] = {"ours": [], "ours_ds": [], "trl": []}
    for _ in range(args.repeats):
        runs["ours"].append(bench_ours(model, tok, tasks, args))
        runs["ours_ds"].append(bench_ours(model, tok, tasks, args, dynamic_sampling=True))
        runs["trl"].append(bench_trl(model, tok, tasks, args))
    ours, ours_ds, trl = (max(runs[k]) for k in ("ours", "ours_ds", "trl"))
    each = {k: ", ".join(f"{v:.0f}" for v in vs) for k, vs in runs.items()}
    print(f"best of {args.repeats} interleaved runs (each run: {each['ours']} | {each['ours_ds']} | {each['trl']})")
    print(f"ours, like for like (every group trained):            {ours:8.1f} samples/s")
    print(
        f"ours, default (dynamic sampling: zero-variance groups  {ours_ds:8.1f} samples/s\n"
        f"      are generated and scored, not trained)"
    )
    print(f"TRL {trl_mod.__version__} GRPOTrainer (use_vllm=False):          {trl:8.1f} samples/s")
    print(
        f"ratio ours/TRL, like for like: {ours / trl:.2f}x (goal >= 2x); "
        f"run by run: {', '.join(f'{a / b:.2f}' for a, b in zip(runs['ours'], runs['trl']))}"
    )
    print(f"ratio ours/TRL, default:       {ours_ds / trl:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
