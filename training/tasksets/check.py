"""`posttrain taskset check FILE... [--quarantine OUT]`: validate task files from a shell or CI.

Exit 0 when every row is valid; 2 with one line per problem (`FILE:ROW: field 'X': problem`) otherwise.
With `--quarantine OUT` the bad rows (the original lines of a JSONL file) are written to OUT, their count is
reported, and the exit code is 0 unless the file itself could not be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training.tasksets.validate import Validator, check_file, write_quarantine


def check_cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Validate task files (JSONL/parquet): one `FILE:ROW: field 'X': problem` line per "
        "error, exit 2 if any (0 with --quarantine, the bad rows written aside).",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="task file(s): .jsonl or .parquet")
    parser.add_argument(
        "--quarantine", metavar="OUT", default=None, help="write bad rows to OUT (JSONL) instead of failing"
    )
    parser.add_argument("--max-errors", type=int, default=50, help="errors printed per file (default 50)")
    args = parser.parse_args(argv)
    bad_rows = []
    rc = 0
    validator = Validator()
    for name in args.files:
        result = check_file(Path(name), validator)
        for err in result.errors[: args.max_errors]:
            print(err)
        if len(result.errors) > args.max_errors:
            print(f"{name}: ... and {len(result.errors) - args.max_errors} more error(s)")
        file_level = any(e.row is None for e in result.errors)
        print(
            f"{name}: {result.rows} row(s), {len(result.tasks)} valid, {len(result.bad)} invalid, "
            f"{len(result.errors)} error(s)",
            file=sys.stderr,
        )
        bad_rows += result.bad
        if file_level or (result.errors and not args.quarantine):
            rc = 2
    if args.quarantine:
        n = write_quarantine(bad_rows, Path(args.quarantine))
        print(f"quarantined {n} row(s) to {args.quarantine}", file=sys.stderr)
    return rc


def cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Task-set tools.")
    sub = parser.add_subparsers(dest="tool", metavar="TOOL")
    sub.add_parser(
        "check", help="validate task files (JSONL/parquet): FILE:ROW: field errors, exit 2 if any", add_help=False
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] != "check":
        parser.print_usage(sys.stderr)
        print(f"{prog}: error: unknown tool {argv[0]!r} (choose from: check)", file=sys.stderr)
        return 2
    return check_cli(argv[1:], f"{prog} check")
