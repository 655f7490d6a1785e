"""Does the tiny profile give every evaluation dimension room to move? Task set -> SFT -> 2 GRPO rounds ->
evaluate, for several seeds, printing per domain what the demo's report shows.

    python benchmarks/tiny_dimensions.py                    # seeds 0-2 with training/profiles.py TINY
    python benchmarks/tiny_dimensions.py --seeds 0 --set taskset.domain_difficulties='{"code": [2, 3]}'

Per seed and domain: greedy holdout pass@1 of the SFT checkpoint and after each round (the rounds' own check),
then from `evaluate` (the candidate, i.e. round 2): pass@1, format rate, long-context pass over the sweep and
self-repair (code). The bar the profile is tuned for: every SFT baseline within 20-80%, RL lifting at least
2 domains by at least 10 points with none dropping by more than 1, and no dimension at 0% or 100% in every
domain. Each seed runs in its own file:// run and SQLite MLflow store under a temporary folder. A quality
check, not a speed ratio: not part of `make bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.numerics import pin_cpu_numerics  # noqa: E402

pin_cpu_numerics()  # one float path on any AVX2 machine, as the test suite runs

from benchmarks.lift_seeds import parse_overrides  # noqa: E402

STAGES = ("taskset", "sft", "rl_round", "evaluate")


def run_seed(seed: int, overrides: dict[str, dict], root: Path) -> dict[str, Any]:
    from training import stage
    from training.config import from_dict
    from training.evaluation.config import EvalConfig
    from training.profiles import TINY
    from training.rl.config import GRPOConfig
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.evaluate import body as evaluate_body
    from training.stages.rl_round import run_round
    from training.stages.sft import SFTConfig, train
    from training.storage import join, read_json, require_manifest

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / f'mlflow-{seed}.db'}"
    run = f"file://{root / f'run-{seed}'}"
    cfg = {k: {"seed": seed, **TINY.get(k, {}), **overrides.get(k, {})} for k in STAGES}
    cfg["evaluate"]["compare_champion"] = False
    times = {}
    with contextlib.redirect_stdout(io.StringIO()):  # the stages' POSTTRAIN_RESULT lines
        t = time.perf_counter()
        stage.run_stage("taskset", from_dict(TasksetConfig, cfg["taskset"]), run, taskset_body)
        stage.run_stage("sft", from_dict(SFTConfig, cfg["sft"]), run, train)
        times["sft"] = time.perf_counter() - t
        t = time.perf_counter()
        r1 = stage.run_stage("rl_round_1", from_dict(GRPOConfig, cfg["rl_round"]), run, lambda c: run_round(c, 1))
        r2 = stage.run_stage("rl_round_2", from_dict(GRPOConfig, cfg["rl_round"]), run, lambda c: run_round(c, 2))
        times["rl"] = time.perf_counter() - t
        t = time.perf_counter()
        stage.run_stage("evaluate", from_dict(EvalConfig, cfg["evaluate"]), run, evaluate_body)
        times["evaluate"] = time.perf_counter() - t
    report = read_json(require_manifest(join(run, "evaluate")), "report.json")
    return {
        "sft": r1.summary["holdout_before"],
        "round1": r1.summary["holdout_after"],
        "round2": r2.summary["holdout_after"],
        "report": report,
        "times": times,
    }


def _rate(c: dict[str, int] | None) -> str:
    return f"{c['passed'] / c['total']:6.1%}" if c and c.get("total") else "   n/a"


def dimension_rows(report: dict[str, Any], model: str) -> dict[str, dict[str, str]]:
    """Per domain, the report's dimensions for `model` as printable rates."""
    out = {}
    for domain, d in report["models"][model]["domains"].items():
        repair = d.get("self_repair")
        out[domain] = {
            "pass1": _rate(d["pass1"]),
            "strict": _rate(d["pass1_strict"]),
            "format": _rate(d["format"]),
            "long_ctx": _rate(d["long_context"]),
            "repair": (f"{repair['repaired_within'].get('1', 0)}/{repair['failed_first']}" if repair else "-"),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.FIELD=VALUE",
        help="override a TINY preset field (taskset, sft, rl_round, evaluate), JSON values",
    )
    parser.add_argument("--keep", type=Path, help="keep the runs (file:// stages, MLflow SQLite) in this folder")
    args = parser.parse_args()
    overrides = parse_overrides(args.set, STAGES)

    import logging

    import mlflow  # noqa: F401 - configures its loggers on import; quieten them after
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("posttrain", "training", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    print(f"tiny profile, seeds {args.seeds}, overrides {overrides or 'none'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="posttrain-dims-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            res = run_seed(seed, overrides, root)
            sft_dims = dimension_rows(res["report"], "sft")
            dims = dimension_rows(res["report"], "candidate")
            times = ", ".join(f"{k} {v:.0f}s" for k, v in res["times"].items())
            print(f"\nseed {seed} ({times})")
            print(
                f"{'domain':11s} {'sft':>6s} {'r1':>6s} {'r2':>6s} {'lift':>6s} | evaluate sft -> candidate: "
                f"pass@1, strict, format, long-context, repaired/failed"
            )
            for domain in sorted(res["sft"]):
                if domain == "all":
                    continue
                s, r1, r2 = res["sft"][domain], res["round1"][domain], res["round2"][domain]
                a, b = sft_dims.get(domain, {}), dims.get(domain, {})
                print(
                    f"{domain:11s} {s:6.1%} {r1:6.1%} {r2:6.1%} {r2 - s:+6.1%} | "
                    + "  ".join(
                        f"{a.get(k, '-').strip()}->{b.get(k, '-').strip()}"
                        for k in ("pass1", "strict", "format", "long_ctx", "repair")
                    ),
                    flush=True,
                )
            # where a domain moves: code level 5's reading is a coin flip per task, so its first attempts sit at
            # chance whatever the model (training/tasksets/generators.py)
            print(
                "evaluate pass@1 by level, sft -> candidate: "
                + "; ".join(f"{domain} " + ", ".join(by_level(res["report"], domain)) for domain in sorted(dims)),
                flush=True,
            )
    return 0


def by_level(report: dict[str, Any], domain: str) -> list[str]:
    """Per difficulty of `domain`: "L<level> passed/total->passed/total", the SFT model's then the candidate's."""
    models = report["models"]
    levels = models["candidate"]["domains"][domain]["by_difficulty"]
    before = models["sft"]["domains"].get(domain, {}).get("by_difficulty", {})
    return [
        f"L{lv} {before.get(lv, {}).get('passed', '-')}/{c['total']}->{c['passed']}/{c['total']}"
        for lv, c in levels.items()
    ]


if __name__ == "__main__":
    sys.exit(main())
