"""The `field` slice: what production feedback says, next to what the models do on the same prompts.

The task set keeps the rated feedback records that carry no reference (field.jsonl) and, of those, the ones
their verifier can judge without one as tasks of the domain "field" (field.parquet; training/tasksets/
feedback.py). Evaluation measures every model on those tasks like any holdout domain, so the gate pairs the
candidate with the champion on them and guards them like any domain, and reports beside them:

- `production`: the users' rating-weighted failure rate (mean of 1 - rating: the share of thumbs-down, or the
  dissatisfaction a [0, 1] rating expresses) over every field record, by domain and by the model version that
  answered: the online signal, comparable night to night;
- per model, pass@1 on the verifiable field tasks and its rating-weighted failure rate: failures weighted by the
  users' dissatisfaction with the production answer (weight 1 - rating), so a failure where users complained
  counts most and one where they were content not at all. None when no verifiable record was rated below 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from training import storage
from training.tasksets.feedback import FIELD_DOMAIN, FeedbackRecord, failure_rate
from training.tasksets.io import load_tasks
from training.tasksets.schema import Task


def load_field(manifest: storage.Manifest, workdir: Path) -> tuple[list[Task], list[FeedbackRecord]]:
    """(the slice's verifiable tasks, every field record) of a task set; empty when it has no feedback."""
    tasks: list[Task] = []
    records: list[FeedbackRecord] = []
    if "field.parquet" in manifest.files:
        tasks = load_tasks(storage.fetch(manifest, "field.parquet", Path(workdir) / "taskset" / "field.parquet"))
    if "field.jsonl" in manifest.files:
        text = storage.read_bytes(manifest, "field.jsonl").decode()
        records = [FeedbackRecord.from_json(json.loads(line)) for line in text.splitlines() if line.strip()]
    return tasks, records


def weighted_failure_rate(outcomes: dict[str, Any], ratings: dict[str, float | None]) -> float | None:
    """sum((1 - rating) * failed) / sum(1 - rating) over the evaluated tasks that were rated."""
    num = den = 0.0
    for task_id, passed in zip(outcomes["ids"], outcomes["pass1"]):
        rating = ratings.get(task_id)
        if rating is None:
            continue
        num += (1.0 - rating) * (1 - int(passed))
        den += 1.0 - rating
    return num / den if den > 0 else None


def field_report(models: dict[str, Any], records: list[FeedbackRecord]) -> dict[str, Any]:
    """report.json's `field` section (see the module docstring)."""
    ratings = {r.id: r.rating for r in records}
    out: dict[str, Any] = {
        "records": len(records),
        "verifiable": sum(1 for r in records if r.verifier),
        "production": failure_rate(records),
        "models": {},
    }
    for name, rep in models.items():
        domain = rep["domains"].get(FIELD_DOMAIN)
        if domain is None:
            continue
        c = domain["pass1"]
        out["models"][name] = {
            "tasks": c["total"],
            "pass1": c["passed"] / c["total"] if c["total"] else 0.0,
            "weighted_failure_rate": weighted_failure_rate(domain["outcomes"], ratings),
        }
    return out


def field_lines(field: dict[str, Any]) -> list[str]:
    """report.md's section on the field slice."""
    prod = field["production"]
    rate = "n/a" if prod["failure_rate"] is None else f"{prod['failure_rate']:.3f}"
    lines = [
        "",
        "## Field feedback",
        "",
        f"{field['records']} rated production record(s) without a reference, {field['verifiable']} verifiable; "
        f"users' rating-weighted failure rate {rate} over {prod['records']} rated.",
        "",
        "| model version that answered | records | failure rate |",
        "|---|---|---|",
    ]
    lines += [f"| {v} | {r['records']} | {r['failure_rate']:.3f} |" for v, r in prod["by_model_version"].items()]
    if field["models"]:
        lines += ["", "| model | field tasks | pass@1 | rating-weighted failure rate |", "|---|---|---|---|"]
        for name, m in field["models"].items():
            wf = "n/a" if m["weighted_failure_rate"] is None else f"{m['weighted_failure_rate']:.3f}"
            lines.append(f"| {name} | {m['tasks']} | {m['pass1']:.3f} | {wf} |")
    return lines
