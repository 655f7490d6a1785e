"""The math verifier against Hugging Face math-verify on answers in the forms real MATH and GSM8K outputs take.

Each pair is (reference answer, completion, correct?) with the label set by hand. On every pair our verifier
(lenient) and math-verify (`verify(parse(gold), parse(completion))`, as TRL and open-r1 call it) must agree
with each other and with the label: every correct form accepted, no wrong answer accepted.
"""

from __future__ import annotations

import pytest

from training.rewards.math import answer_format, format_ok, verify, verify_many, verify_strict
from training.rewards.symbolic import SymbolicChecker, latex_wrapped

MATH_FORM = [  # MATH: a worked solution ending in \boxed{...}
    ("\\frac{\\sqrt{3}}{2}", "Using the unit circle, $\\sin 60^\\circ = \\boxed{\\sqrt3/2}$.", True),
    ("\\frac{\\sqrt{3}}{2}", "So the value is $\\boxed{\\frac{\\sqrt{3}}{2}}$.", True),
    ("\\frac{\\sqrt{3}}{2}", "So the value is $\\boxed{\\frac{1}{2}}$.", False),
    ("\\frac{\\pi}{4}", "The angle is $\\boxed{\\pi/4}$ radians.", True),
    ("\\frac{\\pi}{4}", "The angle is $\\boxed{\\pi/2}$ radians.", False),
    ("(1, 2)", "The intersection point is $\\boxed{(1,2)}$.", True),
    ("(1, 2)", "The intersection point is $\\boxed{(2, 1)}$.", False),
    ("[0, 1)", "The solution set is $\\boxed{[0,1)}$.", True),
    ("[0, 1)", "The solution set is $\\boxed{[0,1]}$.", False),
    ("x^2+2x+1", "Expanding, we get $\\boxed{(x+1)^2}$.", True),
    ("x^2+2x+1", "Expanding, we get $\\boxed{(x-1)^2}$.", False),
    ("\\{1,2,3\\}", "The roots are $\\boxed{\\{3,2,1\\}}$.", True),
    ("\\{1,2,3\\}", "The roots are $\\boxed{\\{1,2\\}}$.", False),
    ("\\frac{7}{2}", "That is $\\boxed{3\\frac{1}{2}}$ cups.", True),
    ("\\frac{7}{2}", "That is $\\boxed{2\\frac{1}{2}}$ cups.", False),
    ("18", "In total she pays $\\boxed{18 \\text{ dollars}}$.", True),
    ("18", "In total she pays $\\boxed{19 \\text{ dollars}}$.", False),
    ("\\text{(B)}", "Comparing the options, the answer is $\\boxed{(B)}$.", True),
    ("\\text{(B)}", "Comparing the options, the answer is $\\boxed{(C)}$.", False),
    ("2\\sqrt{2}", "The distance is $\\sqrt{8} = \\boxed{2\\sqrt{2}}$.", True),
    ("2\\sqrt{2}", "The distance is $\\boxed{\\sqrt{6}}$.", False),
    ("\\frac{1}{2}", "The probability is $\\boxed{0.5}$.", True),
    ("\\frac{1}{2}", "The probability is $\\boxed{\\dfrac{1}{2}}$.", True),
    ("\\frac{1}{2}", "The probability is $\\boxed{\\frac{1}{3}}$.", False),
    ("-3", "Solving, $x = \\boxed{-3}$.", True),
    ("-3", "Solving, $x = \\boxed{3}$.", False),
    ("3+2i", "The product is $\\boxed{3+2i}$.", True),
    ("3+2i", "The product is $\\boxed{3-2i}$.", False),
    ("(-\\infty, 5]", "Hence $x \\in \\boxed{(-\\infty,5]}$.", True),
    ("(-\\infty, 5]", "Hence $x \\in \\boxed{(-\\infty,5)}$.", False),
]
GSM8K_FORM = [  # GSM8K: steps with <<calculator>> notes, then "#### N"
    ("72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72", True),
    ("72", "Natalia sold 48/2 = 24 clips in May.\n48+24 = 70\n#### 70", False),
    ("10", "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nSo she earned 0.2 x 50 = $10.\n#### 10", True),
    ("10", "Weng earns 12/60 = $0.2 per minute.\nSo she earned $12.\n#### 12", False),
    ("1200", "The total is 1,200 dollars.\n#### 1,200", True),
    ("1200", "The total is 1,020 dollars.\n#### 1,020", False),
    ("5", "She has 5 apples left.\n#### 5.00", True),
    ("0.5", "Half a pizza each.\n#### 1/2", True),
    ("-4", "The temperature dropped to -4 degrees.\n#### -4", True),
    ("-4", "The temperature dropped to 4 degrees.\n#### 4", False),
]
CORPUS = MATH_FORM + GSM8K_FORM


@pytest.fixture(scope="module")
def checker():
    c = SymbolicChecker(timeout_s=3.0)
    yield c
    c.close()


def _math_verify(gold: str, completion: str) -> bool:
    from math_verify import parse, verify as mv_verify

    return bool(mv_verify(parse(latex_wrapped(gold)), parse(completion)))


def test_corpus_is_big_and_balanced() -> None:
    assert len(CORPUS) >= 30
    assert sum(1 for *_, ok in CORPUS if ok) >= 20 and sum(1 for *_, ok in CORPUS if not ok) >= 15


def test_our_verifier_agrees_with_math_verify_on_every_pair(checker) -> None:
    ours = verify_many([c for _, c, _ in CORPUS], [g for g, _, _ in CORPUS], checker=checker)
    theirs = [_math_verify(g, c) for g, c, _ in CORPUS]
    labels = [ok for *_, ok in CORPUS]
    disagreements = [(g, c, o, t) for (g, c, _), o, t in zip(CORPUS, ours, theirs) if o != t]
    assert disagreements == []
    assert ours == labels  # every correct form accepted, no wrong answer accepted
    print(
        f"agreement: {len(CORPUS) - len(disagreements)}/{len(CORPUS)} pairs; wrong answers accepted: "
        f"{sum(o and not ok for o, ok in zip(ours, labels))}"
    )


def test_exact_numeric_path_decides_plain_numbers_without_math_verify() -> None:
    class Refuse:
        def equal_many(self, pairs):
            raise AssertionError(f"math-verify asked about {pairs}")

    assert verify_many(
        ["#### 72", "the answer is 1,234.", "x = 0.75", "#### 71"], ["72", "1234", "3/4", "72"], checker=Refuse()
    ) == [True, True, True, False]
    # deliberately stricter than math-verify's 6-digit float rounding: an approximation is not the answer
    assert verify_many(["\\boxed{0.333333}"], ["1/3"], checker=Refuse()) == [False]


def test_strict_needs_the_required_format_and_lenient_does_not(checker) -> None:
    boxed_ref = "so $\\boxed{\\frac{1}{2}}$"
    assert answer_format({}, boxed_ref) == "boxed" and answer_format({}, "3 + 4 = 7\n#### 7") == "gsm8k"
    assert answer_format({"answer_format": "gsm8k"}, boxed_ref) == "gsm8k" and answer_format({}, "7") == "final"
    loose = "The probability is one half, i.e. 1/2."
    assert verify(loose, "\\frac{1}{2}") is True
    assert verify_strict(loose, "\\frac{1}{2}", "boxed") is False
    assert verify_strict("so $\\boxed{0.5}$", "\\frac{1}{2}", "boxed") is True
    assert verify_strict("\\boxed{1} and later \\boxed{2}", "2", "boxed") is True  # the last \boxed{} counts
    assert verify_strict("steps\n#### 12", "12", "gsm8k") and not verify_strict("the answer is 12", "12", "gsm8k")
    assert format_ok("so \\boxed{7}", "boxed") and not format_ok("so 7", "boxed")


def test_a_hanging_comparison_is_cut_off_and_the_next_pair_still_scored() -> None:
    slow = SymbolicChecker(timeout_s=1.0)
    try:
        # a deadline far below one math-verify call: every pair runs past it and its worker is killed
        slow_deadline = type(slow).deadline_s
        type(slow).deadline_s = property(lambda self: 0.001)  # type: ignore[assignment]
        try:
            assert slow.equal_many([("\\pi", "\\pi"), ("x", "x")]) == [False, False]
            assert slow.timeouts == 2
        finally:
            type(slow).deadline_s = slow_deadline  # type: ignore[assignment]
        assert slow.equal_many([("\\frac{1}{2}", "1/2")]) == [True]  # a fresh worker takes over
    finally:
        slow.close()
