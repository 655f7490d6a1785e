"""`posttrain taskset check`: every kind of bad file gives exit 2 and an error naming its exact row and field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training import cli
from training.tasksets.generators import generate
from training.tasksets.io import save_tasks, to_dataset
from training.tasksets.validate import check_file

MATH = {
    "id": "m1",
    "domain": "math",
    "prompt": "Q: 2+3=? A:",
    "verifier": "math",
    "reference": "5",
    "answer": "5",
    "difficulty": 1,
    "source": "test",
}
CODE = {
    "id": "c1",
    "domain": "code",
    "prompt": "Write f(x) returning x plus 1.",
    "verifier": "code",
    "reference": "def f(x): return x+1",
    "tests": [{"call": "f(1)", "expected": 2}],
    "difficulty": 1,
}
EXTRACT = {
    "id": "e1",
    "domain": "extraction",
    "prompt": "Extract age as JSON: Bob is 31.",
    "verifier": "json_rules",
    "answer": '{"age": 31}',
    "difficulty": 1,
    "metadata": {
        "schema": {
            "type": "object",
            "properties": {"age": {"type": "integer"}},
            "required": ["age"],
            "additionalProperties": False,
        }
    },
}


def row(base: dict, i: int, **over) -> dict:
    out = {**base, "id": f"{base['id']}-{i}", **over}
    return {k: v for k, v in out.items() if v is not _DROP}


_DROP = object()


def jsonl(path: Path, rows: list) -> Path:
    lines = [
        r if isinstance(r, bytes) else (r.encode() if isinstance(r, str) else json.dumps(r).encode()) for r in rows
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def good(n: int = 3) -> list[dict]:
    return [row(MATH, i) for i in range(n)]


# (name, rows, expected (row, field) of the single error)
BAD_FILES = [
    ("missing_field", good(1) + [row(MATH, 9, prompt=_DROP)] + good(1)[:0], (2, "prompt")),
    ("wrong_type_difficulty", good(2) + [row(MATH, 9, difficulty="hard")], (3, "difficulty")),
    ("whitespace_prompt", [row(MATH, 9, prompt="  \t ")] + good(2), (1, "prompt")),
    (
        "non_utf8_bytes",
        [
            row(MATH, 0),
            b'{"id": "x", "domain": "math", "prompt": "Q: 2+\xff3=? A:", "verifier": "math", "answer": "5"}',
            row(MATH, 2),
        ],
        (2, "prompt"),
    ),
    ("invalid_json_line", good(2) + ['{"id": "m-9", "domain": "math", "prompt": "Q"'], (3, None)),
    ("unknown_verifier", [row(MATH, 0), row(MATH, 9, verifier="regex_magic")], (2, "verifier")),
    ("duplicate_id", [row(MATH, 0), row(MATH, 1), row(MATH, 0)], (3, "id")),
    ("difficulty_out_of_range", [row(MATH, 0), row(MATH, 9, difficulty=9)], (2, "difficulty")),
    ("code_without_tests", [row(CODE, 9, tests=[]), row(CODE, 1)], (1, "tests")),
    ("code_malformed_test", [row(CODE, 0), row(CODE, 9, tests=[{"call": "f(1)"}])], (2, "tests")),
    ("code_test_not_expression", [row(CODE, 9, tests=[{"call": "f(1", "expected": 2}])], (1, "tests")),
    ("math_without_answer", [row(MATH, 0), row(MATH, 9, answer=None)], (2, "answer")),
    ("extraction_answer_not_json", [row(EXTRACT, 9, answer="{age: 31}")], (1, "answer")),
    ("extraction_answer_breaks_schema", [row(EXTRACT, 0), row(EXTRACT, 9, answer='{"age": "31"}')], (2, "answer")),
    ("extraction_rules_malformed", [row(EXTRACT, 9, metadata={"rules": {"path": "age"}})], (1, "metadata")),
    ("bad_domain_name", [row(MATH, 9, domain="Math!")], (1, "domain")),
    ("metadata_not_object", [row(MATH, 0), row(MATH, 1), row(MATH, 9, metadata=[1, 2])], (3, "metadata")),
    ("line_not_object", [row(MATH, 0), "[1, 2, 3]"], (2, None)),
    ("wrong_type_id", [row(MATH, 0, id=17)], (1, "id")),
    ("blank_lines_counted", [row(MATH, 0), "", row(MATH, 9, difficulty=0)], (3, "difficulty")),
]


def _expected_line(path: Path, row_no: int, field: str | None) -> str:
    return f"{path}:{row_no}: field {field!r}: " if field else f"{path}:{row_no}: "


@pytest.mark.parametrize("name,rows,where", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_jsonl_names_row_and_field(tmp_path, capsys, name, rows, where) -> None:
    path = jsonl(tmp_path / f"{name}.jsonl", rows)
    assert cli.main(["taskset", "check", str(path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(_expected_line(path, *where)), out[0]
    result = check_file(path)
    assert [(e.row, e.field) for e in result.errors] == [where]
    assert len(result.tasks) == result.rows - 1


def test_messages_say_what_is_wrong(tmp_path) -> None:
    cases = {
        "difficulty": ([row(MATH, 0, difficulty="hard")], "expected an integer 1..5, got str 'hard'"),
        "verifier": (
            [row(MATH, 0, verifier="nope")],
            "unknown verifier 'nope'; known: code, format, ifeval, json_rules, judge, math",
        ),
        "id": ([row(MATH, 0), row(MATH, 0)], "duplicate id 'm1-0' (first at row 1)"),
        "prompt": (
            [b'{"id": "a", "domain": "math", "prompt": "\xfe", "verifier": "math", "answer": "1"}'],
            "not valid UTF-8 (byte 0xfe",
        ),
    }
    for field, (rows, message) in cases.items():
        errors = check_file(jsonl(tmp_path / f"{field}.jsonl", rows)).errors
        assert len(errors) == 1 and errors[0].field == field and message in errors[0].message, errors


def test_parquet_missing_column_and_wrong_type(tmp_path, capsys) -> None:
    ds = to_dataset(generate("math", 4, seed=0)).remove_columns(["verifier"])
    path = tmp_path / "no_verifier.parquet"
    ds.to_parquet(str(path))
    assert cli.main(["taskset", "check", str(path)]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{path}:{i}: field 'verifier': missing (required)" for i in range(1, 5)]

    ds = to_dataset(generate("math", 3, seed=0))
    ds = ds.remove_columns(["difficulty"]).add_column("difficulty", ["1", "2", "3"])
    path = tmp_path / "str_difficulty.parquet"
    ds.to_parquet(str(path))
    assert [(e.row, e.field) for e in check_file(path).errors] == [
        (1, "difficulty"),
        (2, "difficulty"),
        (3, "difficulty"),
    ]


def test_good_files_pass(tmp_path, capsys) -> None:
    tasks = generate("math", 20, 0) + generate("code", 20, 0) + generate("extraction", 20, 0)
    save_tasks(tasks, tmp_path / "ok.parquet")
    jsonl(
        tmp_path / "ok.jsonl",
        [row(MATH, 0), row(CODE, 0), row(EXTRACT, 0), row(CODE, 1, tests=json.dumps(CODE["tests"]))],
    )  # tests as JSON text is fine
    assert cli.main(["taskset", "check", str(tmp_path / "ok.parquet"), str(tmp_path / "ok.jsonl")]) == 0
    assert capsys.readouterr().out == ""


def test_unreadable_and_empty_files(tmp_path, capsys) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    (tmp_path / "x.csv").write_text("a,b\n")
    for name, message in (
        ("empty.jsonl", "no task rows"),
        ("broken.parquet", "unreadable parquet"),
        ("x.csv", "unsupported file type"),
    ):
        assert cli.main(["taskset", "check", str(tmp_path / name)]) == 2
        assert message in capsys.readouterr().out


def test_quarantine_writes_bad_rows_aside(tmp_path, capsys) -> None:
    bad_bytes = b'{"id": "x", "domain": "math", "prompt": "\xff\xfe", "verifier": "math", "answer": "1"}'
    path = jsonl(
        tmp_path / "mixed.jsonl", [row(MATH, 0), bad_bytes, row(MATH, 1), row(MATH, 2, verifier="?"), row(MATH, 3)]
    )
    out = tmp_path / "q" / "bad.jsonl"
    assert cli.main(["taskset", "check", str(path), "--quarantine", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"quarantined 2 row(s) to {out}" in captured.err
    assert f"{path}:2: field 'prompt'" in captured.out and f"{path}:4: field 'verifier'" in captured.out
    lines = out.read_bytes().splitlines()
    assert lines == [bad_bytes, json.dumps(row(MATH, 2, verifier="?")).encode()]  # original bytes kept


def test_subprocess_exit_code_and_message(tmp_path) -> None:
    path = jsonl(tmp_path / "bad.jsonl", [row(MATH, 0), row(MATH, 1, difficulty="hard")])
    proc = subprocess.run(
        [sys.executable, "-m", "training.cli", "taskset", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout.strip() == f"{path}:2: field 'difficulty': expected an integer 1..5, got str 'hard'"
    assert "2 row(s), 1 valid, 1 invalid, 1 error(s)" in proc.stderr


def test_taskset_usage_errors(capsys) -> None:
    assert cli.main(["taskset"]) == 2
    assert cli.main(["taskset", "frob"]) == 2
    assert "unknown tool 'frob'" in capsys.readouterr().err


def test_json_array_file_rows_are_positions(tmp_path) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([row(MATH, 0), row(MATH, 1, prompt=""), 5]))
    assert [(e.row, e.field) for e in check_file(path).errors] == [(2, "prompt"), (3, None)]
