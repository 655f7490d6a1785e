"""The lean decode step (training.rollout.lean_decode) against the model's own forward, per architecture."""

from __future__ import annotations

import pytest
import torch

from training.modeling.kv_cache import cache_kwarg, cache_of
from training.rollout.hf import HFRolloutEngine
from training.rollout.lean_decode import GPT2LeanDecoder, LeanDecoder, lean_decoder


def build(kind: str, **extra):
    import transformers

    if kind == "gpt2":  # the tiny profile's architecture (training/modeling/models.py), dropout on as it trains
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(
            transformers.GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=256, **extra)
        ).eval()

    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        **extra,
    )
    config = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "llama3-rope": lambda: transformers.LlamaConfig(
            **common,
            attention_bias=True,
            mlp_bias=True,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=24),
        "mistral": lambda: transformers.MistralConfig(**{"sliding_window": None, **common}),
    }[kind]()
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "apart"])
@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "qwen2", "qwen3", "mistral", "gpt2"])
def test_steps_give_the_model_s_logits_with_padding_and_dropped_rows(kind: str, fuse: bool, monkeypatch) -> None:
    from training.rollout import lean_decode

    if kind == "gpt2" and not fuse:
        pytest.skip("GPT-2's q/k/v projection is one module already: nothing to fuse or keep apart")
    if not fuse:  # a model above the size where q/k/v are concatenated
        monkeypatch.setattr(lean_decode, "FUSE_MAX_BYTES", 0)
    model = build(kind)
    assert (GPT2LeanDecoder if kind == "gpt2" else LeanDecoder).supports(model, 64)
    A, P = 5, 7
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 97, (A, P), generator=g)
    attn = torch.ones(A, P, dtype=torch.long)
    attn[0, :3] = 0  # left padding, as the rollout lays prompts out
    attn[3, :1] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    kw = cache_kwarg(model)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        past = cache_of(out)
        lean = lean_decoder(model, past, attn, 12)
        assert lean is not None and isinstance(lean, GPT2LeanDecoder) == (kind == "gpt2")
        assert all((f is not None) == fuse for f in lean.fused)
        nxt, npos = torch.randint(3, 97, (A,), generator=g), pos[:, -1] + 1
        for t in range(6):
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            ref = model(
                input_ids=nxt[:, None], attention_mask=attn, position_ids=npos[:, None], use_cache=True, **{kw: past}
            )
            past = cache_of(ref)
            got = lean.step(nxt, npos)
            assert got.shape == (nxt.shape[0], 97)
            torch.testing.assert_close(got, ref.logits[:, -1], atol=2e-5, rtol=1e-4)
            nxt, npos = ref.logits[:, -1].argmax(-1), npos + 1
            if t == 2:  # rows 1 and 3 finish: both sides keep the same rows
                keep = torch.tensor([0, 2, 4])
                lean.keep(keep)
                nxt, npos, attn = nxt[keep], npos[keep], attn[keep]
                for layer in past.layers:
                    layer.keys, layer.values = layer.keys[keep], layer.values[keep]


def test_the_buffers_refuse_a_step_past_their_room() -> None:
    model = build("qwen2")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True)
        lean = LeanDecoder.from_cache(model, cache_of(out), torch.ones(1, 3, dtype=torch.bool), 1)
        lean.step(torch.tensor([8]), torch.tensor([3]))
        with pytest.raises(RuntimeError, match="full"):
            lean.step(torch.tensor([9]), torch.tensor([4]))


def test_models_it_does_not_know_keep_their_own_forward() -> None:
    from peft import LoraConfig, get_peft_model

    assert not LeanDecoder.supports(build("gpt2")) and not GPT2LeanDecoder.supports(build("qwen2"))
    assert not GPT2LeanDecoder.supports(build("gpt2", scale_attn_by_inverse_layer_idx=True))
    assert not GPT2LeanDecoder.supports(build("gpt2"), 257)  # past its learned positions
    assert not GPT2LeanDecoder.supports(get_peft_model(build("gpt2"), LoraConfig(r=4, target_modules=["c_attn"])))
    lora = get_peft_model(build("qwen2"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert not LeanDecoder.supports(lora)
    assert not LeanDecoder.supports(lora.get_base_model())  # LoRA layers replaced the plain projections
    dynamic = build("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not LeanDecoder.supports(dynamic)  # its rotary frequencies change with the length
    windowed = build("mistral", sliding_window=16)
    assert LeanDecoder.supports(windowed, 16) and not LeanDecoder.supports(windowed, 17)
    windowed.config.layer_types = ["full_attention"] * 2  # Mistral's modelling ignores layer_types
    assert not LeanDecoder.supports(windowed, 17)
    qwen_window = build("qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=0)
    assert not LeanDecoder.supports(qwen_window, 17)
    assert LeanDecoder.supports(build("qwen2", sliding_window=16), 17)  # the window off (Qwen2.5's configs)
    dispatched = build("qwen2")
    dispatched.hf_device_map = {"": "cpu"}  # loaded with device_map: accelerate's hooks own the weights
    assert not LeanDecoder.supports(dispatched)
    meta = build("qwen2")
    meta.lm_head.weight = torch.nn.Parameter(torch.empty_like(meta.lm_head.weight, device="meta"))
    assert not LeanDecoder.supports(meta)


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_engine_greedy_and_sampled_rollouts_match_the_model_s_own_forward(kind: str) -> None:
    """The rollout engine with and without the lean steps: the same tokens (greedy and seeded sampling), the same
    log-probs to float rounding, stop ids honoured, on a Qwen2 model with GQA and q/k/v biases and on GPT-2."""
    from types import SimpleNamespace

    model = build(kind)
    tok = SimpleNamespace(
        pad_token_id=0, eos_token_id=1, decode=lambda ids, skip_special_tokens=True: " ".join(map(str, ids))
    )
    prompts = [[5, 9, 14, 3], [7, 8], [20, 21, 22, 23, 24, 25]]
    runs = {}
    for lean in (True, False):
        engine = HFRolloutEngine(model, tok, batch_size=8, stop_ids=[1, 2], lean=lean)
        runs[lean] = (
            engine.generate(prompts, 3, 20, temperature=0.0),
            engine.generate(prompts, 3, 20, temperature=1.0, seed=4),
        )
    for fast_groups, plain_groups in zip(runs[True], runs[False]):
        for fast, plain in zip(sum(fast_groups, []), sum(plain_groups, [])):
            assert fast.token_ids == plain.token_ids
            assert fast.finish_reason == plain.finish_reason
            torch.testing.assert_close(torch.tensor(fast.logprobs), torch.tensor(plain.logprobs), atol=1e-4, rtol=1e-4)
    sampled = [c for g in runs[True][1] for c in g]
    assert len({tuple(c.token_ids) for c in sampled}) > 1  # sampling, not one repeated answer
