"""`posttrain score`: completions from any model scored against a task file with the training verifiers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from training.score_cli import cli

ROOT = Path(__file__).resolve().parents[2]
TASKS = [
    {
        "id": "m1",
        "domain": "math",
        "prompt": "What is sin 60?",
        "verifier": "math",
        "answer": "\\frac{\\sqrt{3}}{2}",
        "reference": "so \\boxed{\\frac{\\sqrt{3}}{2}}",
        "metadata": {"reward_weights": {"math": 0.9, "format": 0.1}},
    },
    {"id": "m2", "domain": "math", "prompt": "2+2?", "verifier": "math", "answer": "4"},
    {"id": "e1", "domain": "extraction", "prompt": "Name: Bob", "verifier": "json_rules", "answer": '{"name": "Bob"}'},
]
COMPLETIONS = [
    {"id": "m1", "completion": "It is \\boxed{\\sqrt3/2}."},
    {"id": "m1", "completion": "The answer is $\\sqrt{3}/2$, not boxed."},
    {"id": "m2", "text": "4"},
    {"id": "e1", "completion": '{"name": "Alice"}'},
]


def _files(tmp_path: Path, completions: list) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    comps = tmp_path / "completions.jsonl"
    comps.write_text("".join(json.dumps(c) + "\n" for c in completions))
    return tasks, comps


def test_score_json_rows_and_domain_rates(tmp_path, capsys) -> None:
    tasks, comps = _files(tmp_path, COMPLETIONS)
    assert cli(["--tasks", str(tasks), "--completions", str(comps), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [(r["id"], r["passed"], r["strict"]) for r in rows] == [
        ("m1", True, True),
        ("m1", True, False),
        ("m2", True, True),
        ("e1", False, False),
    ]
    assert rows[0]["components"] == {"math": 1.0, "format": 1.0} and rows[0]["reward"] == 1.0
    assert rows[1]["components"] == {"math": 1.0, "format": 0.0} and abs(rows[1]["reward"] - 0.9) < 1e-9
    assert out["domains"]["math"] == {
        "rows": 3,
        "pass_rate": 1.0,
        "strict_pass_rate": 2 / 3,
        "mean_reward": (1.0 + 0.9 + 1.0) / 3,
    }
    assert out["domains"]["extraction"]["pass_rate"] == 0.0 and out["unscored_tasks"] == 0


def test_score_table_through_the_posttrain_command_and_bad_input(tmp_path) -> None:
    tasks, comps = _files(tmp_path, COMPLETIONS)
    run = subprocess.run(
        [sys.executable, "-m", "training.cli", "score", "--tasks", str(tasks), "--completions", str(comps)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "math" in run.stdout and "100.0%" in run.stdout and "66.7%" in run.stdout
    _, bad = _files(tmp_path, [{"id": "nope", "completion": "1"}])
    assert cli(["--tasks", str(tasks), "--completions", str(bad)]) == 2
    bad.write_text('{"id": "m1"}\n')
    assert cli(["--tasks", str(tasks), "--completions", str(bad)]) == 2
