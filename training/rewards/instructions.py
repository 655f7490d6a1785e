"""Instruction and format following: IFEval-style verifiable constraints, several at once (verifier "ifeval").

A task lists its constraints in `metadata["constraints"]`, each `{"id": <IFEval instruction id>, **kwargs}`
with the ids and keyword names of IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large
Language Models"). The checks are IFEval's own, from the `if-verifiable` package (its copy of Google's
`instructions.py`), so a score here means what it means on IFEval. Every IFEval id is accepted, e.g.:

    punctuation:no_comma                  no "," anywhere
    length_constraints:number_words       {"relation": "less than" | "at least", "num_words": N}
    keywords:existence                    {"keywords": [...]}: each appears (case-insensitive search)
    keywords:forbidden_words              {"forbidden_words": [...]}: none appears as a word
    startend:end_checker                  {"end_phrase": "..."}: the response ends with it (case-insensitive)
    detectable_format:json_format         the whole response is one JSON value (``` fences allowed); with
                                          {"keys": [...]} (our extension) an object with exactly those keys

Two deliberate differences, both for short responses:
- `change_case:english_lowercase` / `english_capital` are IFEval's case rule (`str.islower()` /
  `str.isupper()`) without its language check: IFEval also requires `langdetect` to call the text English, which
  it does not do for a few words ("red sun cat" is detected as Romanian, "owl fig ice" as Welsh), so correct
  answers to short tasks would fail at random.
- IFEval's kwargs left out are drawn at random by its `build_description`; here a missing kwarg is a row error
  (`row_problems`), so a task means the same thing every time it is checked.

IFEval checks that split sentences or tag words (e.g. `change_case:capital_word_frequency`,
`length_constraints:number_sentences`) need NLTK's tokenizer data, which is not installed with the package
(`python -m nltk.downloader punkt_tab`, where downloads are allowed); the tiny generator uses none of them.

Pass (score 1.0) means every constraint holds (IFEval's "prompt-level strict" accuracy); `strict` is the same and
`score` is the same too (no loose variants: a reward must not pay for text around the answer). `explain` names
the constraints not followed. The format rate is "the response is non-empty and, where JSON is asked for, parses".
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from training.rewards.base import Verifier, register_verifier


@functools.lru_cache(maxsize=1)
def _registry() -> dict[str, Any]:
    # Imported on first use: the package pulls in nltk, langdetect and datasets (a few seconds), which only
    # stages that verify instruction tasks should pay.
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT

    return dict(INSTRUCTION_DICT)


def _json_value(text: str) -> Any:
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        return json.loads(body)
    except ValueError:
        return _MISSING


_MISSING = object()


def _lowercase(text: str, **_: Any) -> bool:
    return text.islower()


def _capital(text: str, **_: Any) -> bool:
    return text.isupper()


def _json_format(text: str, keys: Sequence[str] | None = None, **_: Any) -> bool:
    value = _json_value(text)
    if value is _MISSING:
        return False
    return keys is None or (isinstance(value, dict) and sorted(value) == sorted(keys))


# Checks of our own, by id (see the module docstring for why); every other id is IFEval's.
OWN_CHECKS: dict[str, Callable[..., bool]] = {
    "change_case:english_lowercase": _lowercase,
    "change_case:english_capital": _capital,
    "detectable_format:json_format": _json_format,
}


def known_ids() -> list[str]:
    return sorted(set(_registry()) | set(OWN_CHECKS))


def _ifeval_kwargs(cid: str) -> list[str]:
    """The keyword arguments IFEval's instruction `cid` takes (all are needed, see the module docstring)."""
    params = inspect.signature(_registry()[cid](cid).build_description).parameters
    return [name for name, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check(constraint: dict[str, Any], completion: str) -> bool:
    """Does `completion` satisfy one constraint `{"id": ..., **kwargs}`?"""
    cid = constraint["id"]
    kwargs = {k: v for k, v in constraint.items() if k != "id"}
    if cid in OWN_CHECKS:
        return OWN_CHECKS[cid](completion, **kwargs)
    instruction = _registry()[cid](cid)
    instruction.build_description(**kwargs)
    return bool(completion.strip()) and bool(instruction.check_following(completion))


def constraint_results(constraints: Sequence[dict[str, Any]], completion: str) -> list[bool]:
    """Per constraint, does the completion satisfy it?"""
    return [check(c, completion) for c in constraints]


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
            out.append(
                1.0 if constraints and completion.strip() and all(constraint_results(constraints, completion)) else 0.0
            )
        return out

    def format_ok(self, task: Any, completion: str) -> bool:
        if not completion.strip():
            return False
        wants_json = any(c["id"] == "detectable_format:json_format" for c in _constraints(task))
        return not wants_json or _json_value(completion) is not _MISSING

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        constraints = metadata.get("constraints")
        if not isinstance(constraints, list) or not constraints:
            return [("metadata", 'an ifeval task needs metadata.constraints: a non-empty list of {"id": ...}')]
        known = set(known_ids())
        unknown = [c.get("id") for c in constraints if not isinstance(c, dict) or c.get("id") not in known]
        if unknown:
            return [
                (
                    "metadata",
                    f"metadata.constraints: unknown constraint id(s) {unknown}; known: IFEval's ids, "
                    f"e.g. {', '.join(known_ids()[:6])}, ...",
                )
            ]
        for c in constraints:
            if c["id"] in OWN_CHECKS:
                continue
            missing = [k for k in _ifeval_kwargs(c["id"]) if k not in c]
            if missing:
                return [
                    ("metadata", f"metadata.constraints: {c['id']} needs {missing} (IFEval would draw them at random)")
                ]
        return []

    def explain(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[str]:
        out = []
        for task, completion in zip(tasks, completions):
            constraints = _constraints(task)
            failed = [c["id"] for c, ok in zip(constraints, constraint_results(constraints, completion)) if not ok]
            out.append(
                "empty response" if not completion.strip() else ("not followed: " + ", ".join(failed)) if failed else ""
            )
        return out


register_verifier(InstructionVerifier())
