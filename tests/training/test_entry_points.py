"""Verifiers and environments from installed packages: what loads, and the errors that name the package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from training.entry_points import EntryPointError, load_environments, load_verifiers
from training.environments import environment_name
from training.rewards.base import Verifier
from training.tasksets.schema import Task


def install_dist(root: Path, name: str, entry_points: str, module: str = "", source: str = "") -> None:
    """A package as pip leaves it on a path: a dist-info folder (METADATA, entry_points.txt) and its module."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    if module:
        (root / f"{module}.py").write_text(source)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("ep_fixture_")]:
        del sys.modules[name]


def test_a_verifier_class_is_registered_under_its_name(site: Path) -> None:
    source = (
        "from training.rewards.base import Verifier\n"
        "class Rhyme(Verifier):\n    name = 'rhyme'\n    def score(self, tasks, completions, **o):\n"
        "        return [1.0 for _ in completions]\n"
    )
    install_dist(site, "rhymes", "[posttrain.verifiers]\nrhyme = ep_fixture_rhyme:Rhyme\n", "ep_fixture_rhyme", source)
    registered: list[Verifier] = []
    assert load_verifiers(registered.append, Verifier) == ["rhyme"]
    assert [v.name for v in registered] == ["rhyme"]


def test_a_broken_entry_point_names_its_package(site: Path) -> None:
    install_dist(site, "brokenpkg", "[posttrain.verifiers]\nnope = ep_fixture_missing:Nope\n")
    with pytest.raises(EntryPointError, match=r"nope = ep_fixture_missing:Nope \(package brokenpkg 0.1\) failed"):
        load_verifiers(lambda v: v, Verifier)


def test_an_entry_point_of_the_wrong_kind_is_refused(site: Path) -> None:
    install_dist(site, "oddpkg", "[posttrain.verifiers]\nodd = ep_fixture_odd:VALUE\n", "ep_fixture_odd", "VALUE = 3\n")
    with pytest.raises(EntryPointError, match="is a int: expected a Verifier subclass"):
        load_verifiers(lambda v: v, Verifier)


def test_an_environment_is_registered_and_a_clash_refused(site: Path) -> None:
    source = "class Env:\n    name = 'poem_revise'\n    def __init__(self, task, **o):\n        self.task = task\n"
    install_dist(
        site, "poems", "[posttrain.environments]\npoem_revise = ep_fixture_env:Env\n", "ep_fixture_env", source
    )
    registry: dict = {}
    assert load_environments(registry) == ["poem_revise"]
    assert registry["poem_revise"].__name__ == "Env"
    with pytest.raises(EntryPointError, match="already registered"):
        load_environments({"poem_revise": object})


def _task(domain: str, verifier: str) -> Task:
    return Task(id="t", domain=domain, prompt="p", answer="a", verifier=verifier, difficulty=1)


def test_the_environment_comes_from_the_verifier_unless_the_config_names_one() -> None:
    assert environment_name(_task("code", "code"), {}) == "code_repair"  # the code verifier's own
    assert environment_name(_task("python_hard", "code"), {}) == "code_repair"  # a user's domain, same verifier
    assert environment_name(_task("math", "math"), {}) is None
    assert environment_name(_task("math", "math"), {"math": "calculator"}) == "calculator"
    assert environment_name(_task("code", "code"), {"code": ""}) is None  # "" turns it off


def test_a_group_loads_once_and_a_failed_load_is_not_remembered() -> None:
    from training.entry_points import _LOADED, load_once

    calls: list[int] = []

    def broken() -> list[str]:
        calls.append(1)
        raise EntryPointError("entry point x: failed to load")

    def fine() -> list[str]:
        calls.append(2)
        return ["x"]

    try:
        with pytest.raises(EntryPointError):
            load_once("test.group", broken)
        with pytest.raises(EntryPointError):  # still broken: raised again, not skipped silently
            load_once("test.group", broken)
        assert load_once("test.group", fine) == ["x"] and load_once("test.group", fine) == ["x"]
        assert calls == [1, 1, 2]  # loaded once it worked
    finally:
        _LOADED.pop("test.group", None)
