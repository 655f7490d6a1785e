"""The pieces of the pretrained-model path, each against hand-computed values or a real model:
lengths never cut, checkpoint retention, truncated importance sampling, LoRA reference and merged weights."""

from __future__ import annotations

import math

import pytest
import torch

from training import storage
from training.modeling.chat import PromptFormat
from training.rl import algorithms
from training.tasksets.schema import Task


def _task(i: int, prompt: str, reference: str = "7") -> Task:
    return Task(
        id=f"t{i}",
        domain="math",
        difficulty=1,
        prompt=prompt,
        reference=reference,
        answer=reference,
        tests=[],
        verifier="math",
        metadata={},
    )


def test_sft_fails_naming_the_longest_when_too_many_examples_are_over_length(tiny_model) -> None:
    from training.stages.sft import ExamplesTooLong, encode_examples

    _, tok = tiny_model
    fmt = PromptFormat(tok)
    tasks = [_task(i, "Q: 1+1=? A:", "2") for i in range(98)] + [
        _task(98, "Q: " + "9+" * 40 + "1=? A:"),
        _task(99, "Q: " + "9+" * 20 + "1=? A:"),
    ]
    longest = len(fmt.sft_example(tasks[98]).input_ids)
    with pytest.raises(ExamplesTooLong, match=rf"2 of 100 examples .* longest is task 't98' at {longest} tokens"):
        encode_examples(fmt, tasks, max_seq_len=40, max_overlong_share=0.01)
    kept, over = encode_examples(fmt, tasks, max_seq_len=40, max_overlong_share=0.05)  # dropped, never cut
    assert len(kept) == 98 and [tid for tid, _ in over] == ["t98", "t99"]
    assert all(len(ex.input_ids) <= 40 and ex.input_ids[-1] == tok.eos_token_id for ex in kept)


def test_prompts_over_the_limit_are_dropped_and_counted(tiny_model) -> None:
    from training.modeling.chat import fitting_tasks
    from training.modeling.models import prompt_limit

    model, tok = tiny_model
    fmt = PromptFormat(tok)
    tasks = [_task(0, "Q: 1+1=? A:"), _task(1, "Q: " + "9+" * 60 + "1=? A:")]
    kept, dropped = fitting_tasks(fmt, tasks, limit=30)
    assert [t.id for t in kept] == ["t0"] and dropped == 1
    assert prompt_limit(0, model, 40) == model.config.n_positions - 40 and prompt_limit(77, model, 40) == 77


def test_checkpoint_retention_keeps_the_newest_complete(file_run_uri: str, tmp_path) -> None:
    stage_uri = storage.join(file_run_uri, "sft")
    for step in (10, 20, 30):
        w = storage.ManifestWriter(storage.checkpoint_uri(stage_uri, step))
        w.put_bytes(b"x" * step, "train_state.pt")
        w.commit()
    # An interrupted newer checkpoint (no manifest) never counts as one of the kept.
    storage.ManifestWriter(storage.checkpoint_uri(stage_uri, 40)).put_bytes(b"partial", "train_state.pt")
    assert storage.prune_checkpoints(stage_uri, keep_last=2) == [10]
    assert [s for s, _ in storage.list_complete_checkpoints(stage_uri)] == [20, 30]
    files = set(storage.iter_files(stage_uri))
    assert not any("step-00000010" in f for f in files) and "checkpoints/step-00000040/train_state.pt" in files
    assert storage.prune_checkpoints(stage_uri, keep_last=2) == []  # idempotent
    with pytest.raises(ValueError):
        storage.prune_checkpoints(stage_uri, keep_last=0)


def test_truncated_importance_weights_by_hand() -> None:
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    engine = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.4)]])
    w = algorithms.truncated_is_weights(trainer, engine, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.5]]))  # 0.9/0.3 = 3 is truncated to 2
    assert not w.requires_grad
    mask = torch.ones(1, 3)
    assert float(algorithms.mismatch_kl(trainer, trainer, mask)) == 0.0
    # k3 with r = log(trainer/engine): mean of exp(r) - 1 - r over the three tokens
    r = trainer - engine
    expected = float((torch.exp(r) - 1 - r).mean())
    assert float(algorithms.mismatch_kl(trainer, engine, mask)) == pytest.approx(expected)


def test_is_weights_scale_the_policy_gradient() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    plain, _ = algorithms.grpo_loss(logp, logp.detach(), None, adv, mask)
    weighted, _ = algorithms.grpo_loss(logp, logp.detach(), None, adv, mask, is_weights=torch.tensor([[2.0, 0.5]]))
    # ratio 1 at the sampling policy: per-token loss -A, so the weighted token mean is -(2 + 0.5) / 2
    assert plain.item() == pytest.approx(-1.0) and weighted.item() == pytest.approx(-1.25)


def test_lora_reference_is_the_adapter_disabled_base(tiny_model) -> None:
    import copy

    from training.modeling.lora import LoraSettings, apply_lora, merged_state_dict
    from training.rl.grpo_batches import build_batch, completion_logprobs
    from training.rl.update import reference_logprobs
    from training.rollout import Completion

    base, tok = tiny_model
    base_copy = copy.deepcopy(base)
    policy = apply_lora(copy.deepcopy(base), LoraSettings(enabled=True, r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # a trained adapter: the policy now differs from its base
    completions = [
        Completion(token_ids=tok("15", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], text="15")
    ]
    batch = build_batch(tok, ["Q: 12+3=? A:"], completions, torch.zeros(1), torch.device("cpu"))
    with torch.no_grad():
        ref = reference_logprobs(policy, None, batch, 1.0)
        want = completion_logprobs(base_copy, batch, 1.0)
        now = completion_logprobs(policy, batch, 1.0)
    torch.testing.assert_close(ref, want)
    assert not torch.allclose(now, want)
    # Merged weights, under the plain model's names, equal peft's own merge.
    merged = merged_state_dict(policy)
    reference = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for name in reference:
        torch.testing.assert_close(merged[name], reference[name], msg=name)
    assert not any("lora" in n for n in merged)


def test_offloaded_reference_runs_where_it_lives(tiny_model) -> None:
    from training.rl.grpo_batches import build_batch, completion_logprobs
    from training.rl.update import reference_logprobs
    from training.rollout import Completion

    model, tok = tiny_model
    completions = [Completion(token_ids=tok("15", add_special_tokens=False)["input_ids"], text="15")]
    batch = build_batch(tok, ["Q: 12+3=? A:"], completions, torch.zeros(1), torch.device("cpu"))
    with torch.no_grad():
        torch.testing.assert_close(reference_logprobs(None, model, batch, 1.0), completion_logprobs(model, batch, 1.0))
