"""One floating-point path for the tiny runs on any x86-64 CPU with AVX2.

The tiny model's RL results hang on float rounding: the same code, seed and thread count gave different
models on two CI machines (an earlier one and an AMD EPYC with AVX2 and no AVX-512), because torch's kernels,
MKL and oneDNN each pick the widest vector instructions the CPU has, and wider vectors sum in another order.
Pinning all three to AVX2 makes every AVX2 machine take the same kernels. Call `pin_cpu_numerics()` before
torch computes anything (the test suite's conftest and the quality benchmarks do, at import); stage processes
they start inherit the pins through the environment. A variable already set is left alone, and a CPU without
AVX2 (or not x86-64) gets no pins. Production stages do not call this: there the widest kernels are the point.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# torch's own kernels (ATen's CPU capability), MKL's conditional numerical reproducibility branch, oneDNN's ISA
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def cpu_has_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this is an x86-64 CPU whose flags list avx2 (Linux's /proc/cpuinfo; False where it is absent)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and "avx2" in line.split(":", 1)[-1].split() for line in text.splitlines())


def pin_cpu_numerics() -> dict[str, str]:
    """Set PINS in os.environ where unset (AVX2 CPUs only); returns what was set."""
    if not cpu_has_avx2():
        return {}
    added = {k: v for k, v in PINS.items() if k not in os.environ}
    os.environ.update(added)
    return added
