"""The math verifier: pull the final answer out of a completion, normalise it, compare exactly.

    extract_answer("so the answer is 1,234.")   -> "1,234"
    parse_number("−3/4") == Fraction(-3, 4)
    answers_match("0.75", "3/4")                -> True
    math_reward(prompts, completions, answer=[...], verifier=[...]) -> [1.0, 0.0, None, ...]

Extraction, in priority order (the last occurrence of the first kind that is present wins):
`\\boxed{X}` (braces matched), `#### X` (GSM8K), "answer is X" / "answer: X" / "answer = X", else the last
number in the text. Numbers are compared as exact `Fraction`s after normalisation: whitespace, thousands
separators (`1,234` / `1 234` with thin spaces / `1_234`), a leading `+`, unicode minus signs, `-0`, trailing
`.0`, `$`/`%` decoration, `a/b` and `\\frac{a}{b}` fractions, decimals and exponents. A non-numeric answer
falls back to a case- and whitespace-insensitive string comparison.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from training.rewards import register_reward

_MINUS = "\u2212\ufe63\uff0d\u2012\u2013"  # minus sign, small/fullwidth hyphen-minus, figure and en dash
_THOUSANDS = ",\u2009\u202f_'"  # comma, thin space, narrow no-break space, underscore, apostrophe (Swiss)
_SIGN = rf"[+\-{_MINUS}]"
_INT = rf"(?:\d{{1,3}}(?:[{_THOUSANDS}]\d{{3}})+|\d+)"
_DEC = rf"(?:{_INT}(?:\.\d*)?|\.\d+)(?:[eE][+\-]?\d+)?"
# A sign counts only when it does not follow a digit/letter/closing bracket: "10-3" is 10 then 3, not -3.
NUMBER_RE = re.compile(
    rf"(?<![\w.)\]}}])(?:{_SIGN}\s?)?{_DEC}(?:\s*/\s*(?:{_SIGN}\s?)?{_DEC})?"
    rf"|(?<=[\w)\]}}]){_DEC}(?:\s*/\s*{_DEC})?"
)
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|was|:|=)\s*:?\s*", re.IGNORECASE)
_HASHES_RE = re.compile(r"####\s*")


def _boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces matched."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip()
    return None


def _first_answer_after(rest: str) -> str:
    """The answer that follows a marker: its first number if the line has one, else the line itself."""
    line = rest.strip().split("\n", 1)[0].strip()
    if parse_number(line) is not None:
        return line.rstrip(".")
    m = NUMBER_RE.search(_FRAC_RE.sub(r"\1/\2", line.replace("$", "")))
    if m:
        return m.group(0).strip().rstrip(".")
    return line.rstrip(".").strip()


def extract_answer(text: str) -> str | None:
    """The final answer a completion states, as text (not yet normalised); None if it states none."""
    if not isinstance(text, str) or not text.strip():
        return None
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    marks = list(_HASHES_RE.finditer(text))
    if marks:
        return _first_answer_after(text[marks[-1].end():]) or None
    marks = list(_ANSWER_IS_RE.finditer(text))
    if marks:
        found = _first_answer_after(text[marks[-1].end():])
        if found:
            return found
    numbers = NUMBER_RE.findall(_FRAC_RE.sub(r"\1/\2", text))
    return numbers[-1].strip().rstrip(".") if numbers else None


def _decimal(text: str) -> Fraction | None:
    t = text.strip()
    sign = 1
    if t and t[0] in "+-":
        sign = -1 if t[0] == "-" else 1
        t = t[1:].strip()
    if not t or t[0] in "+-":
        return None
    if re.fullmatch(rf"\d{{1,3}}(?:[{_THOUSANDS} ]\d{{3}})+(?:\.\d*)?(?:[eE][+\-]?\d+)?", t):
        t = re.sub(rf"[{_THOUSANDS} ]", "", t)
    if not re.fullmatch(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+\-]?\d+)?", t):
        return None
    if t.endswith("."):
        t = t[:-1]
    mantissa, _, exponent = t.lower().partition("e")
    if len(mantissa) > 4000 or (exponent and abs(int(exponent)) > 400):
        return None  # 1e999999999 would build a gigantic integer: no answer is written like that
    return sign * Fraction(t)


def parse_number(text: str | None) -> Fraction | None:
    """The exact value of a number written in any of the accepted forms, else None."""
    if text is None:
        return None
    t = unicodedata.normalize("NFKC", str(text))
    for ch in _MINUS:
        t = t.replace(ch, "-")
    t = _FRAC_RE.sub(r"(\1)/(\2)", t)
    t = t.strip().strip("$").strip()
    t = re.sub(r"^\\\(|\\\)$", "", t).strip()  # \( ... \)
    t = t.rstrip(".").rstrip("%").strip() if not re.fullmatch(r"\d+\.", t.strip()) else t
    t = t.replace("(", "").replace(")", "") if t.count("(") == t.count(")") <= 2 else t
    if not t:
        return None
    if "/" in t:
        num, _, den = t.partition("/")
        a, b = _decimal(num), _decimal(den)
        if a is None or b is None or b == 0:
            return None
        return a / b
    return _decimal(t)


def _norm_text(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split()).rstrip(".").strip()


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """Exact equality of two answers: as numbers when both parse, else as normalised text."""
    if predicted is None or reference is None:
        return False
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return a == b
    if (a is None) != (b is None):
        return False
    return bool(_norm_text(predicted)) and _norm_text(predicted) == _norm_text(reference)


def verify(completion: str, answer: str | None) -> bool:
    """Does `completion` state `answer` as its final answer?"""
    return answers_match(extract_answer(completion), answer)


@register_reward("math")
def math_reward(prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[Any] | None = None,
                verifier: Sequence[str] | None = None, **_: Any) -> list[float | None]:
    """1.0 when the completion's final answer equals `answer`; None for rows of another verifier or with
    no reference answer."""
    answers = list(answer) if answer is not None else [None] * len(completions)
    out: list[float | None] = []
    for i, completion in enumerate(completions):
        if (verifier is not None and verifier[i] != "math") or answers[i] is None:
            out.append(None)
            continue
        out.append(1.0 if verify(completion, str(answers[i])) else 0.0)
    return out
