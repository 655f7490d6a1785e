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

Symbolic answers (`\\frac{\\sqrt{3}}{2}` vs `\\sqrt3/2`, intervals, sets, `(x+1)^2` vs `x^2+2x+1`, mixed
numbers, units, choices) go to Hugging Face `math-verify` (`training/rewards/symbolic.py`, in a worker process,
every check time-bounded). The exact numeric path stays first: when both answers are plain numbers it decides
alone (exactly, so `0.333333` is not `1/3`), and math-verify is asked only when one of them is not.

Two scores side by side (evaluation reports both):
- lenient (`verify`): the answer wherever the completion states it (the extraction order above);
- strict (`verify_strict`): the answer only where the task's format requires it: the last `\\boxed{}` for
  "boxed" tasks, the last `#### X` for "gsm8k" tasks, the extraction order above for "final" tasks. The format
  is `metadata["answer_format"]`, else read off the reference solution (a `\\boxed{}` or `####` in it).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from training.rewards.base import REWARDS, Verifier, register_verifier
from training.rewards.symbolic import default_checker

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
_MIXED_RE = re.compile(r"([+-]?)(\d+)\s*\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_ANSWER_IS_RE = re.compile(r"answer\s*(?:is|was|:|=)\s*:?\s*", re.IGNORECASE)
_HASHES_RE = re.compile(r"####\s*")
_DOLLARS_RE = re.compile(r"\$\s*([^$]+?)\s*\$")


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
                return text[i + 1 : j].strip()
    return None


def _first_answer_after(rest: str) -> str:
    """The answer that follows a marker: its first number if the line has one, else the line itself."""
    line = rest.strip().split("\n", 1)[0].strip()
    if parse_number(line) is not None:
        return line.rstrip(".")
    math_span = _DOLLARS_RE.search(line)
    if math_span and parse_number(math_span.group(1)) is None:
        return math_span.group(1).strip()  # "$\\sqrt{3}/2$": a symbolic answer, whole (its first number is not it)
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
        return _first_answer_after(text[marks[-1].end() :]) or None
    marks = list(_ANSWER_IS_RE.finditer(text))
    if marks:
        found = _first_answer_after(text[marks[-1].end() :])
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
    mixed = _MIXED_RE.fullmatch(t.strip().strip("$").strip())
    if mixed:  # 3\frac{1}{2} is 7/2 (not "31/2" once the fraction is rewritten)
        whole, frac_num, frac_den = (_decimal(g) for g in mixed.group(2, 3, 4))
        if whole is None or frac_num is None or not frac_den:
            return None
        return (-1 if mixed.group(1) == "-" else 1) * (whole + frac_num / frac_den)
    t = _FRAC_RE.sub(r"(\1)/(\2)", t)
    if re.search(r"[\d.]\s*\(", t):
        return None  # a number written against a bracket (2(3)/(4), 2\frac..): an expression, not a number
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


ANSWER_FORMATS = ("boxed", "gsm8k", "final")
# A final answer longer than this is not an answer; it is never worth a symbolic parse.
MAX_SYMBOLIC_CHARS = 300
_NUMBER_CHARS_RE = re.compile(r"[\d\s.,_+\-eE/%$]+")


def answer_format(metadata: dict[str, Any] | None, reference: str | None = None) -> str:
    """The format a task's answer must take: metadata["answer_format"], else read off the reference."""
    fmt = (metadata or {}).get("answer_format")
    if fmt in ANSWER_FORMATS:
        return str(fmt)
    if reference and ("\\boxed" in reference or "\\fbox" in reference):
        return "boxed"
    if reference and "####" in reference:
        return "gsm8k"
    return "final"


def extract_strict(text: str, fmt: str) -> str | None:
    """The answer only where format `fmt` puts it (None when the completion does not follow the format)."""
    if not isinstance(text, str):
        return None
    if fmt == "boxed":
        return _boxed(text) or None
    if fmt == "gsm8k":
        marks = list(_HASHES_RE.finditer(text))
        return (_first_answer_after(text[marks[-1].end() :]) or None) if marks else None
    return extract_answer(text)


def _exact(predicted: str | None, reference: str) -> bool | None:
    """The fast path: True/False when it can decide alone, None when a symbolic check is needed."""
    if predicted is None:
        return False
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return a == b
    if _norm_text(predicted) and _norm_text(predicted) == _norm_text(reference):
        return True
    if b is not None and a is None and _NUMBER_CHARS_RE.fullmatch(predicted):
        return False  # a number is due, and this is only number characters but no number (1e999999999, 1/0)
    return None


def verify_many(
    completions: Sequence[str],
    answers: Sequence[str],
    strict: bool = False,
    formats: Sequence[str] | None = None,
    checker: Any = None,
) -> list[bool]:
    """Batch form of `verify` / `verify_strict`: the exact path for every row, then one pass of the
    symbolic checker over the rows it could not decide."""
    formats = formats or ["final"] * len(completions)
    out: list[bool] = []
    pending: list[tuple[int, str, str]] = []
    for i, (completion, answer) in enumerate(zip(completions, answers)):
        predicted = extract_strict(completion, formats[i]) if strict else extract_answer(completion)
        decided = _exact(predicted, answer)
        out.append(bool(decided))
        if (
            decided is None
            and predicted is not None
            and 0 < len(predicted.strip()) <= MAX_SYMBOLIC_CHARS
            and str(answer).strip()
        ):
            pending.append((i, str(answer), predicted))
    if pending:
        if checker is None:
            checker = default_checker()
        for (i, _, _), ok in zip(pending, checker.equal_many([(gold, pred) for _, gold, pred in pending])):
            out[i] = ok
    return out


def verify(completion: str, answer: str | None) -> bool:
    """Does `completion` state `answer` as its final answer (anywhere it states one)? Lenient."""
    return answer is not None and verify_many([completion], [answer])[0]


def verify_strict(completion: str, answer: str | None, fmt: str = "boxed") -> bool:
    """Does `completion` state `answer` in the required format `fmt`?"""
    return answer is not None and verify_many([completion], [answer], strict=True, formats=[fmt])[0]


def format_ok(completion: str, fmt: str) -> bool:
    """Does the completion state an answer where format `fmt` requires one (right or wrong)?"""
    found = extract_strict(completion, fmt)
    return found is not None and bool(found.strip())


def math_scores(
    completions: Sequence[str],
    answers: Sequence[Any],
    metadata: Sequence[Any] | None = None,
    references: Sequence[Any] | None = None,
    strict: bool = False,
) -> list[float | None]:
    """1.0/0.0 per row (None where there is no reference answer)."""
    rows = [i for i, a in enumerate(answers) if a is not None]
    formats = [
        answer_format(
            _as_dict(metadata[i]) if metadata is not None else None, references[i] if references is not None else None
        )
        for i in rows
    ]
    verdicts = verify_many([completions[i] for i in rows], [str(answers[i]) for i in rows], strict, formats)
    out: list[float | None] = [None] * len(completions)
    for i, ok in zip(rows, verdicts):
        out[i] = 1.0 if ok else 0.0
    return out


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        import json

        return json.loads(value) if value.strip() else {}
    return dict(value or {})


class MathVerifier(Verifier):
    """Final answers: exact numbers first, then math-verify; lenient `score`, `strict` in the task's format."""

    name = "math"
    instruction = "Please reason step by step, and put your final answer within \\boxed{}."

    @staticmethod
    def _columns(tasks: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        return ([t.answer for t in tasks], [t.metadata for t in tasks], [getattr(t, "reference", None) for t in tasks])

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
        answers, meta, refs = self._columns(tasks)
        return math_scores(completions, answers, meta, refs)

    def strict(self, tasks: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
        answers, meta, refs = self._columns(tasks)
        return math_scores(completions, answers, meta, refs, strict=True)

    def format_ok(self, task: Any, completion: str) -> bool:
        return format_ok(completion, answer_format(_as_dict(task.metadata), getattr(task, "reference", None)))

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        problems = []
        if answer is None or not str(answer).strip():
            problems.append(("answer", "a math task needs a non-empty answer"))
        fmt = metadata.get("answer_format")
        if fmt is not None and fmt not in ANSWER_FORMATS:
            problems.append(
                ("metadata", f"metadata.answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {fmt!r}")
            )
        return problems

    def explain(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[str]:
        out = []
        for completion, score in zip(completions, self.score(tasks, completions)):
            found = extract_answer(completion)
            out.append(
                ""
                if score == 1.0
                else "no final answer found"
                if found is None
                else f"the final answer {found[:80]!r} is wrong"
            )
        return out


register_verifier(MathVerifier())
math_reward = REWARDS["math"]
