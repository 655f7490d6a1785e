"""Recipes: validation that names the file and key, the run parameters they give, and the same stage configs
from the CLI's --recipe as from the DAGs for every stage."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml

from training.config import ConfigError
from training.recipes import RECIPES_DIR, load_recipe, recipe_params

QWEN25_7B = dict(
    model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
    intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
)  # fmt: skip


def write_recipe(tmp_path: Path, **changes) -> Path:
    model = tmp_path / "support-model"  # the name says nothing about its size
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(QWEN25_7B))
    recipe = {
        "model_name": "support-bot",
        "base_model": str(model),
        "rounds": 2,
        "split_salt": "support-v1",
        "domains": {
            "math": {"weight": 0.7, "sources": [{"path": str(tmp_path / "gsm8k.jsonl"), "adapter": "gsm8k"}]},
            "code": {
                "weight": 0.3,
                "group": "programming",
                "sources": [{"path": str(tmp_path / "mbpp.jsonl"), "adapter": "mbpp"}],
            },
        },
        "stages": {"rl_round": {"steps": 50}, "gate": {"min_samples": 50}},
        **changes,
    }
    path = tmp_path / "support-bot.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_the_example_recipe_in_the_repository_is_valid() -> None:
    recipe = load_recipe("example")
    assert recipe.model_name == "example-chat" and set(recipe.domains) == {"math", "code"}
    assert (RECIPES_DIR / "example.yaml").is_file()


def test_a_recipe_gives_the_run_parameters(tmp_path: Path) -> None:
    params = recipe_params(load_recipe(str(write_recipe(tmp_path))))
    assert params["model_name"] == "support-bot" and params["profile"] == "data" and params["rounds"] == 2
    assert params["mix"] == {"math": 0.7, "code": 0.3}
    taskset = params["stage_overrides"]["taskset"]
    assert sorted(s["domain"] for s in taskset["sources"]) == ["code", "math"]
    assert taskset["split"] == "hash" and taskset["split_salt"] == "support-v1"
    assert params["stage_overrides"]["gate"] == {"groups": {"code": "programming"}, "min_samples": 50}


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"model_name": ""}, "model_name: a recipe names the registered model"),
        ({"domains": {}}, "domains: a recipe needs at least one domain"),
        ({"rounds": 12}, "rounds must be in 0..8"),
        ({"stages": {"sfft": {}}}, "unknown stage(s) ['sfft']"),
        ({"learning_rate": 1}, "unknown key(s) learning_rate"),
        ({"domains": {"math": {"weight": 1}}}, "domains.math: sources: a domain needs at least one source"),
        ({"domains": {"math": {"sources": [{"adapter": "gsm8k"}]}}}, "domains.math: sources[0]: a source is"),
        ({"domains": {"math": {"sources": [{"path": "x"}], "wieght": 2}}}, "domains.math: unknown key(s) wieght"),
        ({"feedback": {"domain": "math"}}, "feedback: inbox: where the feedback files arrive"),
        ({"feedback": {"inbox": "/in", "rooot": "s3://x"}}, "feedback: unknown key(s) rooot"),
        ({"timeouts": {"sfft": "1h"}}, "timeouts: unknown stage(s) ['sfft']"),
        ({"timeouts": {"sft": "soon"}}, "timeouts.sft: expected seconds or a duration such as '8h', got 'soon'"),
        ({"timeouts": {"gate": 0}}, "timeouts.gate: a timeout must be at least 1 second"),
    ],
)
def test_a_bad_recipe_names_the_file_and_the_key(tmp_path: Path, changes, words) -> None:
    path = write_recipe(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_recipe(str(path))
    assert str(path) in str(err.value) and words in str(err.value), str(err.value)


def test_an_unknown_recipe_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"recipe 'nope': no such file.*example"):
        load_recipe("nope")


STAGES = ["taskset", "sft", "rl_round_1", "rl_round_2", "evaluate", "gate", "promote"]


def test_the_cli_and_the_dags_build_every_stage_config_alike(tmp_path: Path) -> None:
    from operators.pipeline import stage_config
    from training.cli import resolve_config

    path = write_recipe(tmp_path)
    dag_params = {"recipe": str(path), "profile": "tiny", "seed": 7, "rounds": 1, "rollout_engine": "hf"}
    for stage in STAGES:
        args = argparse.Namespace(
            config=None, set=[], run=f"file://{tmp_path}/r", recipe=str(path), no_preset=False, preset_tier=""
        )
        shell = resolve_config(stage, args)
        dag = json.loads(stage_config(stage, dag_params))
        assert shell == dag, stage
    # the recipe's base model decides the preset, whatever the form says (profile tiny, engine hf): the 7B tier
    rl = json.loads(stage_config("rl_round_1", dag_params))
    assert rl["lr"] == 1e-5 and rl["rollout_engine"] == "auto" and rl["lora"]["enabled"] and rl["steps"] == 50
    sft = json.loads(stage_config("sft", dag_params))
    assert sft["max_seq_len"] == 8192 and sft["base_model"] == str(tmp_path / "support-model")
    assert json.loads(stage_config("evaluate", dag_params))["model_name"] == "support-bot"
    # the form's per-stage overrides still apply on top of the recipe's
    tuned = json.loads(stage_config("rl_round_1", {**dag_params, "stage_overrides": {"rl_round": {"steps": 5}}}))
    assert tuned["steps"] == 5 and tuned["lr"] == 1e-5


def test_nightly_and_refresh_take_the_recipe(tmp_path: Path) -> None:
    from operators.pipeline import model_name, rounds, stage_config

    params = {"recipe": str(write_recipe(tmp_path)), "rounds": 1}
    assert model_name(params) == "support-bot" and rounds(params) == 2  # the recipe's, not the form's
    taskset = json.loads(stage_config("taskset", params))
    assert taskset["profile"] == "data" and len(taskset["sources"]) == 2
    assert model_name({}) == "posttrain-tiny" and rounds({"rounds": 3}) == 3  # without a recipe, as before


def test_a_recipe_with_feedback_imports_its_inbox_and_builds_from_its_batches(tmp_path: Path) -> None:
    from operators.pipeline import feedback, stage_config

    params = {"recipe": str(write_recipe(tmp_path, feedback={"inbox": "s3://inbox/support", "domain": "math"}))}
    fb = feedback(params)
    assert fb == {"inbox": "s3://inbox/support", "root": "s3://posttrain/feedback/support-bot", "domain": "math",
                  "verifier": ""}  # fmt: skip
    assert json.loads(stage_config("taskset", params))["feedback"] == [fb["root"]]
    pinned = {"recipe": str(write_recipe(tmp_path, feedback={"inbox": "/in", "root": "file:///fb"}))}
    assert feedback(pinned)["root"] == "file:///fb"
    # without a feedback section the import is skipped (its `enabled` renders "") and the task set reads none
    plain = {"recipe": str(write_recipe(tmp_path))}
    assert feedback(plain)["inbox"] == "" and "feedback" not in json.loads(stage_config("taskset", plain))
    assert feedback({})["inbox"] == ""


def test_durations_in_seconds() -> None:
    from training.recipes import duration_s

    assert [duration_s(v) for v in (30, 90.5, "45", "90m", "8h", "1.5d", " 2 h ")] == [
        30, 90, 45, 5400, 28800, 129600, 7200,
    ]  # fmt: skip
    for bad in ("8 hours", "-1h", True, "", "1w"):
        with pytest.raises(ValueError):
            duration_s(bad)
