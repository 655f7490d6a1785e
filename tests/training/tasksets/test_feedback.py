"""Production feedback in: row validation and quarantine, stored batches, the task set's tasks and field slice,
and the field figures (users' failure rate, the models' rating-weighted failure rate) against hand values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training import cli, storage
from training.evaluation.field import field_report, weighted_failure_rate
from training.stages.build_taskset import SourceSpec, TasksetConfig, build
from training.tasksets.feedback import FeedbackRecord, FeedbackValidator, failure_rate, validate_feedback
from training.tasksets.feedback_store import batch_id, import_file, read_batches
from training.tasksets.validate import read_rows

TS = "2026-12-05T10:00:00Z"
CONSTRAINT = {"id": "change_case:english_lowercase"}


def row(**kw) -> dict:
    base = {"prompt": "What is 17 * 3?", "response": "51", "timestamp": TS, "model_version": "3", "domain": "math"}
    return {**base, **kw}


GOOD = [
    row(answer="51", verifier="math", thumbs="up"),  # a correction: a task of its domain
    row(prompt="What is 6 * 7?", response="41", answer="42", verifier="math", rating=0.0),
    row(
        prompt="Say hello to the team",
        response="HELLO",
        domain="chat",
        rating=0.25,
        verifier="ifeval",
        metadata={"constraints": [CONSTRAINT]},
    ),  # fmt: skip
    row(prompt="Summarise the ticket", response="...", domain="chat", thumbs="down"),  # rated only
]
BAD = [
    (row(prompt=None, rating=1.0), "prompt", "missing (required)"),
    (row(prompt="Another question", rating=7), "rating", "expected a number in [0, 1]"),
    (row(prompt="Yet another", rating="great"), "rating", "expected a number in [0, 1], got str"),
    (row(prompt="Thumbs sideways", thumbs="sideways"), "thumbs", 'expected "up" or "down"'),
    (row(prompt="Both", rating=1.0, thumbs="up"), "rating", "not both"),
    (row(prompt="When?", rating=1.0, timestamp="yesterday"), "timestamp", "ISO 8601"),
    (row(prompt="Who?", rating=1.0, model_version=None), "model_version", "missing (required)"),
    (row(prompt="Typo", rating=1.0, ratnig=1.0), "ratnig", "unknown field"),
    (row(prompt="No judgement"), "rating", "needs a rating or thumbs"),
    (row(prompt="Answer, no verifier", answer="3"), "verifier", "names its verifier"),
    (row(prompt="Bad answer", answer=3, verifier="math"), "answer", "expected a string or null"),
    (row(**GOOD[0]), "id", "duplicate of row 1"),
]


def write_jsonl(path: Path, rows: list, extra_lines: tuple[bytes, ...] = ()) -> bytes:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows) + b"".join(extra_lines)
    path.write_bytes(data)
    return data


def test_rows_are_sorted_into_tasks_and_field_or_refused_naming_file_row_and_field(tmp_path) -> None:
    path = tmp_path / "night1.jsonl"
    write_jsonl(path, GOOD + [r for r, _, _ in BAD], (b"{not json\n",))
    result = validate_feedback(read_rows(path), str(path), FeedbackValidator())
    kinds = [(r.kind, r.domain, r.verifier, r.rating) for r in result.records]
    assert kinds == [
        ("task", "math", "math", 1.0),
        ("task", "math", "math", 0.0),
        ("field", "chat", "ifeval", 0.25),
        ("field", "chat", "", 0.0),
    ]
    assert result.rows == len(GOOD) + len(BAD) + 1 and len(result.bad) == len(BAD) + 1
    by_row = {}
    for e in result.errors:
        by_row.setdefault(e.row, []).append(e)
    for i, (_, field, text) in enumerate(BAD, start=len(GOOD) + 1):
        errs = by_row[i]
        assert any(e.field == field and text in e.message for e in errs), (i, [str(e) for e in errs])
        assert str(errs[0]).startswith(f"{path}:{i}: field ")
    json_err = by_row[len(GOOD) + len(BAD) + 1][0]
    assert "JSON" in json_err.message or "json" in json_err.message
    # the same record twice has one id, derived from its content
    assert result.records[0].id.startswith("fb-") and len({r.id for r in result.records}) == 4


def test_an_explicitly_named_verifier_must_be_satisfied_but_a_default_one_only_decides_verifiability() -> None:
    named = FeedbackValidator()
    rec, errs = named.check(row(domain="chat", rating=1.0, verifier="ifeval"), 1, "f.jsonl")
    assert rec is None and errs[0].field == "metadata" and "constraints" in errs[0].message
    default = FeedbackValidator(verifier="ifeval")
    rec, errs = default.check(row(domain="chat", rating=1.0), 1, "f.jsonl")
    assert not errs and rec is not None and rec.kind == "field" and rec.verifier == ""
    with pytest.raises(ValueError, match="unknown"):
        FeedbackValidator(verifier="no-such-verifier")


def test_failure_rates_against_hand_values() -> None:
    recs = [
        FeedbackRecord("a", "field", "chat", "p", "r", 0.0, TS, "3"),
        FeedbackRecord("b", "field", "chat", "p", "r", 1.0, TS, "3"),
        FeedbackRecord("c", "field", "mail", "p", "r", 0.5, TS, "4"),
        FeedbackRecord("d", "task", "math", "p", "r", None, TS, "4"),
    ]
    rates = failure_rate(recs)
    # mean of 1 - rating over the three rated: (1 + 0 + 0.5) / 3
    assert rates["records"] == 3 and rates["failure_rate"] == pytest.approx(0.5)
    assert rates["by_model_version"] == {
        "3": {"records": 2, "failure_rate": 0.5},
        "4": {"records": 1, "failure_rate": 0.5},
    }
    assert rates["by_domain"]["chat"]["failure_rate"] == 0.5 and rates["by_domain"]["mail"]["records"] == 1
    ratings = {"a": 0.0, "b": 1.0, "c": 0.5}
    # failed a (weight 1) and b (weight 0), passed c (weight 0.5): 1 / 1.5
    outcomes = {"ids": ["a", "b", "c"], "pass1": [0, 0, 1]}
    assert weighted_failure_rate(outcomes, ratings) == pytest.approx(2 / 3)
    assert weighted_failure_rate({"ids": ["b"], "pass1": [0]}, ratings) is None  # nobody complained
    models = {"candidate": {"domains": {"field": {"pass1": {"passed": 1, "total": 3}, "outcomes": outcomes}}}}
    report = field_report(models, recs[:3])
    assert report["models"]["candidate"] == {"tasks": 3, "pass1": pytest.approx(1 / 3), "weighted_failure_rate": 2 / 3}


def test_import_stores_a_batch_once_keeps_the_raw_file_and_the_quarantine(tmp_path, capsys) -> None:
    path = tmp_path / "night1.jsonl"
    data = write_jsonl(path, GOOD + [BAD[0][0], BAD[1][0]], (b"{not json\n",))
    root = (tmp_path / "feedback").as_uri()
    assert cli.main(["feedback", "import", str(path), "--to", root]) == 0
    out = capsys.readouterr().out
    assert f"{path}:5: field 'prompt': missing (required)" in out and "4 of 7 rows accepted" in out
    uri = storage.join(root, batch_id(data))
    manifest = storage.require_manifest(uri)
    assert storage.read_bytes(manifest, "raw/night1.jsonl") == data  # nothing a user sent is lost
    quarantine = [json.loads(x) for x in storage.read_bytes(manifest, "quarantine.jsonl").decode().splitlines()]
    assert [q["row"] for q in quarantine] == [5, 6, 7]
    assert quarantine[0]["errors"] == [{"field": "prompt", "message": "missing (required)"}]
    assert quarantine[2]["raw"] == "{not json"
    report = storage.read_json(manifest, "report.json")
    assert report["by_kind"] == {"field": 2, "task": 2} and report["quarantined"] == 3

    # the same file again: found complete, nothing written
    assert cli.main(["feedback", "import", str(tmp_path), "--to", root]) == 0
    assert "already imported as " + batch_id(data) in capsys.readouterr().out
    assert storage.require_manifest(uri).created_at == manifest.created_at

    # a file with no usable row: its batch is kept with the quarantine, and the import fails
    bad = tmp_path / "bad" / "night2.jsonl"
    bad.parent.mkdir()
    bad_data = write_jsonl(bad, [BAD[0][0]])
    assert cli.main(["feedback", "import", str(bad), "--to", root]) == 2
    assert "no usable feedback record" in capsys.readouterr().err
    assert storage.read_manifest(storage.join(root, batch_id(bad_data))) is not None


def test_build_reads_batches_tasks_join_their_domain_and_the_field_slice_is_kept_out_of_train(tmp_path) -> None:
    root = (tmp_path / "feedback").as_uri()
    night1 = tmp_path / "n1.jsonl"
    import_file(str(night1), write_jsonl(night1, GOOD), root)
    # night 2 repeats a record and adds one; a train task asks the field prompt word for word
    more = row(prompt="Write a haiku about rain", response="RAIN", domain="chat", rating=0.0, verifier="ifeval",
               metadata={"constraints": [CONSTRAINT]})  # fmt: skip
    night2 = tmp_path / "n2.jsonl"
    import_file(str(night2), write_jsonl(night2, [GOOD[2], more]), root)
    assert len(read_batches([root]).batches) == 2

    tasks = tmp_path / "tasks.jsonl"
    rows = [
        {"id": f"m{i}", "domain": "math", "prompt": f"Compute {i} plus {i} please.", "verifier": "math",
         "answer": str(2 * i)}
        for i in range(40)
    ] + [{"id": "leak", "domain": "chat", "prompt": "write a haiku about rain", "verifier": "ifeval",
          "metadata": {"constraints": [CONSTRAINT]}}]  # fmt: skip
    write_jsonl(tasks, rows)
    cfg = TasksetConfig(profile="data", sources=[SourceSpec(str(tasks))], feedback=[root], holdout_fraction=0.2)
    built = build(cfg)
    ids = {t.id for t in built.train} | {t.id for t in built.holdout}
    fed = [t for t in built.train + built.holdout if t.source.startswith("feedback:")]
    assert len(fed) == 2 and {t.domain for t in fed} == {"math"} and ids >= {t.id for t in fed}
    assert all(t.metadata["feedback"]["model_version"] == "3" for t in fed)
    assert "leak" not in ids  # decontaminated against the field slice
    assert [t.domain for t in built.field_tasks] == ["field", "field"]
    assert {t.metadata["feedback"]["domain"] for t in built.field_tasks} == {"chat"}
    assert len(built.field_records) == 3  # two verifiable, one rated only; the repeat counted once
    fb = built.report["feedback"]
    assert fb["records"] == 5 and fb["duplicates_across_batches"] == 1 and fb["field_verifiable"] == 2
    assert [b["records"] for b in fb["batches"]] == [4, 1]
    # users' failure rate over the five rated records: thumbs up (0), 0.0 (1), 0.25 (0.75), down (1), 0.0 (1)
    assert fb["production"]["failure_rate"] == pytest.approx((0 + 1 + 0.75 + 1 + 1) / 5)


def test_taskset_stage_writes_the_field_slice_and_counts_it(tmp_path, file_run_uri, local_mlflow) -> None:
    root = (tmp_path / "feedback").as_uri()
    night1 = tmp_path / "n1.jsonl"
    import_file(str(night1), write_jsonl(night1, GOOD), root)
    tasks = tmp_path / "tasks.jsonl"
    write_jsonl(tasks, [{"id": f"m{i}", "domain": "math", "prompt": f"Compute {i} times three.", "verifier": "math",
                         "answer": str(3 * i)} for i in range(30)])  # fmt: skip
    config = {"profile": "data", "sources": [{"path": str(tasks)}], "feedback": [root], "holdout_fraction": 0.2}
    assert cli.main(["build-taskset", "--run", file_run_uri, "--config", json.dumps(config)]) == 0
    manifest = storage.require_manifest(storage.join(file_run_uri, "taskset"))
    assert {"field.parquet", "field.jsonl"} <= set(manifest.files)
    assert manifest.extra["summary"]["feedback_records"] == 4 and manifest.extra["summary"]["field"] == 2
    from training.evaluation.field import load_field

    field_tasks, records = load_field(manifest, tmp_path / "read")
    assert [t.verifier for t in field_tasks] == ["ifeval"] and [r.rating for r in records] == [0.25, 0.0]
