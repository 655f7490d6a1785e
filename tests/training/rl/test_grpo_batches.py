"""The update's batch layouts: packed groups by hand, and packed = padded = plain forward (values and gradients)."""

from __future__ import annotations

import copy

import pytest
import torch

from training.rl.config import GRPOConfig
from training.rl.grpo_batches import PackedGroups, build_batch, completion_logprobs, micro_batches, pack_groups
from training.rl.update import policy_update
from training.rollout import make_engine

PROMPTS = ["Q: 12+3=? A:", "Extract age as JSON: Bob is 31.", "Q: 7+8=? A:"]


def test_pack_groups_layout_by_hand() -> None:
    # one group: prompt [5, 6], completions [7, 8] and [9]; pad 0
    b = pack_groups([[5, 6]], [[[7, 8], [9]]], torch.tensor([1.0, -1.0]), pad=0, device=torch.device("cpu"))
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 2]]  # the second completion restarts after the prompt
    assert b.row_of.tolist() == [0, 0]
    # token 7 and token 9 are predicted by the prompt's last position (1); token 8 by position 2 (token 7)
    assert b.predictor.tolist() == [[1, 2], [1, 0]]
    assert b.completion_ids.tolist() == [[7, 8], [9, 0]] and b.completion_mask.tolist() == [[1, 1], [1, 0]]
    allowed = (b.attention_mask[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ]  # 9 sees the prompt and itself, not the other completion


def test_pack_groups_pads_rows_and_lets_padding_attend_to_itself() -> None:
    b = pack_groups([[5], [6, 6]], [[[7], [8]], [[9], [9]]], torch.zeros(4), pad=0, device=torch.device("cpu"))
    assert b.input_ids.tolist() == [[5, 7, 8, 0], [6, 6, 9, 9]]
    assert b.row_of.tolist() == [0, 0, 1, 1]
    assert (b.attention_mask[0, 0, 3] == 0).int().tolist() == [0, 0, 0, 1]  # no all-masked query row


def _rollouts(engine, n: int = 3):
    groups = engine.generate(PROMPTS, n, 8, temperature=1.0, seed=5)
    return groups, [c for g in groups for c in g], [p for p in PROMPTS for _ in range(n)]


@pytest.fixture
def engine(tiny_model):
    model, tok = tiny_model
    return make_engine("hf", model, tok)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_and_gradients_equal_the_plain_forward(engine, temperature) -> None:
    groups, comps, prompts = _rollouts(engine)
    tok, model = engine.tokenizer, engine.model
    plain = build_batch(tok, prompts, comps, torch.zeros(len(comps)), torch.device("cpu"))
    prompt_ids = tok(PROMPTS, add_special_tokens=False)["input_ids"]
    packed = pack_groups(
        prompt_ids,
        [[c.token_ids for c in g] for g in groups],
        torch.zeros(len(comps)),
        tok.pad_token_id,
        torch.device("cpu"),
    )
    a = completion_logprobs(model, plain, temperature)  # (N, L)
    b = completion_logprobs(model, packed, temperature)  # (N, L')
    assert torch.equal(plain.completion_mask[:, : b.shape[1]], packed.completion_mask)
    mask = packed.completion_mask.bool()
    torch.testing.assert_close(a[:, : b.shape[1]][mask], b[mask], atol=1e-5, rtol=1e-5)
    ga = torch.autograd.grad((a * plain.completion_mask).sum(), list(model.parameters()))
    gb = torch.autograd.grad((b * packed.completion_mask).sum(), list(model.parameters()))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


def test_update_is_the_same_packed_or_padded(engine) -> None:
    """One optimizer step from the same weights: packed and padded micro-batches (different splits and orders)
    give the same loss statistics and the same new weights."""
    groups, comps, _ = _rollouts(engine, n=4)
    adv = torch.randn(len(comps))
    results = []
    for packed in (True, False):
        model = copy.deepcopy(engine.model).train()
        ref = copy.deepcopy(engine.model).eval().requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        chunks = micro_batches(engine.tokenizer, PROMPTS, groups, adv, torch.device("cpu"), size=8, packed=packed)
        assert all(isinstance(c, PackedGroups) == packed for c in chunks)
        assert sum(c.completion_mask.shape[0] for c in chunks) == len(comps)
        stats = policy_update(model, ref, opt, chunks, GRPOConfig(beta=0.05, updates_per_batch=1))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (s1, w1), (s2, w2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-5) and s1["grad_norm"] == pytest.approx(
        s2["grad_norm"], rel=1e-4
    )
    for x, y in zip(w1, w2):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)


def test_packed_layout_only_for_attention_that_takes_a_4d_mask(tiny_model) -> None:
    from training.rl.grpo_batches import takes_4d_mask

    model, _ = tiny_model
    assert takes_4d_mask(model)  # sdpa
    model.config._attn_implementation = "flash_attention_2"
    try:
        assert not takes_4d_mask(model)
    finally:
        model.config._attn_implementation = "sdpa"


def test_packing_pays_only_when_completions_differ_in_length() -> None:
    from training.rl.grpo_batches import packing_pays

    pair = 0.0005  # ~ a 5M-parameter Qwen2: attention per (query, key) pair vs one token through the model
    # RL-typical spread (one long completion, many short): packing avoids padding every row to the longest
    assert packing_pays([40], [[200, 10, 12, 8, 15, 9, 11, 10]], pair)
    # every completion at the cap: nothing to save, and the packed row's attention is (P + G*L)^2
    assert not packing_pays([40], [[512] * 8], pair)
    # attention free (pair cost 0): packing is never worse, the prompt runs once either way
    assert packing_pays([40], [[512] * 8], 0.0)


def test_micro_batches_choose_the_cheaper_layout(engine) -> None:
    from training.rl.grpo_batches import attention_pair_cost

    model = engine.model
    assert attention_pair_cost(model) > 0
    groups = engine.generate(PROMPTS[:2], n_samples=2, max_new_tokens=6, temperature=1.0, seed=0)
    adv = torch.zeros(4)
    packed = micro_batches(engine.tokenizer, PROMPTS[:2], groups, adv, torch.device("cpu"), size=0, packed=True)
    assert all(isinstance(c, PackedGroups) for c in packed)  # pair_cost 0: always packed, as before
    padded = micro_batches(
        engine.tokenizer, PROMPTS[:2], groups, adv, torch.device("cpu"), size=0, packed=True, pair_cost=1e6
    )  # attention dearer than anything: the padded layout
    assert not any(isinstance(c, PackedGroups) for c in padded)
    assert torch.equal(packed[0].completion_mask, padded[0].completion_mask)  # same groups, same order
    with torch.no_grad():
        a, b = (completion_logprobs(model, c[0], 1.0) for c in (packed, padded))
    mask = padded[0].completion_mask.bool()
    assert torch.allclose(a[mask], b[mask], atol=1e-5)


def test_tiny_profile_packs_every_micro_batch_and_the_default_packs_where_cheaper() -> None:
    from training.config import from_dict
    from training.profiles import preset
    from training.rl.config import GRPOConfig

    # the tiny profile's lift figures were measured with every micro-batch packed: its update keeps that layout
    assert from_dict(GRPOConfig, preset("tiny", "rl_round_1")).pack_where_cheaper is False
    assert GRPOConfig().pack_where_cheaper is True
    # and the full log-softmax: the chunked head's float rounding moves the tiny run's figures too
    from training.stages.sft import SFTConfig

    assert from_dict(GRPOConfig, preset("tiny", "rl_round_1")).logprob_chunk_tokens == 0
    assert from_dict(SFTConfig, preset("tiny", "sft")).logprob_chunk_tokens == 0
    assert GRPOConfig().logprob_chunk_tokens > 0 and SFTConfig().logprob_chunk_tokens > 0


def test_token_budget_plan_by_hand() -> None:
    from training.rl.grpo_batches import token_budget_plan

    # packed, budget 12: group 0 (prompt 4; completions 3, 3, 5) is cut before the 5 (4+3+3+5 = 15 > 12), so
    # its rows are [0, 1] (10 tokens) and [2] (9); group 1 (prompt 2; 1, 1) is one row of 4.
    # Shortest first: [g1] (4), then g0's [2] (9): 2 rows x 9 = 18 > 12, a new micro-batch; then [0, 1] (10).
    plan = token_budget_plan([4, 2], [[3, 3, 5], [1, 1]], 12, packed=True)
    assert plan == [[(1, [0, 1])], [(0, [2])], [(0, [0, 1])]]
    # padded, budget 12: rows are one completion each (prompt + completion): 7, 7, 9 and 3, 3
    # shortest first: 3, 3 (2 x 3), then 7 (3 x 7 = 21 > 12: new), 7 (2 x 7 = 14 > 12: new), 9 (new)
    plan = token_budget_plan([4, 2], [[3, 3, 5], [1, 1]], 12, packed=False)
    assert plan == [[(1, [0]), (1, [1])], [(0, [0])], [(0, [1])], [(0, [2])]]
    # a row longer than the budget is never cut: it gets a micro-batch of its own
    assert token_budget_plan([4], [[30, 2]], 10, packed=True) == [[(0, [1])], [(0, [0])]]
    # padded rows are laid out as (longest prompt + longest completion): prompts 9 and 1, completions 1 and 9 are
    # 10 tokens each alone but 2 x (9 + 9) = 36 together
    assert len(token_budget_plan([9, 1], [[1], [9]], 30, packed=False)) == 2
    # a budget that holds everything: one micro-batch
    assert token_budget_plan([4, 2], [[3, 3, 5], [1, 1]], 1000, packed=True) == [[(1, [0, 1]), (0, [0, 1, 2])]]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("packed", [True, False])
def test_a_token_budget_split_gives_the_one_micro_batch_update(engine, packed: bool, loss_agg: str) -> None:
    """Groups split across micro-batches by a token budget: the same loss and new weights as one micro-batch."""
    groups, comps, _ = _rollouts(engine, n=4)
    adv = torch.randn(len(comps))
    results = []
    for budget in (0, 24):
        model = copy.deepcopy(engine.model).train()
        ref = copy.deepcopy(engine.model).eval().requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        chunks = micro_batches(
            engine.tokenizer, PROMPTS, groups, adv, torch.device("cpu"), size=0, packed=packed, max_tokens=budget
        )
        if budget:
            assert len(chunks) > len(PROMPTS)  # groups were split
            assert all(c.input_ids.numel() <= budget or c.completion_mask.shape[0] == 1 for c in chunks)
        assert sum(c.completion_mask.shape[0] for c in chunks) == len(comps)
        stats = policy_update(model, ref, opt, chunks, GRPOConfig(beta=0.05, loss_agg=loss_agg))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (s1, w1), (s2, w2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-6) and s1["grad_norm"] == pytest.approx(
        s2["grad_norm"], rel=1e-5
    )
    for x, y in zip(w1, w2):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)  # after Adam's normalisation
