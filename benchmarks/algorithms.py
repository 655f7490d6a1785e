"""Each RL objective on the tiny profile: holdout pass@1 per domain after 2 rounds, seeds 0-2, one table.

    python benchmarks/algorithms.py                                  # every objective, seeds 0-2
    python benchmarks/algorithms.py --objectives grpo rloo --seeds 0
    python benchmarks/algorithms.py --set rl_round.steps=50 --record # also write the table into docs/results.md

One task set and SFT per seed (training/profiles.py TINY, as tests/training/stages/test_tiny_pipeline.py runs
them), then two GRPO rounds per objective from that same SFT model, each objective in its own file:// run.
An objective is an `advantage` and a `policy_loss` (training/rl/algorithms.py) with the settings its paper
uses where PPO's would be wrong:

- grpo:          advantage grpo, policy_loss clip (the profile as it is: the baseline)
- dr_grpo:       advantage dr_grpo
- rloo:          advantage rloo
- reinforce_pp:  advantage reinforce_pp
- gspo:          policy_loss gspo, clip range (3e-4, 4e-4), the sequence mean (Zheng et al. 2025)
- cispo:         policy_loss cispo, the weight clipped to at most 5, the lower side open (MiniMax-M1)

The tiny profile takes one optimizer pass per rollout batch, so every ratio is 1 when the loss is taken: clip
and cispo then give the same gradient, and gspo differs from clip by weighting sequences, not tokens. The
differences this table shows at that setting are the advantages' and the aggregation's; `--set
rl_round.updates_per_batch=2` lets the ratios move. Seeds are where the spread is: read a difference
against the seeds' own range. A quality check, not a speed ratio: not part of `make bench` (minutes per
objective and seed on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.lift_seeds import parse_overrides  # noqa: E402
from benchmarks.numerics import pin_cpu_numerics  # noqa: E402

pin_cpu_numerics()  # one float path on any AVX2 machine, as the test suite runs

OBJECTIVES: dict[str, dict[str, Any]] = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo"},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp"},
    "gspo": {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
    "cispo": {"policy_loss": "cispo", "clip_low": 1.0, "clip_high": 4.0},
}


def sft_run(seed: int, overrides: dict[str, dict], root: Path) -> Path:
    """The seed's task set and SFT model, in a file:// run of their own."""
    from training import stage
    from training.config import from_dict
    from training.profiles import TINY
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.sft import SFTConfig, train

    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root / f'mlflow-{seed}.db'}"
    folder = root / f"sft-{seed}"
    cfg = {k: {"seed": seed, **TINY[k], **overrides.get(k, {})} for k in ("taskset", "sft")}
    with contextlib.redirect_stdout(io.StringIO()):  # the stages' POSTTRAIN_RESULT lines
        stage.run_stage("taskset", from_dict(TasksetConfig, cfg["taskset"]), f"file://{folder}", taskset_body)
        stage.run_stage("sft", from_dict(SFTConfig, cfg["sft"]), f"file://{folder}", train)
    return folder


def rounds(seed: int, objective: str, overrides: dict[str, dict], base: Path, root: Path) -> dict[str, Any]:
    """Two rounds of `objective` from the seed's SFT model: the holdout before and after, per domain."""
    from training import stage
    from training.config import from_dict
    from training.profiles import TINY
    from training.rl.config import GRPOConfig
    from training.stages.rl_round import run_round

    folder = root / f"{objective}-{seed}"
    for name in ("taskset", "sft"):
        shutil.copytree(base / name, folder / name)
    cfg = from_dict(
        GRPOConfig, {"seed": seed, **TINY["rl_round"], **OBJECTIVES[objective], **overrides.get("rl_round", {})}
    )
    run = f"file://{folder}"
    with contextlib.redirect_stdout(io.StringIO()):
        r1 = stage.run_stage("rl_round_1", cfg, run, lambda c: run_round(c, 1))
        r2 = stage.run_stage("rl_round_2", cfg, run, lambda c: run_round(c, 2))
    return {"sft": r1.summary["holdout_before"], "round2": r2.summary["holdout_after"]}


def table(results: dict[tuple[str, int], dict[str, Any]], objectives: list[str], seeds: list[int]) -> str:
    domains = sorted(d for d in next(iter(results.values()))["sft"] if d != "all") + ["all"]
    lines = [
        "| objective | " + " | ".join(domains) + " | all, per seed |",
        "|---|" + "---|" * (len(domains) + 1),
    ]
    sft = {d: sum(results[(objectives[0], s)]["sft"][d] for s in seeds) / len(seeds) for d in domains}
    lines.append("| SFT (before the rounds) | " + " | ".join(f"{sft[d]:.3f}" for d in domains) + " | " + ", ".join(
        f"{results[(objectives[0], s)]['sft']['all']:.3f}" for s in seeds) + " |")  # fmt: skip
    for name in objectives:
        mean = {d: sum(results[(name, s)]["round2"][d] for s in seeds) / len(seeds) for d in domains}
        per_seed = ", ".join(f"{results[(name, s)]['round2']['all']:.3f}" for s in seeds)
        lines.append(f"| {name} | " + " | ".join(f"{mean[d]:.3f}" for d in domains) + f" | {per_seed} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), choices=list(OBJECTIVES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--set", action="append", default=[], metavar="STAGE.FIELD=VALUE", help="override a TINY preset field"
    )
    parser.add_argument("--record", action="store_true", help="write the table into docs/results.md")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)

    import logging

    import mlflow  # noqa: F401 - configures its loggers on import; quieten them after
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("posttrain", "training", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.ERROR if name in ("mlflow", "alembic") else logging.WARNING)
    print(f"tiny profile, objectives {args.objectives}, seeds {args.seeds}, overrides {overrides or 'none'}")
    results: dict[tuple[str, int], dict[str, Any]] = {}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="posttrain-algorithms-") as tmp:
        root = Path(tmp)
        for seed in args.seeds:
            t0 = time.perf_counter()
            base = sft_run(seed, overrides, root)
            print(f"seed {seed}: task set and SFT in {time.perf_counter() - t0:.0f}s", flush=True)
            for name in args.objectives:
                t0 = time.perf_counter()
                results[(name, seed)] = h = rounds(seed, name, overrides, base, root)
                cells = "  ".join(f"{d} {h['sft'][d]:.3f}->{h['round2'][d]:.3f}" for d in sorted(h["sft"]))
                print(f"seed {seed} {name}: {cells}  {time.perf_counter() - t0:.0f}s", flush=True)
    body = table(results, args.objectives, args.seeds)
    print(body)
    if args.record:
        from benchmarks.results import record

        note = (
            f"`python benchmarks/algorithms.py {' '.join(sys.argv[1:])}`: greedy holdout pass@1 after two rounds of "
            f"each objective from the same SFT model per seed, the mean over seeds {args.seeds} per domain and "
            f"'all' per seed; {time.perf_counter() - t_all:.0f} s in all."
        )
        record(f"RL objectives on the tiny profile (seeds {', '.join(map(str, args.seeds))})", note + "\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
