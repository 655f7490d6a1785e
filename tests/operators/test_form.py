"""The trigger form: opens valid, every field in a section with help, dropdown names match the code's
registries, and bad input gets a message naming the field; the approval's body and the pipeline's outcome."""

from __future__ import annotations

import json

import pytest

from operators.form import (
    ADVANTAGE_LABELS,
    ENGINE_LABELS,
    LOSS_AGG_LABELS,
    MAX_ROUNDS,
    PARAMS,
    POLICY_LOSS_LABELS,
    PROFILE_LABELS,
)

SECTIONS = {
    "Data",
    "Supervised fine-tuning (SFT)",
    "Reinforcement learning (GRPO rounds)",
    "Evaluation and gate",
    "Advanced",
}


def _validated(values: dict) -> dict:
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(PARAMS)
    for key, value in values.items():
        params[key] = value
    return params.validate()


def test_form_opens_valid_with_sections_help_and_labels() -> None:
    defaults = _validated({})
    assert defaults["base_model"] is None and defaults["profile"] == "tiny" and defaults["require_approval"] is False
    assert MAX_ROUNDS >= 8 and PARAMS["rounds"].schema["maximum"] == MAX_ROUNDS
    assert {p.schema.get("section") for p in PARAMS.values()} == SECTIONS
    for name, param in PARAMS.items():
        assert param.schema.get("title") and param.schema.get("description_md"), name
        if "enum" in param.schema:  # every dropdown shows a readable label for each value
            assert set(param.schema["values_display"]) == set(param.schema["enum"]), name


def test_dropdowns_match_the_code() -> None:
    from training.profiles import PROFILES
    from training.rl import algorithms
    from training.rollout import ENGINES

    assert set(ADVANTAGE_LABELS) == set(algorithms.ADVANTAGES)
    assert set(POLICY_LOSS_LABELS) == set(algorithms.POLICY_LOSSES)
    assert set(LOSS_AGG_LABELS) == set(algorithms.LOSS_AGGREGATIONS)
    assert set(ENGINE_LABELS) == {"auto", *ENGINES}  # auto: the engine choice (training/rollout)
    assert set(PROFILE_LABELS) == set(PROFILES)


def test_the_mix_takes_domains_a_user_adds() -> None:
    assert _validated({"mix": {"poetry": 0.5, "math": 0.5}})["mix"] == {"poetry": 0.5, "math": 0.5}


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("rounds", MAX_ROUNDS + 1, "maximum"),
        ("rounds", -1, "minimum"),
        ("k", 1, "minimum"),
        ("learning_rate", 0, "exclusiveMinimum"),
        ("kl_coef", -0.1, "minimum"),
        ("profile", "huge", "not one of"),
        ("advantage", "ppo", "not one of"),
        ("policy_loss", "dpo", "not one of"),
        ("rollout_engine", "sglang", "not one of"),
        ("mix", {"math": 2}, "maximum"),
        ("mix", {"my poetry": 0.5}, "my poetry"),
        ("base_model", "my model", "does not match"),
        ("run_root", "/tmp/runs", "does not match"),
        ("stage_overrides", {"sfft": {}}, "sfft"),
        ("approval_timeout_hours", 0, "exclusiveMinimum"),
        ("seed", "one", "not of type"),
        ("gate_metrics", ["pass1", "vibes"], "not one of"),
        ("gate_metrics", ["pass1", "pass1"], "non-unique"),
        ("noninferiority_margin", 0.6, "maximum"),
        ("max_kl", -1, "minimum"),
        ("min_entropy_ratio", 1.5, "maximum"),
    ],
)
def test_bad_values_get_a_message_naming_the_field(field, value, words) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError) as err:
        _validated({field: value})
    message = str(err.value)
    assert field in message and words in message, message


def test_approval_body_and_tags() -> None:
    from operators.approval import approval_body, approval_tags

    body = approval_body(
        {"decision": "promote", "reasons": ["math: +12.0 points vs sft"]},
        {
            "candidate_stage": "rl_round_2",
            "candidate_uri": "s3://b/r/rl_round_2",
            "pass1": {"candidate": {"math": 0.42, "code": 0.1}, "sft": {"math": 0.3, "code": 0.1}},
        },
    )
    assert "**Gate verdict: promote**" in body and "- math: +12.0 points vs sft" in body
    assert "| domain | candidate | sft |" in body and "| math | 42.0% | 30.0% |" in body
    assert approval_tags({"asked": False}) == {}
    assert approval_tags({"asked": True, "approved": True, "by": "admin", "at": "2026-12-03T08:00:00+00:00"}) == {
        "posttrain.approved_by": "admin",
        "posttrain.approved_at": "2026-12-03T08:00:00+00:00",
    }


def test_promote_config_carries_the_approval() -> None:
    from operators.pipeline import promote_config

    approval = {"asked": True, "approved": True, "by": "admin", "at": "t"}
    cfg = json.loads(promote_config({"stage_overrides": {"promote": {"model_name": "m"}}}, approval))
    assert cfg == {"model_name": "m", "version_tags": {"posttrain.approved_by": "admin", "posttrain.approved_at": "t"}}
    assert json.loads(promote_config({}, {"asked": False})) == {}


def test_pipeline_outcome() -> None:
    from operators.end_tracking import outcome

    assert outcome({"sft": "success", "promote": "success", "blocked": "skipped"}) == ("FINISHED", "promoted")
    assert outcome({"promote": "skipped", "blocked": "success"}) == ("FINISHED", "blocked")
    assert outcome({"sft": "failed", "promote": "upstream_failed", "blocked": "upstream_failed"}) == (
        "FAILED",
        "failed",
    )
