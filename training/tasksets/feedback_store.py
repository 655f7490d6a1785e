"""Feedback batches in storage: one manifested folder per imported file, named by its content.

`<ROOT>/batch-<sha256 of the file, 16 hex>/`, committed manifest last:

    raw/<file name>     the file exactly as it arrived (nothing a user sends is lost)
    records.jsonl       the accepted records, normalised (training/tasksets/feedback.py)
    quarantine.jsonl    the refused rows: row, every error (field and message) and the original line
    report.json         counts by kind, domain and model version, the time span, the first errors

Named by content, so importing the same file again (a retried task, a file left in the inbox) finds the batch
complete and writes nothing, and a changed file is a new batch. `read_batches` gives the task set every
complete batch under the roots it names, oldest first, a record that arrived in two batches once.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from training import storage
from training.tasksets.feedback import (
    FeedbackRecord,
    FeedbackValidator,
    quarantine_lines,
    summarize,
    validate_feedback,
)
from training.tasksets.validate import JSONL_SUFFIXES, read_rows

BATCH_PREFIX = "batch-"


def batch_id(data: bytes) -> str:
    return BATCH_PREFIX + hashlib.sha256(data).hexdigest()[:16]


def _stored_files(uri: str) -> list[tuple[str, bytes]]:
    """One object, or the *.jsonl objects directly under a prefix (none yet: an empty inbox)."""
    loc = storage.locate(uri)
    try:
        return [(uri, loc.backend.get_bytes(loc.key()))]
    except storage.ObjectNotFound:
        pass  # not an object: a prefix of feedback files
    names = sorted(r for r in storage.iter_files(uri) if r.endswith(JSONL_SUFFIXES) and "/" not in r)
    return [(storage.join(uri, n), loc.backend.get_bytes(loc.key(n))) for n in names]


def input_files(paths: list[str]) -> list[tuple[str, bytes]]:
    """(label, bytes) of every file named: a local file, a local folder's *.jsonl, or a storage URI (an object,
    or the *.jsonl objects under a prefix), in name order."""
    out: list[tuple[str, bytes]] = []
    for path in paths:
        if "://" in path and not path.startswith("file://"):
            out += _stored_files(path)
            continue
        local = Path(path.removeprefix("file://"))
        if local.is_dir():
            files = sorted(p for p in local.iterdir() if p.is_file() and p.suffix.lower() in JSONL_SUFFIXES)
            out += [(str(p), p.read_bytes()) for p in files]
        elif local.is_file():
            out.append((str(local), local.read_bytes()))
        else:
            raise storage.ObjectNotFound(f"{path}: no such feedback file or folder")
    return out


def import_file(label: str, data: bytes, root: str, domain: str = "", verifier: str = "") -> dict[str, Any]:
    """Store one feedback file as a batch under `root` (or find it stored); its report."""
    bid = batch_id(data)
    uri = storage.join(root, bid)
    done = storage.read_manifest(uri)
    if done is not None:
        return {**storage.read_json(done, "report.json"), "already_imported": True}
    name = PurePosixPath(label).name or "feedback.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / name
        local.write_bytes(data)
        result = validate_feedback(read_rows(local, label), label, FeedbackValidator(domain, verifier))
    report = {
        "batch": bid,
        "uri": uri,
        "file": label,
        "sha256": hashlib.sha256(data).hexdigest(),
        "rows": result.rows,
        "accepted": len(result.records),
        "quarantined": len(result.bad),
        "errors": len(result.errors),
        "examples": [str(e) for e in result.errors[:50]],
        **summarize(result.records),
    }
    writer = storage.ManifestWriter(uri)
    writer.put_bytes(data, f"raw/{name}")
    records = "".join(json.dumps(r.to_json(), ensure_ascii=False, sort_keys=True) + "\n" for r in result.records)
    writer.put_bytes(records.encode(), "records.jsonl")
    if result.bad:
        writer.put_bytes(quarantine_lines(result.bad), "quarantine.jsonl")
    writer.put_json(report, "report.json")
    writer.commit(
        config={"file": label, "domain": domain, "verifier": verifier},
        # to the microsecond: batches imported within one second still read back in the order they came
        extra={
            "summary": {k: report[k] for k in ("batch", "rows", "accepted", "quarantined")},
            "imported_at": datetime.now(UTC).isoformat(),
        },
    )
    return {**report, "already_imported": False}


@dataclass
class Batches:
    """The feedback a task set reads: every record once, and which batches it came from."""

    records: list[tuple[str, FeedbackRecord]] = field(default_factory=list)  # (batch id, record)
    batches: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0


def batch_manifests(uri: str) -> list[storage.Manifest]:
    """`uri` itself when it is a complete batch, else every complete batch folder directly under it, in the
    order they were committed (an incomplete one, an import killed midway, is not there yet)."""
    own = storage.read_manifest(uri)
    if own is not None:
        return [own]
    names = sorted(
        {r.split("/")[0] for r in storage.iter_files(uri) if r.startswith(BATCH_PREFIX) and r.count("/") == 1}
    )
    found = [m for m in (storage.read_manifest(storage.join(uri, n)) for n in names) if m is not None]
    return sorted(found, key=lambda m: (str(m.extra.get("imported_at") or m.created_at), m.uri))


def read_batches(uris: list[str]) -> Batches:
    """Every record of every complete batch under `uris`; a record id seen in an earlier batch is skipped."""
    out = Batches()
    seen: set[str] = set()
    for uri in uris:
        for manifest in batch_manifests(uri):
            report = storage.read_json(manifest, "report.json")
            text = storage.read_bytes(manifest, "records.jsonl").decode()
            taken = 0
            for line in text.splitlines():
                if not line.strip():
                    continue
                record = FeedbackRecord.from_json(json.loads(line))
                if record.id in seen:
                    out.duplicates += 1
                    continue
                seen.add(record.id)
                out.records.append((report["batch"], record))
                taken += 1
            out.batches.append(
                {"batch": report["batch"], "uri": manifest.uri, "file": report["file"], "records": taken,
                 "created_at": manifest.created_at}
            )  # fmt: skip
    return out
