"""The commit hooks judge a change as `make lint` (and so CI) does: the same ruff, the same two commands."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pinned(package: str) -> str:
    for line in (ROOT / "requirements/constraints.txt").read_text().splitlines():
        if line.lower().startswith(f"{package}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{package} is not pinned in requirements/constraints.txt")


def test_pre_commit_hooks_run_the_pinned_ruff_check_and_format() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert set(hooks) == {"ruff-check", "ruff-format"}
    for hook in hooks.values():
        assert hook["additional_dependencies"] == [f"ruff=={_pinned('ruff')}"], hook
    assert hooks["ruff-check"]["entry"].startswith("ruff check")
    assert hooks["ruff-format"]["entry"] == "ruff format"


def test_make_lint_checks_what_the_hooks_fix() -> None:
    lint = re.search(r"^lint:.*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert lint, "Makefile has no lint target"
    recipe = lint.group(1)
    assert "ruff check ." in recipe and "ruff format --check ." in recipe and "mypy" in recipe, recipe
