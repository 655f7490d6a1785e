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

from benchmarks.numerics import pin_cpu_numerics
from infra.local.stack import Stack, free_port

# Before anything computes with torch: one float path on every AVX2 CI machine (benchmarks/numerics.py).
pin_cpu_numerics()

REPO = Path(__file__).resolve().parents[1]

# Airflow reads its configuration when first imported, and test modules import it at collection time: point it
# at a private AIRFLOW_HOME (SQLite) before anything else does, so tests never touch ~/airflow or `make up`'s.
_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="posttrain-test-airflow-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        # Test-only DAGs live in a second bundle so dag.test() can find and serialize them.
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
            [
                {
                    "name": "dags-folder",
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(REPO / "dags")},
                },
                {
                    "name": "test-dags",
                    "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(REPO / "tests" / "dags")},
                },
            ]
        ),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # A retried stage task should not wait the production 30 s in tests.
        "POSTTRAIN_RETRY_DELAY_S": "1",
        # A stage retried right after a kill -9 waits for the dead attempt's lease to expire: 5 s here, not 30 s.
        "POSTTRAIN_LEASE_TTL_S": "5",
    }
)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory):
    from tests.stack_runs import running_stack

    with running_stack(tmp_path_factory.mktemp("stack"), services=("s3", "mlflow")) as stack:
        yield stack


@pytest.fixture
def s3_run_uri(local_stack: Stack) -> str:
    """A fresh run URI in the stack's S3 bucket."""
    return f"s3://posttrain/test-runs/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def aws_semantics_s3() -> str:
    """A second S3 server, moto's, for the few behaviours the embedded s3rver does not emulate.

    AWS and MinIO give a completed multipart upload a composite ETag (`<md5>-<parts>`) and list unfinished
    uploads (ListMultipartUploads); s3rver does neither. Tests of our multipart path against those semantics use
    this server, started as a real process and spoken to with boto3 like the stack's. Returns its endpoint URL.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    import time
    import urllib.request

    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {url}") from None
            time.sleep(0.2)
    try:
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.fixture
def aws_s3_run_uri(aws_semantics_s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh run URI on the moto server; the environment points storage (and any child process) at it."""
    import boto3

    from training import storage

    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": aws_semantics_s3,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = boto3.client(
        "s3",
        endpoint_url=aws_semantics_s3,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    try:
        client.create_bucket(Bucket="posttrain")
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
    storage._s3_backend.cache_clear()
    yield f"s3://posttrain/test-runs/{uuid.uuid4().hex[:12]}"
    storage._s3_backend.cache_clear()


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
    res = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], capture_output=True, text=True, env=os.environ.copy()
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return _AIRFLOW_HOME


@pytest.fixture(scope="session")
def docker_engine():
    """A real Docker engine: a private dockerd started for this session (tests/docker_engine.py), stopped at its
    end with every container it ran. Skips, saying why, where dockerd cannot run."""
    from tests.docker_engine import Engine, EngineUnavailable

    try:
        engine = Engine.start()
    except EngineUnavailable as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        yield engine
    finally:
        engine.stop()
