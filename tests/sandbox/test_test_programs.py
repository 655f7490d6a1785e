"""Whole test programs (HumanEval `check(candidate)`, MBPP asserts with setup): what they can express, and that
no candidate can forge their verdict.

The test program runs in its own process and reaches the candidate's functions (in a second process) only
through stubs carrying plain encoded values; the candidate process is forked before the test program is read,
so its memory never holds the tests. Each hostile candidate below pairs an attack with a wrong solution: a
pass could only come from the attack working.
"""

from __future__ import annotations

import pytest
from sandbox_helpers import HostGuard

from sandbox import Job, Limits, Pool, Status
from sandbox.harness import candidate_names
from sandbox.spec import TestProgram

LIMITS = Limits(wall_s=10.0, cpu_s=5.0)
SETUP = 'import math\n\ndef add(a, b):\n    """a + b; raises TypeError for None."""\n'
CHECK = """
METADATA = {"author": "test"}


def helper(xs):
    total = 0
    for x in xs:
        total = add(total, x)
    return total


def check(candidate):
    secret_pairs = [(17, 25, 42), (1000, -1, 999)]
    for a, b, want in secret_pairs:
        assert candidate(a, b) == want
    assert helper([1, 2, 3]) == 6
    assert math.isclose(candidate(0.1, 0.2), 0.3, rel_tol=1e-9)
    assert abs(candidate(1e-9, 0.0) - 1e-9) < 1e-12
    try:
        candidate(None, 1)
    except TypeError:
        pass
    else:
        raise AssertionError("expected a TypeError")
"""
RIGHT = "    return a + b\n"
WRONG = "    return a - b\n"


def _job(body: str, name: str, prefix: str = "") -> Job:
    return Job(prefix + SETUP + body, test_program=TestProgram(CHECK, "add", SETUP), limits=LIMITS, id=name)


def test_a_correct_candidate_passes_loops_helpers_tolerances_and_expected_exceptions(pool: Pool) -> None:
    verdict = pool.run(_job(RIGHT, "right"))
    assert verdict.status is Status.PASSED, verdict.detail
    assert (verdict.passed, verdict.total) == (1, 1)


@pytest.mark.parametrize(
    "body,detail",
    [
        (WRONG, "AssertionError at test line 15: assert candidate(a, b) == want"),
        ("    return None\n", "AssertionError at test line 15"),
        ("    pass\n", "AssertionError at test line 15"),
        ("    raise ValueError('nope')\n", "ValueError: (raised by the candidate's add) ValueError: nope"),
    ],
)
def test_a_wrong_candidate_fails_with_the_failing_line(pool: Pool, body: str, detail: str) -> None:
    verdict = pool.run(_job(body, "wrong"))
    assert verdict.status is Status.FAILED
    assert detail in verdict.detail


def test_mbpp_style_program_with_setup_code_and_free_function_names(pool: Pool) -> None:
    tests = TestProgram(
        "assert remove_occ('hello', 'l') == 'heo'\nassert count(remove_occ(DATA, 'a')) == 3\n"
        "for word in ['x', 'yy']:\n    assert remove_occ(word, 'y') == word.replace('y', '')\n",
        setup="DATA = 'banana'\n",
    )
    right = "def remove_occ(s, ch):\n    return s.replace(ch, '')\n\ndef count(s):\n    return len(s)\n"
    assert pool.run(Job("DATA = 'banana'\n" + right, test_program=tests, limits=LIMITS)).status is Status.PASSED
    half = "def remove_occ(s, ch):\n    return s.replace(ch, '', 1)\n\ndef count(s):\n    return len(s)\n"
    assert pool.run(Job(half, test_program=tests, limits=LIMITS)).status is Status.FAILED


def test_candidate_names_never_include_builtins_or_names_the_tests_bind() -> None:
    source = (
        "import math\nx = 3\ndef h(y):\n    return len(y)\nassert f(x) == h([1]) and math.pi\nfor i in g():\n    pass\n"
    )
    assert candidate_names(source, "def helper(): pass\n", "entry") == ["f", "g", "entry"]


HOSTILE = {
    # the candidate replaces `check` wherever it can reach: its own module, builtins, __main__
    "patches_check": (
        "import builtins, sys\n"
        "def check(candidate):\n    return None\n"
        "builtins.check = check\nsys.modules['__main__'].check = check\n",
        WRONG,
    ),
    # walks every frame above it and every object in its heap for the test program's text or values
    "inspects_caller_frame_and_heap": (
        "import gc, sys\n"
        "NEEDLE = 'secret_' + 'pairs'  # built at run time: the program's own text does not contain it\n"
        "def _has(v, depth=0):\n"
        "    if v is NEEDLE or depth > 4:\n"
        "        return False\n"
        "    if isinstance(v, bytes):\n"
        "        return NEEDLE.encode() in v\n"
        "    if isinstance(v, str):\n"
        "        return NEEDLE in v\n"
        "    if isinstance(v, dict):\n"
        "        v = list(v.values())\n"
        "    return isinstance(v, (list, tuple)) and any(_has(x, depth + 1) for x in v)\n"
        "def _find():\n"
        "    f = sys._getframe(0)\n"
        "    while f is not None:\n"
        "        if any(_has(v) for scope in (f.f_locals, f.f_globals) for v in list(scope.values())):\n"
        "            return True\n"
        "        f = f.f_back\n"
        "    for o in gc.get_objects():\n"
        "        values = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()\n"
        "        if any(_has(v) for v in list(values)):\n"
        "            return True\n"
        "    return False\n",
        "    print('found' if _find() else 'not found')\n    return a - b\n",
    ),
    # a monkeypatched isclose (and abs) in the candidate's process cannot reach the test's process
    "monkeypatches_math_isclose": (
        "import math, builtins\nmath.isclose = lambda *a, **k: True\nbuiltins.abs = lambda x: 0\n",
        "    return 0.0 if isinstance(a, float) else a + b\n",
    ),
    # values that claim to equal anything are not plain values: they never leave the candidate's process
    "returns_always_equal_objects": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "class Int(int):\n    def __eq__(self, other):\n        return True\n",
        "    return Yes() if a != 17 else Int(0)\n",
    ),
    # reaching into the test process: its memory, its result pipe, ptrace; all refused (it is not dumpable)
    "reaches_into_the_test_process": (
        "import os, ctypes\n"
        "def _attack():\n"
        "    out = []\n"
        "    parent = os.getppid()\n"
        "    for path, flags in ((f'/proc/{parent}/mem', os.O_RDONLY), (f'/proc/{parent}/fd/3', os.O_WRONLY)):\n"
        "        try:\n"
        "            fd = os.open(path, flags)\n"
        "            out.append('opened ' + path)\n"
        "            os.write(fd, b'forged\\n')\n"
        "        except OSError as exc:\n"
        "            out.append(f'{path}: {exc.errno}')\n"
        "    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    out.append(f'ptrace: {libc.ptrace(16, parent, 0, 0)}')\n"
        "    print(out)\n",
        "    _attack()\n    return a - b\n",
    ),
    # ends its own process, or the test's, mid-test
    "exits_during_the_call": ("import os\n", "    os._exit(0)\n"),
    "kills_the_test_process": ("import os, signal\n", "    os.kill(os.getppid(), signal.SIGKILL)\n    return a - b\n"),
    # answers more than it was asked, hoping a queued reply lines up with a later question
    "floods_the_reply_pipe": (
        "import os, json\n",
        "    for fd in range(3, 20):\n"
        "        try:\n"
        "            os.write(fd, b'{\"v\":42}\\n' * 100)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return a - b\n",
    ),
    "raises_system_exit": ("", "    raise SystemExit(0)\n"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_candidate_cannot_forge_a_test_program_verdict(name: str, pool: Pool, host_guard: HostGuard) -> None:
    prefix, body = HOSTILE[name]
    verdict = pool.run(_job(body, name, prefix))
    assert verdict.status in (Status.FAILED, Status.TIMEOUT), (name, verdict.status, verdict.detail)
    assert verdict.passed == 0
    if name == "inspects_caller_frame_and_heap":
        assert "not found" in verdict.stdout and "found\n" not in verdict.stdout.replace("not found", "")
    if name == "reaches_into_the_test_process":
        assert "opened" not in verdict.stdout, verdict.stdout
        assert "ptrace: -1" in verdict.stdout


def test_the_same_hostile_candidates_pass_when_they_also_compute_the_right_answer(pool: Pool) -> None:
    """Control: the attacks themselves do not break a correct candidate's verdict (no false failures)."""
    prefix, _ = HOSTILE["monkeypatches_math_isclose"]
    assert pool.run(_job(RIGHT, "right-with-patches", prefix)).status is Status.PASSED


def test_program_error_and_missing_function_fail(pool: Pool) -> None:
    assert (
        pool.run(Job("def add(a, b)\n", test_program=TestProgram(CHECK, "add", SETUP), limits=LIMITS)).status
        is Status.FAILED
    )
    verdict = pool.run(Job("x = 1\n", test_program=TestProgram("assert f(1) == 2\n"), limits=LIMITS))
    assert verdict.status is Status.FAILED and "name 'f' is not defined" in verdict.detail


def test_job_round_trips_through_json_with_a_test_program() -> None:
    job = Job("def f(): pass\n", test_program=TestProgram("assert f() is None\n", None, "X = 1\n"))
    again = Job.from_dict(job.to_dict())
    assert again.test_program == job.test_program and again.tests == ()
    with pytest.raises(ValueError, match="either tests or a test_program"):
        Job.from_dict({**job.to_dict(), "tests": [{"call": "f()", "expected": None}]})
    with pytest.raises(ValueError, match="not valid Python"):
        TestProgram("assert (")


def test_the_heap_search_finds_the_needle_when_it_is_there(pool: Pool) -> None:
    """Control for `inspects_caller_frame_and_heap`: the same search does find the text in its own process."""
    prefix, body = HOSTILE["inspects_caller_frame_and_heap"]
    verdict = pool.run(_job(body, "control", prefix + "PLANTED = {'k': 'has ' + NEEDLE + ' inside'}\n"))
    assert verdict.stdout == "found\n"
