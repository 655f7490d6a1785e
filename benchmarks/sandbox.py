"""Benchmark: executions/s of sandbox jobs through the pool vs one fresh interpreter per job, two workloads.

    .venv/bin/python benchmarks/sandbox.py [--workloads trivial,humaneval] [--jobs 600] [--concurrency N]
                                           [--rounds 6] [--check]

trivial: a 2-line function plus 3 tests. humaneval: HumanEval-sized programs (a 15-25 line function with a
docstring, loops and helpers, imports from the standard library) with 6-8 tests each, as RL code rewards and
the HumanEval evaluation run them. Ours: `sandbox.Pool.run_batch` (pre-started worker, one fork per
job, full isolation, host-side verdicts). Baseline, measured in the same run: `subprocess.run([python,
file])` per job on the same program with the same tests as assert lines, with the same concurrency, and
none of the isolation. The jobs are split into rounds that alternate ours/baseline, so that load from other
processes on the machine hits both sides alike. A third side, the floor, is measured in the same rounds: a bare
fork of this process per job that compiles and runs the program and its asserts and exits, with no isolation,
no supervision and no result transport: about the least a sandbox that forks one Python per job pays, so its
ratio says which goals this machine allows at all (a page fault costs microseconds on a VM, and a forked Python
faults on every page it writes).
The goals (on the trivial workload): a ratio >= 12x and >= 600 executions/s; --check exits 1 below either.
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
GOAL = 12.0
GOAL_RATE = 600.0

# HumanEval-sized programs (written for this benchmark, in HumanEval's style: typed signature, docstring,
# 15-25 lines, stdlib imports), each with its assert tests.
HUMANEVAL = [
    (
        '''from typing import List


def separate_paren_groups(paren_string: str) -> List[str]:
    """Split a string of balanced, non-nested-between-groups parentheses into its groups, spaces ignored.
    >>> separate_paren_groups('( ) (( )) (( )( ))')
    ['()', '(())', '(()())']
    """
    result = []
    current = []
    depth = 0
    for c in paren_string:
        if c == '(':
            depth += 1
            current.append(c)
        elif c == ')':
            depth -= 1
            current.append(c)
            if depth == 0:
                result.append(''.join(current))
                current.clear()
    return result
''',
        """assert separate_paren_groups('(()()) ((())) () ((())()())') == ['(()())', '((()))', '()', '((())()())']
assert separate_paren_groups('() (()) ((())) (((())))') == ['()', '(())', '((()))', '(((())))']
assert separate_paren_groups('(()(())((())))') == ['(()(())((())))']
assert separate_paren_groups('( ) (( )) (( )( ))') == ['()', '(())', '(()())']
assert separate_paren_groups('') == []
assert separate_paren_groups('()') == ['()']
""",
    ),
    (
        '''import math
from typing import List


def prime_factors_sum(numbers: List[int]) -> List[int]:
    """For each number, the sum of its prime factors counted with multiplicity (0 for numbers below 2).
    >>> prime_factors_sum([12, 7, 1])
    [7, 7, 0]
    """
    def factors(n: int) -> List[int]:
        out = []
        d = 2
        while d <= math.isqrt(n):
            while n % d == 0:
                out.append(d)
                n //= d
            d += 1
        if n > 1:
            out.append(n)
        return out

    return [sum(factors(n)) if n >= 2 else 0 for n in numbers]
''',
        """assert prime_factors_sum([12, 7, 1]) == [7, 7, 0]
assert prime_factors_sum([2]) == [2]
assert prime_factors_sum([100]) == [14]
assert prime_factors_sum([97, 98]) == [97, 16]
assert prime_factors_sum([]) == []
assert prime_factors_sum([0, -5]) == [0, 0]
assert prime_factors_sum([1024]) == [20]
""",
    ),
    (
        '''from collections import Counter
from typing import List, Tuple


def top_k_words(text: str, k: int) -> List[Tuple[str, int]]:
    """The k most frequent lower-cased words (letters only), ties broken alphabetically.
    >>> top_k_words('a b a c b a', 2)
    [('a', 3), ('b', 2)]
    """
    words = []
    word = ''
    for ch in text.lower() + ' ':
        if ch.isalpha():
            word += ch
        elif word:
            words.append(word)
            word = ''
    counts = Counter(words)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ranked[:max(k, 0)]
''',
        """assert top_k_words('a b a c b a', 2) == [('a', 3), ('b', 2)]
assert top_k_words('The the THE cat', 1) == [('the', 3)]
assert top_k_words('', 3) == []
assert top_k_words('x y z', 5) == [('x', 1), ('y', 1), ('z', 1)]
assert top_k_words('dog, cat; dog! bird?', 2) == [('dog', 2), ('bird', 1)]
assert top_k_words('a a b b', 0) == []
assert top_k_words('b a', 1) == [('a', 1)]
assert top_k_words('one two two three three three', 3) == [('three', 3), ('two', 2), ('one', 1)]
""",
    ),
]
WORKLOADS = {"trivial": [(PROGRAM, ASSERTS)], "humaneval": HUMANEVAL}


def floor_batch(sources: list[str], concurrency: int) -> bool:
    """Run each source in a bare forked child, at most `concurrency` at once; True when every one exits 0."""
    running, ok, i = 0, True, 0
    while i < len(sources) or running:
        while i < len(sources) and running < concurrency:
            if os.fork() == 0:
                try:  # compiled in the child, as a sandbox must compile untrusted code
                    exec(compile(sources[i], "<job>", "exec"), {"__name__": "__job__"})
                    os._exit(0)
                except BaseException:  # noqa: BLE001 - any failure is the child's exit code
                    os._exit(1)
            i, running = i + 1, running + 1
        _, status = os.wait()
        running -= 1
        ok = ok and os.waitstatus_to_exitcode(status) == 0
    return ok


def measure(workload: str, args: argparse.Namespace) -> tuple[float, float, float, str, float] | None:
    """(ours executions/s, baseline executions/s, pool start seconds, isolation level, floor executions/s), or
    None on a failure."""
    from sandbox import Job, Pool, Status, parse_assert_tests

    programs = WORKLOADS[workload]
    per_round = max(1, args.jobs // args.rounds)
    jobs = [
        Job(
            programs[i % len(programs)][0],
            parse_assert_tests(programs[i % len(programs)][1]),
            id=f"bench-{workload}-{i}",
        )
        for i in range(per_round)
    ]
    ours_s = base_s = floor_s = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as tmp:
        files, sources = [], []
        for i in range(per_round):  # written before timing: the baseline is not charged for it
            path = Path(tmp) / f"job_{i}.py"
            program, asserts = programs[i % len(programs)]
            sources.append(program + "\n" + asserts)
            path.write_text(sources[-1])
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
                        return None
                    t = time.perf_counter()
                    codes = list(ex.map(baseline_one, files))
                    base_s += time.perf_counter() - t
                    if any(codes):
                        print("error: baseline jobs failed", file=sys.stderr)
                        return None
                    t = time.perf_counter()
                    if not floor_batch(sources, args.concurrency):
                        print("error: floor jobs failed", file=sys.stderr)
                        return None
                    floor_s += time.perf_counter() - t
        finally:
            pool.close()
    n = per_round * args.rounds
    return n / ours_s, n / base_s, startup, level.value, n / floor_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="trivial,humaneval", help=f"comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--jobs", type=int, default=600, help="jobs per side and workload, in total (default 600)")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2 * (os.cpu_count() or 1),
        help="jobs in flight, both sides (default: 2 x CPUs, the pool's own default)",
    )
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds the jobs are split into")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 if the trivial workload is below {GOAL:g}x or {GOAL_RATE:g} executions/s",
    )
    args = parser.parse_args()

    failed = False
    for workload in args.workloads.split(","):
        got = measure(workload, args)
        if got is None:
            return 2
        ours, base, startup, level, floor = got
        n = max(1, args.jobs // args.rounds) * args.rounds
        ratio = ours / base
        what = (
            "2-line function + 3 tests"
            if workload == "trivial"
            else f"{len(HUMANEVAL)} HumanEval-sized programs, 6-8 tests each"
        )
        print(
            f"sandbox benchmark, {workload}: {n} jobs per side ({what}), concurrency {args.concurrency}, "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
        )
        print(f"  isolation in force:                 {level}")
        print(f"  pool start (once, not in the rate): {startup:.3f} s")
        print(f"  ours     sandbox.Pool.run_batch:    {ours:8.1f} executions/s  ({1000 / ours:.2f} ms each)")
        print(f"  baseline subprocess.run([python]):  {base:8.1f} executions/s  ({1000 / base:.2f} ms each)")
        print(
            f"  floor    bare fork, no isolation:   {floor:8.1f} executions/s  ({1000 / floor:.2f} ms each; "
            f"{floor / base:.1f}x the baseline: about the most a fork-per-job sandbox gets here)"
        )
        if workload == "trivial":
            below = [f"ratio below {GOAL:g}x"] * (ratio < GOAL) + [f"rate below {GOAL_RATE:g}/s"] * (ours < GOAL_RATE)
            failed = bool(below)
            print(
                f"  ratio:                              {ratio:8.1f}x  (goals >= {GOAL:g}x and >= {GOAL_RATE:g} "
                f"executions/s: {'BELOW GOAL: ' + ', '.join(below) if below else 'hold'})"
            )
        else:
            print(f"  ratio:                              {ratio:8.1f}x")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
