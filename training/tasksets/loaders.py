"""Real task data: a SourceSpec -> raw records (through `datasets`) -> Task rows (through an adapter).

    rows = load_source(SourceSpec("openai/gsm8k", adapter="gsm8k", name="main", split="train"))
    result = validate_rows(rows, label)      # the stage does this: errors name the source line and field

Where records come from:
- a local `.jsonl` file: read line by line here (not through `datasets`), so a bad line (invalid JSON,
  non-UTF-8 bytes) is reported with its line number instead of failing the whole load;
- a local `.parquet` / `.json` / `.csv` file: `datasets.load_dataset(<format>, data_files=...)`;
- anything else: a hub id, `datasets.load_dataset(path, name, split=split)` (needs network or a warm cache).

Adapters map one record to a Task row (validated afterwards like any task file):
- tasks:     the record is already a Task row.
- gsm8k:     {question, answer: "...steps...\\n#### 42"} -> prompt=question, answer="42" (commas removed),
             reference=the worked solution with `<<...>>` calculator notes removed; difficulty from the number
             of steps (lines before ####), clipped to 1..5; verifier "math".
- math:      {problem, solution, level?, type?} (MATH) -> prompt = problem, answer = the last \\boxed{} of the
             solution, reference = the solution, difficulty from "Level N", metadata.answer_format = "boxed".
- mbpp:      {text|prompt, code, test_list, challenge_test_list?, test_setup_code?, task_id?} -> prompt = text
             plus the first test (MBPP's convention: it shows the function name); tests = {call, expected} pairs
             when every assert (challenge ones too) can move to the host, else the asserts as a test program with
             test_setup_code as its setup; metadata.program_prefix = test_setup_code; verifier "code".
- humaneval: {task_id, prompt, canonical_solution, test, entry_point} -> prompt = the signature + docstring,
             program_prefix = the same prompt (the completion continues the body), tests = the whole
             `check(candidate)` as a test program (setup: the prompt, whose helpers a check may call).
- mapped:    any record; `fields` maps Task fields to columns. Non-string answers become text (numbers as
             written, objects/lists as JSON); `tests` given as assert source become TestCases (or a test program).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sandbox import TestProgram, parse_assert_tests
from training.rewards.code import tests_problem
from training.rewards.math import _boxed
from training.tasksets.schema import COLUMNS
from training.tasksets.sources import SourceSpec
from training.tasksets.validate import JSONL_SUFFIXES, RawRow, RowError, read_rows

_CALC_RE = re.compile(r"<<[^>]*>>")


def source_label(spec: SourceSpec) -> str:
    return spec.path if _is_local(spec.path) else f"{spec.path}:{spec.split}"


def _is_local(path: str) -> bool:
    return Path(path).suffix.lower() in (".jsonl", ".ndjson", ".json", ".parquet", ".pq", ".csv") or Path(path).exists()


def _records(spec: SourceSpec, cache_dir: str | None) -> Iterator[RawRow]:
    label = source_label(spec)
    path = Path(spec.path)
    if _is_local(spec.path) and not path.exists():
        yield RawRow(0, None, b"", [RowError(label, None, None, "file does not exist")])
        return
    if path.suffix.lower() in JSONL_SUFFIXES and path.suffix.lower() != ".json":
        yield from read_rows(path, label)
        return
    import datasets

    datasets.disable_progress_bars()
    try:
        if path.exists():
            fmt = {".pq": "parquet", ".jsonl": "json", ".ndjson": "json"}.get(
                path.suffix.lower(), path.suffix.lower().lstrip(".")
            )
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train", cache_dir=cache_dir)
        else:  # hub datasets use the shared HF cache (HF_HOME), so a re-run does not download again
            ds = datasets.load_dataset(spec.path, spec.name, split=spec.split)
    except Exception as err:  # noqa: BLE001 - a source that cannot be read is a file-level error
        yield RawRow(0, None, b"", [RowError(label, None, None, f"cannot load ({type(err).__name__}: {err})")])
        return
    for i, rec in enumerate(ds, start=1):
        yield RawRow(i, dict(rec), dict(rec))


def _text(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
    return json.dumps(v, ensure_ascii=False)


def _tests_from_asserts(source: Any, entry_point: str | None = None) -> list[dict[str, Any]]:

    if isinstance(source, list):
        source = "\n".join(str(s) for s in source)
    return [t.to_dict() for t in parse_assert_tests(str(source), entry_point)]


def _tests_or_program(source: Any, setup: str = "") -> list[dict[str, Any]] | dict[str, Any]:
    """Assert lines as {call, expected} pairs when every one can move to the host (one process per run, the
    comparison on the host); else the whole source as a test program (loops, helpers, `!=`, setup code)."""

    text = "\n".join(str(s) for s in source) if isinstance(source, list) else str(source)
    try:  # the calls run after the program, whose prefix is the setup: names it defines are there
        return _tests_from_asserts(text)
    except ValueError:
        pass
    try:
        TestProgram(text, None, setup)
    except ValueError as err:
        raise ValueError(f"tests are not a valid test program: {err}") from None
    program: dict[str, Any] = {"program": text}
    if setup.strip():
        program["setup"] = setup
    return program


def _last_boxed(text: str) -> str | None:

    return _boxed(text)


def _gsm8k(rec: dict[str, Any], spec: SourceSpec) -> dict[str, Any]:
    solution = rec.get("answer")
    if not isinstance(solution, str) or "####" not in solution:
        raise _FieldError("answer", "expected a GSM8K solution ending in '#### <number>'")
    steps, _, final = solution.rpartition("####")
    final = final.strip().replace(",", "")
    n_steps = len([line for line in steps.strip().splitlines() if line.strip()])
    return {
        "prompt": rec.get("question"),
        "answer": final,
        "reference": _CALC_RE.sub("", solution).strip(),
        "domain": "math",
        "verifier": "math",
        "difficulty": min(max(n_steps - 1, 1), 5),
    }


_LEVEL_RE = re.compile(r"(\d+)")


def _math(rec: dict[str, Any], spec: SourceSpec) -> dict[str, Any]:
    problem, solution = rec.get("problem"), rec.get("solution")
    if not isinstance(solution, str) or _last_boxed(solution) is None:
        raise _FieldError("solution", "expected a MATH solution with its answer in \\boxed{...}")
    level = _LEVEL_RE.search(str(rec.get("level") or ""))
    meta: dict[str, Any] = {"answer_format": "boxed"}
    if rec.get("type"):
        meta["subject"] = str(rec["type"])
    return {
        "prompt": problem,
        "answer": _last_boxed(solution),
        "reference": solution,
        "domain": "math",
        "verifier": "math",
        "metadata": meta,
        "difficulty": min(max(int(level.group(1)), 1), 5) if level else 1,
    }


def _mbpp(rec: dict[str, Any], spec: SourceSpec) -> dict[str, Any]:
    text = rec.get("text", rec.get("prompt"))
    tests_src = rec.get("test_list")
    if not isinstance(tests_src, list) or not tests_src:
        raise _FieldError("test_list", "expected a non-empty list of assert lines")
    setup = rec.get("test_setup_code") or ""
    challenge = rec.get("challenge_test_list") or []
    try:
        tests = _tests_or_program(list(tests_src) + list(challenge), setup)
    except ValueError as err:
        raise _FieldError("test_list", str(err)) from None
    prompt = f"{text}\nYour code should pass: {tests_src[0]}" if isinstance(text, str) and text.strip() else text
    code = rec.get("code") or ""
    meta: dict[str, Any] = {"program_prefix": setup + "\n"} if setup.strip() else {}
    try:  # the test the prompt shows is the visible one (what a repair episode runs); all of them are hidden
        meta["visible_tests"] = _tests_or_program([tests_src[0]], setup)
    except ValueError:
        pass  # the full set already parsed, so a lone first assert that does not is left unshown
    return {
        "prompt": prompt,
        "reference": code.replace("\r\n", "\n"),
        "tests": tests,
        "domain": "code",
        "verifier": "code",
        "metadata": meta,
        "difficulty": min(max(len(code.strip().splitlines()) // 4 + 1, 1), 5),
        "_key": rec.get("task_id"),
    }


def _humaneval(rec: dict[str, Any], spec: SourceSpec) -> dict[str, Any]:
    entry = rec.get("entry_point")
    if not isinstance(entry, str) or not entry:
        raise _FieldError("entry_point", "missing (required for humaneval)")
    prompt = rec.get("prompt")
    # the whole check(candidate), run as written; the prompt is its setup (helpers a check may call)
    tests = {"program": rec.get("test") or "", "entry_point": entry, "setup": prompt if isinstance(prompt, str) else ""}

    problem = tests_problem(tests)
    if problem:
        raise _FieldError("test", problem)
    solution = rec.get("canonical_solution") or ""
    meta: dict[str, Any] = {"program_prefix": prompt if isinstance(prompt, str) else "", "entry_point": entry}
    shown = docstring_examples(prompt, entry) if isinstance(prompt, str) else []
    if shown:  # the docstring's examples are visible (a repair episode runs them); check(candidate) is hidden
        meta["visible_tests"] = shown
    return {
        "prompt": prompt,
        "reference": solution,
        "tests": tests,
        "domain": "code",
        "verifier": "code",
        "metadata": meta,
        "difficulty": min(max(len(solution.strip().splitlines()) // 4 + 1, 1), 5),
        "id": f"{spec.id_prefix}{rec['task_id']}" if rec.get("task_id") is not None else None,
    }


def docstring_examples(prompt: str, entry_point: str) -> list[dict[str, Any]]:
    """The `>>> entry_point(...)` examples of a HumanEval prompt's docstring whose shown result is a Python
    literal, as {call, expected} tests (examples with side effects, several statements or a non-literal
    result are left out: they cannot be compared on the host)."""
    import ast
    import doctest

    try:
        examples = doctest.DocTestParser().get_examples(prompt)
    except ValueError:  # a docstring doctest cannot parse (inconsistent indentation): no visible tests
        return []
    out = []
    for ex in examples:
        call = ex.source.strip()
        if not call.startswith(f"{entry_point}(") or "\n" in call or not ex.want.strip():
            continue
        try:
            compile(call, "<example>", "eval")
            expected = ast.literal_eval(ex.want.strip())
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
        out.append({"call": call, "expected": expected})
    return out


def _mapped(rec: dict[str, Any], spec: SourceSpec) -> dict[str, Any]:
    out: dict[str, Any] = {}

    for name in COLUMNS:
        column = spec.fields.get(name, name)
        if column in rec:
            out[name] = rec[column]
        elif name in spec.fields:
            raise _FieldError(column, f"missing (mapped to Task field {name!r})")
    if "answer" in out:
        out["answer"] = _text(out["answer"])
    if (
        isinstance(out.get("tests"), (str, list))
        and out["tests"]
        and (
            isinstance(out["tests"], str)
            and out["tests"].lstrip().startswith("assert")
            or isinstance(out["tests"], list)
            and all(isinstance(t, str) for t in out["tests"])
        )
    ):
        try:
            out["tests"] = _tests_or_program(out["tests"])
        except ValueError as err:
            raise _FieldError(spec.fields.get("tests", "tests"), str(err)) from None
    if "id" in out and not isinstance(out["id"], str) and out["id"] is not None:
        out["id"] = _text(out["id"])
    return out


class _FieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


ADAPTERS: dict[str, Callable[[dict[str, Any], SourceSpec], dict[str, Any]]] = {
    "tasks": lambda rec, spec: dict(rec),
    "gsm8k": _gsm8k,
    "math": _math,
    "mbpp": _mbpp,
    "humaneval": _humaneval,
    "mapped": _mapped,
}
_DEFAULT_DOMAIN = {"gsm8k": "math", "math": "math", "mbpp": "code", "humaneval": "code"}


def load_source(spec: SourceSpec, cache_dir: str | None = None) -> Iterator[RawRow]:
    """Task rows of one source, with the source's row numbers; adapter failures become RowErrors.

    `cache_dir` is where `datasets` may put the Arrow copy of a local parquet/json/csv file (a temp dir in the
    stage, so local files do not pile up in the shared HF cache)."""
    label = source_label(spec)
    prefix = spec.id_prefix or (Path(spec.path).stem if _is_local(spec.path) else spec.path.replace("/", "_")) + "-"
    adapt = ADAPTERS[spec.adapter]
    kept = 0
    for rr in _records(spec, cache_dir):
        if spec.limit and kept >= spec.limit:
            return
        if rr.data is None or rr.errors:
            yield rr
            kept += rr.row > 0
            continue
        kept += 1
        try:
            row = adapt(rr.data, spec)
        except _FieldError as err:
            yield RawRow(rr.row, None, rr.raw, [RowError(label, rr.row, err.field, str(err))])
            continue
        if spec.adapter != "tasks":
            key = row.pop("_key", None)
            if row.get("id") is None:
                row["id"] = f"{prefix}{key if key is not None else rr.row}"
            row.setdefault("source", f"{spec.adapter}:{label}")
        for name, value in (("domain", spec.domain), ("verifier", spec.verifier), ("difficulty", spec.difficulty)):
            if value and (spec.adapter in _DEFAULT_DOMAIN or row.get(name) is None):
                row[name] = value
        row.setdefault("domain", _DEFAULT_DOMAIN.get(spec.adapter))
        yield RawRow(rr.row, row, rr.raw)
