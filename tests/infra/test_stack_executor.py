"""The stack's executor mode, without starting anything: what `--executor celery` changes in Airflow's
environment, where the mode comes from, and the worker names task instances report. The servers themselves are
started for real in tests/e2e/test_celery_stack.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.local.stack import Stack, StackError, worker_hostname, worker_name

REPO = Path(__file__).resolve().parents[2]


def test_local_is_the_default_and_celery_changes_only_what_it_needs(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("POSTTRAIN_EXECUTOR", raising=False)
    local = Stack(tmp_path)
    assert local.executor == "local" and local.airflow_env()["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert local.airflow_env()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("sqlite:///")
    assert not (tmp_path / "secrets.json").exists()  # local mode generates no passwords

    celery = Stack(tmp_path, ports={"postgres": 15999, "redis": 16999}, executor="celery", queues=("gpu", "cpu"))
    env = celery.airflow_env()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("@127.0.0.1:15999/airflow")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "db+" + env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    broker = env["AIRFLOW__CELERY__BROKER_URL"]
    assert broker.startswith("redis://:") and broker.endswith("@127.0.0.1:16999/0")
    assert env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] == "cpu"
    # Everything else is the local mode's (the api-server URL the workers report to, the DAG folder...).
    local_env = local.airflow_env()
    changed = {k for k in local_env if env[k] != local_env[k]}
    assert changed == {"AIRFLOW__CORE__EXECUTOR", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"}, changed
    # The passwords are generated once, kept private, and the same for every Stack on this state folder.
    assert (tmp_path / "secrets.json").stat().st_mode & 0o077 == 0
    assert Stack(tmp_path, ports={"postgres": 15999}, executor="celery").database_url == celery.database_url
    workers = {name: argv for name, argv in celery._service("airflow").companions if "celery" in argv}
    assert sorted(workers) == ["celery-worker-cpu", "celery-worker-gpu"]
    assert workers["celery-worker-gpu"][workers["celery-worker-gpu"].index("--queues") + 1] == "gpu"


def test_the_mode_comes_from_the_flag_or_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POSTTRAIN_EXECUTOR", "celery")
    assert Stack(tmp_path).executor == "celery"
    assert Stack(tmp_path, executor="local").executor == "local"
    with pytest.raises(StackError, match="not one of"):
        Stack(tmp_path, executor="kubernetes")
    cli = subprocess.run(
        [
            sys.executable,
            str(REPO / "infra/local/stack.py"),
            "--state-dir",
            str(tmp_path),
            "--executor",
            "bogus",
            "status",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and "invalid choice" in cli.stderr


def test_workers_report_their_own_name(monkeypatch) -> None:
    monkeypatch.setenv("POSTTRAIN_WORKER_HOSTNAME", worker_name("gpu"))
    assert worker_hostname() == "gpu-worker"
    monkeypatch.delenv("POSTTRAIN_WORKER_HOSTNAME")
    assert worker_hostname() and worker_hostname() != "gpu-worker"
    assert os.environ.get("POSTTRAIN_WORKER_HOSTNAME") is None
