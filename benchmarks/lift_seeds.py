"""How robust is the tiny profile's RL lift? Task set -> SFT -> 2 GRPO rounds for several seeds.

    python benchmarks/lift_seeds.py                 # seeds 0-4, ~2.5 min each on 2 CPU cores
    python benchmarks/lift_seeds.py --seeds 0 1 --set rl_round.steps=150

Runs the stages exactly as `tests/training/test_tiny_pipeline.py` does (training/profiles.py TINY, every seed
in all three stages), each seed in its own file:// run and SQLite MLflow store under a temporary folder, and
prints greedy holdout pass@1 per domain for SFT and after round 2, the domains lifted by 10 points or more and
the worst change, and whether each seed meets the test's bar. Not part of `make bench` (it is a quality
check, not a speed ratio, and takes minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.numerics import pin_cpu_numerics  # noqa: E402

pin_cpu_numerics()  # one float path on any AVX2 machine, as the test suite runs


def run_seed(seed: int, overrides: dict[str, dict], root: Path) -> dict[str, dict[str, float]]:
    from training import stage
    from training.config import from_dict
    from training.profiles import TINY
    from training.rl.config import GRPOConfig
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.rl_round import run_round
    from training.stages.sft import SFTConfig, train

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / f'mlflow-{seed}.db'}"
    run = f"file://{root / f'run-{seed}'}"
    cfg = {k: {"seed": seed, **TINY[k], **overrides.get(k, {})} for k in ("taskset", "sft", "rl_round")}
    with contextlib.redirect_stdout(io.StringIO()):  # the stages' POSTTRAIN_RESULT lines
        stage.run_stage("taskset", from_dict(TasksetConfig, cfg["taskset"]), run, taskset_body)
        stage.run_stage("sft", from_dict(SFTConfig, cfg["sft"]), run, train)
        r1 = stage.run_stage("rl_round_1", from_dict(GRPOConfig, cfg["rl_round"]), run, lambda c: run_round(c, 1))
        r2 = stage.run_stage("rl_round_2", from_dict(GRPOConfig, cfg["rl_round"]), run, lambda c: run_round(c, 2))
    return {
        "sft": r1.summary["holdout_before"],
        "round1": r1.summary["holdout_after"],
        "round2": r2.summary["holdout_after"],
    }


def parse_overrides(pairs: list[str], stages: tuple[str, ...] = ("taskset", "sft", "rl_round")) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        stage_name, _, field_name = key.partition(".")
        if not field_name or stage_name not in stages:
            raise SystemExit(f"--set {pair!r}: use STAGE.FIELD=VALUE with STAGE one of {', '.join(stages)}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(stage_name, {})[field_name] = parsed
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.FIELD=VALUE",
        help="override a TINY preset field, e.g. rl_round.steps=150 (JSON values)",
    )
    parser.add_argument("--keep", type=Path, help="keep the runs (file:// stages, MLflow SQLite) in this folder")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)

    import logging

    import mlflow  # noqa: F401 - configures its loggers on import; quieten them after
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("posttrain").setLevel(logging.WARNING)
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("training").setLevel(logging.WARNING)
    print(f"tiny profile, seeds {args.seeds}, overrides {overrides or 'none'}")
    print(f"{'seed':>4}  SFT -> round 2 per domain (lift)  |  domains lifted >= 10 pts, worst change  time")
    passed = 0
    with tempfile.TemporaryDirectory(prefix="posttrain-lift-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            t0 = time.perf_counter()
            h = run_seed(seed, overrides, root)
            lifts = {d: h["round2"][d] - h["sft"][d] for d in sorted(h["sft"]) if d != "all"}
            lifted = [d for d, x in lifts.items() if x >= 0.10 - 1e-9]  # 4 of 40 tasks is 10 points
            worst = min(lifts, key=lifts.__getitem__)
            ok = len(lifted) >= 2 and lifts[worst] >= -0.01  # the bar tests/training/test_tiny_pipeline.py sets
            passed += ok
            cells = "  ".join(f"{d} {h['sft'][d]:.3f}->{h['round2'][d]:.3f} ({x:+.3f})" for d, x in lifts.items())
            print(
                f"{seed:>4}  {cells}  |  {len(lifted)}, {worst} {lifts[worst]:+.3f}"
                f"{'' if ok else ' (below the bar)'}  {time.perf_counter() - t0:.0f}s",
                flush=True,
            )
    print(f"{passed}/{len(args.seeds)} seeds meet the bar (>= 2 domains up 10 points, none down more than 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
