"""`Round`: one GRPO round's state, and its training step as a short loop of named phases.

    rnd = Round.build(cfg, round_, model, tokenizer, ref_model, train_tasks, device)
    metrics = rnd.step(s)    # a pure function of (state, s): a killed round resumes to the same weights

Each step: pick prompts (domain mix, curriculum) -> rollouts, one `Draw` record per draw (tasks, completions,
rewards, episodes) -> keep the informative groups (dynamic sampling, refilled up to `max_sampling_batches`
draws) -> credit (training.rl.credit) -> the update (training.rl.update) -> metrics. Everything random in step s
is derived from (seed, round, s).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

import training.rewards  # the module, not its score_tasks: tests put a stand-in reward there
from training.environments import environment_for
from training.environments.episodes import Episode, run_episodes, split_first_answer
from training.environments.planting import mirrored_plants, planted_attempts
from training.evaluation.holdout import engine_text
from training.modeling import distributed, packed_attention
from training.modeling.chat import PromptFormat, fitting_tasks
from training.modeling.chunked_logprobs import output_head
from training.modeling.lora import merged_state_dict
from training.modeling.models import context_limit, prompt_limit
from training.modeling.optimizers import adamw
from training.modeling.precision import resolve_precision
from training.phases import PhaseTimer
from training.rl.config import GRPOConfig
from training.rl.credit import FirstSplit, Group, assign_credit, first_answer_rewards, informative_groups
from training.rl.curriculum import Curriculum, domain_counts, pick_prompts
from training.rl.grpo_batches import PackedGroups, RolloutBatch, attention_pair_cost, micro_batches, takes_4d_mask
from training.rl.overlong import masked_if_truncated, shaped_rewards
from training.rl.update import policy_update, use_tis
from training.rollout import Completion, make_engine, resolve_engine
from training.rollout.base import length_cut_share
from training.tasksets.schema import Task

log = logging.getLogger("posttrain.rl_round")


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from (seed, round, step, ...): stable across processes (unlike hash())."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little") >> 1


@dataclass
class Draw:
    """One rollout draw of a step, the record every later phase reads: B tasks, their G completions each, the
    flat rewards (B*G; a weighted reward also carries `.components`). Multi-turn draws add their episodes (flat,
    B*G), each group's split for turn credit (None: not split) and the prompt each group's completions follow."""

    tasks: list[Task]
    groups: list[list[Completion]]
    scores: Any
    episodes: list[Episode] = field(default_factory=list)
    splits: list[FirstSplit | None] = field(default_factory=list)
    openings: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.splits:
            self.splits = [None] * len(self.tasks)

    def planted(self, group_size: int) -> set[str]:
        """The ids of the tasks whose group started from a planted answer (a group's first episode says so: a
        mirrored group plays another task id, so the ids cannot)."""
        return {t.id for t, ep in zip(self.tasks, self.episodes[::group_size]) if ep.planted}


@dataclass
class StepSamples:
    """What a step's draws gathered: the kept groups (with their turn-credit splits and openings) and the
    counts its metrics report."""

    kept: list[Group] = field(default_factory=list)
    splits: list[FirstSplit | None] = field(default_factory=list)
    openings: dict[str, list[int]] = field(default_factory=dict)
    first_rewards: list[float] = field(default_factory=list)  # first answers' rewards of every split group drawn
    domain_rewards: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    components: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cut_by_length: list[float] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    drawn: int = 0
    dropped: int = 0  # groups left out as carrying no signal

    def add(self, draw: Draw, rewards: torch.Tensor, keep: list[int]) -> None:
        """One draw, its rewards (B, G) and the indices of its informative groups."""
        self.episodes += draw.episodes
        self.openings.update(draw.openings)
        self.cut_by_length.append(length_cut_share(draw.groups))
        # each weighted-reward component, where it applies (one process; N ranks gather plain rewards)
        for name, values in getattr(draw.scores, "components", {}).items():
            self.components[name] += [v for v in values if v is not None]
        for t, r in zip(draw.tasks, rewards.tolist()):
            self.domain_rewards[t.domain] += r
        self.drawn += len(draw.tasks)
        self.dropped += len(draw.tasks) - len(keep)
        self.kept += [(draw.tasks[i], draw.groups[i], rewards[i].tolist()) for i in keep]
        self.splits += [draw.splits[i] for i in keep]
        self.first_rewards += [r for sp in draw.splits if sp is not None for r in sp[1]]

    def truncate(self, n: int) -> None:
        self.kept, self.splits = self.kept[:n], self.splits[:n]


def one_logprob_path(cfg: GRPOConfig, trainer: Any) -> GRPOConfig:
    """`cfg` with `logprob_chunk_tokens` 0 where the policy cannot take the chunked head (an FSDP shard, a LoRA
    or quantised head, transformed logits: chunked_logprobs.output_head is None for it), so that the reference
    takes the full log-softmax too, and `cfg` as it is otherwise.

    Why the reference follows the policy: at the start of a step the two can be the same weights (the first
    step, and every step with no reward signal), and the KL penalty's gradient is then exactly 0 only when both
    log-probs come out of the same arithmetic. Computed two ways they differ by float rounding (about 1e-7), and
    AdamW divides that gradient by its own running root mean square: an update of the order of lr on every
    weight, in a direction that is rounding noise. tests/training/modeling/test_distributed.py's 2-rank FSDP
    round showed it: a sharded policy (full path) against an unsharded reference (chunked) moved away from it
    over two steps without reward, and its loss left the 1-process round's at the first rewarded step."""
    if cfg.logprob_chunk_tokens and output_head(trainer) is None:
        log.info(
            "rl_round: the policy's output head cannot be chunked (%s); policy and reference take the full "
            "log-softmax alike",
            "FSDP shards" if distributed.is_sharded(distributed.unwrap(trainer)) else "not a plain Linear head",
        )
        return dataclasses.replace(cfg, logprob_chunk_tokens=0)
    return cfg


def packed_layout_attention(cfg: GRPOConfig, model: Any, ref_model: Any | None) -> str:
    """ "segments" where packed micro-batches can attend by segments: packed_groups, packed_attention "auto", and
    the policy and the reference (one forward each per micro-batch) both switched by packed_attention.enable();
    else "dense" (the 4D mask). Decided once per round, the same on every rank (the probe is seeded)."""
    if not (cfg.packed_groups and cfg.packed_attention == "auto"):
        return "dense"
    both = packed_attention.enable(model) and (ref_model is None or packed_attention.enable(ref_model))
    return "segments" if both else "dense"


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
    fmt: PromptFormat
    engine_name: str = "hf"
    compute_dtype: torch.dtype = torch.float32
    prompts_dropped: int = 0
    samples_seen: int = 0
    last_rows: list[dict] = field(default_factory=list)
    last_episodes: list[dict] = field(default_factory=list)  # multi-turn: sample episodes of the last step
    last_draw: Draw | None = None  # the last step's last draw, for inspection
    _prompt_ids: dict[str, list[int]] = field(default_factory=dict)
    trainer: Any = None  # the module the update runs through: DDP around `model`, or `model` (FSDP, 1 process)
    rollout_model: Any = None  # what the hf engine samples from: `model`, or a full replica under FSDP
    timer: PhaseTimer = field(default_factory=PhaseTimer)  # the current step's time per phase (time/<phase>_s)
    pair_cost: float = 0.0  # attention cost per (query, key) pair: packs a micro-batch only where that pays (0: all)
    attention: str = "dense"  # how packed micro-batches keep completions apart: "dense" mask or "segments"

    @classmethod
    def build(
        cls,
        cfg: GRPOConfig,
        round_: int,
        model: Any,
        tokenizer: Any,
        ref_model: Any | None,
        train_tasks: list[Task],
        device: torch.device,
        trainer: Any = None,
        rollout_model: Any = None,
    ) -> Round:
        cfg = one_logprob_path(cfg, model if trainer is None else trainer)
        fmt = PromptFormat(tokenizer, getattr(tokenizer, "chat_settings", None), model.generation_config)
        limit = prompt_limit(cfg.max_prompt_tokens, model, cfg.max_new_tokens)
        train_tasks, dropped = fitting_tasks(fmt, train_tasks, limit)
        pool: dict[str, dict[int, list[Task]]] = defaultdict(lambda: defaultdict(list))
        for t in train_tasks:
            pool[t.domain][t.difficulty].append(t)
        if not pool:
            raise ValueError(f"rl_round: no train task has a prompt within {limit} tokens ({dropped} dropped)")
        unknown = sorted(set(cfg.domain_weights) - set(pool))
        if unknown:
            raise ValueError(f"domain_weights name domains {unknown} absent from the train split {sorted(pool)}")
        optimizer = adamw(
            model, cfg.lr, cfg.betas, cfg.weight_decay, offload=cfg.optimizer_offload, fused=cfg.fused_optimizer
        )
        engine_name = resolve_engine(cfg.rollout_engine, device)
        rollout_model = model if rollout_model is None else rollout_model
        engine = make_engine(
            engine_name, rollout_model, tokenizer, stop_ids=fmt.stop_ids, **engine_options(cfg, engine_name)
        )
        low, high = cfg.curriculum_band
        curriculum = Curriculum((low, high), cfg.curriculum_floor, cfg.curriculum_ema)
        # kernels run asynchronously on CUDA: sync at phase boundaries, or a phase is charged its predecessor's work
        sync = torch.cuda.synchronize if device.type == "cuda" else None
        # Under FSDP every rank must run the same sequence of forwards (each one all-gathers the parameters):
        # a padded micro-batch runs the prompts and the completions as two forwards, a packed one as one, and
        # ranks choosing differently deadlock. So FSDP over several ranks packs every micro-batch.
        choose_layout = cfg.pack_where_cheaper and not (
            distributed.world_size() > 1 and cfg.parallel.strategy == "fsdp"
        )
        return cls(
            cfg,
            round_,
            model,
            tokenizer,
            ref_model,
            optimizer,
            engine,
            pool,
            curriculum,
            device,
            fmt,
            engine_name,
            resolve_precision(cfg.precision, device),
            dropped,
            trainer=model if trainer is None else trainer,
            rollout_model=rollout_model,
            timer=PhaseTimer(sync=sync),
            pair_cost=attention_pair_cost(model) if choose_layout else 0.0,
            attention=packed_layout_attention(cfg, model, ref_model),
        )

    # ----- the step ---------------------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        """Training step `step` (0-based): sample, score, filter, credit, update. Returns its metrics."""
        cfg, t0 = self.cfg, time.monotonic()
        self.timer.reset()
        torch.manual_seed(derive_seed(cfg.seed, self.round, step, "torch"))
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        samples = self.sample(step)
        stats = self.update(samples, step) if samples.kept else {}
        metrics = step_metrics(samples, stats, lr)
        metrics["step_seconds"] = time.monotonic() - t0
        if samples.episodes:  # how episodes went; samples for the table
            self.last_episodes = episode_rows(samples.episodes, step + 1, cfg.log_samples)
            metrics.update(episode_metrics(samples.episodes, samples.first_rewards))
        metrics.update(self.timer.metrics())  # time/<phase>_s: where this step's time went
        return metrics

    def sample(self, step: int) -> StepSamples:
        """Draw groups until the batch has enough informative ones (DAPO dynamic sampling, bounded)."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        counts = domain_counts(cfg.domain_weights, sorted(self.pool), cfg.prompts_per_step)
        samples = StepSamples()
        for draw in range(cfg.max_sampling_batches if cfg.dynamic_sampling else 1):
            rng = random.Random(derive_seed(cfg.seed, self.round, step, draw, "prompts"))
            tasks = pick_prompts(self.pool, counts, self.curriculum if cfg.curriculum else None, rng)
            self.last_draw = d = self.rollouts(tasks, step, draw)
            scores = list(d.scores)
            if cfg.overlong_buffer and cfg.max_turns == 1:  # DAPO's soft overlong punishment (training/rl/overlong.py)
                flat = [c for g in d.groups for c in g]
                scores, pens = shaped_rewards(
                    scores, flat, cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty
                )
                samples.components["overlong_penalty"] += pens
            rewards = torch.tensor(scores, dtype=torch.float32).view(len(tasks), G)  # (B, G)
            self.samples_seen += rewards.numel()
            planted = d.planted(G)
            for t, r in zip(tasks, rewards.tolist()):
                if t.id not in planted:  # a planted group's reward measures repair, not how hard the task is
                    self.curriculum.update(t.domain, t.difficulty, sum(r) / len(r))
            samples.add(d, rewards, informative_groups(rewards, d.groups, d.splits, cfg.dynamic_sampling))
            if len(samples.kept) >= cfg.min_informative * cfg.prompts_per_step:
                break
        samples.truncate(cfg.prompts_per_step)
        return samples

    def update(self, samples: StepSamples, step: int) -> dict[str, float]:
        """Credit, then the policy update on the kept groups; the rollout engine gets the new weights."""
        cfg = self.cfg
        kept, adv = assign_credit(samples.kept, samples.splits, cfg)  # adv: (K', G)
        with self.timer.phase("prepare"):  # laying the groups out as tensors (training.rl.grpo_batches)
            chunks, live = self.update_chunks(kept, adv, samples.openings)
        with self.timer.phase("weight_sync"):
            self.engine.sleep()  # vLLM with sleep mode gives the GPU back to the trainer for the update
        stats = policy_update(
            self.model,
            self.ref_model,
            self.optimizer,
            chunks,
            cfg,
            tis=use_tis(cfg, self.engine_name),
            compute_dtype=self.compute_dtype,
            trainer=self.trainer,
            live=live,
            timer=self.timer,
        )
        with self.timer.phase("weight_sync"):
            self.engine.wake_up()
            synced = self.sync_rollout_weights()
        if synced is not None:
            stats["weight_sync_seconds"] = synced
        self.last_rows = [
            {
                "step": step + 1,
                "domain": t.domain,
                "difficulty": t.difficulty,
                "prompt": engine_text(self.engine, self.prompt_ids(t)),
                "completion": c.text,
                "finish_reason": c.finish_reason,
                "reward": r,
                "advantage": float(a),
            }
            for (t, g, rs), ad in zip(kept, adv.tolist())
            for c, r, a in zip(g, rs, ad)
        ][: cfg.log_samples]
        return stats

    # ----- rollouts ---------------------------------------------------------------------------------------------
    def rollouts(self, tasks: list[Task], step: int, draw: int) -> Draw:
        """G completions of each task and their rewards. One process with batch seeding: one engine call seeded by
        (seed, round, step, draw), exactly as always. Under N ranks each rank samples and scores its share of the
        prompts (seeded by its rank, or per prompt with rollout_seeding=prompt) and the groups are gathered, in
        order, on every rank."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        seeding = cfg.parallel.rollout_seeding
        if cfg.max_turns > 1:
            return self.episode_rollouts(tasks, step, draw)
        if distributed.world_size() == 1 and seeding == "batch":
            with self.timer.phase("rollout"):
                groups = self.engine.generate(
                    [self.prompt_ids(t) for t in tasks],
                    G,
                    cfg.max_new_tokens,
                    cfg.temperature,
                    cfg.top_p,
                    seed=derive_seed(cfg.seed, self.round, step, draw, "sample"),
                )
            with self.timer.phase("reward"):
                return Draw(
                    tasks,
                    groups,
                    training.rewards.score_tasks(
                        [t for t in tasks for _ in range(G)], [c.text for g in groups for c in g]
                    ),
                )
        mine = distributed.shard_indices(len(tasks), distributed.rank(), distributed.world_size())
        with self.timer.phase("rollout"):
            if seeding == "prompt":  # a prompt's samples depend on its position only, not on which rank draws them
                my_groups = [
                    self.engine.generate(
                        [self.prompt_ids(tasks[i])],
                        G,
                        cfg.max_new_tokens,
                        cfg.temperature,
                        cfg.top_p,
                        seed=derive_seed(cfg.seed, self.round, step, draw, "sample", i),
                    )[0]
                    for i in mine
                ]
            else:
                my_groups = self.engine.generate(
                    [self.prompt_ids(tasks[i]) for i in mine],
                    G,
                    cfg.max_new_tokens,
                    cfg.temperature,
                    cfg.top_p,
                    seed=derive_seed(cfg.seed, self.round, step, draw, "sample", distributed.rank()),
                )
        with self.timer.phase("reward"):
            my_scores = training.rewards.score_tasks(
                [tasks[i] for i in mine for _ in range(G)], [c.text for g in my_groups for c in g]
            )
        scored = [(g, my_scores[k * G : (k + 1) * G]) for k, g in enumerate(my_groups)]
        with self.timer.phase("rollout"):  # waiting for the other ranks' groups
            everything = distributed.gather(scored, len(tasks))
        return Draw(tasks, [g for g, _ in everything], [r for _, rs in everything for r in rs])

    def episode_rollouts(self, tasks: list[Task], step: int, draw: int) -> Draw:
        """G episodes of each task (up to max_turns answers; training/environments/episodes.py), each as one
        completion, and their rewards: the verifier's on the final answer, less `turn_cost` per extra answer."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        with self.timer.phase("rollout"):
            planted = planted_attempts(
                tasks,
                cfg.environments,
                cfg.planted_share,
                random.Random(derive_seed(cfg.seed, self.round, step, draw, "plant")),
            )
            played = tasks
            if planted is not None and cfg.planted_mirrors:
                played, planted = mirrored_plants(tasks, planted, cfg.environments)
            episodes = run_episodes(
                self.engine,
                self.fmt,
                played,
                lambda t: environment_for(t, cfg.environments),
                G,
                cfg.max_turns,
                cfg.max_new_tokens,
                cfg.temperature,
                cfg.top_p,
                max_context=context_limit(self.model),
                turn_seed=lambda turn: derive_seed(
                    cfg.seed, self.round, step, draw, "sample", *(() if turn == 1 else ("turn", turn))
                ),
                planted=planted,
            )
        openings = {t.id: group[0].prompt_ids for t, group in zip(tasks, episodes)}
        flat = [ep for g in episodes for ep in g]
        with self.timer.phase("reward"):
            scores = training.rewards.score_tasks([ep.task for ep in flat], [ep.answers[-1] for ep in flat])
        rewards = [float(r) - cfg.turn_cost * (ep.turns - 1) for r, ep in zip(scores, flat)]
        for ep, r in zip(flat, rewards):
            ep.reward = r
        completions = [[ep.as_completion() for ep in g] for g in episodes]
        splits: list[FirstSplit | None] = [None] * len(tasks)
        if cfg.answer_credit == "turn":
            with self.timer.phase("reward"):
                firsts = first_answer_rewards(episodes, [float(r) for r in scores], training.rewards.score_tasks)
            splits = [
                None if f is None else ([split_first_answer(c, ep.answers[0]) for c, ep in zip(cs, group)], f)
                for cs, group, f in zip(completions, episodes, firsts)
            ]
        return Draw(tasks, completions, rewards, episodes=flat, splits=splits, openings=openings)

    # ----- the update's inputs and outputs ----------------------------------------------------------------------
    def update_chunks(
        self,
        kept: list[Group],
        adv: torch.Tensor,
        openings: dict[str, list[int]] | None = None,
    ) -> tuple[list[RolloutBatch | PackedGroups], list[bool] | None]:
        """Micro-batches of this rank's share of the kept groups, and which are live (None: all, 1 process).
        A group's completions follow its environment's opening (`openings`, multi-turn) or the task's prompt.
        Under N ranks every rank ends with the same number of micro-batches: short ones are padded with
        copies of a chunk that count 0 (see policy_update)."""
        cfg, openings = self.cfg, openings or {}

        def chunked(idx: list[int]) -> list[RolloutBatch | PackedGroups]:
            return micro_batches(
                self.tokenizer,
                [openings.get(kept[i][0].id) or self.prompt_ids(kept[i][0]) for i in idx],
                [[masked_if_truncated(c) for c in kept[i][1]] if cfg.truncated == "mask" else kept[i][1] for i in idx],
                adv[idx].flatten(),
                self.device,
                cfg.micro_batch_size,
                cfg.packed_groups and takes_4d_mask(self.model),
                next(self.model.parameters()).dtype,
                pair_cost=self.pair_cost,
                max_tokens=cfg.max_tokens_per_micro_batch,
                attention=self.attention,
            )

        if distributed.world_size() == 1:
            return chunked(list(range(len(kept)))), None
        mine = distributed.shard_indices(len(kept), distributed.rank(), distributed.world_size())
        chunks = chunked(mine) if mine else []
        n = distributed.all_reduce_max(len(chunks))
        filler = chunks[0] if chunks else chunked([0])[0]
        return chunks + [filler] * (n - len(chunks)), [True] * len(chunks) + [False] * (n - len(chunks))

    def sync_rollout_weights(self) -> float | None:
        """Give the rollout engine the newest policy; seconds taken, or None when it already samples from the
        trainer's own weights (hf engine, no FSDP). Under FSDP the shards are gathered bucket by bucket (a
        collective: every rank calls this) into the hf engine's replica or the rank's vLLM engine."""
        sharded = distributed.is_sharded(self.model)
        if self.engine_name == "hf" and not sharded:
            return None
        if not sharded:
            self.engine.update_weights(merged_state_dict(self.model))
            return float(self.engine.last_sync_s)
        started = time.monotonic()
        for bucket in distributed.full_tensors(self.model, self.cfg.parallel.weight_sync_bucket_mb):
            if self.engine_name == "hf":
                with torch.no_grad():
                    self.rollout_model.load_state_dict(bucket, strict=False)
            else:
                self.engine.update_weights(bucket)
        return time.monotonic() - started

    def prompt_ids(self, task: Task) -> list[int]:
        """The task's chat-rendered prompt ids (rendered once per task and kept)."""
        if task.id not in self._prompt_ids:
            self._prompt_ids[task.id] = self.fmt.prompt_ids(task)
        return self._prompt_ids[task.id]


def step_metrics(samples: StepSamples, stats: dict[str, float], lr: float) -> dict[str, float]:
    """A step's metrics: mean reward per domain and over all, each reward component, the update's statistics
    (train/...), how many groups were drawn and kept, and the share of completions cut by the length cap."""
    metrics = {f"reward/{d}": sum(v) / len(v) for d, v in sorted(samples.domain_rewards.items())}
    every = [r for v in samples.domain_rewards.values() for r in v]
    metrics["reward/all"] = sum(every) / max(1, len(every))
    metrics.update({f"reward_component/{name}": sum(v) / len(v) for name, v in sorted(samples.components.items()) if v})
    metrics.update({f"train/{k}": v for k, v in stats.items()})
    metrics.update(
        {
            "groups_drawn": float(samples.drawn),
            "groups_kept": float(len(samples.kept)),
            "zero_variance_frac": samples.dropped / max(1, samples.drawn),
            "lr": lr,
            "rollout/length_cut_frac": sum(samples.cut_by_length) / max(1, len(samples.cut_by_length)),
        }
    )
    return metrics


def episode_metrics(episodes: list[Episode], first_rewards: list[float]) -> dict[str, float]:
    """How a step's episodes went: answers per episode, the planted share, what ended them, and (turn credit)
    how the model's own first answers did in split groups."""
    n = len(episodes)
    metrics = {
        "episode/turns_mean": sum(ep.turns for ep in episodes) / n,
        "episode/planted_frac": sum(ep.planted for ep in episodes) / n,
    }
    if first_rewards:
        metrics["episode/first_answer_reward"] = sum(first_rewards) / len(first_rewards)
    for why in ("environment", "max_turns", "context", "single_turn"):
        metrics[f"episode/ended_by_{why}"] = sum(ep.ended_by == why for ep in episodes) / n
    return metrics


def episode_rows(episodes: list[Any], step: int, n: int) -> list[dict[str, Any]]:
    """Up to n sample episodes for the MLflow table: those with most turns first (the repairs), then in order;
    each with every answer, the environment's replies (tool outputs) and the reward."""
    chosen = sorted(range(len(episodes)), key=lambda i: (-episodes[i].turns, i))[:n]
    return [{"step": step, **episodes[i].row(), "reward": episodes[i].reward} for i in sorted(chosen)]


def engine_options(cfg: GRPOConfig, engine_name: str) -> dict[str, Any]:
    """The rollout engine's settings from the round's config."""
    if engine_name == "hf":
        return {"batch_size": cfg.rollout_batch_size}
    return {
        "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
        "max_model_len": cfg.vllm_max_model_len,
        "enable_prefix_caching": cfg.vllm_prefix_caching,
        "enable_sleep_mode": cfg.vllm_sleep_mode,
        "tensor_parallel_size": cfg.vllm_tensor_parallel_size,
        "seed": cfg.seed,
    }
