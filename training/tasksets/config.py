"""The task-set stage's config (`posttrain build-taskset`), and the spec of one real-data source."""

from __future__ import annotations

from dataclasses import dataclass, field

from training.config import ConfigBase

PROFILES = ("tiny", "data")
ADAPTERS = ("tasks", "gsm8k", "mbpp", "humaneval", "mapped")


@dataclass(frozen=True)
class SourceSpec:
    """One real-data source, loaded through `datasets` and turned into Task rows by an adapter.

    path:       a hub id ("openai/gsm8k") or a local file (.jsonl / .json / .parquet; .jsonl is read line by
                line so every error names its line).
    adapter:    "tasks" (rows already in the Task shape), "gsm8k" (question / answer with "#### X"),
                "mbpp" (text or prompt / code / test_list of asserts), "humaneval" (prompt / canonical_solution /
                test with check(candidate) / entry_point), "mapped" (any JSONL, through `fields`).
    name:       hub config name ("main" for gsm8k); split: hub split ("train", "test").
    limit:      keep the first `limit` rows (0 = all).
    fields:     mapped: Task field -> source column, e.g. {"prompt": "question", "answer": "label"}. Unmapped
                fields keep the column of the same name when it exists.
    domain, verifier, difficulty: when set, they replace what the gsm8k/mbpp/humaneval adapters derive, and
                fill in tasks/mapped rows that lack the field.
    id_prefix:  prefix of generated ids (default: the file stem or hub id and "-"): "gsm8k-" -> "gsm8k-17"
                (the row number; MBPP uses its task_id); HumanEval ids are task_id, prefixed only when set.
    """

    path: str
    adapter: str = "tasks"
    name: str | None = None
    split: str = "train"
    limit: int = 0
    fields: dict[str, str] = field(default_factory=dict)
    domain: str = ""
    verifier: str = ""
    difficulty: int = 0
    id_prefix: str = ""

    def __post_init__(self) -> None:
        if self.adapter not in ADAPTERS:
            raise ValueError(f"sources: adapter {self.adapter!r} is not one of {', '.join(ADAPTERS)}")
        if self.limit < 0:
            raise ValueError("sources: limit must be >= 0")


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
    holdout_fraction: share of each (domain, difficulty) group held out for evaluation (stratified).
    ngram:            word n-gram size of the holdout contamination check; train tasks sharing one with a
                      holdout prompt are dropped. 13 as in GPT-3's decontamination (Brown et al. 2020, App. C).
    sources:          real data, a list of SourceSpec objects ({"path": ..., "adapter": ...}).
    quarantine:       bad source rows are written to quarantine.jsonl and counted instead of failing the stage.
    sample_rows:      tasks per domain in the MLflow sample table.
    """

    profile: str = "tiny"
    seed: int = 0
    total: int = 4000
    counts: dict[str, int] = field(default_factory=dict)
    mix: dict[str, float] = field(default_factory=lambda: {"math": 0.5, "code": 0.25, "extraction": 0.25})
    mix_tolerance: float = 0.05
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    holdout_fraction: float = 0.1
    ngram: int = 13
    sources: list[SourceSpec] = field(default_factory=list)
    quarantine: bool = False
    sample_rows: int = 20

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.ngram < 1:
            raise ValueError("ngram must be >= 1")
        if any(r < 0 for r in self.mix.values()):
            raise ValueError("mix ratios must be >= 0")
        if any(not 1 <= d <= 5 for d in self.difficulties) or not self.difficulties:
            raise ValueError(f"difficulties must be levels 1..5, got {self.difficulties}")
        if self.profile == "data" and not self.sources:
            raise ValueError('profile "data" needs at least one entry in sources')
        if self.total < 0 or any(n < 0 for n in self.counts.values()):
            raise ValueError("total and counts must be >= 0")
        if self.profile == "tiny":
            self.domain_counts()  # unknown generator domains fail here, as a config error

    def domain_counts(self) -> dict[str, int]:
        """tiny: how many tasks to generate per domain."""
        from training.tasksets.generators import DOMAIN_VERIFIER

        if self.counts:
            unknown = sorted(set(self.counts) - set(DOMAIN_VERIFIER))
            if unknown:
                raise ValueError(f"counts: no generator for domain(s) {unknown}; known: {', '.join(DOMAIN_VERIFIER)}")
            return dict(self.counts)
        ratios = {d: r for d, r in self.mix.items() if d in DOMAIN_VERIFIER and r > 0}
        total_r = sum(ratios.values())
        return {d: round(self.total * r / total_r) for d, r in ratios.items()} if total_r else {}
