"""Benchmark: a 100k-task build (generate + validate + dedup + split + parquet write), per phase.

    .venv/bin/python benchmarks/taskset.py [--total 100000]

Baseline, measured in the same run: writing the same 100k generated tasks to parquet with `datasets` and
nothing else (the floor any build that stores its output this way pays). Then the whole stage as a user runs
it (`posttrain build-taskset` with a file:// run and a throw-away SQLite MLflow), wall-clock, which must stay
under 60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=100_000)
    args = parser.parse_args()

    import datasets  # noqa: F401 - import cost is not part of any phase

    from training.stages.build_taskset import TasksetConfig, build
    from training.tasksets.generators import generate
    from training.tasksets.io import save_tasks

    config = TasksetConfig(total=args.total)
    with tempfile.TemporaryDirectory(prefix="bench-taskset-") as tmp:
        tmp_path = Path(tmp)
        # baseline: the parquet write of all generated rows alone
        tasks = [t for d, n in config.domain_counts().items() for t in generate(d, n, config.seed)]
        t = time.perf_counter()
        save_tasks(tasks, tmp_path / "floor.parquet")
        floor = time.perf_counter() - t
        del tasks

        t = time.perf_counter()
        result = build(config)
        t_write = time.perf_counter()
        save_tasks(result.train, tmp_path / "train.parquet")
        save_tasks(result.holdout, tmp_path / "holdout.parquet")
        write = time.perf_counter() - t_write
        total = time.perf_counter() - t
        phases = dict(result.report["timings_s"], write=write)

        print(f"taskset build, {args.total} tasks requested, {os.cpu_count()} CPU(s)")
        for name, seconds in phases.items():
            print(f"  {name:10s} {seconds:7.2f} s")
        print(f"  {'total':10s} {total:7.2f} s   {args.total / total:,.0f} tasks/s")
        rep = result.report
        print(
            f"  kept: train {len(result.train)}, holdout {len(result.holdout)}; exact dups "
            f"{rep['dedup']['exact_duplicates']}, near dups {rep['dedup']['near_duplicates']}, "
            f"contaminated {rep['overlap']['contaminated']}, mix dropped {rep['mixing']['dropped']}"
        )
        print(f"baseline: datasets parquet write of the {args.total} generated rows alone: {floor:.2f} s")
        print(f"ratio: build / baseline = {total / floor:.1f}x")

        # the whole stage, as a user runs it
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
        from training import cli

        t = time.perf_counter()
        rc = cli.main(["build-taskset", "--run", f"file://{tmp_path / 'run'}", "--set", f"total={args.total}"])
        stage = time.perf_counter() - t
        print(
            f"stage: posttrain build-taskset --set total={args.total}: rc={rc}, {stage:.2f} s wall "
            f"(incl. MLflow setup and logging) -> {'OK' if rc == 0 and stage < 60 else 'OVER BUDGET'} "
            f"(budget 60 s)"
        )
        return 0 if rc == 0 and stage < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
