"""Multi-turn episodes through any rollout engine, laid out for the packed GRPO update.

    groups = run_episodes(engine, fmt, tasks, lambda t: environment_for(t, {"code": "code_repair"}),
                          n_samples=8, max_turns=2, max_new_tokens=40, temperature=1.0, seed=s)

Turn 1 samples `n_samples` answers per task in one engine call (exactly the single-turn rollout). After each
turn the environments of the unfinished episodes are stepped together (`step_all`); each reply is appended to
the episode's own token ids (`PromptFormat.reply_ids`: closing the assistant turn if the answer did not, the
reply as a user turn, the next generation prompt) and every unfinished episode continues with one sample from
its whole context. A later turn's prompt therefore extends the earlier one token for token: the transformers
engine simply prefills it, vLLM with prefix caching reuses the KV blocks of every earlier turn.

An episode is laid out as one completion after the first prompt: its answers and the environment's replies
back to back, `model_mask` 1 on the model's tokens only (the loss leaves the environment's out), engine
log-probs 0 on the environment's. Its `text` is the final answer, which the task's verifier (hidden tests)
scores. An episode also ends when its next turn would not fit `max_context` (counted in `info`, never cut).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from training.environments.base import Environment, step_all
from training.modeling.chat import PromptFormat
from training.rollout.base import Completion
from training.tasksets.schema import Task


@dataclass
class Episode:
    """One episode: the first prompt, then everything after it as one sequence."""

    task: Task
    env: Environment | None
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # the model's text, one per turn
    replies: list[str] = field(default_factory=list)  # the environment's replies shown to the model
    infos: list[dict[str, Any]] = field(default_factory=list)  # the environment's info after each stepped turn
    finish_reason: str = "stop"
    done: bool = False
    ended_by: str = ""  # "environment", "max_turns", "context" or "single_turn"
    reward: float | None = None  # set by the trainer once the final answer is scored
    planted: bool = False  # the first answer was planted (run_episodes' `planted`), not sampled
    answer_starts: list[int] = field(default_factory=list)  # where each answer begins in token_ids

    @property
    def turns(self) -> int:
        return len(self.answers)

    def add_answer(self, c: Completion) -> None:
        self.answer_starts.append(len(self.token_ids))
        self.token_ids += c.token_ids
        self.model_mask += [1] * len(c.token_ids)
        self.logprobs += list(c.logprobs) if len(c.logprobs) == len(c.token_ids) else [0.0] * len(c.token_ids)
        self.answers.append(c.text)
        self.finish_reason = c.finish_reason

    def add_planted(self, answer: str, ids: list[int]) -> None:
        """A first answer the model did not write (run_episodes' `planted`): an answer to the environment,
        masked from the loss like a reply. Its ids carry no stop token, so the reply after it closes the turn."""
        self.answer_starts.append(len(self.token_ids))
        self.token_ids += ids
        self.model_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.answers.append(answer)
        self.planted = True

    def add_reply(self, reply: str, ids: list[int]) -> None:
        self.token_ids += ids
        self.model_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.replies.append(reply)

    def context(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    def as_completion(self) -> Completion:
        """The episode as the update sees it: one completion of `prompt_ids`, the final answer as its text."""
        return Completion(
            token_ids=list(self.token_ids),
            text=self.answers[-1] if self.answers else "",
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            model_mask=list(self.model_mask),
            answer_starts=list(self.answer_starts),
        )

    def row(self) -> dict[str, Any]:
        """A samples-table row: every turn's answer, the tool outputs, how it ended (reward added by callers)."""
        return {
            "id": self.task.id,
            "domain": self.task.domain,
            "turns": self.turns,
            "answers": self.answers,
            "tool_outputs": self.replies,
            "ended_by": self.ended_by,
            "planted_first": self.planted,
            "statuses": [str(i.get("status", "")) for i in self.infos],
        }


def final_answer_credit(c: Completion, advantage: float) -> Completion:
    """The episode `c` with its earlier answers left out of the loss where its advantage is positive.

    Every answer before the last was rejected by the environment (an episode goes on only after a rejection).
    The episode's reward is the final answer's, so with one advantage for the whole row a rejected first answer
    that a later turn repaired would be reinforced exactly like a right first answer, and first attempts get no
    reason to be right. Here it earns nothing from the repair; with a negative advantage (the episode failed) it
    keeps its share and is pushed down, as in a single-turn round. A single-answer completion is returned as is."""
    if advantage <= 0 or len(c.answer_starts) < 2:
        return c
    start = c.answer_starts[-1]
    mask = list(c.model_mask) if c.model_mask else [1] * len(c.token_ids)
    mask = [0] * start + mask[start:]
    return replace(c, model_mask=mask)


def split_first_answer(c: Completion, first_text: str) -> tuple[Completion, Completion]:
    """An episode as two rows for turn-level credit (`answer_credit="turn"`): its first answer (sampled, not
    planted) alone, a completion of the opening prompt exactly as a single-turn round samples it (`first_text`
    its text), and the whole episode with that answer masked, so the later answers can take the episode's
    advantage and the first its own. A single-answer episode's second row has no model token left (it adds
    nothing to the loss)."""
    mask = list(c.model_mask) if c.model_mask else [1] * len(c.token_ids)
    # the first answer ends where the environment's reply begins (its first masked token)
    end = next((k for k, m in enumerate(mask) if not m), len(mask))
    first = Completion(
        token_ids=c.token_ids[:end],
        text=first_text,
        logprobs=list(c.logprobs[:end]),
        finish_reason="stop" if end < len(c.token_ids) else c.finish_reason,
        model_mask=mask[:end],
        answer_starts=[0],
    )
    return first, replace(c, model_mask=[0] * end + mask[end:])


def run_episodes(
    engine: Any,
    fmt: PromptFormat,
    tasks: Sequence[Task],
    make_env: Callable[[Task], Environment | None],
    n_samples: int,
    max_turns: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    max_context: int | None = None,
    turn_seed: Callable[[int], int] | None = None,
    planted: Sequence[str | None] | None = None,
) -> list[list[Episode]]:
    """`n_samples` episodes of each task, up to `max_turns` answers each; result[i][j] is sample j of task i.
    Turn t's engine call is seeded by `turn_seed(t)` (default seed for turn 1, seed + t after), so a run is
    reproducible; temperature 0 is greedy (evaluation).

    `planted[i]`, when given and not None, is task i's first answer instead of a sampled one: every episode of
    the group starts from it, laid out and masked like the environment's replies (the model did not write it,
    so it gets no gradient), and the model's own answers begin at turn 2. A task with a planted answer needs an
    environment and max_turns >= 2."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    plant = list(planted) if planted is not None else [None] * len(tasks)
    if len(plant) != len(tasks):
        raise ValueError(f"planted: {len(plant)} answers for {len(tasks)} tasks")
    seed_of = turn_seed or (lambda t: seed if t == 1 else seed + t)
    groups: list[list[Episode]] = []
    first_prompts, sampled_groups = [], []
    for task, answer in zip(tasks, plant):
        envs = [make_env(task) for _ in range(n_samples)]
        if answer is not None and (max_turns < 2 or any(env is None for env in envs)):
            raise ValueError(f"planted answer for task {task.id}: needs an environment and max_turns >= 2")
        opening = [fmt.episode_ids(task, env.reset(task)) if env is not None else fmt.prompt_ids(task) for env in envs]
        group = [Episode(task, env, ids) for env, ids in zip(envs, opening)]
        groups.append(group)
        if answer is not None:
            ids = fmt.answer_ids(answer)
            for ep in group:
                ep.add_planted(answer, ids)
        else:
            first_prompts.append(opening[0])  # the samples of one task share their opening (reset is per task)
            sampled_groups.append(group)
    if first_prompts:
        sampled = engine.generate(first_prompts, n_samples, max_new_tokens, temperature, top_p, seed=seed_of(1))
        for group, completions in zip(sampled_groups, sampled):
            for ep, c in zip(group, completions):
                ep.add_answer(c)
                if ep.env is None:
                    ep.done, ep.ended_by = True, "single_turn"
    flat = [ep for g in groups for ep in g]
    for turn in range(2, max_turns + 1):
        live = [ep for ep in flat if not ep.done]
        if not live:
            break
        steps = step_all([ep.env for ep in live if ep.env is not None], [ep.answers[-1] for ep in live])
        going = []
        for ep, st in zip(live, steps):
            ep.infos.append(st.info)
            if st.done or st.observation is None:
                ep.done, ep.ended_by = True, "environment"
                continue
            # whether the answer's own tokens end with a stop id (an engine may report "stop" without
            # returning the stop token): if not, the reply's tokens close the assistant turn first
            ids = fmt.reply_ids(st.observation, stopped=bool(ep.token_ids) and ep.token_ids[-1] in fmt.stop_ids)
            if max_context is not None and len(ep.context()) + len(ids) + max_new_tokens > max_context:
                ep.done, ep.ended_by = True, "context"
                continue
            ep.add_reply(st.observation, ids)
            going.append(ep)
        if not going:
            break
        outs = engine.generate(
            [ep.context() for ep in going], 1, max_new_tokens, temperature, top_p, seed=seed_of(turn)
        )
        for ep, out in zip(going, outs):
            ep.add_answer(out[0])
    for ep in flat:
        if not ep.done:
            ep.done, ep.ended_by = True, "max_turns"
    return groups
