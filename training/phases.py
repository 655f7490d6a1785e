"""Where a training step's time goes: wall-clock seconds per named phase, summed over a step.

    timer = PhaseTimer()
    with timer.phase("rollout"):
        ...
    timer.metrics()  # {"time/rollout_s": 1.25, ...}, then timer.reset() for the next step

The GRPO step times rollout, reward, reference (forward), policy (forward and backward), optimizer and
weight_sync; the rl_round stage logs them to MLflow every step and the benchmarks print them. No torch here:
on an accelerator, kernels run asynchronously, so the caller passes `sync` (e.g. torch.cuda.synchronize) to be
called at each phase boundary; otherwise a phase would be charged for work queued by the one before it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# The order the GRPO step runs them in; `metrics` lists these first, then any others by first use.
GRPO_PHASES = ("rollout", "reward", "reference", "policy", "optimizer", "weight_sync")


class PhaseTimer:
    """Accumulates seconds per phase; phases may repeat within a step (they add up) but must not nest."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None):
        self._clock = clock
        self._sync = sync
        self.seconds: dict[str, float] = {}
        self._open: str | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._open is not None:
            # nested phases would count the inner time twice and make the breakdown sum past the step
            raise RuntimeError(f"phase {name!r} started inside phase {self._open!r}")
        self._open = name
        if self._sync is not None:
            self._sync()
        start = self._clock()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self.add(name, self._clock() - start)
            self._open = None

    def add(self, name: str, seconds: float) -> None:
        """Charge `seconds` to `name` (for time measured elsewhere, e.g. an engine's weight sync)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return sum(self.seconds.values())

    def metrics(self, prefix: str = "time/") -> dict[str, float]:
        """{"<prefix><phase>_s": seconds}, the GRPO phases first in step order."""
        names = [p for p in GRPO_PHASES if p in self.seconds] + [p for p in self.seconds if p not in GRPO_PHASES]
        return {f"{prefix}{name}_s": self.seconds[name] for name in names}

    def reset(self) -> None:
        self.seconds = {}


def merge(runs: list[dict[str, float]]) -> dict[str, float]:
    """Mean seconds per phase over several steps' `seconds` dicts (a phase missing from a step counts 0)."""
    if not runs:
        return {}
    names: list[str] = []
    for run in runs:
        names += [n for n in run if n not in names]
    return {n: sum(run.get(n, 0.0) for run in runs) / len(runs) for n in names}


def format_breakdown(seconds: dict[str, float]) -> str:
    """One line: each phase's seconds and share of the total, in GRPO step order, e.g.
    "rollout 1.20s 60% | reward 0.10s 5% | ..."."""
    total = sum(seconds.values()) or 1.0
    names = [p for p in GRPO_PHASES if p in seconds] + [p for p in seconds if p not in GRPO_PHASES]
    return " | ".join(f"{n} {seconds[n]:.2f}s {100 * seconds[n] / total:.0f}%" for n in names)
