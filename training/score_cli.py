"""`posttrain score --tasks FILE --completions FILE [--json]`: score completions from any model (for example
sampled from a vLLM server) against a task set, with the same verifiers and reward weights as training.

    posttrain score --tasks holdout.parquet --completions outputs.jsonl           # a per-domain table
    posttrain score --tasks holdout.parquet --completions outputs.jsonl --json    # every row, as JSON

The completions file is JSONL, one object per completion: {"id": <task id>, "completion": "<text>"} ("text",
"output" and "response" are read too). A task may have several completions (samples) or none. Each row gets its
reward (weighted, as RL sees it), its components, and whether it passed its task's verifier leniently and
strictly (in the required format); each domain gets its pass rates and mean reward. Exit 0 after scoring, 2 for
bad input (an invalid task file, an unknown task id, a malformed line), naming the file and line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from training.rewards import score_tasks, verify_tasks
from training.tasksets.validate import check_file

TEXT_KEYS = ("completion", "text", "output", "response")


class BadInput(ValueError):
    pass


def read_completions(path: Path) -> list[tuple[str, str]]:
    """(task id, completion) per line of a JSONL file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInput(f"{path}: cannot read ({err})") from None
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as err:
            raise BadInput(f"{path}:{n}: invalid JSON ({err})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("id"), (str, int)):
            raise BadInput(f"{path}:{n}: expected an object with an 'id' and a 'completion'")
        text = next((obj[k] for k in TEXT_KEYS if k in obj), None)
        if not isinstance(text, str):
            raise BadInput(f"{path}:{n}: field 'completion': expected a string")
        out.append((str(obj["id"]), text))
    return out


def score_file(tasks_path: Path, completions_path: Path, **options: Any) -> dict[str, Any]:

    checked = check_file(tasks_path)
    if checked.errors:
        raise BadInput("\n".join(str(e) for e in checked.errors[:20]))
    by_id = {t.id: t for t in checked.tasks}
    pairs = read_completions(completions_path)
    unknown = sorted({i for i, _ in pairs if i not in by_id})
    if unknown:
        raise BadInput(
            f"{completions_path}: {len(unknown)} completion(s) name tasks not in {tasks_path}: {', '.join(unknown[:5])}"
        )
    tasks = [by_id[i] for i, _ in pairs]
    texts = [c for _, c in pairs]
    scores = score_tasks(tasks, texts, **options)
    strict = verify_tasks(tasks, texts, strict=True, **options)
    rows = [
        {
            "id": t.id,
            "domain": t.domain,
            "verifier": t.verifier,
            "reward": r,
            "passed": p,
            "strict": s,
            "components": {name: values[i] for name, values in scores.components.items() if values[i] is not None},
        }
        for i, (t, r, p, s) in enumerate(zip(tasks, scores, scores.passed, strict))
    ]
    domains: dict[str, dict[str, Any]] = defaultdict(lambda: {"rows": 0, "passed": 0, "strict": 0, "reward": 0.0})
    for row in rows:
        d = domains[row["domain"]]
        d["rows"] += 1
        d["passed"] += int(row["passed"])
        d["strict"] += int(row["strict"])
        d["reward"] += row["reward"]
    summary = {
        name: {
            "rows": d["rows"],
            "pass_rate": d["passed"] / d["rows"],
            "strict_pass_rate": d["strict"] / d["rows"],
            "mean_reward": d["reward"] / d["rows"],
        }
        for name, d in sorted(domains.items())
    }
    return {
        "tasks": str(tasks_path),
        "completions": str(completions_path),
        "rows": rows,
        "domains": summary,
        "unscored_tasks": len(by_id) - len({i for i, _ in pairs}),
    }


def cli(argv: list[str], prog: str = "posttrain score") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        required=True,
        type=Path,
        help="task file (.jsonl/.parquet, as build-taskset writes or `taskset check` accepts)",
    )
    parser.add_argument("--completions", required=True, type=Path, help='JSONL: {"id", "completion"} per line')
    parser.add_argument("--json", action="store_true", help="print every row and the per-domain summary as JSON")
    args = parser.parse_args(argv)
    try:
        result = score_file(args.tasks, args.completions)
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'domain':12s} {'rows':>6s} {'pass':>7s} {'strict':>7s} {'reward':>7s}")
    for name, d in result["domains"].items():
        print(f"{name:12s} {d['rows']:6d} {d['pass_rate']:7.1%} {d['strict_pass_rate']:7.1%} {d['mean_reward']:7.3f}")
    if result["unscored_tasks"]:
        print(f"({result['unscored_tasks']} task(s) without a completion)")
    return 0
