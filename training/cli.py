"""`posttrain <command> ...`: one entry point for every stage and tool.

Commands are imported only when invoked, so `posttrain --help` is instant and `posttrain sandbox` never
imports torch. Stage `X` lives in `training/stages/X.py` (dashes become underscores) and ends with
`stage_cli`, so every stage parses the same arguments and maps the same errors to exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from training import run_config
from training.config import ConfigError, apply_overrides, from_dict, read_source, source_label
from training.profiles import NoPreset, apply_preset, deep_merge
from training.recipes import load_recipe, recipe_params
from training.stage import run_stage
from training.storage import StorageError, join, read_manifest
from training.tracking import TrackingUnavailable

if TYPE_CHECKING:
    from training.stage import StageContext

StageBody = Callable[["StageContext"], "dict[str, Any] | None"]

# name -> ("module:function" taking (argv, prog) and returning an exit code, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    # pipeline stages, in pipeline order
    "build-taskset": (
        "training.stages.build_taskset:cli",
        "build the verifiable task set (generate/load, validate, dedup, split)",
    ),
    "sft": ("training.stages.sft:cli", "supervised fine-tuning on the task set (response-only loss, packing, resume)"),
    "rl-round": (
        "training.stages.rl_round:cli",
        "one GRPO round (--round N): rollouts, verifier rewards, policy update",
    ),
    "evaluate": ("training.stages.evaluate:cli", "evaluate candidate, SFT baseline and champion on the holdout"),
    "gate": ("training.stages.gate:cli", "decide promote/block from the evaluation (per-domain intervals)"),
    "promote": ("training.stages.promote:cli", "register the gated candidate, move the `champion` alias"),
    # tools
    "taskset": (
        "training.tasksets.check:cli",
        "task-set tools: `taskset check FILE [--quarantine OUT]` validates task files",
    ),
    "feedback": (
        "training.feedback_cli:cli",
        "production feedback in: `feedback import FILE... --to ROOT` validates and stores batches",
    ),
    "score": (
        "training.score_cli:cli",
        "score completions from any model against a task set: `score --tasks F --completions F [--json]`",
    ),
    "sandbox": ("sandbox.cli:main", "run untrusted code against tests in the sandbox (`run`, `serve`, `info`)"),
    "adopt": ("training.cli_storage:adopt_cli", "copy a complete folder (champion, newest task set) into a run"),
    "latest": ("training.cli_storage:latest_cli", "show or move a latest.json pointer"),
    "inspect": ("training.cli_storage:inspect_cli", "show the manifest of a stage output or checkpoint URI"),
    "verify": ("training.cli_storage:verify_cli", "verify every file of a manifested folder against its sha256"),
}

EPILOG = """\
Every stage reads its inputs from the manifests of earlier stages under --run and writes its output under
<run>/<stage>/, finishing with manifest.json. Run URIs: s3://bucket/prefix/<run_id> or file:///path/<run_id>.
Environment: MLFLOW_TRACKING_URI, AWS_ENDPOINT_URL_S3 and AWS credentials (`make up` writes .local/env).
"""


def _top_help() -> str:
    width = max(len(n) for n in COMMANDS) + 2
    lines = ["usage: posttrain <command> [options]    (posttrain <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:{width}s}{help_text}" for name, (_, help_text) in COMMANDS.items()]
    return "\n".join(lines) + "\n\n" + EPILOG


def stage_parser(prog: str, description: str, config_cls: type | None = None) -> argparse.ArgumentParser:
    """The arguments every stage takes: --config, --run, --set."""
    doc = (config_cls.__doc__ or "").strip() if config_cls else ""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        default=None,
        help="config file (.json/.yaml) or an inline JSON object; defaults apply to missing keys",
    )
    parser.add_argument(
        "--run",
        required=True,
        metavar="RUN_URI",
        help="pipeline run URI, e.g. s3://posttrain/runs/2026-12-03 or file:///tmp/runs/r1",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (dotted for nested), repeatable",
    )
    parser.add_argument(
        "--recipe",
        default=None,
        metavar="RECIPE",
        help="a recipe file or name (training/recipes.py): the stage's config as the DAGs build it from the "
        "recipe, under --config and --set",
    )
    parser.add_argument(
        "--preset-tier",
        default="",
        metavar="TIER",
        help="the pretrained preset tier (1.5B, 3B, 8B) instead of the one the base model's config.json sizes",
    )
    parser.add_argument(
        "--no-preset",
        action="store_true",
        help="the config's own defaults even for a pretrained base model (no preset under --config/--set)",
    )
    return parser


def cli_base_model(stage: str, data: dict[str, Any], run_uri: str) -> str:
    """The base model whose preset a stage run from the shell gets: sft's own `base_model`; for the stages
    after it, the base model the run's SFT was trained from (its manifest's config). "" for the tiny model."""
    if stage == "sft":
        return str(data.get("base_model") or "")
    if stage.startswith("rl_round") or stage == "evaluate":
        manifest = read_manifest(join(run_uri, "sft"))
        return str((manifest.config if manifest else {}).get("base_model") or "")
    return ""


def resolve_config(stage: str, args: argparse.Namespace) -> dict[str, Any]:
    """The config mapping a stage run from the shell gets: with --recipe, the recipe's stage config exactly as
    the DAGs build it (training/run_config.py) under --config and --set; else --config and --set over the
    base model's preset (training/profiles.py: apply_preset, the DAGs' function), unless --no-preset."""
    given = apply_overrides(read_source(args.config), args.set)
    if getattr(args, "recipe", None):
        return deep_merge(run_config.stage_config(stage, recipe_params(load_recipe(args.recipe))), given)
    base_model = "" if args.no_preset else cli_base_model(stage, given, args.run)
    return apply_preset(stage, given, base_model, "", args.preset_tier)


def run_cli(fn: Callable[[], Any], user_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Map the errors a user can fix (bad config, storage, tracking, plus `user_errors`) to exit code 2 with a
    one-line message, not a traceback."""

    handled: tuple[type[BaseException], ...] = (
        ConfigError,
        NoPreset,
        StorageError,
        TrackingUnavailable,
        *user_errors,
    )
    try:
        rc = fn()
    except handled as err:
        print(f"posttrain: error: {err}", file=sys.stderr)
        return 2
    return int(rc or 0)


def stage_cli(
    argv: list[str],
    prog: str,
    description: str,
    config_cls: type,
    stage: str = "",
    body: StageBody | None = None,
    *,
    arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    bind: Callable[[argparse.Namespace], tuple[str, StageBody]] | None = None,
    user_errors: tuple[type[BaseException], ...] = (),
) -> int:
    """The CLI of one stage: parse --config/--run/--set (plus `arguments`), load the config, run the body
    under the stage contract. `bind` names the stage and its body from the parsed arguments when they depend
    on them (rl-round's --round)."""

    parser = stage_parser(prog, description, config_cls)
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    name, run_body = bind(args) if bind is not None else (stage, body)
    if run_body is None:
        raise TypeError("stage_cli needs a body, or bind")

    def go() -> int:
        data = resolve_config(name, args)
        run_stage(name, from_dict(config_cls, data, source_label(args.config)), args.run, run_body)
        return 0

    return run_cli(go, user_errors)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_help(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"posttrain: unknown command {name!r}\n\n{_top_help()}", file=sys.stderr, end="")
        return 2
    module_name, func = COMMANDS[name][0].split(":")
    handler = getattr(importlib.import_module(module_name), func)
    return int(handler(rest, prog=f"posttrain {name}") or 0)


if __name__ == "__main__":
    sys.exit(main())
