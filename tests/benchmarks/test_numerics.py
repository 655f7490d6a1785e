"""The suite runs on the pinned AVX2 float path wherever the CPU has AVX2 (benchmarks/numerics.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.numerics import PINS, cpu_has_avx2

REPO = Path(__file__).resolve().parents[2]


def test_cpu_flags_are_read_as_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert cpu_has_avx2(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2_like fma\n")
    assert not cpu_has_avx2(info)
    assert not cpu_has_avx2(tmp_path / "missing")
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    info.write_text("flags\t\t: avx2\n")
    assert not cpu_has_avx2(info)


@pytest.mark.skipif(not cpu_has_avx2(), reason="no AVX2 on this CPU: the suite runs on its default float path")
def test_the_suite_and_the_stages_it_starts_take_the_avx2_kernels() -> None:
    for key, value in PINS.items():
        assert os.environ.get(key) == value, key  # set by conftest, inherited by every stage process
    # a fresh process, as a stage is: torch dispatches its CPU kernels at AVX2, not wider
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert out.stdout.strip() == "AVX2", out
