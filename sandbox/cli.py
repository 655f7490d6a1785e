"""`posttrain sandbox run|serve|info` (also `python -m sandbox ...`).

Exit codes of `run`: 0 passed, 1 not passed, 2 bad input (the message names the file and the problem),
3 the sandbox cannot run here (e.g. no network isolation and --allow-unisolated not given).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from sandbox.asserts import parse_assert_tests
from sandbox.pool import Pool, SandboxUnavailable
from sandbox.spec import Job, Limits, TestCase, TestProgram, Verdict

EXIT_PASSED, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3


class BadInput(Exception):
    pass


def load_tests(path: Path, entry_point: str | None = None) -> list[TestCase]:
    """A JSON list of {call, expected[, rel_tol, abs_tol]} (a .json file), or Python assert lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read tests: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        if isinstance(data, dict) and "tests" in data:
            data = data["tests"]
        if not isinstance(data, list) or not data:
            raise BadInput(f'{path}: expected a non-empty JSON list of {{"call": ..., "expected": ...}} objects')
        try:
            return [TestCase.from_dict(item, f"test #{i}") for i, item in enumerate(data)]
        except ValueError as exc:
            raise BadInput(f"{path}: {exc}") from None
    try:
        return parse_assert_tests(text, entry_point=entry_point)
    except ValueError as exc:
        raise BadInput(f"{path}: {exc}") from None


def _read_program(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read program: {exc}") from None


def _print_human(verdict: Verdict) -> None:
    print(
        f"{verdict.status.value.upper()}  {verdict.passed}/{verdict.total} tests  {verdict.duration_s:.3f}s  "
        f"isolation: {verdict.isolation.value}"
    )
    if verdict.detail:
        print(f"  {verdict.detail}")
    for case in verdict.cases:
        if not case.passed:
            print(f"  test {case.index}: {case.detail}")
    for name in ("stdout", "stderr"):
        text = getattr(verdict, name)
        if text:
            more = " (truncated)" if getattr(verdict, f"{name}_truncated") else ""
            print(f"--- {name}{more}\n{text.rstrip()}")


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        program = _read_program(Path(args.program))
        tests: list[TestCase] = []
        test_program = None
        if args.test_program:
            try:
                test_program = TestProgram(_read_program(Path(args.tests)), args.entry_point)
            except ValueError as exc:
                raise BadInput(f"{args.tests}: {exc}") from None
        else:
            tests = load_tests(Path(args.tests), args.entry_point)
        overrides: dict[str, Any] = {}
        if args.timeout is not None:
            overrides["wall_s"] = overrides["cpu_s"] = args.timeout
        if args.memory_mb is not None:
            overrides["memory_mb"] = args.memory_mb
        try:
            limits = Limits(**overrides)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job = Job(program, tests, limits, id=Path(args.program).stem, test_program=test_program)
    try:
        with Pool(max_slots=1, allow_unisolated=args.allow_unisolated or None) as pool:
            verdict = pool.run(job)
    except SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2))
    else:
        _print_human(verdict)
    return EXIT_PASSED if verdict.ok else EXIT_FAILED


def _cmd_serve(args: argparse.Namespace) -> int:
    from sandbox.server import serve

    try:
        return serve(
            args.host,
            args.port,
            args.concurrency,
            allow_unisolated=args.allow_unisolated or None,
            insecure_loopback=args.insecure_loopback,
        )
    except SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


def _cmd_info(args: argparse.Namespace) -> int:
    try:
        with Pool(max_slots=1, allow_unisolated=args.allow_unisolated or None) as pool:
            print(
                json.dumps(
                    {"isolation": pool.isolation.value if pool.isolation else None, "features": pool.features}, indent=2
                )
            )
    except SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def build_parser(prog: str = "posttrain sandbox") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run untrusted programs against tests, isolated.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run one program against its tests and print the verdict",
        description="Exit 0 passed, 1 not passed, 2 bad input, 3 sandbox unavailable.",
    )
    run.add_argument("--program", required=True, help="Python source file of the candidate program")
    run.add_argument(
        "--tests",
        required=True,
        help="tests: a .json list of {call, expected} objects, or a Python file of assert lines",
    )
    run.add_argument("--entry-point", help="with a HumanEval `def check(candidate)` tests file: the function name")
    run.add_argument(
        "--test-program",
        action="store_true",
        help="run the Python tests file as a whole program (loops, helpers, check(candidate) called "
        "with --entry-point) in its own process, calling the program's functions in another",
    )
    run.add_argument("--json", action="store_true", help="print the verdict as JSON")
    run.add_argument("--timeout", type=float, help=f"wall and CPU seconds (default: {Limits().wall_s:g})")
    run.add_argument(
        "--memory-mb", type=int, help=f"address space MB on top of the interpreter (default: {Limits().memory_mb:d})"
    )
    run.add_argument(
        "--allow-unisolated", action="store_true", help="run even without network isolation (rlimits only)"
    )
    run.set_defaults(func=_cmd_run)

    serve = sub.add_parser(
        "serve",
        help="serve POST /run and GET /health over HTTP (JSON)",
        description="Callers of POST /run present 'Authorization: Bearer $POSTTRAIN_SANDBOX_TOKEN'; "
        "the server refuses to start without that variable.",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8090)
    serve.add_argument("--concurrency", type=int, default=None, help="jobs in flight (default: CPU count)")
    serve.add_argument("--allow-unisolated", action="store_true")
    serve.add_argument(
        "--insecure-loopback",
        action="store_true",
        help="start without POSTTRAIN_SANDBOX_TOKEN (accepts any caller); only on a loopback host",
    )
    serve.set_defaults(func=_cmd_serve)

    info = sub.add_parser("info", help="print the isolation level this machine gives")
    info.add_argument("--allow-unisolated", action="store_true")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: list[str] | None = None, prog: str = "posttrain sandbox") -> int:
    try:
        args = build_parser(prog).parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2); return it, do not exit the caller
        return int(exc.code or 0)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
