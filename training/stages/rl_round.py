"""Stage `rl_round_<N>` (`posttrain rl-round --round N`): one round of GRPO on the task set's train split.

    posttrain rl-round --round 1 --run file:///tmp/runs/r1 --set steps=50 --set lr=2e-4

The policy starts from the previous stage's model (`sft` for round 1, `rl_round_<N-1>` after); the frozen
reference for the KL penalty is always the SFT model. Each step:

1. pick prompts: a domain mix (`domain_weights`) and, inside a domain, a curriculum over difficulties that
   favours those whose running pass rate lies in a middle band (they give informative groups);
2. sample `samples_per_prompt` completions per prompt through a RolloutEngine (transformers on CPU, vLLM on GPU);
3. score them with the verifiers (`training.rewards.score_tasks`; code runs in the sandbox in one batch);
4. group-relative advantages; groups whose rewards are all equal carry no signal and are dropped, and more
   prompts are sampled until the batch has enough informative groups (DAPO dynamic sampling, bounded);
5. one clipped-ratio policy-gradient update with a k3 KL penalty to the reference, token-level aggregation.

Everything random in step s is derived from (seed, round, s), and a checkpoint every `checkpoint_every` steps
holds model, optimizer, RNG and curriculum state, so a run killed at any point and retried ends with the same
final metrics as one that was never interrupted. The round ends with a greedy pass@1 check on the holdout split
per domain (before and after), in the stage summary and in MLflow.

This file is the stage body and its CLI; the round itself lives in training/rl/ (config, `Round`, credit, the
update, the memory check).
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch

from training import checkpointing
from training.cli import stage_cli
from training.evaluation.holdout import holdout_check, holdout_samples, holdout_subset, task_outcomes
from training.modeling import distributed, models
from training.modeling.chat import fitting_tasks
from training.modeling.devices import resolve_device
from training.modeling.lora import apply_lora
from training.modeling.models import prompt_limit
from training.modeling.precision import enable_gradient_checkpointing, resolve_precision
from training.rewards.code import use_remote_sandbox
from training.rl.config import GRPOConfig
from training.rl.memory import check_memory
from training.rl.round import Round
from training.rollout import resolve_engine
from training.stage import StageContext, rl_round_stage


def load_policy(
    ctx: StageContext, stage: str, device: torch.device, dtype: torch.dtype | None = None
) -> tuple[Any, Any]:
    """The model and tokenizer an earlier stage of this run wrote, on `device`."""
    model, tokenizer = models.load_model(
        ctx.input(stage).uri, "model", dtype=dtype, cache_dir=ctx.workdir / f"model-{stage}"
    )
    return model.to(device), tokenizer


def run_round(ctx: StageContext, round_: int) -> dict[str, Any]:
    cfg: GRPOConfig = ctx.config  # type: ignore[assignment]
    use_remote_sandbox(cfg.sandbox_url)
    device = distributed.local_device(resolve_device(cfg.device))
    world = distributed.world_size()
    prev = "sft" if round_ == 1 else rl_round_stage(round_ - 1)
    if world > 1 and cfg.lora.enabled and cfg.parallel.strategy == "fsdp":
        raise ValueError("rl_round: LoRA with parallel.strategy=fsdp is not supported; use ddp (adapters are small)")
    if world > 1 and cfg.max_turns > 1:
        raise ValueError(
            "rl_round: max_turns > 1 runs in one process for now (episodes are not sharded over "
            "ranks); use max_turns=1 under torchrun"
        )
    if world > 1 and cfg.vllm_tensor_parallel_size > 1:
        raise ValueError(
            "rl_round: under torchrun each rank runs its own vLLM engine on its own GPU "
            "(data-parallel engines); vllm_tensor_parallel_size > 1 needs a 1-process stage"
        )

    # Policy (previous stage), the KL reference, tasks. With LoRA the frozen base is stored in the compute
    # precision and, adapters disabled, is the reference; without, the reference is the SFT model (offloadable).
    compute_dtype = resolve_precision(cfg.precision, device)
    model, tokenizer = load_policy(ctx, prev, device, dtype=compute_dtype if cfg.lora.enabled else None)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    ref_model = None
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora)
        reference = f"{prev} (the LoRA base, adapters disabled; no second copy)"
    elif cfg.beta:
        ref_model, _ = load_policy(ctx, "sft", torch.device("cpu") if cfg.ref_device == "cpu" else device)
        ref_model.eval().requires_grad_(False)
        reference = f"sft ({'offloaded to cpu' if cfg.ref_device == 'cpu' else 'on ' + str(device)})"
    else:
        reference = "none (beta = 0)"
    limit = prompt_limit(cfg.max_prompt_tokens, model, cfg.max_new_tokens)
    check_memory(model, ref_model, cfg, device, world, limit, resolve_engine(cfg.rollout_engine, device))
    trainer, rollout_model = model, None
    if world > 1:
        # FSDP shards the policy in place; the hf engine needs whole weights, so it samples from a replica.
        rollout_model = (
            copy.deepcopy(model).eval()
            if cfg.parallel.strategy == "fsdp" and resolve_engine(cfg.rollout_engine, device) == "hf"
            else None
        )
        trainer = distributed.wrap(model, cfg.parallel, device)
    rnd = Round.build(
        cfg,
        round_,
        model,
        tokenizer,
        ref_model,
        ctx.tasks("train"),
        device,
        trainer=trainer,
        rollout_model=rollout_model,
    )
    holdout, holdout_dropped = fitting_tasks(
        rnd.fmt, holdout_subset(ctx.tasks("holdout"), cfg.holdout_per_domain), limit
    )
    ctx.progress(
        f"round {round_}: engine {rnd.engine_name}, precision {rnd.compute_dtype}, lora={cfg.lora.enabled}, "
        f"reference {reference}, prompts {'chat-rendered' if rnd.fmt.uses_template else 'plain'}, "
        f"stop ids {rnd.fmt.stop_ids}, {world} rank(s)"
        f"{' ' + cfg.parallel.strategy if world > 1 else ''}; "
        f"dropped over {limit} prompt tokens: {rnd.prompts_dropped} train, "
        f"{holdout_dropped} holdout",
        prompts_dropped_train=float(rnd.prompts_dropped),
        prompts_dropped_holdout=float(holdout_dropped),
    )
    ctx.mlflow.set_tags(
        {
            "posttrain.rollout_engine": rnd.engine_name,
            "posttrain.reference": reference,
            "posttrain.lora": str(cfg.lora.enabled),
            "posttrain.precision": str(rnd.compute_dtype),
            "posttrain.packed_attention": rnd.attention,
        }
    )

    # Resume, or measure where the round starts.
    start_step, history = 0, []
    state, _ = checkpointing.latest_state(ctx.stage_uri, ctx.workdir)
    if state is not None:
        start_step = checkpointing.restore(state, trainer if state.get("sharded") else model, rnd.optimizer)
        rnd.curriculum.rates = dict(state["extra"]["curriculum"])
        holdout_before = state["extra"]["holdout_before"]
        before_outcomes = dict(state["extra"].get("holdout_before_outcomes", {}))
        history = list(state["extra"]["history"])
        rnd.sync_rollout_weights()
        ctx.progress(f"resumed from checkpoint step {start_step}")
    else:
        holdout_before, before_rows = holdout_check(rnd.engine, holdout, cfg.max_new_tokens, rnd.fmt)
        before_outcomes = task_outcomes(before_rows)
        ctx.progress(
            f"round {round_} starts from {prev}", **{f"holdout_before/{k}": v for k, v in holdout_before.items()}
        )

    t0 = time.monotonic()
    model.train()
    for step in range(start_step, cfg.steps):
        metrics = rnd.step(step)
        done = step + 1
        metrics.update({f"curriculum/{k}": v for k, v in sorted(rnd.curriculum.rates.items())})
        # history is what a retried round must reproduce: no timings (step, phases) and no memory, which
        # differ run to run; MLflow gets them all
        history.append(
            {
                "step": done,
                **{
                    k: v
                    for k, v in metrics.items()
                    if not k.startswith(("curriculum/", "time/")) and not k.endswith("_seconds")
                },
            }
        )
        ctx.progress("step", step=done, **metrics, **distributed.peak_memory_metrics(device))
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            checkpointing.save(
                ctx.stage_uri,
                done,
                trainer,
                rnd.optimizer,
                tokenizer,
                extra={
                    "curriculum": dict(rnd.curriculum.rates),
                    "holdout_before": holdout_before,
                    "holdout_before_outcomes": before_outcomes,
                    "history": history,
                },
                keep_last=cfg.keep_checkpoints,
            )
            ctx.progress(f"checkpoint step {done}")
    elapsed = time.monotonic() - t0

    # End of round: holdout check, samples table, the new policy.
    model.eval()
    holdout_after, holdout_rows = holdout_check(rnd.engine, holdout, cfg.max_new_tokens, rnd.fmt)
    after_outcomes = task_outcomes(holdout_rows)
    ctx.mlflow.log_metrics(
        {
            **{f"holdout/{k}": v for k, v in holdout_after.items()},
            **{f"holdout_delta/{k}": holdout_after[k] - holdout_before.get(k, 0.0) for k in holdout_after},
        },
        step=cfg.steps,
    )
    samples = rnd.last_rows + holdout_samples(holdout_rows, cfg.log_samples)
    ctx.mlflow.log_table(samples, "samples.json")
    ctx.writer.put_json(samples, "samples.json")
    if rnd.last_episodes:  # multi-turn: turns, tool outputs and reward of sample episodes
        ctx.mlflow.log_table(rnd.last_episodes, "episodes.json")
        ctx.writer.put_json(rnd.last_episodes, "episodes.json")
    final = distributed.gathered_model(trainer, cfg.parallel.weight_sync_bucket_mb)  # None on ranks other than 0
    if final is not None:
        models.save_checkpoint(final, tokenizer, ctx.writer, "model")
    ctx.writer.put_json(
        {
            "holdout_before": holdout_before,
            "holdout_after": holdout_after,
            # per task, so a reader can pair the two measurements (the gate's paired test) rather than compare rates
            "holdout_outcomes": {"before": before_outcomes, "after": after_outcomes},
            "history": history,
        },
        "round_report.json",
    )
    ctx.progress(f"round {round_} done", step=cfg.steps, **{f"holdout/{k}": v for k, v in holdout_after.items()})
    holdout_counts = {d: {"passed": sum(o.values()), "total": len(o)} for d, o in after_outcomes.items()}
    rewards = [h["reward/all"] for h in history if "reward/all" in h]
    return {
        "round": round_,
        "steps": cfg.steps,
        "resumed_from": start_step,
        "policy_from": prev,
        "holdout_before": holdout_before,
        "holdout_after": holdout_after,
        # holdout counts (the report's per-round plot) and the round's mean train reward (the gate's
        # reward-hacking rule, read by evaluate into report.json's "rounds")
        "holdout": holdout_counts,
        "train_reward_mean": sum(rewards) / max(1, len(rewards)),
        # the gate's KL and entropy sanity rule: the round's mean KL to the reference and token entropy
        "kl_ref_mean": _mean_of(history, "train/kl_ref"),
        "entropy_mean": _mean_of(history, "train/entropy"),
        "final_train_metrics": history[-1] if history else {},
        "rollout_engine": rnd.engine_name,
        "reference": reference,
        "lora": cfg.lora.enabled,
        "prompts_dropped": {"train": rnd.prompts_dropped, "holdout": holdout_dropped},
        "samples_per_s_this_attempt": rnd.samples_seen / max(elapsed, 1e-9),
        "world_size": world,
        "packed_attention": rnd.attention,  # "segments" (no (T, T) mask) or "dense"
    }


def _mean_of(history: list[dict[str, Any]], key: str) -> float | None:
    values = [float(h[key]) for h in history if key in h]
    return sum(values) / len(values) if values else None


def cli(argv: list[str], prog: str = "posttrain rl-round") -> int:
    def round_number(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"--round must be an integer >= 1, got {text!r}")
        return int(text)

    def round_argument(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--round", type=round_number, required=True, help="round number N >= 1 (stage rl_round_N)")

    def bind(args: argparse.Namespace) -> tuple[str, Any]:
        return rl_round_stage(args.round), lambda ctx: run_round(ctx, args.round)

    return stage_cli(
        argv,
        prog,
        "One GRPO round: rollouts, verifier rewards, group-relative policy update.",
        GRPOConfig,
        arguments=round_argument,
        bind=bind,
    )
