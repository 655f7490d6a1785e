"""Every dimension evaluation measures, asserted on a planted model: a fake rollout engine whose answers are
fixed per task (right or wrong greedily, how many of its samples pass, up to which distractor length it still
answers), so each figure in report.json can be computed by hand."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from training.evaluation.config import EvalConfig
from training.evaluation.measure import evaluate_model, failure_modes, long_tail
from training.tasksets.generators import generate


class CharTokenizer:
    """One token per character: distractor budgets are character counts."""

    eos_token_id = None
    chat_template = None

    def __call__(self, text: str, **_: object) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@dataclass
class Out:
    text: str


class PlantedEngine:
    """Greedy: right for the tasks in `greedy_right` while the distractor in front is at most `reads[domain]`
    characters. Sampled: `sampled_right[task id]` of the n samples are right (the first ones)."""

    def __init__(self, tasks, greedy_right: set[str], sampled_right: dict[str, int], reads: dict[str, int]) -> None:
        self.tasks, self.greedy_right, self.sampled_right, self.reads = tasks, greedy_right, sampled_right, reads

    def _task(self, text: str):
        return max((t for t in self.tasks if text.endswith(t.prompt)), key=lambda t: len(t.prompt))

    def generate(self, prompts, n, max_new_tokens, temperature=0.0, seed=0):
        out = []
        for ids in prompts:
            text = "".join(chr(i) for i in ids)
            task = self._task(text)
            wrong = " 99999" if task.domain == "math" else "Wrong, Words"
            if temperature == 0.0:
                ok = task.id in self.greedy_right and len(text) - len(task.prompt) <= self.reads[task.domain]
                out.append([Out(task.reference if ok else wrong)] * n)
            else:
                c = self.sampled_right.get(task.id, 0)
                out.append([Out(task.reference if j < c else wrong) for j in range(n)])
        return out


CFG = EvalConfig(
    n_samples=4,
    ks=[1, 4],
    repair_turns=0,
    long_context_tasks=10,
    max_new_tokens=8,
    long_context_fractions=[0.1, 0.25, 0.5],
)


@pytest.fixture(scope="module")
def planted():
    math_tasks = generate("math", 10, 0, difficulties=(1, 2))  # even index: L1, odd: L2
    inst_tasks = generate("instruction", 10, 0, difficulties=(1, 2))
    tasks = math_tasks + inst_tasks
    greedy = {t.id for t in math_tasks[:6]} | {t.id for t in inst_tasks}
    sampled = {
        **{t.id: 4 for t in math_tasks[:6]},
        math_tasks[6].id: 1,
        math_tasks[7].id: 1,
        **{t.id: 4 for t in inst_tasks},
    }
    # math is read through distractors of up to 60 characters, instruction through any
    engine = PlantedEngine(tasks, greedy, sampled, reads={"math": 60, "instruction": 10**6})
    report = evaluate_model(engine, CharTokenizer(), tasks, CFG, max_context=400)
    return report, math_tasks


def test_pass1_format_and_pass_at_k(planted) -> None:
    report, _ = planted
    math, inst = report["domains"]["math"], report["domains"]["instruction"]
    assert math["pass1"] == {"passed": 6, "total": 10} and inst["pass1"] == {"passed": 10, "total": 10}
    assert math["format"] == {"passed": 10, "total": 10}  # " 99999" is a number: well-formed, wrong
    assert inst["format"] == {"passed": 10, "total": 10}
    # pass@1 over samples: (6*4 + 1 + 1)/40 = 0.65; pass@4 = share of tasks with a right sample = 8/10
    assert math["pass_at_k"] == pytest.approx({"1": 0.65, "4": 0.8})


def test_failure_modes_per_domain_and_difficulty(planted) -> None:
    report, _ = planted
    math = report["domains"]["math"]
    assert math["failure_modes"] == {"capability": 2, "instability": 2}
    # L1 = tasks 0,2,4,6,8: 6 unstable (1/4 samples), 8 incapable; pass@1 (1+1+1+0.25+0)/5, pass@4 4/5
    by = math["failure_modes_by_difficulty"]
    assert by["1"] == {"capability": 1, "instability": 1, "total": 5, "pass_at_k": pytest.approx({"1": 0.65, "4": 0.8})}
    assert by["2"]["capability"] == 1 and by["2"]["instability"] == 1
    assert report["domains"]["instruction"]["failure_modes_by_difficulty"]["1"]["capability"] == 0


def test_long_context_sweep_is_a_curve(planted) -> None:
    report, _ = planted
    math = report["domains"]["math"]
    # fractions of a 400-token window: 40, 100, 200 characters of distractors; math reads up to 60
    assert [(p["fraction"], p["distractor_tokens"], p["passed"], p["total"]) for p in math["long_context_sweep"]] == [
        (0.1, 40, 6, 10),
        (0.25, 100, 0, 10),
        (0.5, 200, 0, 10),
    ]
    assert math["long_context"]["passed"] == 6 and math["long_context"]["total"] == 30
    assert math["long_context"]["consistency"] == pytest.approx(6 / 18)  # greedy passes kept over 3 points
    inst = report["domains"]["instruction"]
    assert [p["passed"] for p in inst["long_context_sweep"]] == [10, 10, 10]


def test_long_tail_names_the_worst_decile(planted) -> None:
    report, math_tasks = planted
    tail = report["long_tail"]
    # 20 tasks -> 2 in the worst decile: the two math tasks no sample solves (8: L1, 9: L2)
    assert tail["worst_decile"] == {
        "tasks": sorted([math_tasks[8].id, math_tasks[9].id]),
        "threshold": 0.0,
        "cells": {"math/L1": 1, "math/L2": 1},
    }
    assert tail["cells"]["math/L1"] == pytest.approx({"tasks": 5, "mean": 0.65, "min": 0.0, "never": 0.2})
    assert tail["cells"]["instruction/L2"] == pytest.approx({"tasks": 5, "mean": 1.0, "min": 1.0, "never": 0.0})


def test_pure_helpers_hand_computed() -> None:
    fm = failure_modes([True, False, False], [3, 2, 0], n_samples=4, ks=[1, 2, 8])
    # pass@2: 1 - C(1,2)/C(4,2) = 1; 1 - C(2,2)/C(4,2) = 5/6; 0 -> mean (1 + 5/6 + 0)/3; k=8 > n is left out
    assert fm == {
        "capability": 1,
        "instability": 1,
        "total": 3,
        "pass_at_k": pytest.approx({"1": (0.75 + 0.5 + 0) / 3, "2": (1 + 5 / 6) / 3}),
    }
    tail = long_tail([("a", "math", 1, 1, 2), ("b", "math", 1, 2, 2), ("c", "code", 3, 0, 2)], decile=0.5)
    # ceil(0.5 * 3) = 2 worst: c (0.0), then a (0.5)
    assert tail["worst_decile"] == {"tasks": ["c", "a"], "threshold": 0.5, "cells": {"code/L3": 1, "math/L1": 1}}
    assert long_tail([])["worst_decile"] == {"tasks": [], "threshold": None, "cells": {}}


def test_fractions_validated() -> None:
    with pytest.raises(ValueError, match="long_context_fractions"):
        EvalConfig(long_context_fractions=[0.5, 1.0])


def test_report_shows_sweep_failure_modes_and_tail(planted, tmp_path) -> None:
    from training.evaluation.plots import plot_report
    from training.evaluation.report import render_markdown

    report, math_tasks = planted
    full = {
        "run_id": "r",
        "candidate_stage": "rl_round_1",
        "models": {"sft": {"uri": "", **report}, "candidate": {"uri": "", **report}},
    }
    md = render_markdown(full)
    assert "| candidate | math | 6/10 (60%) | 0/10 (0%) | 0/10 (0%) |" in md
    assert "| math | L1 | 1 / 1 / 5 | @1 0.65, @4 0.80 |" in md
    assert f"Worst decile: 2 tasks at or below 0% success, in math/L1 (1), math/L2 (1): {math_tasks[8].id}" in md
    assert "![long-context sweep](plots/long_context_sweep.png)" in md
    plots = plot_report(full, tmp_path)
    assert plots["long_context_sweep"].stat().st_size > 0
