"""The MLflow Model Registry side of promotion: versions point at checkpoint URIs; `champion` is an alias.

A registered version's `source` is the checkpoint folder URI (s3:// or file://), the folder the evaluate stage
verified through its manifest, so loading the champion is `models.load_model(champion_uri(...))`. The version
also names the run that trained it (`run_id`: the registry page links to it, and the run to its LoggedModel) and
that LoggedModel's id as tag `posttrain.logged_model_id`. (MLflow records a version's own `model_id` only for a
`models:/<id>` source, which would hide the checkpoint URI that loading relies on.)
"""

from __future__ import annotations

from dataclasses import dataclass

from training.tracking import ensure_reachable

CHAMPION = "champion"
DEFAULT_MODEL_NAME = "posttrain-tiny"


@dataclass(frozen=True)
class Champion:
    name: str
    version: str
    source: str
    run_id: str | None


def _client():
    from mlflow.tracking import MlflowClient

    ensure_reachable()
    return MlflowClient()


def champion(name: str = DEFAULT_MODEL_NAME, alias: str = CHAMPION) -> Champion | None:
    """The version the alias points at, or None when the model or the alias does not exist yet."""
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        mv = client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None
    return Champion(name, str(mv.version), mv.source, mv.run_id)


def promote(
    checkpoint_uri: str,
    name: str = DEFAULT_MODEL_NAME,
    run_id: str | None = None,
    tags: dict[str, str] | None = None,
    alias: str = CHAMPION,
    model_id: str | None = None,
) -> Champion:
    """Register `checkpoint_uri` as a new version of `name` (from run `run_id` and its LoggedModel `model_id`)
    and move `alias` to it.

    Idempotent for a retried promote stage: if a version with the same source already exists it is reused (and
    given `tags`).
    """
    from mlflow.exceptions import MlflowException

    client = _client()
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description="Promoted by the posttrain pipeline's gate.")
    existing = [mv for mv in client.search_model_versions(f"name = '{name}'") if mv.source == checkpoint_uri]
    tags = {**(tags or {}), **({"posttrain.logged_model_id": model_id} if model_id else {})}
    mv = existing[0] if existing else client.create_model_version(name, source=checkpoint_uri, run_id=run_id, tags=tags)
    if existing:
        for key, value in tags.items():
            client.set_model_version_tag(name, mv.version, key, value)
    client.set_registered_model_alias(name, alias, mv.version)
    return Champion(name, str(mv.version), mv.source, mv.run_id)
