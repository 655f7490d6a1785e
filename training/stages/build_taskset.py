"""Stage `taskset` (`posttrain build-taskset`): generate and/or load tasks, validate, deduplicate, split, mix,
record.

    posttrain build-taskset --run file:///tmp/runs/r1                         # tiny profile, a few seconds
    posttrain build-taskset --config taskset.yaml --run s3://posttrain/runs/r1 --set holdout_fraction=0.2

Output under <run>/taskset/ (committed by run_stage, manifest last):
    train.parquet     tasks for SFT/RL, at the configured domain mix
    holdout.parquet   held-out tasks for evaluation (per domain, stratified by difficulty)
    report.json       counts per split/domain/difficulty, validation/quarantine, dedup and n-gram overlap reports
    quarantine.jsonl  bad source rows, only with `quarantine: true` and only when there were some
    field.parquet     the feedback `field` slice's verifiable tasks (domain "field"), when there are some
    field.jsonl       every rated feedback record without a reference (the production failure rate's data)

Pipeline (`build`): generate (tiny) -> load sources -> validate every row (bad rows fail the stage with
file:row: field errors, exit 2, or go to quarantine) -> dedup by normalised prompt -> stratified split ->
drop train tasks sharing an n-gram with the holdout (n-grams common across the corpus ignored) -> mix train
domains. A domain losing more than `max_filter_loss` of its rows to dedup or decontamination, or an empty
split, fails the stage (exit 2) with the filter and the counts. Feedback batches (`feedback`, stored by
`posttrain feedback import`) add their records with an answer or tests as tasks of their domain, through the
same dedup, split and decontamination, and their rated records without one as the `field` slice, which train
tasks are decontaminated against like the holdout. MLflow gets the counts as metrics,
report.json, a sample table (`samples.json`) and a bar chart of counts (`counts.png`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from training import storage
from training.cli import stage_cli
from training.config import ConfigBase
from training.rewards import verifier_names
from training.stage import StageContext
from training.tasksets.dedup import dedup, normalize_text, overlap_filter
from training.tasksets.feedback import FeedbackRecord, failure_rate
from training.tasksets.feedback_store import read_batches
from training.tasksets.generators import DOMAIN_VERIFIER, generate
from training.tasksets.io import save_tasks
from training.tasksets.loaders import load_source, source_label
from training.tasksets.schema import Task
from training.tasksets.sources import PROFILES, SourceSpec
from training.tasksets.split import hash_split, mix_train, stratified_split
from training.tasksets.validate import (
    RawRow,
    RowError,
    TasksetValidationError,
    Validator,
    validate_rows,
    validate_tasks,
    write_quarantine,
)

__all__ = ["TasksetConfig", "TasksetEmptied", "SourceSpec", "Build", "build", "body", "cli", "STAGE"]
log = logging.getLogger("posttrain")
STAGE = "taskset"


@dataclass(frozen=True)
class TasksetConfig(ConfigBase):
    """Build a validated, deduplicated, split task set under <run>/taskset/.

    profile:          "tiny" = synthetic tasks from training/tasksets/generators.py (plus any `sources`);
                      "data" = only the `sources`.
    seed:             generators, split and mixing are deterministic by it.
    total:            tiny: tasks generated before dedup, spread over the domains of `mix` by ratio
                      (overridden per domain by `counts`).
    counts:           tiny: tasks to generate per domain, e.g. {"math": 3000}; empty = from total and mix.
    mix:              domain mixing ratios of the train split (subsampled to them when some domain's share is
                      off by more than `mix_tolerance`); domains not named are kept whole, ratio 0 drops one.
    mix_tolerance:    allowed absolute difference between a domain's train share and its target share.
    difficulties:     tiny: the difficulty levels to generate (1 easy .. 5 hard), round-robin.
    domain_difficulties: tiny: per domain, levels that replace `difficulties` for that domain, e.g.
                      {"code": [2, 3]}: a measurable profile puts each domain where its baseline has headroom.
    holdout_fraction: share of each (domain, difficulty) group held out for evaluation (stratified).
    split:            how tasks are held out: "hash" (a pure function of each task's content and `split_salt`:
                      a task once in the holdout stays there across rebuilds, and a train task never enters
                      it, so night-to-night gates compare the same questions), "shuffle" (a seeded shuffle per
                      (domain, difficulty) group: exact proportions, but a task's side moves when the data
                      changes), or "" (the default): "hash" for profile data, "shuffle" for tiny (its figures
                      were tuned on that split).
    ids:              "source" (the sources' own ids: a hub or file adapter numbers rows, so removing a row
                      renumbers the rest) or "content" (`<domain>-<sha256 of the normalised prompt>`, the
                      source's id kept as metadata.source_id): a task keeps its id across rebuilds, so
                      night-to-night gates pair the same questions. Recipes use "content".
    split_salt:       the hash split's salt: fixed per model line; a new salt (or fraction) is a new holdout.
    previous:         the task set this one follows (a task set folder, or a folder whose latest.json points at
                      one; `taskset_refresh` names the shared one): when its holdout was drawn differently
                      (another split mode, fraction, salt or ids), the build is refused, since tasks the champion
                      trained on could then sit in the holdout it is judged on. "" = no check.
    new_holdout:      start a new holdout anyway (a deliberate new salt or fraction); the next gate then judges
                      the champion on tasks it may have trained on, which the report records.
    ngram:            word n-gram size of the holdout contamination check; train tasks sharing one with a
                      holdout prompt are dropped. 13 as in GPT-3's decontamination (Brown et al. 2020, App. C).
    sources:          real data, a list of SourceSpec objects ({"path": ..., "adapter": ...}).
    quarantine:       bad source rows are written to quarantine.jsonl and counted instead of failing the stage.
    sample_rows:      tasks per domain in the MLflow sample table.
    max_filter_loss:  a domain losing more than this share of its rows to one filter (dedup, decontamination)
                      fails the stage, naming the filter and the counts; so does a split left empty. 1 = never.
    ngram_common:     decontamination ignores n-grams found in at least this share of all prompts (and in at
                      least 10): shared instructions and templates are not contamination.
    feedback:         feedback batches (`posttrain feedback import`): URIs of batch folders or of roots whose
                      complete batches are all read (a record in two batches counts once). Their tasks join
                      the sources; their rated records without a reference become the `field` slice.
    reward_weights:   per domain, the verifiers its reward combines and their weights, e.g.
                      {"math": {"math": 0.9, "format": 0.1}}; stamped on each task as metadata.reward_weights
                      (a task that already names its own keeps them). Empty: each task's verifier alone.
    """

    profile: str = "tiny"
    seed: int = 0
    total: int = 4000
    counts: dict[str, int] = field(default_factory=dict)
    mix: dict[str, float] = field(default_factory=lambda: {"math": 0.5, "code": 0.25, "extraction": 0.25})
    mix_tolerance: float = 0.05
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    domain_difficulties: dict[str, list[int]] = field(default_factory=dict)
    holdout_fraction: float = 0.1
    split: str = ""
    split_salt: str = "posttrain"
    ids: str = "source"
    previous: str = ""
    new_holdout: bool = False
    ngram: int = 13
    sources: list[SourceSpec] = field(default_factory=list)
    feedback: list[str] = field(default_factory=list)
    quarantine: bool = False
    sample_rows: int = 20
    reward_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    max_filter_loss: float = 0.75
    ngram_common: float = 0.01

    def split_mode(self) -> str:
        """ "hash" or "shuffle": `split`, else by profile."""
        return self.split or ("hash" if self.profile == "data" else "shuffle")

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.split not in ("", "hash", "shuffle"):
            raise ValueError(f"split must be 'hash', 'shuffle' or '' (by profile), got {self.split!r}")
        if self.ids not in ("source", "content"):
            raise ValueError(f"ids must be 'source' or 'content', got {self.ids!r}")
        if self.ngram < 1:
            raise ValueError("ngram must be >= 1")
        if not 0.0 < self.max_filter_loss <= 1.0 or not 0.0 <= self.ngram_common <= 1.0:
            raise ValueError("max_filter_loss must be in (0, 1] and ngram_common in [0, 1]")
        if any(r < 0 for r in self.mix.values()):
            raise ValueError("mix ratios must be >= 0")
        for name, levels in {
            "difficulties": self.difficulties,
            **{f"domain_difficulties[{d!r}]": v for d, v in self.domain_difficulties.items()},
        }.items():
            if not levels or any(not 1 <= d <= 5 for d in levels):
                raise ValueError(f"{name} must be levels 1..5, got {levels}")
        if self.profile == "data" and not self.sources and not self.feedback:
            raise ValueError('profile "data" needs at least one entry in sources (or feedback)')
        if self.total < 0 or any(n < 0 for n in self.counts.values()):
            raise ValueError("total and counts must be >= 0")
        if self.profile == "tiny":
            self.domain_counts()  # unknown generator domains fail here, as a config error

            unknown_levels = sorted(set(self.domain_difficulties) - set(DOMAIN_VERIFIER))
            if unknown_levels:
                raise ValueError(
                    f"domain_difficulties: unknown domain(s) {unknown_levels}; known: {', '.join(DOMAIN_VERIFIER)}"
                )

        for domain, weights in self.reward_weights.items():
            unknown = sorted(set(weights) - set(verifier_names()))
            if unknown:
                raise ValueError(
                    f"reward_weights[{domain!r}]: unknown verifier(s) {unknown}; known: {', '.join(verifier_names())}"
                )
            if any(w < 0 for w in weights.values()) or not any(w > 0 for w in weights.values()):
                raise ValueError(f"reward_weights[{domain!r}]: weights must be >= 0 and not all 0")

    def domain_counts(self) -> dict[str, int]:
        """tiny: how many tasks to generate per domain."""

        if self.counts:
            unknown = sorted(set(self.counts) - set(DOMAIN_VERIFIER))
            if unknown:
                raise ValueError(f"counts: no generator for domain(s) {unknown}; known: {', '.join(DOMAIN_VERIFIER)}")
            return dict(self.counts)
        ratios = {d: r for d, r in self.mix.items() if d in DOMAIN_VERIFIER and r > 0}
        total_r = sum(ratios.values())
        return {d: round(self.total * r / total_r) for d, r in ratios.items()} if total_r else {}


@dataclass
class Build:
    train: list[Task]
    holdout: list[Task]
    report: dict[str, Any]
    quarantined: list[tuple[str, RawRow]] = field(default_factory=list)
    field_tasks: list[Task] = field(default_factory=list)  # the feedback slice's verifiable tasks
    field_records: list[FeedbackRecord] = field(default_factory=list)  # every rated record without a reference


class HoldoutMoved(ValueError):
    """The holdout would be drawn differently from the previous task set's: refused unless `new_holdout`."""


def split_settings(config: TasksetConfig) -> dict[str, Any]:
    """What decides which tasks are held out (report.json's "split")."""
    mode = config.split_mode()
    return {
        "mode": mode,
        "fraction": config.holdout_fraction,
        "ids": config.ids,
        **({"salt": config.split_salt} if mode == "hash" else {}),
    }


def check_holdout_kept(config: TasksetConfig) -> dict[str, Any] | None:
    """Compare this build's split with `config.previous`'s; raise HoldoutMoved when they differ (unless
    `new_holdout`). Returns what was compared, for the report; None without a previous task set."""
    if not config.previous:
        return None
    manifest = storage.read_manifest(config.previous) or storage.resolve_latest(config.previous)
    if manifest is None or "report.json" not in manifest.files:
        return None  # the first task set of this line
    before = storage.read_json(manifest, "report.json").get("split") or {}
    now = split_settings(config)
    changed = {k: (before.get(k, "source" if k == "ids" else None), v) for k, v in now.items()}
    changed = {k: pair for k, pair in changed.items() if pair[0] != pair[1]}
    if changed and not config.new_holdout:
        what = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise HoldoutMoved(
            f"the holdout would move: {manifest.uri} was split with {before}, this build would change {what}. "
            "Tasks the champion trained on could then enter the holdout it is judged on. Keep the recipe's "
            "holdout_fraction and split_salt, or set new_holdout: true to start a new holdout on purpose."
        )
    return {"previous": manifest.uri, "changed": sorted(changed), "new_holdout": bool(changed)}


class TasksetEmptied(ValueError):
    """A filter took (nearly) all of a domain, or a split is empty: the stage fails instead of training on it."""


def content_id(task: Task) -> Task:
    """The task under an id that is a function of its domain and normalised prompt; its old id in metadata."""
    digest = hashlib.sha256(f"{task.domain}\x1f{normalize_text(task.prompt)}".encode()).hexdigest()[:16]
    return replace(task, id=f"{task.domain}-{digest}", metadata={**task.metadata, "source_id": task.id})


def check_filter_loss(name: str, before: list[Task], after: list[Task], max_loss: float) -> None:
    """Fail when `name` took more than `max_loss` of some domain's rows."""
    was, now = Counter(t.domain for t in before), Counter(t.domain for t in after)
    for domain in sorted(was):
        lost = was[domain] - now[domain]
        if lost and lost / was[domain] > max_loss:
            raise TasksetEmptied(
                f"{name} dropped {lost} of {was[domain]} {domain!r} rows ({lost / was[domain]:.0%}, more than "
                f"max_filter_loss={max_loss:g}); {now[domain]} left. Check the source for duplicated or templated "
                "prompts, or raise max_filter_loss if this is expected."
            )


def check_not_empty(train: list[Task], holdout: list[Task], holdout_fraction: float, steps: dict[str, int]) -> None:
    trail = ", ".join(f"{k}: {v}" for k, v in steps.items())
    if not train:
        raise TasksetEmptied(f"the train split is empty ({trail}, after mixing: 0)")
    if holdout_fraction > 0 and not holdout:
        raise TasksetEmptied(
            f"the holdout split is empty ({trail}; holdout_fraction={holdout_fraction:g} of "
            "each domain and difficulty needs groups of at least 2 tasks)"
        )


def counts(tasks: list[Task]) -> dict[str, Any]:
    by_dd: dict[str, dict[str, int]] = {}
    for (domain, level), n in sorted(Counter((t.domain, t.difficulty) for t in tasks).items()):
        by_dd.setdefault(domain, {})[str(level)] = n
    return {
        "total": len(tasks),
        "by_domain": dict(sorted(Counter(t.domain for t in tasks).items())),
        "by_domain_difficulty": by_dd,
    }


def build(config: TasksetConfig, cache_dir: str | None = None) -> Build:
    """The whole task-set pipeline in memory; raises TasksetValidationError on bad rows unless quarantining."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    validator = Validator()
    tasks: list[Task] = []
    inputs: dict[str, int] = {}
    if config.profile == "tiny":
        for domain, n in config.domain_counts().items():
            levels = config.domain_difficulties.get(domain, config.difficulties)
            generated = generate(domain, n, config.seed, tuple(levels))
            inputs[f"generated:{domain}"] = len(generated)
            tasks += generated
        timings["generate"] = time.perf_counter() - t0
        t = time.perf_counter()
        checked = validate_tasks(tasks, "<generated>", validator)
        if checked.errors:  # a generator bug, never quarantined
            raise TasksetValidationError(checked.errors)
        timings["validate"] = time.perf_counter() - t
    t = time.perf_counter()
    errors: list[RowError] = []
    quarantined: list[tuple[str, RawRow]] = []
    for spec in config.sources:
        label = source_label(spec)
        result = validate_rows(load_source(spec, cache_dir), label, validator)
        inputs[label] = result.rows
        tasks += result.tasks
        errors += result.errors
        quarantined += [(label, rr) for rr in result.bad]
        if result.rows == 0 and not result.errors:
            errors.append(RowError(label, None, None, "no task rows"))
    if config.sources:
        timings["load_sources"] = time.perf_counter() - t
    field_records: list[FeedbackRecord] = []
    field_tasks: list[Task] = []
    feedback_report: dict[str, Any] = {}
    if config.feedback:
        t = time.perf_counter()
        batches = read_batches(config.feedback)
        for batch, record in batches.records:
            if record.kind == "task":
                tasks.append(record.as_task(batch))
            else:
                field_records.append(record)
                task = record.field_task(batch)
                if task is not None:
                    field_tasks.append(task)
        for b in batches.batches:
            inputs[f"feedback:{b['batch']}"] = b["records"]
        feedback_report = {
            "batches": batches.batches,
            "records": len(batches.records),
            "duplicates_across_batches": batches.duplicates,
            "tasks": len(batches.records) - len(field_records),
            "field": len(field_records),
            "field_verifiable": len(field_tasks),
            "production": failure_rate([r for _, r in batches.records]),
        }
        timings["feedback"] = time.perf_counter() - t
    if config.reward_weights:
        tasks = [
            replace(t, metadata={**t.metadata, "reward_weights": dict(config.reward_weights[t.domain])})
            if t.domain in config.reward_weights and "reward_weights" not in t.metadata
            else t
            for t in tasks
        ]
    file_level = [e for e in errors if e.row is None]
    if errors and (not config.quarantine or file_level):
        raise TasksetValidationError(file_level if config.quarantine else errors)
    t = time.perf_counter()
    unique, dedup_report = dedup(tasks)
    check_filter_loss("dedup (same normalised prompt)", tasks, unique, config.max_filter_loss)
    if config.ids == "content":  # unique after dedup: one task per normalised prompt
        unique = [content_id(task) for task in unique]
    timings["dedup"] = time.perf_counter() - t
    t = time.perf_counter()
    if config.split_mode() == "hash":
        train, holdout = hash_split(unique, config.holdout_fraction, config.split_salt)
    else:
        train, holdout = stratified_split(unique, config.holdout_fraction, config.seed)
    if field_tasks:  # a real user's prompt held for evaluation is not trained on, even when short
        asked = {normalize_text(f.prompt) for f in field_tasks}
        train = [task for task in train if normalize_text(task.prompt) not in asked]
    common = max(10, math.ceil(config.ngram_common * len(unique))) if config.ngram_common > 0 else 0
    clean, overlap_report = overlap_filter(train, [*holdout, *field_tasks], config.ngram, common_min_prompts=common)
    check_filter_loss(
        f"decontamination ({config.ngram}-gram overlap with the holdout)", train, clean, config.max_filter_loss
    )
    train, mix_report = mix_train(clean, config.mix, config.seed, config.mix_tolerance)
    check_not_empty(
        train,
        holdout,
        config.holdout_fraction,
        {"input": len(tasks), "after dedup": len(unique), "after decontamination": len(clean)},
    )
    timings["split"] = time.perf_counter() - t
    report = {
        "profile": config.profile,
        "seed": config.seed,
        # how the holdout was drawn: with "hash", the same salt and fraction give the same side to every task
        "split": split_settings(config),
        "inputs": inputs,
        "counts": {
            "train": counts(train),
            "holdout": counts(holdout),
            **({"field": counts(field_tasks)} if field_tasks else {}),
        },
        "validation": {
            "errors": len(errors),
            "quarantined": len(quarantined),
            "examples": [str(e) for e in errors[:20]],
        },
        "dedup": dedup_report,
        "overlap": overlap_report,
        "mixing": mix_report,
        "timings_s": {k: round(v, 4) for k, v in timings.items()},
        **({"feedback": feedback_report} if config.feedback else {}),
    }
    return Build(train, holdout, report, quarantined, field_tasks, field_records)


def _samples(train: list[Task], holdout: list[Task], per_domain: int) -> list[dict[str, Any]]:
    rows = []
    for split, tasks in (("train", train), ("holdout", holdout)):
        taken: Counter[str] = Counter()
        for t in tasks:
            if taken[t.domain] < (per_domain if split == "train" else max(per_domain // 4, 1)):
                taken[t.domain] += 1
                rows.append(
                    {
                        "split": split,
                        "id": t.id,
                        "domain": t.domain,
                        "difficulty": t.difficulty,
                        "verifier": t.verifier,
                        "prompt": t.prompt,
                        "reference": t.reference,
                        "answer": t.answer or "",
                        "tests": len(t.tests) if isinstance(t.tests, list) else 1,
                    }
                )
    return rows


def _figure(report: dict[str, Any]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    labels, train_n, hold_n = [], [], []
    train_dd = report["counts"]["train"]["by_domain_difficulty"]
    hold_dd = report["counts"]["holdout"]["by_domain_difficulty"]
    for domain in sorted(set(train_dd) | set(hold_dd)):
        for level in sorted(set(train_dd.get(domain, {})) | set(hold_dd.get(domain, {})), key=int):
            labels.append(f"{domain}\nd{level}")
            train_n.append(train_dd.get(domain, {}).get(level, 0))
            hold_n.append(hold_dd.get(domain, {}).get(level, 0))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], train_n, width=0.4, label="train")
    ax.bar([x + 0.2 for x in xs], hold_n, width=0.4, label="holdout")
    ax.set_xticks(list(xs), labels, fontsize=6)
    ax.set_ylabel("tasks")
    ax.set_title("task counts per domain and difficulty")
    ax.legend()
    fig.tight_layout()
    return fig


def _metrics(report: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for split in ("train", "holdout"):
        c = report["counts"][split]
        out[f"{split}.total"] = c["total"]
        for domain, n in c["by_domain"].items():
            out[f"{split}.{domain}"] = n
        for domain, levels in c["by_domain_difficulty"].items():
            for level, n in levels.items():
                out[f"{split}.{domain}.d{level}"] = n
    out["dedup.exact"] = report["dedup"]["exact_duplicates"]
    out["dedup.near"] = report["dedup"]["near_duplicates"]
    out["overlap.contaminated"] = report["overlap"]["contaminated"]
    out["mixing.dropped"] = report["mixing"]["dropped"]
    out["validation.quarantined"] = report["validation"]["quarantined"]
    if "feedback" in report:
        fb = report["feedback"]
        out["feedback.records"] = fb["records"]
        out["feedback.tasks"] = fb["tasks"]
        out["feedback.field"] = fb["field"]
        out["feedback.field_verifiable"] = fb["field_verifiable"]
        if fb["production"]["failure_rate"] is not None:
            out["feedback.production_failure_rate"] = fb["production"]["failure_rate"]
    return out


def body(ctx: StageContext) -> dict[str, Any]:
    """The stage body for `run_stage` (training/stage.py)."""

    config: TasksetConfig = ctx.config  # type: ignore[assignment]  # run_stage was given a TasksetConfig
    started = time.perf_counter()
    kept = check_holdout_kept(config)
    result = build(config, cache_dir=str(ctx.workdir / "hf-cache"))
    report = result.report
    if kept is not None:
        report["split"]["checked_against"] = kept
    t = time.perf_counter()
    for name, tasks in (("train", result.train), ("holdout", result.holdout)):
        path = ctx.workdir / f"{name}.parquet"
        save_tasks(tasks, path)
        ctx.writer.put_file(path, f"{name}.parquet")
    if result.field_tasks:
        path = ctx.workdir / "field.parquet"
        save_tasks(result.field_tasks, path)
        ctx.writer.put_file(path, "field.parquet")
    if result.field_records:
        lines = "".join(
            json.dumps(r.to_json(), ensure_ascii=False, sort_keys=True) + "\n" for r in result.field_records
        )
        ctx.writer.put_bytes(lines.encode(), "field.jsonl")
    if result.quarantined:
        path = ctx.workdir / "quarantine.jsonl"
        write_quarantine([rr for _, rr in result.quarantined], path)
        ctx.writer.put_file(path, "quarantine.jsonl")
    report["timings_s"]["write"] = round(time.perf_counter() - t, 4)
    report["timings_s"]["total"] = round(time.perf_counter() - started, 4)
    ctx.writer.put_json(report, "report.json")
    ctx.mlflow.log_metrics(_metrics(report))
    ctx.mlflow.log_dict(report, "report.json")
    ctx.mlflow.log_table(_samples(result.train, result.holdout, config.sample_rows), "samples.json")
    try:
        ctx.mlflow.log_figure(_figure(report), "counts.png")
    except Exception as err:  # noqa: BLE001 - a chart is never worth failing the stage
        log.warning("[taskset] counts chart not logged: %s", err)
    ctx.progress("built", train=len(result.train), holdout=len(result.holdout), quarantined=len(result.quarantined))
    return {
        "train": len(result.train),
        "holdout": len(result.holdout),
        "train_by_domain": report["counts"]["train"]["by_domain"],
        "holdout_by_domain": report["counts"]["holdout"]["by_domain"],
        "quarantined": len(result.quarantined),
        **(
            {"feedback_records": report["feedback"]["records"], "field": len(result.field_records)}
            if "feedback" in report
            else {}
        ),
        "contaminated": report["overlap"]["contaminated"],
        "duplicates": report["dedup"]["exact_duplicates"] + report["dedup"]["near_duplicates"],
    }


def cli(argv: list[str], prog: str = "posttrain build-taskset") -> int:
    return stage_cli(
        argv,
        prog,
        "Build the verifiable task set: generate/load, validate, dedup, split.",
        TasksetConfig,
        STAGE,
        body,
        user_errors=(TasksetValidationError, TasksetEmptied, HoldoutMoved),
    )
