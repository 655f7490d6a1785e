"""The math checker: extraction forms and normalisation edge cases."""

from __future__ import annotations

from fractions import Fraction

import pytest

from training.rewards.math import answers_match, extract_answer, math_reward, parse_number, verify


@pytest.mark.parametrize(
    "text,expected",
    [
        ("68", "68"),
        ("  68\n", "68"),
        ("2+3=5", "5"),
        ("10-3=7", "7"),
        ("7-3", "3"),  # a minus after a digit is an operator, not a sign
        ("-5", "-5"),
        ("x = −3/4", "−3/4"),  # unicode minus
        ("So the answer is 1,234.", "1,234"),
        ("The answer is: 42 apples, not 41", "42"),
        ("answer = 3/4", "3/4"),
        ("Answer: $12.50", "$12.50"),  # the marker's whole line when it is one number
        ("the answer is 1 234", "1 234"),
        ("steps 1, 2, 3\n#### 1,000", "1,000"),
        ("first #### 3 then #### 4", "4"),  # last marker wins
        (r"so \boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{12} and then 13", "12"),  # boxed beats last number
        (r"\boxed{x^{2}}", "x^{2}"),  # nested braces matched
        ("answer is 3 but the last number is 9", "3"),  # "answer is" beats last number
        ("it is 2.5.", "2.5"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text,value",
    [
        ("42", 42),
        ("+42", 42),
        ("-0", 0),
        ("0.0", 0),
        ("5.0", 5),
        ("5.", 5),
        (".5", Fraction(1, 2)),
        ("1,234", 1234),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("1 234", 1234),
        ("1\u2009234", 1234),
        ("1_000", 1000),
        ("3/4", Fraction(3, 4)),
        ("-3/4", Fraction(-3, 4)),
        ("\u22123/4", Fraction(-3, 4)),
        ("6/8", Fraction(3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"\dfrac{-1}{2}", Fraction(-1, 2)),
        ("$12.50", Fraction(25, 2)),
        ("50%", 50),
        ("1e3", 1000),
        ("  7  ", 7),
        ("\uff17", 7),  # fullwidth 7
    ],
)
def test_parse_number(text, value) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["abc", "1/0", "1,23", "12,34", "--5", "", None, "3/", "1.2.3"])
def test_parse_number_rejects(text) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "pred,ref,ok",
    [
        ("0.75", "3/4", True),
        ("3/4", "0.75", True),
        ("-0", "0", True),
        ("+5", "5.0", True),
        ("1,000", "1000", True),
        ("\u22127", "-7", True),
        ("7", "-7", False),
        ("0.333", "1/3", False),
        ("2", "2.0001", False),
        ("Paris", " paris ", True),
        ("Paris", "London", False),
        ("5", "five", False),
        (None, "5", False),
        ("5", None, False),
        ("", "", False),
    ],
)
def test_answers_match(pred, ref, ok) -> None:
    assert answers_match(pred, ref) is ok


def test_verify_full_completions() -> None:
    assert verify("Q: 23+45=? A: 68", "68")  # the prompt's numbers come first; the last one counts
    assert verify("We add them: 23 + 45 = 68.\nThe answer is 68.", "68")
    assert verify("#### 1,234", "1234")
    assert not verify("69", "68")
    assert not verify("68 or 69", "68")  # the last number is the answer


def test_reward_fn_contract() -> None:
    out = math_reward(
        ["p"] * 4, ["5", "6", "5", "x"], answer=["5", "5", None, "5"], verifier=["math", "math", "math", "code"]
    )
    assert out == [1.0, 0.0, None, None]


def test_hostile_completions_are_cheap_and_unrewarded() -> None:
    import time

    start = time.perf_counter()
    for text in (
        "1" * 100_000,
        "1," * 50_000,
        "-" * 100_000,
        "1e999999999",
        "\\boxed{" * 10_000,
        "#### " * 20_000,
        "1/" * 50_000,
    ):
        assert not verify(text, "5")
    assert time.perf_counter() - start < 2.0
    assert parse_number("1e999999999") is None and parse_number("1e400") == 10**400
