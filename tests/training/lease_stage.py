"""A stage for the lease tests, run as its own process: `python lease_stage.py RUN_URI STEPS STEP_S`.

It counts to STEPS, one checkpoint per step (each records which attempt wrote it and when it passed its
lease check), resuming from the last complete checkpoint like SFT and RL rounds do. The attempt's name comes
from $ATTEMPT.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

from training import stage, storage
from training.config import ConfigBase

STAGE = "steps"


@dataclass(frozen=True)
class StepsConfig(ConfigBase):
    """steps: how far to count. step_s: seconds per step."""

    steps: int = 20
    step_s: float = 0.2


def body(ctx: stage.StageContext) -> dict:
    cfg: StepsConfig = ctx.config  # type: ignore[assignment]
    found = storage.last_complete_checkpoint(ctx.stage_uri)
    start = found[0] if found else 0
    print(f"RESUMED_FROM {start}", flush=True)
    for step in range(start + 1, cfg.steps + 1):
        time.sleep(cfg.step_s)
        writer = storage.ManifestWriter(storage.checkpoint_uri(ctx.stage_uri, step))
        # taken before the write's own lease check, so a write that lands was checked after this instant
        writer.put_json({"step": step, "attempt": os.environ["ATTEMPT"], "before_check": time.time()}, "state.json")
        writer.commit(extra={"step": step})
        print(f"CHECKPOINT {step}", flush=True)
    ctx.writer.put_json({"resumed_from": start, "attempt": os.environ["ATTEMPT"]}, "result.json")
    return {"resumed_from": start}


if __name__ == "__main__":
    run_uri, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    stage.run_stage(STAGE, StepsConfig(steps, step_s), run_uri, body)
