"""The chunked head: log-probs and gradients equal the full (T, V) log-softmax, by hand and on GPT-2 and Qwen2 in
every update layout (packed, padded, shared-prompt KV) and in SFT's loss."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from training.modeling.chunked_logprobs import final_hidden, output_head, token_logprobs
from training.rl.grpo_batches import build_batch, completion_logprobs, pack_groups
from training.stages.sft import Example, collate, pack, response_loss


def test_a_hand_computed_value() -> None:
    head = torch.nn.Linear(1, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [0.0], [-1.0]]))
    # h = 2: logits (2, 0, -2); log p(token 0) = 2 - log(e^2 + 1 + e^-2)
    got = token_logprobs(torch.tensor([[2.0]]), torch.tensor([0]), head)
    assert got.item() == pytest.approx(2 - math.log(math.exp(2) + 1 + math.exp(-2)), abs=1e-6)
    # at temperature 2 the logits halve: (1, 0, -1)
    got = token_logprobs(torch.tensor([[2.0]]), torch.tensor([0]), head, temperature=2.0)
    assert got.item() == pytest.approx(1 - math.log(math.e + 1 + 1 / math.e), abs=1e-6)


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_full_log_softmax(chunk: int, bias: bool, temperature: float) -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=bias)
    hidden = torch.randn(4, 5, 8, requires_grad=True)
    targets = torch.randint(0, 50, (4, 5))
    weights = torch.randn(4, 5)  # an arbitrary downstream loss, so every position's gradient differs
    full = torch.log_softmax(head(hidden).float() / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
    want = torch.autograd.grad((full * weights).sum(), [hidden, *head.parameters()])
    got_logp = token_logprobs(hidden, targets, head, temperature, chunk=chunk)
    got = torch.autograd.grad((got_logp * weights).sum(), [hidden, *head.parameters()])
    torch.testing.assert_close(got_logp, full, atol=1e-6, rtol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_still_do() -> None:
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 20).requires_grad_(False)
    hidden = torch.randn(6, 8, requires_grad=True)
    token_logprobs(hidden, torch.randint(0, 20, (6,)), head, chunk=4).sum().backward()
    assert head.weight.grad is None and hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_no_positions_gives_an_empty_result_that_still_backpropagates() -> None:
    head = torch.nn.Linear(4, 10)
    hidden = torch.randn(0, 4, requires_grad=True)
    out = token_logprobs(hidden, torch.zeros(0, dtype=torch.long), head)
    assert out.shape == (0,)
    out.sum().backward()


def _qwen2(vocab: int = 997):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).eval()


def _gpt2(vocab: int = 301):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=256, attn_implementation="sdpa")
    return GPT2LMHeadModel(config).eval()


MODELS = {"gpt2": _gpt2, "qwen2": _qwen2}


def _groups(vocab: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=g).tolist()

    return [ids(4), ids(6)], [[ids(5), ids(2), ids(7)], [ids(3), ids(6), ids(1)]]


class _Tok:
    pad_token_id = 0


def _grads(model, logp: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    weights = torch.linspace(-1, 2, logp.numel()).view_as(logp)
    return list(torch.autograd.grad((logp * weights * mask).sum(), list(model.parameters())))


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("layout", ["packed", "padded", "shared_prompt"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_update_logprobs_and_gradients_equal_the_full_head(arch: str, layout: str, checkpointing: bool) -> None:
    model = MODELS[arch]()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()  # checkpointing only recomputes in training mode; both models have no dropout here
        model.config.resid_pdrop = model.config.attn_pdrop = model.config.embd_pdrop = 0.0
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    assert output_head(model) is model.get_output_embeddings()
    prompts, groups = _groups(model.config.vocab_size)
    flat = [c for g in groups for c in g]
    if layout == "packed":
        batch = pack_groups(prompts, groups, torch.zeros(len(flat)), 0, torch.device("cpu"))
    else:
        from training.rollout import Completion

        comps = [Completion(text="", token_ids=c) for c in flat]
        per = [p for p, g in zip(prompts, groups) for _ in g]
        batch = build_batch(
            _Tok(),
            per,
            comps,
            torch.zeros(len(flat)),
            torch.device("cpu"),
            group_size=3 if layout == "shared_prompt" else 1,
        )
    full = completion_logprobs(model, batch, 0.8)
    chunked = completion_logprobs(model, batch, 0.8, chunk_tokens=5)
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(chunked[mask], full[mask], atol=1e-5, rtol=1e-5)
    assert (chunked[~mask] == 0).all()  # outside the mask nothing is computed
    for g_full, g_chunked in zip(_grads(model, full, mask), _grads(model, chunked, mask)):
        torch.testing.assert_close(g_chunked, g_full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("packing", [True, False])
def test_sft_loss_and_gradients_equal_the_full_head(arch: str, packing: bool) -> None:
    model = MODELS[arch]()
    g = torch.Generator().manual_seed(4)
    examples = []
    for n, prompt in [(9, 4), (5, 2), (12, 7), (3, 1)]:
        ids = torch.randint(1, model.config.vocab_size, (n,), generator=g).tolist()
        examples.append(Example(ids, [0] * prompt + [1] * (n - prompt)))
    batch = collate(pack(examples, 16, 0, packing), 16, 0)
    full, n_full = response_loss(model, batch)
    chunked, n_chunked = response_loss(model, batch, chunk_tokens=4)
    assert n_full == n_chunked == sum(sum(e.loss_mask[1:]) for e in examples)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-6)
    for a, b in zip(
        torch.autograd.grad(full, list(model.parameters())), torch.autograd.grad(chunked, list(model.parameters()))
    ):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


def test_final_hidden_is_what_the_head_reads() -> None:
    model = _qwen2()
    ids = torch.randint(1, 997, (2, 9))
    hidden, _ = final_hidden(model, input_ids=ids)
    torch.testing.assert_close(model.lm_head(hidden), model(input_ids=ids).logits)


def test_heads_the_chunked_path_cannot_stand_in_for_keep_the_full_path() -> None:
    from peft import LoraConfig, get_peft_model

    softcapped = _qwen2()
    softcapped.config.final_logit_softcapping = 30.0  # Gemma's transform after the head
    assert output_head(softcapped) is None
    lora_head = get_peft_model(_qwen2(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert output_head(lora_head) is None
    lora_body = get_peft_model(_qwen2(), LoraConfig(r=2, target_modules=["q_proj"]))
    assert output_head(lora_body) is lora_body.get_base_model().lm_head  # through the PEFT wrapper


def test_a_lora_policy_gets_the_same_adapter_gradients() -> None:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_qwen2(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    prompts, groups = _groups(997)
    batch = pack_groups(prompts, groups, torch.zeros(6), 0, torch.device("cpu"))
    mask = batch.completion_mask.bool()
    params = [p for p in model.parameters() if p.requires_grad]
    full, chunked = (completion_logprobs(model, batch, 1.0, chunk_tokens=k) for k in (0, 3))
    torch.testing.assert_close(chunked[mask], full[mask], atol=1e-5, rtol=1e-5)
    ga = torch.autograd.grad(full[mask].sum(), params)
    gb = torch.autograd.grad(chunked[mask].sum(), params)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_the_copy_of_a_model_keeps_its_head() -> None:
    model = _gpt2()
    assert output_head(copy.deepcopy(model)) is not None


def test_the_reference_takes_the_policys_path() -> None:
    """A policy whose head cannot be chunked takes the full log-softmax, and the round's config then sends the
    reference there too (rl.round.one_logprob_path): two paths differ by rounding, which AdamW makes a step."""
    from peft import LoraConfig, get_peft_model

    from training.rl.config import GRPOConfig
    from training.rl.round import one_logprob_path

    cfg = GRPOConfig(logprob_chunk_tokens=256)
    assert one_logprob_path(cfg, _qwen2()) is cfg
    lora_head = get_peft_model(_qwen2(), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert one_logprob_path(cfg, lora_head).logprob_chunk_tokens == 0
    full = GRPOConfig(logprob_chunk_tokens=0)
    assert one_logprob_path(full, lora_head) is full

    # the effect it prevents: policy == reference, log-probs two ways, one AdamW step on the KL penalty alone
    model = _qwen2()
    prompts, groups = _groups(997)
    batch = pack_groups(prompts, groups, torch.zeros(6), 0, torch.device("cpu"))
    mask = batch.completion_mask.float()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        ref_same, ref_other = (completion_logprobs(model, batch, 1.0, chunk_tokens=k) for k in (0, 3))
    for ref, moves in ((ref_same, False), (ref_other, True)):
        opt.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, batch, 1.0, chunk_tokens=0)
        kl = torch.exp(ref - logp) - (ref - logp) - 1  # k3, zero with zero gradient where ref == logp
        ((kl * mask).sum() / mask.sum()).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        opt.step()
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before))
        if moves:
            assert max(float(g.abs().max()) for g in grads) < 1e-6  # a rounding-sized gradient ...
            assert moved > 1e-4  # ... and an lr-sized step (AdamW divides by the gradient's own scale)
        else:
            assert all(float(g.abs().max()) == 0 for g in grads) and moved == 0
