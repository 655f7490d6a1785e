"""Environments and multi-turn episodes: code repair against visible tests in the real sandbox, a calculator
tool, the token layout of an episode (the next turn's prompt extends the last one token for token), and the
loss: environment tokens get no gradient.

The episode tests drive a planted engine (answers chosen by what the context says, real tokenizer ids), so each
turn's content is known; everything else (tokenizer, chat template, sandbox, model, loss) is real."""

from __future__ import annotations

import pytest
import torch

from training.environments import CalculatorEnv, CodeRepairEnv, environment_for, step_all
from training.environments.calculator import calculate
from training.environments.episodes import Episode, final_answer_credit, run_episodes, split_first_answer
from training.modeling import models
from training.modeling.chat import PromptFormat
from training.rewards import score_tasks
from training.rl import algorithms
from training.rl.grpo_batches import completion_logprobs, micro_batches
from training.rollout.base import Completion
from training.tasksets.schema import Task

TASK = Task(
    "c1",
    "code",
    "Write f(x) returning x plus 3.",
    "code",
    reference="def f(x): return x+3",
    tests=[{"call": "f(2)", "expected": 5}, {"call": "f(0)", "expected": 3}, {"call": "f(7)", "expected": 10}],
    metadata={"visible_tests": [{"call": "f(2)", "expected": 5}]},
)
WRONG, RIGHT = "def f(x): return x-3", "def f(x): return x+3"


@pytest.fixture(scope="module")
def tok():
    corpus = [
        TASK.prompt,
        WRONG,
        RIGHT,
        "# error: 0/1 tests passed; first failure: f(2): expected 5, got -1",
        "# fixed:",
        "Q: 23*45=? A: calc(23*45) = 1035",
    ]
    return models.build_tiny_tokenizer(corpus, vocab_size=300)


class PlantedEngine:
    """Answers WRONG until the context shows the sandbox's complaint, then RIGHT; records every prompt."""

    def __init__(self, tok) -> None:
        self.tok, self.stop_ids, self.prompts = tok, [tok.eos_token_id], []

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0, seed=0):
        out = []
        for ids in prompts:
            self.prompts.append(list(ids))
            text = RIGHT if "expected 5" in self.tok.decode(list(ids)) else WRONG
            token_ids = list(self.tok(text, add_special_tokens=False)["input_ids"]) + [self.tok.eos_token_id]
            out.append([Completion(token_ids, text, [-0.5] * len(token_ids), "stop") for _ in range(n)])
        return out


def test_code_repair_runs_visible_tests_and_names_what_was_expected() -> None:
    wrong, right, broken, empty = step_all([CodeRepairEnv(TASK) for _ in range(4)], [WRONG, RIGHT, "def f(x:", ""])
    assert not wrong.done and "f(2): expected 5, got -1" in wrong.observation and wrong.info["status"] == "failed"
    assert right.done and right.observation is None and right.info["visible_passed"]
    assert not broken.done and "not valid Python" in broken.observation
    assert not empty.done and "no code" in empty.observation
    # visible tests pass, hidden ones do not: the environment is satisfied, the reward is not
    cheat = "def f(x): return 5"
    assert CodeRepairEnv(TASK).step(cheat).done and score_tasks([TASK], [cheat]) == [0.0]


def test_calculator_tool_is_a_second_environment() -> None:
    assert calculate("(2+3)*4") == 20 and calculate("-7//2") == -4
    for bad in ("__import__('os')", "2**10000", "1/0", "x+1"):
        with pytest.raises(ValueError):
            calculate(bad)
    math = Task("m1", "math", "Q: 23*45=? A:", "math", reference="1035", answer="1035")
    env = environment_for(math, {"math": "calculator"})
    assert isinstance(env, CalculatorEnv) and "calc(" in env.reset(math)[0]["content"]
    step = env.step("calc(23*45)")
    assert not step.done and step.observation == "calc(23*45) = 1035"
    assert "error" in env.step("calc(open('x'))").observation
    assert env.step("1035").done


def test_episode_is_laid_out_as_one_sequence_the_engine_saw(tok) -> None:
    fmt = PromptFormat(tok)
    engine = PlantedEngine(tok)
    (group,) = run_episodes(
        engine, fmt, [TASK], lambda t: CodeRepairEnv(t), n_samples=2, max_turns=3, max_new_tokens=16
    )
    ep = group[0]
    assert ep.answers == [WRONG, RIGHT] and ep.ended_by == "environment" and ep.turns == 2
    assert "expected 5, got -1" in ep.replies[0]
    # the first prompt is exactly the single-turn prompt; the second extends the first token for token
    assert ep.prompt_ids == fmt.prompt_ids(TASK) == engine.prompts[0]
    second = engine.prompts[1]
    assert second[: len(ep.prompt_ids)] == ep.prompt_ids and ep.context()[: len(second)] == second
    # ... and equals re-rendering the whole conversation through the chat template
    assert second == fmt.follow_up_ids(TASK, [(WRONG, ep.replies[0])])
    c = ep.as_completion()
    first_len = len(engine.generate([ep.prompt_ids], 1, 16)[0][0].token_ids)
    reply_len = len(second) - len(ep.prompt_ids) - first_len
    assert c.model_mask == [1] * first_len + [0] * reply_len + [1] * (len(c.token_ids) - first_len - reply_len)
    assert c.text == RIGHT and c.logprobs[first_len : first_len + reply_len] == [0.0] * reply_len
    # T = 2: the last answer is not stepped; a task without an environment stays single-turn
    (short,) = run_episodes(PlantedEngine(tok), fmt, [TASK], lambda t: CodeRepairEnv(t), 1, 2, 16)
    assert short[0].ended_by == "max_turns" and short[0].turns == 2
    (single,) = run_episodes(PlantedEngine(tok), fmt, [TASK], lambda t: None, 1, 3, 16)
    assert (
        single[0].turns == 1
        and single[0].ended_by == "single_turn"
        and single[0].as_completion().model_mask == [1] * len(single[0].token_ids)
    )
    # a turn that would not fit the context ends the episode instead of being cut
    (tight,) = run_episodes(
        PlantedEngine(tok), fmt, [TASK], lambda t: CodeRepairEnv(t), 1, 3, 16, max_context=len(second) + 8
    )
    assert tight[0].turns == 1 and tight[0].ended_by == "context"


def test_a_planted_first_answer_is_masked_and_the_model_answers_its_failure(tok) -> None:
    fmt = PromptFormat(tok)
    engine = PlantedEngine(tok)
    planted, sampled = run_episodes(
        engine,
        fmt,
        [TASK, TASK],
        lambda t: CodeRepairEnv(t),
        n_samples=2,
        max_turns=2,
        max_new_tokens=16,
        planted=[WRONG, None],
    )
    ep = planted[0]
    assert ep.planted and not sampled[0].planted and ep.answers == [WRONG, RIGHT] and ep.turns == 2
    assert "expected 5, got -1" in ep.replies[0]
    # turn 1 was sampled once (the unplanted task); the planted group's engine call is its turn 2, and that
    # prompt is the conversation a sampled WRONG would have led to, apart from WRONG's own stop token
    assert engine.prompts[0] == fmt.prompt_ids(TASK)
    assert fmt.tokenizer.decode(engine.prompts[1]) == fmt.tokenizer.decode(
        fmt.follow_up_ids(TASK, [(WRONG, ep.replies[0])])
    )
    c = ep.as_completion()
    model_turn = len(c.token_ids) - (len(engine.prompts[1]) - len(ep.prompt_ids))
    assert c.model_mask == [0] * (len(c.token_ids) - model_turn) + [1] * model_turn  # only turn 2 is trained
    assert c.text == RIGHT and all(lp == 0.0 for lp, m in zip(c.logprobs, c.model_mask) if not m)
    assert ep.row()["planted_first"] and not sampled[0].row()["planted_first"]
    with pytest.raises(ValueError, match="max_turns"):
        run_episodes(engine, fmt, [TASK], lambda t: CodeRepairEnv(t), 1, 1, 16, planted=[WRONG])
    with pytest.raises(ValueError, match="environment"):
        run_episodes(engine, fmt, [TASK], lambda t: None, 1, 2, 16, planted=[WRONG])


def test_planted_attempts_fail_the_visible_tests() -> None:
    import random

    from training.environments.planting import planted_attempts
    from training.tasksets.generators import generate

    tasks = generate("code", 40, 3, (4, 5)) + [Task("m1", "math", "1+1", "math", reference="2", answer="2")]
    plants = planted_attempts(tasks, {"code": "code_repair"}, 1.0, random.Random(0))
    assert plants is not None and plants[-1] is None  # math has no repair environment here
    chosen = [(t, p) for t, p in zip(tasks, plants) if p is not None]
    assert len(chosen) >= 30  # near misses that happen to pass the visible tests are not planted
    assert all(not st.done for st in step_all([CodeRepairEnv(t) for t, _ in chosen], [p for _, p in chosen]))
    assert all(p != t.reference for t, p in chosen)
    half = planted_attempts(tasks, {"code": "code_repair"}, 0.5, random.Random(0))
    assert half is not None and 5 <= sum(p is not None for p in half) <= 30
    assert planted_attempts(tasks, {"code": "code_repair"}, 0.0, random.Random(0)) is None


def test_mirrored_plants_start_from_the_reference_and_ask_for_the_near_miss() -> None:
    import random

    from training.environments.planting import mirrored_plants, planted_attempts
    from training.rewards import score_tasks
    from training.tasksets.generators import generate

    tasks = generate("code", 40, 3, (4, 5)) + [Task("m1", "math", "1+1", "math", reference="2", answer="2")]
    plants = planted_attempts(tasks, {"code": "code_repair"}, 1.0, random.Random(0))
    assert plants is not None
    played, firsts = mirrored_plants(tasks, plants, {"code": "code_repair"})
    swapped = [i for i, (t, p) in enumerate(zip(tasks, played)) if p is not t]
    assert len(swapped) >= 25 and played[-1] is tasks[-1] and firsts[-1] is None
    for i in swapped:  # same prompt, the reference planted, the near miss is what the mirror's tests ask for
        assert played[i].prompt == tasks[i].prompt and played[i].id == f"{tasks[i].id}~mirror"
        assert firsts[i] == tasks[i].reference and played[i].reference == plants[i]
    mirrors = [played[i] for i in swapped]
    assert score_tasks(mirrors, [plants[i] for i in swapped]) == [1.0] * len(swapped)
    assert score_tasks(mirrors, [tasks[i].reference for i in swapped]) == [0.0] * len(swapped)
    assert not any(st.done for st in step_all([CodeRepairEnv(m) for m in mirrors], [firsts[i] for i in swapped]))
    kept = [i for i in range(len(tasks)) if i not in swapped]  # no mirror (or one the reference passes): as planted
    assert all(played[i] is tasks[i] and firsts[i] == plants[i] for i in kept)


def logprobs_after_backward(model, batch) -> torch.Tensor:
    """The batch's completion log-probs (N, L) after one GRPO loss's backward, with their gradient kept."""
    logp = completion_logprobs(model, batch, 1.0)
    logp.retain_grad()
    loss, _ = algorithms.grpo_loss(
        logp,
        logp.detach(),
        None,
        batch.advantages,
        batch.completion_mask.float(),
        beta=0.0,
        clip_low=0.2,
        clip_high=0.28,
        agg="token-mean",
        kl_estimator="k3",
        policy_loss="clip",
    )
    loss.backward()
    assert logp.grad is not None
    return logp


@pytest.mark.parametrize("packed", [True, False])
def test_environment_tokens_get_no_gradient(tok, packed) -> None:
    torch.manual_seed(0)
    model = models.build_tiny_model(models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2), tok).train()
    model.config._attn_implementation = "eager"
    fmt = PromptFormat(tok)
    (group,) = run_episodes(PlantedEngine(tok), fmt, [TASK], lambda t: CodeRepairEnv(t), 2, 2, 16)
    completions = [ep.as_completion() for ep in group]
    (batch,) = micro_batches(
        tok, [group[0].prompt_ids], [completions], torch.tensor([1.0, -0.5]), torch.device("cpu"), 0, packed=packed
    )
    env = torch.tensor([[m == 0 for m in c.model_mask] for c in completions])  # (N, L) environment tokens
    assert bool(env.any()) and not bool((batch.completion_mask.bool() & env).any())
    logp = logprobs_after_backward(model, batch)  # (N, L), .grad set
    assert torch.all(logp.grad[env] == 0)  # no gradient flows from any environment token
    assert torch.all(logp.grad[batch.completion_mask.bool()] != 0)  # every model token carries one
    # the environment tokens are still in the sequence the model attends to (they condition turn 2)
    assert torch.isfinite(logp[env]).all() and bool((logp[env] < 0).all())


def test_a_repaired_episode_credits_its_final_answer_only(tok) -> None:
    """answer_credit="final": a wrong first answer gets nothing from the repair after it (positive
    advantage: only the final answer trains), and is pushed down with a failed episode (negative: all of it)."""
    by_hand = Completion([11, 12, 13, 14, 15, 16, 17], "b", model_mask=[1, 1, 0, 0, 1, 1, 1], answer_starts=[0, 4])
    assert final_answer_credit(by_hand, 0.8).model_mask == [0, 0, 0, 0, 1, 1, 1]
    assert final_answer_credit(by_hand, -0.8) is by_hand and final_answer_credit(by_hand, 0.0) is by_hand
    assert by_hand.model_mask == [1, 1, 0, 0, 1, 1, 1]  # the episode itself is left as it was
    one_answer = Completion([11, 12, 13], "a", answer_starts=[0])
    assert final_answer_credit(one_answer, 0.8) is one_answer
    assert final_answer_credit(Completion([11, 12], "a"), 0.8).model_mask == []  # a single-turn completion

    torch.manual_seed(0)
    model = models.build_tiny_model(models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2), tok).train()
    (group,) = run_episodes(PlantedEngine(tok), PromptFormat(tok), [TASK], lambda t: CodeRepairEnv(t), 2, 2, 16)
    ep = group[0]
    assert ep.answers == [WRONG, RIGHT] and len(ep.answer_starts) == 2
    wrong_ids, right_ids = (tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in (WRONG, RIGHT))
    first = len(wrong_ids)
    assert ep.answer_starts[0] == 0 and ep.token_ids[:first] == wrong_ids
    assert ep.token_ids[ep.answer_starts[1] :] == right_ids and ep.answer_starts[1] > first  # the reply between
    credited = [final_answer_credit(ep.as_completion(), a) for ep, a in zip(group, (1.0, -1.0))]
    (batch,) = micro_batches(tok, [ep.prompt_ids], [credited], torch.tensor([1.0, -1.0]), torch.device("cpu"), 0)
    logp = logprobs_after_backward(model, batch)  # (N, L), .grad set
    assert torch.all(logp.grad[0, :first] == 0) and torch.all(
        logp.grad[0, ep.answer_starts[1] :][batch.completion_mask[0, ep.answer_starts[1] :].bool()] != 0
    )  # positive: the repair alone trains
    assert torch.all(logp.grad[1, :first] != 0)  # negative: the wrong first answer is pushed down too


def test_turn_level_credit_gives_first_answers_their_own_advantage(tok) -> None:
    """answer_credit="turn": a first answer is scored and credited on its own, the later answers take the
    episode's advantage, and a group that always ends right but not always first time still trains."""
    from training.rl.config import GRPOConfig
    from training.rl.credit import first_answer_rewards, turn_credit_rows

    def episode(*answers: str, planted: bool = False) -> Episode:
        ep = Episode(TASK, None, [1, 2])
        for k, a in enumerate(answers):
            ids = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            if k == 0 and planted:
                ep.add_planted(a, ids[:-1])
            else:
                ep.add_answer(Completion(ids, a, [-0.5] * len(ids)))
            if k < len(answers) - 1:
                ep.add_reply("# error", [7, 8])
        return ep

    right_first, repaired, failed = episode(RIGHT), episode(WRONG, RIGHT), episode(WRONG, WRONG)
    first, rest = split_first_answer(repaired.as_completion(), repaired.answers[0])
    cut = repaired.answer_starts[1] - 2  # the first answer ends where the reply's 2 tokens begin
    assert first.token_ids == repaired.token_ids[:cut] and first.text == WRONG and first.model_mask == [1] * cut
    assert first.logprobs == repaired.logprobs[:cut] and first.answer_starts == [0]
    assert rest.token_ids == repaired.token_ids and rest.model_mask == [0] * cut + repaired.model_mask[cut:]
    only_first, nothing_left = split_first_answer(right_first.as_completion(), RIGHT)
    assert only_first.token_ids == right_first.token_ids and not any(nothing_left.model_mask)

    # the verifier: RIGHT passes; first answers a later turn replaced are scored again, the others are not
    asked: list[str] = []

    def score(tasks: list, answers: list[str]) -> list[float]:
        asked.extend(answers)
        return [float(a == RIGHT) for a in answers]

    groups = [
        [right_first, repaired, failed, episode(RIGHT)],  # split: some went past one answer
        [episode(RIGHT), episode(RIGHT)],  # every episode ended at its first answer: not split
        [episode(WRONG, RIGHT, planted=True), episode(WRONG, WRONG, planted=True)],
    ]  # planted: not split
    finals = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert first_answer_rewards(groups, finals, score) == [[1.0, 0.0, 0.0, 1.0], None, None]
    assert asked == [WRONG, WRONG]

    grpo = algorithms.get_advantage("grpo")
    completions = [[ep.as_completion() for ep in g] for g in groups]
    split = ([split_first_answer(c, ep.answers[0]) for c, ep in zip(completions[0], groups[0])], [1.0, 0.0, 0.0, 1.0])
    kept = [(TASK, completions[0], [1.0, 1.0, 0.0, 1.0])]
    rows, adv = turn_credit_rows(kept, [split], grpo(torch.tensor([[1.0, 1.0, 0.0, 1.0]])), grpo, True)
    # hand-computed: episodes [1, 1, 0, 1]: mean .75, sample std .5; first answers [1, 0, 0, 1]: mean .5, std .5774
    assert torch.allclose(adv, torch.tensor([[0.866, -0.866, -0.866, 0.866], [0.5, 0.5, -1.5, 0.5]]), atol=1e-3)
    assert [c.text for c in rows[0][1]] == [RIGHT, WRONG, WRONG, RIGHT] and rows[0][2] == [1.0, 0.0, 0.0, 1.0]
    assert rows[1][1][1].model_mask[:cut] == [0] * cut and any(rows[1][1][1].model_mask[cut:])
    # always right in the end, not always first time: only the first answers train (the episodes are flat)
    flat_end = (TASK, completions[0][:2], [1.0, 1.0])
    rows, adv = turn_credit_rows([flat_end], [(split[0][:2], [1.0, 0.0])], torch.zeros(1, 2), grpo, True)
    assert len(rows) == 1 and torch.allclose(adv, torch.tensor([[0.7071, -0.7071]]), atol=1e-3)
    # without dynamic sampling both parts stay; an unsplit group passes as it was
    rows, adv = turn_credit_rows(
        [flat_end, (TASK, completions[1], [1.0, 1.0])],
        [(split[0][:2], [1.0, 0.0]), None],
        torch.zeros(2, 2),
        grpo,
        False,
    )
    assert len(rows) == 3 and rows[2][1] == completions[1] and adv.shape == (3, 2)
    with pytest.raises(ValueError, match="answer_credit 'turns': use one of episode, final, turn"):
        GRPOConfig(answer_credit="turns")


def test_multi_turn_grpo_step_is_deterministic_and_logs_episodes(tiny_model, monkeypatch) -> None:
    import copy
    import dataclasses

    import training.rewards
    from training.rl.config import GRPOConfig
    from training.rl.round import Round
    from training.tasksets.generators import generate

    # An untrained model earns 0 everywhere; a length-parity reward gives every group some variance. Its
    # answers are not Python, so the code-repair environment replies and every episode takes 2 turns.
    monkeypatch.setattr(training.rewards, "score_tasks", lambda tasks, texts: [float(len(t) % 2) for t in texts])
    model, tok = tiny_model
    tasks = generate("code", 12, 0, (3, 4))
    cfg = GRPOConfig(
        prompts_per_step=3,
        samples_per_prompt=4,
        max_new_tokens=6,
        dynamic_sampling=False,
        beta=0.05,
        device="cpu",
        lr=1e-2,
        max_turns=2,
        turn_cost=0.25,
    )

    def run() -> tuple[dict, dict, list[dict]]:
        policy = copy.deepcopy(model).train()
        rnd = Round.build(cfg, 1, policy, tok, copy.deepcopy(model).eval(), tasks, torch.device("cpu"))
        return rnd.step(0), policy.state_dict(), rnd.last_episodes

    m1, s1, rows = run()
    m2, s2, _ = run()
    assert m1["episode/turns_mean"] == 2.0 and m1["episode/ended_by_max_turns"] == 1.0
    assert m1["train/grad_norm"] > 0 and m1["groups_kept"] == 3
    # the turn cost: rewards are parity - 0.25 for the second answer
    assert all(r["reward"] in (-0.25, 0.75) for r in rows)
    assert rows and all(
        r["turns"] == 2 and len(r["answers"]) == 2 and r["tool_outputs"][0].startswith("# error:") for r in rows
    )
    untimed = {k: v for k, v in m1.items() if k != "step_seconds" and not k.startswith("time/")}
    assert untimed == {k: v for k, v in m2.items() if k != "step_seconds" and not k.startswith("time/")}
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    single = dataclasses.replace(cfg, max_turns=1)
    rnd = Round.build(
        single, 1, copy.deepcopy(model).train(), tok, copy.deepcopy(model).eval(), tasks, torch.device("cpu")
    )
    assert not any(k.startswith("episode/") for k in rnd.step(0)) and rnd.last_episodes == []
    # turn-level credit: every group went past one answer, so each is split, its first answers scored alone
    turn = dataclasses.replace(cfg, answer_credit="turn")
    rnd = Round.build(
        turn, 1, copy.deepcopy(model).train(), tok, copy.deepcopy(model).eval(), tasks, torch.device("cpu")
    )
    m = rnd.step(0)
    firsts = [len(ep.answers[0]) % 2 for ep in rnd.last_draw.episodes]
    assert len(firsts) == 12 and m["episode/first_answer_reward"] == sum(firsts) / 12 and m["train/grad_norm"] > 0


class AgainEnv:
    """A test environment (any tool plugs in through the registry): always asks once more."""

    name = "again"

    def __init__(self, task: Task) -> None:
        self.task = task

    def reset(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "user", "content": task.prompt}]

    def step(self, completion: str):
        from training.environments import Step

        return Step(f"again: {completion[:8]!r}", False, {"status": "asked"})


def test_round_logs_sample_episodes_to_mlflow(sft_run) -> None:  # noqa: F811 - the fixture imported below
    import mlflow

    from training import stage, storage
    from training.environments.base import register_environment
    from training.rl.config import GRPOConfig
    from training.stages.rl_round import run_round

    register_environment("again")(AgainEnv)
    cfg = GRPOConfig(
        steps=2,
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=6,
        checkpoint_every=0,
        device="cpu",
        holdout_per_domain=4,
        max_turns=3,
        environments={"math": "again"},
        log_samples=6,
    )
    result = stage.run_stage("rl_round_1", cfg, sft_run, lambda ctx: run_round(ctx, 1))
    rows = storage.read_json(storage.require_manifest(storage.join(sft_run, "rl_round_1")), "episodes.json")
    assert 0 < len(rows) <= 6
    math_rows = [r for r in rows if r["domain"] == "math"]
    assert math_rows and all(r["turns"] == 3 and len(r["tool_outputs"]) == 2 and "reward" in r for r in math_rows)
    assert all(r["turns"] == 1 and r["ended_by"] == "single_turn" for r in rows if r["domain"] != "math")
    client = mlflow.MlflowClient()
    assert "episodes.json" in {a.path for a in client.list_artifacts(result.mlflow_run_id)}
    table = client.load_table(
        client.get_run(result.mlflow_run_id).info.experiment_id, "episodes.json", run_ids=[result.mlflow_run_id]
    )
    assert {"turns", "tool_outputs", "reward", "answers"} <= set(table.columns)


from tests.training.rl.test_grpo import sft_run  # noqa: E402, F401 - the SFT stage fixture


def test_a_round_with_planted_first_answers_trains_the_repair_turn_only(monkeypatch) -> None:
    import dataclasses

    import training.rewards
    from training.rl.config import GRPOConfig
    from training.rl.round import Round
    from training.tasksets.generators import generate

    monkeypatch.setattr(training.rewards, "score_tasks", lambda tasks, texts: [float(len(t) % 2) for t in texts])
    tasks = generate("code", 12, 0, (4, 5))
    tok = models.build_tiny_tokenizer([t.prompt for t in tasks] + [t.reference for t in tasks], vocab_size=300)
    torch.manual_seed(0)
    model = models.build_tiny_model(models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2), tok)
    cfg = GRPOConfig(
        prompts_per_step=3,
        samples_per_prompt=4,
        max_new_tokens=6,
        dynamic_sampling=False,
        device="cpu",
        lr=1e-2,
        max_turns=2,
        planted_share=1.0,
    )
    rnd = Round.build(cfg, 1, model.train(), tok, copy_of(model).eval(), tasks, torch.device("cpu"))
    metrics = rnd.step(0)
    assert metrics["episode/planted_frac"] == 1.0 and metrics["train/grad_norm"] > 0
    assert rnd.curriculum.rates == {}  # a planted group's reward measures repair, not the task's difficulty
    reference = {t.id: t.reference for t in tasks}
    rows = rnd.last_episodes
    assert rows and all(
        r["planted_first"]
        and r["turns"] == 2
        and r["answers"][0] != reference[r["id"]]
        and r["tool_outputs"][0].startswith("# error:")
        for r in rows
    )
    # a planted answer whose reply leaves no room for the model's turn: nothing to train, the group is dropped
    short = models.build_tiny_model(models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=40), tok)
    rnd = Round.build(cfg, 1, short.train(), tok, copy_of(short).eval(), tasks, torch.device("cpu"))
    assert rnd.step(0)["groups_kept"] == 0
    with pytest.raises(ValueError, match="planted_share"):
        dataclasses.replace(cfg, max_turns=1)
    with pytest.raises(ValueError, match="planted_mirrors needs planted_share"):
        dataclasses.replace(cfg, planted_share=0.0, planted_mirrors=True)
    # mirrored: the reference is the planted first answer, the episode plays the mirror (its reward and id)
    rnd = Round.build(
        dataclasses.replace(cfg, planted_mirrors=True),
        1,
        model.train(),
        tok,
        copy_of(model).eval(),
        tasks,
        torch.device("cpu"),
    )
    assert rnd.step(0)["episode/planted_frac"] == 1.0 and rnd.curriculum.rates == {}
    rows = rnd.last_episodes
    mirrored = [r for r in rows if r["id"].endswith("~mirror")]
    assert mirrored and all(r["answers"][0] == reference[r["id"].removesuffix("~mirror")] for r in mirrored)


def copy_of(model):
    import copy

    return copy.deepcopy(model)
