"""Stage configs: frozen dataclasses filled from a file or inline JSON, plus `--set key=value` overrides.

    cfg = load_config(SFTConfig, "configs/tiny.json", ["lr=3e-4", "lora.r=8"])

Every key is checked against the dataclass: an unknown key or a value of the wrong type is a ConfigError that
names the source, the key and what was expected. Nothing is ever `exec`-ed.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

C = TypeVar("C")


class ConfigError(ValueError):
    pass


class ConfigBase:
    """Mixin for stage configs: `to_dict()` is what gets logged to MLflow and written to the manifest."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def read_source(source: str | Path | None) -> dict[str, Any]:
    """A config mapping from a .json/.yaml/.yml file path, an inline JSON object, or nothing."""
    if source is None or source == "":
        return {}
    text = str(source)
    if text.lstrip().startswith("{"):
        where = "inline --config JSON"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from err
    else:
        path = Path(text)
        where = str(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        raw = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(raw) or {}
            except yaml.YAMLError as err:
                raise ConfigError(f"{where}: invalid YAML: {err}") from err
        else:
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the config must be a JSON/YAML object, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`a.b=3` sets data["a"]["b"] = 3; the value is parsed as JSON when it can be, else kept as a string."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return out


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a dataclass type, never an instance
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected an object for {hint.__name__}, got {value!r}")
        return from_dict(hint, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected an object, got {value!r}")
        vhint = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, vhint, f"{where}.{k}") for k, v in value.items()}
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[C], data: Mapping[str, Any], where: str = "config") -> C:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types with the key named."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], f"{where}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def source_label(source: str | Path | None) -> str:
    """How errors name a config source: the file, "inline --config JSON", or "config" for none."""
    return "inline --config JSON" if source and str(source).lstrip().startswith("{") else str(source or "config")


def load_config(cls: type[C], source: str | Path | None = None, overrides: list[str] | None = None) -> C:
    data = apply_overrides(read_source(source), overrides or [])
    return from_dict(cls, data, source_label(source))
