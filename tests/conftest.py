"""Shared fixtures. `local_stack` starts the real S3-compatible server and MLflow server once per session.

The stack runs on free ports in a temporary state folder, so tests never touch a developer's `make up`
stack, and it is stopped (whole process groups) at the end of the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from infra.local.stack import Stack, free_port

REPO = Path(__file__).resolve().parents[1]

# Airflow reads its configuration when first imported, and test modules import it at collection time: point it
# at a private AIRFLOW_HOME (SQLite) before anything else does, so tests never touch ~/airflow or `make up`'s.
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="posttrain-test-airflow-"))
os.environ.update({
    "AIRFLOW_HOME": str(_AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
    # Test-only DAGs live in a second bundle so dag.test() can find and serialize them.
    "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps([
        {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(REPO / "dags")}},
        {"name": "test-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
         "kwargs": {"path": str(REPO / "tests" / "dags")}},
    ]),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    # A retried stage task should not wait the production 30 s in tests.
    "POSTTRAIN_RETRY_DELAY_S": "1",
})


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory):
    state = tmp_path_factory.mktemp("stack")
    stack = Stack(state, ports={"s3": free_port(), "mlflow": free_port(), "airflow": free_port()})
    saved = dict(os.environ)
    try:
        stack.up(("s3", "mlflow"), quiet=True)
        os.environ.update(stack.client_env())
        yield stack
    finally:
        stack.down(quiet=True)
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def s3_run_uri(local_stack: Stack) -> str:
    """A fresh run URI in the stack's S3 bucket."""
    return f"s3://posttrain/test-runs/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def file_run_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'runs' / uuid.uuid4().hex[:12]}"


@pytest.fixture
def local_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """MLflow without a server (SQLite store) for unit tests of stage bodies; not for tracking tests."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata DB (SQLite) in the session's private AIRFLOW_HOME."""
    res = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True,
                         env=os.environ.copy())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return _AIRFLOW_HOME
