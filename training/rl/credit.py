"""Credit assignment for one GRPO step: which groups carry signal, and each completion's advantage.

    keep = informative_groups(rewards, groups, splits, dynamic_sampling)   # DAPO dynamic sampling
    kept, adv = assign_credit(kept, splits, cfg)                           # (K', G) advantages

Advantages are group-relative (the registered estimator `cfg.advantage`, training.rl.algorithms). Multi-turn
episodes share credit as `cfg.answer_credit` says: "episode" (one advantage per episode), "final" (answers the
environment rejected leave the loss where the advantage is positive) or "turn" (first answers take advantages of
their own; Zeng et al. 2025).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from training.environments.episodes import final_answer_credit
from training.rl import algorithms
from training.rl.config import GRPOConfig
from training.rollout import Completion
from training.tasksets.schema import Task

# one group of a step: its task, its G completions and their rewards
Group = tuple[Task, list[Completion], list[float]]
# answer_credit "turn": a group's episodes each split into (first answer, the rest), and the first answers' rewards
FirstSplit = tuple[list[tuple[Completion, Completion]], list[float]]


def informative_groups(
    rewards: torch.Tensor, groups: list[list[Completion]], splits: Sequence[FirstSplit | None], dynamic_sampling: bool
) -> list[int]:
    """The indices of the groups to train on. rewards: (B, G). With dynamic sampling (DAPO) a group whose rewards
    are all equal carries no signal and is dropped, unless it is split for turn credit and its first answers'
    rewards differ. A group the model wrote nothing in (a planted answer whose reply left no room) is dropped
    either way: it has nothing to train."""
    keep = algorithms.drop_zero_variance_groups(rewards) if dynamic_sampling else torch.arange(len(groups))  # (K,)
    if dynamic_sampling and any(sp is not None for sp in splits):
        keep = torch.tensor(
            sorted(
                set(keep.tolist()) | {i for i, sp in enumerate(splits) if sp is not None and max(sp[1]) > min(sp[1])}
            ),
            dtype=torch.long,
        )
    return [i for i in keep.tolist() if any(model_wrote(c) for c in groups[i])]


def assign_credit(
    kept: list[Group], splits: list[FirstSplit | None], cfg: GRPOConfig
) -> tuple[list[Group], torch.Tensor]:
    """Group-relative advantages of the kept groups, shared among an episode's answers as `cfg.answer_credit`
    says. Returns the groups to update on (turn credit splits some in two) and their advantages (K', G)."""
    advantage = algorithms.get_advantage(cfg.advantage)
    adv = advantage(torch.tensor([r for _, _, r in kept]))  # (K, G)
    if cfg.answer_credit == "final":
        kept = [
            (t, [final_answer_credit(c, a) for c, a in zip(g, row)], r) for (t, g, r), row in zip(kept, adv.tolist())
        ]
    elif cfg.answer_credit == "turn":
        kept, adv = turn_credit_rows(kept, splits, adv, advantage, cfg.dynamic_sampling)
    return kept, adv


def first_answer_rewards(
    groups: list[list[Any]], scores: list[float], score: Callable[[list[Task], list[str]], Sequence[float]]
) -> list[list[float] | None]:
    """answer_credit "turn": per group of episodes, the verifier's score of each episode's first answer alone
    (`scores`: each episode's final answer's, flat; `score(tasks, answers)`, the verifier, for first answers that
    a later turn replaced), or None where the group is not split: planted (its first answer is not the model's)
    or every episode ended at its first answer (the episode's reward is then the first answer's)."""
    G = len(groups[0]) if groups else 0
    rows = [
        (g, j) for g, group in enumerate(groups) for j, ep in enumerate(group) if ep.turns > 1 and not group[0].planted
    ]
    again = (
        dict(zip(rows, score([groups[g][j].task for g, j in rows], [groups[g][j].answers[0] for g, j in rows])))
        if rows
        else {}
    )
    return [
        None
        if group[0].planted or all(ep.turns == 1 for ep in group)
        else [float(again.get((g, j), scores[g * G + j])) for j in range(len(group))]
        for g, group in enumerate(groups)
    ]


def turn_credit_rows(
    kept: list[Group],
    splits: list[FirstSplit | None],
    adv: torch.Tensor,
    advantage: Callable[[torch.Tensor], torch.Tensor],
    informative_only: bool,
) -> tuple[list[Group], torch.Tensor]:
    """answer_credit "turn": each kept group with a split (`splits[k]`: each episode as its first answer and the
    rest, training.environments.episodes.split_first_answer, and the first answers' rewards) becomes two groups
    of rows: its first answers, with advantages from their own rewards, and its episodes with the first answers
    masked, keeping the episode's advantages (`adv[k]`). With `informative_only` (dynamic sampling) a part whose
    rewards do not vary is left out, as a flat group would be. Other groups pass as they are. The groups to
    update on and their advantages (K', G)."""
    rows: list[Group] = []
    advs: list[torch.Tensor] = []
    for (task, group, rewards), split, a in zip(kept, splits, adv):
        if split is None:
            rows.append((task, group, rewards))
            advs.append(a)
            continue
        pairs, first = split
        if not informative_only or max(first) > min(first):
            rows.append((task, [f for f, _ in pairs], first))
            advs.append(advantage(torch.tensor([first]))[0])
        if not informative_only or max(rewards) > min(rewards):
            rows.append((task, [rest for _, rest in pairs], rewards))
            advs.append(a)
    return rows, torch.stack(advs) if advs else adv[:0]


def model_wrote(c: Completion) -> bool:
    """Whether a completion holds any token the model generated (an episode's may all be planted or replies)."""
    return not c.model_mask or any(c.model_mask)
