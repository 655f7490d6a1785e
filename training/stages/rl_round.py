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
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from training import algorithms, checkpointing, models
from training.config import ConfigBase
from training.curriculum import Curriculum, domain_counts, pick_prompts
from training.devices import resolve_device
from training.grpo_batches import PackedGroups, RolloutBatch, completion_logprobs, micro_batches, takes_4d_mask
from training.optimizers import adamw
from training.rollout import ENGINES, Completion, make_engine
from training.stage import StageContext, rl_round_stage
from training.tasksets.schema import Task


# ----- config -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GRPOConfig(ConfigBase):
    """One GRPO round (stage `rl_round_<N>`).

    seed:               with the round number and step, determines prompt choice and sampling of every step.
    steps:              policy updates in this round.
    prompts_per_step:   groups (prompts) per update, B.
    samples_per_prompt: completions per prompt, G (GRPO's group size; Shao et al. 2024, "DeepSeekMath").
    max_new_tokens:     completion length cap for rollouts and the holdout check.
    temperature, top_p: rollout sampling; the policy log-probs use the same temperature (as TRL does).
    lr, weight_decay, betas, grad_clip: AdamW and global-norm clipping, constant LR after `warmup_steps`. The
                        tiny profile needs lr <= 2e-4 at 32x8 samples per step: 3e-4 at 16x8 made holdout
                        pass@1 collapse (each Adam step moves every weight by ~lr whatever the signal).
    warmup_steps:       linear LR warm-up at the start of the round.
    beta:               weight of the KL(policy || SFT reference) penalty; 0 disables the reference model.
    kl_estimator:       "k3" (unbiased, low variance, >= 0; Schulman 2020 "Approximating KL Divergence", as
                        in DeepSeekMath), or "k1"/"k2".
    advantage:          registered estimator (training.algorithms): "grpo" (centred on the group mean and
                        divided by the group's reward std) or "dr_grpo" (centred only; Liu et al. 2025 argue
                        the std division over-weights near-uniform groups).
    policy_loss:        registered policy loss (training.algorithms): "clip" (PPO's clipped surrogate).
    clip_low, clip_high: PPO ratio clip range [1-clip_low, 1+clip_high] (Schulman et al. 2017); clip_high >
                        clip_low is DAPO's "clip-higher" (Yu et al. 2025).
    loss_agg:           one of algorithms.LOSS_AGGREGATIONS: "token-mean" (DAPO token-level: every token
                        weighs the same), "seq-mean-token-mean" (original GRPO) or "seq-mean-token-sum".
    updates_per_batch:  optimizer passes over each rollout batch (GRPO's mu); 1 = strictly on-policy.
    micro_batch_size:   completions per forward/backward, whole groups, ordered by length and padded per
                        micro-batch (gradients accumulate across them; the loss equals the whole-batch loss);
                        0 = one micro-batch.
    packed_groups:      lay each group out as one row (the prompt once, its completions back to back, a
                        block attention mask) instead of one padded row per completion: ~3x fewer tokens
                        through the model in the update (training.grpo_batches). Needs eager or sdpa attention.
    dynamic_sampling:   drop zero-variance groups and refill (DAPO); bounded by `max_sampling_batches`.
    min_informative:    fraction of prompts_per_step that must be informative groups before the update runs
                        (fewer after max_sampling_batches draws: update on what there is, or skip if none).
    max_sampling_batches: rollout draws per step at most.
    domain_weights:     domain mixing ratios for the prompts of a step ({} = uniform over train domains).
    curriculum:         weight difficulties by their running pass rate: weight 1 inside `curriculum_band`,
                        `curriculum_floor` outside (a group's reward variance p(1-p) is largest mid-band;
                        cf. DAPO dynamic sampling and "online difficulty filtering", Bae et al. 2025).
    curriculum_band:    [low, high] pass-rate band that counts as learnable.
    curriculum_floor:   weight of difficulties outside the band (never 0: rates drift).
    curriculum_ema:     update rate of the running pass rate per (domain, difficulty).
    checkpoint_every:   steps between resumable checkpoints (0 = none).
    holdout_per_domain: holdout tasks per domain for the end-of-round check (0 = all).
    log_samples:        sample rollouts logged as an MLflow table (from the last step and the holdout).
    rollout_engine:     "hf" (transformers generate, shares the trainer's model) or "vllm" (GPU).
    rollout_batch_size: sequences per engine call (hf).
    device:             "cpu", "cuda" or "auto".
    """

    seed: int = 0
    steps: int = 50
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_new_tokens: int = 40
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    grad_clip: float = 1.0
    warmup_steps: int = 0
    beta: float = 0.01
    kl_estimator: str = "k3"
    advantage: str = "grpo"
    policy_loss: str = "clip"
    clip_low: float = 0.2
    clip_high: float = 0.28
    loss_agg: str = "token-mean"
    updates_per_batch: int = 1
    micro_batch_size: int = 64
    packed_groups: bool = True
    dynamic_sampling: bool = True
    min_informative: float = 0.5
    max_sampling_batches: int = 3
    domain_weights: dict[str, float] = field(default_factory=dict)
    curriculum: bool = True
    curriculum_band: list[float] = field(default_factory=lambda: [0.1, 0.9])
    curriculum_floor: float = 0.2
    curriculum_ema: float = 0.3
    checkpoint_every: int = 10
    holdout_per_domain: int = 0
    log_samples: int = 32
    rollout_engine: str = "hf"
    rollout_batch_size: int = 512
    device: str = "auto"

    def __post_init__(self) -> None:
        algorithms.get_advantage(self.advantage)
        algorithms.get_policy_loss(self.policy_loss)
        algorithms.get_kl(self.kl_estimator)
        if self.loss_agg not in algorithms.LOSS_AGGREGATIONS:
            raise ValueError(f"loss_agg {self.loss_agg!r}: use one of {', '.join(algorithms.LOSS_AGGREGATIONS)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2 (group-relative advantages need a group)")
        if self.rollout_engine not in ENGINES:
            raise ValueError(f"rollout_engine {self.rollout_engine!r}: use one of {', '.join(ENGINES)}")


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from (seed, round, step, ...): stable across processes (unlike hash())."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


# ----- the update ---------------------------------------------------------------------------------------------
def policy_update(model: Any, ref_model: Any | None, optimizer: torch.optim.Optimizer,
                  chunks: Sequence[RolloutBatch | PackedGroups], cfg: GRPOConfig) -> dict[str, float]:
    """`updates_per_batch` optimizer steps on one rollout batch (as micro-batches); averaged loss statistics."""
    with torch.no_grad():
        ref_logp = ([completion_logprobs(ref_model, c, cfg.temperature) for c in chunks]
                    if ref_model is not None and cfg.beta else None)  # [(n, L_c)]
        old_logp = ([completion_logprobs(model, c, cfg.temperature) for c in chunks]
                    if cfg.updates_per_batch > 1 else None)  # [(n, L_c)]
    n_tokens = torch.stack([c.completion_mask.sum() for c in chunks]).sum().clamp(min=1)
    n_seqs = sum(c.completion_mask.shape[0] for c in chunks)
    stats: dict[str, float] = defaultdict(float)
    for _ in range(cfg.updates_per_batch):
        optimizer.zero_grad(set_to_none=True)
        for j, c in enumerate(chunks):
            mask = c.completion_mask.float()  # (n, L_c)
            logp = completion_logprobs(model, c, cfg.temperature)  # (n, L_c)
            old = old_logp[j] if old_logp is not None else logp.detach()  # (n, L_c)
            loss, st = algorithms.grpo_loss(
                logp, old, ref_logp[j] if ref_logp is not None else None, c.advantages, mask,
                beta=cfg.beta, clip_low=cfg.clip_low, clip_high=cfg.clip_high, agg=cfg.loss_agg,
                kl_estimator=cfg.kl_estimator, policy_loss=cfg.policy_loss)
            # Micro-batches share one normaliser, so accumulation equals the whole-batch loss.
            share = mask.sum() / n_tokens if cfg.loss_agg == "token-mean" else c.completion_mask.shape[0] / n_seqs
            (loss * share).backward()
            for k, v in st.items():
                stats[k] += float(v) * float(share) / cfg.updates_per_batch
            stats["loss"] += float(loss.detach()) * float(share) / cfg.updates_per_batch
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0
                                                   else float("inf"))
        optimizer.step()
        stats["grad_norm"] += float(grad_norm) / cfg.updates_per_batch
    return dict(stats)


# ----- holdout check ------------------------------------------------------------------------------------------
def holdout_pass_at_1(engine: Any, tasks: list[Task], max_new_tokens: int) -> tuple[dict[str, float], list[dict]]:
    """Greedy pass@1 per domain (and "all"), plus the rows (for a samples table)."""
    from training.rewards import verify_tasks

    groups = engine.generate([t.prompt for t in tasks], n_samples=1, max_new_tokens=max_new_tokens,
                             temperature=0.0, seed=0)
    texts = [g[0].text for g in groups]
    scores = [float(ok) for ok in verify_tasks(tasks, texts)]  # pass rates, not (weighted) rewards
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t, s in zip(tasks, scores):
        by_domain[t.domain].append(s)
    rates = {d: sum(v) / len(v) for d, v in sorted(by_domain.items())}
    rates["all"] = sum(scores) / max(1, len(scores))
    rows = [{"id": t.id, "domain": t.domain, "difficulty": t.difficulty, "prompt": t.prompt, "completion": c,
             "reward": s} for t, c, s in zip(tasks, texts, scores)]
    return rates, rows


def holdout_subset(tasks: list[Task], per_domain: int) -> list[Task]:
    if not per_domain:
        return tasks
    seen: dict[str, int] = defaultdict(int)
    out = []
    for t in tasks:
        if seen[t.domain] < per_domain:
            out.append(t)
            seen[t.domain] += 1
    return out


# ----- the stage ----------------------------------------------------------------------------------------------
def load_policy(ctx: StageContext, stage: str, device: torch.device) -> tuple[Any, Any]:
    model, tokenizer = models.load_model(ctx.input(stage).uri, "model",
                                         cache_dir=ctx.workdir / f"model-{stage}")
    return model.to(device), tokenizer


@dataclass
class Round:
    """Everything one GRPO round works on; `step(s)` runs training step s (a pure function of the state)."""

    cfg: GRPOConfig
    round: int
    model: Any
    tokenizer: Any
    ref_model: Any | None
    optimizer: torch.optim.Optimizer
    engine: Any
    pool: dict[str, dict[int, list[Task]]]
    curriculum: Curriculum
    device: torch.device
    samples_seen: int = 0
    last_rows: list[dict] = field(default_factory=list)

    @classmethod
    def build(cls, cfg: GRPOConfig, round_: int, model: Any, tokenizer: Any, ref_model: Any | None,
              train_tasks: list[Task], device: torch.device) -> Round:
        pool: dict[str, dict[int, list[Task]]] = defaultdict(lambda: defaultdict(list))
        for t in train_tasks:
            pool[t.domain][t.difficulty].append(t)
        unknown = sorted(set(cfg.domain_weights) - set(pool))
        if unknown:
            raise ValueError(f"domain_weights name domains {unknown} absent from the train split {sorted(pool)}")
        optimizer = adamw(model, cfg.lr, cfg.betas, cfg.weight_decay)
        engine = make_engine(cfg.rollout_engine, model, tokenizer,
                             **({"batch_size": cfg.rollout_batch_size} if cfg.rollout_engine == "hf" else {}))
        low, high = cfg.curriculum_band
        curriculum = Curriculum((low, high), cfg.curriculum_floor, cfg.curriculum_ema)
        return cls(cfg, round_, model, tokenizer, ref_model, optimizer, engine, pool, curriculum, device)

    def step(self, step: int) -> dict[str, float]:
        """Training step `step` (0-based): sample, score, filter, update. Returns its metrics."""
        from training.rewards import score_tasks

        cfg, t0 = self.cfg, time.monotonic()
        torch.manual_seed(derive_seed(cfg.seed, self.round, step, "torch"))
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        counts = domain_counts(cfg.domain_weights, sorted(self.pool), cfg.prompts_per_step)

        # 1-4: sample until the batch has enough informative groups (bounded).
        kept: list[tuple[Task, list[Completion], list[float]]] = []
        domain_rewards: dict[str, list[float]] = defaultdict(list)
        drawn = zero_var = 0
        components: dict[str, list[float]] = defaultdict(list)  # each weighted-reward component, where it applies
        for draw in range(cfg.max_sampling_batches if cfg.dynamic_sampling else 1):
            rng = random.Random(derive_seed(cfg.seed, self.round, step, draw, "prompts"))
            tasks = pick_prompts(self.pool, counts, self.curriculum if cfg.curriculum else None, rng)
            groups = self.engine.generate([t.prompt for t in tasks], cfg.samples_per_prompt, cfg.max_new_tokens,
                                          cfg.temperature, cfg.top_p,
                                          seed=derive_seed(cfg.seed, self.round, step, draw, "sample"))
            flat_tasks = [t for t in tasks for _ in range(cfg.samples_per_prompt)]
            scores = score_tasks(flat_tasks, [c.text for g in groups for c in g])
            for name, values in getattr(scores, "components", {}).items():
                components[name] += [v for v in values if v is not None]
            rewards = torch.tensor(scores, dtype=torch.float32).view(len(tasks), cfg.samples_per_prompt)  # (B, G)
            drawn += len(tasks)
            self.samples_seen += rewards.numel()
            for t, r in zip(tasks, rewards.tolist()):
                self.curriculum.update(t.domain, t.difficulty, sum(r) / len(r))
                domain_rewards[t.domain] += r
            keep = (algorithms.drop_zero_variance_groups(rewards) if cfg.dynamic_sampling
                    else torch.arange(len(tasks)))  # (K,)
            zero_var += len(tasks) - len(keep)
            kept += [(tasks[i], groups[i], rewards[i].tolist()) for i in keep.tolist()]
            if len(kept) >= cfg.min_informative * cfg.prompts_per_step:
                break
        kept = kept[:cfg.prompts_per_step]

        # 5: the update.
        stats: dict[str, float] = {}
        if kept:
            rewards = torch.tensor([r for _, _, r in kept])  # (K, G)
            adv = algorithms.get_advantage(cfg.advantage)(rewards)  # (K, G)
            chunks = micro_batches(self.tokenizer, [t.prompt for t, _, _ in kept], [g for _, g, _ in kept],
                                   adv.flatten(), self.device, cfg.micro_batch_size,
                                   cfg.packed_groups and takes_4d_mask(self.model), next(self.model.parameters()).dtype)
            stats = policy_update(self.model, self.ref_model, self.optimizer, chunks, cfg)
            if cfg.rollout_engine != "hf":  # the hf engine samples from the trainer's own model object
                self.engine.update_weights(self.model.state_dict())
            self.last_rows = [{"step": step + 1, "domain": t.domain, "difficulty": t.difficulty, "prompt": t.prompt,
                               "completion": c.text, "reward": r, "advantage": float(a)}
                              for (t, g, rs), ad in zip(kept, adv.tolist())
                              for c, r, a in zip(g, rs, ad)][:cfg.log_samples]
        metrics = {f"reward/{d}": sum(v) / len(v) for d, v in sorted(domain_rewards.items())}
        every = [r for v in domain_rewards.values() for r in v]
        metrics["reward/all"] = sum(every) / max(1, len(every))
        metrics.update({f"reward_component/{name}": sum(v) / len(v) for name, v in sorted(components.items()) if v})
        metrics.update({f"train/{k}": v for k, v in stats.items()})
        metrics.update({"groups_drawn": float(drawn), "groups_kept": float(len(kept)),
                        "zero_variance_frac": zero_var / max(1, drawn), "lr": lr,
                        "step_seconds": time.monotonic() - t0})
        return metrics


def run_round(ctx: StageContext, round_: int) -> dict[str, Any]:
    cfg: GRPOConfig = ctx.config  # type: ignore[assignment]
    device = resolve_device(cfg.device)
    prev = "sft" if round_ == 1 else rl_round_stage(round_ - 1)

    # Policy (previous stage), frozen reference (SFT), tasks.
    model, tokenizer = load_policy(ctx, prev, device)
    ref_model = None
    if cfg.beta:
        ref_model, _ = load_policy(ctx, "sft", device)
        ref_model.eval().requires_grad_(False)
    holdout = holdout_subset(ctx.tasks("holdout"), cfg.holdout_per_domain)
    rnd = Round.build(cfg, round_, model, tokenizer, ref_model, ctx.tasks("train"), device)

    # Resume, or measure where the round starts.
    start_step, history = 0, []
    state, _ = checkpointing.latest_state(ctx.stage_uri, ctx.workdir)
    if state is not None:
        start_step = checkpointing.restore(state, model, rnd.optimizer)
        rnd.curriculum.rates = dict(state["extra"]["curriculum"])
        holdout_before = state["extra"]["holdout_before"]
        history = list(state["extra"]["history"])
        if cfg.rollout_engine != "hf":
            rnd.engine.update_weights(model.state_dict())
        ctx.progress(f"resumed from checkpoint step {start_step}")
    else:
        holdout_before, _ = holdout_pass_at_1(rnd.engine, holdout, cfg.max_new_tokens)
        ctx.progress(f"round {round_} starts from {prev}",
                     **{f"holdout_before/{k}": v for k, v in holdout_before.items()})

    t0 = time.monotonic()
    model.train()
    for step in range(start_step, cfg.steps):
        metrics = rnd.step(step)
        done = step + 1
        metrics.update({f"curriculum/{k}": v for k, v in sorted(rnd.curriculum.rates.items())})
        history.append({"step": done, **{k: v for k, v in metrics.items()
                                          if not k.startswith("curriculum/") and k != "step_seconds"}})
        ctx.progress("step", step=done, **metrics)
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and done < cfg.steps:
            checkpointing.save(ctx.stage_uri, done, model, rnd.optimizer, tokenizer,
                               extra={"curriculum": dict(rnd.curriculum.rates), "holdout_before": holdout_before,
                                      "history": history})
            ctx.progress(f"checkpoint step {done}")
    elapsed = time.monotonic() - t0

    # End of round: holdout check, samples table, the new policy.
    model.eval()
    holdout_after, holdout_rows = holdout_pass_at_1(rnd.engine, holdout, cfg.max_new_tokens)
    ctx.mlflow.log_metrics({**{f"holdout/{k}": v for k, v in holdout_after.items()},
                            **{f"holdout_delta/{k}": holdout_after[k] - holdout_before.get(k, 0.0)
                               for k in holdout_after}}, step=cfg.steps)
    ctx.mlflow.log_table(rnd.last_rows + _holdout_samples(holdout_rows, cfg.log_samples), "samples.json")
    models.save_checkpoint(model, tokenizer, ctx.writer, "model")
    ctx.writer.put_json({"holdout_before": holdout_before, "holdout_after": holdout_after, "history": history},
                        "round_report.json")
    ctx.progress(f"round {round_} done", step=cfg.steps, **{f"holdout/{k}": v for k, v in holdout_after.items()})
    holdout_counts: dict[str, dict[str, int]] = {}
    for row in holdout_rows:
        c = holdout_counts.setdefault(row["domain"], {"passed": 0, "total": 0})
        c["total"] += 1
        c["passed"] += int(row["reward"] > 0)
    rewards = [h["reward/all"] for h in history if "reward/all" in h]
    return {"round": round_, "steps": cfg.steps, "resumed_from": start_step, "policy_from": prev,
            "holdout_before": holdout_before, "holdout_after": holdout_after,
            # holdout counts (the report's per-round plot) and the round's mean train reward (the gate's
            # reward-hacking rule, read by evaluate into report.json's "rounds")
            "holdout": holdout_counts, "train_reward_mean": sum(rewards) / max(1, len(rewards)),
            "final_train_metrics": history[-1] if history else {},
            "samples_per_s_this_attempt": rnd.samples_seen / max(elapsed, 1e-9)}


def _holdout_samples(rows: list[dict], n: int) -> list[dict]:
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_domain[r["domain"]].append(r)
    per = max(1, n // max(1, len(by_domain)))
    return [{"step": "holdout", **r} for d in sorted(by_domain) for r in by_domain[d][:per]]


def cli(argv: list[str], prog: str = "posttrain rl-round") -> int:
    import argparse

    from training.cli import stage_cli

    def round_number(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"--round must be an integer >= 1, got {text!r}")
        return int(text)

    def round_argument(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--round", type=round_number, required=True,
                            help="round number N >= 1 (stage rl_round_N)")

    def bind(args: argparse.Namespace) -> tuple[str, Any]:
        return rl_round_stage(args.round), lambda ctx: run_round(ctx, args.round)

    return stage_cli(argv, prog, "One GRPO round: rollouts, verifier rewards, group-relative policy update.",
                     GRPOConfig, arguments=round_argument, bind=bind)
