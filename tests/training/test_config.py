from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from training.config import ConfigBase, ConfigError, load_config


@dataclass(frozen=True)
class Lora(ConfigBase):
    r: int = 8
    alpha: float = 16.0


@dataclass(frozen=True)
class Cfg(ConfigBase):
    lr: float = 1e-3
    steps: int = 10
    name: str = "tiny"
    use_lora: bool = False
    domains: list[str] = field(default_factory=lambda: ["math"])
    mix: dict[str, float] = field(default_factory=dict)
    lora: Lora = field(default_factory=Lora)
    base_model: str | None = None


def test_defaults_file_inline_and_overrides(tmp_path) -> None:
    assert load_config(Cfg) == Cfg()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"steps": 5, "lora": {"r": 4}}))
    cfg = load_config(Cfg, path, ["lr=3e-4", "lora.alpha=8", "mix.math=0.7", "name=big", "base_model=null"])
    assert cfg == Cfg(lr=3e-4, steps=5, name="big", mix={"math": 0.7}, lora=Lora(r=4, alpha=8.0))
    assert load_config(Cfg, '{"use_lora": true}').use_lora is True
    yml = tmp_path / "c.yaml"
    yml.write_text("steps: 7\ndomains: [math, code]\n")
    assert load_config(Cfg, yml).domains == ["math", "code"]
    assert Cfg().to_dict()["lora"] == {"r": 8, "alpha": 16.0}


@pytest.mark.parametrize(
    "source, overrides, message",
    [
        ('{"stepz": 3}', [], "unknown key(s) stepz; allowed: base_model, domains"),
        ('{"steps": "ten"}', [], "inline --config JSON.steps: expected an integer"),
        ('{"use_lora": "yes"}', [], "use_lora: expected true/false"),
        ('{"lora": {"rank": 4}}', [], "inline --config JSON.lora: unknown key(s) rank"),
        ('{"domains": "math"}', [], "domains: expected a list"),
        ("{bad json", [], "invalid JSON at line 1"),
        (None, ["steps"], "expected key=value"),
        (None, ["lr=fast"], "config.lr: expected a number, got 'fast'"),
    ],
)
def test_errors_name_the_key(source, overrides, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(Cfg, source, overrides)
    assert message in str(err.value)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Cfg, tmp_path / "nope.json")
