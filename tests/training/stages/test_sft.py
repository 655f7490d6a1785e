"""SFT: response-only loss mask, packing without cross-contamination, the stage, checkpoint and resume."""

from __future__ import annotations

import pytest
import torch

from training import checkpointing, stage, storage
from training.modeling import models
from training.stages.sft import LoraSettings, SFTConfig, collate, lr_at, pack, response_loss, tokenize_example, train


def test_tokenize_masks_prompt_and_trains_response_and_eos(tiny_model) -> None:
    _, tok = tiny_model
    ex = tokenize_example(tok, "Q: 12+3=? A:", "15", max_len=64)
    n_prompt = len(tok("Q: 12+3=? A:", add_special_tokens=False)["input_ids"])
    assert ex.input_ids[-3:] == [tok.convert_tokens_to_ids("1"), tok.convert_tokens_to_ids("5"), tok.eos_token_id]
    assert ex.loss_mask == [0] * n_prompt + [1, 1, 1]
    short = tokenize_example(tok, "Q: 12+3=? A:", "15", max_len=4)
    assert len(short.input_ids) == 4 and short.loss_mask == [0] * 4


def test_pack_first_fit_keeps_order(tiny_model) -> None:
    _, tok = tiny_model
    exs = [tokenize_example(tok, f"Q: {i}+1=? A:", str(i + 1), 64) for i in range(10, 20)]  # 12 tokens each
    rows = pack(exs, max_len=30, pad_id=0)
    assert [len(r) for r in rows] == [2, 2, 2, 2, 2]
    assert [e for r in rows for e in r] == exs
    assert [len(r) for r in pack(exs, 30, 0, packing=False)] == [1] * 10


def test_packed_rows_equal_separate_examples(tiny_model) -> None:
    """Block-diagonal mask + restarted positions: each packed example sees only itself."""
    model, tok = tiny_model
    a = tokenize_example(tok, "Q: 12+3=? A:", "15", 64)
    b = tokenize_example(tok, "Extract age as JSON: Bob is 31.", '{"age": 31}', 64)
    packed = collate([[a, b]], max_len=64, pad_id=tok.pad_token_id)
    alone = collate([[a], [b]], max_len=64, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=packed.attention_mask
        ).logits  # (1, T, V)
        la = model(
            input_ids=alone.input_ids, position_ids=alone.position_ids, attention_mask=alone.attention_mask
        ).logits  # (2, T', V)
    na, nb = len(a.input_ids), len(b.input_ids)
    torch.testing.assert_close(lp[0, :na], la[0, :na], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp[0, na : na + nb], la[1, :nb], atol=1e-5, rtol=1e-5)
    # and the loss is the mean over response tokens of both examples, packed or not
    loss_p, n_p = response_loss(model, packed)
    loss_a, n_a = response_loss(model, alone)
    assert n_p == n_a == sum(a.loss_mask) + sum(b.loss_mask)
    torch.testing.assert_close(loss_p, loss_a, atol=1e-5, rtol=1e-5)


def test_loss_ignores_prompt_tokens(tiny_model) -> None:
    model, tok = tiny_model
    a = tokenize_example(tok, "Q: 12+3=? A:", "15", 64)
    b = tokenize_example(tok, "Q: 99+9=? A:", "15", 64)  # other prompt, same response
    batch = collate([[a]], 64, tok.pad_token_id)
    logits = model(
        input_ids=batch.input_ids, position_ids=batch.position_ids, attention_mask=batch.attention_mask
    ).logits[0]  # (T, V)
    logp = torch.log_softmax(logits, -1)
    n = len(a.input_ids)
    manual = -sum(logp[t - 1, a.input_ids[t]] for t in range(n) if a.loss_mask[t]) / sum(a.loss_mask)
    torch.testing.assert_close(response_loss(model, batch)[0], manual, atol=1e-5, rtol=1e-5)
    assert response_loss(model, collate([[b]], 64, tok.pad_token_id))[1] == 3


def test_lr_schedule() -> None:
    cfg = SFTConfig(lr=1.0, warmup_steps=4, max_steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(9, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # half way through the cosine: (1 + cos(pi/2)) / 2
    assert lr_at(14, cfg) == pytest.approx(0.1)


SMALL = dict(
    max_steps=6,
    batch_size=4,
    max_seq_len=64,
    vocab_size=300,
    checkpoint_every=3,
    log_every=2,
    tiny=models.TinyModelConfig(n_layer=1, n_embd=32, n_head=2),
    warmup_steps=2,
)


def _final_state(run_uri: str) -> dict[str, torch.Tensor]:
    model, _ = models.load_model(storage.join(run_uri, "sft"), "model")
    return model.state_dict()


def test_sft_stage_writes_model_and_checkpoints(taskset_run) -> None:
    result = stage.run_stage("sft", SFTConfig(**SMALL), taskset_run, train)
    sft_uri = storage.join(taskset_run, "sft")
    manifest = storage.read_manifest(sft_uri)
    assert "model/model.safetensors" in manifest.files and "model/tokenizer.json" in manifest.files
    assert [s for s, _ in storage.list_complete_checkpoints(sft_uri)] == [3]
    assert result.summary["steps"] == 6 and result.summary["final_loss"] < 10


def test_sft_resume_after_crash_matches_uninterrupted(taskset_run, file_run_uri, monkeypatch, tmp_path) -> None:
    from tests.training.conftest import commit_taskset, make_tasks, split_tasks

    # Reference: the whole run without interruption, in a second run folder.
    other = f"file://{tmp_path}/other-run"
    commit_taskset(other, *split_tasks(make_tasks()))
    stage.run_stage("sft", SFTConfig(**SMALL), other, train)

    # Crash right after the step-3 checkpoint lands; the retry resumes from it.
    real_save = checkpointing.save

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        raise KeyboardInterrupt("simulated kill")

    monkeypatch.setattr(checkpointing, "save", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        stage.run_stage("sft", SFTConfig(**SMALL), taskset_run, train)
    assert storage.read_manifest(storage.join(taskset_run, "sft")) is None
    monkeypatch.setattr(checkpointing, "save", real_save)
    resumed = stage.run_stage("sft", SFTConfig(**SMALL), taskset_run, train)
    assert resumed.summary["resumed_from"] == 3

    a, b = _final_state(other), _final_state(taskset_run)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0, msg=name)


def test_sft_lora_trains_adapters_and_saves_merged(taskset_run) -> None:
    cfg = SFTConfig(**{**SMALL, "checkpoint_every": 0}, lora=LoraSettings(enabled=True, r=4, alpha=8))
    stage.run_stage("sft", cfg, taskset_run, train)
    model, _ = models.load_model(storage.join(taskset_run, "sft"), "model")
    assert not any("lora" in n for n in model.state_dict())  # merged into plain GPT-2 weights


class CharTokenizer:  # one token per character, id 0 = eos
    eos_token_id = 0
    chat_template = None

    def __call__(self, text, **_):
        return {"input_ids": [ord(c) for c in text]}


def test_long_context_examples_grow_fit_and_train_on_the_answer_only() -> None:
    from training.modeling.chat import PromptFormat
    from training.stages.sft import SFTConfig, long_context_examples
    from training.tasksets.generators import generate

    tasks = generate("math", 40, 0, difficulties=(1, 2))
    fmt = PromptFormat(CharTokenizer())
    out = long_context_examples(fmt, tasks, share=0.25, fractions=[0.1, 0.25, 0.5], max_seq_len=128, seed=0)
    assert len(out) == 10 and all(len(ex.input_ids) <= 128 for ex in out)
    plain = {len(fmt.sft_example(t).input_ids) for t in tasks}
    assert all(len(ex.input_ids) > max(plain) for ex in out[1::3])  # 32+ characters of distractors in front
    prefix_lengths = [len(ex.input_ids) - sum(ex.loss_mask) for ex in out[:3]]
    assert prefix_lengths[0] < prefix_lengths[1] < prefix_lengths[2]  # 10%, 25%, 50% of 128: growing
    for ex in out:  # the loss is on the answer (and its eos) only, never on the distractors
        answer = "".join(chr(i) for i, m in zip(ex.input_ids, ex.loss_mask) if m and i)
        assert answer.isdigit() or answer.lstrip("-").isdigit()
    assert long_context_examples(fmt, tasks, 0.0, [0.5], 128, 0) == []
    with pytest.raises(ValueError, match="long_context_fractions"):
        SFTConfig(long_context_fractions=[0.0])


def test_repair_examples_show_a_failed_attempt_and_its_real_error_then_train_on_the_fix() -> None:
    from training.environments import CodeRepairEnv
    from training.environments.code_repair import near_miss
    from training.modeling.chat import PromptFormat
    from training.stages.sft import repair_examples
    from training.tasksets.generators import generate

    tasks = generate("code", 20, 0, difficulties=(2, 3)) + generate("math", 10, 0, difficulties=(1,))
    fmt = PromptFormat(CharTokenizer())
    out = repair_examples(fmt, tasks, share=0.5, max_seq_len=400, seed=0)
    assert 5 <= len(out) <= 10  # half of the 20 code tasks (math cannot explain a failure), minus lucky passes
    by_prompt = {t.prompt: t for t in tasks if t.domain == "code"}
    for ex in out:
        text = "".join(chr(i) for i in ex.input_ids if i)
        trained = "".join(chr(i) for i, m in zip(ex.input_ids, ex.loss_mask) if m and i)
        task = next(t for p, t in by_prompt.items() if text.startswith(p))
        assert trained == task.reference  # the loss is on the fix only
        attempt, _, rest = text[len(task.prompt) :].partition("\n")
        step = CodeRepairEnv(task).step(attempt)
        assert not step.done  # the attempt really fails its visible tests ...
        assert rest.startswith("# error: ") and ("expected" in rest or "Error" in rest)  # ... and says how
        assert rest == f"{step.observation}\n{task.reference}"  # exactly the reply RL and evaluation show
    rng = __import__("random").Random(0)
    assert near_miss("def f(x): return x*3+45", rng) != "def f(x): return x*3+45"
    # the task read the other way, or a constant a little off: both kinds are drawn
    drawn = {near_miss("def f(x): return x+45", rng) for _ in range(40)}
    assert "def f(x): return x-45" in drawn and "def f(x): return x+44" in drawn
    # other_reading (what RL plants): the other reading whenever there is one, else any near miss
    assert {near_miss("def f(x): return x+45", rng, other_reading=True) for _ in range(20)} == {"def f(x): return x-45"}
    assert near_miss("def f(x): return 45", rng, other_reading=True) in {f"def f(x): return {k}" for k in range(42, 49)}
    assert near_miss("def f(s): return s.upper()", rng) == "def f(s): return s.lower()"
    assert near_miss("def f(s): return s[2:]", rng) in {"def f(s): return s[:-2]"} | {
        f"def f(s): return s[{k}:]" for k in (0, 1, 3, 4, 5)
    }
    assert "def f(s): return '#'+s" in {near_miss("def f(s): return s+'#'", rng) for _ in range(40)}
    assert near_miss("def f(xs): return sorted(xs,reverse=True)", rng) == "def f(xs): return sorted(xs)"
    assert near_miss("def f(s): return s", rng) == "def f(s): return None"
    assert repair_examples(fmt, tasks, 0.0, 400, 0) == []


def test_a_mirrored_repair_example_asks_for_the_attempt_on_the_same_prompt() -> None:
    from training.environments import CodeRepairEnv
    from training.environments.code_repair import mirror_tasks
    from training.modeling.chat import PromptFormat
    from training.rewards import score_tasks
    from training.stages.sft import repair_examples
    from training.tasksets.generators import generate

    task = generate("code", 1, 0, difficulties=(1,))[0]  # an integer function, e.g. x plus 3
    attempt = task.reference.replace("return ", "return 1+", 1)  # a program whose outputs differ on every call
    (mirror,) = mirror_tasks([task], [attempt])
    assert mirror is not None and mirror.prompt == task.prompt and mirror.reference == attempt
    assert mirror.id == f"{task.id}~mirror"
    assert [t["expected"] for t in mirror.tests] == [t["expected"] + 1 for t in task.tests]  # run in the sandbox
    assert mirror.metadata["visible_tests"] == mirror.tests[: len(task.metadata["visible_tests"])]
    assert score_tasks([mirror, mirror], [attempt, task.reference]) == [1.0, 0.0]
    assert "expected" in CodeRepairEnv(mirror).step(task.reference).observation
    # nothing to mirror: a program that passes, one that raises, one whose value JSON cannot carry
    assert mirror_tasks([task] * 3, [task.reference, "def f(x): return 1/0", "def f(x): return {1}"]) == [None] * 3

    tasks = generate("code", 20, 0, difficulties=(2, 3))
    fmt = PromptFormat(CharTokenizer())
    plain = repair_examples(fmt, tasks, share=0.5, max_seq_len=400, seed=0)
    both = repair_examples(fmt, tasks, share=0.5, max_seq_len=400, seed=0, mirrors=True)
    assert both[: len(plain)] == plain and len(plain) < len(both) <= 2 * len(plain)
    references = {t.reference for t in tasks}
    for ex in both[len(plain) :]:  # a mirror: the reference is the failed attempt, the near miss is the fix
        text = "".join(chr(i) for i in ex.input_ids if i)
        trained = "".join(chr(i) for i, m in zip(ex.input_ids, ex.loss_mask) if m and i)
        task = next(t for t in tasks if text.startswith(t.prompt))
        assert text[len(task.prompt) :].startswith(task.reference + "\n# error: ") and trained not in references


def test_chat_instructions_come_from_the_verifiers_unless_named() -> None:
    from training.modeling.chat import ChatSettings
    from training.rewards import get_verifier
    from training.stages.sft import chat_for
    from training.tasksets.schema import Task

    tasks = [
        Task(id="a", domain="math", prompt="1+1?", verifier="math", answer="2"),
        Task(id="b", domain="python_hard", prompt="f?", verifier="code"),  # a user's domain, a built-in verifier
        Task(id="c", domain="extraction", prompt="json", verifier="json_rules", answer="{}"),  # no instruction
    ]
    off = ChatSettings(instructions={"math": "Box it."})
    assert chat_for(off, tasks) is off
    on = ChatSettings(instructions={"math": "Box it."}, from_verifiers=True)
    assert chat_for(on, tasks).instructions == {"math": "Box it.", "python_hard": get_verifier("code").instruction}


def test_gradient_accumulation_trains_the_weights_one_pass_does(taskset_run, tmp_path) -> None:
    """1, 2 and 4 passes a step over the same rows: the same loss and final weights (to float rounding, the
    passes' sums are grouped differently), through the whole stage."""
    from tests.training.conftest import commit_taskset, make_tasks, split_tasks

    states, losses = [], []
    for k in (1, 2, 4):
        run = f"file://{tmp_path}/run-{k}"
        commit_taskset(run, *split_tasks(make_tasks()))
        result = stage.run_stage("sft", SFTConfig(**{**SMALL, "gradient_accumulation_steps": k}), run, train)
        states.append(_final_state(run))
        losses.append(result.summary["final_loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5) and losses[2] == pytest.approx(losses[0], rel=1e-5)
    for other in states[1:]:
        for name in states[0]:
            torch.testing.assert_close(other[name], states[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_accumulation_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        SFTConfig(gradient_accumulation_steps=0)


def test_an_offloaded_optimizer_trains_the_weights_the_device_one_does(taskset_run, tmp_path) -> None:
    from tests.training.conftest import commit_taskset, make_tasks, split_tasks

    other = f"file://{tmp_path}/offloaded"
    commit_taskset(other, *split_tasks(make_tasks()))
    stage.run_stage("sft", SFTConfig(**SMALL), taskset_run, train)
    stage.run_stage("sft", SFTConfig(**{**SMALL, "optimizer_offload": True}), other, train)
    a, b = _final_state(taskset_run), _final_state(other)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=1e-5, msg=name)
