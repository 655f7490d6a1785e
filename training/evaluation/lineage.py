"""Cycle to cycle: what each run of a model line started from, and its holdout pass@1 over the runs, in MLflow.

The evaluate stage calls `record_cycle` on the pipeline's parent run (the one MLflow's UI lists per DAG run):

- tags naming the champion it was compared with (for `nightly_retraining`, the one the night started from: the
  promotion comes after), the task set (the shared one it adopted, and when that was built) and the feedback
  batches the task set read, plus `posttrain.model_name`, by which the runs of one model line are found; the
  same as `lineage.json`;
- the candidate's holdout pass@1 per domain as `holdout.pass1.<domain>` metrics, so MLflow's run comparison
  charts them across runs;
- `history/holdout_pass1.json` and `.png`: each domain's candidate pass@1 over the runs of the model line up to
  this one, oldest first, this one last.

Tags and metrics are part of the record and fail the stage when they cannot be written; the chart is not.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from training import storage
from training.evaluation.measure import pass1_rate
from training.tracking import STAGE_TAG

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from training.registry import Champion
    from training.stage import StageContext

log = logging.getLogger("posttrain")
MODEL_TAG = "posttrain.model_name"
METRIC_PREFIX = "holdout.pass1."
HISTORY_JSON = "history/holdout_pass1.json"
HISTORY_PNG = "history/holdout_pass1.png"
# MLflow's tag value limit (mlflow.utils.validation.MAX_TAG_VAL_LENGTH); the full list is in lineage.json.
TAG_CHARS = 8000
# How many earlier runs of a model line the history reaches back (one search page).
HISTORY_RUNS = 1000


def lineage(ctx: StageContext, model_name: str, champion: Champion | None) -> dict[str, Any]:
    """What this run started from: the champion, the task set (the adopted one, else the run's own) and the
    feedback batches its report names (none in task sets built before feedback existed)."""
    taskset = ctx.input("taskset")
    source_uri = taskset.config.get("adopted_from") or taskset.uri
    source = storage.read_manifest(source_uri) if source_uri != taskset.uri else taskset
    # an adopted task set is a copy of every file, report.json included
    report = storage.read_json(taskset, "report.json") if "report.json" in taskset.files else {}
    batches = (report.get("feedback") or {}).get("batches") or []
    return {
        "model_name": model_name,
        "champion": (
            {"name": champion.name, "version": champion.version, "source": champion.source, "run_id": champion.run_id}
            if champion
            else None
        ),
        "taskset": {"uri": source_uri, "created_at": source.created_at if source else ""},
        "feedback_batches": [
            {"batch": b["batch"], "uri": b["uri"], "records": b.get("records"), "created_at": b.get("created_at")}
            for b in batches
        ],
    }


def history(client: Any, experiment_id: str, model_name: str, current_run_id: str) -> list[dict[str, Any]]:
    """The parent runs of the model line up to `current_run_id`, oldest first, the current one last: run id,
    name, start time and candidate pass@1 per domain.

    Runs that started after the current one (a later night, while an old night is re-run) are left out, so a
    run's history is what was known when it ran."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{MODEL_TAG}` = '{model_name}' and tags.`{STAGE_TAG}` = 'pipeline'",
        order_by=["attributes.start_time DESC"],
        max_results=HISTORY_RUNS,
    )
    current = client.get_run(current_run_id)
    earlier = [r for r in runs if r.info.run_id != current_run_id and r.info.start_time <= current.info.start_time]
    return [_point(r) for r in [*reversed(earlier), current]]


def _point(run: Any) -> dict[str, Any]:
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "start_time": run.info.start_time,
        "pass1": {
            k[len(METRIC_PREFIX) :]: v for k, v in sorted(run.data.metrics.items()) if k.startswith(METRIC_PREFIX)
        },
    }


def history_figure(series: list[dict[str, Any]]) -> Figure:
    """Each domain's pass@1 over the runs; a bare Figure (no pyplot), freed when dropped."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    xs = list(range(1, len(series) + 1))
    for domain in sorted({d for run in series for d in run["pass1"]}):
        ax.plot(xs, [run["pass1"].get(domain, float("nan")) for run in series], marker="o", label=domain)
    ax.set_xticks(xs, [str(run["run_name"]) for run in series], rotation=30, ha="right", fontsize=7)
    ax.set_xlabel("run of the model line (oldest first)")
    ax.set_ylabel("candidate holdout pass@1")
    ax.set_ylim(0, 1)
    ax.set_title("holdout pass@1 per domain over the runs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _ids_tag(ids: list[str]) -> str:
    """Comma-separated ids, cut to fit a tag value (naming how many were left out)."""
    text = ",".join(ids)
    if len(text) <= TAG_CHARS:
        return text
    kept = text[: TAG_CHARS - 32].rsplit(",", 1)[0]
    return f"{kept},...(+{len(ids) - kept.count(',') - 1} more, see lineage.json)"


def record_cycle(
    ctx: StageContext, report: dict[str, Any], model_name: str, champion: Champion | None
) -> dict[str, Any]:
    """Tag the parent run with this run's lineage, log the candidate's pass@1 per domain there and the model
    line's history; returns {"lineage": what lineage.json holds, "runs": runs in the history}.

    `champion` is the registered champion the stage compared with (None when there is none yet or it was not
    compared); `report` is the evaluate report (report["models"]["candidate"]["domains"])."""
    from mlflow.entities import Metric, RunTag

    client, parent = ctx.mlflow.client, ctx.mlflow.parent_run_id
    found = lineage(ctx, model_name, champion)
    tags = {
        MODEL_TAG: model_name,
        "posttrain.taskset_uri": found["taskset"]["uri"],
        "posttrain.taskset_created_at": found["taskset"]["created_at"],
        "posttrain.feedback_batches": _ids_tag([b["batch"] for b in found["feedback_batches"]]),
        **(
            {"posttrain.champion_version": champion.version, "posttrain.champion_source": champion.source}
            if champion
            else {}
        ),
    }
    candidate = report["models"]["candidate"]
    ts = int(time.time() * 1000)
    metrics = [Metric(METRIC_PREFIX + d, pass1_rate(candidate, d), ts, 0) for d in sorted(candidate["domains"])]
    # one call: the tags and metrics are the record, and a failure here fails the stage
    client.log_batch(parent, metrics=metrics, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    client.log_dict(parent, found, "lineage.json")
    series = history(client, ctx.mlflow.experiment_id, model_name, parent)
    client.log_dict(parent, series, HISTORY_JSON)
    try:
        client.log_figure(parent, history_figure(series), HISTORY_PNG)
    except Exception as err:  # noqa: BLE001 - a chart is never worth failing the stage
        log.warning("[%s] history chart %s not logged: %s", ctx.stage, HISTORY_PNG, err)
    return {"lineage": found, "runs": len(series)}
