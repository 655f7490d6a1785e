"""The pool end to end: verdicts for correct and wrong programs, batches, limits, the worker's life cycle,
the unisolated fallback and its refusal, and the module-level run/run_batch."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from sandbox_helpers import descendants, worker_pid

import sandbox
from sandbox import IsolationLevel, Job, Limits, Pool, SandboxUnavailable, Status, TestCase

ADD = "def add(a, b):\n    return a + b\n"
ADD_TESTS = [TestCase("add(2, 3)", 5), TestCase("add(-1, 1)", 0), TestCase("add('a', 'b')", "ab")]


def test_correct_program_passes(pool: Pool):
    v = pool.run(Job(ADD, ADD_TESTS, id="add"))
    assert (v.status, v.passed, v.total, v.id) == (Status.PASSED, 3, 3, "add")
    assert v.ok and v.fraction == 1.0
    assert v.exit_code == 0 and v.signal is None
    assert v.isolation is pool.isolation
    assert 0 < v.duration_s < 5
    assert all(c.passed for c in v.cases)


def test_wrong_program_reports_passed_over_total(pool: Pool):
    v = pool.run(Job("def add(a, b):\n    return a + b if a > 0 else 99\n", ADD_TESTS))
    assert (v.status, v.passed, v.total) == (Status.FAILED, 1, 3)
    assert [c.passed for c in v.cases] == [True, False, False]
    assert "add(-1, 1): expected 0, got 99" in v.cases[1].detail


def test_exceptions_are_per_test(pool: Pool):
    program = "def add(a, b):\n    if a == -1:\n        raise ValueError('nope')\n    return a + b\n"
    v = pool.run(Job(program, ADD_TESTS))
    assert (v.status, v.passed) == (Status.FAILED, 2)
    assert v.cases[1].detail == "ValueError: nope"


def test_rich_values_and_tolerances(pool: Pool):
    program = (
        "import math\ndef f():\n    return (1, [2.0, {'k': {3, 4}}], None, b'x')\n"
        "def g():\n    return 0.1 + 0.2\ndef h():\n    return {(1, 2): 'pair'}\n"
    )
    tests = [
        TestCase("f()", (1, [2, {"k": {3, 4}}], None, b"x")),
        TestCase("g()", 0.3, rel_tol=1e-9),
        TestCase("h()", {(1, 2): "pair"}),
        TestCase("g()", 0.3),
    ]
    v = pool.run(Job(program, tests))
    assert [c.passed for c in v.cases] == [True, True, True, False]


def test_output_is_captured_capped_and_does_not_decide(pool: Pool):
    program = "import sys\nprint('x' * 200000)\nprint('to stderr', file=sys.stderr)\n" + ADD
    v = pool.run(Job(program, ADD_TESTS, Limits(max_output_bytes=1000)))
    assert v.status is Status.PASSED
    assert v.stdout == "x" * 1000 and v.stdout_truncated and v.truncated
    assert v.stderr == "to stderr\n" and not v.stderr_truncated


def test_each_job_is_a_fresh_process(pool: Pool):
    program = (
        "import random, os\nSTATE = []\ndef f():\n    STATE.append(1)\n"
        "    return (len(STATE), random.random(), os.getcwd())\n"
    )
    a, b = pool.run_batch([Job(program, [TestCase("f()", 0)]), Job(program, [TestCase("f()", 0)])])
    va, vb = (eval(x.cases[0].detail.split("got ", 1)[1]) for x in (a, b))
    assert va[0] == vb[0] == 1  # no state carried over from another job
    assert va[1] != vb[1]  # random reseeded per job
    assert va[2] != vb[2]  # private work dir per job


def test_job_sees_a_scrubbed_environment_and_private_dirs(pool: Pool):
    program = (
        "import os, tempfile\ndef env():\n    return sorted(os.environ)\n"
        "def home_is_cwd():\n    return os.environ['HOME'] == os.getcwd() == tempfile.gettempdir()\n"
        "def perms():\n    return oct(os.stat('.').st_mode & 0o777)\n"
        "def can_write_here():\n    open('f.txt', 'w').write('x')\n    return open('f.txt').read()\n"
    )
    v = pool.run(
        Job(
            program,
            [
                TestCase("home_is_cwd()", True),
                TestCase("perms()", "0o700"),
                TestCase("can_write_here()", "x"),
                TestCase("[k for k in env() if 'SECRET' in k or 'AWS' in k or 'MLFLOW' in k]", []),
            ],
        )
    )
    assert v.status is Status.PASSED, v


def test_lazy_imports_work_inside_jobs(pool: Pool):
    program = "import sqlite3, zlib, fractions, decimal, json\ndef f():\n    return str(fractions.Fraction(1, 3))\n"
    v = pool.run(Job(program, [TestCase("f()", "1/3")]))
    assert v.status is Status.PASSED, v


def test_typing_prompt_header_works(pool: Pool):
    program = "from typing import List\n\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n"
    assert pool.run(Job(program, [TestCase("total([1, 2, 3])", 6)])).ok


def test_run_batch_preserves_order_with_mixed_outcomes(pool: Pool):
    jobs = []
    for i in range(24):
        kind = i % 4
        program = [ADD, "def add(a, b):\n    return 0\n", "while True:\n    pass\n", "raise SystemExit(1)\n"][kind]
        jobs.append(Job(program, ADD_TESTS, Limits(wall_s=3, cpu_s=0.5), id=f"j{i}"))
    verdicts = pool.run_batch(jobs, concurrency=3)
    assert [v.id for v in verdicts] == [j.id for j in jobs]
    expected = [Status.PASSED, Status.FAILED, Status.TIMEOUT, Status.FAILED]
    assert [v.status for v in verdicts] == [expected[i % 4] for i in range(24)]


def test_run_batch_edge_cases(pool: Pool):
    assert pool.run_batch([]) == []
    with pytest.raises(TypeError):
        pool.run_batch(["not a job"])  # type: ignore[list-item]
    v = pool.run_batch([Job(ADD, ADD_TESTS)], concurrency=1000)
    assert v[0].ok


def test_zero_tests_means_it_ran_cleanly(pool: Pool):
    assert pool.run(Job("x = 1\n", [])).status is Status.PASSED
    assert pool.run(Job("raise ValueError\n", [])).status is Status.FAILED


def test_threads_share_one_pool(pool: Pool):
    results: list[list[Status]] = []

    def work() -> None:
        results.append([v.status for v in pool.run_batch([Job(ADD, ADD_TESTS) for _ in range(10)], concurrency=2)])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 4
    assert all(s is Status.PASSED for r in results for s in r)


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=-1)
    with pytest.raises(ValueError, match="unknown Limits"):
        Limits.from_dict({"wall": 1})
    with pytest.raises(ValueError, match="tests\\[0\\]"):
        Job("x", ["nope"])  # type: ignore[list-item]


def test_memory_limit_is_enforced(pool: Pool):
    program = "def f(mb):\n    return len(bytearray(mb * 2 ** 20))\n"
    small = Limits(memory_mb=64)
    assert pool.run(Job(program, [TestCase("f(16)", 16 * 2**20)], small)).status is Status.PASSED
    assert pool.run(Job(program, [TestCase("f(200)", 200 * 2**20)], small)).status is Status.MEMORY


def test_worker_restarts_after_being_killed():
    with Pool(max_slots=2) as p:
        assert p.run(Job(ADD, ADD_TESTS)).ok
        old = worker_pid(p)
        os.kill(p.worker_pid, signal.SIGKILL)  # the shim; the worker follows (parent-death signal)
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{old}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not os.path.exists(f"/proc/{old}")
        assert p.run(Job(ADD, ADD_TESTS)).ok  # restarted transparently
        assert worker_pid(p) != old


def test_closing_the_pool_ends_every_process():
    p = Pool(max_slots=2)
    p.run_batch([Job("import time\ntime.sleep(30)\n", [], Limits(wall_s=0.5))])
    shim, worker = p.worker_pid, worker_pid(p)
    p.close()
    assert not os.path.exists(f"/proc/{shim}") and not os.path.exists(f"/proc/{worker}")
    with pytest.raises(SandboxUnavailable):
        p.run(Job(ADD, ADD_TESTS))


def test_close_during_a_running_job_kills_it():
    p = Pool(max_slots=2)
    p.start()
    worker = worker_pid(p)
    done = threading.Event()

    def long_job() -> None:
        p.run(Job("import time\ntime.sleep(30)\n", [], Limits(wall_s=30, cpu_s=30)))
        done.set()

    t = threading.Thread(target=long_job, daemon=True)
    t.start()
    resident = set(descendants(worker))  # the fork template
    deadline = time.monotonic() + 5
    while not set(descendants(worker)) - resident and time.monotonic() < deadline:
        time.sleep(0.02)
    jobs = sorted(set(descendants(worker)) - resident)
    assert jobs
    p._stop_worker()  # what close() does, without waiting for the caller's thread
    assert done.wait(10)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in jobs)


def test_unisolated_fallback_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv(sandbox.pool.ENV_ALLOW_UNISOLATED, raising=False)
    with pytest.raises(SandboxUnavailable, match="allow_unisolated"):
        Pool(no_namespaces=True).start()
    with Pool(no_namespaces=True, allow_unisolated=True, max_slots=2) as p:
        assert p.isolation is IsolationLevel.RLIMITS_ONLY
        v = p.run(Job(ADD, ADD_TESTS))
        assert v.ok and v.isolation is IsolationLevel.RLIMITS_ONLY
        t = p.run(Job("import time\ntime.sleep(30)\n", ADD_TESTS, Limits(wall_s=0.5)))
        assert t.status is Status.TIMEOUT
    monkeypatch.setenv(sandbox.pool.ENV_ALLOW_UNISOLATED, "1")
    with Pool(no_namespaces=True, max_slots=1) as p:
        assert p.run(Job(ADD, ADD_TESTS)).isolation is IsolationLevel.RLIMITS_ONLY


def test_module_level_run_and_run_batch():
    v = sandbox.run(Job(ADD, ADD_TESTS))
    assert v.ok and v.isolation.network_isolated
    vs = sandbox.run_batch([Job(ADD, ADD_TESTS), Job("def add(a, b):\n    return 1\n", ADD_TESTS)], concurrency=2)
    assert [x.status for x in vs] == [Status.PASSED, Status.FAILED]
    assert sandbox.default_pool() is sandbox.default_pool()


def test_pool_process_footprint_is_small(pool: Pool):
    """The worker must stay lean: every job is a fork of it."""
    rss_kb = int(open(f"/proc/{worker_pid(pool)}/status").read().split("VmRSS:")[1].split()[0])
    assert rss_kb < 40_000


def test_a_forked_host_process_gets_its_own_worker(pool: Pool):
    """multiprocessing/data loaders fork the trainer: the child must not share the parent's worker socket."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            v = pool.run(Job(ADD, ADD_TESTS))
            os.write(w, f"{v.status.value} {worker_pid(pool)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    status, child_worker = os.read(r, 100).decode().split()
    os.waitpid(pid, 0)
    assert status == "passed"
    assert int(child_worker) != worker_pid(pool)
    assert pool.run(Job(ADD, ADD_TESTS)).ok  # the parent's worker is undisturbed
