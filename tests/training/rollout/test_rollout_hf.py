"""The transformers rollout engine: shapes, seeded determinism, logprobs equal to a training forward pass."""

from __future__ import annotations

import importlib

import pytest
import torch

from training.rl.grpo_batches import build_batch, completion_logprobs
from training.rollout import Completion, RolloutEngine, make_engine

PROMPTS = ["Q: 12+3=? A:", "Extract age as JSON: Bob is 31.", "Q: 7+8=? A:"]


@pytest.fixture(params=["loop", "generate"])
def engine(tiny_model, request):
    model, tok = tiny_model
    return make_engine("hf", model, tok, impl=request.param)


def test_decode_loop_equals_transformers_generate(tiny_model) -> None:
    model, tok = tiny_model
    loop = make_engine("hf", model, tok, impl="loop").generate(PROMPTS, 1, 8, temperature=0.0)
    gen = make_engine("hf", model, tok, impl="generate").generate(PROMPTS, 1, 8, temperature=0.0)
    for a, b in zip(loop, gen):
        assert a[0].token_ids == b[0].token_ids and a[0].text == b[0].text
        torch.testing.assert_close(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4, rtol=1e-4)


def test_top_p_keeps_the_nucleus() -> None:
    from training.rollout.hf import _top_p

    # probs [.5, .3, .15, .05]: top_p .7 keeps .5 and .3 (cumulative .5 < .7, then .8 >= .7), drops the rest
    logp = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    kept = torch.isfinite(_top_p(logp, 0.7))
    assert kept.tolist() == [[False, True, False, True]]
    assert torch.equal(_top_p(logp, 1.0), logp)


def test_shapes(engine) -> None:
    assert isinstance(engine, RolloutEngine)
    out = engine.generate(PROMPTS, n_samples=4, max_new_tokens=6, temperature=1.0, seed=1)
    assert len(out) == 3 and all(len(g) == 4 for g in out)
    for group in out:
        for c in group:
            assert isinstance(c, Completion) and 1 <= len(c.token_ids) <= 6
            assert len(c.logprobs) == len(c.token_ids) and all(lp <= 0 for lp in c.logprobs)
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == engine.tokenizer.eos_token_id)
            assert engine.tokenizer.pad_token_id not in c.token_ids


def test_seeded_and_leaves_global_rng_alone(engine) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = engine.generate(PROMPTS, 3, 6, temperature=1.0, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = engine.generate(PROMPTS, 3, 6, temperature=1.0, seed=7)
    c = engine.generate(PROMPTS, 3, 6, temperature=1.0, seed=8)
    ids = lambda out: [[x.token_ids for x in g] for g in out]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)


def test_batching_does_not_change_greedy(tiny_model) -> None:
    model, tok = tiny_model
    whole = make_engine("hf", model, tok).generate(PROMPTS, 2, 6, temperature=0.0)
    split = make_engine("hf", model, tok, batch_size=1).generate(PROMPTS, 2, 6, temperature=0.0)
    assert [[x.token_ids for x in g] for g in whole] == [[x.token_ids for x in g] for g in split]
    assert all(g[0].token_ids == g[1].token_ids for g in whole)  # greedy: samples agree


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_forward_pass(engine, temperature) -> None:
    out = engine.generate(PROMPTS, 2, 6, temperature=temperature, seed=3)
    comps = [c for g in out for c in g]
    prompts = [p for p in PROMPTS for _ in range(2)]
    batch = build_batch(engine.tokenizer, prompts, comps, torch.zeros(len(comps)), torch.device("cpu"))
    with torch.no_grad():
        logp = completion_logprobs(engine.model, batch, temperature)  # (N, L)
    for i, c in enumerate(comps):
        torch.testing.assert_close(logp[i, : len(c.token_ids)], torch.tensor(c.logprobs), atol=1e-4, rtol=1e-4)


def test_update_weights_from_state_dict_and_folder(tiny_model, tmp_path) -> None:
    import copy

    from training.modeling import models

    model, tok = tiny_model
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(0.5)
    eng = make_engine("hf", copy.deepcopy(model), tok)
    eng.update_weights(clone.state_dict())
    assert torch.equal(eng.model.transformer.wte.weight, clone.transformer.wte.weight)
    models.save_checkpoint(model, tok, tmp_path / "m")
    eng.update_weights(tmp_path / "m")
    assert torch.equal(eng.model.transformer.wte.weight, model.transformer.wte.weight)


def test_vllm_module_imports_without_vllm() -> None:
    mod = importlib.import_module("training.rollout.vllm")
    assert hasattr(mod, "VLLMRolloutEngine")
    if not mod.HAVE_VLLM:
        with pytest.raises(RuntimeError, match="vllm"):
            mod.VLLMRolloutEngine("/nonexistent", None)


def test_shared_prompt_logprobs_equal_plain_forward(engine) -> None:
    """Computing each prompt once and repeating its KV cache for the group gives the plain forward's
    log-probs, and the same gradients."""
    out = engine.generate(PROMPTS, 3, 6, temperature=1.0, seed=5)
    comps = [c for g in out for c in g]
    prompts = [p for p in PROMPTS for _ in range(3)]
    adv = torch.randn(len(comps))
    plain = build_batch(engine.tokenizer, prompts, comps, adv, torch.device("cpu"))
    grouped = build_batch(engine.tokenizer, prompts, comps, adv, torch.device("cpu"), group_size=3)
    model = engine.model
    a = completion_logprobs(model, plain, 1.0)
    b = completion_logprobs(model, grouped, 1.0)
    mask = plain.completion_mask.bool()
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)
    ga = torch.autograd.grad((a * plain.completion_mask).sum(), list(model.parameters()))
    gb = torch.autograd.grad((b * grouped.completion_mask).sum(), list(model.parameters()))
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


def test_loop_shares_the_prefill_and_still_equals_generate(tiny_model) -> None:
    """The loop prefills each prompt once for all its samples; greedy samples equal transformers' generate,
    which prefills every sample."""
    model, tok = tiny_model
    loop = make_engine("hf", model, tok, impl="loop", batch_size=4).generate(PROMPTS, 2, 8, temperature=0.0)
    gen = make_engine("hf", model, tok, impl="generate").generate(PROMPTS, 2, 8, temperature=0.0)
    for a, b in zip(loop, gen):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)


def test_inverse_cdf_sampling_matches_the_distribution() -> None:
    from training.rollout.hf import _sample, _top_p

    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = _sample(probs.log().repeat(100_000, 1))  # (100000,)
    freq = torch.bincount(draws, minlength=4).float() / len(draws)
    # binomial sd at p=.6, n=1e5 is .0015: 5 sd
    torch.testing.assert_close(freq, probs, atol=0.008, rtol=0.0)
    assert int((draws == 1).sum()) == 0  # a zero-probability token is never drawn
    nucleus = _top_p(torch.tensor([0.5, 0.3, 0.15, 0.05]).log().repeat(20_000, 1), 0.7)
    assert set(_sample(nucleus).unique().tolist()) == {0, 1}


def test_reserved_cache_gives_the_concatenating_cache_s_logits_exactly(tiny_model) -> None:
    import copy

    from training.modeling.kv_cache import cache_kwarg, cache_of, reserve_cache, select_cache_rows

    model, _ = tiny_model
    torch.manual_seed(0)
    ids = torch.randint(5, 290, (4, 9))  # (B, P)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0  # a left-padded prompt
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    kw = cache_kwarg(model)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        plain = cache_of(out)
        reserved = copy.deepcopy(plain)
        assert reserve_cache(reserved, 3)
        assert not reserve_cache(object(), 3)  # an unknown layout is left alone
        next_pos = pos[:, -1] + 1
        for t in range(6):  # a row dropped at step 2; steps 3.. run past the reservation of 3 tokens
            tok = torch.randint(5, 290, (attn.shape[0], 1))
            if t == 2:
                keep = torch.tensor([0, 2, 3])
                assert select_cache_rows(plain, keep) and select_cache_rows(reserved, keep)
                attn, next_pos, tok = attn[keep], next_pos[keep], tok[keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            a = model(input_ids=tok, attention_mask=attn, position_ids=next_pos[:, None], use_cache=True, **{kw: plain})
            b = model(
                input_ids=tok, attention_mask=attn, position_ids=next_pos[:, None], use_cache=True, **{kw: reserved}
            )
            plain, reserved, next_pos = cache_of(a), cache_of(b), next_pos + 1
            assert torch.equal(a.logits, b.logits), t
            assert torch.equal(plain.layers[0].keys, reserved.layers[0].keys), t
