"""The typed vocabulary of the sandbox: what a job is, what limits it runs under, and what comes back.

Status names follow the judge conventions (SandboxFusion / isolate): PASSED=OK, FAILED=wrong answer or
runtime error, TIMEOUT=TLE, MEMORY=MLE, OUTPUT_LIMIT=OLE, CRASHED=SG (killed by a signal), ERROR=XX (the
sandbox itself failed; the candidate is not to blame and a retry may succeed).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    OUTPUT_LIMIT = "output_limit"
    CRASHED = "crashed"
    ERROR = "error"


class IsolationLevel(str, enum.Enum):
    """What actually confines a job. Reported in every Verdict so a reward log says what it trusted."""

    # Network, pid, mount, ipc and uts namespaces; read-only root with private /tmp; one unprivileged uid
    # per concurrent job; rlimits. Needs root (or CAP_SYS_ADMIN).
    NAMESPACES_UID = "namespaces+uid+rlimits"
    # The same namespaces entered through an unprivileged user namespace: jobs share the caller's uid (with
    # every capability dropped), so a job could read files the caller can read outside the hidden paths.
    NAMESPACES = "userns+rlimits"
    # No namespaces at all: the job can reach the network. Refused unless explicitly allowed.
    RLIMITS_ONLY = "rlimits-only"
    # A container per job: --network none, read-only root, memory and pids limits.
    DOCKER = "docker"

    @property
    def network_isolated(self) -> bool:
        return self is not IsolationLevel.RLIMITS_ONLY


@dataclass(frozen=True)
class Limits:
    """Resource limits for one job.

    wall_s: wall-clock budget; the whole job (every process it started) is killed when it runs out.
    cpu_s: CPU seconds (RLIMIT_CPU); SIGXCPU at the limit, SIGKILL one second later.
    memory_mb: address space the program may add on top of the pre-started interpreter (RLIMIT_AS).
    max_procs: processes and threads of the job's uid (RLIMIT_NPROC).
    max_file_mb: largest file the job may write (RLIMIT_FSIZE).
    max_open_files: RLIMIT_NOFILE.
    max_output_bytes: stdout and stderr kept each; the rest is read and dropped (`*_truncated`).
    output_kill_bytes: total stdout+stderr after which the job is killed (OUTPUT_LIMIT): an output bomb
        should not cost the full wall budget.
    max_result_bytes: size of the result stream (encoded test values); a larger one is cut and fails.
    """

    wall_s: float = 5.0
    cpu_s: float = 4.0
    memory_mb: int = 256
    max_procs: int = 32
    max_file_mb: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    output_kill_bytes: int = 4 * 1024 * 1024
    max_result_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name, value in self.to_dict().items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        # Flat numbers only: `asdict`'s recursive deep copy cost more than the rest of a job's host-side work.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown Limits field(s) {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}")
        return cls(**data)


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class TestCase:
    """One check: `call` is a Python expression evaluated in the program's namespace after it ran; the value
    it produces must equal `expected` (compared on the host, see `sandbox.values.values_equal`). In JSON
    (to_dict/from_dict), values JSON cannot express are tagged: {"__tuple__": [1, 2]}, {"__set__": [...]}.

    rel_tol / abs_tol turn float comparisons into `math.isclose` (also inside lists, tuples and dicts).
    """

    __test__ = False  # not a pytest test class

    call: str
    expected: Any
    rel_tol: float | None = None
    abs_tol: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.call, str) or not self.call.strip():
            raise ValueError(f"TestCase.call must be a non-empty expression string, got {self.call!r}")
        try:
            compile(self.call, "<call>", "eval")
        except SyntaxError as exc:
            raise ValueError(f"TestCase.call {self.call!r} is not a Python expression: {exc.msg}") from None
        from sandbox.values import to_json

        try:
            to_json(self.expected)  # only plain values: the host compares with ==, and must trust it
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"TestCase.expected for {self.call!r}: {exc}") from None
        for name in ("rel_tol", "abs_tol"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"TestCase.{name} must be a non-negative number or None, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON; tuples, sets, bytes etc. in `expected` as {"__tuple__": [...]}-style objects."""
        from sandbox.values import to_json

        out: dict[str, Any] = {"call": self.call, "expected": to_json(self.expected)}
        if self.rel_tol is not None:
            out["rel_tol"] = self.rel_tol
        if self.abs_tol is not None:
            out["abs_tol"] = self.abs_tol
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "test") -> TestCase:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object with 'call' and 'expected', got {type(data).__name__}")
        unknown = set(data) - {"call", "expected", "rel_tol", "abs_tol"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: call, expected, rel_tol, abs_tol")
        for key in ("call", "expected"):
            if key not in data:
                raise ValueError(f"{where}: missing field '{key}'")
        from sandbox.values import from_json

        try:
            return cls(data["call"], from_json(data["expected"]), data.get("rel_tol"), data.get("abs_tol"))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class TestProgram:
    """Tests written as a whole program (HumanEval's `def check(candidate)`, MBPP's assert lines with
    `test_setup_code`, loops, helpers, tolerances, expected exceptions).

    source:      the test program. Assertions, loops and helper functions all run as written.
    entry_point: when set, `check(<entry_point>)` is called after `source` ran (HumanEval); else running
                 `source` is the test (MBPP).
    setup:       trusted code run before `source` in the test process (HumanEval's prompt, whose helpers a
                 check may call; MBPP's test_setup_code).

    The test program runs in its own process inside the job and never runs candidate code: every name it
    uses that neither it nor `setup` defines (and that is not a builtin), and the entry point, is a stub that
    calls the candidate's function in a second process over a pipe carrying only plain encoded values.
    Arguments are copies: a candidate that mutates an argument in place is not seen by the test.
    """

    __test__ = False  # not a pytest test class

    source: str
    entry_point: str | None = None
    setup: str = ""

    def __post_init__(self) -> None:
        for name in ("source", "setup"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"TestProgram.{name} must be a string")
        if not self.source.strip():
            raise ValueError("TestProgram.source is empty")
        if self.entry_point is not None and not (isinstance(self.entry_point, str) and self.entry_point.isidentifier()):
            raise ValueError(f"TestProgram.entry_point must be an identifier, got {self.entry_point!r}")
        for name in ("setup", "source"):
            try:
                compile(getattr(self, name), f"<test {name}>", "exec")
            except (SyntaxError, ValueError) as exc:
                raise ValueError(f"TestProgram.{name} is not valid Python: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source}
        if self.entry_point is not None:
            out["entry_point"] = self.entry_point
        if self.setup:
            out["setup"] = self.setup
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "test_program") -> TestProgram:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object with 'source', got {type(data).__name__}")
        unknown = set(data) - {"source", "entry_point", "setup"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: source, entry_point, setup")
        if "source" not in data:
            raise ValueError(f"{where}: missing field 'source'")
        try:
            return cls(data["source"], data.get("entry_point"), data.get("setup") or "")
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


# What the host compares for a test-program job: the one value its test process reports, True when every
# assertion held. The call text only labels the case.
PROGRAM_CHECK = TestCase("test_program()", True)


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Job:
    """A program and the tests it must pass: `tests` (call/expected pairs compared on the host) or one
    `test_program` (then `tests` is empty). `tests` is stored as a tuple (the job is immutable)."""

    program: str
    tests: Sequence[TestCase] = ()
    limits: Limits | None = None
    id: str = field(default_factory=_new_id)
    test_program: TestProgram | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.program, str):
            raise ValueError(f"Job.program must be a string, got {type(self.program).__name__}")
        tests = tuple(self.tests)
        for i, test in enumerate(tests):
            if not isinstance(test, TestCase):
                raise ValueError(f"Job.tests[{i}] must be a TestCase, got {type(test).__name__}")
        object.__setattr__(self, "tests", tests)
        if self.limits is not None and not isinstance(self.limits, Limits):
            raise ValueError(f"Job.limits must be a Limits or None, got {type(self.limits).__name__}")
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("Job.id must be a non-empty string")
        if self.test_program is not None:
            if not isinstance(self.test_program, TestProgram):
                raise ValueError(f"Job.test_program must be a TestProgram, got {type(self.test_program).__name__}")
            if tests:
                raise ValueError("a Job has either tests or a test_program, not both")

    @property
    def checks(self) -> tuple[TestCase, ...]:
        """What the host compares reported values against (for a test program: one True)."""
        return (PROGRAM_CHECK,) if self.test_program is not None else tuple(self.tests)

    def request(self) -> dict[str, Any]:
        """What the job process receives: the program, the calls, the test program; never expected values."""
        return {
            "program": self.program,
            "calls": [t.call for t in self.tests],
            "test_program": self.test_program.to_dict() if self.test_program is not None else None,
            "limits": self.effective_limits.to_dict(),
        }

    @property
    def effective_limits(self) -> Limits:
        return self.limits or DEFAULT_LIMITS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "program": self.program, "tests": [t.to_dict() for t in self.tests]}
        if self.test_program is not None:
            out["test_program"] = self.test_program.to_dict()
        if self.limits is not None:
            out["limits"] = self.limits.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "job") -> Job:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
        unknown = set(data) - {"id", "program", "tests", "limits", "test_program"}
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {sorted(unknown)}; allowed: id, program, tests, limits, test_program"
            )
        if not isinstance(data.get("program"), str):
            raise ValueError(f"{where}: 'program' must be a string")
        program = None
        if data.get("test_program") is not None:
            program = TestProgram.from_dict(data["test_program"], f"{where}.test_program")
        tests = data.get("tests", [] if program is not None else None)
        if not isinstance(tests, list):
            raise ValueError(f"{where}: 'tests' must be a list of {{call, expected}} objects")
        cases = [TestCase.from_dict(t, f"{where}.tests[{i}]") for i, t in enumerate(tests)]
        limits = None
        if data.get("limits") is not None:
            if not isinstance(data["limits"], dict):
                raise ValueError(f"{where}: 'limits' must be an object")
            try:
                limits = Limits.from_dict(data["limits"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}.limits: {exc}") from None
        kwargs: dict[str, Any] = {}
        if data.get("id") is not None:
            kwargs["id"] = str(data["id"])
        try:
            return cls(data["program"], cases, limits, test_program=program, **kwargs)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class CaseResult:
    """Outcome of one TestCase. `detail` is a short, capped description (error or mismatching value)."""

    index: int
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the host concluded about one job. Only `status`/`passed` were decided from the result channel
    and host-side comparison; stdout/stderr are informational and never affect them."""

    id: str
    status: Status
    passed: int
    total: int
    duration_s: float
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    isolation: IsolationLevel
    detail: str = ""
    exit_code: int | None = None
    signal: int | None = None
    cases: tuple[CaseResult, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is Status.PASSED

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["isolation"] = self.isolation.value
        out["cases"] = [asdict(c) for c in self.cases]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        """The inverse of `to_dict` (a verdict that came back from the HTTP service)."""
        return cls(
            id=str(data["id"]),
            status=Status(data["status"]),
            passed=int(data["passed"]),
            total=int(data["total"]),
            duration_s=float(data["duration_s"]),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            stdout_truncated=bool(data.get("stdout_truncated")),
            stderr_truncated=bool(data.get("stderr_truncated")),
            isolation=IsolationLevel(data["isolation"]),
            detail=str(data.get("detail", "")),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            cases=tuple(
                CaseResult(int(c["index"]), bool(c["passed"]), str(c.get("detail", ""))) for c in data.get("cases", ())
            ),
        )
