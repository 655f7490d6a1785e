"""`posttrain feedback import PATH... --to ROOT`: production feedback files into stored, manifested batches.

    posttrain feedback import /data/feedback/2026-12-05.jsonl --to s3://posttrain/feedback/support-bot
    posttrain feedback import /data/feedback/inbox --to s3://posttrain/feedback/support-bot --domain support

Each file becomes one batch, `<ROOT>/batch-<sha256 of the file, 16 hex>/`, committed manifest last:

    raw/<file name>     the file exactly as it arrived (nothing a user sends is lost)
    records.jsonl       the accepted records, normalised (training/tasksets/feedback.py)
    quarantine.jsonl    the refused rows: row, every error (field and message) and the original line
    report.json         counts by kind, domain and model version, the time span, the first errors

A batch is named by its content, so importing the same file again (a retried task, a file left in the inbox)
finds the batch complete and writes nothing; a changed file is a new batch. The task set reads every complete
batch under ROOT (TasksetConfig.feedback). Refused rows never stop an import (production logs are messy and the
good rows are worth having); a file with no usable record at all does, with exit code 2, after its batch is
stored with the quarantine.
"""

from __future__ import annotations

import argparse

from training.cli import run_cli
from training.stage import StageResult, emit
from training.tasksets.feedback_store import import_file, input_files


class NoUsableFeedback(ValueError):
    """A feedback file in which no row could be accepted."""


def import_cli(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Import production feedback files (JSONL: prompt, response, rating or thumbs, timestamp, "
        "model_version, and optionally domain, answer, tests, reference, verifier) as batches under --to. "
        "Every row is validated; refused rows are kept in the batch's quarantine.jsonl with the reason.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="a feedback file, or a folder of *.jsonl files")
    parser.add_argument("--to", required=True, metavar="ROOT", help="where batches go, e.g. s3://posttrain/feedback/m")
    parser.add_argument("--domain", default="", help="the domain of rows that name none")
    parser.add_argument("--verifier", default="", help="the verifier of rows that name none")
    args = parser.parse_args(argv)

    def go() -> int:
        files = input_files(args.paths)
        if not files:  # an inbox with nothing in it yet: a quiet night, not an error
            print(f"no feedback files in {', '.join(args.paths)}")
        reports = []
        for label, data in files:
            report = import_file(label, data, args.to, args.domain, args.verifier)
            reports.append(report)
            state = "already imported as" if report["already_imported"] else "imported as"
            print(
                f"{label}: {state} {report['batch']}: {report['accepted']} of {report['rows']} rows accepted "
                f"({report.get('by_kind', {})}), {report['quarantined']} quarantined"
            )
            for line in report["examples"][:10]:
                print(f"  {line}")
        empty = [r["file"] for r in reports if r["accepted"] == 0]
        emit(
            StageResult(
                "feedback",
                args.to,
                None,
                {
                    "batches": [r["batch"] for r in reports],
                    "accepted": sum(r["accepted"] for r in reports),
                    "quarantined": sum(r["quarantined"] for r in reports),
                },
            )
        )
        if empty:
            raise NoUsableFeedback(
                f"no usable feedback record in {', '.join(empty)} (every row refused; see quarantine.jsonl of "
                "its batch under " + args.to + ")"
            )
        return 0

    return run_cli(go, (NoUsableFeedback, ValueError))


def cli(argv: list[str], prog: str = "posttrain feedback") -> int:
    """`posttrain feedback import ...` (the one subcommand so far)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {prog} import PATH... --to ROOT [--domain D] [--verifier V]\n\n{__doc__}")
        return 0 if argv else 2
    if argv[0] != "import":
        print(f"{prog}: unknown subcommand {argv[0]!r}; try `{prog} import --help`")
        return 2
    return import_cli(argv[1:], f"{prog} import")
