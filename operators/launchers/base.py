"""The launcher seam: start a stage somewhere, stream its log lines, wait for it, stop it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from operators.spec import StageSpec


class StageTimeout(RuntimeError):
    pass


class Launcher(Protocol):
    def run(self, spec: StageSpec, argv: list[str], env: dict[str, str], on_line: Callable[[str], None]) -> int:
        """Run the stage to completion, calling on_line for every output line; return its exit code."""
        ...

    def stop(self) -> None:
        """Stop the running stage (called from on_kill, possibly from another thread)."""
        ...
