"""Instruction and format following: IFEval-style verifiable constraints, several at once (verifier "ifeval").

A task lists its constraints in `metadata["constraints"]`, each `{"id": <IFEval instruction id>, **kwargs}`
with the ids and keyword names of IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large
Language Models") where one exists, so a task set can later be checked by that code too:

    punctuation:no_comma                  no "," anywhere
    change_case:english_lowercase         letters present, none upper case
    change_case:english_capital           letters present, none lower case
    length_constraints:number_words       {"relation": "less than" | "at least", "num_words": N} (whitespace words)
    keywords:existence                    {"keywords": [...]}: each appears as a word (case-insensitive)
    keywords:forbidden_words              {"forbidden_words": [...]}: none appears as a word
    startend:end_checker                  {"end_phrase": "..."}: the response ends with it (trailing space ignored)
    detectable_format:json_format         the whole response is one JSON value; with {"keys": [...]} (our
                                          extension) an object with exactly those keys

Pass (score 1.0) means every constraint holds (IFEval's "prompt-level strict" accuracy); `explain` names the
ones that do not. The format rate is "the response is non-empty and, where JSON is asked for, parses".

Why hand-written and not the `if-verifiable` package (IFEval and IFBench checks): it is not a dependency of
this project and cannot be installed into its environment here, and IFEval's own checks pull in nltk and
langdetect with data downloads; the checks above are the handful the tiny profile's generator uses, each a few
lines that tests/rewards/test_instructions.py pins on planted completions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from training.rewards.base import Verifier, register_verifier

_WORD = re.compile(r"[A-Za-z0-9_']+")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _json_value(text: str) -> Any:
    try:
        return json.loads(text.strip())
    except ValueError:
        return _MISSING


_MISSING = object()


def _no_comma(text: str, **_: Any) -> bool:
    return "," not in text


def _lowercase(text: str, **_: Any) -> bool:
    return any(c.isalpha() for c in text) and text == text.lower()


def _capital(text: str, **_: Any) -> bool:
    return any(c.isalpha() for c in text) and text == text.upper()


def _number_words(text: str, relation: str = "less than", num_words: int = 0, **_: Any) -> bool:
    n = len(text.split())
    return n < int(num_words) if relation == "less than" else n >= int(num_words)


def _existence(text: str, keywords: Sequence[str] = (), **_: Any) -> bool:
    words = set(_words(text))
    return all(k.lower() in words for k in keywords)


def _forbidden(text: str, forbidden_words: Sequence[str] = (), **_: Any) -> bool:
    words = set(_words(text))
    return not any(k.lower() in words for k in forbidden_words)


def _end_checker(text: str, end_phrase: str = "", **_: Any) -> bool:
    return text.rstrip().endswith(end_phrase)


def _json_format(text: str, keys: Sequence[str] | None = None, **_: Any) -> bool:
    value = _json_value(text)
    if value is _MISSING:
        return False
    return keys is None or (isinstance(value, dict) and sorted(value) == sorted(keys))


CHECKS: dict[str, Callable[..., bool]] = {
    "punctuation:no_comma": _no_comma,
    "change_case:english_lowercase": _lowercase,
    "change_case:english_capital": _capital,
    "length_constraints:number_words": _number_words,
    "keywords:existence": _existence,
    "keywords:forbidden_words": _forbidden,
    "startend:end_checker": _end_checker,
    "detectable_format:json_format": _json_format,
}


def constraint_results(constraints: Sequence[dict[str, Any]], completion: str) -> list[bool]:
    """Per constraint, does the completion satisfy it?"""
    return [CHECKS[c["id"]](completion, **{k: v for k, v in c.items() if k != "id"}) for c in constraints]


def _constraints(task: Any) -> list[dict[str, Any]]:
    meta = task.metadata if isinstance(task.metadata, dict) else json.loads(task.metadata or "{}")
    return list(meta.get("constraints") or [])


class InstructionVerifier(Verifier):
    """Every constraint in metadata["constraints"] holds (1.0), else 0.0."""

    name = "ifeval"

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for task, completion in zip(tasks, completions):
            constraints = _constraints(task)
            # a task without constraints has nothing to verify: no reward (as json_rules does)
            out.append(1.0 if constraints and completion.strip() and all(constraint_results(constraints, completion))
                       else 0.0)
        return out

    def format_ok(self, task: Any, completion: str) -> bool:
        if not completion.strip():
            return False
        wants_json = any(c["id"] == "detectable_format:json_format" for c in _constraints(task))
        return not wants_json or _json_value(completion) is not _MISSING

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        constraints = metadata.get("constraints")
        if not isinstance(constraints, list) or not constraints:
            return [("metadata", "an ifeval task needs metadata.constraints: a non-empty list of {\"id\": ...}")]
        unknown = [c.get("id") for c in constraints if not isinstance(c, dict) or c.get("id") not in CHECKS]
        if unknown:
            return [("metadata", f"metadata.constraints: unknown constraint id(s) {unknown}; known: "
                                 f"{', '.join(CHECKS)}")]
        return []

    def explain(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[str]:
        out = []
        for task, completion in zip(tasks, completions):
            constraints = _constraints(task)
            failed = [c["id"] for c, ok in zip(constraints, constraint_results(constraints, completion)) if not ok]
            out.append("empty response" if not completion.strip() else
                       ("not followed: " + ", ".join(failed)) if failed else "")
        return out


register_verifier(InstructionVerifier())
