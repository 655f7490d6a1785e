"""`posttrain sandbox run|info` through sandbox.cli.main, plus one real `python -m sandbox` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.cli import main

PROGRAM = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def files(tmp_path: Path):
    prog = tmp_path / "solution.py"
    prog.write_text(PROGRAM)
    tests_json = tmp_path / "tests.json"
    tests_json.write_text(json.dumps([{"call": "add(1, 2)", "expected": 3}, {"call": "add(2, 2)", "expected": 4}]))
    tests_py = tmp_path / "tests.py"
    tests_py.write_text("assert add(1, 2) == 3\nassert add(0, 0) == 0\n")
    return tmp_path, prog, tests_json, tests_py


def test_run_json_tests_passes_exit_0(files, capsys):
    _, prog, tests_json, _ = files
    assert main(["run", "--program", str(prog), "--tests", str(tests_json), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "passed" and out["passed"] == out["total"] == 2
    assert out["isolation"] in ("namespaces+uid+rlimits", "userns+rlimits")


def test_run_assert_tests_human_output(files, capsys):
    _, prog, _, tests_py = files
    assert main(["run", "--program", str(prog), "--tests", str(tests_py)]) == 0
    assert capsys.readouterr().out.startswith("PASSED  2/2 tests")


def test_run_failing_program_exit_1(files, capsys):
    tmp, _, tests_json, _ = files
    wrong = tmp / "wrong.py"
    wrong.write_text("def add(a, b):\n    return a * b\n")
    assert main(["run", "--program", str(wrong), "--tests", str(tests_json)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAILED  1/2 tests") and "expected 3, got 2" in out


def test_run_timeout_option(files, capsys):
    tmp, _, tests_json, _ = files
    slow = tmp / "slow.py"
    slow.write_text("import time\ntime.sleep(10)\n" + PROGRAM)
    assert main(["run", "--program", str(slow), "--tests", str(tests_json), "--timeout", "0.5", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "timeout"


@pytest.mark.parametrize(
    "content, name, fragment",
    [
        ('[{"call": "add(1, 2)"}]', "t.json", "test #0: missing field 'expected'"),
        ("{not json", "t.json", "invalid JSON at line 1"),
        ("[]", "t.json", "non-empty JSON list"),
        ('[{"call": "add(1,", "expected": 3}]', "t.json", "not a Python expression"),
        ("assert add(1, 2) != 4\n", "t.py", "line 1"),
    ],
)
def test_bad_tests_file_exit_2_names_file_and_problem(files, capsys, content, name, fragment):
    tmp, prog, _, _ = files
    bad = tmp / name
    bad.write_text(content)
    assert main(["run", "--program", str(prog), "--tests", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and fragment in err


def test_missing_files_and_bad_options_exit_2(files, capsys):
    tmp, prog, tests_json, _ = files
    assert main(["run", "--program", str(tmp / "nope.py"), "--tests", str(tests_json)]) == 2
    assert "nope.py" in capsys.readouterr().err
    assert main(["run", "--program", str(prog), "--tests", str(tmp / "nope.json")]) == 2
    assert main(["run", "--program", str(prog), "--tests", str(tests_json), "--timeout", "-1"]) == 2
    assert main(["run", "--program", str(prog)]) == 2  # argparse: --tests is required
    assert main(["--help"]) == 0


def test_info(capsys):
    assert main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["features"]["namespaces"] is True


def test_python_dash_m_sandbox(files):
    _, prog, tests_json, _ = files
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox", "run", "--program", str(prog), "--tests", str(tests_json), "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "passed"
