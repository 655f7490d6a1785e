"""What a person sees, in headless Chromium on the embedded stack: the `post_training` trigger form opens valid
and submits with its defaults, a short per-stage override, one RL round and "Require human approval" ticked;
Approve under Required Actions moves the champion alias (approver and time become version tags); the run
succeeds in the grid; the "MLflow run" link opens the run with its metrics and "Checkpoint" a listing. Reject
under Required Actions ends in `blocked`, shown on a test DAG with post_training's approval and branch wiring
(tests/dags/approval_flow.py), so the module pays for one pipeline run rather than three.

The override keeps the DAG run short on 2 cores (tiny profile, few steps, a small evaluation); the gate's
tolerance is opened wide (and the minimum evidence lowered to the small evaluation) so the verdict is "promote"
and the approval is asked.
"""

from __future__ import annotations

import json
import time
from urllib.parse import quote

import pytest
from browser_helpers import api, newest_run, wait_for_dag

from infra.local.stack import Stack
from tests.stack_runs import SHORT_RUN

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(2400)]

DAG = "post_training"
MODEL = "posttrain-tiny"
OVERRIDES = SHORT_RUN
# A guard, not the expected time: a run takes a few minutes on an idle 2-core machine, far longer when shared.
RUN_TIMEOUT_S = 1500


def _trigger(
    browser, stack: Stack, token: str, *, rounds: int | None = None, require_approval: bool = False
) -> tuple[str, dict]:
    """Open the form, check it opens valid, set the override (and the given fields), submit; the new run."""
    before = newest_run(stack.airflow_url, token, DAG)
    trigger = browser.open_trigger_form(stack.airflow_url, DAG)
    browser.shot("form-opened")
    assert trigger.is_enabled(), "the form must open valid: Trigger is disabled"
    assert "error" not in browser.find("//*[@role='dialog']").text.lower()
    # The per-stage config first: the UI rebuilds the run's conf from that editor's own copy when it changes,
    # so fields set before it would be lost.
    browser.open_section("Advanced")
    browser.paste_into_code_editor("Per-stage config", json.dumps(OVERRIDES))
    if rounds is not None:
        browser.open_section("Reinforcement learning (GRPO rounds)")
        browser.set_number("RL rounds", rounds)
    if require_approval:
        browser.open_section("Evaluation and gate")
        browser.check("Require human approval")
    browser.shot("form-filled")
    assert trigger.is_enabled(), browser.find("//*[@role='dialog']").text
    trigger.click()

    def created() -> tuple[str, dict] | None:
        run = newest_run(stack.airflow_url, token, DAG)
        return run if run is not None and (before is None or run[0] != before[0]) else None

    return browser.wait_for(created, 120, "the trigger created no run", every_s=2)


def _wait_for_run_in_grid(
    browser,
    stack: Stack,
    run_id: str,
    until: tuple[str, ...] = ("Success", "Failed"),
    timeout_s: float = RUN_TIMEOUT_S,
    token: str | None = None,
) -> str:
    """Watch the run's page (grid beside the task list) until its state badge reads one of `until`.

    With `token`, the run's end is awaited through the API first and the page opened after: the UI's polling
    costs a third of a core for as long as it is open, which the run's own stages need on 2 cores.
    """
    if token is not None:
        browser.driver.get("about:blank")
        browser.wait_for(
            lambda: (
                api(stack.airflow_url, token, f"dags/{DAG}/dagRuns/{quote(run_id)}")["state"] in ("success", "failed")
            ),
            timeout_s,
            f"run {run_id} never ended",
            every_s=5,
        )
    browser.driver.get(f"{stack.airflow_url}/dags/{DAG}/runs/{run_id}")

    def state() -> str | None:
        badge = browser._first("//*[@data-testid='state-badge']")  # the run's state, beside its id
        return badge.text.strip() if badge is not None and badge.text.strip() in until else None

    found = browser.wait_for(state, timeout_s, f"run {run_id} never reached {until}", every_s=3, refresh_every_s=15)
    browser.shot(f"run-{found}")
    return found


def _task_states(browser, stack: Stack, run_id: str, tasks: tuple[str, ...]) -> dict[str, str]:
    """The run's task list as the UI shows it (task id -> state text), once it shows every one of `tasks`.

    It waits for the tasks asked about, not for any one row: a CI run once read a list that had `promote`'s row
    and no `blocked` row (a read before every row was drawn), where all 17 tasks fit the first page.
    """
    browser.driver.get(f"{stack.airflow_url}/dags/{DAG}/runs/{run_id}")

    def rows() -> dict[str, str]:
        out = {}
        for row in browser.driver.find_elements("xpath", "//table//tbody/tr"):
            cells = row.find_elements("xpath", "./td")
            if len(cells) > 3 and cells[1].text.strip():
                out[cells[1].text.strip()] = cells[3].text.strip()
        return out if all(out.get(task) for task in tasks) else {}

    return browser.wait_for(rows, 60, f"the run's task list never showed all of {tasks}")


def test_trigger_form_run_approved_in_the_ui_succeeds_and_mlflow_shows_it(browser, ui_stack, airflow_token) -> None:
    from mlflow import MlflowClient

    started = time.monotonic()
    before = _champion_version(ui_stack)
    run_id, conf = _trigger(browser, ui_stack, airflow_token, rounds=1, require_approval=True)
    # Submitted as it opened, plus the override and the two fields set: every other default is in the conf.
    assert conf["stage_overrides"] == OVERRIDES
    assert conf["profile"] == "tiny" and conf["base_model"] is None and conf["seed"] == 0
    assert conf["rounds"] == 1 and conf["require_approval"] is True
    assert conf["advantage"] == "grpo" and conf["policy_loss"] == "clip"  # the RL section's dropdowns, as opened

    _answer_required_action(
        browser,
        ui_stack,
        airflow_token,
        run_id,
        "Approve",
        dag=DAG,
        expect=("Gate verdict: promote", "domain", "candidate", "rl_round_1"),
    )
    assert _wait_for_run_in_grid(browser, ui_stack, run_id, token=airflow_token) == "Success"
    print(f"run {run_id} succeeded {time.monotonic() - started:.0f}s after the form opened")
    states = _task_states(browser, ui_stack, run_id, ("promote", "blocked"))
    assert states["promote"] == "Success" and states["blocked"] == "Skipped", states
    # The task list shows its first page; the rounds' states come from the API that page reads.
    tis = api(ui_stack.airflow_url, airflow_token, f"dags/{DAG}/dagRuns/{quote(run_id)}/taskInstances")
    rounds = {ti["task_id"]: ti["state"] for ti in tis["task_instances"] if ti["task_id"].startswith("rl_round")}
    assert rounds["rl_round_1"] == "success" and rounds["rl_round_2"] == "skipped", rounds
    # A grid cell per task; the finished ones show the success mark.
    sft_cell = browser.find(f"//a[@data-testid='grid-{run_id}-sft']//*[@data-testid='task-state-badge']")
    assert sft_cell.is_displayed()

    # Approve moved the champion alias to the new version, which records who approved it and when.
    after = _champion_version(ui_stack)
    assert after is not None and after != before, "the champion alias did not move"
    version = MlflowClient(ui_stack.mlflow_url).get_model_version(MODEL, after)
    assert version.tags["posttrain.approved_by"] == "admin" and version.tags["posttrain.approved_at"]
    browser.driver.get(f"{ui_stack.mlflow_url}/#/models/{MODEL}")
    browser.wait_for(lambda: "champion" in browser.text(), 60, "MLflow's model page shows no champion alias")
    browser.shot("mlflow-champion")

    # The task's "MLflow run" link (under Details, Extra Links) opens the stage's MLflow run, with its metrics,
    # its dataset and its system metrics, in MLflow's model-training view.
    browser.driver.get(f"{ui_stack.airflow_url}/dags/{DAG}/runs/{run_id}/tasks/sft/details")
    href = browser.find("//a[normalize-space()='MLflow run']").get_attribute("href")
    checkpoint = browser.find("//a[normalize-space()='Checkpoint']").get_attribute("href")
    browser.shot("task-extra-links")
    assert href.startswith(ui_stack.mlflow_url) and "workflowType=machine_learning" in href, href
    browser.driver.get(href)
    browser.wait_for(
        lambda: "system/cpu_utilization_percentage" in browser.text(), 60, "the MLflow run page shows no metrics"
    )
    page = browser.text()
    assert "taskset-train" in page and "Training" in page, "the run shows no dataset"
    browser.shot("mlflow-run")
    browser.driver.get(href.replace("?", "/model-metrics?"))
    browser.wait_for(
        lambda: "grad_norm" in browser.text() and "loss" in browser.text(),
        60,
        "the MLflow run's model metrics show no training curve",
    )
    browser.shot("mlflow-run-metrics")

    # The "Checkpoint" link opens a readable listing of the stage folder, not S3's XML.
    browser.driver.get(checkpoint)
    browser.wait_for(lambda: "complete: manifest written" in browser.text(), 30, "no listing page")
    assert "model/" in browser.text() and "<ListBucketResult" not in browser.driver.page_source
    browser.shot("checkpoint-listing")


def _champion_version(stack: Stack) -> str | None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        return MlflowClient(stack.mlflow_url).get_model_version_by_alias(MODEL, "champion").version
    except MlflowException:
        return None


def _answer_required_action(
    browser, stack: Stack, token: str, run_id: str, choice: str, *, dag: str, expect: tuple[str, ...]
) -> None:
    """Once the approval of `dag`'s run waits for input, open it under Required Actions, check it shows each of
    `expect` (the verdict and the table), and click `choice`.

    The page is opened only then, as a person opens it from the run: before the task asks, the UI has no
    Required Action tab and sends that address to the task's logs, where reloading would never bring it back.
    """
    path = f"dags/{dag}/dagRuns/{quote(run_id)}/taskInstances/approval"
    browser.driver.get("about:blank")  # nothing to see until then; the UI's polling would take CPU from the run
    browser.wait_for(
        lambda: api(stack.airflow_url, token, path)["state"] == "awaiting_input",
        RUN_TIMEOUT_S,
        "the approval task never asked for input",
        every_s=5,
    )
    url = f"{stack.airflow_url}/dags/{dag}/runs/{run_id}/tasks/approval/required_actions"

    def button():
        if not browser.driver.current_url.endswith("/required_actions"):
            browser.driver.get(url)
        return browser._first(f"//button[@data-testid='hitl-option-{choice}']")

    browser.driver.get(url)
    found = browser.wait_for(button, 120, "the approval's buttons never showed under Required Actions")
    page = browser.text()
    assert all(text in page for text in expect), page
    browser.shot("required-action")
    found.click()
    browser.wait_for(
        lambda: api(stack.airflow_url, token, path)["state"] != "awaiting_input",
        120,
        f"clicking {choice} did not answer the approval",
    )
    browser.shot(f"after-{choice}")


def test_reject_in_the_ui_sends_the_run_to_blocked(browser, ui_stack, airflow_token) -> None:
    """Reject under Required Actions, on post_training's approval and branch wiring after a planted "promote"."""
    dag = "test_approval_flow"
    wait_for_dag(ui_stack.airflow_url, airflow_token, dag)
    api(ui_stack.airflow_url, airflow_token, f"dags/{dag}", "PATCH", {"is_paused": False})
    run_id = api(ui_stack.airflow_url, airflow_token, f"dags/{dag}/dagRuns", "POST", {"logical_date": None})[
        "dag_run_id"
    ]
    _answer_required_action(
        browser,
        ui_stack,
        airflow_token,
        run_id,
        "Reject",
        dag=dag,
        expect=("Gate verdict: promote", "planted for the approval test", "domain", "candidate"),
    )
    path = f"dags/{dag}/dagRuns/{quote(run_id)}"
    browser.wait_for(
        lambda: api(ui_stack.airflow_url, airflow_token, path)["state"] in ("success", "failed"),
        300,
        "the rejected run never ended",
        every_s=2,
    )
    tis = api(ui_stack.airflow_url, airflow_token, f"{path}/taskInstances")
    states = {ti["task_id"]: ti["state"] for ti in tis["task_instances"]}
    assert states["blocked"] == "success" and states["promote"] == "skipped", states
    raw = api(ui_stack.airflow_url, airflow_token, f"{path}/taskInstances/approval/xcomEntries/return_value")
    answer = json.loads(raw["value"]) if isinstance(raw["value"], str) else raw["value"]
    assert answer["asked"] is True and answer["approved"] is False and answer["by"] == "admin", answer


def test_unanswered_approval_times_out_as_a_reject(ui_stack, airflow_token) -> None:
    """Nobody answers within the deadline: the scheduler applies the default answer, Reject, by "(timeout)".

    Run on the same stack as the UI tests, through the API (there is nothing to click), with a test DAG whose
    approval waits about a second (tests/dags/approval_timeout.py)."""
    from operators.approval import TIMEOUT_BY

    dag = "test_approval_timeout"
    wait_for_dag(ui_stack.airflow_url, airflow_token, dag)
    api(ui_stack.airflow_url, airflow_token, f"dags/{dag}", "PATCH", {"is_paused": False})
    run = api(ui_stack.airflow_url, airflow_token, f"dags/{dag}/dagRuns", "POST", {"logical_date": None})
    path = f"dags/{dag}/dagRuns/{quote(run['dag_run_id'])}"
    deadline = time.monotonic() + 300
    while api(ui_stack.airflow_url, airflow_token, path)["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, "the approval never timed out"
        time.sleep(2)
    ti = api(ui_stack.airflow_url, airflow_token, f"{path}/taskInstances/approval")
    raw = api(ui_stack.airflow_url, airflow_token, f"{path}/taskInstances/approval/xcomEntries/return_value")
    answer = json.loads(raw["value"]) if isinstance(raw["value"], str) else raw["value"]  # stored as JSON
    assert ti["state"] == "success", ti
    assert answer == {"asked": True, "approved": False, "by": TIMEOUT_BY, "at": answer["at"]}
    assert answer["at"], "the timeout's time is recorded"
