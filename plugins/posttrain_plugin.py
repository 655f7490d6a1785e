"""Registers posttrain's operator extra links with Airflow (the UI needs them to render link buttons)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from plugins.links import CheckpointLink, MlflowRunLink


class PosttrainPlugin(AirflowPlugin):
    name = "posttrain"
    operator_extra_links = [MlflowRunLink(), CheckpointLink()]
