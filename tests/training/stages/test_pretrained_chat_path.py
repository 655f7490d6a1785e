"""The path a user's pretrained chat model takes, end to end, on a real architecture built inside the test.

A Qwen2-architecture model (random weights, ~0.3M parameters) with a ChatML tokenizer, a pad token and two eos
ids in its generation_config is saved as a plain Hugging Face folder and used as `base_model` for
build-taskset -> sft -> rl_round_1 (LoRA) -> evaluate -> gate on GSM8K-shaped and HumanEval-shaped records.
Nothing is downloaded: the tokenizer is trained on the test's own corpus.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from training import stage, storage
from training.modeling.chat import ChatSettings, PromptFormat, stop_token_ids
from training.modeling.synthetic_models import build_chatml_qwen2

NAMES = ["Ava", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena"]
ITEMS = ["apples", "pens", "stamps", "shells", "books", "coins", "marbles", "cards"]
MATH_INSTRUCTION = "Show your work and end with '#### <answer>'."


def gsm8k_rows(n: int, seed: int = 0) -> list[dict]:
    """GSM8K-shaped records: a question, and a worked answer ending in `#### N`."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        who, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
        rows.append(
            {
                "question": f"{who} has {a} {item}. {other} gives {who} {b} more. How many {item} now?",
                "answer": f"{who} starts with {a} {item}.\n{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}",
            }
        )
    return rows


def humaneval_rows(n: int) -> list[dict]:
    """HumanEval-shaped records: signature + docstring, canonical body, check(candidate), entry point."""
    rows = []
    for i in range(n):
        k = i + 2
        rows.append(
            {
                "task_id": f"Synth/{i}",
                "entry_point": f"times_{k}",
                "prompt": f'def times_{k}(x: int) -> int:\n    """Return x times {k}."""\n',
                "canonical_solution": f"    return x * {k}\n",
                "test": f"def check(candidate):\n    assert candidate(3) == {3 * k}\n    assert candidate(0) == 0\n",
            }
        )
    return rows


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], list[dict]]:
    root = tmp_path_factory.mktemp("chat-model")
    gsm, he = gsm8k_rows(160), humaneval_rows(24)
    corpus = (
        [r["question"] + " " + r["answer"] for r in gsm]
        + [r["prompt"] + r["canonical_solution"] for r in he]
        + [MATH_INSTRUCTION, "user assistant system"]
    )
    return build_chatml_qwen2(root / "qwen2-chat", corpus), gsm, he


def test_stop_ids_are_every_eos_and_the_end_of_turn(chat_model_dir) -> None:
    from training.modeling import models

    folder, _, _ = chat_model_dir
    model, tok = models.load_model(str(folder))
    im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert sorted(stop_token_ids(tok, model.generation_config)) == sorted([im_end, endoftext])
    fmt = PromptFormat(tok, ChatSettings(system_prompt="Be brief.", instructions={"math": "Use ####."}))
    from training.tasksets.schema import Task

    task = Task(
        id="t1",
        domain="math",
        difficulty=1,
        prompt="What is 2+3?",
        reference="2 + 3 = 5\n#### 5",
        answer="5",
        tests=[],
        verifier="math",
        metadata={},
    )
    assert tok.decode(fmt.prompt_ids(task)) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "What is 2+3?\n\nUse ####.<|im_end|>\n<|im_start|>assistant\n"
    )
    ex = fmt.sft_example(task)
    trained = [t for t, m in zip(ex.input_ids, ex.loss_mask) if m]
    # The loss covers the assistant turn exactly: the reference and the end-of-turn token, not the "\n" after.
    assert tok.decode(trained) == "2 + 3 = 5\n#### 5<|im_end|>"
    assert ex.input_ids[: len(fmt.prompt_ids(task))] == fmt.prompt_ids(task)


def test_a_sampled_second_eos_also_stops(chat_model_dir) -> None:
    """Stopping on every eos id: a model made to prefer <|endoftext|> stops there, finish_reason "stop"."""
    from training.modeling import models
    from training.rollout.hf import HFRolloutEngine

    folder, _, _ = chat_model_dir
    model, tok = models.load_model(str(folder))
    endoftext = tok.convert_tokens_to_ids("<|endoftext|>")

    def prefer_endoftext(module, inputs, logits):  # this token now wins every greedy step
        logits[..., endoftext] += 1e4
        return logits

    model.lm_head.register_forward_hook(prefer_endoftext)
    fmt = PromptFormat(tok, None, model.generation_config)
    engine = HFRolloutEngine(model, tok, stop_ids=fmt.stop_ids)
    ((only,),) = engine.generate([tok("hello", add_special_tokens=False)["input_ids"]], 1, 8, temperature=0.0)
    assert only.token_ids == [endoftext] and only.finish_reason == "stop"
    plain = HFRolloutEngine(model, tok)  # eos_token (<|im_end|>) only: never stops on <|endoftext|>
    ((cut,),) = plain.generate([tok("hello", add_special_tokens=False)["input_ids"]], 1, 8, temperature=0.0)
    assert cut.finish_reason == "length" and len(cut.token_ids) == 8


@pytest.mark.slow
def test_pretrained_chat_model_end_to_end(chat_model_dir, file_run_uri, local_mlflow, tmp_path) -> None:
    from training.config import from_dict
    from training.evaluation.config import EvalConfig
    from training.evaluation.gate_rules import GateConfig
    from training.modeling import models
    from training.rl.config import GRPOConfig
    from training.rollout.hf import HFRolloutEngine
    from training.stages.build_taskset import TasksetConfig, body as taskset_body
    from training.stages.evaluate import body as evaluate_body
    from training.stages.gate import body as gate_body
    from training.stages.rl_round import run_round
    from training.stages.sft import SFTConfig, train

    folder, gsm, he = chat_model_dir
    gsm_file, he_file = tmp_path / "gsm8k.jsonl", tmp_path / "humaneval.jsonl"
    gsm_file.write_text("".join(json.dumps(r) + "\n" for r in gsm))
    he_file.write_text("".join(json.dumps(r) + "\n" for r in he))
    run = file_run_uri

    taskset = from_dict(
        TasksetConfig,
        {
            "profile": "data",
            "holdout_fraction": 0.2,
            "mix": {},
            "sources": [{"path": str(gsm_file), "adapter": "gsm8k"}, {"path": str(he_file), "adapter": "humaneval"}],
        },
    )
    built = stage.run_stage("taskset", taskset, run, taskset_body)
    assert built.summary["train_by_domain"]["math"] > 100 and built.summary["holdout_by_domain"]["code"] >= 4

    sft_cfg = from_dict(
        SFTConfig,
        {
            "base_model": str(folder),
            "max_steps": 45,
            "batch_size": 8,
            "lr": 3e-3,
            "warmup_steps": 5,
            "min_lr_ratio": 1.0,
            "max_seq_len": 256,
            "checkpoint_every": 15,
            "keep_checkpoints": 1,
            "log_every": 15,
            "chat": {"instructions": {"math": MATH_INSTRUCTION}},
        },
    )
    sft = stage.run_stage("sft", sft_cfg, run, train)
    # Nothing was cut, and SFT trained chat-rendered conversations with the loss on the assistant turn only.
    assert sft.summary["examples_overlong_dropped"] == 0 and sft.summary["chat_template"] is True
    assert sft.summary["packed_attention"] == "segments"  # a Qwen2 SDPA model: packed rows without a (T, T) mask
    samples = storage.read_json(storage.require_manifest(storage.join(run, "sft")), "sample_examples.json")
    for s in samples:
        assert s["text"].startswith("<|im_start|>user\n") and "<|im_start|>assistant\n" in s["text"]
        assert s["trained"].endswith("<|im_end|>") and "<|im_start|>" not in s["trained"]
    assert any("\n#### " in s["trained"] for s in samples)  # the final answer line survived
    # Only the newest mid-stage checkpoint is kept (checkpoints at 15 and 30; 15 was deleted after 30 landed).
    assert [st for st, _ in storage.list_complete_checkpoints(storage.join(run, "sft"))] == [30]
    assert not any("step-00000015" in f for f in storage.iter_files(storage.join(run, "sft")))

    # Completions of the SFT model stop at the end-of-turn token.
    model, tok = models.load_model(storage.join(run, "sft"), "model")
    assert tok.chat_settings.instructions == {"math": MATH_INSTRUCTION}  # carried with the model
    fmt = PromptFormat(tok, tok.chat_settings, model.generation_config)
    from training.tasksets.io import load_stage_tasks

    holdout = load_stage_tasks(storage.require_manifest(storage.join(run, "taskset")), "holdout", tmp_path / "ts")
    engine = HFRolloutEngine(model, tok, stop_ids=fmt.stop_ids)
    outs = engine.generate([fmt.prompt_ids(t) for t in holdout[:12]], 2, 80, temperature=1.0, seed=1)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    stopped = [c for g in outs for c in g if c.finish_reason == "stop"]
    assert stopped, "after SFT the model ends its answers"
    assert all(c.token_ids[-1] == im_end and im_end not in c.token_ids[:-1] for c in stopped)

    rl_cfg = from_dict(
        GRPOConfig,
        {
            "steps": 3,
            "prompts_per_step": 4,
            "samples_per_prompt": 4,
            "max_new_tokens": 48,
            "lr": 1e-3,
            "checkpoint_every": 1,
            "keep_checkpoints": 1,
            "holdout_per_domain": 6,
            "log_samples": 16,
            "lora": {"enabled": True, "r": 4, "alpha": 8},
            "beta": 0.04,
            "dynamic_sampling": False,
        },
    )
    rl = stage.run_stage("rl_round_1", rl_cfg, run, lambda ctx: run_round(ctx, 1))
    assert rl.summary["lora"] is True and rl.summary["reference"].startswith("sft (the LoRA base, adapters disabled")
    assert rl.summary["packed_attention"] == "segments"
    assert [st for st, _ in storage.list_complete_checkpoints(storage.join(run, "rl_round_1"))] == [2]
    rows = storage.read_json(storage.require_manifest(storage.join(run, "rl_round_1")), "samples.json")
    assert rows and all(
        r["prompt"].startswith("<|im_start|>user\n") and r["prompt"].endswith("<|im_start|>assistant\n") for r in rows
    )
    assert {r["finish_reason"] for r in rows} <= {"stop", "length"}
    # The round's output is a plain (merged) model: loadable without peft, same architecture.
    merged, _ = models.load_model(storage.join(run, "rl_round_1"), "model")
    assert type(merged).__name__ == "Qwen2ForCausalLM" and not any("lora" in n for n in merged.state_dict())

    ev = stage.run_stage(
        "evaluate",
        from_dict(
            EvalConfig,
            {
                "max_new_tokens": 48,
                "n_samples": 2,
                "ks": [1, 2],
                "max_tasks_per_domain": 6,
                "long_context_tasks": 2,
                "distractor_tokens": 64,
                "compare_champion": False,
            },
        ),
        run,
        evaluate_body,
    )
    report = storage.read_json(storage.require_manifest(storage.join(run, "evaluate")), "report.json")
    cand = report["models"]["candidate"]
    assert ev.summary["candidate_stage"] == "rl_round_1" and set(cand["domains"]) == {"math", "code"}
    assert all(d["dropped_over_length"] == 0 for d in cand["domains"].values())
    assert all(s["prompt"].startswith("<|im_start|>user\n") for s in cand["samples"])
    verdict = stage.run_stage("gate", from_dict(GateConfig, {"min_samples": 1}), run, gate_body)
    assert verdict.summary["decision"] in ("promote", "block") and verdict.summary["reasons"]
