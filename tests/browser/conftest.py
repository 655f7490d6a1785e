"""Fixtures for the browser tests: the whole embedded stack (S3, MLflow, Airflow) and a headless Chromium.

The stack is started once for the module on free ports in a temporary state folder, exactly as `make up` starts
it. POSTTRAIN_UI_STACK=<state dir> reuses a stack that is already up instead (handy while writing a test).
A test that fails keeps its screenshots (every step saves one) under build/browser-screenshots/<test>/; a
passing test's are removed unless POSTTRAIN_KEEP_SCREENSHOTS=1.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from browser_helpers import SHOTS

from infra.local.stack import AIRFLOW_USER, Stack


def _need_browser() -> None:
    from browser_helpers import CHROMEDRIVER, CHROMIUM

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:  # .ci/run installs them; a developer machine may not have them
        pytest.skip(f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def ui_stack(tmp_path_factory: pytest.TempPathFactory):
    from tests.stack_runs import running_stack

    _need_browser()
    reuse = os.environ.get("POSTTRAIN_UI_STACK")
    if reuse:
        saved = dict(os.environ)
        stack = Stack(Path(reuse))
        try:
            os.environ.update(stack.client_env())
            _wait_for_dag(stack, "post_training")
            yield stack
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return
    # The DAG files do not change during the tests: parse them once, not every 30 s (each parse is a process
    # that imports the DAGs, CPU the runs need on 2 cores).
    with running_stack(
        tmp_path_factory.mktemp("ui-stack"), env={"AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600"}
    ) as stack:
        _wait_for_dag(stack, "post_training")
        yield stack


def _wait_for_dag(stack: Stack, dag_id: str) -> None:
    from browser_helpers import airflow_token, wait_for_dag

    wait_for_dag(
        stack.airflow_url, airflow_token(stack.airflow_url, AIRFLOW_USER, stack.airflow_password() or ""), dag_id
    )


@pytest.fixture
def airflow_token(ui_stack: Stack) -> str:
    from browser_helpers import airflow_token as token

    return token(ui_stack.airflow_url, AIRFLOW_USER, ui_stack.airflow_password() or "")


@pytest.fixture
def browser(request: pytest.FixtureRequest, tmp_path: Path, ui_stack: Stack, airflow_token: str):
    from browser_helpers import Browser

    shots = SHOTS / request.node.name
    shutil.rmtree(shots, ignore_errors=True)
    b = Browser(tmp_path / "chromium-profile", shots)
    b.log_in_to_airflow(ui_stack.airflow_url, airflow_token)
    try:
        yield b
    finally:
        failed = any(
            getattr(request.node, f"rep_{w}", None) and getattr(request.node, f"rep_{w}").failed
            for w in ("setup", "call")
        )
        if failed:
            b.shot("failed")
            (shots / "page.txt").write_text(b.driver.current_url + "\n\n" + b.text())
            print(f"screenshots of the failure: {shots}")
        b.quit()
        if not failed and not os.environ.get("POSTTRAIN_KEEP_SCREENSHOTS"):
            shutil.rmtree(shots, ignore_errors=True)
