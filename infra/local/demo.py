"""`make demo`: start the embedded stack, run the `post_training` DAG on the tiny profile through Airflow's
scheduler, follow it in the terminal, then say where to look and what the gate decided.

The run is a real Airflow DAG run (visible in the UI while it runs): triggered over Airflow's REST API,
scheduled by the scheduler, each stage a `posttrain <stage>` process writing to the stack's S3 server and
logging to its MLflow server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from infra.local.stack import AIRFLOW_USER, Stack  # noqa: E402

DAG_ID = "post_training"


class Airflow:
    """The few REST calls the demo needs (Airflow 3 public API, bearer token from the simple auth manager)."""

    def __init__(self, base: str, password: str) -> None:
        self.base = base.rstrip("/")
        self.password = password
        self.token = ""

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.base}{path}",
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def login(self) -> None:
        self.token = self._request("POST", "/auth/token", {"username": AIRFLOW_USER, "password": self.password})[
            "access_token"
        ]

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            return self._request(method, path, body)
        except urllib.error.HTTPError as err:
            if err.code == 401:  # token expired during a long run
                self.login()
                return self._request(method, path, body)
            raise


def wait_for_dag(api: Airflow, timeout_s: float = 180, dag_id: str = DAG_ID) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            api.call("GET", f"/api/v2/dags/{dag_id}")
            return
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
        time.sleep(3)
    raise SystemExit(
        f"the DAG processor did not pick up {dag_id} within {timeout_s:.0f}s; see .local/logs/airflow-dag-processor.log"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the DAG run")
    args = parser.parse_args()

    stack = Stack()
    print("== starting the embedded stack (S3, MLflow, Airflow)", flush=True)
    stack.up()
    api = Airflow(stack.airflow_url, stack.airflow_password() or "")
    api.login()
    wait_for_dag(api)
    api.call("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})
    run = api.call(
        "POST",
        f"/api/v2/dags/{DAG_ID}/dagRuns",
        {"logical_date": None, "conf": {"rounds": args.rounds}, "note": "make demo"},
    )
    run_id = run["dag_run_id"]
    print(f"\n== triggered {DAG_ID} run {run_id}; following it (also live in the Airflow UI)", flush=True)

    seen: dict[str, str] = {}
    started = time.monotonic()
    state = run["state"]
    while time.monotonic() - started < args.timeout:
        tis = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        for ti in sorted(tis, key=lambda t: (t.get("start_date") or "~", t["task_id"])):
            if ti["state"] and seen.get(ti["task_id"]) != ti["state"]:
                seen[ti["task_id"]] = ti["state"]
                print(f"  {time.monotonic() - started:6.0f}s  {ti['task_id']:14s} {ti['state']}", flush=True)
        state = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            break
        time.sleep(5)

    verdict = None
    try:
        entry = api.call("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/gate/xcomEntries/return_value")
        value = entry["value"]
        verdict = (json.loads(value) if isinstance(value, str) else value).get("summary")
    except (urllib.error.HTTPError, ValueError, AttributeError):
        pass

    print(f"\n== {DAG_ID} run {run_id}: {state} in {time.monotonic() - started:.0f}s")
    print(
        f"  Airflow UI: {stack.airflow_url}/dags/{DAG_ID}  (user {AIRFLOW_USER}, password {stack.airflow_password()})"
    )
    print(f"  MLflow UI : {stack.mlflow_url}  (experiment 'posttrain': parent run per pipeline run, nested stages)")
    from operators.pipeline import DEFAULT_RUN_ROOT, run_slug

    run_uri = f"{DEFAULT_RUN_ROOT}/{run_slug(run_id)}"
    print(
        f"  Outputs   : {run_uri}/<stage>/  (S3 at {stack.s3_url}; `source .local/env` then "
        f"`posttrain inspect {run_uri}/evaluate`)"
    )
    print(f"  Report    : {run_uri}/evaluate/report.html (also in the evaluate stage's MLflow run)")
    if verdict:
        print(f"  Gate      : {verdict.get('decision', '?').upper()}")
        for reason in verdict.get("reasons", []):
            print(f"              {reason}")
    print("  Stop with : make down")
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
