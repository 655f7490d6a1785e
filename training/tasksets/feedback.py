"""Production feedback as data: records validated row by row, sorted into verifiable tasks and the `field` slice.

A feedback file is JSONL, one record a line, as a serving system logs it:

    {"prompt": "What is 17 * 3?", "response": "51", "thumbs": "up", "timestamp": "2026-12-05T10:00:00Z",
     "model_version": "3", "domain": "math", "answer": "51"}

    prompt          what the user asked (required, not blank)
    response        what the model answered (required, a string; may be empty)
    rating | thumbs the user's judgement: `rating` a number in [0, 1] (1 = satisfied), or `thumbs` "up" / "down"
                    (also true / false, 1 / -1); one of them, not both. Optional where the record carries an
                    answer or tests (a correction is feedback enough).
    timestamp       when it was answered, ISO 8601 (required)
    model_version   the registered model version (or any label) that answered (required)
    domain          the task domain (required unless the import names one for the file)
    answer, tests   what a verifier checks (the task schema's fields: a math answer, code tests)
    reference       a correct full response (the SFT target), optional
    verifier        the verifier that checks it (else the import's default)
    metadata        anything the verifier needs (ifeval: {"constraints": [...]})
    id              optional; else derived from the record's content, so the same record has the same id in
                    every batch it arrives in
    difficulty      optional, 1..5

What a record becomes:
- with `answer`, `tests` or `reference`: a verifiable **task** of its domain (kind "task"), checked by its
  verifier like any task row; it goes through the task set's dedup, hash split and decontamination like any
  source, so a user's correction can land in the holdout and be guarded there.
- rated, without them: a **field** record (kind "field"): the production rating is kept, and when its
  verifier can judge it without a reference (ifeval constraints, say) the evaluation measures the models on it
  as the `field` slice; otherwise it only counts in the production failure rate.
- anything else is refused with every problem named (file, row, field) and kept in the batch's quarantine
  with the original line: missing prompt, bad rating, bad JSON, a duplicate of an earlier row, ...
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from training.rewards import get_verifier, verifier_names
from training.tasksets.schema import Task
from training.tasksets.validate import _DOMAIN_RE, RawRow, RowError, Validator

FIELD_DOMAIN = "field"
KINDS = ("task", "field")
THUMBS = {"up": 1.0, "down": 0.0}  # and true / false, 1 / -1
KNOWN_FIELDS = (
    "id", "prompt", "response", "rating", "thumbs", "timestamp", "model_version", "domain", "answer", "tests",
    "reference", "verifier", "metadata", "difficulty",
)  # fmt: skip


@dataclass(frozen=True)
class FeedbackRecord:
    """One accepted record, normalised: `rating` in [0, 1] or None, `kind` "task" or "field"."""

    id: str
    kind: str
    domain: str
    prompt: str
    response: str
    rating: float | None
    timestamp: str
    model_version: str
    verifier: str = ""
    answer: str | None = None
    tests: list[dict[str, Any]] | dict[str, Any] = field(default_factory=list)
    reference: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    difficulty: int = 1
    row: int = 0

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeedbackRecord:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def feedback_metadata(self, batch: str) -> dict[str, Any]:
        return {"rating": self.rating, "model_version": self.model_version, "timestamp": self.timestamp, "batch": batch}

    def as_task(self, batch: str) -> Task:
        """A kind "task" record as a task of its domain; the production context rides in metadata.feedback."""
        return Task(
            id=self.id,
            domain=self.domain,
            prompt=self.prompt,
            verifier=self.verifier,
            reference=self.reference,
            answer=self.answer,
            tests=self.tests,
            difficulty=self.difficulty,
            source=f"feedback:{batch}",
            metadata={**self.metadata, "feedback": self.feedback_metadata(batch)},
        )

    def field_task(self, batch: str) -> Task | None:
        """A kind "field" record as a task of the `field` slice, when its verifier can judge it without a
        reference; None when only its rating counts. The slice's tasks pool into the gate group "field"."""
        if not self.verifier:
            return None
        meta = {
            **self.metadata,
            "feedback": {**self.feedback_metadata(batch), "domain": self.domain, "response": self.response},
            "group": FIELD_DOMAIN,
        }
        return Task(
            id=self.id,
            domain=FIELD_DOMAIN,
            prompt=self.prompt,
            verifier=self.verifier,
            difficulty=self.difficulty,
            source=f"feedback:{batch}",
            metadata=meta,
        )


@dataclass
class FeedbackResult:
    file: str
    records: list[FeedbackRecord] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)
    bad: list[RawRow] = field(default_factory=list)
    rows: int = 0


def record_id(domain: str, prompt: str, response: str, model_version: str, timestamp: str) -> str:
    """The id of a record without one: a digest of what makes it this record, the same in every batch."""
    digest = hashlib.sha256("\x1f".join((domain, prompt, response, model_version, timestamp)).encode())
    return "fb-" + digest.hexdigest()[:16]


def parse_rating(data: dict[str, Any]) -> tuple[float | None, str | None, str | None]:
    """(rating in [0, 1] or None, the field at fault, the problem) from `rating` or `thumbs`."""
    has_rating, has_thumbs = data.get("rating") is not None, data.get("thumbs") is not None
    if has_rating and has_thumbs:
        return None, "rating", "give rating or thumbs, not both"
    if has_thumbs:
        value = data["thumbs"]
        if isinstance(value, str) and value.strip().lower() in THUMBS:
            return THUMBS[value.strip().lower()], None, None
        if isinstance(value, bool):
            return float(value), None, None
        if isinstance(value, (int, float)) and value in (1, -1):
            return (1.0 if value == 1 else 0.0), None, None
        return None, "thumbs", f'expected "up" or "down" (or true/false, 1/-1), got {value!r}'
    if has_rating:
        value = data["rating"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "rating", f"expected a number in [0, 1], got {type(value).__name__} {value!r}"
        if not 0.0 <= float(value) <= 1.0:
            return None, "rating", f"expected a number in [0, 1] (1 = satisfied), got {value!r}"
        return float(value), None, None
    return None, None, None


def _timestamp_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return "missing (required): when the response was given, ISO 8601"
    try:
        datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return f"expected an ISO 8601 time such as 2026-12-05T10:00:00Z, got {value!r}"
    return None


class FeedbackValidator:
    """Validates feedback rows one at a time, remembering ids (explicit or derived) to refuse duplicates."""

    def __init__(self, domain: str = "", verifier: str = "") -> None:
        if domain and not _DOMAIN_RE.match(domain):
            raise ValueError(f"domain {domain!r} is not a domain name (lower-case letters, digits, _)")
        if verifier and verifier not in verifier_names():
            raise ValueError(f"verifier {verifier!r} is unknown; known: {', '.join(sorted(verifier_names()))}")
        self.domain = domain
        self.verifier = verifier
        self.seen: dict[str, int] = {}
        self.known = set(verifier_names())

    def check(self, data: dict[str, Any], row: int, file: str) -> tuple[FeedbackRecord | None, list[RowError]]:
        errs: list[RowError] = []

        def bad(name: str | None, message: str) -> None:
            errs.append(RowError(file, row, name, message))

        prompt = data.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            bad("prompt", "missing (required)" if prompt is None else "expected a non-blank string")
        response = data.get("response")
        if not isinstance(response, str):
            bad("response", "missing (required): the model's answer" if response is None else "expected a string")
        rating, at, problem = parse_rating(data)
        if problem:
            bad(at, problem)
        ts_problem = _timestamp_problem(data.get("timestamp"))
        if ts_problem:
            bad("timestamp", ts_problem)
        version = data.get("model_version")
        if not isinstance(version, (str, int)) or isinstance(version, bool) or not str(version).strip():
            bad("model_version", "missing (required): the model version that answered")
        domain = data.get("domain") or self.domain
        if not isinstance(domain, str) or not domain:
            bad("domain", "missing (required), or name one for the whole file (--domain)")
        elif not _DOMAIN_RE.match(domain):
            bad("domain", f"{domain!r} is not a domain name (lower-case letters, digits, _)")
        elif domain == FIELD_DOMAIN:
            bad("domain", f"{FIELD_DOMAIN!r} is the name of the feedback evaluation slice; name the task's domain")
        verifier = data.get("verifier") or self.verifier
        if verifier and verifier not in verifier_names():
            bad("verifier", f"unknown verifier {verifier!r}; known: {', '.join(sorted(verifier_names()))}")
            verifier = ""
        unknown = sorted(set(data) - set(KNOWN_FIELDS))
        if unknown:
            bad(unknown[0], f"unknown field(s) {unknown}; known: {', '.join(KNOWN_FIELDS)}")
        if errs:
            return None, errs
        assert isinstance(prompt, str) and isinstance(response, str) and isinstance(domain, str)  # checked above

        rid = data.get("id")
        if rid is not None and (not isinstance(rid, str) or not rid.strip()):
            return None, [RowError(file, row, "id", "expected a non-empty string")]
        rid = rid or record_id(domain, prompt, response, str(version), data["timestamp"])
        if rid in self.seen:
            return None, [RowError(file, row, "id", f"duplicate of row {self.seen[rid]} (id {rid!r})")]

        verifiable = any(data.get(k) not in (None, "", []) for k in ("answer", "tests", "reference"))
        if not verifiable and rating is None:
            return None, [RowError(file, row, "rating", "missing: a record needs a rating or thumbs, or an answer")]
        task_row: dict[str, Any] = {
            "id": rid,
            "domain": domain,
            "prompt": prompt,
            "verifier": verifier,
            **{k: data[k] for k in ("answer", "tests", "reference", "metadata", "difficulty") if k in data},
        }
        named = bool(data.get("verifier"))
        if verifiable and not verifier:
            return None, [
                RowError(file, row, "verifier", "missing: a record with an answer or tests names its verifier")
            ]
        # the task schema's checks; a field record's verifier's own needs are weighed below, not here
        checker = Validator(self.known)
        task, task_errs = checker.check({**task_row, "verifier": verifier if verifiable else "format"}, row, file)
        if task is None:
            return None, task_errs
        if not verifiable and verifier:
            problems = get_verifier(verifier).row_problems(None, [], task.metadata)
            if problems and named:  # the record asked for this verifier: its row must satisfy it
                return None, [RowError(file, row, f, m) for f, m in problems]
            if problems or verifier == "format":
                verifier = ""  # the import's default needs a reference here (or only delegates): rating only
        self.seen[rid] = row
        return (
            FeedbackRecord(
                id=rid,
                kind="task" if verifiable else "field",
                domain=domain,
                prompt=prompt,
                response=response,
                rating=rating,
                timestamp=data["timestamp"].strip(),
                model_version=str(version),
                verifier=verifier,
                answer=task.answer,
                tests=task.tests,
                reference=task.reference,
                metadata=task.metadata,
                difficulty=task.difficulty,
                row=row,
            ),
            [],
        )


def validate_feedback(rows: Iterable[RawRow], file: str, validator: FeedbackValidator) -> FeedbackResult:
    """Every row of a feedback file checked: the accepted records, every error, the bad rows as read."""
    result = FeedbackResult(file)
    for rr in rows:
        if rr.data is None or rr.errors:
            if rr.row == 0:  # the whole file (unreadable, unsupported suffix)
                result.errors += rr.errors
                continue
            result.rows += 1
            result.errors += rr.errors
            result.bad.append(rr)
            continue
        result.rows += 1
        record, errs = validator.check(rr.data, rr.row, file)
        if record is None:
            result.errors += errs
            result.bad.append(RawRow(rr.row, rr.data, rr.raw, errs))
        else:
            result.records.append(record)
    return result


def quarantine_lines(bad: Sequence[RawRow]) -> bytes:
    """The refused rows as JSONL: where, why, and the original line (as text, undecodable bytes escaped)."""
    out = []
    for rr in bad:
        raw = rr.raw.decode("utf-8", "backslashreplace") if isinstance(rr.raw, bytes) else rr.raw
        out.append(
            json.dumps(
                {
                    "row": rr.row,
                    "errors": [{"field": e.field, "message": e.message} for e in rr.errors],
                    "raw": raw.rstrip("\n") if isinstance(raw, str) else raw,
                },
                ensure_ascii=False,
                default=str,
            )
        )
    return ("\n".join(out) + "\n").encode() if out else b""


def summarize(records: Sequence[FeedbackRecord]) -> dict[str, Any]:
    """Counts of a batch's records by kind, domain and answering model version, and the time they span."""
    times = sorted(r.timestamp for r in records)
    return {
        "records": len(records),
        "by_kind": dict(sorted(Counter(r.kind for r in records).items())),
        "by_domain": dict(sorted(Counter(r.domain for r in records).items())),
        "by_model_version": dict(sorted(Counter(r.model_version for r in records).items())),
        "field_verifiable": sum(1 for r in records if r.kind == "field" and r.verifier),
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
    }


def failure_rate(records: Iterable[FeedbackRecord]) -> dict[str, Any]:
    """What users said: the rating-weighted failure rate (mean of 1 - rating: the share of thumbs-down, or the
    dissatisfaction a [0, 1] rating expresses) over all rated records, by domain and by model version."""
    rated = [r for r in records if r.rating is not None]

    def rate(rs: list[FeedbackRecord]) -> dict[str, Any]:
        return {"records": len(rs), "failure_rate": round(sum(1.0 - (r.rating or 0.0) for r in rs) / len(rs), 6)}

    by: dict[str, dict[str, list[FeedbackRecord]]] = {"by_domain": {}, "by_model_version": {}}
    for r in rated:
        by["by_domain"].setdefault(r.domain, []).append(r)
        by["by_model_version"].setdefault(r.model_version, []).append(r)
    return {
        **(rate(rated) if rated else {"records": 0, "failure_rate": None}),
        **{k: {name: rate(rs) for name, rs in sorted(v.items())} for k, v in by.items()},
    }
