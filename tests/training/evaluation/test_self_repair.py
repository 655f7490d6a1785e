"""Self-repair at evaluation goes through the same environment as RL: greedy episodes of up to 1 + R answers,
the code-repair environment showing the visible tests' failure; each turn judged by the hidden tests. A planted
engine fixes its program once the context shows what was expected (real tokenizer, template and sandbox)."""

from __future__ import annotations

from training.evaluation.config import EvalConfig
from training.evaluation.measure import repair_report, self_repair
from training.modeling import models
from training.modeling.chat import PromptFormat
from training.rollout.base import Completion
from training.stages.gate import metric_counts
from training.tasksets.schema import Task


def code_task(tid: str, k: int) -> Task:
    tests = [{"call": f"f({x})", "expected": x + k} for x in (2, 0, 7)]
    return Task(
        tid,
        "code",
        f"Write f(x) returning x plus {k}.",
        "code",
        reference=f"def f(x): return x+{k}",
        tests=tests,
        metadata={"visible_tests": tests[:1]},
    )


FIXES = code_task("fixes", 3)  # wrong first, right once it sees "expected"
FIRST = code_task("first", 4)  # right at once
NEVER = code_task("never", 5)  # wrong whatever it is told
MATH = Task("m", "math", "Q: 1+1=? A:", "math", reference="2", answer="2")


class RepairingEngine:
    def __init__(self, tok) -> None:
        self.tok, self.stop_ids = tok, [tok.eos_token_id]

    def generate(self, prompts, n, max_new_tokens, temperature=1.0, top_p=1.0, seed=0):
        out = []
        for ids in prompts:
            text = self.tok.decode(list(ids))
            if "Q: 1+1" in text:
                answer = "2"
            elif "plus 4" in text or ("plus 3" in text and "expected" in text):
                answer = f"def f(x): return x+{4 if 'plus 4' in text else 3}"
            else:
                answer = "def f(x): return x-1"
            token_ids = list(self.tok(answer, add_special_tokens=False)["input_ids"]) + [self.tok.eos_token_id]
            out.append([Completion(token_ids, answer, [0.0] * len(token_ids))] * n)
        return out


def test_self_repair_reports_first_attempt_and_pass_within_each_turn() -> None:
    tasks = [FIXES, FIRST, NEVER, MATH]
    tok = models.build_tiny_tokenizer(
        [t.prompt for t in tasks]
        + [t.reference for t in tasks]
        + ["# error: expected got # fixed: tests passed first failure"],
        vocab_size=300,
    )
    cfg = EvalConfig(repair_turns=2, max_new_tokens=16)
    within, cut = self_repair(RepairingEngine(tok), tasks, cfg, PromptFormat(tok))
    assert within == {0: [False, True, True], 1: [True, True, True], 2: [False, False, False]}  # math: no env
    assert cut == {0: 0, 1: 0, 2: 0}
    report = repair_report(list(within.values()), 0)
    assert report["first_attempt"] == {"passed": 1, "total": 3} and report["failed_first"] == 2
    assert report["pass_within"] == {
        "1": {"passed": 1, "total": 3},
        "2": {"passed": 2, "total": 3},
        "3": {"passed": 2, "total": 3},
    }
    assert report["repaired_within"] == {"1": 1, "2": 1} and report["pass_within_turns"] == 2 / 3
    # the gate's self_repair rule: first-attempt passes + repaired = pass within all turns
    counts = metric_counts(
        {"models": {"candidate": {"domains": {"code": {"pass1": report["first_attempt"], "self_repair": report}}}}}[
            "models"
        ]["candidate"],
        "self_repair",
    )
    assert (counts["code"].passed, counts["code"].total) == (2, 3)


def test_evaluate_model_reports_self_repair_for_domains_with_an_environment() -> None:
    from training.evaluation.measure import evaluate_model

    tasks = [FIXES, FIRST, NEVER, MATH]
    tok = models.build_tiny_tokenizer([t.prompt for t in tasks] + [t.reference for t in tasks], vocab_size=300)
    cfg = EvalConfig(
        repair_turns=1, max_new_tokens=16, n_samples=2, ks=[1, 2], long_context_tasks=1, distractor_tokens=8
    )
    report = evaluate_model(RepairingEngine(tok), tok, tasks, cfg, fmt=PromptFormat(tok))["domains"]
    assert "self_repair" not in report["math"]
    sr = report["code"]["self_repair"]
    assert sr["first_attempt"] == report["code"]["pass1"] == {"passed": 1, "total": 3}
    assert sr["pass_within"]["2"] == {"passed": 2, "total": 3} and sr["repaired_within"] == {"1": 1}
