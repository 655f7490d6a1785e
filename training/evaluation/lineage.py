"""Cycle to cycle: what each run of a model line started from, and its holdout pass@1 over the runs, in MLflow.

The evaluate stage calls `record_cycle` on the pipeline's parent run (the one MLflow's UI lists per DAG run):

- tags naming the champion it was compared with (for `nightly_retraining`, the one the night started from: the
  promotion comes after), the task set (the shared one it adopted, and when that was built) and the feedback
  batches the task set read, plus `posttrain.model_name`, by which the runs of one model line are found; the
  same as `lineage.json`;
- the candidate's holdout pass@1 per domain as `holdout.pass1.<domain>` metrics, so MLflow's run comparison
  charts them across runs;
- `history/holdout_pass1.json` and `.png`: each domain's candidate pass@1 over every run of the model line so
  far, oldest first, this one last.

Tags and metrics are part of the record and fail the stage when they cannot be written; the chart is not.
"""

from __future__ import annotations

import logging
from typing import Any

from training import storage
from training.evaluation.measure import pass1_rate
from training.tracking import STAGE_TAG

log = logging.getLogger("posttrain")
MODEL_TAG = "posttrain.model_name"
METRIC_PREFIX = "holdout.pass1."


def lineage(ctx: Any, model_name: str, champion: Any) -> dict[str, Any]:
    """What this run started from: champion, task set, feedback batches."""
    taskset = ctx.input("taskset")
    source_uri = taskset.config.get("adopted_from") or taskset.uri
    source = storage.read_manifest(source_uri) if source_uri != taskset.uri else taskset
    report = storage.read_json(taskset, "report.json") if "report.json" in taskset.files else {}
    batches = (report.get("feedback") or {}).get("batches") or []
    return {
        "model_name": model_name,
        "champion": (
            {"version": champion.version, "source": champion.source, "run_id": champion.run_id} if champion else None
        ),
        "taskset": {"uri": source_uri, "created_at": source.created_at if source else ""},
        "feedback_batches": [{"batch": b["batch"], "uri": b["uri"], "records": b.get("records")} for b in batches],
    }


def history(client: Any, experiment_id: str, model_name: str) -> list[dict[str, Any]]:
    """Every parent run of the model line, oldest first: its run id, name, start time and pass@1 per domain."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{MODEL_TAG}` = '{model_name}' and tags.`{STAGE_TAG}` = 'pipeline'",
        order_by=["attributes.start_time ASC"],
        max_results=1000,
    )
    return [
        {
            "run_id": r.info.run_id,
            "run_name": r.info.run_name,
            "start_time": r.info.start_time,
            "pass1": {
                k[len(METRIC_PREFIX) :]: v for k, v in sorted(r.data.metrics.items()) if k.startswith(METRIC_PREFIX)
            },
        }
        for r in runs
    ]


def history_figure(series: list[dict[str, Any]]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    domains = sorted({d for run in series for d in run["pass1"]})
    xs = list(range(1, len(series) + 1))
    for domain in domains:
        ax.plot(xs, [run["pass1"].get(domain, float("nan")) for run in series], marker="o", label=domain)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("run of the model line (oldest first)")
    ax.set_ylabel("candidate holdout pass@1")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def record_cycle(ctx: Any, report: dict[str, Any], model_name: str, champion: Any) -> dict[str, Any]:
    """Tag the parent run with this run's lineage, log its pass@1 per domain there and the model line's history."""
    client, parent = ctx.mlflow.client, ctx.mlflow.parent_run_id
    found = lineage(ctx, model_name, champion)
    tags = {
        MODEL_TAG: model_name,
        "posttrain.taskset_uri": found["taskset"]["uri"],
        "posttrain.taskset_created_at": found["taskset"]["created_at"],
        "posttrain.feedback_batches": ",".join(b["batch"] for b in found["feedback_batches"]),
        **(
            {"posttrain.champion_version": champion.version, "posttrain.champion_source": champion.source}
            if champion
            else {}
        ),
    }
    for key, value in tags.items():
        client.set_tag(parent, key, str(value))
    client.log_dict(parent, found, "lineage.json")
    candidate = report["models"]["candidate"]
    for domain in candidate["domains"]:
        client.log_metric(parent, METRIC_PREFIX + domain, pass1_rate(candidate, domain))
    series = history(client, ctx.mlflow.experiment_id, model_name)
    client.log_dict(parent, series, "history/holdout_pass1.json")
    try:
        client.log_figure(parent, history_figure(series), "history/holdout_pass1.png")
    except Exception as err:  # noqa: BLE001 - a chart is never worth failing the stage
        log.warning("[evaluate] history chart not logged: %s", err)
    return {"lineage": found, "runs": len(series)}
