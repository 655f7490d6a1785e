"""Generators (deterministic, bounded difficulty, short) and the parquet round trip."""

from __future__ import annotations

import json

import pytest

from training.tasksets.dedup import tokens
from training.tasksets.generators import generate
from training.tasksets.io import load_tasks, save_tasks
from training.tasksets.schema import Task
from training.tasksets.validate import TasksetValidationError, validate_tasks

DOMAINS = ("math", "code", "extraction", "instruction")


@pytest.mark.parametrize("domain", DOMAINS)
def test_deterministic_by_seed_and_prefix_stable(domain) -> None:
    a = generate(domain, 200, seed=7)
    assert a == generate(domain, 200, seed=7)
    assert generate(domain, 50, seed=7) == a[:50]  # ids and tasks do not depend on n
    assert [t.prompt for t in generate(domain, 200, seed=8)] != [t.prompt for t in a]
    assert len({t.id for t in a}) == 200 and a[3].id == f"{domain}-7-3"


@pytest.mark.parametrize("domain", DOMAINS)
def test_difficulty_bounded_balanced_and_valid(domain) -> None:
    tasks = generate(domain, 300, seed=1, difficulties=(2, 4))
    assert {t.difficulty for t in tasks} == {2, 4}
    assert sum(t.difficulty == 2 for t in tasks) == 150
    assert validate_tasks(tasks).errors == []
    for t in tasks:  # sized for the tiny model, and within the 13-gram contamination window
        assert len(t.prompt) < 60 and len(t.reference) <= 42 and len(tokens(t.prompt)) <= 13, t
        assert t.source == f"synthetic:{domain}@seed=1"
    with pytest.raises(ValueError, match="difficulties"):
        generate(domain, 1, 0, difficulties=(0,))


def test_difficulty_levels_get_harder() -> None:
    tasks = generate("math", 500, 0)
    digits = {d: max(len(t.answer.lstrip("-")) for t in tasks if t.difficulty == d) for d in range(1, 6)}
    assert digits[1] <= 2 and digits[4] >= 4
    assert all("+" in t.prompt and len(t.prompt) <= 11 for t in tasks if t.difficulty == 1)
    code = generate("code", 50, 0)
    assert all(3 <= len(t.tests) <= 5 for t in code)
    with pytest.raises(ValueError, match="unknown generator domain"):
        generate("poetry", 1, 0)


def test_parquet_round_trip(tmp_path) -> None:
    tasks = generate("math", 30, 0) + generate("code", 30, 0) + generate("extraction", 30, 0)
    tasks.append(Task("odd", "math", "Q: ünïcödé − 1=? A:", "math", answer="-1", metadata={"k": [1, {"x": None}]}))
    path = tmp_path / "sub" / "tasks.parquet"
    save_tasks(tasks, path)
    assert load_tasks(path) == tasks
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    assert schema.names == [
        "id",
        "domain",
        "prompt",
        "verifier",
        "reference",
        "answer",
        "tests",
        "difficulty",
        "source",
        "metadata",
    ]
    assert json.loads(pq.read_table(path).column("tests")[30].as_py()) == tasks[30].tests


def test_load_tasks_refuses_bad_rows(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "domain": "math", "prompt": "p", "verifier": "math"}) + "\n")
    with pytest.raises(TasksetValidationError, match=r"t.jsonl:1: field 'answer'"):
        load_tasks(path)
