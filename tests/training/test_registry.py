"""Promotion against the real MLflow server: versions point at checkpoint URIs and the alias moves."""

from __future__ import annotations

import uuid

import pytest

from training import registry


@pytest.mark.slow
def test_promote_moves_champion_alias(local_stack) -> None:
    name = f"test-model-{uuid.uuid4().hex[:6]}"
    assert registry.champion(name) is None
    first = registry.promote("s3://posttrain/runs/a/rl_round_2/model", name, tags={"gate": "promote"})
    assert registry.champion(name) == first and first.version == "1"
    second = registry.promote("s3://posttrain/runs/b/rl_round_2/model", name)
    now = registry.champion(name)
    assert now == second and now.version == "2" and now.source.endswith("/b/rl_round_2/model")
    again = registry.promote("s3://posttrain/runs/b/rl_round_2/model", name)  # retried promote stage
    assert again.version == "2"
