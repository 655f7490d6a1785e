"""One recipe per model line: what a model is trained from, on what, and how, in one reviewable file.

A recipe (YAML or JSON) says which registered model it is (`model_name`), what it starts from (`base_model`,
sized for its preset from its config.json), its data per domain (sources with their adapters and verifiers, the
domain's weight in the train mix and the RL prompts, an optional gate `group`), the number of RL rounds, the
holdout (`holdout_fraction`, `split_salt`: fixed for the model line, so the holdout does not move), and any
per-stage override (`stages`):

    model_name: support-bot
    base_model: s3://posttrain/models/support-bot-base
    rounds: 2
    domains:
      math:
        weight: 0.7
        sources: [{path: /data/gsm8k/train.jsonl, adapter: gsm8k}]
      code:
        weight: 0.3
        group: programming
        sources: [{path: /data/mbpp.jsonl, adapter: mbpp}]
    feedback:
      inbox: s3://posttrain/feedback-inbox/support-bot
      domain: support
    stages:
      rl_round: {steps: 50}
    timeouts:
      sft: 4h
      rl_round: 8h
      rl_round_3: 12h

`timeouts` (optional) is each stage's wall-clock limit: seconds, or a number with s, m, h or d. The launcher
stops a stage past it (the process, the container or the pod's activeDeadlineSeconds) and the task fails, so a
hung stage does not hold its GPU pool slot for the 6-hour default. `rl_round` is every round's; `rl_round_N`
one round's.

`feedback` (optional) is where production feedback arrives: `taskset_refresh` imports every new file in
`inbox` (`posttrain feedback import`, training/tasksets/feedback.py) as a batch under `root` (default
`$POSTTRAIN_FEEDBACK_ROOT/<model_name>`, `s3://posttrain/feedback/<model_name>`), and the task set reads every
batch there: records with an answer or tests become tasks of their domain, rated ones the `field` slice.

Where recipes live: files in a recipes folder (`POSTTRAIN_RECIPES_DIR`, default `recipes/` beside training/;
`/opt/posttrain/recipes` in the images). A file, not an Airflow Variable or an S3 object, because a change to
how a production model is trained should be reviewed like code, and the same file must be readable by the
CLI (`posttrain <stage> --recipe FILE`) and by the scheduler (`recipe` in the DAGs' params, or
`POSTTRAIN_RECIPE` for the scheduled runs) with nothing else running. `recipe_params` turns a recipe into the
run parameters training/run_config.py builds every stage's config from, for the DAGs and the CLI alike.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config import ConfigBase, ConfigError, from_dict, read_source

RECIPES_DIR = Path(os.environ.get("POSTTRAIN_RECIPES_DIR") or Path(__file__).resolve().parents[1] / "recipes")
STAGES = ("taskset", "sft", "rl_round", "evaluate", "gate", "promote")


@dataclass(frozen=True)
class RecipeDomain(ConfigBase):
    """One domain: its sources (the task set's SourceSpec fields; `domain` is filled in), its weight in the
    train mix and the RL prompts, the verifier its rows get when they name none, its reward weights, and the
    gate group its small holdout pools into."""

    sources: list[dict[str, Any]] = field(default_factory=list)
    weight: float = 1.0
    verifier: str = ""
    reward_weights: dict[str, float] = field(default_factory=dict)
    group: str = ""

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("sources: a domain needs at least one source")
        for i, src in enumerate(self.sources):
            if not isinstance(src, dict) or not src.get("path"):
                raise ValueError(f"sources[{i}]: a source is a mapping with a `path`")
        if self.weight < 0:
            raise ValueError(f"weight must be >= 0, got {self.weight}")


FEEDBACK_ROOT = os.environ.get("POSTTRAIN_FEEDBACK_ROOT", "s3://posttrain/feedback")


@dataclass(frozen=True)
class RecipeFeedback(ConfigBase):
    """Where a model line's production feedback arrives (`inbox`: a folder or prefix of JSONL files) and is kept
    (`root`: its batches), and the domain / verifier of records that name none."""

    inbox: str = ""
    root: str = ""
    domain: str = ""
    verifier: str = ""

    def __post_init__(self) -> None:
        if not self.inbox:
            raise ValueError("inbox: where the feedback files arrive (a folder or an s3:// prefix)")


@dataclass(frozen=True)
class Recipe(ConfigBase):
    model_name: str = ""
    base_model: str = ""
    preset_tier: str = ""
    rounds: int = 1
    seed: int = 0
    holdout_fraction: float = 0.1
    split_salt: str = "posttrain"
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    feedback: dict[str, Any] = field(default_factory=dict)
    timeouts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name: a recipe names the registered model it trains")
        if not self.domains:
            raise ValueError("domains: a recipe needs at least one domain with sources")
        if not 0 <= self.rounds <= 8:
            raise ValueError(f"rounds must be in 0..8, got {self.rounds}")
        for section in ("stages", "timeouts"):
            unknown = sorted(set(getattr(self, section)) - set(STAGES) - {f"rl_round_{n}" for n in range(1, 9)})
            if unknown:
                raise ValueError(f"{section}: unknown stage(s) {unknown}; known: {', '.join(STAGES)}, rl_round_N")
        for stage, value in self.timeouts.items():
            try:
                duration_s(value)
            except ValueError as e:
                raise ValueError(f"timeouts.{stage}: {e}") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(value: Any) -> int:
    """Seconds from a number of seconds or a string such as "90m", "8h", "1.5d"; refuses zero and below."""
    if isinstance(value, bool):
        raise ValueError(f"expected seconds or a duration such as '8h', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(value))
        if not match:
            raise ValueError(f"expected seconds or a duration such as '8h', got {value!r}")
        seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if seconds < 1:
        raise ValueError(f"a timeout must be at least 1 second, got {value!r}")
    return int(seconds)


def recipe_path(name: str) -> Path:
    """A recipe file: `name` as a path, else `<RECIPES_DIR>/<name>.yaml|.yml|.json`."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    for suffix in (".yaml", ".yml", ".json"):
        candidate = RECIPES_DIR / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in RECIPES_DIR.glob("*.y*ml")) + sorted(p.stem for p in RECIPES_DIR.glob("*.json"))
    raise ConfigError(f"recipe {name!r}: no such file, nor in {RECIPES_DIR} (recipes there: {known or 'none'})")


def load_recipe(name: str) -> Recipe:
    """The recipe `name` (a path or a name in RECIPES_DIR), validated; errors name the file and the key."""
    path = recipe_path(name)
    where = str(path)
    recipe = from_dict(Recipe, read_source(str(path)), where)
    for domain, spec in recipe.domains.items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: domains.{domain}: expected a mapping, got {type(spec).__name__}")
        from_dict(RecipeDomain, spec, f"{where}: domains.{domain}")
    if recipe.feedback:
        from_dict(RecipeFeedback, recipe.feedback, f"{where}: feedback")
    return recipe


def feedback_params(recipe: Recipe) -> dict[str, str]:
    """The recipe's feedback settings with the root filled in; {} without a `feedback` section."""
    if not recipe.feedback:
        return {}
    fb = RecipeFeedback(**recipe.feedback)
    root = fb.root or f"{FEEDBACK_ROOT.rstrip('/')}/{recipe.model_name}"
    return {"inbox": fb.inbox, "root": root, "domain": fb.domain, "verifier": fb.verifier}


def recipe_params(recipe: Recipe) -> dict[str, Any]:
    """The run parameters of a recipe, in the shape the trigger form gives them (training/run_config.py)."""
    domains = {name: RecipeDomain(**spec) for name, spec in recipe.domains.items()}
    sources = [
        {**src, "domain": name, **({"verifier": d.verifier} if d.verifier and "verifier" not in src else {})}
        for name, d in domains.items()
        for src in d.sources
    ]
    taskset = {
        "sources": sources,
        "holdout_fraction": recipe.holdout_fraction,
        "split": "hash",
        "split_salt": recipe.split_salt,
        "ids": "content",
    }
    feedback = feedback_params(recipe)
    if feedback:
        taskset["feedback"] = [feedback["root"]]
    weights = {name: d.reward_weights for name, d in domains.items() if d.reward_weights}
    if weights:
        taskset["reward_weights"] = weights
    groups = {name: d.group for name, d in domains.items() if d.group}
    overrides: dict[str, dict[str, Any]] = {"taskset": taskset, **({"gate": {"groups": groups}} if groups else {})}
    for stage, values in recipe.stages.items():
        overrides[stage] = {**overrides.get(stage, {}), **values}
    return {
        "model_name": recipe.model_name,
        "profile": "data",
        "base_model": recipe.base_model,
        "preset_tier": recipe.preset_tier,
        "rounds": recipe.rounds,
        "seed": recipe.seed,
        "mix": {name: d.weight for name, d in domains.items()},
        "stage_overrides": overrides,
        **({"feedback": feedback} if feedback else {}),
        **({"timeouts": {k: duration_s(v) for k, v in recipe.timeouts.items()}} if recipe.timeouts else {}),
    }
