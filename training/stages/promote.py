"""Stage `promote` (`posttrain promote`): act on the gate's verdict.

Reads `<run>/gate/verdict.json`. On "promote" it registers the candidate's folder URI as a new version of the
MLflow registered model and moves the alias (default `champion`) to it; on "block" it refuses (exit 2), naming
the reasons, so a hand-run promote cannot bypass the gate. A retried promote reuses the version it registered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training import storage
from training.cli import stage_cli
from training.config import ConfigBase
from training.registry import CHAMPION, DEFAULT_MODEL_NAME, promote
from training.stage import StageContext

STAGE = "promote"


class GateBlocked(RuntimeError):
    """The gate said block: promotion is refused (exit 2)."""


@dataclass(frozen=True)
class PromoteConfig(ConfigBase):
    """Promotion.

    model_name:   MLflow registered model to add a version to.
    alias:        the alias moved to the new version ("champion" is what evaluate compares against).
    version_tags: extra tags for the version (the DAG adds who approved it and when).
    """

    model_name: str = DEFAULT_MODEL_NAME
    alias: str = CHAMPION
    version_tags: dict[str, str] = field(default_factory=dict)


def body(ctx: StageContext) -> dict[str, Any]:

    cfg: PromoteConfig = ctx.config  # type: ignore[assignment]
    verdict = storage.read_json(ctx.input("gate"), "verdict.json")
    if not verdict["promote"]:
        raise GateBlocked("the gate blocked this candidate: " + "; ".join(verdict["reasons"]))
    candidate = storage.require_manifest(verdict["candidate_uri"], "candidate")
    ctx.add_parent(candidate)
    tags = {"posttrain.run_id": ctx.run_id, "posttrain.stage": verdict.get("candidate_stage", ""), **cfg.version_tags}
    champ = promote(
        candidate.uri,
        cfg.model_name,
        run_id=candidate.mlflow_run_id,
        tags=tags,
        alias=cfg.alias,
        model_id=candidate.extra.get("mlflow_model_id"),
    )
    ctx.writer.put_json(
        {"model_name": champ.name, "version": champ.version, "alias": cfg.alias, "source": champ.source},
        "promotion.json",
    )
    ctx.progress(f"promoted {champ.source} as {champ.name} v{champ.version} (alias {cfg.alias})")
    return {"model_name": champ.name, "version": champ.version, "alias": cfg.alias, "source": champ.source}


def cli(argv: list[str], prog: str = "posttrain promote") -> int:
    return stage_cli(
        argv,
        prog,
        "Register the gated candidate and move the champion alias.",
        PromoteConfig,
        STAGE,
        body,
        user_errors=(GateBlocked,),
    )
