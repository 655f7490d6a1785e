"""A judge-reward GRPO round on the tiny profile: the math domain's reward is half the math verifier, half a
judge model reached over the OpenAI chat-completions wire format (a real local server started here)."""

from __future__ import annotations

import pytest

from tests.training.rewards.judge_server import JudgeServer
from training import stage
from training.config import from_dict
from training.profiles import TINY

pytestmark = pytest.mark.slow


def test_tiny_round_with_a_judge_reward(file_run_uri, local_mlflow, monkeypatch) -> None:
    from training.rl.config import GRPOConfig
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.rl_round import run_round
    from training.stages.sft import SFTConfig, train
    from training.storage import read_json, require_manifest

    taskset = {
        **TINY["taskset"],
        "counts": {"math": 300, "code": 40, "extraction": 40, "instruction": 40},
        "reward_weights": {"math": {"math": 0.5, "judge": 0.5}},
    }
    sft = {**TINY["sft"], "max_steps": 60, "checkpoint_every": 60}
    grpo = {
        **TINY["rl_round"],
        "steps": 3,
        "checkpoint_every": 3,
        "prompts_per_step": 8,
        "samples_per_prompt": 4,
        "holdout_per_domain": 8,
        "dynamic_sampling": False,
    }
    with JudgeServer() as server:
        monkeypatch.setenv("POSTTRAIN_JUDGE_URL", server.url)
        monkeypatch.setenv("POSTTRAIN_JUDGE_MODEL", "tiny-judge")
        stage.run_stage("taskset", from_dict(TasksetConfig, taskset), file_run_uri, taskset_body)
        stage.run_stage("sft", from_dict(SFTConfig, sft), file_run_uri, train)
        result = stage.run_stage("rl_round_1", from_dict(GRPOConfig, grpo), file_run_uri, lambda ctx: run_round(ctx, 1))
    report = read_json(require_manifest(f"{file_run_uri}/rl_round_1"), "round_report.json")
    history = report["history"]
    assert len(history) == 3
    judged = [step["reward_component/judge"] for step in history]
    print(
        "judge round: requests",
        len(server.requests),
        "judge component per step",
        judged,
        "math component",
        [step["reward_component/math"] for step in history],
        "reward/math",
        [step["reward/math"] for step in history],
        "holdout after",
        result.summary["holdout_after"],
    )
    assert server.requests and all(r["body"]["model"] == "tiny-judge" for r in server.requests)
    assert all(0.2 <= j <= 0.9 for j in judged)  # every math sample was graded: 2/10 or 9/10
    assert all(0.0 <= step["reward/math"] <= 1.0 for step in history)
