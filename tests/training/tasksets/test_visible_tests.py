"""Visible and hidden tests: what a repair episode may run and show (metadata.visible_tests) vs what judges the
final program (tests). Generators and the HumanEval/MBPP loaders produce both; older task files still load."""

from __future__ import annotations

import json
from pathlib import Path

from training.tasksets.generators import VISIBLE_CODE_TESTS, generate
from training.tasksets.loaders import docstring_examples, load_source
from training.tasksets.schema import Task, visible_tests
from training.tasksets.sources import SourceSpec
from training.tasksets.validate import validate_rows

HUMANEVAL_PROMPT = (
    'def add(x: int, y: int) -> int:\n    """Add two numbers.\n    >>> add(2, 3)\n    5\n'
    "    >>> add(-1, 1)\n    0\n    >>> print(add(1, 1))\n    2\n    >>> add(0, 0) is None\n    False\n"
    '    >>> add(1, 2) # doctest: +SKIP\n    <int>\n    """\n'
)


def test_generated_code_tasks_show_a_subset_of_their_hidden_tests() -> None:
    for task in generate("code", 30, seed=3, difficulties=(3, 4, 5)):
        shown = visible_tests(task)
        assert shown == task.tests[:VISIBLE_CODE_TESTS] and len(task.tests) > len(shown) > 0


def test_a_two_reading_prompt_s_first_visible_test_tells_the_readings_apart() -> None:
    import random

    from training.environments.code_repair import near_miss

    tasks = generate("code", 300, seed=1, difficulties=(5,))
    for task in tasks:
        other = near_miss(task.reference, random.Random(0), other_reading=True)  # the prompt read the other way
        assert other != task.reference, task.reference
        namespace: dict = {}
        exec(other, namespace)  # our own generated one-liners, not model output
        first = visible_tests(task)[0]
        assert eval(first["call"], namespace) != first["expected"], (task.prompt, other, first)
    # "s cut by 8" has no 6-letter test that tells s[8:] from s[:-8]: those draw longer strings
    cut_long = [t for t in tasks if "cut by" in t.prompt or "trimmed by" in t.prompt if int(t.prompt[-2]) >= 6]
    assert cut_long and all(len(eval(visible_tests(t)[0]["call"][2:-1])) > int(t.prompt[-2]) for t in cut_long)


def test_humaneval_docstring_examples_become_visible_tests(tmp_path: Path) -> None:
    # a literal result after a single call of the entry point; print(...), non-literals are left out
    assert docstring_examples(HUMANEVAL_PROMPT, "add") == [
        {"call": "add(2, 3)", "expected": 5},
        {"call": "add(-1, 1)", "expected": 0},
        {"call": "add(0, 0) is None", "expected": False},
    ]
    row = {
        "task_id": "HumanEval/0",
        "entry_point": "add",
        "prompt": HUMANEVAL_PROMPT,
        "canonical_solution": "    return x + y\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    }
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (task,) = validate_rows(load_source(SourceSpec(str(path), adapter="humaneval")), str(path)).tasks
    assert visible_tests(task)[:2] == [{"call": "add(2, 3)", "expected": 5}, {"call": "add(-1, 1)", "expected": 0}]
    assert isinstance(task.tests, dict)  # check(candidate) stays the hidden test program


def test_task_files_without_visible_tests_still_load_and_show_their_first_test() -> None:
    old = Task.from_row(
        {
            "id": "a",
            "domain": "code",
            "prompt": "p",
            "verifier": "code",
            "tests": json.dumps([{"call": "f(1)", "expected": 2}, {"call": "f(2)", "expected": 3}]),
            "metadata": "{}",
        }
    )
    assert visible_tests(old) == [{"call": "f(1)", "expected": 2}]
    program = Task("b", "code", "p", "code", tests={"program": "assert f(1) == 2"})
    assert visible_tests(program) == []  # running the whole hidden program would show hidden failures


def test_malformed_visible_tests_are_named_by_row_and_field(tmp_path: Path) -> None:
    rows = [
        {
            "id": "a",
            "domain": "code",
            "prompt": "Write f.",
            "verifier": "code",
            "tests": [{"call": "f(1)", "expected": 2}],
            "metadata": {"visible_tests": [{"call": "f(("}]},
        }
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = validate_rows(load_source(SourceSpec(str(path))), str(path))
    assert result.tasks == []
    (err,) = result.errors
    assert (err.row, err.field) == (1, "metadata") and "visible_tests: tests[0]: missing 'expected'" in err.message
