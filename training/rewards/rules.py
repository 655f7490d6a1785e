"""The `json_rules` verifier: the completion must contain a JSON value that (1) validates against the task's
JSON schema (`metadata["schema"]`, any draft jsonschema knows), (2) equals the expected value (`answer`, JSON
text) when the task has one, and (3) satisfies every extra rule in `metadata["rules"]`:

    {"path": "contact.email", "regex": "^[^@]+@[^@]+$"}   the value (as text) must fully match
    {"path": "age", "min": 0, "max": 150}                   a number within bounds
    {"path": "name", "equals": "Bob"}                       exact value

Equality is JSON equality: key order is irrelevant, 31 == 31.0, but true != 1 and "31" != 31.
The JSON is taken from the whole completion, else its first fenced block, else the span from the first `{`
(or `[`) to the last matching `}` (or `]`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from training.rewards.base import REWARDS, Verifier, register_verifier

_MISSING = object()
_FENCE_RE = re.compile(r"```[ \t]*\w*[ \t]*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON value a completion states, or `_MISSING` (a sentinel; JSON null is a legal value)."""
    if not isinstance(text, str):
        return _MISSING
    candidates = [text.strip()]
    m = _FENCE_RE.search(text)
    if m:
        candidates.append(m.group(1).strip())
    for open_, close in (("{", "}"), ("[", "]")):
        i, j = text.find(open_), text.rfind(close)
        if 0 <= i < j:
            candidates.append(text[i : j + 1])
    for cand in candidates:
        try:
            return json.loads(cand)
        except (ValueError, RecursionError):
            continue
    return _MISSING


def json_equal(a: Any, b: Any) -> bool:
    """JSON value equality: bools are not numbers, ints and floats compare by value, dict order ignored."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str):
    import jsonschema

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_validator(schema: dict[str, Any]):
    """A cached jsonschema validator for `schema` (raises jsonschema.SchemaError for an invalid schema)."""
    return _validator(json.dumps(schema, sort_keys=True))


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split(".") if path else []:
        if isinstance(obj, dict) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return _MISSING
    return obj


def rule_problems(obj: Any, rules: Sequence[dict[str, Any]]) -> list[str]:
    """What `obj` violates among `rules` (empty when it satisfies all)."""
    problems = []
    for rule in rules:
        if not isinstance(rule, dict):
            problems.append(f"invalid rule {rule!r}")
            continue
        path = str(rule.get("path", ""))
        value = _lookup(obj, path)
        if value is _MISSING:
            problems.append(f"{path}: missing")
            continue
        if "equals" in rule and not json_equal(value, rule["equals"]):
            problems.append(f"{path}: {value!r} != {rule['equals']!r}")
        if "regex" in rule:
            try:
                ok = (
                    isinstance(value, (str, int, float))
                    and not isinstance(value, bool)
                    and re.fullmatch(rule["regex"], str(value)) is not None
                )
            except (re.error, TypeError):
                ok = False
            if not ok:
                problems.append(f"{path}: {value!r} does not match {rule['regex']!r}")
        for bound, within in (("min", lambda v, b: v >= b), ("max", lambda v, b: v <= b)):
            if bound in rule and not (
                isinstance(value, (int, float)) and not isinstance(value, bool) and within(value, rule[bound])
            ):
                problems.append(f"{path}: {value!r} violates {bound} {rule[bound]!r}")
    return problems


def verify(completion: str, answer: str | None, metadata: dict[str, Any] | None = None) -> bool:
    meta = metadata or {}
    obj = extract_json(completion)
    if obj is _MISSING:
        return False
    if meta.get("schema") is not None:
        try:
            if not schema_validator(meta["schema"]).is_valid(obj):
                return False
        except Exception:  # noqa: BLE001 - an invalid schema verifies nothing
            return False
    if answer is not None:
        try:
            expected = json.loads(answer)
        except ValueError:
            return False
        if not json_equal(obj, expected):
            return False
    return not rule_problems(obj, meta.get("rules") or [])


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value) if value.strip() else {}
    return dict(value or {})


_SCHEMA_OK: dict[str, str | None] = {}


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is not a valid JSON schema (None when it is); cached per schema."""
    key = json.dumps(schema, sort_keys=True)
    if key not in _SCHEMA_OK:
        try:
            schema_validator(schema)
            _SCHEMA_OK[key] = None
        except Exception as err:  # noqa: BLE001 - jsonschema.SchemaError and friends
            _SCHEMA_OK[key] = f"metadata.schema is not a valid JSON schema ({getattr(err, 'message', err)})"
    return _SCHEMA_OK[key]


class JsonRulesVerifier(Verifier):
    """JSON output: schema, expected value, rules."""

    name = "json_rules"

    def score(self, tasks: Sequence[Any], completions: Sequence[str], **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for task, completion in zip(tasks, completions):
            meta = _as_dict(task.metadata)
            if task.answer is None and not meta.get("schema") and not meta.get("rules"):
                out.append(0.0)  # nothing to verify against: no reward
                continue
            out.append(1.0 if verify(completion, task.answer, meta) else 0.0)
        return out

    def format_ok(self, task: Any, completion: str) -> bool:
        try:
            return isinstance(extract_json(completion), (dict, list))
        except (ValueError, TypeError):
            return False

    def row_problems(self, answer: Any, tests: Any, metadata: dict[str, Any]) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if answer is None or not str(answer).strip():
            problems.append(("answer", "a json_rules task needs the expected JSON as its answer"))
        else:
            try:
                expected = json.loads(answer)
            except ValueError as err:
                problems.append(("answer", f"not valid JSON ({getattr(err, 'msg', err)})"))
            else:
                schema = metadata.get("schema")
                if isinstance(schema, dict) and schema_problem(schema) is None:
                    error = next(iter(schema_validator(schema).iter_errors(expected)), None)
                    if error is not None:
                        problems.append(("answer", f"does not match metadata.schema: {error.message}"))
        if "schema" in metadata or "rules" in metadata:
            rules = metadata.get("rules", [])
            if "schema" in metadata and not isinstance(metadata["schema"], dict):
                kind = "null" if metadata["schema"] is None else type(metadata["schema"]).__name__
                problems.append(("metadata", f"metadata.schema: expected an object, got {kind}"))
            elif "schema" in metadata and (problem := schema_problem(metadata["schema"])) is not None:
                problems.append(("metadata", problem))
            elif not isinstance(rules, list) or not all(
                isinstance(r, dict) and isinstance(r.get("path"), str) for r in rules
            ):
                problems.append(
                    (
                        "metadata",
                        'metadata.rules: expected a list of {"path": ..., "regex"|"equals"|"min"|"max": ...} objects',
                    )
                )
        return problems

    def explain(self, tasks: Sequence[Any], completions: Sequence[str], **options: Any) -> list[str]:
        out = []
        for task, completion, score in zip(tasks, completions, self.score(tasks, completions)):
            obj = extract_json(completion)
            problems = rule_problems(obj, _as_dict(task.metadata).get("rules") or []) if obj is not _MISSING else []
            out.append(
                ""
                if score == 1.0
                else "no JSON value found"
                if obj is _MISSING
                else "; ".join(problems[:3]) or "the JSON value is wrong"
            )
        return out


register_verifier(JsonRulesVerifier())
json_rules_reward = REWARDS["json_rules"]
