"""Packed rows attended by segments (no (T, T) mask): the indices by hand, and on GPT-2 and Qwen2 the RL
log-probs, the SFT loss and every gradient equal the dense block mask's; a switched model's other calls are
transformers' SDPA; a model that cannot take segments keeps the mask, and a segments batch for it is refused."""

from __future__ import annotations

import logging

import pytest
import torch

from training.modeling import packed_attention
from training.modeling.packed_attention import build_segments, enable, takes_segments
from training.rl.grpo_batches import completion_logprobs, micro_batches, pack_groups, packing_pays
from training.stages.sft import Example, collate, pack, response_loss

CPU = torch.device("cpu")


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _qwen2(attn: str = "sdpa"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: the gathered keys keep their own head count
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    return _no_dropout(Qwen2ForCausalLM(config))


def _gpt2(attn: str = "sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=2, n_positions=256, attn_implementation=attn)
    return _no_dropout(GPT2LMHeadModel(config))


MODELS = {"gpt2": _gpt2, "qwen2": _qwen2}


def _groups(vocab: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    # uneven lengths, a one-token completion, rows of different lengths (the second row is padded)
    return [ids(4), ids(6)], [[ids(5), ids(2), ids(7)], [ids(3), ids(1), ids(2)]]


def _grads(model, value: torch.Tensor) -> list[torch.Tensor]:
    weights = torch.linspace(-1, 2, value.numel()).view_as(value)
    return list(torch.autograd.grad((value * weights).sum(), [p for p in model.parameters() if p.requires_grad]))


def test_gather_and_scatter_indices_by_hand() -> None:
    # row 0 (T = 6): prompt 0-1, completion a at 2-3, completion b at 4; row 1: prompt 0, completion at 1-2
    segs = build_segments([[([0, 1, 2, 3], [0, 1, 2, 3]), ([0, 1, 4], [4])], [([0, 1, 2], [0, 1, 2])]], T=6)
    # rows flattened: row 1 starts at 6; segments shorter than S = 4 repeat their last index
    assert segs.gather.tolist() == [[0, 1, 2, 3], [0, 1, 4, 4], [6, 7, 8, 8]]
    # position -> flattened segment output (segment i, slot j: i*4 + j); 12 = the zero row (row padding)
    assert segs.scatter.tolist() == [0, 1, 2, 3, 6, 12, 8, 9, 10, 12, 12, 12]


def test_pack_groups_by_segments_builds_no_square_mask() -> None:
    prompts, groups = [[1, 2], [3]], [[[4, 5], [6]], [[7, 8]]]
    batch = pack_groups(prompts, groups, torch.zeros(3), 0, CPU, attention="segments")
    dense = pack_groups(prompts, groups, torch.zeros(3), 0, CPU, attention="dense")
    assert batch.attention_mask.shape == (2, 1, 1, 1) and dense.attention_mask.shape == (2, 1, 5, 5)
    for name in ("input_ids", "position_ids", "row_of", "predictor", "completion_ids", "completion_mask"):
        assert torch.equal(getattr(batch, name), getattr(dense, name)), name
    assert batch.segments is not None
    # each completion's segment: the prompt, then the completion (row 0: [1 2 | 4 5 | 6], row 1: [3 | 7 8])
    assert batch.segments.gather.tolist() == [[0, 1, 2, 3], [0, 1, 4, 4], [5, 6, 7, 7]]
    # the prompt's outputs come from the group's first segment; row 1's last position is padding
    assert batch.segments.scatter.tolist() == [0, 1, 2, 3, 6, 8, 9, 10, 12, 12]
    with pytest.raises(ValueError, match="attention must be"):
        pack_groups(prompts, groups, torch.zeros(3), 0, CPU, attention="flex")


def test_the_probes_dense_mask_is_pack_groups_mask() -> None:
    # the probe's reference: the same rows as test_pack_groups_by_segments_builds_no_square_mask, by hand
    spans = [[([0, 1, 2, 3], [0, 1, 2, 3]), ([0, 1, 4], [4])], [([0, 1, 2], [0, 1, 2])]]
    dense = pack_groups([[1, 2], [3]], [[[4, 5], [6]], [[7, 8]]], torch.zeros(3), 0, CPU, attention="dense")
    assert torch.equal(packed_attention.dense_mask(spans, 5, torch.float32), dense.attention_mask)


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("chunk", [0, 4])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_rl_logprobs_and_gradients_equal_the_dense_mask(arch: str, chunk: int, checkpointing: bool) -> None:
    model = MODELS[arch]()
    if checkpointing:  # the backward recomputes each layer: the keyword has to reach attention again
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert enable(model) and takes_segments(model)
    prompts, groups = _groups(model.config.vocab_size)
    n = sum(len(g) for g in groups)
    dense = pack_groups(prompts, groups, torch.zeros(n), 0, CPU, attention="dense")
    segs = pack_groups(prompts, groups, torch.zeros(n), 0, CPU, attention="segments")
    want = completion_logprobs(model, dense, 0.8, chunk) * dense.completion_mask
    got = completion_logprobs(model, segs, 0.8, chunk) * segs.completion_mask
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(_grads(model, got), _grads(model, want)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("checkpointing", [False, True])
def test_sft_loss_and_gradients_equal_the_dense_mask(arch: str, checkpointing: bool) -> None:
    model = MODELS[arch]()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    assert enable(model)
    g = torch.Generator().manual_seed(5)
    examples = []
    for n in (5, 9, 3, 7, 4):
        ids = torch.randint(1, model.config.vocab_size, (n,), generator=g).tolist()
        examples.append(Example(ids, [0] * (n // 2) + [1] * (n - n // 2)))
    rows = pack(examples, 16, 0)
    assert any(len(r) > 1 for r in rows)  # packed rows, and the last one padded
    want, n_want = response_loss(model, collate(rows, 16, 0, "dense"))
    segs = collate(rows, 16, 0, "segments")
    assert segs.attention_mask.shape[-2:] == (1, 1)
    got, n_got = response_loss(model, segs)
    assert n_got == n_want
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for a, b in zip(_grads(model, got), _grads(model, want)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_a_switched_models_other_calls_are_plain_sdpa(arch: str) -> None:
    plain, switched = MODELS[arch]().eval(), MODELS[arch]().eval()
    assert enable(switched) and not takes_segments(plain)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6]])  # a left-padded row, as the padded layout has
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=mask).logits
        b = switched(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(a, b)
    out_a = plain.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    out_b = switched.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
    assert torch.equal(out_a, out_b)


def test_an_eager_model_keeps_the_mask_and_a_segments_batch_for_it_is_refused() -> None:
    model = _qwen2("eager")
    assert not enable(model) and packed_attention.implementation(model) == "eager"
    prompts, groups = _groups(model.config.vocab_size)
    segs = pack_groups(prompts, groups, torch.zeros(6), 0, CPU, attention="segments")
    with pytest.raises(ValueError, match="laid out by segments reached Qwen2ForCausalLM.*'eager'"):
        completion_logprobs(model, segs, 1.0)
    with pytest.raises(ValueError, match="SFT batch laid out by segments"):
        response_loss(model, collate([[Example([1, 2, 3], [0, 1, 1])]], 8, 0, "segments"))


def test_a_model_that_drops_the_keyword_fails_the_probe_and_keeps_sdpa(caplog: pytest.LogCaptureFixture) -> None:
    # No architecture here drops its keywords, so the fault is simulated: a forward that passes only the
    # named arguments on. Without the probe such a model would attend over the whole packed row, silently.
    model = _gpt2()
    inner = model.forward

    def forward(input_ids=None, attention_mask=None, position_ids=None, **_dropped):
        return inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)

    model.forward = forward
    with caplog.at_level(logging.WARNING, logger="training.modeling.packed_attention"):
        assert not enable(model)
    assert packed_attention.implementation(model) == "sdpa"
    assert "keeps the dense mask" in caplog.text and "placeholder mask reached attention" in caplog.text


def test_packing_pays_counts_each_segment_causally() -> None:
    # one group, prompt 10, 4 completions of 100 tokens, pair cost 0.01 (hand-computed, in token units):
    # padded: 10 + 0.01*100 + 4 * (100 + 0.01*100*110) = 11 + 840 = 851
    # dense-packed: T = 410, 410 + 0.01*410^2 = 2091 -> padded wins
    # segments: 410 + 0.01 * 4 * 110^2 / 2 = 410 + 242 = 652 -> packing wins
    assert not packing_pays([10], [[100] * 4], 0.01)
    assert packing_pays([10], [[100] * 4], 0.01, segments=True)


def test_micro_batches_lay_packed_batches_out_by_segments() -> None:
    from training.rollout import Completion

    class Tok:
        pad_token_id = 0

    groups = [[Completion(text="", token_ids=[5, 6, 7]), Completion(text="", token_ids=[8])]]
    out = micro_batches(Tok(), [[1, 2]], groups, torch.zeros(2), CPU, 0, attention="segments")
    assert len(out) == 1 and out[0].segments is not None and out[0].attention_mask.shape == (1, 1, 1, 1)


def test_the_round_uses_segments_only_where_policy_and_reference_take_them() -> None:
    from training.rl.config import GRPOConfig
    from training.rl.round import packed_layout_attention

    assert packed_layout_attention(GRPOConfig(), _gpt2(), _gpt2()) == "segments"
    assert packed_layout_attention(GRPOConfig(packed_attention="dense"), _gpt2(), _gpt2()) == "dense"
    assert packed_layout_attention(GRPOConfig(packed_groups=False), _gpt2(), None) == "dense"
    assert packed_layout_attention(GRPOConfig(), _gpt2(), _gpt2("eager")) == "dense"
    with pytest.raises(ValueError, match="packed_attention"):
        GRPOConfig(packed_attention="flex")


def test_a_saved_checkpoint_does_not_record_the_switch(tmp_path) -> None:
    import json

    model = _qwen2()
    assert enable(model)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert packed_attention.NAME not in json.dumps(saved)
