"""Untrusted-code execution for rewards: run model-written programs against tests, isolated, and get a
typed Verdict whose pass cannot be forged from inside the job.

    from sandbox import Job, TestCase, run, run_batch, parse_assert_tests
    job = Job("def add(a, b):\\n    return a + b\\n", parse_assert_tests("assert add(2, 3) == 5"))
    verdict = run(job)            # Verdict(status=Status.PASSED, passed=1, total=1, isolation=...)

How: a pre-started worker (already in network/pid/mount namespaces) forks a supervisor per job, which forks
the confined job process (own pid namespace, own uid, rlimits, private dir). The job reports only the values
its test calls produce; expected values stay on the host, which decides the verdict. See
sandbox/README.md. Never imports torch.
"""

from sandbox.asserts import parse_assert_tests
from sandbox.pool import Pool, SandboxUnavailable, default_pool, run, run_batch, shutdown_default_pool
from sandbox.spec import CaseResult, IsolationLevel, Job, Limits, Status, TestCase, TestProgram, Verdict
from sandbox.values import values_equal

__all__ = [
    "CaseResult",
    "IsolationLevel",
    "Job",
    "Limits",
    "Pool",
    "SandboxUnavailable",
    "Status",
    "TestCase",
    "TestProgram",
    "Verdict",
    "default_pool",
    "parse_assert_tests",
    "run",
    "run_batch",
    "shutdown_default_pool",
    "values_equal",
]
