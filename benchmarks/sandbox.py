"""Benchmark: executions/s of trivial jobs through the sandbox pool vs one fresh interpreter per job.

    .venv/bin/python benchmarks/sandbox.py [--jobs 600] [--concurrency N] [--rounds 6] [--check]

Each job is a small function plus 3 tests. Ours: `sandbox.Pool.run_batch` (pre-started worker, one fork per
job, full isolation, host-side verdicts). Baseline, measured in the same run: `subprocess.run([python,
file])` per job on the same program with the same tests as assert lines, with the same concurrency, and
none of the isolation. The jobs are split into rounds that alternate ours/baseline, so that load from other
processes on the machine hits both sides alike.
The goal is a ratio >= 10x; --check exits 1 below it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROGRAM = "def add(a, b):\n    return a + b\n"
ASSERTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add('a', 'b') == 'ab'\n"
GOAL = 10.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=600, help="jobs per side, in total (default 600)")
    parser.add_argument("--concurrency", type=int, default=2 * (os.cpu_count() or 1),
                        help="jobs in flight, both sides (default: 2 x CPUs, the pool's own default)")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds the jobs are split into")
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the ratio is below {GOAL:g}x")
    args = parser.parse_args()

    from sandbox import Job, Pool, Status, parse_assert_tests

    tests = parse_assert_tests(ASSERTS)
    per_round = max(1, args.jobs // args.rounds)
    jobs = [Job(PROGRAM, tests, id=f"bench-{i}") for i in range(per_round)]
    ours_s = base_s = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        files = []
        for i in range(per_round):  # written before timing: the baseline is not charged for it
            path = Path(tmp) / f"job_{i}.py"
            path.write_text(PROGRAM + ASSERTS)
            files.append(str(path))

        def baseline_one(path: str) -> int:
            return subprocess.run([sys.executable, path], capture_output=True).returncode

        t = time.perf_counter()
        pool = Pool(max_slots=max(args.concurrency, 1))
        level = pool.start()
        startup = time.perf_counter() - t
        try:
            pool.run_batch(jobs[:20], args.concurrency)  # warm-up, not timed
            with ThreadPoolExecutor(args.concurrency) as ex:
                list(ex.map(baseline_one, files[:5]))
                for _ in range(args.rounds):
                    t = time.perf_counter()
                    verdicts = pool.run_batch(jobs, args.concurrency)
                    ours_s += time.perf_counter() - t
                    bad = [v for v in verdicts if v.status is not Status.PASSED]
                    if bad:
                        print(f"error: {len(bad)} sandbox jobs did not pass, e.g. {bad[0]}", file=sys.stderr)
                        return 2
                    t = time.perf_counter()
                    codes = list(ex.map(baseline_one, files))
                    base_s += time.perf_counter() - t
                    if any(codes):
                        print("error: baseline jobs failed", file=sys.stderr)
                        return 2
        finally:
            pool.close()

    n = per_round * args.rounds
    ours, base = n / ours_s, n / base_s
    ratio = ours / base
    print(f"sandbox benchmark: {n} trivial jobs per side (2-line function + 3 tests), concurrency "
          f"{args.concurrency}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"isolation in force:                 {level.value}")
    print(f"pool start (once, not in the rate): {startup:.3f} s")
    print(f"ours     sandbox.Pool.run_batch:    {ours:8.1f} executions/s  ({n} in {ours_s:.2f} s, "
          f"{1000 * ours_s / n:.2f} ms each)")
    print(f"baseline subprocess.run([python]):  {base:8.1f} executions/s  ({n} in {base_s:.2f} s, "
          f"{1000 * base_s / n:.2f} ms each)")
    verdict = "" if ratio >= GOAL else ": BELOW GOAL"
    print(f"ratio:                              {ratio:8.1f}x  (goal >= {GOAL:g}x{verdict})")
    return 1 if args.check and ratio < GOAL else 0


if __name__ == "__main__":
    sys.exit(main())
