"""GRPO round: curriculum and mixing helpers, one step, the stage, and kill -9 + retry = uninterrupted."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training import stage, storage
from training.modeling import models
from training.rl.config import GRPOConfig
from training.rl.credit import assign_credit
from training.rl.curriculum import Curriculum, domain_counts, pick_prompts
from training.rl.round import Round, derive_seed
from training.stages.rl_round import run_round
from training.stages.sft import SFTConfig, train as sft_train

ROOT = Path(__file__).resolve().parents[3]
TINY = models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2)


def test_domain_counts_largest_remainder() -> None:
    # 10 * [.5, .25, .25] = [5, 2.5, 2.5] -> floors [5, 2, 2], one left goes to the larger remainder, ties by name
    assert domain_counts({"math": 0.5, "code": 0.25, "extraction": 0.25}, ["code", "extraction", "math"], 10) == {
        "code": 3,
        "extraction": 2,
        "math": 5,
    }
    assert domain_counts({}, ["a", "b"], 3) == {"a": 2, "b": 1}
    assert domain_counts({"a": 1.0}, ["a", "b"], 4) == {"a": 4, "b": 0}
    with pytest.raises(ValueError):
        domain_counts({"a": 0.0}, ["a"], 4)


def test_curriculum_band_weights_and_ema() -> None:
    cur = Curriculum(band=(0.2, 0.8), floor=0.1, ema=0.5)
    assert cur.weight("math", 3) == 1.0  # unknown: worth a look
    cur.update("math", 3, 1.0)
    assert cur.weight("math", 3) == 0.1  # solved: out of band
    cur.update("math", 3, 0.0)  # ema: .5 * 1 + .5 * 0 = .5
    assert cur.rates["math/3"] == 0.5 and cur.weight("math", 3) == 1.0


def test_pick_prompts_follows_counts_and_curriculum() -> None:
    from tests.training.conftest import make_tasks

    pool: dict = {}
    for t in make_tasks():
        pool.setdefault(t.domain, {}).setdefault(t.difficulty, []).append(t)
    cur = Curriculum(band=(0.2, 0.8), floor=0.0, ema=1.0)
    cur.update("math", 2, 1.0)  # math/2 solved -> weight 0: only math/3 is drawn
    picked = pick_prompts(pool, {"math": 6, "extraction": 2}, cur, random.Random(0))
    assert [t.domain for t in picked].count("math") == 6 and len(picked) == 8
    assert {t.difficulty for t in picked if t.domain == "math"} == {3}
    again = pick_prompts(pool, {"math": 6, "extraction": 2}, cur, random.Random(0))
    assert [t.id for t in again] == [t.id for t in picked]


def test_derive_seed_is_stable() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 1, 3)
    assert 0 <= derive_seed("x") < 2**63


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown advantage"):
        GRPOConfig(advantage="ppo")
    with pytest.raises(ValueError, match="samples_per_prompt"):
        GRPOConfig(samples_per_prompt=1)


def test_step_updates_policy_and_is_deterministic(tiny_model, monkeypatch) -> None:
    import copy

    import training.rewards

    # An untrained model earns 0 everywhere; a length-parity reward gives every group some variance.
    monkeypatch.setattr(training.rewards, "score_tasks", lambda tasks, texts: [float(len(t) % 2) for t in texts])

    from tests.training.conftest import make_tasks

    model, tok = tiny_model
    cfg = GRPOConfig(
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=6,
        dynamic_sampling=False,
        beta=0.05,
        device="cpu",
        lr=1e-2,
    )

    def run() -> tuple[dict, dict]:
        policy = copy.deepcopy(model).train()
        rnd = Round.build(cfg, 1, policy, tok, copy.deepcopy(model).eval(), make_tasks(), torch.device("cpu"))
        metrics = rnd.step(0)
        return metrics, policy.state_dict()

    m1, s1 = run()
    m2, s2 = run()
    assert m1["groups_drawn"] == 4 and m1["groups_kept"] == 4 and "train/loss" in m1 and m1["train/grad_norm"] > 0
    # the gate's KL and entropy sanity rule reads these (beta > 0: a KL to the reference is computed)
    assert m1["train/entropy"] > 0 and m1["train/kl_ref"] >= 0

    def untimed(m: dict) -> dict:
        return {k: v for k, v in m.items() if k != "step_seconds" and not k.startswith("time/")}

    assert untimed(m1) == untimed(m2)
    # the per-phase breakdown of the step (training.phases), logged to MLflow with the other metrics
    phases = {
        "time/rollout_s",
        "time/reward_s",
        "time/reference_s",
        "time/policy_s",
        "time/optimizer_s",
        "time/weight_sync_s",
    }
    assert phases <= set(m1) and all(m1[k] >= 0 for k in phases)
    assert sum(v for k, v in m1.items() if k.startswith("time/")) <= m1["step_seconds"] + 0.05
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    assert any(not torch.equal(s1[k], model.state_dict()[k]) for k in s1)


@pytest.mark.parametrize(
    "objective",
    [
        {"advantage": "rloo"},
        {"advantage": "reinforce_pp"},
        {"policy_loss": "gspo", "clip_low": 3e-4, "clip_high": 4e-4, "loss_agg": "seq-mean-token-mean"},
        {"policy_loss": "cispo", "clip_low": 1.0, "clip_high": 4.0, "updates_per_batch": 2},
    ],
    ids=lambda o: o.get("policy_loss") or o["advantage"],
)
def test_every_objective_runs_a_real_step(tiny_model, monkeypatch, objective) -> None:
    """Each registered objective through a whole step of a real model: rollouts, rewards, its advantages or its
    loss in the update (two passes for cispo, so its ratios leave 1), and a policy that moved."""
    import copy

    import training.rewards
    from tests.training.conftest import make_tasks

    monkeypatch.setattr(training.rewards, "score_tasks", lambda tasks, texts: [float(len(t) % 2) for t in texts])
    model, tok = tiny_model
    cfg = GRPOConfig(
        prompts_per_step=4, samples_per_prompt=4, max_new_tokens=6, dynamic_sampling=False, device="cpu", lr=1e-2,
        **objective,
    )  # fmt: skip
    policy = copy.deepcopy(model).train()
    metrics = Round.build(cfg, 1, policy, tok, None, make_tasks(), torch.device("cpu")).step(0)
    assert metrics["train/grad_norm"] > 0 and math.isfinite(metrics["train/loss"])
    assert any(not torch.equal(p, q) for p, q in zip(policy.state_dict().values(), model.state_dict().values()))


def test_overlong_shaping_and_filtering_in_a_step(tiny_model, monkeypatch) -> None:
    """With max_new_tokens 6 an untrained model is cut at the cap nearly always: the soft punishment lowers those
    rewards by the full penalty (buffer 2: length 6 is -1), and `truncated: mask` takes their tokens out of the
    update's loss mask while they still count in the group."""
    import copy

    import training.rewards
    from tests.training.conftest import make_tasks
    from training.rl.overlong import overlong_penalty

    monkeypatch.setattr(training.rewards, "score_tasks", lambda tasks, texts: [float(len(t) % 2) for t in texts])
    model, tok = tiny_model
    cfg = GRPOConfig(
        prompts_per_step=4,
        samples_per_prompt=4,
        max_new_tokens=6,
        dynamic_sampling=False,
        device="cpu",
        overlong_buffer=2,
        overlong_penalty=1.0,
        truncated="mask",
    )
    rnd = Round.build(cfg, 1, copy.deepcopy(model).train(), tok, None, make_tasks(), torch.device("cpu"))
    samples = rnd.sample(0)
    flat = [c for _, g, _ in samples.kept for c in g]
    want = [overlong_penalty(len(c.token_ids), 6, 2) for c in flat]
    assert samples.components["overlong_penalty"] == want and min(want) == -1.0
    texts_reward = training.rewards.score_tasks(None, [c.text for c in flat])
    assert [r for _, _, rs in samples.kept for r in rs] == pytest.approx([r + p for r, p in zip(texts_reward, want)])
    kept, adv = assign_credit(samples.kept, samples.splits, cfg)
    chunks, _ = rnd.update_chunks(kept, adv)
    masks = torch.cat([c.completion_mask.sum(-1) for c in chunks])  # tokens in the loss, per completion
    cut = sorted(c.finish_reason == "length" for c in flat)
    assert sorted((masks == 0).tolist()) == cut and any(cut)


@pytest.fixture
def sft_run(taskset_run):
    stage.run_stage(
        "sft",
        SFTConfig(max_steps=20, batch_size=4, max_seq_len=64, vocab_size=300, tiny=TINY, checkpoint_every=0),
        taskset_run,
        sft_train,
    )
    return taskset_run


ROUND = dict(
    steps=4,
    prompts_per_step=4,
    samples_per_prompt=4,
    max_new_tokens=6,
    checkpoint_every=2,
    device="cpu",
    holdout_per_domain=5,
)


def test_round_stage_outputs(sft_run) -> None:
    result = stage.run_stage("rl_round_1", GRPOConfig(**ROUND), sft_run, lambda ctx: run_round(ctx, 1))
    s = result.summary
    assert s["policy_from"] == "sft" and s["steps"] == 4
    assert set(s["holdout_after"]) == {"all", "math", "extraction"}
    # read by the gate's KL and entropy rule; None when no step had an informative group to update on
    assert "kl_ref_mean" in s and (s["entropy_mean"] is None or s["entropy_mean"] > 0)
    manifest = storage.read_manifest(storage.join(sft_run, "rl_round_1"))
    assert "model/model.safetensors" in manifest.files and "round_report.json" in manifest.files
    assert [st for st, _ in storage.list_complete_checkpoints(storage.join(sft_run, "rl_round_1"))] == [2]
    r2 = stage.run_stage("rl_round_2", GRPOConfig(**ROUND), sft_run, lambda ctx: run_round(ctx, 2))
    assert r2.summary["policy_from"] == "rl_round_1"
    assert r2.summary["holdout_before"] == s["holdout_after"]  # round 2 starts where round 1 ended
    # per-task outcomes for paired comparisons: the same tasks as the rates, round 2's before = round 1's after
    reports = [
        storage.read_json(storage.require_manifest(storage.join(sft_run, f"rl_round_{k}")), "round_report.json")
        for k in (1, 2)
    ]
    for report in reports:
        for when in ("before", "after"):
            outcomes = report["holdout_outcomes"][when]
            assert set(outcomes) == {"math", "extraction"} and all(0 < len(o) <= 5 for o in outcomes.values())
            rates = report[f"holdout_{when}"]
            assert all(abs(sum(o.values()) / len(o) - rates[d]) < 1e-9 for d, o in outcomes.items())
    assert reports[1]["holdout_outcomes"]["before"] == reports[0]["holdout_outcomes"]["after"]


def _round_cmd(run_uri: str, cfg: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        "training.cli",
        "rl-round",
        "--round",
        "1",
        "--run",
        run_uri,
        "--config",
        json.dumps(cfg),
    ]


def _copy_run(src: str, dest: Path) -> str:
    import shutil

    for name in ("taskset", "sft"):
        shutil.copytree(Path(src[len("file://") :]) / name, dest / name)
    return f"file://{dest}"


@pytest.mark.slow
def test_killed_round_resumes_to_identical_result(sft_run, tmp_path) -> None:
    """SIGKILL a round right after its first checkpoint lands; the retry must end exactly where an
    uninterrupted run ends (same metrics, same weights)."""
    cfg = {**ROUND, "steps": 16, "checkpoint_every": 4, "seed": 3}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    clean = _copy_run(sft_run, tmp_path / "clean")
    killed = _copy_run(sft_run, tmp_path / "killed")

    out = subprocess.run(_round_cmd(clean, cfg), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = stage.parse_result(out.stdout)

    proc = subprocess.Popen(
        _round_cmd(killed, cfg), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    first_ckpt = Path(killed[len("file://") :]) / "rl_round_1" / "checkpoints" / "step-00000004" / "manifest.json"
    deadline = time.monotonic() + 240
    while not first_ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first_ckpt.exists() and proc.returncode == -signal.SIGKILL, "the round finished before it was killed"
    assert storage.read_manifest(storage.join(killed, "rl_round_1")) is None

    out = subprocess.run(_round_cmd(killed, cfg), env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    retried = stage.parse_result(out.stdout)
    assert retried["summary"]["resumed_from"] >= 4
    for key in ("holdout_before", "holdout_after", "final_train_metrics"):
        assert retried["summary"][key] == expected["summary"][key], key
    a = models.load_model(storage.join(clean, "rl_round_1"), "model")[0].state_dict()
    b = models.load_model(storage.join(killed, "rl_round_1"), "model")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    history = lambda uri: storage.read_json(
        storage.read_manifest(storage.join(uri, "rl_round_1")),  # noqa: E731
        "round_report.json",
    )["history"]
    assert history(killed) == history(clean)
