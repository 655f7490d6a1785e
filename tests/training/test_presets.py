"""Presets from the model itself: parameter counts from config.json, tiers, the refusal above 8B, and the one
function that applies presets for the DAGs and the CLI alike."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

from training.model_size import model_size_b, parameter_count, read_model_config
from training.profiles import SUB_CONFIGS, NoPreset, apply_preset, pretrained_tier

# Published configs (config.json on the hub), the fields that size them; the totals are the models' own.
QWEN25_05B = dict(
    model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
)  # fmt: skip
QWEN25_7B = dict(
    model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
    intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
)  # fmt: skip
LLAMA31_70B = dict(
    model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
    intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False,
)  # fmt: skip


def test_published_models_are_counted_to_within_a_percent() -> None:
    # Qwen2.5-0.5B: 0.49B; Qwen2.5-7B: 7.61B; Llama-3.1-70B: 70.6B (model cards; norms and biases left out)
    assert parameter_count(QWEN25_05B) / 1e9 == pytest.approx(0.494, rel=0.01)
    assert parameter_count(QWEN25_7B) / 1e9 == pytest.approx(7.62, rel=0.01)
    assert parameter_count(LLAMA31_70B) / 1e9 == pytest.approx(70.6, rel=0.01)


def _weights(model) -> int:
    """The weight matrices of a model (the embedding once when tied), as parameter_count counts them."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.dim() < 2 or id(p) in seen:  # norms and biases are left out
            continue
        seen.add(id(p))
        total += p.numel()
    return total


@pytest.mark.parametrize(
    "config_cls, kwargs",
    [
        ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
        ("LlamaConfig", dict(num_key_value_heads=4, tie_word_embeddings=False)),
        ("MistralConfig", dict(num_key_value_heads=2, tie_word_embeddings=False)),
        ("MixtralConfig", dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
        ("GPT2Config", None),
    ],
)
def test_the_count_matches_real_models_built_from_config(config_cls, kwargs) -> None:
    import transformers

    cls = getattr(transformers, config_cls)
    if kwargs is None:
        config = cls(n_embd=64, n_layer=3, n_head=4, vocab_size=500, n_positions=128)
    else:
        sizes = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=160)
        config = cls(vocab_size=500, max_position_embeddings=128, **sizes, **kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert parameter_count(config.to_dict()) == _weights(model)


def test_a_folder_is_sized_by_its_config_not_its_name(tmp_path: Path) -> None:
    chat = tmp_path / "my-chat-model"
    chat.mkdir()
    (chat / "config.json").write_text(json.dumps(QWEN25_7B))
    assert model_size_b(str(chat)) == (pytest.approx(7.62, rel=0.01), "config.json")
    assert pretrained_tier(str(chat)) == "8B"
    misleading = tmp_path / "llama-70b-distilled"  # the name says 70B; the config says 0.5B
    (misleading / "model").mkdir(parents=True)
    (misleading / "model" / "config.json").write_text(json.dumps(QWEN25_05B))
    assert pretrained_tier(str(misleading)) == "1.5B"
    assert pretrained_tier(f"file://{misleading}") == "1.5B"  # a model folder in posttrain storage
    assert read_model_config(str(tmp_path / "absent-3B")) is None
    assert model_size_b("Qwen/Qwen2.5-3B-Instruct") == (3.0, "name")  # not cached here: the name is the fallback
    assert pretrained_tier("/models/no-size-anywhere") == "1.5B"


def test_above_8b_is_refused_with_what_to_do_unless_a_tier_is_named(tmp_path: Path) -> None:
    big = tmp_path / "prod-model"
    big.mkdir()
    (big / "config.json").write_text(json.dumps(LLAMA31_70B))
    with pytest.raises(NoPreset, match=r"70\.6B parameters \(from its config.json\) is above the largest preset"):
        pretrained_tier(str(big))
    assert pretrained_tier(str(big), "8B") == "8B"
    with pytest.raises(ValueError, match="preset tier '13B'"):
        pretrained_tier(str(big), "13B")


def test_apply_preset_merges_sub_configs_and_replaces_mappings(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    cfg = apply_preset("rl_round_2", {"lora": {"r": 8}, "domain_weights": {"math": 1.0}}, str(folder))
    assert cfg["lora"] == {"enabled": True, "r": 8, "alpha": 32, "target_modules": "all-linear"}
    assert cfg["domain_weights"] == {"math": 1.0} and cfg["lr"] == 1e-5
    assert apply_preset("sft", {"lr": 1.0}) == {"lr": 1.0}  # no base model, no profile: as given
    assert apply_preset("rl-round", {}, "", "tiny")["steps"] == 150  # the CLI's spelling of the stage


def test_sub_configs_are_the_config_classes_dataclass_fields() -> None:
    from training.evaluation.config import EvalConfig
    from training.rl.config import GRPOConfig
    from training.stages.sft import SFTConfig

    found = set()
    for cls in (SFTConfig, GRPOConfig, EvalConfig):
        hints = typing.get_type_hints(cls)
        found |= {f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}
    assert found == set(SUB_CONFIGS)


def test_the_cli_and_the_dag_give_a_stage_the_same_config(tmp_path: Path, file_run_uri: str, local_mlflow) -> None:
    from operators.pipeline import stage_config
    from training.cli import stage_cli
    from training.stages.sft import SFTConfig

    folder = tmp_path / "my-chat-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    seen: dict[str, dict] = {}

    def record(name: str):
        def body(ctx):
            seen[name] = ctx.config.to_dict()
            return {}

        return body

    argv = ["--run", file_run_uri + "-shell", "--set", f"base_model={folder}"]
    assert stage_cli(argv, "posttrain sft", "", SFTConfig, "sft", record("shell")) == 0
    dag = stage_config("sft", {"profile": "tiny", "base_model": str(folder), "seed": 0})
    assert (
        stage_cli(["--run", file_run_uri, "--config", dag], "posttrain sft", "", SFTConfig, "sft", record("dag")) == 0
    )
    assert seen["shell"] == seen["dag"]
    assert seen["shell"]["max_seq_len"] == 8192 and seen["shell"]["lora"]["enabled"]  # the 8B tier, not 128
    # the rounds after it take the base model from the run's SFT manifest: the same preset as the DAG's
    from training.rl.config import GRPOConfig

    shell_rl = ["--run", file_run_uri + "-shell"]
    assert stage_cli(shell_rl, "posttrain rl-round", "", GRPOConfig, "rl_round_1", record("rl_shell")) == 0
    dag_rl = stage_config("rl_round_1", {"profile": "tiny", "base_model": str(folder), "seed": 0})
    assert (
        stage_cli(["--run", file_run_uri, "--config", dag_rl], "p", "", GRPOConfig, "rl_round_1", record("rl_dag")) == 0
    )
    assert seen["rl_shell"] == seen["rl_dag"] and seen["rl_shell"]["lr"] == 1e-5
    bare = ["--run", file_run_uri + "-bare", "--set", f"base_model={folder}", "--no-preset"]
    assert stage_cli(bare, "posttrain sft", "", SFTConfig, "sft", record("bare")) == 0
    assert seen["bare"]["max_seq_len"] == SFTConfig().max_seq_len != 8192  # the config's own default


@pytest.mark.parametrize("tier", ["1.5B", "3B", "8B"])
def test_pretrained_tiers_train_at_reasoning_lengths(tier: str) -> None:
    """Every tier's presets are valid configs at reasoning lengths: 8k SFT rows, 4k-8k RL completions with
    DAPO's overlong shaping, and what makes them fit (chunked head, token-budget micro-batches, checkpointing)."""
    from training.config import from_dict
    from training.evaluation.config import EvalConfig
    from training.profiles import PRETRAINED_TIERS
    from training.rl.config import GRPOConfig
    from training.stages.sft import SFTConfig

    presets = PRETRAINED_TIERS[tier]
    sft = from_dict(SFTConfig, presets["sft"])
    rl = from_dict(GRPOConfig, presets["rl_round"])
    ev = from_dict(EvalConfig, presets["evaluate"])
    assert sft.max_seq_len == 8192 and sft.gradient_checkpointing and sft.logprob_chunk_tokens > 0
    assert sft.batch_size % sft.gradient_accumulation_steps == 0
    assert 4096 <= rl.max_new_tokens <= 8192 and rl.gradient_checkpointing and rl.logprob_chunk_tokens > 0
    assert rl.overlong_buffer == rl.max_new_tokens // 8 and rl.truncated == "keep"
    assert rl.max_tokens_per_micro_batch >= rl.max_new_tokens  # one completion fits a micro-batch's budget
    assert ev.max_new_tokens == rl.max_new_tokens  # evaluation reads chains as long as RL trains
