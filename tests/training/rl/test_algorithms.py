"""The maths of training/rl/algorithms.py against numbers computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from training.rl import algorithms as A


def close(x: torch.Tensor, expected) -> None:
    torch.testing.assert_close(x, torch.tensor(expected, dtype=x.dtype), atol=1e-5, rtol=1e-5)


def test_group_advantages_with_std() -> None:
    # group [1, 0, 0, 1]: mean 0.5, deviations [.5, -.5, -.5, .5]
    # unbiased var = (4 * 0.25) / 3 = 1/3, std = 0.577350; .5 / .577350 = 0.866025
    # group [1, 0, 0, 0]: mean .25, deviations [.75, -.25, -.25, -.25]
    # var = (.5625 + 3 * .0625) / 3 = .25, std = .5 -> [1.5, -.5, -.5, -.5]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    close(
        A.group_advantages(rewards, normalize_std=True, eps=0.0),
        [[0.866025, -0.866025, -0.866025, 0.866025], [1.5, -0.5, -0.5, -0.5]],
    )


def test_group_advantages_without_std_and_uniform_group() -> None:
    # Dr. GRPO: only the mean is subtracted: [1,0,0,0] - .25 = [.75, -.25, -.25, -.25]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    close(A.group_advantages(rewards, normalize_std=False), [[0.75, -0.25, -0.25, -0.25], [0, 0, 0, 0]])
    # a uniform group has std 0: 0 / (0 + eps) = 0, never NaN
    close(A.group_advantages(rewards, normalize_std=True)[1], [0, 0, 0, 0])
    close(A.get_advantage("dr_grpo")(rewards), [[0.75, -0.25, -0.25, -0.25], [0, 0, 0, 0]])


def test_drop_zero_variance_groups() -> None:
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.0]])
    assert A.drop_zero_variance_groups(rewards).tolist() == [1, 3]
    assert A.zero_variance_groups(rewards).tolist() == [True, False, True, False]


def test_kl_estimators() -> None:
    # p(x) = .5 (policy), q(x) = .25 (reference)
    # k1 = log p - log q = log 2 = 0.693147
    # k2 = (log 2)^2 / 2 = 0.240227
    # k3: r = log q - log p = -log 2; e^r - 1 - r = .5 - 1 + .693147 = 0.193147
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    close(A.kl_k1(logp, ref), [[0.693147]])
    close(A.kl_k2(logp, ref), [[0.240227]])
    close(A.kl_k3(logp, ref), [[0.193147]])
    close(A.get_kl("k3")(logp, logp), [[0.0]])  # identical policies: 1 - 1 - 0 = 0


def test_clipped_policy_loss_per_token_cases() -> None:
    # one token per sequence, old logp = 0, so ratio = exp(logp); clip range [0.8, 1.2]
    # ratio 1.5, A=+1: min(1.5, 1.2) = 1.2            -> loss -1.2  (clipped)
    # ratio 1.5, A=-1: min(-1.5, -1.2) = -1.5         -> loss  1.5  (not clipped)
    # ratio 0.5, A=+1: min(0.5, 0.8) = 0.5            -> loss -0.5  (not clipped)
    # ratio 0.5, A=-1: min(-0.5, -0.8) = -0.8         -> loss  0.8  (clipped)
    ratios = torch.tensor([[1.5], [1.5], [0.5], [0.5]])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4, 1)
    expected = [-1.2, 1.5, -0.5, 0.8]
    for i in range(4):
        loss, stats = A.clipped_policy_loss(
            torch.log(ratios[i : i + 1]),
            torch.zeros(1, 1),
            adv[i : i + 1],
            mask[i : i + 1],
            clip_low=0.2,
            clip_high=0.2,
        )
        assert loss.item() == pytest.approx(expected[i], abs=1e-6)
        assert stats["clip_frac"].item() == (1.0 if i in (0, 3) else 0.0)
    # all four at once, token-mean: (-1.2 + 1.5 - .5 + .8) / 4 = 0.15
    loss, stats = A.clipped_policy_loss(torch.log(ratios), torch.zeros(4, 1), adv, mask)
    assert loss.item() == pytest.approx(0.15, abs=1e-6) and stats["clip_frac"].item() == 0.5


def test_clip_higher_and_gradients() -> None:
    # clip_high = .28: ratio 1.25, A=+1 is inside [0.8, 1.28] -> loss -1.25, gradient d(-r)/dlogp = -r = -1.25
    logp = torch.log(torch.tensor([[1.25]])).requires_grad_(True)
    loss, _ = A.clipped_policy_loss(
        logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.25) and logp.grad.item() == pytest.approx(-1.25)
    # with clip_high = .2 the same token is clipped: loss -1.2 and no gradient
    logp = torch.log(torch.tensor([[1.25]])).requires_grad_(True)
    loss, _ = A.clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    loss.backward()
    assert loss.item() == pytest.approx(-1.2) and logp.grad.item() == 0.0


def test_aggregation_modes() -> None:
    # seq 1: token losses [1, 2, 3] all real; seq 2: [4, 9, 9] with only the first real
    # token-mean:          (1 + 2 + 3 + 4) / 4 = 2.5
    # seq-mean-token-mean: mean(6/3, 4/1) = mean(2, 4) = 3
    # seq-mean-token-sum:  mean(6, 4) = 5
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert A.aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(2.5)
    assert A.aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert A.aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(5.0)
    with pytest.raises(ValueError, match="token-mean"):
        A.aggregate_loss(loss, mask, "mean")
    assert A.masked_mean(loss, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN


def test_grpo_loss_adds_beta_times_kl() -> None:
    # on-policy (ratio 1), A = 1: pg = -1; KL k3 of p=.5 vs q=.25 = 0.193147; beta .1 -> -1 + .0193147
    logp = torch.log(torch.tensor([[0.5]]))
    loss, stats = A.grpo_loss(
        logp, logp, torch.log(torch.tensor([[0.25]])), torch.tensor([1.0]), torch.ones(1, 1), beta=0.1
    )
    assert loss.item() == pytest.approx(-1 + 0.1 * 0.193147, abs=1e-6)
    assert stats["kl_ref"].item() == pytest.approx(0.193147, abs=1e-6)
    assert stats["pg_loss"].item() == pytest.approx(-1.0)


def test_token_logprobs() -> None:
    # logits [0, log 3] -> softmax [1/4, 3/4]; at temperature 2: logits [0, log 3 / 2] -> [1/(1+√3), √3/(1+√3)]
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    close(A.token_logprobs(logits, torch.tensor([[1]])), [[math.log(0.75)]])
    close(A.token_logprobs(logits, torch.tensor([[0]]), temperature=2.0), [[math.log(1 / (1 + math.sqrt(3)))]])


def test_registry_refuses_conflicting_registration() -> None:
    with pytest.raises(ValueError, match="already registered"):

        @A.register_advantage("grpo")
        def other(rewards, normalize_std=True, eps=1e-6):  # noqa: ARG001
            return rewards

    assert A.get_advantage("grpo") is A.group_advantages
    A.register_advantage("grpo")(A.group_advantages)  # the same function again is fine (module reloads)
    with pytest.raises(ValueError, match="registered: dr_grpo, grpo"):
        A.get_advantage("ppo")


# ----- RLOO, REINFORCE++, GSPO, CISPO ---------------------------------------------------------------------------
def test_rloo_leaves_each_sample_out_of_its_baseline() -> None:
    # [1, 0, 0, 1]: the others' mean is 1/3 for a 1 and 2/3 for a 0 -> [2/3, -2/3, -2/3, 2/3]
    # [.5, 1, 0]: others' means .5, .25, .75 -> [0, .75, -.75]; = G/(G-1) (r - mean) = 1.5 * [0, .5, -.5]
    close(A.leave_one_out_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]])), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]])
    close(A.leave_one_out_advantages(torch.tensor([[0.5, 1.0, 0.0]])), [[0.0, 0.75, -0.75]])
    assert A.get_advantage("rloo") is A.leave_one_out_advantages
    with pytest.raises(ValueError, match="at least 2"):
        A.leave_one_out_advantages(torch.tensor([[1.0]]))


def test_reinforce_pp_normalises_over_the_whole_batch() -> None:
    # [[1, 0], [1, 1]]: centred on the group means [[.5, -.5], [0, 0]]; over the batch mean 0, unbiased
    # std sqrt((.25 + .25) / 3) = 0.408248 -> [[1.224745, -1.224745], [0, 0]] (GRPO's per-group division: +-0.7071)
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    close(A.reinforce_pp_advantages(rewards, eps=0.0), [[1.224745, -1.224745], [0.0, 0.0]])
    close(A.group_advantages(rewards, eps=0.0)[0], [0.707107, -0.707107])
    # a group whose rewards barely differ keeps small advantages (GRPO would scale them to unit size)
    near = torch.tensor([[1.0, 0.0], [0.51, 0.49]])
    assert A.reinforce_pp_advantages(near)[1].abs().max() < 0.03 < A.group_advantages(near)[1].abs().max()


def _gspo_inputs() -> tuple[torch.Tensor, ...]:
    # sequence 0: token ratios 2 and 1/2, geometric mean 1; sequence 1: one real token, ratio 2 (then padding)
    logp = torch.tensor([[math.log(0.5), math.log(0.5)], [math.log(0.2), 0.0]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(1.0)], [math.log(0.1), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return logp, old, torch.tensor([1.0, 1.0]), mask


def test_gspo_clips_the_sequence_ratio() -> None:
    logp, old, adv, mask = _gspo_inputs()
    # clip (.2, .2): s0 = 1 -> loss -1 on both its tokens; s1 = 2 clipped to 1.2 (A > 0) -> -1.2
    # token mean: (-1 - 1 - 1.2) / 3 = -1.066667; sequence mean: (-1 - 1.2) / 2 = -1.1
    loss, stats = A.sequence_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg="token-mean")
    close(loss, -3.2 / 3)
    close(stats["clip_frac"], 1 / 3)  # sequence 1's one token
    loss, _ = A.sequence_policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg="seq-mean-token-mean")
    close(loss, -1.1)
    # gradient (sequence mean): d(-s0 / 2)/d logp_0,t = -(1/2) * s0 * (1/2) = -0.25 on each of sequence 0's
    # tokens; sequence 1 is clipped, so 0
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[-0.25, -0.25], [0.0, 0.0]])
    # the paper's range (3e-4, 4e-4) clips s0 = 1 nowhere and s1 = 2 to 1.0004
    loss, _ = A.sequence_policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    close(loss, -(1.0 + 1.0004) / 2)


def test_cispo_weights_the_log_probability_by_the_clipped_ratio() -> None:
    # ratios 2 and 1 -> clipped weights 1.2 and 1; A = 2
    # losses -1.2 * 2 * ln .5 = 1.663553 and -1 * 2 * ln .3 = 2.407946; token mean 2.035750
    logp = torch.tensor([[math.log(0.5), math.log(0.3)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.3)]])
    mask = torch.ones(1, 2)
    loss, stats = A.clipped_weight_policy_loss(logp, old, torch.tensor([2.0]), mask, clip_low=0.2, clip_high=0.2)
    close(loss, 2.035750)
    close(stats["clip_frac"], 0.5)
    # the weight is a constant: d loss / d logp_t = -w_t * A / 2 -> [-1.2, -1.0]; the clipped token still counts
    (grad,) = torch.autograd.grad(loss, logp)
    close(grad, [[-1.2, -1.0]])
    # PPO's clip zeroes the first token's gradient instead (ratio 2 > 1.2 with A > 0)
    (ppo,) = torch.autograd.grad(A.clipped_policy_loss(logp, old, torch.tensor([2.0]), mask)[0], logp)
    assert ppo[0, 0] == 0 and ppo[0, 1] != 0
    # clip_low >= 1 leaves the lower side open (MiniMax-M1): a ratio of .5 keeps its weight
    low = torch.tensor([[math.log(0.25)]], requires_grad=True)
    _, st = A.clipped_weight_policy_loss(
        low, torch.tensor([[math.log(0.5)]]), torch.tensor([1.0]), torch.ones(1, 1), 1.0, 0.2
    )
    close(st["clip_frac"], 0.0)


def test_every_objective_is_registered_and_reaches_grpo_loss() -> None:
    assert set(A.ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "reinforce_pp"}
    assert set(A.POLICY_LOSSES) == {"clip", "gspo", "cispo"}
    logp, old, adv, mask = _gspo_inputs()
    for name in A.POLICY_LOSSES:
        loss, stats = A.grpo_loss(logp, old, old, adv, mask, beta=0.1, policy_loss=name)
        assert torch.isfinite(loss) and {"pg_loss", "kl_ref", "clip_frac", "approx_kl_old"} <= set(stats)
