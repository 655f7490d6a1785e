"""Named per-stage config presets. The stage dataclasses keep generic defaults; a profile is what a pipeline
run on that profile passes to each stage (the DAG's trigger form layers the user's overrides on top).

`tiny` was tuned on 2 CPU cores so that SFT then 2 GRPO rounds lift arithmetic holdout pass@1 by >= 10 points
without other domains dropping (tests/training/test_tiny_pipeline.py): math difficulties 1-2, a math-heavy
mix, SFT stopped at 300 steps at constant LR (so RL has headroom), a low RL learning rate (>= 3e-4 collapsed
the holdout) and 150 steps per round. `python benchmarks/lift_seeds.py` measures it across seeds: with these
settings seeds 0-4 lifted math by +30.0, +33.1, +23.1, +31.2 and +3.8 points (seed 4's SFT model reaches only
18% and RL does not move it); with 200 SFT and 100 RL steps they lifted +20.6, +6.2, +18.8, +3.8 and +8.1.
"""

from __future__ import annotations

from typing import Any

TINY: dict[str, dict[str, Any]] = {
    "taskset": {"counts": {"math": 3000, "code": 400, "extraction": 400}, "difficulties": [1, 2],
                "mix": {"math": 0.8, "code": 0.1, "extraction": 0.1}, "mix_tolerance": 0.1},
    "sft": {"max_steps": 300, "min_lr_ratio": 1.0, "checkpoint_every": 100},
    "rl_round": {"steps": 150, "checkpoint_every": 25, "lr": 2e-4, "prompts_per_step": 32,
                 "samples_per_prompt": 8, "beta": 0.01,
                 "domain_weights": {"math": 0.8, "code": 0.1, "extraction": 0.1}},
    "evaluate": {"max_tasks_per_domain": 200},
}

PROFILES: dict[str, dict[str, dict[str, Any]]] = {"tiny": TINY, "data": {}}


def preset(profile: str, stage: str) -> dict[str, Any]:
    """The profile's config for `stage` ("rl_round_N" uses the profile's "rl_round" entry)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {', '.join(PROFILES)}")
    table = PROFILES[profile]
    key = "rl_round" if stage.startswith("rl_round") else stage
    return dict(table.get(key, {}))
