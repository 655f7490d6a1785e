"""Loaders for real data: GSM8K, MBPP and HumanEval styles and a mapped user JSONL, from small local files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from training.tasksets.loaders import load_source
from training.tasksets.sources import SourceSpec
from training.tasksets.validate import validate_rows

needs_sandbox = pytest.mark.skipif(
    importlib.util.find_spec("sandbox") is None, reason="sandbox/ is not importable in this checkout"
)

GSM8K = [
    {
        "question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in total?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72 clips.\n#### 72",
    },
    {
        "question": "A shop has 1,000 pens and sells 234. How many are left?",
        "answer": "1000 - 234 = <<1000-234=766>>766\n#### 1,766",
    },
]
MBPP = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\r\n  return tuple(sorted(set(a) & set(b)))",
        "test_list": [
            "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
            "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
        ],
        "test_setup_code": "",
    },
    {
        "task_id": 3,
        "text": "Write a python function to identify non-prime numbers.",
        "code": (
            "import math\ndef is_not_prime(n):\n    return any(n % i == 0 for i in range(2, int(math.sqrt(n)) + 1))"
        ),
        "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True", "assert is_not_prime(35)"],
        "test_setup_code": "import math",
    },
]
HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "entry_point": "add",
        "prompt": 'def add(x: int, y: int) -> int:\n    """Add two numbers."""\n',
        "canonical_solution": "    return x + y\n",
        "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n"
        "    assert candidate(-1, 1) == 0\n",
    }
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def load(spec: SourceSpec, tmp_path):
    from training.tasksets.loaders import source_label

    return validate_rows(load_source(spec, cache_dir=str(tmp_path / "cache")), source_label(spec))


def test_gsm8k_style(tmp_path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", GSM8K)
    result = load(SourceSpec(str(path), adapter="gsm8k", id_prefix="gsm-"), tmp_path)
    assert result.errors == []
    first, second = result.tasks
    assert (first.id, first.answer, first.domain, first.verifier) == ("gsm-1", "72", "math", "math")
    assert "<<" not in first.reference and first.reference.endswith("#### 72")
    assert second.answer == "1766" and first.difficulty == 1
    assert first.source == f"gsm8k:{path}"


def test_gsm8k_bad_row_names_line_and_column(tmp_path) -> None:
    path = write_jsonl(tmp_path / "gsm.jsonl", [GSM8K[0], {"question": "q", "answer": "no marker"}, "{oops"])
    result = load(SourceSpec(str(path), adapter="gsm8k"), tmp_path)
    assert [(e.row, e.field) for e in result.errors] == [(2, "answer"), (3, None)]
    assert str(result.errors[0]).startswith(f"{path}:2: field 'answer': expected a GSM8K solution")
    assert len(result.tasks) == 1 and result.tasks[0].id == "gsm-1"


@needs_sandbox  # the adapter turns asserts into tests with sandbox.parse_assert_tests
def test_mbpp_style_parquet(tmp_path) -> None:
    import datasets

    from sandbox import TestCase

    path = tmp_path / "mbpp.parquet"
    datasets.Dataset.from_list(MBPP).to_parquet(str(path))
    result = load(SourceSpec(str(path), adapter="mbpp", id_prefix="mbpp/", limit=2), tmp_path)
    assert result.errors == []
    t = result.tasks[0]
    assert t.id == "mbpp/2" and t.domain == "code" and t.verifier == "code"
    assert t.prompt.endswith("Your code should pass: " + MBPP[0]["test_list"][0])
    case = TestCase.from_dict(t.tests[0])  # stored in the sandbox's JSON form (tuples stay tuples)
    assert (case.call, case.expected) == ("similar_elements((3, 4, 5, 6), (5, 7, 4, 10))", (4, 5))
    mbpp_default = load(SourceSpec(str(path), adapter="mbpp"), tmp_path).tasks
    assert [t.id for t in mbpp_default] == ["mbpp-2", "mbpp-3"]
    assert "\r" not in t.reference and result.tasks[1].metadata == {
        "program_prefix": "import math\n",
        "visible_tests": [{"call": "is_not_prime(2)", "expected": False}],
    }
    assert result.tasks[1].tests[2] == {"call": "bool(is_not_prime(35))", "expected": True}


@needs_sandbox
def test_humaneval_style(tmp_path) -> None:
    path = write_jsonl(tmp_path / "he.jsonl", HUMANEVAL)
    (t,) = load(SourceSpec(str(path), adapter="humaneval"), tmp_path).tasks
    assert t.id == "HumanEval/0" and t.metadata["program_prefix"] == HUMANEVAL[0]["prompt"]
    assert t.tests == {"program": HUMANEVAL[0]["test"], "entry_point": "add", "setup": HUMANEVAL[0]["prompt"]}


@needs_sandbox
def test_loaded_code_references_pass_in_sandbox(tmp_path) -> None:
    from training.rewards import score_tasks

    he = load(SourceSpec(str(write_jsonl(tmp_path / "he.jsonl", HUMANEVAL)), adapter="humaneval"), tmp_path).tasks
    mbpp = load(SourceSpec(str(write_jsonl(tmp_path / "mbpp.jsonl", MBPP)), adapter="mbpp"), tmp_path).tasks
    tasks = he + mbpp
    # HumanEval completions continue the prompt; MBPP's tuple expectations survive the JSON round trip
    assert score_tasks(tasks, [t.reference for t in tasks]) == [1.0, 1.0, 1.0]
    assert score_tasks(
        tasks, ["    return x - y\n", "def similar_elements(a, b): return ()", "def is_not_prime(n): return True"]
    ) == [0.0, 0.0, 0.0]


def test_mapped_user_jsonl(tmp_path) -> None:
    rows = [
        {"uid": 7, "q": "How many legs has a spider?", "label": 8, "level": 2},
        {"uid": 8, "q": "Capital of France?", "label": "Paris", "level": 1},
        {"uid": 9, "question": "no q column", "label": 1},
    ]
    path = write_jsonl(tmp_path / "user.jsonl", rows)
    spec = SourceSpec(
        str(path),
        adapter="mapped",
        fields={"id": "uid", "prompt": "q", "answer": "label", "difficulty": "level"},
        domain="trivia",
        verifier="math",
    )
    result = load(spec, tmp_path)
    assert [(t.id, t.answer, t.difficulty, t.domain) for t in result.tasks] == [
        ("7", "8", 2, "trivia"),
        ("8", "Paris", 1, "trivia"),
    ]
    assert [(e.row, e.field, e.message) for e in result.errors] == [(3, "q", "missing (mapped to Task field 'prompt')")]


@needs_sandbox
def test_mapped_assert_tests_and_tasks_adapter(tmp_path) -> None:
    rows = [{"name": "dbl", "desc": "Double it.", "asserts": ["assert dbl(2) == 4"]}]
    spec = SourceSpec(
        str(write_jsonl(tmp_path / "c.jsonl", rows)),
        adapter="mapped",
        fields={"id": "name", "prompt": "desc", "tests": "asserts"},
        domain="code",
        verifier="code",
    )
    (t,) = load(spec, tmp_path).tasks
    assert t.tests == [{"call": "dbl(2)", "expected": 4}] and t.difficulty == 1
    task_row = {"id": "a", "domain": "math", "prompt": "Q: 1+1=? A:", "verifier": "math", "answer": "2"}
    (t,) = load(SourceSpec(str(write_jsonl(tmp_path / "t.jsonl", [task_row]))), tmp_path).tasks
    assert t.id == "a" and t.answer == "2"


def test_missing_file_and_hub_failure_are_file_level_errors(tmp_path) -> None:
    result = load(SourceSpec(str(tmp_path / "nope.jsonl"), adapter="gsm8k"), tmp_path)
    assert [(e.row, e.field) for e in result.errors] == [(None, None)] and "does not exist" in str(result.errors[0])


def test_spec_rejects_unknown_adapter() -> None:
    with pytest.raises(ValueError, match="adapter 'csv' is not one of"):
        SourceSpec("x.jsonl", adapter="csv")


@needs_sandbox
def test_mbpp_rows_whose_asserts_need_code_become_test_programs(tmp_path) -> None:
    """Loops, helpers and `!=` cannot move to the host: such rows (and their challenge tests) load as a whole
    test program with test_setup_code as its setup, and the reference passes it."""
    from training.rewards import score_tasks

    row = {
        "task_id": 9,
        "text": "Write a function to square every item.",
        "code": "def squares(xs):\n    return [x * x for x in xs]",
        "test_setup_code": "DATA = [1, 2, 3]",
        "test_list": ["assert squares(DATA) == [1, 4, 9]", "assert squares([]) != None"],
        "challenge_test_list": ["for n in range(5):\n    assert squares([n]) == [n * n]"],
    }
    (t,) = load(SourceSpec(str(write_jsonl(tmp_path / "mbpp.jsonl", [row])), adapter="mbpp"), tmp_path).tasks
    assert t.tests == {"program": "\n".join(row["test_list"] + row["challenge_test_list"]), "setup": "DATA = [1, 2, 3]"}
    assert score_tasks([t, t], [t.reference, "def squares(xs):\n    return xs"]) == [1.0, 0.0]
