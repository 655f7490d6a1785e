"""Validation of task rows: one pass, structured errors naming file, row and field.

    result = check_file(Path("tasks.jsonl"))
    for err in result.errors:
        print(err)            # tasks.jsonl:7: field 'difficulty': expected an integer 1..5, got str 'hard'
    result.tasks              # the rows that passed, as Task records
    result.bad                # the rows that failed (raw line bytes or row dicts), for quarantine

Rows are numbered as a user counts them: the 1-based line of a JSONL file (blank lines count, and are
skipped), the 1-based row of a parquet file or of a `.json` file holding one JSON array. A row's problems
are reported in column order (schema.COLUMNS).

What is checked: the file decodes (UTF-8; for a bad line the field holding the bad bytes is named), each line is
a JSON object; id/domain/prompt/verifier present and strings; prompt not blank; verifier known to the reward
registry; domain a lower-case name (any, or one of `domains` when given); difficulty an integer 1..5;
reference/answer/source strings (answer may be null); tests and metadata a list/object or its JSON text; ids
unique; metadata["reward_weights"] (when present) names known verifiers with non-negative weights; and
whatever the task's verifier (and each weighted one) requires of its row, as its `Verifier.row_problems` says
(math: an answer; code: {call, expected} tests whose calls are expressions, or a test program that compiles;
json_rules: an answer that is JSON text, valid under metadata["schema"], and well-formed metadata["rules"]).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.rewards import get_verifier, verifier_names
from training.tasksets.schema import COLUMNS, MAX_DIFFICULTY, MIN_DIFFICULTY, Task

REQUIRED = ("id", "domain", "prompt", "verifier")
_DOMAIN_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
_SURROGATE_RE = re.compile("[\udc80-\udcff]")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class RowError:
    file: str
    row: int | None  # None: the whole file
    field: str | None  # None: the whole row
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.row}" if self.row is not None else self.file
        return f"{where}: field {self.field!r}: {self.message}" if self.field else f"{where}: {self.message}"


class TasksetValidationError(ValueError):
    """Bad rows in a task source; `errors` has every RowError, the message the first few."""

    def __init__(self, errors: Sequence[RowError], shown: int = 20) -> None:
        self.errors = list(errors)
        lines = [str(e) for e in self.errors[:shown]]
        if len(self.errors) > shown:
            lines.append(f"... and {len(self.errors) - shown} more error(s)")
        super().__init__(f"{len(self.errors)} invalid task row(s):\n" + "\n".join(lines))


@dataclass
class RawRow:
    """One row as read: `data` (None when unreadable), `raw` (the line bytes or the row dict, for quarantine)."""

    row: int
    data: dict[str, Any] | None
    raw: bytes | dict[str, Any]
    errors: list[RowError] = field(default_factory=list)


@dataclass
class ValidationResult:
    file: str
    tasks: list[Task] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)
    bad: list[RawRow] = field(default_factory=list)
    rows: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors


# ----- reading ------------------------------------------------------------------------------------------------
def _bad_bytes_field(obj: Any) -> bool:
    if isinstance(obj, str):
        return bool(_SURROGATE_RE.search(obj))
    if isinstance(obj, dict):
        return any(_bad_bytes_field(k) or _bad_bytes_field(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(_bad_bytes_field(v) for v in obj)
    return False


def _parse_line(line: bytes, row: int, file: str) -> RawRow:
    try:
        text = line.decode("utf-8")
        utf8_err = None
    except UnicodeDecodeError as err:
        text = line.decode("utf-8", "surrogateescape")
        utf8_err = f"not valid UTF-8 (byte 0x{line[err.start]:02x} at byte offset {err.start})"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        msg = utf8_err or f"invalid JSON ({getattr(err, 'msg', err)} at column {getattr(err, 'colno', '?')})"
        return RawRow(row, None, line, [RowError(file, row, None, msg)])
    if not isinstance(data, dict):
        return RawRow(
            row, None, line, [RowError(file, row, None, f"expected a JSON object, got {type(data).__name__}")]
        )
    rr = RawRow(row, data, line)
    if utf8_err:
        bad = [k for k, v in data.items() if _bad_bytes_field(k) or _bad_bytes_field(v)]
        rr.errors += [RowError(file, row, k, utf8_err) for k in bad] or [RowError(file, row, None, utf8_err)]
    return rr


def read_rows(path: Path | str, label: str | None = None) -> Iterator[RawRow]:
    """Rows of a JSONL or parquet file. An unreadable file yields one RawRow whose error has row None."""
    path = Path(path)
    file = label or str(path)
    suffix = path.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - any reader failure is a file-level error
            yield RawRow(0, None, b"", [RowError(file, None, None, f"unreadable parquet ({err})")])
            return
        for i, data in enumerate(table.to_pylist(), start=1):
            yield RawRow(i, data, data)
        return
    if suffix not in JSONL_SUFFIXES:
        yield RawRow(
            0,
            None,
            b"",
            [
                RowError(
                    file,
                    None,
                    None,
                    f"unsupported file type {suffix!r}; use {'/'.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)}",
                )
            ],
        )
        return
    try:
        data = path.read_bytes()
    except OSError as err:
        yield RawRow(0, None, b"", [RowError(file, None, None, f"unreadable ({err.strerror or err})")])
        return
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if suffix == ".json" and data.lstrip()[:1] == b"[":  # a JSON array of rows: row = 1-based position
        try:
            items = json.loads(data)
        except (ValueError, RecursionError) as err:
            yield RawRow(0, None, b"", [RowError(file, None, None, f"invalid JSON array ({err})")])
            return
        for i, item in enumerate(items, start=1):
            if isinstance(item, dict):
                yield RawRow(i, item, item)
            else:
                yield RawRow(
                    i,
                    None,
                    json.dumps(item).encode(),
                    [RowError(file, i, None, f"expected a JSON object, got {type(item).__name__}")],
                )
        return
    for i, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield _parse_line(line.rstrip(b"\r"), i, file)


# ----- checking -----------------------------------------------------------------------------------------------
def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_field(value: Any, kind: type | tuple[type, ...], what: str) -> tuple[Any, str | None]:
    """A list/dict field given natively or as JSON text (None or blank: an empty one of the first kind)."""
    empty = kind[0]() if isinstance(kind, tuple) else kind()
    if value is None:
        return empty, None
    if isinstance(value, str):
        if not value.strip():
            return empty, None
        try:
            value = json.loads(value)
        except ValueError as err:
            return None, f"not valid JSON text ({getattr(err, 'msg', err)})"
    if not isinstance(value, kind):
        return None, f"expected {what}, got {_type_name(value)}"
    return value, None


def _known_verifiers() -> set[str]:
    return set(verifier_names())


def _weights_problem(weights: Any, known: set[str]) -> str | None:
    if not isinstance(weights, dict) or not weights:
        return "metadata.reward_weights: expected an object {verifier: weight}"
    for name, w in weights.items():
        if name not in known:
            return f"metadata.reward_weights: unknown verifier {_show(name)}; known: {', '.join(sorted(known))}"
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
            return f"metadata.reward_weights[{name!r}]: expected a non-negative number, got {_show(w)}"
    if not any(w > 0 for w in weights.values()):
        return "metadata.reward_weights: every weight is 0"
    return None


class Validator:
    """Validates rows one at a time, remembering ids across rows (and across files, if reused)."""

    def __init__(self, known_verifiers: Iterable[str] | None = None, domains: Iterable[str] | None = None) -> None:
        self.verifiers = set(known_verifiers) if known_verifiers is not None else _known_verifiers()
        self.domains = set(domains) if domains is not None else None
        self.seen_ids: dict[str, tuple[str, int]] = {}

    def check(self, data: dict[str, Any], row: int, file: str) -> tuple[Task | None, list[RowError]]:
        errs: list[RowError] = []

        def bad(name: str, message: str) -> None:
            errs.append(RowError(file, row, name, message))

        values: dict[str, Any] = {}
        for name in REQUIRED:
            v = data.get(name)
            if name not in data or v is None:
                bad(name, "missing (required)")
            elif not isinstance(v, str):
                bad(name, f"expected a string, got {_type_name(v)} {_show(v)}")
            elif name == "id":
                if not v.strip():
                    bad(name, "empty id")
                elif v in self.seen_ids:
                    where, first = self.seen_ids[v]
                    bad(
                        name,
                        f"duplicate id {_show(v)} (first at {where}:{first})"
                        if where != file
                        else f"duplicate id {_show(v)} (first at row {first})",
                    )
                else:
                    values[name] = v
            elif name == "domain":
                if not _DOMAIN_RE.match(v):
                    bad(name, f"{_show(v)} is not a domain name (lower-case letters, digits, _)")
                elif self.domains is not None and v not in self.domains:
                    bad(name, f"unknown domain {_show(v)}; allowed: {', '.join(sorted(self.domains))}")
                else:
                    values[name] = v
            elif name == "prompt":
                if not v.strip():
                    bad(name, "empty prompt" if not v else "blank prompt (only whitespace)")
                else:
                    values[name] = v
            elif name == "verifier":
                if v not in self.verifiers:
                    bad(name, f"unknown verifier {_show(v)}; known: {', '.join(sorted(self.verifiers))}")
                else:
                    values[name] = v
        for name in ("reference", "source"):
            v = data.get(name)
            if v is not None and not isinstance(v, str):
                bad(name, f"expected a string, got {_type_name(v)} {_show(v)}")
            else:
                values[name] = v or ""
        answer = data.get("answer")
        tests, tests_err = _json_field(
            data.get("tests"), (list, dict), "a list of {call, expected} objects or a {program, ...} object"
        )
        meta, meta_err = _json_field(data.get("metadata"), dict, "an object")
        verifier = values.get("verifier")
        answer_err = answer is not None and not isinstance(answer, str)
        if answer_err:
            bad("answer", f"expected a string or null, got {_type_name(answer)} {_show(answer)}")
        if tests_err:
            bad("tests", tests_err)
        if meta_err:
            bad("metadata", meta_err)
        # what the task's verifier (and every weighted one) needs of the row: the verifier says, not this file
        named = [verifier] if verifier else []
        if not meta_err and isinstance(meta, dict) and "reward_weights" in meta:
            problem = _weights_problem(meta["reward_weights"], self.verifiers)
            if problem:
                bad("metadata", problem)
            else:
                named += [n for n in meta["reward_weights"] if n != verifier]

        taken = {e.field for e in errs}
        for name in named:
            for field_name, message in get_verifier(name).row_problems(
                None if answer_err else answer, None if tests_err else tests, {} if meta_err else meta
            ):
                if field_name not in taken:
                    bad(field_name, message)
                    taken.add(field_name)
        # difficulty
        level = data.get("difficulty", MIN_DIFFICULTY)
        if isinstance(level, float) and level.is_integer():
            level = int(level)
        if level is None:
            level = MIN_DIFFICULTY
        if isinstance(level, bool) or not isinstance(level, int) or not MIN_DIFFICULTY <= level <= MAX_DIFFICULTY:
            got = (
                f"{_type_name(level)} {_show(level)}"
                if not isinstance(level, int) or isinstance(level, bool)
                else str(level)
            )
            bad("difficulty", f"expected an integer {MIN_DIFFICULTY}..{MAX_DIFFICULTY}, got {got}")
        if "id" in values:
            self.seen_ids.setdefault(values["id"], (file, row))
        if errs:
            order = {c: i for i, c in enumerate(COLUMNS)}
            errs.sort(key=lambda e: order.get(e.field or "", -1))
            return None, errs
        return Task(
            id=values["id"],
            domain=values["domain"],
            prompt=values["prompt"],
            verifier=values["verifier"],
            reference=values["reference"],
            answer=answer,
            tests=tests,
            difficulty=level,
            source=values["source"],
            metadata=meta,
        ), []


def validate_rows(rows: Iterable[RawRow], file: str, validator: Validator | None = None) -> ValidationResult:
    validator = validator or Validator()
    result = ValidationResult(file)
    for rr in rows:
        if rr.row:
            result.rows += 1
        errs = list(rr.errors)
        task = None
        if rr.data is not None:
            task, more = validator.check(rr.data, rr.row, file)
            errs += more
            if rr.errors:
                task = None
        if errs:
            result.errors += errs
            if rr.row:
                result.bad.append(rr)
        elif task is not None:
            result.tasks.append(task)
    return result


def check_file(path: Path | str, validator: Validator | None = None, label: str | None = None) -> ValidationResult:
    """Validate every row of a JSONL/parquet task file. An empty file is an error too."""
    file = label or str(path)
    result = validate_rows(read_rows(path, file), file, validator)
    if result.rows == 0 and not result.errors:
        result.errors.append(RowError(file, None, None, "no task rows"))
    return result


def task_row(task: Task) -> dict[str, Any]:
    """A Task as a row dict for `Validator.check` (tests/metadata stay Python objects; nothing is copied)."""
    return {
        "id": task.id,
        "domain": task.domain,
        "prompt": task.prompt,
        "verifier": task.verifier,
        "reference": task.reference,
        "answer": task.answer,
        "tests": task.tests,
        "difficulty": task.difficulty,
        "source": task.source,
        "metadata": task.metadata,
    }


def validate_tasks(
    tasks: Sequence[Task], file: str = "<generated>", validator: Validator | None = None
) -> ValidationResult:
    """Validate Task records already in memory (generated tasks); row = 1-based position."""
    return validate_rows((RawRow(i, task_row(t), task_row(t)) for i, t in enumerate(tasks, start=1)), file, validator)


def write_quarantine(bad: Sequence[RawRow], path: Path | str) -> int:
    """Write bad rows as JSONL (original line bytes when the source was JSONL); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for rr in bad:
            raw = rr.raw if isinstance(rr.raw, bytes) else json.dumps(rr.raw, default=str, ensure_ascii=False).encode()
            f.write(raw.rstrip(b"\n") + b"\n")
    return len(bad)
