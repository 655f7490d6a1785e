"""The code verifier through the real sandbox, the reward registry, and score_tasks dispatch."""

from __future__ import annotations

import importlib.util

import pytest

from training import rewards
from training.rewards import REWARDS, UnknownVerifier, get_reward, register_reward, score_tasks
from training.rewards.code import assemble_program, code_reward, extract_program
from training.tasksets.generators import generate
from training.tasksets.schema import Task

needs_sandbox = pytest.mark.skipif(
    importlib.util.find_spec("sandbox") is None, reason="sandbox/ is not importable in this checkout"
)


@pytest.fixture
def batches(monkeypatch) -> list:
    """Every batch of jobs sent to the real local sandbox (a spy: the jobs still run there)."""
    import sandbox

    sent: list = []
    real = sandbox.run_batch

    def spy(jobs, **kw):
        sent.append(list(jobs))
        return real(jobs, **kw)

    monkeypatch.setattr(sandbox, "run_batch", spy)
    return sent


def test_registry_names_and_conflicts() -> None:
    assert {"math", "code", "json_rules"} <= set(REWARDS)
    with pytest.raises(ValueError, match="already registered"):
        register_reward("math")(lambda prompts, completions, **c: [None] * len(completions))
    same = REWARDS["math"]
    assert register_reward("math")(same) is same  # re-registering the same function is harmless
    with pytest.raises(
        UnknownVerifier,
        match="unknown verifier 'regex'; known verifiers: code, format, ifeval, json_rules, judge, math",
    ):
        get_reward("regex")
    with pytest.raises(UnknownVerifier, match="known verifiers"):
        score_tasks([Task("t", "math", "p", "regex")], ["1"])


def test_program_assembly() -> None:
    assert extract_program("```python\ndef f(x):\n    return 1\n```\nexplanation") == "def f(x):\n    return 1\n"
    assert extract_program("def f(x): return 1") == "def f(x): return 1"
    meta = {"program_prefix": "def f(x):\n", "program_suffix": "\n"}
    assert assemble_program("    return x", meta) == "def f(x):\n    return x\n"


def test_code_reward_without_sandbox_work() -> None:
    # rows of other verifiers, empty completions and malformed tests never reach the sandbox
    out = code_reward(
        ["p"] * 3,
        ["", "def f(x): return x", "x"],
        tests=[[{"call": "f(1)", "expected": 1}], [{"call": "f(1"}], []],
        verifier=["code", "code", "math"],
    )
    assert out == [0.0, 0.0, None]


@needs_sandbox
def test_code_reward_runs_one_batch_in_sandbox(batches) -> None:
    import sandbox

    tests = [{"call": "f(2)", "expected": 5}, {"call": "f(-3)", "expected": 0}]
    completions = [
        "def f(x): return x+3",
        "def f(x): return x+4",
        "```python\ndef f(x):\n    return 3+x\n```",
        "def f(x): return",
        "import time\ndef f(x):\n    while True: pass",
    ]
    out = code_reward(
        ["p"] * 5,
        completions,
        tests=[tests] * 5,
        verifier=["code"] * 5,
        id=[f"t{i}" for i in range(5)],
        limits=sandbox.Limits(wall_s=1.5, cpu_s=1.0),
    )
    assert out == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert [len(b) for b in batches] == [5]


@needs_sandbox
def test_a_group_repeating_a_program_runs_it_once_and_each_row_gets_its_verdict(batches) -> None:
    from training.rewards.code import code_job, run_jobs

    right, wrong = "def f(x): return x+3", "def f(x): return x-3"
    tests = [{"call": "f(2)", "expected": 5}]
    other = [{"call": "f(2)", "expected": -1}]  # the same program against other tests is another job
    rows = [(right, tests), (wrong, tests), (right, tests), (right, other), (wrong, tests), (right, tests)]
    jobs = [code_job(p, t, {}, f"row{i}", None) for i, (p, t) in enumerate(rows)]
    verdicts = run_jobs(jobs)
    assert [job.id for b in batches for job in b] == ["row0", "row1", "row3"]
    assert [v.ok for v in verdicts] == [True, False, True, False, False, True]
    assert [v.id for v in verdicts] == [f"row{i}" for i in range(6)]
    out = code_reward(["p"] * 6, [p for p, _ in rows], tests=[t for _, t in rows], verifier=["code"] * 6)
    assert out == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0] and sum(len(b) for b in batches) == 6


@needs_sandbox
def test_code_that_does_not_parse_scores_zero_without_a_sandbox_run(batches) -> None:
    tests = [{"call": "f(2)", "expected": 5}]
    completions = [
        "def f(x) return x+3",
        "(" * 5000 + "1",
        "def f(x):\n    return x+3\x00",
        '{")*9',
        "def f(x): return x+3",
    ]
    out = code_reward(["p"] * 5, completions, tests=[tests] * 5, verifier=["code"] * 5)
    assert out == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert [job.program for b in batches for job in b] == ["def f(x): return x+3"]  # only the one that parses ran


@needs_sandbox
def test_generated_references_pass_their_own_verifiers() -> None:
    """Every domain's reference completion scores 1.0 (code through the sandbox), and a wrong one 0.0."""
    tasks = generate("math", 10, 3) + generate("code", 15, 3) + generate("extraction", 10, 3)
    assert score_tasks(tasks, [t.reference for t in tasks]) == [1.0] * len(tasks)
    wrong = [
        "0" if t.domain == "math" and t.answer != "0" else "def f(*a): return None" if t.domain == "code" else "{}"
        for t in tasks
    ]
    scores = score_tasks(tasks, wrong)
    assert scores.count(1.0) <= 1  # "None" may happen to be right for no generated task; allow one fluke


def test_score_tasks_dispatch_without_code() -> None:
    tasks = generate("math", 3, 0) + generate("extraction", 3, 0)
    comps = [t.reference for t in tasks]
    comps[1] = "nope"
    assert score_tasks(tasks, comps) == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="3 tasks but 2 completions"):
        score_tasks(tasks[:3], comps[:2])
    assert rewards.task_columns(tasks[:1])["answer"] == [tasks[0].answer]
