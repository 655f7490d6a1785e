"""Registers posttrain's operator extra links with Airflow (the UI needs them to render link buttons) and the
storage browser the "Checkpoint" link opens on stacks without an object-store console (plugins/browse.py)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from plugins.browse import PREFIX, app
from plugins.links import CheckpointLink, MlflowRunLink


class PosttrainPlugin(AirflowPlugin):
    name = "posttrain"
    operator_extra_links = [MlflowRunLink(), CheckpointLink()]
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "posttrain storage browser"}]
