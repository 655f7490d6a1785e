"""`make demo`: start the embedded stack and run the tiny pipeline end to end, then say where to look.

Each stage runs exactly as the Airflow operator runs it (`posttrain <stage> --run <uri>` in a subprocess with
the stack's environment), against the stack's S3 server and MLflow server, under one run URI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from infra.local.stack import Stack  # noqa: E402
from training.cli import COMMANDS  # noqa: E402
from training.stage import parse_result  # noqa: E402

# (command, extra args, stage folder) in pipeline order.
PIPELINE = [
    ("build-taskset", [], "taskset"),
    ("sft", [], "sft"),
    ("rl-round", ["--round", "1"], "rl_round_1"),
    ("rl-round", ["--round", "2"], "rl_round_2"),
    ("evaluate", [], "evaluate"),
    ("gate", [], "gate"),
    ("promote", [], "promote"),
]


def main() -> int:
    stack = Stack()
    print("== starting the embedded stack", flush=True)
    stack.up()
    env = {**os.environ, **stack.client_env()}
    run_id = time.strftime("demo-%Y%m%d-%H%M%S")
    run_uri = f"s3://posttrain/runs/{run_id}"
    print(f"\n== running the tiny pipeline: {run_uri}", flush=True)
    results = {}
    for command, extra, folder in PIPELINE:
        if command not in COMMANDS:
            print(f"  {folder:12s} (stage not in this build yet)")
            continue
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "training.cli", command, "--run", run_uri, *extra],
                              env=env, stdout=subprocess.PIPE, text=True)
        result = parse_result(proc.stdout)
        if proc.returncode != 0 or result is None:
            print(f"  {folder:12s} FAILED (exit {proc.returncode}); see the log above", flush=True)
            return 1
        results[folder] = result
        print(f"  {folder:12s} done in {time.monotonic() - started:5.1f}s  {json.dumps(result['summary'])[:160]}",
              flush=True)

    print("\n== where to look")
    print(f"  MLflow UI : {stack.mlflow_url}   (experiment 'posttrain', parent run '{run_id}')")
    print(f"  Airflow UI: {stack.airflow_url}   (user admin, password {stack.airflow_password()})")
    print(f"  Outputs   : {run_uri}/<stage>/manifest.json   (posttrain inspect {run_uri}/<stage>)")
    if "gate" in results:
        print(f"  Gate      : {json.dumps(results['gate']['summary'])}")
    print(f"  Stop with : make down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
