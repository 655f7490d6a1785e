"""Verifiers and environments from other packages, through Python entry points.

A user's package adds a domain without an edit here by declaring, in its pyproject.toml:

    [project.entry-points."posttrain.verifiers"]
    haiku = "my_package.verifiers:HaikuVerifier"      # a Verifier subclass, an instance, or a module

    [project.entry-points."posttrain.environments"]
    haiku_revise = "my_package.envs:HaikuReviseEnv"   # an environment class (or factory), or a module

Once it is installed in the stage's environment, `training.rewards` and `training.environments` load these on
the first lookup of a verifier or environment (not on import, so the user's module may itself import
posttrain's): a Verifier class is instantiated and registered under its `name`; an environment class is registered
under the entry point's name; a module is imported for its own `register_*` calls. Task rows then name the
verifier (`"verifier": "haiku"`), and the verifier's `environment` and `instruction` give the domain its
multi-turn environment and chat instruction.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any

VERIFIER_GROUP = "posttrain.verifiers"
ENVIRONMENT_GROUP = "posttrain.environments"


class EntryPointError(RuntimeError):
    """An installed package's entry point could not be loaded or is not what its group expects."""


_LOADED: dict[str, list[str]] = {}


def load_once(group: str, load: Callable[[], list[str]]) -> list[str]:
    """`load()` the first time a group is asked for, its entry point names remembered after. A load that
    raises is not remembered, so the next lookup raises again instead of going on without the package."""
    if group not in _LOADED:
        _LOADED[group] = []  # a plugin that looks a verifier up while it loads does not recurse
        try:
            _LOADED[group] = load()
        except BaseException:
            del _LOADED[group]
            raise
    return list(_LOADED[group])


def _origin(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    package = f" (package {dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ep.group}: {ep.name} = {ep.value}{package}"


def _load(ep: EntryPoint) -> Any:
    try:
        return ep.load()
    except Exception as exc:  # whatever the package raises, say which package it was
        raise EntryPointError(f"{_origin(ep)} failed to load: {type(exc).__name__}: {exc}") from exc


def load_verifiers(register: Callable[[Any], Any], verifier_type: type) -> list[str]:
    """Register every `posttrain.verifiers` entry point; returns the entry point names loaded."""
    loaded = []
    for ep in entry_points(group=VERIFIER_GROUP):
        obj = _load(ep)
        if inspect.isclass(obj) and issubclass(obj, verifier_type):
            obj = obj()
        if isinstance(obj, verifier_type):
            if not getattr(obj, "name", ""):
                raise EntryPointError(f"{_origin(ep)}: {type(obj).__name__} has no `name`")
            register(obj)
        elif not isinstance(obj, ModuleType):
            raise EntryPointError(
                f"{_origin(ep)} is a {type(obj).__name__}: expected a Verifier subclass or instance, or a module "
                "that registers its verifiers"
            )
        loaded.append(ep.name)
    return loaded


def load_environments(registry: dict[str, Any]) -> list[str]:
    """Add every `posttrain.environments` entry point to `registry` (name -> class or factory)."""
    loaded = []
    for ep in entry_points(group=ENVIRONMENT_GROUP):
        obj = _load(ep)
        if isinstance(obj, ModuleType):
            loaded.append(ep.name)
            continue
        if not callable(obj):
            raise EntryPointError(f"{_origin(ep)} is a {type(obj).__name__}: expected an environment class")
        old = registry.get(ep.name)
        if old is not None and old is not obj:
            raise EntryPointError(f"{_origin(ep)}: environment {ep.name!r} is already registered to {old!r}")
        registry[ep.name] = obj
        loaded.append(ep.name)
    return loaded
